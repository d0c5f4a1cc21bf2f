"""Real-graph parity of an EAGLE3 pair (DESIGN §17): NVIDIA's exported Qwen3 base (``--eagle-base``) and
``LlamaForCausalLMEagle3`` draft, driven by trtio's SpecDecodeSetup. The accepted tokens equal Hugging Face's
greedy tokens; verify's logits at every node of trees made from Hugging Face's tokens (accepted nodes and the
wrong siblings beside them) equal Hugging Face's for those prefixes; the draft's prefill, catch-up and proposal
logits equal the case's draft reference. A wrong tree input fails the check."""

from __future__ import annotations

import numpy as np
import pytest

from tests._parity import when
from tests._parity_spec import SPEC_SCENARIOS, AcceptHook, Hook, SpecCase, Tree, planted_spec, run_spec

CASE = "qwen3-eagle3"
ROPE_THETA = 10000.0  # the fixture's base and draft configs


@pytest.fixture(scope="module")
def case() -> SpecCase:
    return SpecCase(CASE)


# Every scenario on the host backend, and on a GPU graphs off and on; graphs on the host too for the admission
# (its verify and proposal steps replay their captured graphs, also after the batch changed).
RUNS = [pytest.param(scenario, backend, graphs, marks=[pytest.mark.gpu] if backend == "cuda" else [])
        for scenario in SPEC_SCENARIOS for backend, graphs in (("host", False), ("cuda", False), ("cuda", True))]
RUNS.append(pytest.param("admission", "host", True))


@pytest.mark.parametrize("scenario, backend, graphs", RUNS)
def test_equals_hugging_face(case: SpecCase, scenario: str, backend: str, graphs: bool) -> None:
    cmp = run_spec(case, scenario, backend, graphs)
    assert cmp.base.rows >= 10 and cmp.base.worst <= 0.1
    if scenario == "base_tree":
        # every node of three rounds of 7-node trees, and the three prefill rows
        assert cmp.base.rows == 3 + 3 * 3 * 7 and cmp.accepted == [4, 4, 3] * 3
    else:
        assert cmp.draft.rows >= 6 and cmp.draft.worst <= 0.1
    if scenario == "draft_tree":
        # the last sequence's verify trees without their last level (padding rows); the draft's prefill row, six
        # tree nodes and a catch-up row a round
        assert cmp.base.rows == 3 + 3 * (7 + 7 + 5) and cmp.accepted == [4, 4, 3] * 3
        assert cmp.draft.rows == 3 + 3 * 3 * (6 + 1)
    if scenario == "admission":  # the admitted request's prefills besides
        assert cmp.base.rows == 4 + 3 * 3 * 7 and cmp.draft.rows == 4 + 3 * 3 * (6 + 1)
        assert cmp.accepted == [4, 4, 3] * 3


# -- planted bugs ---------------------------------------------------------------------------------------------------


def _copy(inputs: dict[str, np.ndarray], name: str) -> np.ndarray:
    inputs[name] = np.array(inputs[name])
    return inputs[name]


def _width(inputs: dict[str, np.ndarray]) -> int:
    return int(inputs["inputs_embeds"].shape[0] // inputs["query_lengths"].shape[0])


def _bits(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """Sequence 0's unpacked mask rows [W, W] (bit j of a row: it sees in-flight row j)."""
    w = _width(inputs)
    words = inputs["packed_attention_mask"][:w].astype(np.int64) & 0xFFFFFFFF
    cols = np.arange(w)
    return ((words[:, cols // 32] >> (cols % 32)) & 1).astype(bool)


def _flip(inputs: dict[str, np.ndarray], row: int, col: int) -> None:
    _copy(inputs, "packed_attention_mask")[row, col // 32] ^= np.int32(1 << (col % 32))


def _mask_sees_off_path(inputs: dict[str, np.ndarray]) -> None:
    """Sequence 0's first node that does not see an earlier real node now sees it (a sibling, or its parent's)."""
    bits, real = _bits(inputs), inputs["attention_position_ids"][:_width(inputs)] >= 0
    real[int(inputs["query_lengths"][0]):] = False
    for r in range(bits.shape[0]):
        for c in range(r):
            if real[r] and real[c] and not bits[r, c]:
                _flip(inputs, r, c)
                return


def _mask_drops_parent(inputs: dict[str, np.ndarray]) -> None:
    """Sequence 0's first node with a parent no longer sees it."""
    bits = _bits(inputs)
    for r in range(bits.shape[0]):
        seen = np.flatnonzero(bits[r, :r])
        if seen.size:
            _flip(inputs, r, int(seen[-1]))
            return


def _rope_row(position: np.ndarray, width: int) -> np.ndarray:
    inv = 1.0 / ROPE_THETA ** (np.arange(0, width, 2, dtype=np.float64) / width)
    angle = position[:, None].astype(np.float64) * inv[None]
    return np.concatenate([np.cos(angle), np.sin(angle)], axis=1).astype(np.float32)


def _rope_at_slot(inputs: dict[str, np.ndarray]) -> None:
    """Each real tree row's RoPE row at its KV slot (length - W + row) instead of its position (past + depth)."""
    w = _width(inputs)
    t = _copy(inputs, "rope_rotary_cos_sin")
    slots = (inputs["attention_sequence_lengths"][:, None] - w + np.arange(w)[None]).reshape(-1)
    real = inputs["attention_position_ids"] >= 0
    t[real] = _rope_row(slots[real], t.shape[1])


def _node_marked_padding(inputs: dict[str, np.ndarray]) -> None:
    """Sequence 0's node 1 (a real node with children) marked padding: position -1."""
    _copy(inputs, "attention_position_ids")[1] = -1


def _positions_plus_one(inputs: dict[str, np.ndarray]) -> None:
    ids = _copy(inputs, "attention_position_ids")
    ids[ids >= 0] += 1


def _logits_row_early(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "logits_indices")[:] -= 1


def _sequence_lengths_plus_one(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "attention_sequence_lengths")[:] += 1


def _features_late(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "hidden_states_input")
    t[1:] = t[:-1].copy()


def _zero_draft_hidden(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "hidden_states_from_draft")[:] = 0


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


def _roots_swapped(inputs: dict[str, np.ndarray]) -> None:
    """A round's first proposal level: sequences 0 and 1 get each other's root hidden state."""
    k = int(inputs["query_lengths"][0])
    if k == 2:  # the first level: each sequence's first k rows hang off its root
        w = _width(inputs)
        t = _copy(inputs, "hidden_states_from_draft")
        t[[*range(k), *range(w, w + k)]] = t[[*range(w, w + k), *range(k)]]


def _pages_of_sequence_0(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "kv_page_table")
    t[1] = t[0]


def _sibling_committed(paths: list[list[int]], tree: Tree) -> list[list[int]]:
    """Sequence 0's accepted path ends on its last node's sibling (the runner-up): its KV is committed."""
    path, parents = list(paths[0]), tree.parents[0]
    last = path[-1]
    path[-1] = next(n for n in range(1, len(parents)) if parents[n] == parents[last] and n != last)
    return [path, *paths[1:]]


# (scenario, engine hooks by role, accept hook): each plants one wrong runtime input, as a trtio bug would write it.
BUGS: dict[str, tuple[str, dict[str, Hook] | None, AcceptHook | None]] = {
    "verify mask: a node sees a node off its path": ("base_tree", {"base": when(phase=5)(_mask_sees_off_path)}, None),
    "verify mask: a node no longer sees its parent": ("base_tree", {"base": when(phase=5)(_mask_drops_parent)}, None),
    "proposal mask: a node sees a node off its path": ("draft_tree", {"draft": _proposal(_mask_sees_off_path)}, None),
    "proposal mask: a node no longer sees its parent": ("draft_tree", {"draft": _proposal(_mask_drops_parent)},
                                                        None),
    "verify RoPE rows at the KV slot, not the tree position": ("base_tree", {"base": when(phase=5)(_rope_at_slot)},
                                                               None),
    "proposal RoPE rows at the KV slot, not the tree position": ("draft_tree", {"draft": _proposal(_rope_at_slot)},
                                                                 None),
    "a real verify node's attention_position_ids -1": ("base_tree", {"base": when(phase=5)(_node_marked_padding)},
                                                       None),
    "verify logits rows one early": ("base_tree", {"base": when(phase=5)(_logits_row_early)}, None),
    "verify attention_sequence_lengths one long": ("base_tree", {"base": when(phase=5)(_sequence_lengths_plus_one)},
                                                   None),
    "draft prefill features one row late": ("draft_tree", {"draft": when(phase=1)(_features_late)}, None),
    "catch-up features one row late": ("draft_tree", {"draft": _catch_up(_features_late)}, None),
    "proposal without the parent's draft hidden state": ("draft_tree", {"draft": _proposal(_zero_draft_hidden)},
                                                         None),
    "accept commits a sibling's KV": ("base_tree", None, _sibling_committed),
    "proposal roots of two sequences swapped": ("draft_tree", {"draft": _proposal(_roots_swapped)}, None),
    "the admitted sequence's verify on sequence 0's pages": (
        "admission", {"base": when(phase=5, after=1)(_pages_of_sequence_0)}, None),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_input_bug_fails_parity(case: SpecCase, bug: str) -> None:
    scenario, hooks, accept_hook = BUGS[bug]
    how = planted_spec(case, scenario, hooks, accept_hook)
    assert how.startswith(("mismatch", "refused"))


def test_tree_positions_are_read_only_as_the_padding_mark(case: SpecCase) -> None:
    """Edge-LLM's tree kernels take each row's RoPE from its own ``rope_rotary_cos_sin`` row
    (``tokenAlignedRope``) and read ``attention_position_ids`` only for the padding mark -1: other values of it
    change nothing (what positions mean is carried by the RoPE rows, which the bugs above move)."""
    cmp = run_spec(case, "base_tree", hooks={"base": when(phase=5)(_positions_plus_one)})
    assert cmp.base.worst <= 0.1
