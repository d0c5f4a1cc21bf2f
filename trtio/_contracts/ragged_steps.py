"""The ragged contract as an object: its PipelineIO layout, its bindings, and how a step stages its inputs.

Token-major worst case: ``T`` rows = batch x the longest step of any engine (prompt, verify tree or
draft tree), logits rows = batch x the most rows a step selects. A step's per-step inputs (offsets,
lengths, positions, logits rows, tree masks) live in one step block (:class:`~trtio._staging.StepStaging`):
one host write and one copy per step, the rest laid out on the device (:mod:`trtio._ops`). The host layouts
themselves are :mod:`trtio._contracts.ragged`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from trtio import names
from trtio._config import DeploymentConfig, LLMEngineConfig
from trtio._contracts.contract import (
    PAGE_TABLE_NAMES,
    ROUND_NEXT,
    Contract,
    DraftLevelPlan,
    EngineView,
    Pipeline,
    PipelineLayout,
    StepInputs,
    absent,
    mrope_request,
    rope_row_bytes,
)
from trtio._contracts.ragged import (
    PHASE_DECODE,
    PHASE_DRAFT,
    PHASE_PREFILL,
    PHASE_PREFILL_RESTORED,
    StepLayout,
    TreeLayout,
    causal_step,
    decode_step,
    ramp,
    registry_for,
)
from trtio._dtypes import DType
from trtio._memory import TensorRequest
from trtio._ops import CatchUpTargets, DecodeAdvance, DraftLevel, DraftTreeBuffers, TreeStep, TreeTargets
from trtio._registry import TensorRegistry
from trtio._staging import StagedGroup
from trtio._stream import Stream
from trtio._tensor_map import TensorMap
from trtio.features import FamilyConfig

if TYPE_CHECKING:
    from trtio._engine import DeviceWork
    from trtio._tensor import Tensor

__all__ = ["RaggedContract", "RaggedSteps"]

# The members a user sees on a ragged PipelineIO (Edge-LLM 0.11's, and trtio's row buffers).
_MEMBERS = (
    "query_start_offsets", "query_lengths", "past_lengths", "attention_sequence_lengths", "state_indices",
    "logits_indices", "row_src", "row_dst", "rope_rows", "positions", "spec_tree_parent_ids", "spec_tree_depths",
    "ragged_rope_cos_sin", "execution_phase_marker", "context_sequence_count_carrier", "skip_softmax_scale",
    "row_scratch", "packed_attention_mask", "spec_decode_position_ids",
)


# The seed's batch-major lengths and selection (and trtio's pinned twins of the batch contract's tree inputs): this
# contract's steps carry lengths, offsets and logits rows in their own inputs instead.
_UNAVAILABLE = ("context_lengths", "host_context_lengths", "select_token_indices", "host_select_token_indices",
                "host_packed_attention_mask", "host_spec_decode_position_ids", "host_spec_select_token_indices")


def _step_requests(base: LLMEngineConfig, bundle: DeploymentConfig | None, b: int, t: int,
                   p: int) -> list[TensorRequest]:
    """The step block's tensors, in upload order (see the comment below), for ``b`` slots, ``t`` token rows and
    ``p`` logits rows per sequence."""
    draft = bundle.draft if bundle is not None else None
    rows, words = b * p, math.ceil(p / 32)
    i32 = DType.INT32
    # Per-step inputs. Each upload copies one byte range, from the first value a step wrote to the last: what the
    # steps write on their own comes first (the lengths, a DFlash delta's rows, offsets, slots and a level's
    # parents), then what a tree step writes together (its lengths, logits rows, parents, depths and mask), then the
    # page tables (written when they change), the row lists, the base's own tree inputs, and last what only the
    # device writes (positions, RoPE rows).
    # decode_lengths (an LLM's): the device's copy of the lengths, which a decode step advances itself.
    offsets = TensorRequest.of("query_start_offsets", (b + 1,), i32)
    step = [TensorRequest.of("decode_lengths", (b,), i32), offsets] if bundle is None else []
    step.append(TensorRequest.of("past_lengths", (b,), i32))
    # what a family writes every step with the lengths (a DFlash delta)
    step += _unique([r for cfg, family in _families(base, bundle) for r in family.step_requests(cfg, "lengths", b, t)])
    step.append(TensorRequest.of("state_indices", (b,), i32))
    if draft is not None:
        step += [TensorRequest.of("draft_roots", (b,), i32),  # each sequence's root hidden row (ops.DraftLevel)
                 TensorRequest.of("draft_parents", (rows,), i32)]  # a draft level's parents (ops.DraftLevel)
    step.append(TensorRequest.of("attention_sequence_lengths", (b,), i32))
    if bundle is not None:  # next to a tree layout's constants: a draft tree step writes them together
        step.append(offsets)
    step += [
        TensorRequest.of("query_lengths", (b,), i32),
        TensorRequest.of("logits_indices", (rows,), DType.INT64),
    ]
    if bundle is not None:
        step += [
            TensorRequest.of("spec_tree_parent_ids", (t,), i32),
            TensorRequest.of("spec_tree_depths", (t,), i32),
            TensorRequest.of("packed_attention_mask", (t, words), i32),
            # The catch-up's row lists (CatchUp: its scratch rows, then the accepted rows): only it writes them.
            TensorRequest.of("catch_up_dst", (rows,), i32),
            TensorRequest.of("catch_up_src", (rows,), i32),
        ]
    # The page-table rows of a step's sequences (step order), staged when they change (pages on demand).
    step.append(TensorRequest.of(PAGE_TABLE_NAMES[False], (b, 2, base.pages_per_sequence), i32))
    # what a family stages with them (a bounded window's page rows)
    step += _unique([r for cfg, family in _families(base, bundle) for r in family.step_requests(cfg, "pages", b, t)])
    if draft is not None:
        step.append(TensorRequest.of(PAGE_TABLE_NAMES[True], (b, 2, draft.pages_per_sequence), i32))
    step += [
        TensorRequest.of("row_src", (t,), i32),
        TensorRequest.of("row_dst", (t,), i32),
    ]
    if bundle is not None:
        # The base's own tree inputs (_BASE_OWN): only its steps write them, so a verify tree that repeats
        # finds them in the block however many draft steps ran since (those rewrite the draft's on the device).
        step += [
            TensorRequest.of(_BASE_OFFSETS, (b + 1,), i32),
            TensorRequest.of("verify_query_lengths", (b,), i32),
            TensorRequest.of("verify_logits_indices", (rows,), DType.INT64),
            TensorRequest.of("verify_tree_parent_ids", (t,), i32),
            TensorRequest.of("verify_tree_depths", (t,), i32),
            TensorRequest.of("verify_packed_attention_mask", (t, words), i32),
        ]
    if draft is not None:
        # The draft catch-up's own (_CATCH_UP_NAMES): the levels rewrite the shared ones on the device every
        # round, so a catch-up that repeats finds its tree here; sized for the longest catch-up (accept_dims).
        longest = max(draft.max_draft_tree_size, 1)
        a = b * longest
        step += [
            TensorRequest.of("catch_up_query_start_offsets", (b + 1,), i32),
            TensorRequest.of("catch_up_query_lengths", (b,), i32),
            TensorRequest.of("catch_up_logits_indices", (b,), DType.INT64),
            TensorRequest.of("catch_up_tree_parent_ids", (a,), i32),
            TensorRequest.of("catch_up_tree_depths", (a,), i32),
            TensorRequest.of("catch_up_packed_attention_mask", (a, math.ceil(longest / 32)), i32),
        ]
    step += [
        TensorRequest.of("positions", (t,), i32),
        TensorRequest.of("rope_rows", (t,), i32),
    ]
    if bundle is not None:
        step.append(TensorRequest.of("spec_decode_position_ids", (t,), i32))
    if draft is not None:
        step.append(TensorRequest.of(ROUND_NEXT, (b,), i32))  # last: only the device writes it (contract.ROUND_NEXT)
    return step


def _unique(requests: list[TensorRequest]) -> list[TensorRequest]:
    """One request a name, in the order first asked: a member the families of both engines of a pair ask for (a
    family both configs have) is one tensor, the larger of the two asked."""
    out: dict[str, TensorRequest] = {}
    for r in requests:
        have = out.get(r.name)
        if have is None or math.prod(r.shape) > math.prod(have.shape):
            out[r.name] = r
    return list(out.values())


def _families(base: LLMEngineConfig, bundle: DeploymentConfig | None) -> list[tuple[LLMEngineConfig, FamilyConfig]]:
    """Every family of the engines a PipelineIO serves (the LLM or the base first, then the draft), with the config
    it belongs to."""
    configs = [base] if bundle is None or bundle.draft is None else [base, bundle.draft]
    return [(cfg, family) for cfg in configs for family in cfg.features]


class RaggedContract(Contract):
    """Edge-LLM 0.11's token-major contract with paged KV pools (see :mod:`trtio._contracts.ragged`)."""

    name = "ragged"
    kv_layout = "paged"
    slotted = True

    def registry(self, cfg: LLMEngineConfig) -> TensorRegistry:
        return registry_for(cfg)

    def pipeline_layout(self, base: LLMEngineConfig, bundle: DeploymentConfig | None,
                        max_batch: int) -> PipelineLayout:
        b = max_batch
        act, h = base.activation, base.hidden_size
        spec = bundle.spec if bundle is not None else None
        draft = bundle.draft if bundle is not None else None
        p = bundle.effective_max_draft_proposal_size() if bundle is not None else 1
        max_input = max(base.max_supported_input_length,
                        draft.max_supported_input_length if draft is not None else 0)
        t = b * max(max_input, p)
        rows = b * p  # logits rows: one per sequence (LLM), every tree node (verify), top-k per sequence (draft)
        vocab = max(base.output_vocab_size, draft.output_vocab_size if draft is not None else 0)
        i32 = DType.INT32
        reqs = [
            TensorRequest.of("inputs_embeds", (t, h), act),
            TensorRequest.of("output_logits", (rows, vocab), DType.FLOAT32),
        ]
        nd = base.num_deepstack_features
        reqs += [TensorRequest.of(names.deepstack_embeds(i), (t, h), act) for i in range(nd)]
        zero_rows = b * (max(spec.verify_size, 1) if spec is not None else 1)
        reqs.append(TensorRequest.of("deepstack_zero", (zero_rows, h), act) if nd else absent("deepstack_zero", act))
        reqs.append(mrope_request(base, b))
        if spec is not None:
            width = max(spec.base_output_hidden_dim, spec.draft_hidden_size)
            reqs += [
                TensorRequest.of("base_hidden_states", (t, spec.base_output_hidden_dim), act),
                TensorRequest.of("draft_hidden_states_in", (t, spec.draft_hidden_size), act),
                # Past the T rows a step writes: one row per slot keeping its root hidden state between rounds.
                TensorRequest.of("draft_hidden_states_out", (t + b, spec.draft_hidden_size), act),
                TensorRequest.of("row_scratch", (rows, width), act),
            ]
        else:
            reqs += [absent(m, act) for m in ("base_hidden_states", "draft_hidden_states_in",
                                              "draft_hidden_states_out", "row_scratch")]
        own = _unique([r for cfg, family in _families(base, bundle) for r in family.members(cfg, t)])  # families
        reqs += own
        reqs += [
            absent("output_hidden_states", act),
            TensorRequest.of("ragged_rope_cos_sin", (t, base.rotary_dim), DType.FLOAT32),
            # Shape-only carriers: the engine reads their extents, never their bytes.
            TensorRequest.of("execution_phase_marker", (8,), i32),
            TensorRequest.of("context_sequence_count_carrier", (b,), i32),
            TensorRequest.of("skip_softmax_scale", (1,), DType.INT8),
        ]
        step = _step_requests(base, bundle, b, t, p)
        if bundle is None:
            reqs += [absent("packed_attention_mask", i32), absent("spec_decode_position_ids", i32),
                     absent("spec_tree_parent_ids", i32), absent("spec_tree_depths", i32)]
        title = "PipelineIO(spec_decode, ragged)" if bundle is not None else "PipelineIO(llm, ragged)"
        return PipelineLayout(
            title, reqs, step, max_batch=b, max_seq=t // b, hidden_size=h, is_spec_decode=bundle is not None,
            num_deepstack=nd, members=_MEMBERS + tuple(r.name for r in own),
            zeroed=("execution_phase_marker", "context_sequence_count_carrier", "skip_softmax_scale", "deepstack_zero",
                    "base_hidden_states", "draft_hidden_states_in", "draft_hidden_states_out"),
            unavailable=_UNAVAILABLE)

    def bind_pipeline(self, io: Pipeline, tm: TensorMap, cfg: LLMEngineConfig) -> None:
        """The token-major inputs (Edge-LLM 0.11). ``valid_tree_counts`` is an alias of ``query_lengths``;
        RoPE rows are gathered per token into ``ragged_rope_cos_sin``. A spec-decode base binds its own
        query offsets, query lengths, logits rows and tree inputs (step-block tensors, :data:`_BASE_OWN`): the
        draft's steps rewrite the shared ones every round."""
        tm.set(names.kRopeCosSin, io.member("ragged_rope_cos_sin"))  # a family may bind its rows elsewhere
        tm.set(names.kPositions, io.member("positions"))
        own = _BASE_OWN if cfg.role == "base" and io.is_spec_decode else {}

        def member(name: str) -> Tensor:  # the engine's own copy of a tree input, else the shared member
            mine = own.get(name)
            if mine is None:
                return io.member(name)
            assert io.step is not None
            return io.step.tensors[mine]

        tm.set(names.kQueryStartOffsets, member("query_start_offsets"))
        tm.set(names.kQueryLengths, member("query_lengths"))
        tm.set(names.kPastLengths, io.member("past_lengths"))
        tm.set(names.kAttentionSequenceLengths, io.member("attention_sequence_lengths"))
        tm.set(names.kStateIndices, io.member("state_indices"))
        tm.set(names.kExecutionPhaseMarker, io.member("execution_phase_marker"))
        tm.set(names.kContextSequenceCountCarrier, io.member("context_sequence_count_carrier"))
        tm.set(names.kLogitsIndices, member("logits_indices"))
        tm.set(names.kSkipSoftmaxScale, io.member("skip_softmax_scale"))
        if io.is_spec_decode:
            tm.set(names.kPackedAttentionMask, member("packed_attention_mask"))
            tm.set(names.kAttentionPositionIds, io.spec_decode_position_ids)
            tm.set(names.kTreeParentIds, member("spec_tree_parent_ids"))
            tm.set(names.kTreeDepths, member("spec_tree_depths"))
            tm.set(names.kValidTreeCounts, member("query_lengths"))

    def binds_rope_table(self, cfg: LLMEngineConfig) -> bool:
        return False  # each step gathers its tokens' rows from the table

    def steps(self, io: Pipeline, rope_table: Callable[[LLMEngineConfig, Stream], Tensor]) -> StepInputs:
        return RaggedSteps(io, rope_table)

    def page_table(self, io: Pipeline, role: str) -> Tensor | None:
        assert io.step is not None
        return io.step.tensors[PAGE_TABLE_NAMES[role == "draft"]]

    def catch_up_map(self, io: Pipeline, tm: TensorMap) -> TensorMap:
        """A copy of the draft's map ``tm`` with the catch-up's own query offsets, lengths, logits rows and tree
        inputs (:data:`_CATCH_UP_NAMES`, step-block tensors) in place of the shared ones, which a round's levels
        rewrite on the device: the two plans of the draft bind different tensors for them."""
        assert io.step is not None
        own = io.step.tensors
        swap = {names.kQueryStartOffsets: own[_CATCH_UP_NAMES["query_start_offsets"]]}
        for engine_name, member in _TREE_BINDINGS.items():
            if engine_name in tm:
                swap[engine_name] = own[_CATCH_UP_NAMES[member]]
        out = TensorMap(f"{tm.name} catch-up")
        for name, t in tm.items():
            out.set(name, swap.get(name, t))
        out.freeze()
        return out


# What a decode step's device work writes into the step block (stale on the host after it runs).
_DECODE_WRITES = ("past_lengths", "attention_sequence_lengths", "positions", "rope_rows")
# What a tree step's device work writes.
_TREE_WRITES = ("attention_sequence_lengths", "positions", "spec_decode_position_ids", "rope_rows")
# What a round's first proposal level writes besides its page-table rows (RaggedSteps.draft_level).
_LEVEL_NAMES: tuple[str, ...] = ("draft_roots", "query_start_offsets", "past_lengths", "state_indices")
# What the levels write on the device: the tree's inputs, and the attention lengths (past + the round's width).
_LEVEL_WRITES = (*DraftTreeBuffers.WRITES, "attention_sequence_lengths")
# The page-table rows' name (one tuple), by whether the engine is the draft (StepInputs.write_pages' names).
_PAGE_TABLE = {is_draft: (PAGE_TABLE_NAMES[is_draft],) for is_draft in (False, True)}
_LEVEL_PAGED: dict[bool, tuple[str, ...]] = {is_draft: _LEVEL_NAMES + names
                                              for is_draft, names in _PAGE_TABLE.items()}  # with them
# The same where the round's lengths are on the device already (DraftLevelPlan.caught_up): all but past_lengths.
_LEVEL_HELD: tuple[str, ...] = ("draft_roots", "query_start_offsets", "state_indices")
_LEVEL_HELD_PAGED: dict[bool, tuple[str, ...]] = {is_draft: _LEVEL_HELD + names
                                                   for is_draft, names in _PAGE_TABLE.items()}
# What a tree step writes besides its layout's constants (RaggedSteps.tree): its cached lengths and slots.
_TREE_NAMES: tuple[str, ...] = ("past_lengths", "state_indices")
# A tree layout's constants, next to each other in the step block (StepStaging.write_group).
_TREE_GROUP = ("query_lengths", "logits_indices", "spec_tree_parent_ids", "spec_tree_depths", "packed_attention_mask")
# A spec-decode base's own copies of them (RaggedContract.bind_pipeline), next to each other too.
_BASE_NAMES = dict(zip(_TREE_GROUP, ("verify_query_lengths", "verify_logits_indices", "verify_tree_parent_ids",
                                     "verify_tree_depths", "verify_packed_attention_mask")))
_VERIFY_GROUP = tuple(_BASE_NAMES.values())
# And its own query offsets, written on their own: a round's levels write theirs into the shared member, which differ
# where the draft's tree is not as wide as the verify's (an MTP chain: 3 drafted nodes, a verify of 4).
_BASE_OFFSETS = "verify_query_start_offsets"
_TREE_OFFSETS = (*_TREE_NAMES, _BASE_OFFSETS)  # what a base's tree step writes besides its layout's constants
# Every input a spec-decode base binds to its own step-block tensor (RaggedContract.bind_pipeline), by member name.
_BASE_OWN = {"query_start_offsets": _BASE_OFFSETS, **_BASE_NAMES}
# The draft's catch-up's own query offsets and tree constants (RaggedContract.catch_up_map), next to each other:
# a round's levels rewrite the shared ones on the device, and write other offsets.
_CATCH_UP_NAMES = dict(zip(("query_start_offsets", *_TREE_GROUP),
                           ("catch_up_query_start_offsets", "catch_up_query_lengths", "catch_up_logits_indices",
                            "catch_up_tree_parent_ids", "catch_up_tree_depths", "catch_up_packed_attention_mask")))
_CATCH_UP_GROUP = tuple(_CATCH_UP_NAMES.values())
# What a catch-up laid out on the device stages (RaggedSteps.catch_up): its cached lengths, slots and query offsets.
_CATCH_UP_STAGED = ("past_lengths", "state_indices", _CATCH_UP_NAMES["query_start_offsets"])
# What its layout (ops.CatchUpLayout) and tree step write on the device: its tree constants and row lists.
_CATCH_UP_LAID = (*_CATCH_UP_GROUP[1:], "catch_up_dst", "catch_up_src", *_TREE_WRITES)
# The engine inputs bound to a tree step's constants (RaggedContract.bind_pipeline), and the members they are.
_TREE_BINDINGS = {names.kQueryLengths: "query_lengths", names.kValidTreeCounts: "query_lengths",
                  names.kLogitsIndices: "logits_indices", names.kPackedAttentionMask: "packed_attention_mask",
                  names.kTreeParentIds: "spec_tree_parent_ids", names.kTreeDepths: "spec_tree_depths"}


def _owns_tree(e: EngineView, io: Pipeline) -> bool:
    """Whether ``e`` binds its own tree inputs in every step (:data:`_BASE_OWN`): a spec-decode base."""
    return e.role == "base" and io.is_spec_decode


def _tree_names(e: EngineView) -> dict[str, str]:
    """The step-block names of a spec-decode tree step's constants on engine ``e``: the base's verify inputs
    (:data:`_BASE_NAMES`), or the draft's catch-up's (:data:`_CATCH_UP_NAMES`, bound by its catch-up map)."""
    return _BASE_NAMES if e.role == "base" else _CATCH_UP_NAMES


class RaggedSteps(StepInputs):
    """Step inputs of the ragged contract: every step writes its layout (Edge-LLM's entry padding, phases
    1-5) into the step block and uploads it with one copy; RoPE rows are gathered on the device at each
    token's position."""

    def prompt(self, e: EngineView, past: np.ndarray | None, lengths: np.ndarray, width: int, s: Stream,
               slots: np.ndarray | None = None, pages: np.ndarray | None = None) -> tuple[DeviceWork, ...]:
        zero = np.zeros(lengths.shape[0], np.int64)
        layout = causal_step(zero if past is None else past, lengths, width,
                             phase=PHASE_PREFILL if past is None else PHASE_PREFILL_RESTORED, slots=slots)
        self.write_pages(e, pages)
        return self._stage_layout(e, layout, s)

    def laid_out(self, e: EngineView, layout: StepLayout, s: Stream, pages: np.ndarray | None = None
                 ) -> tuple[DeviceWork, ...]:
        self.write_pages(e, pages)
        return self._stage_layout(e, layout, s)

    def empty_prefill(self, e: EngineView, past: np.ndarray | None) -> bool:
        return past is None

    def _stage_layout(self, e: EngineView, layout: StepLayout, s: Stream) -> tuple[DeviceWork, ...]:
        """Write a step's inputs into the step block and upload them with one copy; returns the gather of the
        step's RoPE rows (one per token, at its position) from the engine's table, device work to enqueue
        before the engine (in its graph)."""
        io, step = self.io, self.step
        owns = _owns_tree(e, io)
        qlen, logits, parent_ids, depths, mask = _VERIFY_GROUP if owns else _TREE_GROUP
        step.write(_BASE_OFFSETS if owns else "query_start_offsets", layout.query_start_offsets)
        step.write(qlen, layout.query_lengths)
        step.write("past_lengths", layout.past_lengths)
        step.write("attention_sequence_lengths", layout.attention_sequence_lengths)
        step.write("state_indices", layout.state_indices)
        step.write(logits, layout.logits_indices)
        rows = step.write("positions", layout.positions)  # a shared RoPE table's rows are the positions
        table, per_slot = self.rope_source(e, s)
        if per_slot:  # MRoPE: one table per sequence slot, [B, C, R] read as B*C rows
            slots = np.repeat(layout.state_indices.astype(np.int64), layout.width)
            at = layout.positions
            rows = step.write("rope_rows", np.where(at >= 0, slots * e.cfg.max_kv_cache_capacity + at, -1)
                              .astype(np.int32))
        if layout.packed_mask is not None and io.is_spec_decode:
            assert layout.attention_position_ids is not None
            assert layout.tree_parent_ids is not None and layout.tree_depths is not None
            step.write(mask, layout.packed_mask)
            step.write("spec_decode_position_ids", layout.attention_position_ids)
            step.write(parent_ids, layout.tree_parent_ids)
            step.write(depths, layout.tree_depths)
        step.upload(s)
        return self._rope_rows(e, table, rows, layout.rows)

    def _rope_rows(self, e: EngineView, table: Tensor, rows: Tensor, count: int) -> tuple[DeviceWork, ...]:
        """The gather of a step's RoPE rows, and of the rows a family gathers beside them at the same positions
        (:meth:`~trtio.features.FamilyConfig.rope_gathers`: Gemma 4's full layers')."""
        io = self.io
        copy = self.row_copy(io.member("ragged_rope_cos_sin"), table, rows, count, rope_row_bytes(e.cfg))
        gathers = e.cfg.rope_gathers
        if not gathers:
            return (copy,)
        return (copy, *(self.row_copy(io.member(dst), io.member(src), rows, count, width)
                        for dst, src, width in gathers))

    def _write_decode(self, lengths: np.ndarray, slots: np.ndarray | None) -> None:
        layout = decode_step(lengths)
        step = self.step
        step.write("query_start_offsets", layout.query_start_offsets)
        step.write("query_lengths", layout.query_lengths)
        step.write("state_indices", layout.state_indices if slots is None else slots.astype(np.int32))
        step.write("logits_indices", layout.logits_indices)

    def _decode_uploaded(self) -> None:
        self.step.overwritten(_DECODE_WRITES)

    def _decode_work(self, e: EngineView, b: int, s: Stream) -> tuple[DeviceWork, ...]:
        """:class:`~trtio._ops.DecodeAdvance` (past and attention lengths, positions, MRoPE rows), then the
        RoPE rows gathered at those positions."""
        t = self.step.tensors
        table, per_slot = self.rope_source(e, s)
        rows = t["rope_rows"] if per_slot else t["positions"]
        return (DecodeAdvance(t["decode_lengths"], b, t["past_lengths"], t["attention_sequence_lengths"],
                              t["positions"], rows if per_slot else None,
                              e.cfg.max_kv_cache_capacity if per_slot else 0,
                              t["state_indices"] if per_slot else None),  # each sequence's own slot's table
                *self._rope_rows(e, table, rows, b))

    def tree(self, e: EngineView, layout: TreeLayout, past: np.ndarray, select: np.ndarray, s: Stream,
             slots: np.ndarray | None = None, pages: np.ndarray | None = None) -> tuple[DeviceWork, ...]:
        """The cached lengths and the tree's constants (which the step block receives once while they repeat)
        in one copy; the device lays out the rest (:class:`~trtio._ops.TreeStep`), then the RoPE rows are
        gathered."""
        step = self.step
        plan = self._tree_plans.get((e.role, id(layout)))
        if plan is None or plan[0] is not layout:
            plan = self._tree_plan(e, layout, s)
        _layout, offsets, group, work = plan
        names: tuple[str, ...] = _TREE_NAMES
        values: tuple[np.ndarray, ...] = (past, self.slot_ids(layout.real.shape[0], slots))
        if offsets is not None:
            names, values = _TREE_OFFSETS, (*values, offsets)
        if pages is not None:  # write_pages' name for them
            names, values = names + _PAGE_TABLE[e.role == "draft"], (*values, pages)
        step.write_all(names, values)
        step.write_prepared(group)
        step.upload(s)
        step.overwritten(_TREE_WRITES)
        return work

    def _tree_plan(self, e: EngineView, layout: TreeLayout, s: Stream
                   ) -> tuple[TreeLayout, np.ndarray | None, StagedGroup, tuple[DeviceWork, ...]]:
        """What a tree step of ``layout`` on engine ``e`` writes and runs, whatever is cached: the layout, its query
        offsets where they are written on their own (the base's), its constants laid out to be written together
        (:data:`_VERIFY_GROUP`, or the catch-up's :data:`_CATCH_UP_GROUP`: with the offsets), and its device
        work."""
        b, w = layout.real.shape
        found = self._tree_work(e, b, w, layout.phase, layout.padding_position, layout.packed_mask.shape[1], s)
        constants = (layout.query_lengths, layout.logits_indices, layout.tree_parent_ids, layout.tree_depths,
                     layout.packed_mask)
        offsets = ramp(b + 1, w)
        step = self.step
        plan = (layout, offsets, step.group(_VERIFY_GROUP, constants), found) if e.role == "base" else \
            (layout, None, step.group(_CATCH_UP_GROUP, (offsets, *constants)), found)
        self._tree_plans.put((e.role, id(layout)), plan)
        return plan

    def _tree_work(self, e: EngineView, b: int, w: int, phase: int, padding: int, words: int,
                   s: Stream) -> tuple[DeviceWork, ...]:
        """A tree step's device work (:class:`~trtio._ops.TreeStep`, then its RoPE rows gathered, and a family's beside
        them), per shape."""
        key = (e.role, b, w, phase, padding, words)
        found = self._tree_works.get(key)
        if found is None:
            targets = self.tree_targets(e)
            table, per_slot = self.rope_source(e, s)
            rows = targets.rope_rows if per_slot else targets.positions
            assert rows is not None
            found = self._tree_works.put(key, (
                TreeStep(targets, b, w, phase > PHASE_DECODE, padding),
                *self._rope_rows(e, table, rows, b * w)))  # a family's own rows too (Gemma 4's full layers')
        return found

    catch_up_logits_per_row = True

    def catch_up_targets(self, e: EngineView) -> CatchUpTargets:
        t = self.step.tensors
        own = _CATCH_UP_NAMES
        return CatchUpTargets(t["catch_up_dst"], t["catch_up_src"], lengths=t[own["query_lengths"]],
                              logits=t[own["logits_indices"]], parent_ids=t[own["spec_tree_parent_ids"]],
                              depths=t[own["spec_tree_depths"]], mask=t[own["packed_attention_mask"]])

    def _stage_catch_up(self, e: EngineView, batch: int, width: int, past: np.ndarray, s: Stream,
                        slots: np.ndarray | None, pages: np.ndarray | None) -> None:
        """The cached lengths, slots and query offsets (a constant per shape: the block keeps it) of
        :data:`_CATCH_UP_STAGED`, with the page-table rows where given, in one upload where any is new."""
        step = self.step
        values: tuple[np.ndarray, ...] = (past, self.slot_ids(batch, slots), ramp(batch + 1, width))
        if pages is None:
            step.write_all(_CATCH_UP_STAGED, values)
        else:
            step.write_all(_CATCH_UP_STAGED + _PAGE_TABLE[e.role == "draft"], (*values, pages))
        step.upload(s)
        step.overwritten(_CATCH_UP_LAID)

    def _chain_work(self, e: EngineView, b: int, width: int, words: int, s: Stream) -> tuple[DeviceWork, ...]:
        return self._tree_work(e, b, width, PHASE_DRAFT if width > 1 else PHASE_DECODE, -1, words, s)

    def tree_starts(self) -> Tensor | None:
        return self.step.tensors["past_lengths"]  # verify stages its cached lengths there (its tree targets')

    def tree_targets(self, e: EngineView) -> TreeTargets:
        found = self._targets.get(e.role)
        if found is None:
            t = self.step.tensors
            per_slot = e.cfg.rope_per_slot
            own = _tree_names(e)
            lengths, depths = own["query_lengths"], own["spec_tree_depths"]
            found = self._targets[e.role] = TreeTargets(
                t["past_lengths"], t[lengths], t[depths], asl=t["attention_sequence_lengths"],
                positions=t["positions"], ids=t["spec_decode_position_ids"],
                rope_rows=t["rope_rows"] if per_slot else None,
                rope_cap=e.cfg.max_kv_cache_capacity if per_slot else 0,
                next=t[ROUND_NEXT] if e.role == "draft" else None)
        return found

    def draft_buffers(self, e: EngineView, words: Tensor, nodes: Tensor, width: int,
                      n_words: int) -> DraftTreeBuffers:
        t = self.step.tensors
        per_slot = e.cfg.rope_per_slot
        return DraftTreeBuffers(words, nodes, t["draft_parents"], t["past_lengths"], t["row_src"], t["row_dst"],
                                t["logits_indices"], t["packed_attention_mask"], t["spec_decode_position_ids"], width,
                                n_words, logits_stride=width, roots=t["draft_roots"], query_lengths=t["query_lengths"],
                                positions=t["positions"], parent_ids=t["spec_tree_parent_ids"],
                                depths=t["spec_tree_depths"], rope_rows=t["rope_rows"] if per_slot else None,
                                rope_cap=e.cfg.max_kv_cache_capacity if per_slot else 0,
                                ctx=t["attention_sequence_lengths"])  # past + width, made by each level

    def draft_level(self, e: EngineView, tree: DraftTreeBuffers, plan: DraftLevelPlan,
                    s: Stream) -> tuple[DeviceWork, ...]:
        """A proposal level (phase 4; 3 for a one-node tree): the parents, uploaded with the round's lengths (on a
        round's first level, where the last catch-up did not leave them on the device), then the level made on the
        device (:class:`~trtio._ops.DraftLevel`) and the RoPE rows gathered at the nodes' positions. A parent's draft
        hidden row is the previous level's output row."""
        b, w = plan.batch, tree.width
        if plan.n0 == 0:
            self.stage_round(e, plan, w, s)
        else:
            self.stage_parents(plan.n0, b, plan.parents, s)
        level0, level_k = (0, 0) if plan.n0 == 0 else plan.level
        shared = plan.parents.ndim == 1
        key = (b, plan.n0, plan.k, level0, level_k, shared, plan.caught_up)
        found = self._level_works.get(key)
        if found is None:
            table, _per_slot = self.rope_source(e, s)
            rows = tree.rope_rows if tree.rope_rows is not None else tree.positions
            assert rows is not None
            found = self._level_works.put(key, (
                DraftLevel(tree, b, plan.n0, plan.k, level0, level_k, shared, plan.n0 * b,
                           self.step.tensors[ROUND_NEXT] if plan.caught_up else None),
                self.row_copy(self.io.member("ragged_rope_cos_sin"), table, rows, b * w, rope_row_bytes(e.cfg))))
        return found

    round_past = "past_lengths"

    def stage_round(self, e: EngineView, plan: DraftLevelPlan, width: int, s: Stream) -> None:
        """The round's root rows, query offsets, cached lengths (unless the device has them: ``plan.caught_up``),
        slots and page-table rows (a round's later levels find them in the block: only the levels run between,
        which keep them), with the parents, in one upload."""
        step = self.step
        b = plan.batch
        if plan.caught_up:
            values: tuple[np.ndarray, ...] = (plan.roots, ramp(b + 1, width), self.slot_ids(b, plan.slots))
            names, paged = _LEVEL_HELD, _LEVEL_HELD_PAGED
        else:
            values = (plan.roots, ramp(b + 1, width), plan.past, self.slot_ids(b, plan.slots))
            names, paged = _LEVEL_NAMES, _LEVEL_PAGED
        if plan.pages is None:
            step.write_all(names, values)
        else:  # with the page-table rows (write_pages' name for them)
            step.write_all(paged[e.role == "draft"], (*values, plan.pages))
        self.stage_parents(0, b, plan.parents, s)
        # the levels rewrite these on the device; only verify and catch-ups write them between rounds
        step.overwritten(_LEVEL_WRITES)

    def prompt_roots(self, batch: int, width: int, lengths: np.ndarray) -> np.ndarray:
        return ramp(batch, dtype="i8")  # the draft's hidden output has one row per sequence (its logits row)

    def catch_up_roots(self, batch: int, width: int, accepted: np.ndarray) -> np.ndarray | None:
        return ramp(batch, dtype="i8")
