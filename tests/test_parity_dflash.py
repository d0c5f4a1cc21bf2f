"""Real-graph parity of a DFlash pair (DESIGN §17): NVIDIA's exported dense Qwen3 base (``--dflash-base``) and DFlash
block draft (``--dflash-draft``), driven by trtio's SpecDecodeSetup (``trtio.families.spec.dflash``). The accepted
tokens equal Hugging Face's greedy tokens; verify's logits at every node of chains made from Hugging Face's tokens
(accepted nodes and the wrong ones after a deviation) equal Hugging Face's for those prefixes; every row of every
block the draft runs (its prefill, over the prompt's delta, and each catch-up, over the accepted path's) equals the
case's draft reference, which reads the target's hidden states of all committed positions: a delta row written at the
wrong position, for the wrong sequence, or not at all moves them. A wrong input fails the check.

The block draft proposes nothing level by level: the pair's own rounds verify the block's guesses (rows 1 .. B - 1,
each guessing the token at its own position) as a chain after the root."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from tests._parity import when
from tests._parity_spec import (
    SPEC_SCENARIOS,
    DraftFamily,
    Hook,
    Proposer,
    SpecCase,
    SpecCompare,
    State,
    Tree,
    planted_spec,
    run_spec,
)
from trtio.families.hybrid.replay import GdnReplay
from trtio.families.hybrid.snapshots import IntermediateStates

CASE = "qwen3-dflash"
HYBRID = "qwen3_5-dflash"  # the same draft layout on the MTP case's Qwen3.5 base (target layers 0, 1, 2)


@pytest.fixture(scope="module")
def case() -> SpecCase:
    return SpecCase(CASE)


# -- the block draft's part in the rounds ------------------------------------------------------------------------------


def _blocks(case: SpecCase, state: State, which: list[int]) -> np.ndarray:
    """The blocks [len(which), B, hidden] of sequences ``which``: each pending token (the last committed one the base
    has not run), then mask tokens."""
    spec = case.spec
    ids = [[int(state.seqs[i].tokens[state.committed[i]])] + [spec["mask_token_id"]] * (spec["block_size"] - 1)
           for i in which]
    return case.table("base")[np.array(ids)]


def _compare_blocks(case: SpecCase, cmp: SpecCompare, state: State, which: list[int], got: np.ndarray,
                    what: str) -> None:
    """Every row of each block held to the draft's reference for the sequence's committed length."""
    for i, rows in zip(which, got):
        s = state.seqs[i]
        c = state.committed[i]
        want = case.arrays[f"draft_blocks_{s.index}"][c - s.prompt_length]
        for j in range(rows.shape[0]):
            cmp.draft.values(want[j], rows[j], f"sequence {s.index} block row {j} after {c} tokens ({what})")


def _draft_prefill(setup: Any, case: SpecCase, cmp: SpecCompare, state: State, which: list[int],
                   slots: list[int] | None) -> None:
    """The draft's prefill: the prompts' delta (the base prefill's rows) and each sequence's first block."""
    b = case.spec["block_size"]
    lens = [state.seqs[i].prompt_length for i in which]
    got = setup.draft_prefill(_blocks(case, state, which), lens, slots=slots).to_numpy().reshape(len(which), b, -1)
    if state.root is None:
        state.root = got.copy()
    else:
        state.root[which] = got
    _compare_blocks(case, cmp, state, which, got, "draft prefill" if slots is None else "admitted draft prefill")


def _catch_up(setup: Any, case: SpecCase, cmp: SpecCompare, state: State, lens: list[int]) -> None:
    """The draft's catch-up after an accept of ``lens`` tokens: the accepted paths' delta and the next blocks (each
    after its bonus token, the base's greedy token at the path's last node)."""
    b = len(state.seqs)
    moved = State(state.seqs, [c + n for c, n in zip(state.committed, lens)], state.root)
    got = setup.draft_accept(_blocks(case, moved, list(range(b))), lens).to_numpy()
    state.root = got.reshape(b, case.spec["block_size"], -1).copy()
    _compare_blocks(case, cmp, moved, list(range(b)), state.root, f"round {state.round} catch-up")


def _guesses(d2t: np.ndarray) -> Proposer:
    """The pair's own rounds: the root then the block's guesses (rows 1 .. B - 1) as a chain."""
    del d2t  # a DFlash draft predicts the target's vocabulary

    def propose(setup: Any, case: SpecCase, state: State, cmp: SpecCompare) -> Tree:
        assert state.root is not None
        b = case.spec["block_size"]
        tokens = [[int(s.tokens[c]), *(int(t) for t in root[1:].argmax(axis=1))]
                  for s, c, root in zip(state.seqs, state.committed, state.root)]
        return Tree(tokens, [list(range(-1, b - 1)) for _ in tokens])
    return propose


DFLASH = DraftFamily(_draft_prefill, _catch_up, _guesses, proposes=False)


# Every scenario on the host backend, and on a GPU graphs off and on; graphs on the host too for the admission.
RUNS = [pytest.param(scenario, backend, graphs, marks=[pytest.mark.gpu] if backend == "cuda" else [])
        for scenario in SPEC_SCENARIOS for backend, graphs in (("host", False), ("cuda", False), ("cuda", True))]
RUNS.append(pytest.param("admission", "host", True))


# Accepted path lengths per round (sequences 0, 1, 2): the chains deviate from Hugging Face's tokens at levels
# (none, 3, 2), (none, 3, 1), (none, 2, none) (scripts/parity_cases/dflash.py::DEVIATE).
ACCEPTED = [4, 3, 2, 4, 3, 1, 4, 2, 4]


def _check_counts(scenario: str, cmp: SpecCompare) -> None:
    """The rows each scenario compares and the paths it accepts (the dense and the hybrid case alike)."""
    if scenario == "base_tree":  # every node of three rounds of 4-node chains, and the three prefill rows
        assert cmp.base.rows == 3 + 3 * 3 * 4 and cmp.accepted == ACCEPTED and cmp.draft.rows == 0
    if scenario == "draft_tree":  # the last sequence's chains without their last node; 4 rows a block
        assert cmp.base.rows == 3 + 3 * (4 + 4 + 3) and cmp.accepted == [*ACCEPTED[:8], 3]
        assert cmp.draft.rows == (3 + 3 * 3) * 4
    if scenario == "draft_rounds":  # the random draft's own guesses: its first is never the base's
        assert cmp.base.rows == 3 + 4 * 3 and cmp.draft.rows == (3 + 4 * 3) * 4 and set(cmp.accepted) == {1}
    if scenario == "admission":  # the admitted request's prefills besides; it starts again from its first chain
        assert cmp.base.rows == 4 + 3 * 3 * 4 and cmp.draft.rows == (4 + 3 * 3) * 4
        assert cmp.accepted == [4, 3, 2, 4, 3, 1, 4, 3, 4]


@pytest.mark.parametrize("scenario, backend, graphs", RUNS)
def test_equals_hugging_face(case: SpecCase, scenario: str, backend: str, graphs: bool) -> None:
    cmp = run_spec(case, scenario, backend, graphs, family=DFLASH)
    assert cmp.base.worst <= 0.1 and cmp.draft.worst <= 0.1
    _check_counts(scenario, cmp)


# -- a hybrid base -------------------------------------------------------------------------------------------------
# Edge-LLM 0.11 exports every DFlash base as a DDTree base (model.py: dflash_base sets dflash_tree_base; the builder
# writes dflash_tree_base: true into its config): on a Qwen3.5 base its gated_delta_net nodes carry use_ddtree and
# verify statelessly, writing a replay stash into intermediate_recurrent_state_j (gdnTreeChunkKernels.h) that the
# runtime's commit replays along the accepted path (gdnTreeReplayCommitBatched); its causal_conv1d nodes write each
# node's window. trtio replays the stash (trtio/families/hybrid/replay.py) and copies the accepted node's window;
# before it copied the accepted node's intermediate rows as the state ("snapshot"), and the first verify after an
# accept was NaN here (the model leaves the scratch after the stash NaN; garbage on a GPU): the first planted bug
# below. docs/edgellm-assumptions.md 11.2.


@pytest.fixture(scope="module")
def hybrid() -> SpecCase:
    return SpecCase(HYBRID)


@pytest.mark.parametrize("scenario, backend, graphs", RUNS)
def test_a_hybrid_base_equals_hugging_face(hybrid: SpecCase, scenario: str, backend: str, graphs: bool) -> None:
    """On the Qwen3.5 base (three Gated DeltaNet layers, each accept replayed): the same rounds as the dense base's,
    every verify after an accept from the replayed states."""
    cmp = run_spec(hybrid, scenario, backend, graphs, family=DFLASH)
    assert cmp.base.worst <= 0.1 and cmp.draft.worst <= 0.1
    _check_counts(scenario, cmp)


@contextlib.contextmanager
def _patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """``owner.name`` replaced by ``make(the real one)`` while the block runs."""
    real = getattr(owner, name)
    setattr(owner, name, make(real))
    try:
        yield
    finally:
        setattr(owner, name, real)


def _copy_commit(real: Any) -> Any:
    """trtio's commit before the replay: the accepted node's intermediate recurrent rows copied into the slot as if
    they were its state (they hold the stash and the plugin's scratch)."""
    def commit(self: GdnReplay, slots: np.ndarray, rows: np.ndarray, lengths: np.ndarray, nodes: int,
               stream: Any) -> None:
        last = rows[np.arange(len(slots)), lengths - 1]
        pools = [p.to_numpy() for p in self._pools]
        for pool, stash, tensor in zip(pools, self._stash, self._pools):
            inter = stash.to_numpy()
            pool[slots] = inter[last]
            tensor.copy_from(pool, stream)
    return commit


def _replayed(change: Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray, int]]) -> Any:
    """The replay of other rows: ``change(rows, lengths, nodes)`` gives what the real commit replays."""
    def make(real: Any) -> Any:
        def commit(self: GdnReplay, slots: np.ndarray, rows: np.ndarray, lengths: np.ndarray, nodes: int,
                   stream: Any) -> None:
            real(self, slots, *change(np.asarray(rows), np.asarray(lengths), nodes), stream)
        return commit
    return make


def _without_root(rows: np.ndarray, lengths: np.ndarray, nodes: int) -> tuple[np.ndarray, np.ndarray, int]:
    return np.concatenate([rows[:, 1:], np.full((len(rows), 1), -1)], axis=1), lengths - 1, nodes


def _last_only(rows: np.ndarray, lengths: np.ndarray, nodes: int) -> tuple[np.ndarray, np.ndarray, int]:
    return rows[np.arange(len(rows)), lengths - 1][:, None], np.ones_like(lengths), nodes


def _stash_rows_apart(rows: np.ndarray, lengths: np.ndarray, nodes: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Each sequence's stash looked for one row further on per sequence (a wrong verify width)."""
    seq = np.arange(len(rows))[:, None]
    return np.where(rows >= 0, rows + seq, -1), lengths, nodes + 1


def _conv_of_node_before(real: Any) -> Any:
    def copy_last(self: Any, slots: np.ndarray, last: np.ndarray, stream: Any) -> None:
        real(self, slots, np.where(last % VERIFY > 0, last - 1, last), stream)
    return copy_last


VERIFY = 4  # the chains' nodes: the verify width

HYBRID_BUGS: dict[str, tuple[Any, str, Callable[[Any], Any]]] = {
    "accept copies the accepted node's intermediate recurrent rows as the state (trtio before the replay)": (
        GdnReplay, "commit", _copy_commit),
    "the replay skips the path's root": (GdnReplay, "commit", _replayed(_without_root)),
    "the replay runs the path's last node only": (GdnReplay, "commit", _replayed(_last_only)),
    "the replay reads each sequence's stash one row per sequence further on": (
        GdnReplay, "commit", _replayed(_stash_rows_apart)),
    "accept copies the conv window of the node before the accepted one": (
        IntermediateStates, "copy_last", _conv_of_node_before),
}


@pytest.mark.parametrize("bug", list(HYBRID_BUGS))
def test_a_planted_commit_bug_fails_the_hybrid_parity(hybrid: SpecCase, bug: str) -> None:
    owner, name, make = HYBRID_BUGS[bug]
    with _patched(owner, name, make):
        how = planted_spec(hybrid, "base_tree", family=DFLASH)
    assert how.startswith("mismatch")


# -- planted bugs ---------------------------------------------------------------------------------------------------


def _copy(inputs: dict[str, np.ndarray], name: str) -> np.ndarray:
    inputs[name] = np.array(inputs[name])
    return inputs[name]


def _draft_steps(first: bool) -> Any:
    """A draft hook only in its first step (the prefill's delta: the prompts) or only in the later ones (the
    catch-ups' deltas: the accepted paths)."""
    def wrap(bug: Hook) -> Hook:
        seen = [0]

        def hook(inputs: dict[str, np.ndarray]) -> None:
            seen[0] += 1
            if (seen[0] == 1) == first:
                bug(inputs)
        return hook
    return wrap


def _real(inputs: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(inputs["dflash_delta_token_to_sequence"]) >= 0


def _delta_positions_late(inputs: dict[str, np.ndarray]) -> None:
    real = _real(inputs)
    _copy(inputs, "dflash_delta_positions")[real] += 1


def _delta_of_sequence_0_to_1(inputs: dict[str, np.ndarray]) -> None:
    owners = _copy(inputs, "dflash_delta_token_to_sequence")
    owners[owners == 0] = 1


def _delta_rope_late(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "dflash_delta_rope_cos_sin")
    t[1:] = t[:-1].copy()


def _delta_features_late(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "dflash_target_hidden_concat")
    t[1:] = t[:-1].copy()


def _delta_last_row_dropped(inputs: dict[str, np.ndarray]) -> None:
    """Each sequence's last delta row marked padding: its position's keys and values never written."""
    owners, positions = _copy(inputs, "dflash_delta_token_to_sequence"), _copy(inputs, "dflash_delta_positions")
    for b in np.unique(owners[owners >= 0]):
        last = int(np.flatnonzero(owners == b)[-1])
        owners[last] = positions[last] = -1


def _block_causal(inputs: dict[str, np.ndarray]) -> None:
    """The block's mask causal (row j sees rows 0 .. j) where DFlash's is bidirectional."""
    w = int(inputs["inputs_embeds"].shape[0] // inputs["query_lengths"].shape[0])
    mask = _copy(inputs, "packed_attention_mask")
    mask[:, 0] = np.tile((np.int32(2) << np.arange(w, dtype=np.int32)) - 1, mask.shape[0] // w)


def _block_rope_late(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "rope_rotary_cos_sin")
    t[1:] = t[:-1].copy()


def _pages_swapped(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "kv_page_table")
    t[[0, 1]] = t[[1, 0]]


def _verify_sees_ahead(inputs: dict[str, np.ndarray]) -> None:
    w = int(inputs["inputs_embeds"].shape[0] // inputs["query_lengths"].shape[0])
    _copy(inputs, "packed_attention_mask")[:w, 0] = np.int32((1 << w) - 1)


# (scenario, engine hooks by role): each plants one wrong runtime input, as a trtio bug would write it.
BUGS: dict[str, tuple[str, dict[str, Hook]]] = {
    "delta positions one late": ("draft_tree", {"draft": _delta_positions_late}),
    "sequence 0's delta rows given to sequence 1": ("draft_tree", {"draft": _delta_of_sequence_0_to_1}),
    "delta RoPE rows one late": ("draft_tree", {"draft": _delta_rope_late}),
    "the prompts' delta without each prompt's last token": (
        "draft_tree", {"draft": _draft_steps(first=True)(_delta_last_row_dropped)}),
    "catch-up delta features one row late (an accepted node's from its parent)": (
        "draft_tree", {"draft": _draft_steps(first=False)(_delta_features_late)}),
    "the block's mask causal, not bidirectional": ("draft_tree", {"draft": _block_causal}),
    "the block's RoPE rows one late": ("draft_tree", {"draft": _block_rope_late}),
    # (swapped in every step the pages are only renamed, consistently: no parity check sees that by construction)
    "the draft's page-table rows of two sequences swapped after the prefill": (
        "draft_tree", {"draft": _draft_steps(first=False)(_pages_swapped)}),
    "verify mask: nodes see the nodes after them": ("base_tree", {"base": when(phase=5)(_verify_sees_ahead)}),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_input_bug_fails_parity(case: SpecCase, bug: str) -> None:
    scenario, hooks = BUGS[bug]
    how = planted_spec(case, scenario, hooks, family=DFLASH)
    assert how.startswith(("mismatch", "refused"))
