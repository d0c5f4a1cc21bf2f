"""A ReferenceEngine for the vision encoders of Edge-LLM 0.11's Qwen2.5-VL and Qwen3-VL directories.

:class:`ReferenceVisualEngine` declares exactly the I/O of a real ``visual/visual.engine`` of the config's kind
(:func:`trtio.components.visual.vit.vit_registry`: names, dtypes, shapes and the builder's one optimization profile)
and, like
:class:`~trtio.testing.ReferenceEngine`, computes on the raw addresses it is given: numpy on the host device
(one closure enqueued through the host backend, recorded while a stream is captured), CuPy on the GPU (every
temporary from the context memory, so an execute can be captured into a CUDA graph). trtio binds it exactly
as a TensorRT engine.

The computation is a small ViT of seeded weights (:class:`VitWeights`) in which every input counts, so a
wrong binding or value shows in the output (``docs/toy-model.md``, "The toy vision encoder"):

1. ``x = input @ w_patch``; Qwen3-VL adds ``sum_k fast_pos_embed_weight[k] * pos_table[fast_pos_embed_idx[k]]``;
2. Qwen2.5-VL reorders ``x`` and ``rotary_pos_emb`` merge group by merge group in ``window_index`` order;
3. ``depth`` blocks: multi-head attention with rotate-half RoPE of ``[cos(rot), cos(rot) | sin(rot), sin(rot)]``
   within the ``cu_seqlens`` segments (Qwen2.5-VL: ``cu_window_seqlens`` except in
   ``fullatt_block_indexes``), a key seen only at offsets below ``max_seqlen_carrier``'s extent in its
   segment, then a ReLU MLP; Qwen3-VL merges the stream after each block of ``deepstack_visual_indexes``
   into ``deepstack_features_i``;
4. ``output`` = each ``merge_size ** 2`` rows concatenated, times ``w_merge`` (Qwen2.5-VL: back in
   ``reverse_window_index`` order).

Data an engine cannot use (segments that do not tile the patches, a segment longer than the carrier, a window
index that is not a permutation, a reverse index that does not undo it, a position index outside the table)
raises :class:`~trtio.InvalidValueError` on the host device from the enqueued work; on the GPU indices are
clipped (a check would synchronise the host).
"""

from __future__ import annotations

import abc
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._dtypes import DType
from trtio.components.visual.visual_config import VisualConfig
from trtio.components.visual.vit import (
    FAST_POS_CORNERS,
    deepstack_features,
    kCuSeqlens,
    kCuWindowSeqlens,
    kFastPosEmbIdx,
    kFastPosEmbWeight,
    kMaxSeqLenCarrier,
    kReverseWindowIndex,
    kRotaryPosEmb,
    kVisualInput,
    kVisualOutput,
    kWindowIndex,
    vit_registry,
    vit_step,
)
from trtio.errors import ConfigError, InvalidValueError
from trtio.testing.reference_engine import (
    ReferenceEngine,
    ReferenceExecutionContext,
    _Plan,
)
from trtio.testing.reference_gpu import (
    ADDRESS_ALIGNMENT,
    _align,
    _GpuMatmul,
    _import_cupy,
    compute_device,
    gpu_scope,
)
from trtio.testing.reference_io import ExecutionContextAllocationStrategy, TensorIOMode, _Decl, _index
from trtio.testing.reference_math import _attend, _DataError, _load, _rope, _store

__all__ = ["ReferenceVisualEngine", "VitWeights", "reference_vit"]

VIT_ATTN_SCALE = 0.5
VIT_MLP_SCALE = 0.5
_DEFAULT_DEPTH = 2


def vit_depth(cfg: VisualConfig) -> int:
    """The toy ViT's blocks: the config's ``vision_config.depth`` (2 where it has none)."""
    depth = cfg.extras.get("vision_config.depth", _DEFAULT_DEPTH)
    if not isinstance(depth, int) or depth < 1:
        raise ConfigError("vision_config.depth", f"expected an integer >= 1, got {depth!r}")
    deepest = max(cfg.deepstack_visual_indexes, default=-1)
    if deepest >= depth:
        raise ConfigError("vision_config.deepstack_visual_indexes",
                          f"names block {deepest}, but the ViT has {depth} (vision_config.depth)")
    return depth


def full_attention_blocks(cfg: VisualConfig) -> frozenset[int]:
    """The blocks that attend over whole frames: every block of a Qwen3-VL ViT; Qwen2.5-VL's
    ``fullatt_block_indexes`` (the others attend within windows)."""
    depth = vit_depth(cfg)
    if not cfg.has_windows:
        return frozenset(range(depth))
    found = cfg.extras.get("vision_config.fullatt_block_indexes", [depth - 1])
    if not isinstance(found, (list, tuple)) or not all(isinstance(i, int) and 0 <= i < depth for i in found):
        raise ConfigError("vision_config.fullatt_block_indexes", f"expected block indexes below {depth}, got {found!r}")
    return frozenset(found)


def _draw(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)


@dataclass(frozen=True, eq=False)
class VitWeights:
    """Seeded parameters of the toy ViT (float32, used as ``x @ w``)."""

    w_patch: np.ndarray  # [patch_dim, hidden]
    pos_table: np.ndarray | None  # Qwen3-VL: [num_position_embeddings, hidden]
    wq: tuple[np.ndarray, ...]
    wk: tuple[np.ndarray, ...]
    wv: tuple[np.ndarray, ...]
    wo: tuple[np.ndarray, ...]
    w1: tuple[np.ndarray, ...]
    w2: tuple[np.ndarray, ...]
    w_merge: np.ndarray  # [merge_size**2 * hidden, out_hidden]
    w_deepstack: tuple[np.ndarray, ...]  # one merger per deepstack feature

    @classmethod
    def generate(cls, cfg: VisualConfig, seed: int = 0) -> VitWeights:
        """``numpy.random.default_rng(seed)``: ``w_patch``, (Qwen3-VL) ``pos_table``, then per block ``wq, wk, wv,
        wo, w1, w2``, then ``w_merge`` and the deepstack mergers."""
        if not isinstance(cfg, VisualConfig):  # another encoder kind (InternVL's tiles): no toy model of it
            raise ConfigError("cfg", f"the toy ViT is a Qwen ViT's (a VisualConfig); there is none of a "
                                     f"{type(cfg).__name__} (its directory needs its engine files)")
        rng = np.random.default_rng(seed)
        h, p, unit = cfg.hidden_size, cfg.patch_dim, cfg.merge_unit
        w_patch = _draw(rng, (p, h), 1.0 / math.sqrt(p))
        pos = _draw(rng, (cfg.num_position_embeddings, h), 1.0) if not cfg.has_windows else None
        blocks: dict[str, list[np.ndarray]] = {k: [] for k in ("wq", "wk", "wv", "wo", "w1", "w2")}
        for _ in range(vit_depth(cfg)):
            blocks["wq"].append(_draw(rng, (h, h), 1.0 / math.sqrt(h)))
            blocks["wk"].append(_draw(rng, (h, h), 1.0 / math.sqrt(h)))
            blocks["wv"].append(_draw(rng, (h, h), 1.0 / math.sqrt(h)))
            blocks["wo"].append(_draw(rng, (h, h), VIT_ATTN_SCALE / math.sqrt(h)))
            blocks["w1"].append(_draw(rng, (h, 2 * h), 1.0 / math.sqrt(h)))
            blocks["w2"].append(_draw(rng, (2 * h, h), VIT_MLP_SCALE / math.sqrt(2 * h)))
        w_merge = _draw(rng, (unit * h, cfg.out_hidden_size), 1.0 / math.sqrt(unit * h))
        ds = tuple(_draw(rng, (unit * h, cfg.out_hidden_size), 1.0 / math.sqrt(unit * h))
                   for _ in range(cfg.num_deepstack))
        return cls(w_patch, pos, tuple(blocks["wq"]), tuple(blocks["wk"]), tuple(blocks["wv"]), tuple(blocks["wo"]),
                   tuple(blocks["w1"]), tuple(blocks["w2"]), w_merge, ds)

    def on(self, to: Any) -> VitWeights:
        """The same weights as arrays of another module (``cupy.asarray``)."""
        def each(arrays: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
            return tuple(to(a) for a in arrays)

        return VitWeights(to(self.w_patch), None if self.pos_table is None else to(self.pos_table), each(self.wq),
                          each(self.wk), each(self.wv), each(self.wo), each(self.w1), each(self.w2),
                          to(self.w_merge), each(self.w_deepstack))


@dataclass(frozen=True)
class _AttnShape:
    """The attention's heads and head size, as :func:`trtio.testing.reference_math._attend` reads them."""

    hq: int
    hkv: int
    d: int


def _segments(xp: Any, cu: Any, n: int) -> tuple[Any, Any]:
    """Each row's segment (int64 ``[n]``) and that segment's first row, from ``cu`` (int32 ``[segments + 1]``)."""
    rows = xp.arange(n, dtype=xp.int64)
    bounds = cu.astype(xp.int64)
    seg = xp.searchsorted(bounds[1:], rows, side="right")
    seg = xp.minimum(seg, bounds.shape[0] - 2)
    return seg, bounds[seg]


def _check_segments(what: str, cu: np.ndarray, n: int, carrier: int) -> None:
    if cu.shape[0] < 2 or int(cu[0]) != 0 or int(cu[-1]) != n or (np.diff(cu) <= 0).any():
        raise _DataError(f"{what} = {cu.tolist()} must rise from 0 to the {n} rows, each segment non-empty")
    longest = int(np.diff(cu).max())
    if carrier and longest > carrier:
        raise _DataError(f"{what}: a segment of {longest} rows, longer than max_seqlen_carrier's extent {carrier} "
                         f"(the attention's launch bound)")


def _vit_forward(xp: Any, mm: Any, cfg: VisualConfig, w: VitWeights, io: Mapping[str, Any], carrier: int, *,
                 checked: bool) -> tuple[Any, list[Any]]:
    """The toy ViT (module docstring) over the bound views ``io``: float32 ``(output, [deepstack...])``."""
    x = _load(xp, io[kVisualInput], DType.FLOAT16)
    n = x.shape[0]
    unit, hidden = cfg.merge_unit, cfg.hidden_size
    tokens = n // unit
    h = mm(x, w.w_patch)
    cu = io[kCuSeqlens]
    if checked:
        _check_segments("cu_seqlens", np.asarray(cu), n, carrier)
    if not cfg.has_windows:
        assert w.pos_table is not None
        idx = io[kFastPosEmbIdx]
        table_rows = w.pos_table.shape[0]
        if checked:
            bad = np.argwhere((idx < 0) | (idx >= table_rows))
            if bad.size:
                where = tuple(int(i) for i in bad[0])
                raise _DataError(f"fast_pos_embed_idx{list(where)} = {int(idx[where])} is outside the "
                                 f"{table_rows}-row position table")
        idx = xp.clip(idx, 0, table_rows - 1)
        weight = _load(xp, io[kFastPosEmbWeight], DType.FLOAT16)
        for k in range(FAST_POS_CORNERS):
            h = h + weight[k][:, None] * w.pos_table[idx[k]]
    rot = io[kRotaryPosEmb].astype(xp.float32)
    if cfg.has_windows:
        order = io[kWindowIndex]
        if checked:
            got = np.sort(np.asarray(order))
            if not np.array_equal(got, np.arange(tokens)):
                raise _DataError(f"window_index must be a permutation of the {tokens} merged tokens")
            back = np.asarray(io[kReverseWindowIndex])
            if not np.array_equal(np.asarray(order)[back], np.arange(tokens)):
                raise _DataError("reverse_window_index must undo window_index")
            _check_segments("cu_window_seqlens", np.asarray(io[kCuWindowSeqlens]), n, 0)
        order = xp.clip(order, 0, tokens - 1)
        h = h.reshape(tokens, unit, hidden)[order].reshape(n, hidden)
        rot = rot.reshape(tokens, unit, rot.shape[1])[order].reshape(n, rot.shape[1])
    heads = cfg.num_heads
    d = hidden // heads
    # Hugging Face's q * cos(cat(rot, rot)) + rotate_half(q) * sin(cat(rot, rot)): rotate-half RoPE of the whole
    # head with the rows [cos(rot) | sin(rot)]
    rope = _rope(xp, xp.concatenate([xp.cos(rot), xp.sin(rot)], axis=1)[None], d)
    shape: Any = _AttnShape(heads, heads, d)  # the fields _attend reads of a geometry
    full_seg, full_start = _segments(xp, cu, n)
    offsets = xp.arange(n, dtype=xp.int64) - full_start
    full = (full_seg[:, None] == full_seg[None, :]) & (offsets < carrier)[None, :]
    windowed = full
    if cfg.has_windows:
        win_seg, _ = _segments(xp, io[kCuWindowSeqlens], n)
        windowed = win_seg[:, None] == win_seg[None, :]
    full_blocks = full_attention_blocks(cfg)
    ds_at = {layer: i for i, layer in enumerate(cfg.deepstack_visual_indexes)}
    deepstack: list[Any] = [None] * cfg.num_deepstack
    for b in range(len(w.wq)):
        visible = (full if b in full_blocks else windowed)[None]
        q = rope(mm(h, w.wq[b]).reshape(1, n, heads, d))
        k = rope(mm(h, w.wk[b]).reshape(1, n, heads, d))
        v = mm(h, w.wv[b]).reshape(1, n, heads, d)
        attn = _attend(xp, mm, shape, q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), visible)
        h = h + mm(attn.reshape(n, hidden), w.wo[b])
        h = h + mm(xp.maximum(mm(h, w.w1[b]), 0.0), w.w2[b])
        if b in ds_at:
            deepstack[ds_at[b]] = mm(h.reshape(tokens, unit * hidden), w.w_deepstack[ds_at[b]])
    out = mm(h.reshape(tokens, unit * hidden), w.w_merge)
    if cfg.has_windows:
        back = xp.clip(io[kReverseWindowIndex], 0, tokens - 1)
        out = out[back]
    return out, deepstack


def reference_vit(cfg: VisualConfig, weights: VitWeights, patches: Any, grid_thw: Any) -> tuple[np.ndarray,
                                                                                                list[np.ndarray]]:
    """The toy ViT's float32 ``(output, [deepstack...])`` for host ``patches`` (rounded to float16 as the engine
    takes them) and ``grid_thw``, its other inputs from :func:`trtio.components.visual.vit.vit_step`: the ground truth
    of tests."""
    step = vit_step(cfg, grid_thw)
    io: dict[str, Any] = dict(step.values)
    io[kVisualInput] = np.asarray(patches).astype(np.float16)
    with np.errstate(all="ignore"):
        out, ds = _vit_forward(np, np.matmul, cfg, weights, io, step.dims.vit_max_seqlen, checked=True)
    return out.astype(np.float32), [d.astype(np.float32) for d in ds]


def _scratch_bound(cfg: VisualConfig) -> int:
    """GPU scratch bytes of the largest execute (generous copy counts of each temporary), plus a 1 MiB margin."""
    n, t = cfg.max_patches, cfg.max_image_tokens
    f4, i8 = 4, 8
    h, d = cfg.hidden_size, cfg.hidden_size // cfg.num_heads
    persistent = 4 * n * cfg.patch_dim * f4 + 40 * n * h * f4 + 16 * n * 2 * d * f4 + 12 * n * n * i8 + 16 * n * i8
    per_block = 16 * n * h * f4 + 12 * cfg.num_heads * n * n * f4 + 8 * n * n + 6 * n * 2 * h * f4
    outputs = (6 + 3 * cfg.num_deepstack) * t * cfg.out_hidden_size * f4 + 4 * FAST_POS_CORNERS * n * h * f4
    return _align(persistent + vit_depth(cfg) * per_block + outputs + 512 * ADDRESS_ALIGNMENT + (1 << 20))


@dataclass(frozen=True)
class _VitGeometry:
    """What :class:`ReferenceExecutionContext`'s shared checks read of an engine's geometry: a ViT is neither a
    ragged nor a speculative engine."""

    is_ragged: bool = False
    is_spec: bool = False
    role: str = "visual"
    contract: str = "visual"
    types: tuple[str, ...] = ()  # no recurrent layer


class EncoderReferenceEngine(ReferenceEngine):
    """What the encoder doubles share (a ViT's, Phi-4-MM's): the ``visual`` contract and one optimization profile,
    as Edge-LLM's encoder engines have; a subclass makes its own context (:meth:`_context`)."""

    @property
    def contract(self) -> str:
        return "visual"

    @property
    def num_optimization_profiles(self) -> int:
        return 1

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
        if _index(profile_index, 1) is None and name in self._by_name and self._by_name[name].is_input:
            raise InvalidValueError(f"{self._name}: get_tensor_profile_shape: profile index {profile_index!r} is out "
                                    f"of range [0, 1)")
        return super().get_tensor_profile_shape(name, profile_index)

    def get_device_memory_size_for_profile_v2(self, profile_index: int) -> int:
        return self._profile_memory[0] if _index(profile_index, 1) is not None else 0

    def create_execution_context(
        self, strategy: ExecutionContextAllocationStrategy | int = ExecutionContextAllocationStrategy.STATIC,
    ) -> ReferenceExecutionContext:
        try:
            strategy = ExecutionContextAllocationStrategy(int(strategy))
        except (TypeError, ValueError):
            raise InvalidValueError(f"{self._name}: create_execution_context: unknown allocation strategy "
                                    f"{strategy!r}") from None
        return self._context(strategy, f"{self._name}.context{next(self._context_ids)}")

    @abc.abstractmethod
    def _context(self, strategy: ExecutionContextAllocationStrategy, name: str) -> ReferenceExecutionContext:
        """A new execution context of this engine (its own kind)."""


class ReferenceVisualEngine(EncoderReferenceEngine):
    """A toy ViT with TensorRT's ``ICudaEngine`` API (module docstring); build it with :meth:`from_config`.
    One optimization profile, as Edge-LLM's visual engines have."""

    def __init__(self, cfg: VisualConfig, weights: VitWeights, *, device: str, null_compute: bool, name: str,
                 seed: int) -> None:
        self._cfg = cfg
        self._geo = _VitGeometry()  # type: ignore[assignment]  # the context's shared checks read two flags
        self._backend = None  # launches on the shared backend of its device (trtio_backend)
        self._vit_weights = weights
        self._device = device
        self._null_compute = bool(null_compute)
        self._name = name
        self._seed = seed
        self._tp = (0, 1)
        self._all_reduce = None
        self._weight_inputs = ()
        registry = vit_registry(cfg)
        self._decls = [_Decl(i, s.name, TensorIOMode.INPUT if s.is_input else TensorIOMode.OUTPUT, s.dtype,
                             s.engine_shape, s.profiles if s.is_input else ()) for i, s in enumerate(registry)]
        self._by_name = {decl.name: decl for decl in self._decls}
        self._host_weights = None
        self._gpu_weights = None
        self._gpu_matmul = None
        self._gpu_scatter = None
        self._device_id = -1
        self._gpu_vit: VitWeights | None = None
        self._context_ids = itertools.count()
        if device == "gpu" and not null_compute:
            cupy = _import_cupy()
            self._device_id = int(cupy.cuda.runtime.getDevice())
            self._gpu_vit = weights.on(cupy.asarray)
            self._gpu_matmul = _GpuMatmul(cupy)
        self._profile_memory = (512 if null_compute else _scratch_bound(cfg),)

    @classmethod
    def from_config(cls, cfg: Any, *, seed: int = 0, device: str = "auto", weights: Any = None,
                    null_compute: bool = False, name: str | None = None, backend: Any = None,
                    **unused: Any) -> ReferenceVisualEngine:
        """A toy ViT engine of ``cfg`` (a :class:`~trtio.components.visual.visual_config.VisualConfig`): ``device``
        ``"host"``
        (numpy), ``"gpu"`` (CuPy) or ``"auto"``; ``weights`` default to ``VitWeights.generate(cfg, seed)``;
        ``null_compute=True`` keeps the I/O and its checks and computes nothing. ``backend``: a host-kind
        Backend instance (an :class:`~trtio.testing.AsyncHostBackend`) the engine launches its work on."""
        if not isinstance(cfg, VisualConfig):
            raise ConfigError("cfg", f"ReferenceVisualEngine takes a VisualConfig, got {type(cfg).__name__}")
        if unused:
            raise InvalidValueError(f"ReferenceVisualEngine.from_config: {sorted(unused)} are for LLM engines")
        if device not in ("auto", "host", "gpu"):
            raise InvalidValueError(f"ReferenceVisualEngine: device must be 'auto', 'host' or 'gpu', got {device!r}")
        device = compute_device(device, null_compute, "ReferenceVisualEngine")
        if backend is not None:
            if isinstance(backend, str) or backend.name == "cuda":
                raise InvalidValueError("ReferenceVisualEngine: backend= takes a host-kind Backend instance; use "
                                        "device='gpu' for the cuda backend")
            device = "host"
        if weights is None:
            weights = VitWeights.generate(cfg, seed)
        engine = cls(cfg, weights, device=device, null_compute=null_compute, name=name or f"toy-{cfg.model_type}-vit",
                     seed=seed)
        engine._backend = backend
        return engine

    @property
    def weights(self) -> Any:
        return self._vit_weights

    def _context(self, strategy: ExecutionContextAllocationStrategy, name: str) -> ReferenceVisualContext:
        return ReferenceVisualContext(self, strategy, name)


    def __repr__(self) -> str:
        return (f"ReferenceVisualEngine(name={self._name!r}, kind={self._cfg.model_type!r}, device={self._device!r}, "
                f"io_tensors={len(self._decls)}, null_compute={self._null_compute})")


class ReferenceVisualContext(ReferenceExecutionContext):
    """The ``IExecutionContext`` of a :class:`ReferenceVisualEngine`: the parent's profile, shape, address and
    memory handling, with the ViT's output shapes, shape rules and computation."""

    _engine: ReferenceVisualEngine

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        decl = self._engine._by_name.get(name)
        if decl is None or decl.is_input:
            return super().get_tensor_shape(name)
        rows = self._shapes.get(kVisualInput)
        cfg = self._engine._cfg
        return (-1, cfg.out_hidden_size) if rows is None else (rows[0] // cfg.merge_unit, cfg.out_hidden_size)

    def _shape_problems(self) -> list[str]:
        cfg = self._engine._cfg
        s = self._set_shapes()
        n = s[kVisualInput][0]
        problems = []
        if n % cfg.merge_unit:
            problems.append(f"input has {n} rows, not whole merge groups of {cfg.merge_unit}")
        if s[kRotaryPosEmb][0] != n:
            problems.append(f"rotary_pos_emb has {s[kRotaryPosEmb][0]} rows, input {n}")
        if cfg.has_windows:
            for name in (kWindowIndex, kReverseWindowIndex):
                if s[name][0] != n // cfg.merge_unit:
                    problems.append(f"{name} has {s[name][0]} entries, input holds {n // cfg.merge_unit} merged tokens")
        else:
            for name in (kFastPosEmbIdx, kFastPosEmbWeight):
                if s[name][1] != n:
                    problems.append(f"{name} has {s[name][1]} columns, input {n} rows")
        return problems

    def _compute_host(self, plan: _Plan, stream: int) -> None:
        engine = self._engine
        try:
            with np.errstate(all="ignore"):
                out, ds = _vit_forward(np, np.matmul, engine._cfg, engine._vit_weights, plan.views,
                                       plan.shapes[kMaxSeqLenCarrier][0], checked=True)
        except _DataError as exc:
            raise InvalidValueError(f"{self.name}: execute_async_v3: {exc}") from None
        _write_outputs(np, plan.views, out, ds)

    def _execute_gpu(self, plan: _Plan, stream_handle: int) -> None:
        engine = self._engine
        scratch = self._scratch
        assert scratch is not None and engine._gpu_vit is not None and engine._gpu_matmul is not None
        with gpu_scope(self._streams, stream_handle, engine._device_id, scratch) as cupy:
            out, ds = _vit_forward(cupy, engine._gpu_matmul, engine._cfg, engine._gpu_vit, plan.views,
                                   plan.shapes[kMaxSeqLenCarrier][0], checked=False)
            _write_outputs(cupy, plan.views, out, ds)


def _write_outputs(xp: Any, views: Mapping[str, Any], out: Any, deepstack: list[Any]) -> None:
    views[kVisualOutput][...] = _store(xp, out, DType.FLOAT16)
    for i, feature in enumerate(deepstack):
        views[deepstack_features(i)][...] = _store(xp, feature, DType.FLOAT16)

