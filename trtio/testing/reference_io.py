"""What a :class:`~trtio.testing.ReferenceEngine` declares: TensorRT's enums, the engine's geometry and its I/O.

The enums have TensorRT's member names and values (trtio finds them on the engine's module,
``trtio.testing.reference_engine``, which re-exports them). ``_Geometry`` holds the numbers of
``docs/toy-model.md`` read once from a config; ``_declare`` (batch contract) and ``_declare_ragged``
(Edge-LLM 0.11's token-major contract) list the engine's I/O tensors in declaration order.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trtio import names
from trtio._checks import is_int
from trtio._contracts import ragged as ragged_contract
from trtio._dtypes import DType
from trtio._state import paged_state_specs
from trtio.errors import InvalidValueError
from trtio.families.hybrid.hybrid_config import recurrent_state_specs
from trtio.families.spec.block_family import block_family_of
from trtio.testing.toy_model import config_role, output_vocab_size

__all__ = ["RAGGED_OMITTABLE", "DataType", "ExecutionContextAllocationStrategy", "TensorIOMode", "TensorLocation"]

Shape = tuple[int, ...]
ProfileShapes = tuple[Shape, Shape, Shape]


# -- TensorRT's enums ----------------------------------------------------------------------------


class DataType(enum.IntEnum):
    """``tensorrt.DataType``: same member names and values."""

    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8
    INT4 = 9
    FP4 = 10
    E8M0 = 11


class TensorIOMode(enum.IntEnum):
    """``tensorrt.TensorIOMode``."""

    NONE = 0
    INPUT = 1
    OUTPUT = 2


class TensorLocation(enum.IntEnum):
    """``tensorrt.TensorLocation``."""

    DEVICE = 0
    HOST = 1


class ExecutionContextAllocationStrategy(enum.IntEnum):
    """``tensorrt.ExecutionContextAllocationStrategy``."""

    STATIC = 0
    ON_PROFILE_CHANGE = 1
    USER_MANAGED = 2


# -- the engine's geometry and I/O contract ------------------------------------------------------


def _half(x: int) -> int:
    return max(1, x // 2)


@dataclass(frozen=True)
class _Geometry:
    """The numbers of ``docs/toy-model.md`` read once from a config (duck-typed)."""

    role: str
    h: int
    vout: int
    bmax: int
    smax: int
    cap: int
    layers: int
    hq: int
    hkv: int
    d: int
    r: int
    act: DType
    kv: DType
    nd: int
    mrope: bool
    hb: int  # draft: base_model_hidden_size, else 0
    p1: int  # longest step of profile 1
    fixed_cache_batch: bool = False  # caches declared [Bmax, Hkv, C, D]: rows are sequence slots
    contract: str = "batch"  # or "ragged" (Edge-LLM 0.11, paged KV)
    page: int = 0  # ragged: tokens per KV page
    pool_pages: int = 0  # ragged: pages per layer pool (P; the pool holds 2P: K pages, then V pages)
    seq_pages: int = 0  # ragged: page-table columns (M = pages_per_sequence)
    eagle: tuple[int, ...] = ()  # ragged base: layers whose residual streams form hidden_states
    types: tuple[str, ...] = ()  # hybrid: the mixer layers ("attention" / "mamba"); () is all attention
    conv: tuple[int, int] = (0, 0)  # hybrid: a slot's conv state [conv_dim, conv_kernel]
    state: tuple[int, int, int] = (0, 0, 0)  # hybrid: a slot's recurrent state [heads, head_dim, size]
    conv_dtype: DType = DType.FLOAT16
    state_dtype: DType = DType.FLOAT32
    tree_base: bool = False  # hybrid base built as a DDTree base (mtp_tree_base / dflash_tree_base): reference_math
    dflash: bool = False  # a DFlash block draft (reference_dflash)

    @classmethod
    def from_config(cls, cfg: Any, *, fixed_cache_batch: bool = False) -> _Geometry:
        role = config_role(cfg)
        p1 = 1
        if role == "base":
            p1 = int(cfg.max_verify_tree_size)
        elif role == "draft":
            p1 = int(cfg.max_draft_tree_size)
        ragged: dict[str, Any] = {}
        if getattr(cfg, "contract", None) == "ragged":
            ragged = dict(
                contract="ragged",
                page=int(cfg.kv_page_size),
                pool_pages=int(cfg.kv_pool_pages),
                seq_pages=int(cfg.pages_per_sequence),
                eagle=tuple(int(i) for i in cfg.eagle_hidden_state_layers) if role == "base" else (),
                dflash=role == "draft" and block_family_of(dict(getattr(cfg, "extras", {}) or {})) is not None,
            )
            if getattr(cfg, "is_hybrid", False):
                ragged.update(types=tuple(cfg.layer_types), conv=tuple(cfg.conv_state_shape),
                              state=tuple(cfg.recurrent_state_shape), conv_dtype=DType.coerce(cfg.conv_state_dtype),
                              state_dtype=DType.coerce(cfg.recurrent_state_dtype),
                              tree_base=bool(getattr(cfg, "mtp_tree_base", False)
                                             or getattr(cfg, "dflash_tree_base", False)
                                             or getattr(cfg, "jetspec_tree_base", False)))
        return cls(
            role=role,
            h=int(cfg.hidden_size),
            vout=output_vocab_size(cfg),
            bmax=int(cfg.max_supported_batch_size),
            smax=int(cfg.max_supported_input_length),
            cap=int(cfg.max_kv_cache_capacity),
            layers=int(cfg.num_attention_layers),
            hq=int(cfg.num_attention_heads),
            hkv=int(cfg.num_kv_heads),
            d=int(cfg.head_dim),
            r=int(cfg.rotary_dim or cfg.head_dim),
            act=DType.coerce(cfg.activation_dtype),
            kv=DType.coerce(cfg.kv_cache_dtype),
            nd=int(getattr(cfg, "num_deepstack_features", 0) or 0),
            mrope=getattr(cfg, "rope_type", "rope") == "mrope",
            hb=int(getattr(cfg, "base_model_hidden_size", 0) or 0) if role == "draft" else 0,
            p1=p1,
            fixed_cache_batch=fixed_cache_batch,
            **ragged,
        )

    @property
    def is_spec(self) -> bool:
        return self.role != "llm"

    @property
    def recurrent_layers(self) -> int:
        return sum(1 for t in self.types if t != "attention")

    @property
    def is_ragged(self) -> bool:
        return self.contract == "ragged"

    @property
    def seq_slots(self) -> int:
        """Ragged: the KV slots one sequence can address through its page-table row (M * page)."""
        return self.seq_pages * self.page

    @property
    def hidden_out(self) -> int:
        """Ragged base: width of hidden_states (the EAGLE3 layers' streams side by side, else H)."""
        return self.h * max(len(self.eagle), 1)

    @property
    def f(self) -> int:
        return 2 * self.h


@dataclass(frozen=True)
class _Decl:
    """One I/O tensor as the engine declares it."""

    index: int
    name: str
    mode: TensorIOMode
    dtype: DType
    shape: Shape  # -1 for dynamic dims
    profiles: tuple[ProfileShapes, ...]  # inputs: (min, opt, max) per profile; outputs: ()
    alias: str | None = None  # outputs that update an input in place: that input

    @property
    def is_input(self) -> bool:
        return self.mode is TensorIOMode.INPUT

    @property
    def is_static(self) -> bool:
        return -1 not in self.shape


def _declare(g: _Geometry) -> list[_Decl]:
    """The I/O table of ``docs/toy-model.md``, in its declaration order."""
    f32, i32, i64 = DType.FLOAT32, DType.INT32, DType.INT64
    rows: list[tuple[str, TensorIOMode, DType, Shape, tuple[ProfileShapes, ...], str | None]] = []

    def seq(width: int) -> tuple[ProfileShapes, ...]:
        return (
            ((1, 1, width), (g.bmax, _half(g.smax), width), (g.bmax, g.smax, width)),
            ((1, 1, width), (g.bmax, _half(g.p1), width), (g.bmax, g.p1, width)),
        )

    def per_batch(*rest: int) -> tuple[ProfileShapes, ...]:
        one = ((1, *rest), (g.bmax, *rest), (g.bmax, *rest))
        return (one, one)

    def static(shape: Shape) -> tuple[ProfileShapes, ...]:
        return ((shape, shape, shape),) * 2

    def inp(name: str, dtype: DType, shape: Shape, profiles: tuple[ProfileShapes, ...]) -> None:
        rows.append((name, TensorIOMode.INPUT, dtype, shape, profiles, None))

    def out(name: str, dtype: DType, shape: Shape, alias: str | None = None) -> None:
        rows.append((name, TensorIOMode.OUTPUT, dtype, shape, (), alias))

    inp(names.kInputsEmbeds, g.act, (-1, -1, g.h), seq(g.h))
    if g.role == "draft":
        inp(names.kBaseModelHiddenStates, g.act, (-1, -1, g.hb), seq(g.hb))
        inp(names.kDraftModelHiddenStates, g.act, (-1, -1, g.h), seq(g.h))
    inp(names.kContextLengths, i32, (-1,), per_batch())
    inp(names.kLastTokenIds, i64, (-1, -1),
        (((1, 1), (g.bmax, 1), (g.bmax, 1)), ((1, 1), (g.bmax, _half(g.p1)), (g.bmax, g.p1))))
    inp(names.kKVCacheStartIndex, i32, (-1,), per_batch())
    if g.mrope:
        inp(names.kRopeCosSin, f32, (-1, g.cap, g.r), per_batch(g.cap, g.r))
    else:
        inp(names.kRopeCosSin, f32, (1, g.cap, g.r), static((1, g.cap, g.r)))
    if g.is_spec:
        inp(names.kAttentionMask, i32, (-1, -1, -1), (
            ((1, 1, 1), (g.bmax, 1, 1), (g.bmax, 1, 1)),
            ((1, 1, 1), (g.bmax, _half(g.p1), math.ceil(_half(g.p1) / 32)),
             (g.bmax, g.p1, math.ceil(g.p1 / 32))),
        ))
        inp(names.kAttentionPosId, i32, (-1, -1),
            (((1, 1), (g.bmax, 1), (g.bmax, 1)), ((1, 1), (g.bmax, _half(g.p1)), (g.bmax, g.p1))))
    for i in range(g.nd):
        inp(names.deepstack_embeds(i), g.act, (-1, -1, g.h), seq(g.h))
    cache = (g.bmax if g.fixed_cache_batch else -1, g.hkv, g.cap, g.d)
    cache_profiles = static(cache) if g.fixed_cache_batch else per_batch(g.hkv, g.cap, g.d)
    for i in range(g.layers):
        inp(names.k_cache(i), g.kv, cache, cache_profiles)
        inp(names.v_cache(i), g.kv, cache, cache_profiles)
    out(names.kLogits, f32, (-1, g.vout))
    out(names.kOutputHiddenStates, g.act, (-1, -1, g.h))
    for i in range(g.layers):
        out(names.present_k_cache(i), g.kv, cache, names.k_cache(i))
        out(names.present_v_cache(i), g.kv, cache, names.v_cache(i))
    return [_Decl(i, *row) for i, row in enumerate(rows)]


#: Inputs of the ragged contract that no dense graph reads, so a real engine may lack them
#: (TensorRT's ONNX parser drops unused inputs): ``from_config(cfg, omit=...)`` leaves them out.
RAGGED_OMITTABLE = (names.kPositions, names.kStateIndices, names.kTreeParentIds, names.kTreeDepths,
                    names.kValidTreeCounts)
# Ragged inputs the reference engine reads neither for data nor for shape rules beyond their extent.
_RAGGED_UNREAD = frozenset(RAGGED_OMITTABLE) | {names.kAttentionPositionIds, names.kExecutionPhaseMarker,
                                                 names.kContextSequenceCountCarrier}


def _declare_ragged(cfg: Any, omit: Iterable[str] = (),
                    weight_inputs: Iterable[tuple[str, DType, Shape]] = ()) -> list[_Decl]:
    """The I/O of an Edge-LLM 0.11 engine of ``cfg.role``, in the exporter's order (``docs/toy-model.md``).

    Built from ``trtio._contracts.ragged.registry_for`` (every binding but the KV state) and
    ``trtio._state.paged_state_specs`` (pools, their present aliases, the page table), so shapes and
    profiles have one source. The optional ``skip_softmax_scale`` is left out; ``omit`` drops
    optional inputs of :data:`RAGGED_OMITTABLE` that this role declares. ``weight_inputs`` (name, dtype,
    shape) are static weight inputs the engine reads its weights from (``checkpoint_weight_bindings``),
    declared last.
    """
    registry = ragged_contract.registry_for(cfg)
    state = {spec.name: spec for spec in paged_state_specs(cfg)}
    recurrent = recurrent_state_specs(cfg) if getattr(cfg, "is_hybrid", False) else []
    layers = range(int(cfg.num_attention_layers))
    omit = set(omit)
    omittable = {name for name in RAGGED_OMITTABLE if name in registry and registry[name].optional}
    if omit - omittable:
        raise InvalidValueError(f"ReferenceEngine: omit={sorted(omit)}: a {cfg.role} engine can only lack "
                                f"{sorted(omittable)} (optional inputs no dense graph reads)")
    # The exporter writes the pools right after inputs_embeds and the page table after the
    # context-count carrier; every other binding keeps the registry's order.
    g4 = getattr(cfg, "gemma4", None)
    before_pools = names.ple_token_embeds(g4.ple_layers - 1) if g4 is not None and g4.ple_layers else \
        names.kInputsEmbeds  # Gemma 4's PLE inputs come before the pools
    follows = {
        before_pools: [state[names.past_key_values(i)] for i in layers],
        names.kContextSequenceCountCarrier: [state[n] for n in (names.kKVPageTable, names.kSwaKVPageTable,
                                                                names.kSwaKVCacheMode) if n in state],
        names.kLogitsIndices: [spec for spec in recurrent if spec.is_input],  # a hybrid's state pools
    }
    specs = []
    for spec in registry:
        if spec.name in omit or spec.name == names.kSkipSoftmaxScale:
            continue
        specs.append(spec)
        specs.extend(follows.get(spec.name, ()))
    specs.extend(state[names.present_key_values(i)] for i in layers if names.present_key_values(i) in state)
    specs.extend(spec for spec in recurrent if not spec.is_input)
    aliases = {names.present_key_values(i): names.past_key_values(i) for i in layers}
    aliases.update((out.name, inp.name) for inp, out in zip([r for r in recurrent if r.is_input],
                                                             [r for r in recurrent if not r.is_input]))
    decls = [_Decl(index, spec.name, TensorIOMode.INPUT if spec.is_input else TensorIOMode.OUTPUT, spec.dtype,
                   spec.engine_shape, spec.profiles if spec.is_input else (), aliases.get(spec.name))
             for index, spec in enumerate(specs)]
    for name, dtype, shape in weight_inputs:
        decls.append(_Decl(len(decls), name, TensorIOMode.INPUT, dtype, shape, ((shape, shape, shape),) * 2))
    return decls


def _index(value: Any, size: int) -> int | None:
    """``value`` as an index in ``[0, size)`` (Python or numpy integer, as pybind takes), else None."""
    if not is_int(value):
        return None
    i = int(value)
    return i if 0 <= i < size else None


# -- shape rules ------------------------------------------------------------------------------------


def _batch_shape_problems(g: _Geometry, s: dict[str, Shape]) -> list[str]:
    """The batch contract's shape rules: what TensorRT's shape inference would refuse (batch and step length
    that disagree, KVCacheUpdate's cache batch). ``s``: every input's shape."""
    emb = s[names.kInputsEmbeds]
    batch, seq = emb[0], emb[1]
    problems = []

    def need(name: str, got: Shape, want: Shape, why: str) -> None:
        if got != want:
            problems.append(f"{name!r} has shape {got}, but {why} needs {want}")

    for name in (names.kContextLengths, names.kKVCacheStartIndex):
        need(name, s[name], (batch,), f"the batch of inputs_embeds {emb}")
    ids = s[names.kLastTokenIds]
    if ids[0] != batch:
        problems.append(f"'last_token_ids' has shape {ids}, but its batch must equal inputs_embeds' ({batch})")
    if g.role == "draft":
        need(names.kBaseModelHiddenStates, s[names.kBaseModelHiddenStates], (batch, seq, g.hb),
             f"inputs_embeds {emb}")
        need(names.kDraftModelHiddenStates, s[names.kDraftModelHiddenStates], emb, f"inputs_embeds {emb}")
    for i in range(g.nd):
        need(names.deepstack_embeds(i), s[names.deepstack_embeds(i)], emb, f"inputs_embeds {emb}")
    if g.mrope:
        need(names.kRopeCosSin, s[names.kRopeCosSin], (batch, g.cap, g.r), "MRoPE (one table per sequence)")
    if g.is_spec:
        mask = s[names.kAttentionMask]
        pos = s[names.kAttentionPosId]
        if mask[0] != batch or pos[0] != batch:
            problems.append(f"'attention_mask' {mask} and 'attention_pos_id' {pos} must have the batch "
                            f"of inputs_embeds ({batch})")
        if mask[1] not in (1, seq):
            problems.append(f"'attention_mask' {mask} must have 1 row (causal) or one row per token "
                            f"of the step ({seq})")
        if pos[1] not in (1, seq):
            problems.append(f"'attention_pos_id' {pos} must have 1 column or one per token of the step ({seq})")
    for i in range(g.layers):
        for cache in (names.k_cache(i), names.v_cache(i)):
            if g.fixed_cache_batch and s[cache][0] < batch:
                problems.append(f"{cache!r} holds {s[cache][0]} sequence slots but inputs_embeds has {batch}")
            elif not g.fixed_cache_batch and s[cache][0] != batch:
                problems.append(
                    f"{cache!r} has batch {s[cache][0]} but inputs_embeds has {batch}: TensorRT's "
                    f"KVCacheUpdate needs the cache batch to equal the update batch")
    return problems


def _ragged_shape_problems(g: _Geometry, s: dict[str, Shape]) -> list[str]:
    """The ragged contract's shape rules (docs/toy-model.md, "A step"): entry padding, sequence and
    token extents, and the phase carriers. ``s``: every input's shape."""
    rows = s[names.kInputsEmbeds][0]
    seqs = s[names.kQueryLengths][0]
    problems = []

    def need(name: str, want: Shape, why: str) -> None:
        if name in s and s[name] != want:
            problems.append(f"{name!r} has shape {s[name]}, but {why} needs {want}")

    if rows % seqs:
        problems.append(f"'inputs_embeds' has {rows} rows, not a multiple of the {seqs} sequences of "
                        f"'query_lengths' (entry padding: T = S * W)")
    width = rows // seqs
    seq_why = f"the {seqs} sequences of 'query_lengths'"
    for name in (names.kPastLengths, names.kAttentionSequenceLengths, names.kStateIndices,
                 names.kValidTreeCounts):
        need(name, (seqs,), seq_why)
    need(names.kQueryStartOffsets, (seqs + 1,), seq_why)
    table = s[names.kKVPageTable]
    if table[0] != seqs:
        problems.append(f"'kv_page_table' has shape {table}, but {seq_why} need {seqs} rows")
    row_why = f"the {rows} rows of 'inputs_embeds'"
    need(names.kRopeCosSin, (rows, g.r), row_why)
    for name in (names.kPositions, names.kAttentionPositionIds, names.kTreeParentIds, names.kTreeDepths):
        need(name, (rows,), row_why)
    need(names.kBaseModelHiddenStates, (rows, g.hb), row_why)
    for name in [names.kDraftModelHiddenStates] + [names.deepstack_embeds(i) for i in range(g.nd)]:
        need(name, (rows, g.h), row_why)
    mask = s.get(names.kPackedAttentionMask)
    if mask is not None and mask[0] != rows:
        problems.append(f"'packed_attention_mask' has shape {mask}, but {row_why} need [{rows}, words]")
    phase = s[names.kExecutionPhaseMarker][0]
    carried = s[names.kContextSequenceCountCarrier][0]
    tree_phases = (ragged_contract.PHASE_DRAFT, ragged_contract.PHASE_VERIFY)
    if not ragged_contract.PHASE_PREFILL <= phase <= ragged_contract.PHASE_VERIFY:
        problems.append(f"'execution_phase_marker' has extent {phase}: this engine runs phases 1 (prefill), "
                        f"2 (prefill after a restored prefix), 3 (decode), 4 (draft) and 5 (verify)")
    elif phase in tree_phases and mask is None:
        problems.append(f"'execution_phase_marker' has extent {phase} (tree attention), but a plain LLM "
                        f"engine has no packed_attention_mask: phases 1-3 only")
    elif phase <= ragged_contract.PHASE_PREFILL_RESTORED and carried != seqs:
        problems.append(f"'context_sequence_count_carrier' has extent {carried}, but phase {phase} (prefill) "
                        f"needs one per sequence ({seqs}); mixed prefill and generation steps are refused")
    elif phase > ragged_contract.PHASE_PREFILL_RESTORED and carried != 0:
        problems.append(f"'context_sequence_count_carrier' has extent {carried}, but phase {phase} "
                        f"(generation) needs 0")
    if phase in tree_phases and mask is not None and not rows % seqs and 32 * mask[1] < width:
        problems.append(f"'packed_attention_mask' has shape {mask}: {mask[1]} words hold {32 * mask[1]} "
                        f"bits, fewer than the {width} in-flight rows of a phase-{phase} sequence")
    return problems
