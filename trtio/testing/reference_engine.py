"""A pure-Python stand-in for a TensorRT engine that computes trtio's toy transformer.

:class:`ReferenceEngine` implements the subset of TensorRT 10/11's ``ICudaEngine`` and
``IExecutionContext`` Python API that trtio uses, with TensorRT's names, argument orders, return
types and failure behaviour, and computes the toy model of ``docs/toy-model.md`` on the raw
addresses it is given. trtio talks to it exactly as to TensorRT; nothing in trtio special-cases it.
The enums TensorRT's API returns (:class:`DataType`, :class:`TensorIOMode`, :class:`TensorLocation`,
:class:`ExecutionContextAllocationStrategy`) live in this module, because trtio finds them through
``sys.modules[type(engine).__module__]``.

Two contracts, picked by ``cfg.contract``: trtio's batch-major one (``[B, S, H]`` activations,
contiguous KV caches written like TensorRT's KVCacheUpdate) and, for ``"ragged"``, Edge-LLM 0.11's
token-major one (``[T, H]`` entry-padded rows, phase carriers, one paged KV pool per layer read and
written through ``kv_page_table``; fp8 pools included). Its I/O is built from
``trtio.contracts.ragged.registry_for`` and ``trtio.state.paged_state_specs``, in the order NVIDIA's
exporter writes it. ``docs/toy-model.md`` specifies both.

Two devices:

* ``"host"``: numpy on host memory (trtio's ``host`` backend). ``execute_async_v3(stream)``
  enqueues one closure with the host backend's ``launch_host_func``; the closure holds the
  bindings (addresses and shapes) as they were at enqueue time and computes on the raw memory in
  place (no copies of the caches). While the stream is captured the closure is recorded, and every
  replay of the host "graph" recomputes from the same addresses with whatever data they then hold,
  as a CUDA graph would.
* ``"gpu"``: CuPy on device memory, on the given stream (``cupy.cuda.Stream.from_external``).
  Every temporary CuPy makes comes from a per-context bump allocator over the context memory, reset at the start of
  each execute (and after each layer), so an execute hands out the same addresses each time, never
  calls ``cudaMalloc`` and never synchronises the host: after one warm-up execute with the same
  bindings, ``execute_async_v3`` can be captured into a CUDA graph.

Both devices run one implementation of the math (:func:`_forward`, :func:`_forward_ragged`, over
an array module that is numpy or CuPy) in float32; bf16 is converted with the same integer bit
operations on both, fp8 (e4m3fn) by ml_dtypes on the host and by :func:`float32_to_e4m3fn_bits` /
:func:`e4m3fn_bits_to_float32` on the GPU (CuPy has no fp8 dtype; tests hold them to ml_dtypes). On
the GPU the matrix products are one plain CUDA kernel rather than cuBLAS (CuPy refuses cuBLAS calls
during a capture), so replayed graphs and direct executes agree bit for bit; the ragged contract's
page-table writes are another small kernel that skips padding rows without a host sync.

Where this engine chooses behaviour TensorRT leaves open or undefined:

* ``execute_async_v3`` returns False (logging each reason) for: an I/O without an address, a
  dynamic input without a shape, a ``present_*`` output not bound to its cache's address, a cache
  batch other than ``inputs_embeds``' (KVCacheUpdate), input shapes that disagree on the batch or
  step length (TensorRT's shape inference would refuse them), and USER_MANAGED context memory that
  is missing or smaller than the active profile needs. Ragged: ``T`` not a multiple of ``S``
  (``query_lengths``' extent), ``[S]`` inputs, ``kv_page_table`` rows or ``query_start_offsets``
  (``S + 1``) of another extent, token inputs of other than ``T`` rows, a phase extent outside 1..5
  (4..5 need a ``packed_attention_mask`` of ``ceil(W / 32)`` words or more), a context-sequence
  carrier other than ``S`` in phases 1-2 or 0 in phases 3-5.
* Switching to another optimization profile forgets every input shape: set them again.
* Data that would index outside a tensor (a cache slot ``start + s >= C``, a RoPE position
  ``>= C``, a ``last_token_ids`` entry ``>= S``) raises ``ValueError`` on the host device, from the
  enqueued work; on the GPU it is clipped, since checking would synchronise the host. Ragged: an
  offset other than ``i * W``, a query length outside ``0..W``, a slot past the sequence's pages, a
  page id outside the pool on a page the step touches, a logits row outside ``T``, in tree phases an
  ``attention_sequence_lengths`` entry below ``W`` (the GPU ignores the offsets and clips the rest).
* ``device_memory_size_v2`` is the GPU scratch bound of the worst-case shapes of either profile
  (reported on the host device too, where nothing uses it); a ``null_compute`` engine reports 512.
"""

from __future__ import annotations

import enum
import itertools
import logging
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio import names
from trtio.contracts import ragged as ragged_contract
from trtio.cuda._hostmem import host_view
from trtio.dtypes import DType
from trtio.state import paged_state_specs
from trtio.testing.toy_model import ToyWeights, config_role, output_vocab_size

__all__ = [
    "ADDRESS_ALIGNMENT",
    "DataType",
    "ExecutionContextAllocationStrategy",
    "ReferenceEngine",
    "ReferenceExecutionContext",
    "TensorIOMode",
    "TensorLocation",
]

log = logging.getLogger("trtio.testing.reference_engine")

#: TensorRT's alignment for tensor addresses and for user-managed context memory.
ADDRESS_ALIGNMENT = 256
#: The context memory a reference engine reports when it needs none (null_compute): never 0.
_MIN_CONTEXT_MEMORY = 512

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
            )
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


def _declare_ragged(cfg: Any, omit: Iterable[str] = ()) -> list[_Decl]:
    """The I/O of an Edge-LLM 0.11 engine of ``cfg.role``, in the exporter's order (``docs/toy-model.md``).

    Built from ``trtio.contracts.ragged.registry_for`` (every binding but the KV state) and
    ``trtio.state.paged_state_specs`` (pools, their present aliases, the page table), so shapes and
    profiles have one source. The optional ``skip_softmax_scale`` is left out; ``omit`` drops
    optional inputs of :data:`RAGGED_OMITTABLE` that this role declares.
    """
    registry = ragged_contract.registry_for(cfg)
    state = {spec.name: spec for spec in paged_state_specs(cfg)}
    layers = range(int(cfg.num_attention_layers))
    omit = set(omit)
    omittable = {name for name in RAGGED_OMITTABLE if name in registry}
    if omit - omittable:
        raise ValueError(f"ReferenceEngine: omit={sorted(omit)}: a {cfg.role} engine can only lack "
                         f"{sorted(omittable)} (optional inputs no dense graph reads)")
    # The exporter writes the pools right after inputs_embeds and the page table after the
    # context-count carrier; every other binding keeps the registry's order.
    follows = {
        names.kInputsEmbeds: [state[names.past_key_values(i)] for i in layers],
        names.kContextSequenceCountCarrier: [state[names.kKVPageTable]],
    }
    specs = []
    for spec in registry:
        if spec.name in omit or spec.name == names.kSkipSoftmaxScale:
            continue
        specs.append(spec)
        specs.extend(follows.get(spec.name, ()))
    specs.extend(state[names.present_key_values(i)] for i in layers)
    aliases = {names.present_key_values(i): names.past_key_values(i) for i in layers}
    return [_Decl(index, spec.name, TensorIOMode.INPUT if spec.is_input else TensorIOMode.OUTPUT, spec.dtype,
                  spec.engine_shape, spec.profiles if spec.is_input else (), aliases.get(spec.name))
            for index, spec in enumerate(specs)]


def _index(value: Any, size: int) -> int | None:
    """``value`` as an index in ``[0, size)`` (Python or numpy integer, as pybind takes), else None."""
    if isinstance(value, bool):
        return None
    try:
        i = operator.index(value)
    except TypeError:
        return None
    return i if 0 <= i < size else None


def _align(n: int, alignment: int = ADDRESS_ALIGNMENT) -> int:
    return (int(n) + alignment - 1) // alignment * alignment


def _scratch_bound(g: _Geometry, batch: int, seq: int, select: int) -> int:
    """Bytes of GPU scratch one execute needs at most for a step of ``batch`` x ``seq`` tokens.

    Counts every float32 / int64 temporary :func:`_forward` makes (each kind of array times a
    generous number of copies), for the persistent part (inputs, masks, positions), one layer
    (scratch is released after each layer) and the outputs, plus alignment and a 1 MiB margin.
    """
    t = batch * seq
    f4, i8 = 4, 8
    q = t * g.hq * g.d * f4
    kv = t * g.hkv * g.d * f4
    cache = batch * g.hkv * g.cap * g.d * f4
    scores = batch * g.hq * seq * g.cap * f4
    x = t * g.h * f4
    mask = batch * seq * g.cap * i8
    persistent = (
        16 * mask  # visibility, tree bits and their temporaries
        + 12 * t * g.r * f4  # rope rows, cos, sin
        + 16 * x + 6 * t * max(g.hb, 1) * f4  # activation loads, draft input projections, x buffers
        + 8 * t * g.hkv * i8 + 16 * t * i8 + 16 * batch * select * i8  # indices
    )
    per_layer = (
        8 * q + 24 * kv  # projections, RoPE, cache conversions of the new K/V
        + 6 * cache  # cache reads converted to float32
        + 10 * scores  # scores, mask, softmax
        + 4 * batch * g.hq * seq * g.d * f4  # attention output and its transposes
        + 10 * x + 4 * t * g.f * f4  # residuals, MLP, deepstack
    )
    final = 10 * x + 3 * batch * select * g.h * f4 + 3 * batch * select * g.vout * f4
    allocations = 512 * ADDRESS_ALIGNMENT  # alignment waste, a few hundred allocations
    return _align(persistent + per_layer + final + allocations + (1 << 20))


def _ragged_scratch_bound(g: _Geometry, tokens: int, seqs: int, select: int) -> int:
    """:func:`_scratch_bound` for a ragged step of ``tokens`` rows, ``seqs`` sequences and ``select``
    logits rows. Per sequence the step gathers every slot its page-table row addresses (``M * page``),
    so the caches read count ``seqs * M * page`` slots; scores and masks count ``tokens * M * page``
    whatever the split into sequences. FP8 pools add their bit conversions (a few uint32 temporaries
    per element), which the generous copy counts cover.
    """
    t, lk = tokens, g.seq_slots
    f4, i8 = 4, 8
    q = t * g.hq * g.d * f4
    kv = t * g.hkv * g.d * f4
    cache = seqs * lk * g.hkv * g.d * f4
    scores = t * g.hq * lk * f4
    x = t * g.h * f4
    mask = t * lk * i8
    persistent = (
        16 * mask  # visibility, tree bits and their temporaries
        + 12 * t * g.r * f4  # RoPE rows, cos, sin
        + 16 * x + 6 * t * max(g.hb, 1) * f4  # activation loads, draft input projections, x buffers
        + 16 * seqs * lk * i8  # page-table gathers: pool rows of every addressable slot, slots in use
        + 24 * t * i8 + 16 * seqs * (g.seq_pages + 2) * i8 + 16 * select * i8  # row, sequence and page indices
    )
    per_layer = (
        8 * q + 32 * kv  # projections, RoPE, storage conversions of the new K/V
        + 12 * cache  # pool gathers converted to float32
        + 10 * scores  # scores, mask, softmax
        + 4 * t * g.hq * g.d * f4  # attention output and its transposes
        + 10 * x + 4 * t * g.f * f4  # residuals, MLP, deepstack, EAGLE3 hidden-state stores
    )
    final = 10 * x + 3 * select * g.h * f4 + 8 * select * g.vout * f4  # logits, draft log-softmax
    allocations = 512 * ADDRESS_ALIGNMENT
    return _align(persistent + per_layer + final + allocations + (1 << 20))


# -- the math, shared by numpy and CuPy -----------------------------------------------------------


def _ml_dtypes() -> Any:
    try:
        import ml_dtypes  # noqa: PLC0415 - optional dependency
    except ImportError:
        return None
    return ml_dtypes


def float32_to_e4m3fn_bits(xp: Any, x: Any) -> Any:
    """float32 -> float8 e4m3fn storage (uint8 bits) with element-wise ops of ``xp`` (numpy or CuPy).

    CuPy has no fp8 dtype, so the GPU rounds on the bits; the host checks this function against
    ml_dtypes. Round to nearest, ties to even; below 2**-6 the subnormals (steps of 2**-9, exact
    after scaling by 512); magnitudes that round past 448 (the format's max), infinities and NaN
    become NaN (0x7F) with the sign kept, as ml_dtypes' cast does (e4m3fn has no infinity).
    """
    u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    sign = ((u >> 24) & xp.uint32(0x80)).astype(xp.uint8)
    a = u & xp.uint32(0x7FFFFFFF)
    # Normal range: drop 20 of the 23 mantissa bits, rounding to nearest even; a carry moves into
    # the exponent as it should. Rebias the exponent from 127 to 7 (120 << 3 in the shifted bits).
    shifted = (a + (xp.uint32(0x7FFFF) + ((a >> 20) & xp.uint32(1)))) >> 20
    normal = xp.where(shifted > xp.uint32(0x7E + (120 << 3)), xp.uint32(0x7F + (120 << 3)), shifted)
    normal = normal - xp.uint32(120 << 3)  # only read where a >= 2**-6, so it never wraps there
    is_small = a < xp.uint32(0x3C800000)  # |x| < 2**-6: a subnormal (or 2**-6 after rounding up)
    small = xp.where(is_small, a, xp.uint32(0)).view(xp.float32)
    sub = xp.rint(small * xp.float32(512.0)).astype(xp.uint32)  # round half to even, like the bits above
    return xp.where(is_small, sub, normal).astype(xp.uint8) | sign


def e4m3fn_bits_to_float32(xp: Any, bits: Any) -> Any:
    """float8 e4m3fn storage (uint8 bits) -> float32, exactly, with element-wise ops of ``xp``."""
    b = bits.astype(xp.uint32)
    sign = (b & xp.uint32(0x80)) << 24
    exponent = (b >> 3) & xp.uint32(0xF)
    mantissa = b & xp.uint32(7)
    normal = sign | ((exponent + xp.uint32(120)) << 23) | (mantissa << 20)
    subnormal = (mantissa.astype(xp.float32) * xp.float32(2.0 ** -9)).view(xp.uint32) | sign
    out = xp.where(exponent == 0, subnormal, normal)
    out = xp.where((exponent == 15) & (mantissa == 7), sign | xp.uint32(0x7FC00000), out)
    return out.view(xp.float32)


def _load(xp: Any, raw: Any, dtype: DType) -> Any:
    """A new float32 array from raw storage (bf16 arrives as uint16 bits, fp8 as uint8 bits)."""
    if dtype is DType.BFLOAT16:
        return (raw.astype(xp.uint32) << 16).view(xp.float32)
    if dtype is DType.FP8:
        mld = _ml_dtypes() if xp is np else None
        if mld is not None:
            return raw.view(mld.float8_e4m3fn).astype(np.float32)
        return e4m3fn_bits_to_float32(xp, raw)
    return raw.astype(xp.float32)


def _store(xp: Any, x: Any, dtype: DType) -> Any:
    """``x`` (float32) rounded to ``dtype``'s storage (bf16: uint16 bits, round to nearest even;
    fp8: e4m3fn uint8 bits, by ml_dtypes on the host and :func:`float32_to_e4m3fn_bits` on the GPU)."""
    if dtype is DType.BFLOAT16:
        u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
        rounded = (u + (xp.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16
        is_nan = (u & 0x7FFFFFFF) > 0x7F800000
        return xp.where(is_nan, (u >> 16) | 0x0040, rounded).astype(xp.uint16)
    if dtype is DType.FP8:
        mld = _ml_dtypes() if xp is np else None
        if mld is not None:
            return np.asarray(x, dtype=np.float32).astype(mld.float8_e4m3fn).view(np.uint8)
        return float32_to_e4m3fn_bits(xp, x)
    return x.astype(dtype.storage_numpy)


@dataclass(frozen=True)
class _Weights:
    """ToyWeights as arrays of one array module (numpy, or CuPy on the device)."""

    wq: tuple[Any, ...]
    wk: tuple[Any, ...]
    wv: tuple[Any, ...]
    wo: tuple[Any, ...]
    w1: tuple[Any, ...]
    w2: tuple[Any, ...]
    we: Any
    wh: Any
    wd: Any
    w_lm: Any

    @classmethod
    def of(cls, w: ToyWeights, to: Callable[[np.ndarray], Any]) -> _Weights:
        def conv(a: np.ndarray | None) -> Any:
            return None if a is None else to(np.ascontiguousarray(a, dtype=np.float32))

        def layers(arrays: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
            return tuple(conv(a) for a in arrays)

        return cls(wq=layers(w.wq), wk=layers(w.wk), wv=layers(w.wv), wo=layers(w.wo), w1=layers(w.w1),
                   w2=layers(w.w2), we=conv(w.we), wh=conv(w.wh), wd=conv(w.wd), w_lm=conv(w.w_lm))


class _NoScratch:
    """numpy allocates as it likes: marks and releases are no-ops."""

    def mark(self) -> int:
        return 0

    def release(self, mark: int) -> None:
        pass


class _DataError(ValueError):
    pass


def _check_range(what: str, values: np.ndarray, lo: int, hi: int, rule: str) -> None:
    """Host only: data the model cannot use raises (on the GPU it is clipped instead)."""
    bad = np.argwhere((values < lo) | (values >= hi))
    if bad.size:
        where = tuple(int(i) for i in bad[0])
        raise _DataError(f"{what}{list(where)} = {int(values[where])} breaks {rule}")


def _attend(xp: Any, mm: Callable[[Any, Any], Any], g: _Geometry, q: Any, keys: Any, values: Any,
            visible: Any) -> Any:
    """Grouped-query attention of both contracts: ``q`` [B, S, Hq, D] over ``keys`` / ``values``
    [B, Hkv, K, D] (float32, as stored), ``visible`` [B, S, K] bool; returns [B, S, Hq*D].

    A query that sees no key gets zeros. ``values`` must hold no NaN where no query looks.
    """
    batch, seq = q.shape[0], q.shape[1]
    hkv, hq, d = g.hkv, g.hq, g.d
    group, lk = hq // hkv, keys.shape[2]
    inv_sqrt_d = np.float32(1.0 / math.sqrt(d))
    q_grouped = q.transpose(0, 2, 1, 3).reshape(batch, hkv, group * seq, d)
    scores = (mm(q_grouped, keys.transpose(0, 1, 3, 2)) * inv_sqrt_d).reshape(batch, hkv, group, seq, lk)
    scores = xp.where(visible[:, None, None, :, :], scores, -xp.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    any_seen = xp.isfinite(row_max)  # a row that sees no key attends to nothing: zeros
    p = xp.exp(scores - xp.where(any_seen, row_max, 0.0))
    denom = p.sum(axis=-1, keepdims=True)
    p = xp.where(any_seen, p / xp.where(any_seen, denom, 1.0), 0.0).astype(xp.float32)
    attn = mm(p.reshape(batch, hkv, group * seq, lk), values).reshape(batch, hq, seq, d)
    return attn.transpose(0, 2, 1, 3).reshape(batch, seq, hq * d)


def _forward(xp: Any, mm: Callable[[Any, Any], Any], g: _Geometry, w: _Weights, io: Mapping[str, Any],
             tree: bool, scratch: Any) -> None:
    """One engine call of ``docs/toy-model.md`` on the arrays ``io`` (views of the bound memory).

    ``mm`` is the matrix product (``numpy.matmul``; on the GPU a kernel of this module, because
    CuPy refuses cuBLAS calls while a stream is captured). Writes ``logits``, ``hidden_states`` and
    the new K/V rows of every cache in place. On the host (``xp is numpy``) data that would index
    out of range raises; on the GPU it is clipped (a check would synchronise the host).
    """
    host = xp is np
    f32 = xp.float32
    emb = io[names.kInputsEmbeds]
    batch, seq, _ = emb.shape
    c, d, r, hkv, hq = g.cap, g.d, g.r, g.hkv, g.hq
    half = r // 2

    ctx = io[names.kContextLengths].astype(xp.int64)
    start = io[names.kKVCacheStartIndex].astype(xp.int64)
    last = io[names.kLastTokenIds].astype(xp.int64)
    select = last.shape[1]
    b_idx = xp.arange(batch, dtype=xp.int64)
    s_idx = xp.arange(seq, dtype=xp.int64)
    slots = xp.arange(c, dtype=xp.int64)
    write = start[:, None] + s_idx[None, :]  # [B, S]: cache slot of each new token
    below_ctx = slots[None, None, :] < ctx[:, None, None]  # [B, 1, C]

    if tree:
        pos = xp.broadcast_to(io[names.kAttentionPosId].astype(xp.int64), (batch, seq))
        words = io[names.kAttentionMask]  # int32 [B, S, W]
        nbits = 32 * words.shape[2]
        rel = slots[None, :] - start[:, None]  # [B, C]: the tree node a slot holds
        in_tree = (rel >= 0) & (rel < seq) & (rel < nbits)
        rel_c = xp.clip(rel, 0, nbits - 1)
        word = words[b_idx[:, None, None], s_idx[None, :, None], (rel_c // 32)[:, None, :]]  # [B, S, C]
        # An arithmetic shift keeps bit k of the word at bit 0, also for negative (bit 31) words.
        seen = in_tree[:, None, :] & (((word >> (rel_c % 32)[:, None, :]) & 1) == 1)
        visible = below_ctx & ((slots[None, :] < start[:, None])[:, None, :] | seen)
    else:
        pos = write
        visible = below_ctx & (slots[None, None, :] <= write[:, :, None])

    if host:
        _check_range("kvcache_start_index + s at [b, s] ", write, 0, c,
                     f"0 <= slot < max_kv_cache_capacity ({c})")
        _check_range("RoPE position at [b, s] ", np.asarray(pos), 0, c,
                     f"0 <= position < {c} (rows of rope_rotary_cos_sin)")
        _check_range("last_token_ids", last, 0, seq, f"0 <= id < step length ({seq})")
    else:
        write = xp.clip(write, 0, c - 1)
        pos = xp.clip(pos, 0, c - 1)
        last = xp.clip(last, 0, seq - 1)

    table = io[names.kRopeCosSin]  # float32 [1 or B, C, R]
    rows_cs = table[0][pos] if table.shape[0] == 1 else table[b_idx[:, None], pos]  # [B, S, R]
    cos = rows_cs[:, :, None, :half]
    sin = rows_cs[:, :, None, half:r]

    def rope(t: Any) -> Any:  # [B, S, heads, D]
        t1, t2 = t[..., :half], t[..., half:r]
        return xp.concatenate([t1 * cos - t2 * sin, t2 * cos + t1 * sin, t[..., r:]], axis=-1)

    x = _load(xp, emb, g.act)
    if g.role == "draft":
        x = (mm(x, w.we)
             + mm(_load(xp, io[names.kBaseModelHiddenStates], g.act), w.wh)
             + mm(_load(xp, io[names.kDraftModelHiddenStates], g.act), w.wd))
    # Flat row of cache[b, h, slot] in a [B*Hkv*C, D] view: where KVCacheUpdate writes token (b, s).
    cache_rows = ((b_idx[:, None, None] * hkv + xp.arange(hkv, dtype=xp.int64)[None, None, :]) * c
                  + write[:, :, None]).reshape(-1)
    # Slots no query sees may hold anything (fresh cudaMalloc memory, NaN included): 0 * NaN is NaN,
    # so their values are zeroed before the probability-weighted sum rather than trusted.
    slot_used = visible.any(axis=1)[:, None, :, None]  # [B, 1, C, 1]
    x_keep = None if host else xp.empty((batch, seq, g.h), dtype=f32)
    layer_mark = scratch.mark()

    for layer in range(g.layers):
        q = rope(mm(x, w.wq[layer]).reshape(batch, seq, hq, d))
        k = rope(mm(x, w.wk[layer]).reshape(batch, seq, hkv, d))
        v = mm(x, w.wv[layer]).reshape(batch, seq, hkv, d)
        k_cache = io[names.k_cache(layer)]  # raw [B, Hkv, C, D]
        v_cache = io[names.v_cache(layer)]
        k_cache.reshape(-1, d)[cache_rows] = _store(xp, k.reshape(-1, d), g.kv)
        v_cache.reshape(-1, d)[cache_rows] = _store(xp, v.reshape(-1, d), g.kv)
        keys = _load(xp, k_cache[:batch], g.kv)  # [B, Hkv, C, D], as stored (a fixed-batch cache: its first rows)
        values = xp.where(slot_used, _load(xp, v_cache[:batch], g.kv), 0.0)
        x = x + mm(_attend(xp, mm, g, q, keys, values, visible), w.wo[layer])
        x = x + mm(xp.maximum(mm(x, w.w1[layer]), 0.0), w.w2[layer])
        if layer < g.nd:
            x = x + _load(xp, io[names.deepstack_embeds(layer)], g.act)
        if x_keep is not None:
            # Keep the residual stream and hand this layer's scratch back: stream order makes
            # the reuse safe, and the scratch a step needs no longer grows with the layer count.
            x_keep[...] = x
            x = x_keep
            scratch.release(layer_mark)

    io[names.kOutputHiddenStates][...] = _store(xp, x, g.act)
    chosen = x[b_idx[:, None], last].reshape(batch * select, g.h)
    io[names.kLogits][...] = mm(chosen, w.w_lm)


def _scatter_rows_host(target: np.ndarray, index: np.ndarray, rows: np.ndarray) -> None:
    """``target[index[i]] = rows[i]`` for every ``index[i] >= 0`` (rows of -1 are written nowhere)."""
    keep = index >= 0
    target[index[keep]] = rows[keep]


def _log_softmax(xp: Any, z: Any) -> Any:
    z = z - z.max(axis=-1, keepdims=True)
    return z - xp.log(xp.exp(z).sum(axis=-1, keepdims=True))


def _forward_ragged(xp: Any, mm: Callable[[Any, Any], Any], scatter: Callable[[Any, Any, Any], None],
                    g: _Geometry, w: _Weights, io: Mapping[str, Any], phase: int, scratch: Any) -> None:
    """One step of Edge-LLM 0.11's token-major contract (``docs/toy-model.md``, "A step").

    ``T`` rows are ``S`` sequences of ``W`` rows (entry padding), so the math runs on ``[S, W, ...]``
    views and shares the batch contract's attention. K/V go through the page table: each layer's
    pool is viewed as ``[2P * page, Hkv * D]`` rows; valid rows scatter into it (``scatter`` skips
    index -1: padding rows write nothing), and each sequence gathers all ``M * page`` slots its
    page-table row addresses. ``phase`` is the extent of ``execution_phase_marker`` (validated).
    """
    host = xp is np
    f32, i64 = xp.float32, xp.int64
    emb = io[names.kInputsEmbeds]
    t = emb.shape[0]
    ql = io[names.kQueryLengths].astype(i64)
    n = ql.shape[0]
    width = t // n
    page, lk, pages2 = g.page, g.seq_slots, 2 * g.pool_pages
    d, r, hkv, hq, h = g.d, g.r, g.hkv, g.hq, g.h
    half = r // 2
    tree = phase >= ragged_contract.PHASE_DRAFT
    past = io[names.kPastLengths].astype(i64)
    asl = io[names.kAttentionSequenceLengths].astype(i64)
    table = io[names.kKVPageTable].astype(i64)  # [S, 2, M]: K page ids, V page ids
    picks = io[names.kLogitsIndices].astype(i64)  # [R]
    seq_idx = xp.arange(n, dtype=i64)
    j = xp.arange(width, dtype=i64)
    slots = xp.arange(lk, dtype=i64)

    if host:
        offsets = io[names.kQueryStartOffsets].astype(np.int64)
        bad = np.flatnonzero(offsets != np.arange(n + 1) * width)
        if bad.size:
            i = int(bad[0])
            raise _DataError(f"query_start_offsets[{i}] = {int(offsets[i])} breaks entry padding "
                             f"(offset i*W = {i * width}; W = T/S = {width})")
        _check_range("query_lengths", ql, 0, width + 1, f"0 <= query length <= W ({width})")
    else:  # the GPU does not look at query_start_offsets: entry padding fixes them to i*W
        ql = xp.clip(ql, 0, width)
    valid = j[None, :] < ql[:, None]  # [S, W]
    write = past[:, None] + j[None, :]  # [S, W]: KV slot of each row (valid rows only)
    if host:
        _check_range("past_lengths[s] + j at valid row [s, j] ", np.where(valid, write, 0), 0, lk,
                     f"0 <= slot < the {g.seq_pages} pages x {page} slots of a page-table row ({lk})")
        has_rows = ql > 0
        if tree:
            _check_range("attention_sequence_lengths", np.where(has_rows, asl, width), width, lk + 1,
                         f"W ({width}) <= length <= {lk} in phase {phase} (the in-flight rows sit at "
                         f"slots length - W ..)")
        _check_range("logits_indices", picks, 0, t, f"0 <= row < T ({t})")
        # Every page a sequence touches: slots below what it writes, and in tree phases below its length.
        extent = np.where(has_rows, np.maximum(asl, past + ql) if tree else past + ql, 0)
        touched = (np.arange(g.seq_pages)[None, :] * page) < extent[:, None]  # [S, M]
        _check_range("kv_page_table", np.where(touched[:, None, :], table, 0), 0, pages2,
                     f"0 <= page id < 2 * kv_pool_pages ({pages2}) for every page the step touches")
    # The host has refused whatever these clips would change for a valid row; on the GPU they are
    # the answer to bad data. Padding rows and unused page-table entries (-1) are clipped on both
    # and then neither written nor seen.
    write = xp.clip(write, 0, lk - 1)
    picks = xp.clip(picks, 0, t - 1)
    if tree:
        asl = xp.clip(asl, width, lk)
    table = xp.clip(table, 0, pages2 - 1)

    def pool_rows(kind: int, seq: Any, slot: Any) -> Any:
        """Row of the pool viewed [2P * page, Hkv * D] that holds ``slot`` of sequence ``seq``."""
        return table[seq, kind, slot // page] * page + slot % page

    dst_k = xp.where(valid, pool_rows(0, seq_idx[:, None], write), -1).reshape(-1)  # [T]
    dst_v = xp.where(valid, pool_rows(1, seq_idx[:, None], write), -1).reshape(-1)
    src_k = pool_rows(0, seq_idx[:, None], slots[None, :]).reshape(-1)  # [S * Lk]
    src_v = pool_rows(1, seq_idx[:, None], slots[None, :]).reshape(-1)

    if tree:
        prefix = asl - width  # [S]: committed slots; the W in-flight rows follow them
        words = io[names.kPackedAttentionMask].reshape(n, width, -1)  # int32 [S, W, w]
        nbits = 32 * words.shape[2]
        rel = slots[None, :] - prefix[:, None]  # [S, Lk]: the in-flight row a slot holds
        in_flight = (rel >= 0) & (rel < width) & (rel < nbits)
        rel_c = xp.clip(rel, 0, nbits - 1)
        word = words[seq_idx[:, None, None], j[None, :, None], (rel_c // 32)[:, None, :]]  # [S, W, Lk]
        seen = in_flight[:, None, :] & (((word >> (rel_c % 32)[:, None, :]) & 1) == 1)
        visible = valid[:, :, None] & ((slots[None, :] < prefix[:, None])[:, None, :] | seen)
    else:
        visible = (valid[:, :, None] & (slots[None, None, :] <= write[:, :, None])
                   & (slots[None, None, :] < asl[:, None, None]))
    # Slots no valid row sees may hold anything (other sequences' pages, NaN): zero their values.
    slot_used = visible.any(axis=1).reshape(n * lk, 1)

    cos_sin = io[names.kRopeCosSin].reshape(n, width, 1, -1)  # float32 [S, W, 1, R]: each row its own
    cos = cos_sin[..., :half]
    sin = cos_sin[..., half:r]

    def rope(v: Any) -> Any:  # [S, W, heads, D]
        v1, v2 = v[..., :half], v[..., half:r]
        return xp.concatenate([v1 * cos - v2 * sin, v2 * cos + v1 * sin, v[..., r:]], axis=-1)

    def rows(name: str, width_: int) -> Any:
        return _load(xp, io[name], g.act).reshape(n, width, width_)

    x = rows(names.kInputsEmbeds, h)
    if g.role == "draft":
        x = (mm(x, w.we) + mm(rows(names.kBaseModelHiddenStates, g.hb), w.wh)
             + mm(rows(names.kDraftModelHiddenStates, h), w.wd))
    hidden_out = io[names.kOutputHiddenStates] if g.role == "base" else None
    x_keep = None if host else xp.empty((n, width, h), dtype=f32)
    layer_mark = scratch.mark()

    for layer in range(g.layers):
        q = rope(mm(x, w.wq[layer]).reshape(n, width, hq, d))
        k = rope(mm(x, w.wk[layer]).reshape(n, width, hkv, d))
        v = mm(x, w.wv[layer]).reshape(n, width, hkv, d)
        pool = io[names.past_key_values(layer)].reshape(pages2 * page, hkv * d)  # raw storage, in place
        scatter(pool, dst_k, _store(xp, k.reshape(t, hkv * d), g.kv))
        scatter(pool, dst_v, _store(xp, v.reshape(t, hkv * d), g.kv))
        keys = _load(xp, pool[src_k], g.kv).reshape(n, lk, hkv, d).transpose(0, 2, 1, 3)
        values = xp.where(slot_used, _load(xp, pool[src_v], g.kv), 0.0).reshape(n, lk, hkv, d).transpose(0, 2, 1, 3)
        x = x + mm(_attend(xp, mm, g, q, keys, values, visible), w.wo[layer])
        x = x + mm(xp.maximum(mm(x, w.w1[layer]), 0.0), w.w2[layer])
        if layer < g.nd:
            x = x + rows(names.deepstack_embeds(layer), h)
        if hidden_out is not None:
            for pos, captured in enumerate(g.eagle):
                if captured == layer:
                    hidden_out[:, pos * h:(pos + 1) * h] = _store(xp, x.reshape(t, h), g.act)
        if x_keep is not None:
            x_keep[...] = x
            x = x_keep
            scratch.release(layer_mark)

    final = x.reshape(t, h)
    chosen = final[picks]  # [R, H]
    logits = mm(chosen, w.w_lm)
    if g.role == "draft":
        logits = _log_softmax(xp, logits)
        io[names.kOutputHiddenStates][...] = _store(xp, chosen, g.act)
    elif hidden_out is not None and not g.eagle:
        hidden_out[...] = _store(xp, final, g.act)
    io[names.kLogits][...] = logits


# -- GPU support ------------------------------------------------------------------------------------


def _import_cupy() -> Any:
    import cupy  # noqa: PLC0415 - optional dependency, imported only for the gpu device

    return cupy


_MATMUL_SOURCE = r"""
extern "C" __global__ void trtio_reference_bmm(
        const float* a, const float* b, float* out, long long batch, long long m, long long n, long long k,
        long long sab, long long sam, long long sak, long long sbb, long long sbk, long long sbn) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= batch * m * n) return;
    long long col = i % n, row = (i / n) % m, mat = i / (m * n);
    const float* pa = a + mat * sab + row * sam;
    const float* pb = b + mat * sbb + col * sbn;
    float acc = 0.0f;
    for (long long j = 0; j < k; ++j) acc += pa[j * sak] * pb[j * sbk];
    out[i] = acc;
}
"""


class _GpuMatmul:
    """float32 ``a @ b`` as one plain CUDA kernel: ``[..., M, K] @ [K, N]`` or matching batch dims.

    Not cuBLAS: CuPy refuses cuBLAS calls while a stream is captured, and one fixed kernel also
    makes a replayed graph and a direct execute add in the same order. Toy sizes only.
    """

    def __init__(self, cupy: Any) -> None:
        self._cupy = cupy
        self._kernel = cupy.RawKernel(_MATMUL_SOURCE, "trtio_reference_bmm")
        self._kernel.compile()  # now, not in the first (maybe captured) execute

    def __call__(self, a: Any, b: Any) -> Any:
        cp = self._cupy
        k, n = b.shape[-2], b.shape[-1]
        if b.ndim == 2:  # [..., K] rows times one matrix
            a3, b3 = a.reshape(1, -1, k), b.reshape(1, k, n)
        else:  # the same batch dims on both sides; reshape copies only where a view cannot do
            a3, b3 = a.reshape(-1, a.shape[-2], k), b.reshape(-1, k, n)
        batch, m = a3.shape[0], a3.shape[1]
        out = cp.empty((*a.shape[:-1], n), dtype=cp.float32)
        total = batch * m * n
        if total:
            sa = [st // 4 for st in a3.strides]
            sb = [st // 4 for st in b3.strides]
            i64 = np.int64
            self._kernel(((total + 255) // 256,), (256,),
                         (a3, b3, out, i64(batch), i64(m), i64(n), i64(k),
                          i64(sa[0]), i64(sa[1]), i64(sa[2]), i64(sb[0]), i64(sb[1]), i64(sb[2])))
        return out


_SCATTER_SOURCE = r"""
extern "C" __global__ void trtio_reference_scatter_rows(
        const unsigned char* rows, unsigned char* target, const long long* index, long long n, long long row_bytes) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * row_bytes) return;
    long long dst = index[i / row_bytes];
    if (dst < 0) return;
    target[dst * row_bytes + i % row_bytes] = rows[i];
}
"""


class _GpuScatterRows:
    """``target[index[i]] = rows[i]`` for ``index[i] >= 0``, byte for byte (any storage dtype).

    CuPy's fancy assignment has no "skip this row"; boolean indexing would synchronise the host.
    ``target`` and ``rows`` are C-contiguous 2-D arrays of one dtype and row width.
    """

    def __init__(self, cupy: Any) -> None:
        self._cupy = cupy
        self._kernel = cupy.RawKernel(_SCATTER_SOURCE, "trtio_reference_scatter_rows")
        self._kernel.compile()

    def __call__(self, target: Any, index: Any, rows: Any) -> None:
        cp = self._cupy
        rows = cp.ascontiguousarray(rows)
        index = cp.ascontiguousarray(index, dtype=cp.int64)
        row_bytes = rows.shape[1] * rows.itemsize
        total = index.shape[0] * row_bytes
        if total:
            self._kernel(((total + 255) // 256,), (256,),
                         (rows, target, index, np.int64(index.shape[0]), np.int64(row_bytes)))


class _StreamRef:
    """A raw stream handle in the CUDA stream protocol, for ``cupy.cuda.Stream.from_external``."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _cupy_stream(cupy: Any, handle: int, device_id: int) -> Any:
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_StreamRef(handle))
    return cupy.cuda.ExternalStream(handle, device_id)


class _BumpAllocator:
    """CuPy allocator over one block of context memory: hands out 256-byte aligned slices.

    Nothing is freed one by one; :meth:`reset` (start of each execute) and :meth:`release`
    (after each layer) move the offset back. Slices are handed out in the same order every
    execute, so a CUDA graph captured from one execute replays on the same addresses.
    """

    def __init__(self, cupy: Any, what: str, base: int, size: int, device_id: int) -> None:
        self._cupy = cupy
        self.what = what
        self.base = int(base)
        self.size = int(size)
        self.device_id = device_id
        self.offset = 0
        self.peak = 0
        self.count = 0

    def __call__(self, nbytes: int) -> Any:
        need = _align(max(int(nbytes), 1))
        if self.offset + need > self.size:
            raise RuntimeError(
                f"{self.what}: context memory exhausted: a temporary of {int(nbytes)} bytes needs "
                f"{self.offset + need} bytes in all, but the context memory holds {self.size} "
                f"(engine.device_memory_size_v2 underestimates this step; please report it)")
        ptr = self.base + self.offset
        self.offset += need
        self.peak = max(self.peak, self.offset)
        self.count += 1
        mem = self._cupy.cuda.UnownedMemory(ptr, need, self, self.device_id)
        return self._cupy.cuda.MemoryPointer(mem, 0)

    def reset(self) -> None:
        self.offset = 0

    def mark(self) -> int:
        return self.offset

    def release(self, mark: int) -> None:
        self.offset = mark


# -- the engine -------------------------------------------------------------------------------------


class ReferenceEngine:
    """A toy-model engine with TensorRT's ``ICudaEngine`` API (see module docstring).

    Build it with :meth:`from_config`. Unknown tensor names behave as TensorRT's getters do: an
    error is logged on ``trtio.testing.reference_engine`` and a sentinel comes back
    (``get_tensor_mode``: ``TensorIOMode.NONE``; ``get_tensor_dtype``: ``DataType.FLOAT``;
    ``get_tensor_shape``: ``()``; ``get_tensor_location``: ``TensorLocation.DEVICE``;
    ``get_aliased_input_tensor``: None); ``get_tensor_profile_shape`` raises ``RuntimeError``
    as TensorRT's Python binding does.
    """

    def __init__(self, cfg: Any, weights: ToyWeights, *, device: str, null_compute: bool, name: str,
                 seed: int, fixed_cache_batch: bool = False, omit: Iterable[str] = ()) -> None:
        self._cfg = cfg
        self._geo = _Geometry.from_config(cfg, fixed_cache_batch=fixed_cache_batch)
        self._toy_weights = weights
        self._device = device
        self._null_compute = bool(null_compute)
        self._name = name
        self._seed = seed
        self._decls = _declare_ragged(cfg, omit) if self._geo.is_ragged else _declare(self._geo)
        self._by_name = {decl.name: decl for decl in self._decls}
        self._host_weights: _Weights | None = None
        self._gpu_weights: _Weights | None = None
        self._gpu_matmul: _GpuMatmul | None = None
        self._gpu_scatter: _GpuScatterRows | None = None
        self._device_id = -1
        self._context_ids = itertools.count()
        if device == "gpu" and not self._null_compute:
            cupy = _import_cupy()
            self._device_id = int(cupy.cuda.runtime.getDevice())
            self._gpu_weights = _Weights.of(weights, cupy.asarray)
            self._gpu_matmul = _GpuMatmul(cupy)
            if self._geo.is_ragged:
                self._gpu_scatter = _GpuScatterRows(cupy)
        elif not self._null_compute:
            self._host_weights = _Weights.of(weights, np.asarray)
        sizes = []
        for p in range(2):
            g = self._geo
            if self._null_compute:
                sizes.append(_MIN_CONTEXT_MEMORY)
            elif g.is_ragged:
                steps = g.smax if p == 0 else g.p1  # rows per sequence: a prompt, or a generation step
                select = g.bmax * steps if g.is_spec else g.bmax  # logits rows (profile max)
                sizes.append(_ragged_scratch_bound(g, g.bmax * steps, g.bmax, select))
            else:
                seq = g.smax if p == 0 else g.p1
                select = 1 if p == 0 else g.p1
                sizes.append(_scratch_bound(g, g.bmax, seq, select))
        self._profile_memory = tuple(sizes)

    @classmethod
    def from_config(cls, cfg: Any, *, seed: int = 0, device: str = "auto", weights: ToyWeights | None = None,
                    null_compute: bool = False, name: str | None = None,
                    fixed_cache_batch: bool = False, omit: Iterable[str] = ()) -> ReferenceEngine:
        """An engine computing the toy model of ``cfg`` (an ``LLMEngineConfig`` or any object with its fields).

        ``cfg.contract`` picks the I/O contract: ``"ragged"`` is Edge-LLM 0.11's token-major one with
        a paged KV cache (``docs/toy-model.md``; it needs the config's ragged fields:
        ``kv_page_size``, ``kv_pool_pages``, ``pages_per_sequence``, ``eagle_hidden_state_layers``,
        ``role``, ``max_step_tokens``); anything else (None included) the batch-major one.
        ``omit`` (ragged only) leaves out optional inputs no dense graph reads
        (:data:`RAGGED_OMITTABLE`), as an engine whose ONNX parser dropped them; a name this role
        does not declare as optional is a ValueError. Ragged engines take ``kv_cache_dtype="fp8"``
        (e4m3fn pools); batch ones compute with float32, float16 or bfloat16 caches only.

        ``fixed_cache_batch=True`` declares the batch-contract caches with a fixed batch of
        ``max_supported_batch_size`` (cache rows are sequence slots; a step of ``b`` sequences uses
        rows ``0..b-1``) instead of a dynamic one that must equal the step's batch.

        ``weights`` default to ``ToyWeights.generate(cfg, seed)``. ``device``: ``"host"`` (numpy,
        for trtio's host backend), ``"gpu"`` (CuPy, for the cuda backend), or ``"auto"`` (gpu when
        ``trtio.cuda_available()`` and CuPy imports, else host). ``null_compute=True`` keeps the
        I/O contract and every validation but computes nothing (overhead benchmarks); it needs no
        weights and reports a small context memory. ``name`` defaults to ``"toy-<role>"``.
        """
        validate = getattr(cfg, "validate", None)
        if callable(validate):
            validate()
        if device not in ("auto", "host", "gpu"):
            raise ValueError(f"ReferenceEngine: device must be 'auto', 'host' or 'gpu', got {device!r}")
        if device == "auto":
            device = "gpu" if _gpu_usable() else "host"
        elif device == "gpu" and not null_compute:
            try:
                _import_cupy()
            except ImportError as exc:
                raise RuntimeError(f"ReferenceEngine: device='gpu' needs CuPy ({exc}); use device='host'") from None
        geo = _Geometry.from_config(cfg)
        omit = tuple(omit)
        if geo.is_ragged and fixed_cache_batch:
            raise ValueError("ReferenceEngine: fixed_cache_batch is for the batch contract; a ragged engine's "
                             "KV state is a paged pool")
        if omit and not geo.is_ragged:
            raise ValueError(f"ReferenceEngine: omit={list(omit)} is for the ragged contract (cfg.contract="
                             f"'ragged'); a batch engine has no optional inputs")
        if not null_compute:
            floats = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)
            for field_name, dt in (("activation_dtype", geo.act), ("kv_cache_dtype", geo.kv)):
                if dt in floats or (geo.is_ragged and field_name == "kv_cache_dtype" and dt is DType.FP8):
                    continue
                also = " (fp8 KV: ragged contract only)" if dt is DType.FP8 else ""
                raise ValueError(
                    f"ReferenceEngine computes with float32, float16 or bfloat16 only{also}; {field_name} is "
                    f"{dt} (pass null_compute=True for an engine that only checks its I/O)")
        if weights is None:
            weights = ToyWeights.generate(cfg, seed) if not null_compute else _NO_WEIGHTS
        elif weights.num_layers != geo.layers or weights.is_draft != (geo.role == "draft"):
            raise ValueError(f"ReferenceEngine: the weights ({weights.num_layers} layers, draft={weights.is_draft}) "
                             f"do not fit the config ({geo.layers} layers, role {geo.role!r})")
        return cls(cfg, weights, device=device, null_compute=null_compute,
                   name=name if name is not None else f"toy-{geo.role}", seed=seed,
                   fixed_cache_batch=fixed_cache_batch, omit=omit)

    # -- reference-engine extras (not TensorRT API) ---------------------------------------------
    @property
    def config(self) -> Any:
        return self._cfg

    @property
    def weights(self) -> ToyWeights:
        return self._toy_weights

    @property
    def device(self) -> str:
        """``"host"`` or ``"gpu"``: where this engine computes."""
        return self._device

    @property
    def trtio_backend(self) -> str:
        """The trtio backend whose memory this engine computes on: ``"host"`` or ``"cuda"``."""
        return "cuda" if self._device == "gpu" else "host"

    @property
    def null_compute(self) -> bool:
        return self._null_compute

    @property
    def contract(self) -> str:
        """``"batch"`` or ``"ragged"``: the I/O contract this engine speaks."""
        return self._geo.contract

    def io_contract(self) -> list[dict[str, Any]]:
        """The I/O contract as ``trtio.testing.toy_build.network_contract`` reports a built network's."""
        rows = []
        for decl in self._decls:
            rows.append(dict(name=decl.name, mode="input" if decl.is_input else "output", dtype=str(decl.dtype),
                             shape=decl.shape, profiles=list(decl.profiles), aliased_input=decl.alias))
        return rows

    def __repr__(self) -> str:
        return (f"ReferenceEngine(name={self._name!r}, role={self._geo.role!r}, contract={self._geo.contract!r}, "
                f"device={self._device!r}, io_tensors={len(self._decls)}, null_compute={self._null_compute})")

    # -- ICudaEngine -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def num_io_tensors(self) -> int:
        return len(self._decls)

    @property
    def num_optimization_profiles(self) -> int:
        return 2

    def __len__(self) -> int:
        return len(self._decls)

    def __getitem__(self, index: int) -> str:
        i = _index(index, len(self._decls))
        if i is None:
            raise IndexError(f"{self._name}: I/O tensor index {index!r} out of range [0, {len(self._decls)})")
        return self._decls[i].name

    def get_tensor_name(self, index: int) -> str | None:
        i = _index(index, len(self._decls))
        if i is None:
            log.error("%s: get_tensor_name: index %r is out of range [0, %d)", self._name, index, len(self._decls))
            return None
        return self._decls[i].name

    def _lookup(self, call: str, name: str) -> _Decl | None:
        decl = self._by_name.get(name)
        if decl is None:
            log.error("%s: %s: %r is not an I/O tensor of this engine", self._name, call, name)
        return decl

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        decl = self._lookup("get_tensor_mode", name)
        return TensorIOMode.NONE if decl is None else decl.mode

    def get_tensor_dtype(self, name: str) -> DataType:
        decl = self._lookup("get_tensor_dtype", name)
        return DataType.FLOAT if decl is None else DataType[decl.dtype.trt_name]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        decl = self._lookup("get_tensor_shape", name)
        return () if decl is None else decl.shape

    def get_tensor_location(self, name: str) -> TensorLocation:
        self._lookup("get_tensor_location", name)
        return TensorLocation.DEVICE

    def is_shape_inference_io(self, name: str) -> bool:
        self._lookup("is_shape_inference_io", name)
        return False

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
        """``[min, opt, max]`` of input ``name`` in ``profile_index`` (a static input: its shape thrice)."""
        decl = self._by_name.get(name)
        if decl is None or not decl.is_input:
            what = "not an I/O tensor" if decl is None else "an output, not an input"
            raise RuntimeError(f"{self._name}: get_tensor_profile_shape: {name!r} is {what}")
        p = _index(profile_index, 2)
        if p is None:
            raise RuntimeError(f"{self._name}: get_tensor_profile_shape: profile index {profile_index!r} "
                               f"is out of range [0, 2)")
        return list(decl.profiles[p])

    def get_aliased_input_tensor(self, name: str) -> str | None:
        decl = self._lookup("get_aliased_input_tensor", name)
        return None if decl is None else decl.alias

    @property
    def device_memory_size_v2(self) -> int:
        """Context memory (bytes) that covers every profile."""
        return max(self._profile_memory)

    def get_device_memory_size_for_profile_v2(self, profile_index: int) -> int:
        p = _index(profile_index, 2)
        if p is None:
            log.error("%s: get_device_memory_size_for_profile_v2: profile index %r is out of range [0, 2)",
                      self._name, profile_index)
            return 0
        return self._profile_memory[p]

    def create_execution_context(
        self, strategy: ExecutionContextAllocationStrategy | int = ExecutionContextAllocationStrategy.STATIC,
    ) -> ReferenceExecutionContext:
        """A new context. STATIC and ON_PROFILE_CHANGE own context memory of ``device_memory_size_v2``
        bytes (allocated on the GPU now; the host device needs none); USER_MANAGED waits for
        ``set_device_memory``."""
        try:
            strategy = ExecutionContextAllocationStrategy(int(strategy))
        except (TypeError, ValueError):
            raise RuntimeError(f"{self._name}: create_execution_context: unknown allocation strategy "
                               f"{strategy!r}") from None
        return ReferenceExecutionContext(self, strategy, f"{self._name}.context{next(self._context_ids)}")


_NO_WEIGHTS = ToyWeights(wq=(), wk=(), wv=(), wo=(), w1=(), w2=(), we=None, wh=None, wd=None,
                         w_lm=np.zeros((0, 0), np.float32))


def _gpu_usable() -> bool:
    from trtio.cuda.backend import cuda_available  # noqa: PLC0415 - avoid importing the backend early

    if not cuda_available():
        return False
    try:
        _import_cupy()
    except ImportError:
        return False
    return True


# -- the execution context ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """A validated binding snapshot: what one execute computes on."""

    shapes: Mapping[str, Shape]
    addresses: Mapping[str, int]
    tree: bool
    views: Mapping[str, Any]  # name -> numpy / CuPy array over the bound memory (inputs and logits/hidden)
    phase: int = 0  # ragged: the extent of execution_phase_marker


class ReferenceExecutionContext:
    """``IExecutionContext`` of a :class:`ReferenceEngine` (see :meth:`execute_async_v3`).

    ``calls`` counts the calls of each state-changing method and of ``execute_async_v3`` (failed
    calls included), so tests can assert that a steady decode step sets nothing.

    Choices where TensorRT's behaviour is not pinned down: switching to another optimization
    profile forgets every input shape; ON_PROFILE_CHANGE allocates like STATIC; user-managed
    memory must be 256-byte aligned. A host-device context enqueues its work through trtio's shared
    host backend (``get_backend("host")``), so captures must be made on that backend.
    """

    def __init__(self, engine: ReferenceEngine, strategy: ExecutionContextAllocationStrategy, name: str) -> None:
        self._engine = engine
        self._strategy = strategy
        self.name = name
        self.calls: dict[str, int] = {
            "set_input_shape": 0, "set_tensor_address": 0, "set_optimization_profile_async": 0,
            "set_device_memory": 0, "execute_async_v3": 0,
        }
        self._profile = 0
        self._shapes: dict[str, Shape] = {}
        self._addresses: dict[str, int] = {}
        self._plan: _Plan | None = None
        self._memory: tuple[int, int] | None = None  # (ptr, size) of the context memory
        self._owned_memory: Any = None
        self._scratch: _BumpAllocator | None = None
        self._streams: dict[int, Any] = {}
        self._host_backend: Any = None
        if strategy is not ExecutionContextAllocationStrategy.USER_MANAGED and engine.device == "gpu" \
                and not engine.null_compute:
            cupy = _import_cupy()
            size = engine.device_memory_size_v2
            self._owned_memory = cupy.cuda.Memory(size)
            self._set_memory(int(self._owned_memory.ptr), size)

    def __repr__(self) -> str:
        return (f"ReferenceExecutionContext(name={self.name!r}, profile={self._profile}, "
                f"strategy={self._strategy.name})")

    @property
    def engine(self) -> ReferenceEngine:
        return self._engine

    @property
    def active_optimization_profile(self) -> int:
        return self._profile

    @property
    def scratch_peak_bytes(self) -> int:
        """GPU only: the most context memory one execute has used so far (not TensorRT API)."""
        return 0 if self._scratch is None else self._scratch.peak

    def _error(self, call: str, message: str, *args: Any) -> None:
        log.error("%s: %s: " + message, self.name, call, *args)

    def _invalidate(self) -> None:
        self._plan = None

    # -- profiles and shapes -----------------------------------------------------------------------
    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        """Select profile 0 (prefill) or 1; a change forgets every input shape."""
        self.calls["set_optimization_profile_async"] += 1
        p = _index(profile_index, self._engine.num_optimization_profiles)
        if p is None:
            raise RuntimeError(f"{self.name}: set_optimization_profile_async: profile index {profile_index!r} "
                               f"is out of range [0, {self._engine.num_optimization_profiles})")
        if p != self._profile:
            self._profile = p
            self._shapes.clear()
            self._invalidate()
        return True

    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool:
        self.calls["set_input_shape"] += 1
        call = "set_input_shape"
        decl = self._engine._by_name.get(name)
        if decl is None or not decl.is_input:
            self._error(call, "%r is %s", name, "not an I/O tensor" if decl is None else "an output, not an input")
            return False
        try:
            dims = tuple(int(x) for x in shape)
        except (TypeError, ValueError):
            self._error(call, "%r: shape %r is not a sequence of ints", name, shape)
            return False
        if len(dims) != len(decl.shape):
            self._error(call, "%r: shape %s has rank %d, the engine declares rank %d %s",
                        name, dims, len(dims), len(decl.shape), decl.shape)
            return False
        lo, _, hi = decl.profiles[self._profile]
        for axis, (got, static, mn, mx) in enumerate(zip(dims, decl.shape, lo, hi)):
            if static != -1 and got != static:
                self._error(call, "%r: dim %d of %s is %d, but the engine's shape %s fixes it to %d",
                            name, axis, dims, got, decl.shape, static)
                return False
            if not mn <= got <= mx:
                self._error(call, "%r: dim %d of %s is %d, outside profile %d's range [%d, %d] (min %s, max %s)",
                            name, axis, dims, got, self._profile, mn, mx, lo, hi)
                return False
        if self._shapes.get(name) != dims:
            self._shapes[name] = dims
            self._invalidate()
        return True

    def _input_shape(self, decl: _Decl) -> Shape | None:
        shape = self._shapes.get(decl.name)
        if shape is None and decl.is_static:
            return decl.shape
        return shape

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        """Inputs: the shape set (the engine's, with -1, until then). Outputs: inferred from the inputs."""
        decl = self._engine._by_name.get(name)
        if decl is None:
            self._error("get_tensor_shape", "%r is not an I/O tensor", name)
            return ()
        if decl.is_input:
            shape = self._input_shape(decl)
            return decl.shape if shape is None else shape
        g = self._engine._geo
        if g.is_ragged:
            return self._ragged_output_shape(decl)
        if name == names.kLogits:
            ids = self._shapes.get(names.kLastTokenIds)
            return (-1, g.vout) if ids is None else (ids[0] * ids[1], g.vout)
        if name == names.kOutputHiddenStates:
            emb = self._shapes.get(names.kInputsEmbeds)
            return decl.shape if emb is None else emb
        assert decl.alias is not None
        cache = self._shapes.get(decl.alias)
        return decl.shape if cache is None else cache

    def _ragged_output_shape(self, decl: _Decl) -> Shape:
        g = self._engine._geo
        if decl.alias is not None:
            return self._shapes.get(decl.alias, decl.shape)
        rows = self._shapes.get(names.kLogitsIndices)
        if decl.name == names.kLogits:
            return (-1, g.vout) if rows is None else (rows[0], g.vout)
        if g.role == "draft":  # hidden_states: the final stream at the logits rows
            return (-1, g.h) if rows is None else (rows[0], g.h)
        emb = self._shapes.get(names.kInputsEmbeds)
        return (-1, g.hidden_out) if emb is None else (emb[0], g.hidden_out)

    def infer_shapes(self) -> list[str]:
        """Names of the inputs whose shapes are still unspecified; RuntimeError if the shapes set disagree."""
        missing = [d.name for d in self._engine._decls if d.is_input and self._input_shape(d) is None]
        if not missing:
            problems = self._shape_problems()
            if problems:
                for problem in problems:
                    self._error("infer_shapes", "%s", problem)
                raise RuntimeError(f"{self.name}: infer_shapes: " + "; ".join(problems))
        return missing

    # -- addresses and memory ----------------------------------------------------------------------
    def set_tensor_address(self, name: str, memory: int) -> bool:
        self.calls["set_tensor_address"] += 1
        call = "set_tensor_address"
        if name not in self._engine._by_name:
            self._error(call, "%r is not an I/O tensor", name)
            return False
        ptr = int(memory)
        if ptr == 0:
            self._error(call, "%r: address is null (bind a small dummy buffer for an empty tensor)", name)
            return False
        if ptr < 0 or ptr % ADDRESS_ALIGNMENT:
            self._error(call, "%r: address 0x%x is not %d-byte aligned", name, ptr, ADDRESS_ALIGNMENT)
            return False
        if self._addresses.get(name) != ptr:
            self._addresses[name] = ptr
            self._invalidate()
        return True

    def get_tensor_address(self, name: str) -> int:
        if name not in self._engine._by_name:
            self._error("get_tensor_address", "%r is not an I/O tensor", name)
            return 0
        return self._addresses.get(name, 0)

    def set_device_memory(self, memory: int, size: int) -> None:
        """USER_MANAGED only: the context memory, 256-byte aligned (RuntimeError otherwise)."""
        self.calls["set_device_memory"] += 1
        if self._strategy is not ExecutionContextAllocationStrategy.USER_MANAGED:
            raise RuntimeError(f"{self.name}: set_device_memory needs a context created with "
                               f"ExecutionContextAllocationStrategy.USER_MANAGED, this one is {self._strategy.name}")
        ptr, size = int(memory), int(size)
        if ptr <= 0 or ptr % ADDRESS_ALIGNMENT:
            raise RuntimeError(f"{self.name}: set_device_memory: address 0x{ptr:x} is not a "
                               f"{ADDRESS_ALIGNMENT}-byte aligned device address")
        if size < 0:
            raise RuntimeError(f"{self.name}: set_device_memory: size {size} is negative")
        if self._memory != (ptr, size):
            self._set_memory(ptr, size)
            self._invalidate()

    def _set_memory(self, ptr: int, size: int) -> None:
        self._memory = (ptr, size)
        if self._engine.device == "gpu" and not self._engine.null_compute:
            self._scratch = _BumpAllocator(_import_cupy(), self.name, ptr, size, self._engine._device_id)

    def update_device_memory_size_for_shapes(self) -> int:
        """The context memory the active profile needs (the reference engine sizes per profile)."""
        return self._engine.get_device_memory_size_for_profile_v2(self._profile)

    # -- validation ---------------------------------------------------------------------------------
    def _set_shapes(self) -> dict[str, Shape]:
        """Every input's shape (all are set when this is called; the declared one stands in otherwise)."""
        out = {}
        for d in self._engine._decls:
            if d.is_input:
                shape = self._input_shape(d)
                out[d.name] = d.shape if shape is None else shape
        return out

    def _ragged_shape_problems(self) -> list[str]:
        """The ragged contract's shape rules (docs/toy-model.md, "A step"): entry padding, sequence and
        token extents, and the phase carriers."""
        g = self._engine._geo
        s = self._set_shapes()
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

    def _shape_problems(self) -> list[str]:
        """Disagreements between input shapes that TensorRT's shape inference would refuse."""
        g = self._engine._geo
        if g.is_ragged:
            return self._ragged_shape_problems()
        s = self._set_shapes()
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

    def _validate(self) -> _Plan | None:
        engine = self._engine
        problems: list[str] = []
        for decl in engine._decls:
            if decl.is_input and self._input_shape(decl) is None:
                problems.append(f"input {decl.name!r} has no shape (set_input_shape was not called "
                                f"since the profile was selected)")
        for decl in engine._decls:
            if not self._addresses.get(decl.name):
                problems.append(f"{decl.name!r} has no address (set_tensor_address)")
        for decl in engine._decls:
            if decl.alias is None:
                continue
            out_ptr, in_ptr = self._addresses.get(decl.name, 0), self._addresses.get(decl.alias, 0)
            if out_ptr and in_ptr and out_ptr != in_ptr:
                problems.append(f"{decl.name!r} is bound to 0x{out_ptr:x} but its input {decl.alias!r} to "
                                f"0x{in_ptr:x}: KVCacheUpdate writes the cache in place, bind both to one address")
        if not problems:
            problems += self._shape_problems()
        if self._strategy is ExecutionContextAllocationStrategy.USER_MANAGED:
            need = engine.get_device_memory_size_for_profile_v2(self._profile)
            if self._memory is None:
                problems.append(f"no context memory (USER_MANAGED: call set_device_memory with {need} bytes)")
            elif self._memory[1] < need:
                problems.append(f"context memory of {self._memory[1]} bytes is smaller than the "
                                f"{need} bytes profile {self._profile} needs")
        if problems:
            for problem in problems:
                self._error("execute_async_v3", "%s", problem)
            return None
        shapes = {d.name: self.get_tensor_shape(d.name) for d in engine._decls}
        g = engine._geo
        tree = not g.is_ragged and g.is_spec and shapes[names.kAttentionMask][1] > 1
        phase = shapes[names.kExecutionPhaseMarker][0] if g.is_ragged else 0
        views = {} if engine.null_compute else self._views(shapes)
        return _Plan(shapes=shapes, addresses=dict(self._addresses), tree=tree, views=views, phase=phase)

    def _views(self, shapes: Mapping[str, Shape]) -> dict[str, Any]:
        engine = self._engine
        make: Callable[[int, Shape, np.dtype], Any]
        if engine.device == "gpu":
            cupy = _import_cupy()
            device_id = engine._device_id

            def make(ptr: int, shape: Shape, dtype: np.dtype) -> Any:
                nbytes = int(np.prod(shape)) * dtype.itemsize
                mem = cupy.cuda.UnownedMemory(ptr, nbytes, self, device_id)
                return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))
        else:
            def make(ptr: int, shape: Shape, dtype: np.dtype) -> Any:
                nbytes = int(np.prod(shape)) * dtype.itemsize
                return host_view(ptr, nbytes).view(dtype).reshape(shape)

        views = {}
        unread = _RAGGED_UNREAD if engine._geo.is_ragged else frozenset()
        for decl in engine._decls:
            if decl.alias is not None or decl.name in unread:
                continue  # a present_* output is its cache input's memory; shape-only inputs have no data
            # bf16 and fp8 are computed on as their bits (CuPy has neither dtype)
            raw_bits: dict[DType, np.dtype] = {DType.BFLOAT16: np.dtype("uint16"), DType.FP8: np.dtype("uint8")}
            dtype = raw_bits.get(decl.dtype, decl.dtype.storage_numpy)
            views[decl.name] = make(self._addresses[decl.name], shapes[decl.name], dtype)
        return views

    # -- execution -------------------------------------------------------------------------------------
    def execute_async_v3(self, stream_handle: int) -> bool:
        """Enqueue one step on ``stream_handle``; False (with the reasons logged) if the bindings are incomplete.

        Validation runs only after a ``set_*`` call changed something, so a steady-state execute
        costs a lookup and a launch. The work reads and writes the bound memory in stream order:
        on the host device it runs when the host backend runs the stream's work (now, or at each
        replay of a captured graph); on the GPU it is CuPy kernels on the stream.
        """
        self.calls["execute_async_v3"] += 1
        plan = self._plan
        if plan is None:
            plan = self._plan = self._validate()
            if plan is None:
                return False
        engine = self._engine
        if engine.null_compute:
            return True
        stream = int(stream_handle)
        if engine.device == "gpu":
            self._execute_gpu(plan, stream)
        else:
            if self._host_backend is None:
                from trtio.cuda.backend import get_backend  # noqa: PLC0415

                self._host_backend = get_backend("host")
            self._host_backend.launch_host_func(stream, lambda: self._compute_host(plan))
        return True

    def _compute_host(self, plan: _Plan) -> None:
        engine = self._engine
        assert engine._host_weights is not None
        try:
            # An engine does not warn about NaN or inf in what it is given; it computes on.
            with np.errstate(all="ignore"):
                if engine._geo.is_ragged:
                    _forward_ragged(np, np.matmul, _scatter_rows_host, engine._geo, engine._host_weights, plan.views,
                                    plan.phase, _NoScratch())
                else:
                    _forward(np, np.matmul, engine._geo, engine._host_weights, plan.views, plan.tree, _NoScratch())
        except _DataError as exc:
            raise ValueError(f"{self.name}: execute_async_v3: {exc}") from None

    def _execute_gpu(self, plan: _Plan, stream_handle: int) -> None:
        cupy = _import_cupy()
        engine = self._engine
        scratch = self._scratch
        assert scratch is not None and engine._gpu_weights is not None and engine._gpu_matmul is not None
        ext = self._streams.get(stream_handle)
        if ext is None:
            ext = self._streams[stream_handle] = _cupy_stream(cupy, stream_handle, engine._device_id)
        scratch.reset()
        with cupy.cuda.Device(engine._device_id), ext, cupy.cuda.using_allocator(scratch):
            if engine._geo.is_ragged:
                assert engine._gpu_scatter is not None
                _forward_ragged(cupy, engine._gpu_matmul, engine._gpu_scatter, engine._geo, engine._gpu_weights,
                                plan.views, plan.phase, scratch)
            else:
                _forward(cupy, engine._gpu_matmul, engine._geo, engine._gpu_weights, plan.views, plan.tree, scratch)
