"""Real-graph parity of an MTP pair on a hybrid base (DESIGN §17): NVIDIA's exported Qwen3.5 base (three Gated
DeltaNet layers and a gated attention layer, ``--mtp``) and its one-layer MTP head, driven by trtio's
SpecDecodeSetup. The accepted tokens equal Hugging Face's greedy tokens, three sequences at a time; verify's logits
at every node of chains made from Hugging Face's tokens (the accepted nodes and the wrong ones after a deviation)
equal Hugging Face's for those prefixes, which holds only if each accept committed the recurrent states of the
sequence's accepted node into its slot (``trtio.families.hybrid.snapshots``: the verify leaves the pools as they
were and writes every token's states); the draft's prefill, catch-up and proposal logits equal the head's
reference. A wrong input or a wrong commit fails the check.

Issue 48 #3 (fixed in ``trtio/_ops.py``: ``CopyJobs`` compares the rows a strided copy touches): before the fix the
first accept of every scenario here raised ``InvalidValueError: CopyJobs: copy 0 writes memory that copy 2 reads or
writes; such copies must run one after the other`` (three sequences, three recurrent layers: each sequence's commit
is one strided copy a kind through the evenly spaced pools, and the first-to-last byte spans of the sequences'
copies overlap); with it every scenario passes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from tests._parity import when
from tests._parity_spec import SPEC_SCENARIOS, AcceptHook, Hook, SpecCase, planted_spec, run_spec
from trtio.families.hybrid.snapshots import IntermediateStates

CASE = "qwen3_5-mtp"


@pytest.fixture(scope="module")
def case() -> SpecCase:
    return SpecCase(CASE)


# Every scenario on the host backend, and on a GPU graphs off and on; graphs on the host too for the admission.
RUNS = [pytest.param(scenario, backend, graphs, marks=[pytest.mark.gpu] if backend == "cuda" else [])
        for scenario in SPEC_SCENARIOS for backend, graphs in (("host", False), ("cuda", False), ("cuda", True))]
RUNS.append(pytest.param("admission", "host", True))

# Accepted path lengths per round (sequences 0, 1, 2): the chains deviate from Hugging Face's tokens at levels
# (none, 3, 2), (none, 3, 1), (none, 2, none) (scripts/parity_cases/mtp.py::DEVIATE).
ACCEPTED = [4, 3, 2, 4, 3, 1, 4, 2, 4]


@pytest.mark.parametrize("scenario, backend, graphs", RUNS)
def test_equals_hugging_face(case: SpecCase, scenario: str, backend: str, graphs: bool) -> None:
    cmp = run_spec(case, scenario, backend, graphs)
    assert cmp.base.worst <= 0.1 and cmp.draft.worst <= 0.1
    if scenario == "base_tree":  # every node of three rounds of 4-node chains, and the three prefill rows
        assert cmp.base.rows == 3 + 3 * 3 * 4 and cmp.accepted == ACCEPTED and cmp.draft.rows == 0
    if scenario == "draft_tree":
        # the last sequence's chains without their last node (a padding row in the verify); the draft's prefill
        # row, three chain nodes and a catch-up row a round
        assert cmp.base.rows == 3 + 3 * (4 + 4 + 3) and cmp.accepted == [*ACCEPTED[:8], 3]
        assert cmp.draft.rows == 3 + 3 * 3 * (3 + 1)
    if scenario == "draft_rounds":  # the random head's own chains: its first guess is never the base's
        assert cmp.base.rows >= 12 and cmp.draft.rows >= 12 and set(cmp.accepted) == {1}
    if scenario == "admission":  # the admitted request's prefills besides; it starts again from its first chain
        assert cmp.base.rows == 4 + 3 * 3 * 4 and cmp.draft.rows == 4 + 3 * 3 * (3 + 1)
        assert cmp.accepted == [4, 3, 2, 4, 3, 1, 4, 3, 4]


# -- planted bugs ---------------------------------------------------------------------------------------------------


def _copy(inputs: dict[str, np.ndarray], name: str) -> np.ndarray:
    inputs[name] = np.array(inputs[name])
    return inputs[name]


@contextlib.contextmanager
def _commit_rows(pick: Callable[[np.ndarray, int], np.ndarray] | None) -> Iterator[None]:
    """trtio's accept commits, per sequence, verify row ``pick(rows, W)`` (rows: the accepted nodes' rows ``s * W +
    node``) into the slot instead of the accepted node's; None: commits nothing (the slot keeps the states from
    before the verify)."""
    real = IntermediateStates.commit

    def commit(self: IntermediateStates, slots: np.ndarray, rows: np.ndarray, lengths: np.ndarray, nodes: int,
               stream: Any) -> None:
        if pick is not None:  # the picked row as a path of one node
            last = np.asarray(rows)[np.arange(len(slots)), lengths - 1]
            real(self, slots, pick(last, VERIFY)[:, None], np.ones_like(lengths), nodes, stream)

    IntermediateStates.commit = commit  # type: ignore[method-assign]
    try:
        yield
    finally:
        IntermediateStates.commit = real  # type: ignore[method-assign]


VERIFY = 4  # the chains' nodes: the verify width


def _state_indices_swapped(inputs: dict[str, np.ndarray]) -> None:
    rows = _copy(inputs, "state_indices")
    rows[[0, 1]] = rows[[1, 0]]


def _not_zeroed_at_admission() -> Hook:
    """The admitted request finds its slot's rows as they were before the release (the base's pools as the last
    verify found them), not the zeros trtio wrote: written back at the admitted prefill (the base's second phase
    1)."""
    kept: dict[str, np.ndarray] = {}
    prefills = [0]

    def hook(inputs: dict[str, np.ndarray]) -> None:
        if inputs["execution_phase_marker"].shape[0] == 1:
            prefills[0] += 1
            if prefills[0] == 2:
                (slot,) = np.asarray(inputs["state_indices"])
                for name, pool in inputs.items():
                    if name in kept:
                        pool[slot] = kept[name][slot]
            return
        kept.update({k: np.array(v) for k, v in inputs.items() if k.startswith(("conv_state_", "recurrent_state_"))})
    return hook


def _width(inputs: dict[str, np.ndarray]) -> int:
    return int(inputs["inputs_embeds"].shape[0] // inputs["query_lengths"].shape[0])


def _mask_sees_ahead(inputs: dict[str, np.ndarray]) -> None:
    """Every node of sequence 0 sees every node of its chain, those after it (off its path) too."""
    w = _width(inputs)
    _copy(inputs, "packed_attention_mask")[:w, 0] = np.int32((1 << w) - 1)


def _mask_only_self(inputs: dict[str, np.ndarray]) -> None:
    """Every node of sequence 0 sees the committed tokens and itself, none of its ancestors in flight. (One parent
    dropped alone moves these logits by 0.016 at most: the base's one attention layer of two heads is a small part of
    a hybrid's output; the recurrent layers, which the mask does not reach, carry the chain.)"""
    w = _width(inputs)
    _copy(inputs, "packed_attention_mask")[:w, 0] = (np.int32(1) << np.arange(w, dtype=np.int32))


def _logits_row_early(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "logits_indices")[:] -= 1


def _rope_row_late(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "rope_rotary_cos_sin")
    t[1:] = t[:-1].copy()


def _features_late(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "hidden_states_input")
    t[1:] = t[:-1].copy()


def _proposal(bug: Hook) -> Hook:
    """Only the draft's proposal levels (phase 4 without base features; a catch-up carries them)."""
    def hook(inputs: dict[str, np.ndarray]) -> None:
        if inputs["execution_phase_marker"].shape[0] == 4 and not inputs["hidden_states_input"].any():
            bug(inputs)
    return hook


def _catch_up(bug: Hook) -> Hook:
    """Only the draft's catch-ups (phase 4 with the accepted tokens' base features)."""
    def hook(inputs: dict[str, np.ndarray]) -> None:
        if inputs["execution_phase_marker"].shape[0] == 4 and inputs["hidden_states_input"].any():
            bug(inputs)
    return hook


def _zero_draft_hidden(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "hidden_states_from_draft")[:] = 0


def _feedback_of_the_root(inputs: dict[str, np.ndarray]) -> None:
    """Every node of a proposal level reads the root's output (row 0 of its sequence) instead of its parent's:
    the head's hidden-state feedback from the wrong row."""
    w = _width(inputs)
    t = _copy(inputs, "hidden_states_from_draft")
    for s in range(inputs["query_lengths"].shape[0]):
        t[s * w + 1:(s + 1) * w] = t[s * w]


def _node_before(rows: np.ndarray, width: int) -> np.ndarray:
    return np.where(rows % width > 0, rows - 1, rows)


def _last_node(rows: np.ndarray, width: int) -> np.ndarray:
    return rows // width * width + width - 1


# (scenario, engine hooks by role, accept hook, trtio's commit): each plants one wrong runtime input or one wrong
# state commit, as a trtio bug would leave it.
BUGS: dict[str, tuple[str, dict[str, Hook] | None, AcceptHook | None, Any]] = {
    "accept commits the states of the node before the accepted one": ("base_tree", None, None, _node_before),
    "accept commits the states of the chain's last node": ("base_tree", None, None, _last_node),
    "accept commits no states (the slot keeps the pre-verify states)": ("base_tree", None, None, None),
    "verify: two sequences' state_indices swapped": ("base_tree", {"base": when(phase=5)(_state_indices_swapped)},
                                                     None, "keep"),
    "the admitted slot's states not zeroed": ("admission", {"base": _not_zeroed_at_admission()}, None, "keep"),
    "verify mask: nodes see the nodes after them": ("base_tree", {"base": when(phase=5)(_mask_sees_ahead)}, None,
                                                    "keep"),
    "verify mask: nodes see no ancestor in flight": ("base_tree", {"base": when(phase=5)(_mask_only_self)}, None,
                                                     "keep"),
    "verify RoPE rows one late": ("base_tree", {"base": when(phase=5)(_rope_row_late)}, None, "keep"),
    "verify logits rows one early": ("base_tree", {"base": when(phase=5)(_logits_row_early)}, None, "keep"),
    "draft prefill features one row late": ("draft_tree", {"draft": when(phase=1)(_features_late)}, None, "keep"),
    "catch-up features one row late": ("draft_tree", {"draft": _catch_up(_features_late)}, None, "keep"),
    "proposal without the parent's draft hidden state": ("draft_tree", {"draft": _proposal(_zero_draft_hidden)},
                                                         None, "keep"),
    "proposal feedback from the root's row, not the parent's": (
        "draft_tree", {"draft": _proposal(_feedback_of_the_root)}, None, "keep"),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_bug_fails_parity(case: SpecCase, bug: str) -> None:
    scenario, hooks, accept_hook, commit = BUGS[bug]
    with contextlib.nullcontext() if commit == "keep" else _commit_rows(commit):
        how = planted_spec(case, scenario, hooks, accept_hook)
    assert how.startswith(("mismatch", "refused"))
