"""Real-graph parity of a JetSpec pair (DESIGN §17): NVIDIA's exported dense Qwen3 base (``--jetspec-base``) and
JetSpec block draft (``--jetspec-draft``: a causal DFlash draft, ``jetspec_config.causal_head: true``), driven by
trtio's SpecDecodeSetup (``trtio.families.spec.jetspec``, the block steps of ``trtio.families.spec.dflash``). The
accepted tokens equal Hugging Face's greedy tokens; verify's logits at every node of the rounds' chains equal Hugging
Face's; every row of every block the draft runs equals the case's causal draft reference
(``scripts/parity_cases/jetspec.py``: block row ``i`` sees the committed positions and block rows ``0 .. i``, as
Edge-LLM's ``dflashPrepareProposalInputsKernel`` writes the mask with ``causalProposalMask``). The rounds are DFlash's
(``tests/test_parity_dflash.py``): a wrong mask, position or delta input fails the check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from test_parity_dflash import BUGS as DFLASH_BUGS
from test_parity_dflash import (
    DFLASH,
    RUNS,
    _check_counts,
    _copy,
    _delta_features_late,
    _delta_last_row_dropped,
)

from tests._parity_spec import Hook, SpecCase, planted_spec, run_spec

CASE = "qwen3-jetspec"


@pytest.fixture(scope="module")
def case() -> SpecCase:
    return SpecCase(CASE)


def test_the_case_is_a_jetspec_pair_whose_draft_differs_from_a_bidirectional_one(case: SpecCase) -> None:
    """The fixture is what the exporter wrote for a JetSpec pair, and its causal references are not the
    bidirectional ones (the mask matters: a row's logits move when it sees the rows after it)."""
    assert case.spec["block_size"] == 4 and case.spec["mask_token_id"] == 511
    dflash = SpecCase("qwen3-dflash")  # the same base and seed: the same draft weights, a bidirectional block
    mine, theirs = case.arrays["draft_blocks_0"], dflash.arrays["draft_blocks_0"]
    assert np.abs(mine[:, -1] - theirs[:, -1]).max() < 1e-4, "the last row sees the whole block either way"
    assert np.abs(mine[:, 0] - theirs[:, 0]).max() > 0.5, "the root row sees itself only in a causal block"


@pytest.mark.parametrize("scenario, backend, graphs", RUNS)
def test_equals_hugging_face(case: SpecCase, scenario: str, backend: str, graphs: bool) -> None:
    cmp = run_spec(case, scenario, backend, graphs, family=DFLASH)
    assert cmp.base.worst <= 0.1 and cmp.draft.worst <= 0.1
    _check_counts(scenario, cmp)


# -- planted bugs ---------------------------------------------------------------------------------------------------


def _width(inputs: dict[str, np.ndarray]) -> int:
    return int(inputs["inputs_embeds"].shape[0] // inputs["query_lengths"].shape[0])


def _block_bidirectional(inputs: dict[str, np.ndarray]) -> None:
    """The block's mask DFlash's (every row sees the whole block) where JetSpec's is causal."""
    _copy(inputs, "packed_attention_mask")[:, 0] = np.int32((1 << _width(inputs)) - 1)


def _block_sees_next_row(inputs: dict[str, np.ndarray]) -> None:
    """Each block row sees the row after it too (a causal mask one row too wide)."""
    w = _width(inputs)
    mask = _copy(inputs, "packed_attention_mask")
    mask[:, 0] = np.tile(np.minimum((np.int32(4) << np.arange(w, dtype=np.int32)) - 1, (1 << w) - 1),
                         mask.shape[0] // w)


def _block_one_slot_early(inputs: dict[str, np.ndarray]) -> None:
    """Each sequence's block placed one slot early (``attention_sequence_lengths`` one short): its first row
    overwrites the last committed token's keys and values."""
    _copy(inputs, "attention_sequence_lengths")[:] -= 1


def _block_rope_from_the_committed_length(inputs: dict[str, np.ndarray]) -> None:
    """Every block row given its root's RoPE row (the committed length's), not committed length + j."""
    w = _width(inputs)
    t = _copy(inputs, "rope_rotary_cos_sin")
    t[:] = np.repeat(t[::w].copy(), w, axis=0)


def _prompt_delta(bug: Hook) -> Hook:
    """``bug`` in the draft steps whose delta holds a prompt (a delta row at position 0), or in the others."""
    def hook(inputs: dict[str, np.ndarray]) -> None:
        if (np.asarray(inputs["dflash_delta_positions"]) == 0).any():
            bug(inputs)
    return hook


def _prompt_rows_dropped(inputs: dict[str, np.ndarray]) -> None:
    """Each prompt's last delta row marked padding, over a draft KV pool that holds nothing yet (zeroed in place
    first: the pool's memory is reused between runs, and a row left unwritten would otherwise read the right keys and
    values an earlier run left there)."""
    for name in inputs:
        if name.startswith("past_key_values_"):
            inputs[name][...] = 0
    _delta_last_row_dropped(inputs)


def _catch_up_delta(bug: Hook) -> Hook:
    def hook(inputs: dict[str, np.ndarray]) -> None:
        if not (np.asarray(inputs["dflash_delta_positions"]) == 0).any():
            bug(inputs)
    return hook


# (scenario, engine hooks by role): each plants one wrong runtime input, as a trtio bug would write it. Made afresh for
# each run.
BUGS: dict[str, Callable[[], tuple[str, dict[str, Hook]]]] = {
    "the block's mask bidirectional (DFlash's), not causal": lambda: ("draft_tree", {"draft": _block_bidirectional}),
    "each block row sees the next row too": lambda: ("draft_tree", {"draft": _block_sees_next_row}),
    "the block placed one slot early (over the last committed token)": lambda: (
        "draft_tree", {"draft": _block_one_slot_early}),
    "every block row at its root's RoPE position": lambda: (
        "draft_tree", {"draft": _block_rope_from_the_committed_length}),
    "the prompts' delta without each prompt's last token": lambda: (
        "draft_tree", {"draft": _prompt_delta(_prompt_rows_dropped)}),
    "catch-up delta features one row late (an accepted node's from its parent)": lambda: (
        "draft_tree", {"draft": _catch_up_delta(_delta_features_late)}),
    **{bug: (lambda bug=bug: DFLASH_BUGS[bug]) for bug in (  # stateless hooks: shared with the DFlash file's
        "delta positions one late", "sequence 0's delta rows given to sequence 1", "delta RoPE rows one late",
        "the block's RoPE rows one late", "verify mask: nodes see the nodes after them")},
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_input_bug_fails_parity(case: SpecCase, bug: str) -> None:
    scenario, hooks = BUGS[bug]()
    how = planted_spec(case, scenario, hooks, family=DFLASH)
    assert how.startswith(("mismatch", "refused"))


def test_trtio_writes_the_drafts_causal_mask_and_positions(case: SpecCase) -> None:
    """What trtio writes for the draft's block, read at the graph: JetSpec's rows ``2^(j+1) - 1`` (rows 0 .. j), the
    positions committed length + j, as Edge-LLM's kernel writes them (the attention plugin reads
    ``attention_position_ids`` for padding only, -1, so parity alone cannot see a shifted id: this pins it)."""
    seen: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def record(inputs: dict[str, Any]) -> None:
        seen.append((np.array(inputs["packed_attention_mask"][:, 0]), np.array(inputs["attention_position_ids"]),
                     np.array(inputs["past_lengths"])))
    cmp = run_spec(case, "draft_tree", hooks={"draft": record}, family=DFLASH)
    assert cmp.draft.worst <= 0.1 and len(seen) == 1 + 3  # the prefill and three catch-ups
    for mask, ids, past in seen:
        w = mask.shape[0] // past.shape[0]
        assert mask.tolist() == [(1 << (j + 1)) - 1 for j in range(w)] * past.shape[0]
        assert ids.tolist() == [int(p) + j for p in past for j in range(w)]
