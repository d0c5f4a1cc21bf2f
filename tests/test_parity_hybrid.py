"""Real-graph parity of hybrid text models (DESIGN §17): NVIDIA's exported Qwen3.5 (Gated DeltaNet) and Nemotron-H
(Mamba2, ``use_rope: false``) graphs driven by trtio equal Hugging Face's fp32 forward, scenario by scenario: a batch,
chunked prefill with the recurrent state carried from chunk to chunk, an admission into a released slot (its rows
zeroed: no state of the released sequence leaks), and a prefix pinned and continued (the slot's states kept with the
prefix and restored into the new slot). A wrong runtime input, or a state row trtio leaves as it was, fails the check.

The plugins' numpy models (``trtio.testing.edgellm_plugins``: ``causal_conv1d``, ``gated_delta_net``,
``update_ssm_state``) read and write the pool row ``state_indices[s]`` and never zero one, as Edge-LLM's kernels do:
the zeroing at admission and the prefix's restore are trtio's alone, and HF's logits are the truth.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tests._parity import TEXT_SCENARIOS, Case, planted, run, when

CASES = ["qwen3_5", "nemotron_h"]
# Issue 48 #1 (fixed: use_rope false gets the identity table, trtio/_setups/binding.py): before the fix trtio wrote a
# real rotary table for Nemotron-H where Edge-LLM's runtime feeds cos 1, sin 0 and HF rotates nothing, and this parity
# failed: worst |Δ logits| 7.47 / 7.03 / 7.47 / 8.17 (batch, chunked, admission, prefix), greedy tokens off in 18/24,
# 6/8, 13/16, 5/8 rows; after it 0.022 / 0.027 / 0.016 / 0.027, greedy equal. The planted bug below keeps it caught.

# (backend, CUDA graphs): the host backend here; the cuda backend, graphs off and on, where a GPU answers.
RUNS = [pytest.param(("host", False), id="host"),
        pytest.param(("cuda", False), id="cuda", marks=pytest.mark.gpu),
        pytest.param(("cuda", True), id="cuda-graphs", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("where", RUNS)
@pytest.mark.parametrize("scenario", list(TEXT_SCENARIOS))
@pytest.mark.parametrize("name", CASES)
def test_equals_hugging_face(name: str, scenario: str, where: tuple[str, bool]) -> None:
    backend, graphs = where
    cmp = run(Case(name), scenario, backend=backend, graphs=graphs)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


# -- planted bugs -------------------------------------------------------------------------------------------------

Hook = Callable[[dict[str, np.ndarray]], None]


def _pools(inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Every recurrent layer's conv and recurrent state pool (views of the bound memory: writes land there)."""
    return [v for k, v in inputs.items() if k.startswith(("conv_state_", "recurrent_state_"))]


def _state_indices_swapped(inputs: dict[str, np.ndarray]) -> None:
    rows = np.array(inputs["state_indices"])
    rows[[0, 1]] = rows[[1, 0]]
    inputs["state_indices"] = rows


def _rows_zeroed(inputs: dict[str, np.ndarray]) -> None:
    """The step's sequences start from zero states: a chunk's state not carried, a prefix's not restored."""
    for pool in _pools(inputs):
        pool[np.asarray(inputs["state_indices"])] = 0


def _not_zeroed_at_admission() -> Hook:
    """The admission scenario's new request finds its slot's rows as the released sequence left them: the hook keeps
    each decode's pools (as they are when the next step starts) and, at the admitted prefill (the second phase 1),
    writes the released slot's rows back over the zeros trtio put there."""
    kept: dict[str, np.ndarray] = {}
    prefills = [0]

    def hook(inputs: dict[str, np.ndarray]) -> None:
        phase = inputs["execution_phase_marker"].shape[0]
        if phase == 1:
            prefills[0] += 1
            if prefills[0] == 2:
                (slot,) = np.asarray(inputs["state_indices"])
                for name, pool in inputs.items():
                    if name in kept:
                        pool[slot] = kept[name][slot]
                return
        kept.update({k: np.array(v) for k, v in inputs.items() if k.startswith(("conv_state_", "recurrent_state_"))})
    return hook


def _real_rope(inputs: dict[str, np.ndarray]) -> None:
    """A rotary table for the token positions (theta 10000, the table's width) where a ``use_rope: false`` model
    must get the identity (cos 1, sin 0): what trtio wrote for Nemotron-H before issue 48's fix."""
    table = np.array(inputs["rope_rotary_cos_sin"])
    half = table.shape[1] // 2
    inv = 1.0 / 10000.0 ** (np.arange(half) * 2.0 / table.shape[1])
    angles = np.asarray(inputs["positions"], np.float64)[:, None] * inv[None]
    table[:, :half], table[:, half:] = np.cos(angles), np.sin(angles)
    inputs["rope_rotary_cos_sin"] = table


# (case, scenario, hook factory): each plants one wrong runtime input or state, as a trtio bug would leave it.
BUGS: dict[str, tuple[str, str, Callable[[], Hook]]] = {}
for _case in CASES:
    BUGS.update({
        f"{_case}: two sequences' state_indices swapped (decode)":
            (_case, "batch", lambda: when(phase=3)(_state_indices_swapped)),
        f"{_case}: the admitted slot's states not zeroed":
            (_case, "admission", _not_zeroed_at_admission),
        f"{_case}: the state not carried into a chunk":
            (_case, "chunked", lambda: when(phase=2)(_rows_zeroed)),
        f"{_case}: the pinned prefix's states not restored":
            (_case, "prefix", lambda: when(phase=2, after=2)(_rows_zeroed)),
    })
BUGS["nemotron_h: a rotary table where use_rope is false"] = ("nemotron_h", "batch", lambda: _real_rope)


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_bug_fails_parity(bug: str) -> None:
    name, scenario, hook = BUGS[bug]
    how = planted(Case(name), scenario, hook())
    assert how.startswith(("mismatch", "refused"))
