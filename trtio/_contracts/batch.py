"""The batch-major contract: trtio's TensorRT-native toy engines and engines built with TensorRT's
KVCacheUpdate / Attention layers (``docs/architecture.md``, "Contracts").

Activations are ``[B, S, H]``; lengths and selection go through ``context_lengths`` and
``last_token_ids``; the KV caches (``k_cache_i`` / ``v_cache_i``) and ``kvcache_start_index`` belong to
the engine state, which owns their specs (:mod:`trtio._state`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from trtio import names
from trtio._cache import BoundedCache
from trtio._config import DeploymentConfig, LLMEngineConfig
from trtio._contracts.contract import (
    ROUND_NEXT,
    SEED_STAGING_PAIRS,
    Contract,
    DraftLevelPlan,
    EngineView,
    Pipeline,
    PipelineLayout,
    StepInputs,
    absent,
    deepstack_requests,
    mrope_request,
    seed_requests,
)
from trtio._cuda.backend import Location
from trtio._dtypes import DType
from trtio._memory import TensorRequest
from trtio._ops import CatchUpTargets, DecodeAdvance, DraftLevel, DraftTreeBuffers, TreeStep, TreeTargets
from trtio._registry import TensorRegistry, TensorSpec
from trtio._staging import constant
from trtio._stream import Stream

if TYPE_CHECKING:
    from trtio._contracts.ragged import TreeLayout
    from trtio._engine import DeviceWork
    from trtio._tensor import Tensor
    from trtio._tensor_map import TensorMap

__all__ = ["BatchContract", "BatchSteps", "registry_for"]


def _common(reg: TensorRegistry, cfg: LLMEngineConfig) -> None:
    act = cfg.activation
    i32, i64, f32 = DType.INT32, DType.INT64, DType.FLOAT32
    reg.add(TensorSpec(names.kContextLengths, "input", i32, ("batch",)))
    reg.add(TensorSpec(names.kLastTokenIds, "input", i64, ("batch", "select_len")))
    reg.add(TensorSpec(names.kRopeCosSin, "input", f32, ("rope_batch", "kv_len", cfg.rotary_dim)))
    for i in range(cfg.num_deepstack_features):
        reg.add(TensorSpec(names.deepstack_embeds(i), "input", act, ("batch", "seq_len", cfg.hidden_size)))
    reg.add(TensorSpec(names.kLogits, "output", f32, (("batch", "select_len"), cfg.output_vocab_size)))
    # Optional: Edge-LLM serves an engine without this output from the same map.
    reg.add(TensorSpec(names.kOutputHiddenStates, "output", act, ("batch", "seq_len", cfg.hidden_size),
                       optional=True))


def _tree_inputs(reg: TensorRegistry) -> None:
    reg.add(TensorSpec(names.kAttentionMask, "input", DType.INT32,
                       ("batch", "attn_mask_seq_len", "packed_mask_len")))
    reg.add(TensorSpec(names.kAttentionPosId, "input", DType.INT32, ("batch", "attn_mask_seq_len")))


def registry_for(cfg: LLMEngineConfig) -> TensorRegistry:
    """The PipelineIO-owned bindings of a batch-major engine of ``cfg.role`` (llm, base or draft)."""
    reg = TensorRegistry(cfg.role, contract="batch")
    act = cfg.activation
    reg.add(TensorSpec(names.kInputsEmbeds, "input", act, ("batch", "seq_len", cfg.hidden_size)))
    if cfg.role == "draft":
        reg.add(TensorSpec(names.kBaseModelHiddenStates, "input", act,
                           ("batch", "seq_len", cfg.base_model_hidden_size)))
        reg.add(TensorSpec(names.kDraftModelHiddenStates, "input", act, ("batch", "seq_len", cfg.hidden_size)))
    _common(reg, cfg)
    if cfg.role != "llm":
        _tree_inputs(reg)
    return reg


# -- the contract object: PipelineIO layout, bindings, step inputs ----------------------------------------


class BatchContract(Contract):
    """The batch-major contract (see module docstring): whole-batch steps over contiguous caches."""

    name = "batch"
    kv_layout = "contiguous"
    slotted = False

    def registry(self, cfg: LLMEngineConfig) -> TensorRegistry:
        return registry_for(cfg)

    def pipeline_layout(self, base: LLMEngineConfig, bundle: DeploymentConfig | None,
                        max_batch: int) -> PipelineLayout:
        if bundle is None:
            return _llm_layout(base, max_batch)
        return _spec_layout(bundle, max_batch)

    def bind_pipeline(self, io: Pipeline, tm: TensorMap, cfg: LLMEngineConfig) -> None:
        tm.set(names.kContextLengths, io.context_lengths)
        tm.set(names.kLastTokenIds, io.select_token_indices)
        if cfg.rope_per_slot:
            tm.set(names.kRopeCosSin, io.mrope_cos_sin)
        if io.is_spec_decode:
            tm.set(names.kAttentionMask, io.packed_attention_mask)
            tm.set(names.kAttentionPosId, io.spec_decode_position_ids)

    def binds_rope_table(self, cfg: LLMEngineConfig) -> bool:
        return not cfg.rope_per_slot

    def steps(self, io: Pipeline, rope_table: Callable[[LLMEngineConfig, Stream], Tensor]) -> StepInputs:
        return BatchSteps(io, rope_table)


def _llm_layout(cfg: LLMEngineConfig, b: int) -> PipelineLayout:
    s, h, act = cfg.max_supported_input_length, cfg.hidden_size, cfg.activation
    nd = cfg.num_deepstack_features
    reqs = seed_requests(b, s, h, act, logits_rows=b, vocab=cfg.output_vocab_size, select_cols=1)
    reqs += deepstack_requests(nd, (b, s, h), (b, 1, h), act)
    reqs.append(mrope_request(cfg, b))
    reqs += [absent("base_hidden_states", act), absent("draft_hidden_states_in", act),
             absent("draft_hidden_states_out", act),
             TensorRequest.of("output_hidden_states", (b, s, h), act),
             absent("packed_attention_mask", DType.INT32), absent("spec_decode_position_ids", DType.INT32)]
    # decode_lengths: the device's copy of the lengths, which a decode step advances itself (ops.DecodeAdvance).
    return PipelineLayout("PipelineIO(llm)", reqs, [TensorRequest.of("decode_lengths", (b,), DType.INT32)],
                          max_batch=b, max_seq=s, hidden_size=h, is_spec_decode=False, num_deepstack=nd,
                          zeroed=("deepstack_zero",), staging_pairs=SEED_STAGING_PAIRS)


def _spec_layout(bundle: DeploymentConfig, b: int) -> PipelineLayout:
    base, draft, spec = bundle.base, bundle.draft, bundle.spec
    assert draft is not None and spec is not None
    max_input = max(base.max_supported_input_length, draft.max_supported_input_length)
    p = bundle.effective_max_draft_proposal_size()
    seq = max(max_input, p)
    act, h = base.activation, base.hidden_size
    vocab = max(base.output_vocab_size, draft.output_vocab_size)
    words = math.ceil(p / 32)
    i32 = DType.INT32
    reqs = seed_requests(b, seq, h, act, logits_rows=b * p, vocab=vocab, select_cols=p)
    reqs += deepstack_requests(base.num_deepstack_features, (b, max_input, h), (b, max(spec.verify_size, 1), h), act)
    reqs.append(mrope_request(base, b))
    reqs += [
        TensorRequest.of("base_hidden_states", (b, seq, spec.base_output_hidden_dim), act),
        TensorRequest.of("draft_hidden_states_in", (b, seq, spec.draft_hidden_size), act),
        TensorRequest.of("draft_hidden_states_out", (b, seq, spec.draft_hidden_size), act),
        absent("output_hidden_states", act),
        TensorRequest.of("packed_attention_mask", (b, p, words), i32),
        TensorRequest.of("spec_decode_position_ids", (b, p), i32),
        TensorRequest.of("host_packed_attention_mask", (b, p, words), i32, Location.PINNED),
        TensorRequest.of("host_spec_decode_position_ids", (b, p), i32, Location.PINNED),
        TensorRequest.of("host_spec_select_token_indices", (b, p), DType.INT64, Location.PINNED),
        TensorRequest.of("row_scratch", (b * p, max(spec.base_output_hidden_dim, spec.draft_hidden_size)), act),
    ]
    # Each upload copies one byte range, from the first value a step wrote to the last: a draft level's values
    # first, then a tree step's (ops.TreeStep: the cached lengths, then a tree's constants, which the device copies
    # or expands into the engine's inputs), then the row indices of the hidden-state moves (draft inputs assembled
    # from outputs, accepted rows compacted).
    step = [TensorRequest.of("draft_roots", (b,), i32),  # each sequence's root hidden row
            TensorRequest.of("tree_past", (b,), i32),
            TensorRequest.of("draft_parents", (b * p,), i32),  # a draft level's (ops.DraftLevel)
            TensorRequest.of("tree_lengths", (b,), i32),
            TensorRequest.of("tree_depths", (b * p,), i32),
            TensorRequest.of("tree_mask", (b * p, words), i32),
            TensorRequest.of("tree_select", (b * p,), DType.INT64),
            # The catch-up's row lists (CatchUp: its scratch rows, then the accepted rows): only it writes them.
            TensorRequest.of("catch_up_dst", (b * p,), i32),
            TensorRequest.of("catch_up_src", (b * p,), i32),
            TensorRequest.of("row_src", (b * seq,), i32),
            TensorRequest.of("row_dst", (b * seq,), i32),
            # The base's tree step (verify) has names of its own: the catch-up between two verifies writes the
            # draft's into the tree_* names, and the verify tree's constants stay in the block while they repeat.
            # Last in the block, so a catch-up's upload (tree_past .. catch_up_src) does not copy them.
            TensorRequest.of("verify_lengths", (b,), i32),
            TensorRequest.of("verify_depths", (b * p,), i32),
            TensorRequest.of("verify_mask", (b * p, words), i32),
            TensorRequest.of("verify_select", (b * p,), DType.INT64),
            TensorRequest.of(ROUND_NEXT, (b,), i32)]  # last: only the device writes it (contract.ROUND_NEXT)
    return PipelineLayout(
        "PipelineIO(spec_decode)", reqs, step, max_batch=b, max_seq=seq, hidden_size=h, is_spec_decode=True,
        num_deepstack=base.num_deepstack_features, members=("row_scratch", "row_src", "row_dst"),
        zeroed=("select_token_indices", "base_hidden_states", "draft_hidden_states_in", "draft_hidden_states_out",
                "packed_attention_mask", "spec_decode_position_ids", "deepstack_zero"),
        staging_pairs=SEED_STAGING_PAIRS + (("host_packed_attention_mask", "packed_attention_mask"),
                                            ("host_spec_decode_position_ids", "spec_decode_position_ids")))


_ROUND_NAMES = ("draft_roots", "tree_past")  # what a round's first proposal level writes besides its parents
_ROUND_HELD = ("draft_roots",)  # the same where the round's lengths are on the device already (plan.caught_up)
# A tree step's constants, written together (StepStaging.write_group): the base's (verify) and the draft's (catch-up).
_VERIFY_GROUP = ("verify_lengths", "verify_depths", "verify_mask", "verify_select")
_TREE_GROUP = ("tree_lengths", "tree_depths", "tree_mask", "tree_select")
# What a catch-up laid out on the device writes there (BatchSteps.catch_up, ops.CatchUpLayout): its tree constants,
# row lists and the next round's roots.
_CATCH_UP_LAID = (*_TREE_GROUP, "catch_up_dst", "catch_up_src", "draft_roots")


class BatchSteps(StepInputs):
    """Step inputs of the batch contract: lengths and token selection through the PipelineIO's staging
    pairs, the start index through the state's; tree and draft-level inputs laid out on the device from the
    step block (see :mod:`trtio._ops`)."""

    def __init__(self, io: Pipeline, rope_table: Callable[[LLMEngineConfig, Stream], Tensor]) -> None:
        super().__init__(io, rope_table)
        self._select_zero_batch: int | None = None  # the batch whose decode selection (all 0) is staged
        self._root_bases: BoundedCache[tuple[int, int], np.ndarray] = BoundedCache()  # catch_up_roots's, per shape

    def prompt(self, e: EngineView, past: np.ndarray | None, lengths: np.ndarray, width: int, s: Stream,
               slots: np.ndarray | None = None, pages: np.ndarray | None = None) -> tuple[DeviceWork, ...]:
        b = lengths.shape[0]
        self.io.upload_context_lengths(lengths if past is None else past + lengths, s)
        self.io.upload_select_token_indices((lengths - 1)[:, None], s)
        start = None if past is None and e.empty_start_ok else (np.zeros(b, np.int32) if past is None else past)
        e.state.upload_start_index(start, s)
        self._select_zero_batch = None
        return ()

    def empty_prefill(self, e: EngineView, past: np.ndarray | None) -> bool:
        return past is None and e.empty_start_ok

    def decode(self, e: EngineView, lengths: np.ndarray, s: Stream, slots: np.ndarray | None = None,
               key: tuple[int, ...] | None = None, pages: np.ndarray | None = None, *,
               staged: bool = False) -> tuple[DeviceWork, ...]:
        work = super().decode(e, lengths, s, slots, key, pages, staged=staged)
        b = lengths.shape[0]
        if self._select_zero_batch != b:
            self.io.upload_select_token_indices(np.zeros((b, 1), np.int64), s)
            self._select_zero_batch = b
        return work

    def _write_decode(self, lengths: np.ndarray, slots: np.ndarray | None) -> None:
        pass  # the start index and context lengths are made on the device from the lengths alone

    def _decode_uploaded(self) -> None:
        pass  # the device writes nothing of the step block

    def _decode_work(self, e: EngineView, b: int, s: Stream) -> tuple[DeviceWork, ...]:
        return (DecodeAdvance(self.step.tensors["decode_lengths"], b, e.state.kv_lengths, self.io.context_lengths),)

    def tree(self, e: EngineView, layout: TreeLayout, past: np.ndarray, select: np.ndarray, s: Stream,
             slots: np.ndarray | None = None, pages: np.ndarray | None = None) -> tuple[DeviceWork, ...]:
        """The cached lengths and the tree's constants (which the step block receives once while they repeat)
        in one copy; the device writes the start index, context lengths, position ids, mask and token
        selection (:class:`~trtio._ops.TreeStep`)."""
        step = self.step
        plan = self._tree_plans.get((e.role, id(layout)))
        if plan is None or plan[0] is not layout or plan[1] is not select:
            b, w = layout.real.shape
            words = layout.packed_mask.shape[1]
            key = (e.role, b, w, words, select.shape[1])
            found = self._tree_works.get(key)
            if found is None:
                found = self._tree_works.put(key, (TreeStep(self.tree_targets(e), b, w, True, 0, words,
                                                            select.shape[1]),))
            plan = (layout, select, self.step.group(_VERIFY_GROUP if e.role == "base" else _TREE_GROUP, (
                layout.query_lengths, layout.tree_depths, layout.packed_mask, select)), found)
            self._tree_plans.put((e.role, id(layout)), plan)
        step.write("tree_past", past)
        step.write_prepared(plan[2])
        step.upload(s)
        return plan[3]

    catch_up_logits_per_row = False

    def catch_up_targets(self, e: EngineView) -> CatchUpTargets:
        t = self.step.tensors
        lengths, depths, mask, select = (t[n] for n in _TREE_GROUP)
        return CatchUpTargets(t["catch_up_dst"], t["catch_up_src"], lengths=lengths, logits=select, depths=depths,
                              mask=mask, roots=t["draft_roots"])

    def _stage_catch_up(self, e: EngineView, batch: int, width: int, past: np.ndarray, s: Stream,
                        slots: np.ndarray | None, pages: np.ndarray | None) -> None:
        """The cached lengths alone, in one upload where they are new."""
        step = self.step
        step.write("tree_past", past)
        step.upload(s)
        step.overwritten(_CATCH_UP_LAID)

    def _chain_work(self, e: EngineView, b: int, width: int, words: int, s: Stream) -> tuple[DeviceWork, ...]:
        key = (e.role, b, width, words, 1)
        found = self._tree_works.get(key)
        if found is None:
            found = self._tree_works.put(key, (TreeStep(self.tree_targets(e), b, width, True, 0, words, 1),))
        return found

    def catch_up_roots_held(self, roots: np.ndarray) -> np.ndarray | None:
        # the layout wrote them into draft_roots (CatchUpTargets.roots)
        held = roots if not roots.flags.writeable and roots.flags.owndata else constant(roots)
        self.step.device_wrote("draft_roots", held)
        return held

    def tree_starts(self) -> Tensor | None:
        return self.step.tensors["tree_past"]  # verify stages its cached lengths there (its tree targets')

    def tree_targets(self, e: EngineView) -> TreeTargets:
        found = self._targets.get(e.role)
        if found is None:
            t, io = self.step.tensors, self.io
            lengths, depths, mask, select = (t[n] for n in (_VERIFY_GROUP if e.role == "base" else _TREE_GROUP))
            found = self._targets[e.role] = TreeTargets(
                t["tree_past"], lengths, depths, start=e.state.kv_lengths, ctx=io.context_lengths,
                ids=io.spec_decode_position_ids, mask_src=mask, mask_dst=io.packed_attention_mask,
                select_src=select, select_dst=io.select_token_indices,
                next=t[ROUND_NEXT] if e.role == "draft" else None)
        return found

    def draft_buffers(self, e: EngineView, words: Tensor, nodes: Tensor, width: int,
                      n_words: int) -> DraftTreeBuffers:
        t, io = self.step.tensors, self.io
        return DraftTreeBuffers(words, nodes, t["draft_parents"], t["tree_past"], t["row_src"], t["row_dst"],
                                io.select_token_indices, io.packed_attention_mask, io.spec_decode_position_ids, width,
                                n_words, logits_stride=0, roots=t["draft_roots"], start=e.state.kv_lengths,
                                ctx=io.context_lengths)

    def draft_level(self, e: EngineView, tree: DraftTreeBuffers, plan: DraftLevelPlan,
                    s: Stream) -> tuple[DeviceWork, ...]:
        """The parents, with the round's lengths and root rows on its first level; the device writes the
        start index and context lengths from them. A parent's draft hidden row is its node's row."""
        if plan.n0 == 0:
            self.stage_round(e, plan, tree.width, s)
        else:
            self.stage_parents(plan.n0, plan.batch, plan.parents, s)
        shared = plan.parents.ndim == 1
        key = (plan.batch, plan.n0, plan.k, shared, plan.caught_up)
        found = self._level_works.get(key)
        if found is None:
            found = self._level_works.put(
                key, (DraftLevel(tree, plan.batch, plan.n0, plan.k, 0, tree.width, shared, plan.n0 * plan.batch,
                                 self.step.tensors[ROUND_NEXT] if plan.caught_up else None),))
        return found

    round_past = "tree_past"

    def stage_round(self, e: EngineView, plan: DraftLevelPlan, width: int, s: Stream) -> None:
        """The round's root rows and cached lengths (unless the device has them: ``plan.caught_up``; a round's
        later levels find them in the block: only the levels run between, which keep them), with the parents, in
        one upload."""
        step = self.step
        if plan.caught_up:
            step.write_all(_ROUND_HELD, (plan.roots,))
        else:
            step.write_all(_ROUND_NAMES, (plan.roots, plan.past))
        self.stage_parents(0, plan.batch, plan.parents, s)
        # the levels rewrite these on the device; only verify and catch-ups write them between rounds
        step.overwritten(DraftTreeBuffers.WRITES)

    def prompt_roots(self, batch: int, width: int, lengths: np.ndarray) -> np.ndarray:
        return np.asarray(np.arange(batch) * width + lengths - 1)

    def catch_up_roots(self, batch: int, width: int, accepted: np.ndarray) -> np.ndarray | None:
        before = self._root_bases.get((batch, width))  # row i * width - 1, made once per shape: one add a round
        if before is None:
            before = self._root_bases.put((batch, width), np.arange(batch) * width - 1)
        roots: np.ndarray = np.add(before, accepted, dtype=np.int64)  # (an array of its own)
        return roots
