"""The toy model as a real TensorRT / TensorRT-RTX network: build it, serialize it, read its contract.

The model and its I/O contract are ``docs/toy-model.md``; the weights are
:class:`~trtio.testing.toy_model.ToyWeights`, so a plan built here, the numpy reference and the
:class:`~trtio.testing.ReferenceEngine` compute the same function. The network uses TensorRT's own
transformer layers: ``KVCacheUpdate`` (LINEAR) for the caches, ``RotaryEmbedding`` and
``Attention`` with an explicit boolean mask built inside the network from ``kvcache_start_index``,
``context_lengths``, the step length and, for spec-decode engines, the packed ``attention_mask``
bits and ``attention_pos_id``.

TensorRT-RTX builds these plans on a CPU-only machine (ahead of time); running them needs a GPU.
The TensorRT module is always a parameter (a module object, or ``"tensorrt"`` /
``"tensorrt_rtx"`` resolved by :func:`trtio._trt.import_trt`), never imported at module import and
never patched into ``sys.modules``. Configs are duck-typed: an :class:`~trtio.LLMEngineConfig` or
any object with its fields.

:func:`network_engine_io` turns a built network's declared I/O into the form of
:meth:`trtio._engine.EngineIO.to_dict`, and :func:`contract_diff` lists every difference between two such
forms: that is how CI checks, without a GPU, that a plan will offer trtio exactly the bindings the
:class:`~trtio.testing.ReferenceEngine` does.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from trtio import names
from trtio._dtypes import DType
from trtio._trt import KNOWN_MODULES, import_trt, trt_logger
from trtio.errors import ConfigError, EngineError
from trtio.testing.toy_model import ToyWeights, config_role

__all__ = [
    "BuiltPlan",
    "MODULE_NAMES",
    "build_network",
    "build_plan",
    "contract_diff",
    "network_contract",
    "network_engine_io",
    "profile_shapes",
    "resolve_module",
    "step_capacity",
]

_log = logging.getLogger("trtio.toy_build")

MODULE_NAMES = KNOWN_MODULES

# -- contract shapes --------------------------------------------------------------------------

Shape = tuple[int, ...]
ProfileShapes = tuple[Shape, Shape, Shape]


def _half(x: int) -> int:
    return max(1, x // 2)


def step_capacity(cfg: Any) -> int:
    """``P1``: the longest step of profile 1 (1 for a plain LLM, else the tree size of the role)."""
    role = config_role(cfg)
    if role == "base":
        return int(cfg.max_verify_tree_size)
    if role == "draft":
        return int(cfg.max_draft_tree_size)
    return 1


def profile_shapes(cfg: Any) -> dict[str, list[ProfileShapes]]:
    """Every dynamic input's ``[(min, opt, max) for profile 0, (min, opt, max) for profile 1]``.

    This is the table of ``docs/toy-model.md``; profile 0 is prefill, profile 1 everything else.
    """
    role = config_role(cfg)
    h = int(cfg.hidden_size)
    bmax = int(cfg.max_supported_batch_size)
    smax = int(cfg.max_supported_input_length)
    cap = int(cfg.max_kv_cache_capacity)
    hkv, d, r = int(cfg.num_kv_heads), int(cfg.head_dim), int(cfg.rotary_dim)
    p1 = step_capacity(cfg)

    def seq(width: int) -> list[ProfileShapes]:
        return [
            ((1, 1, width), (bmax, _half(smax), width), (bmax, smax, width)),
            ((1, 1, width), (bmax, _half(p1), width), (bmax, p1, width)),
        ]

    def batch(*rest: int) -> list[ProfileShapes]:
        one = ((1, *rest), (bmax, *rest), (bmax, *rest))
        return [one, one]

    shapes: dict[str, list[ProfileShapes]] = {names.kInputsEmbeds: seq(h)}
    if role == "draft":
        shapes[names.kBaseModelHiddenStates] = seq(int(cfg.base_model_hidden_size))
        shapes[names.kDraftModelHiddenStates] = seq(h)
    shapes[names.kContextLengths] = batch()
    shapes[names.kLastTokenIds] = [
        ((1, 1), (bmax, 1), (bmax, 1)),
        ((1, 1), (bmax, _half(p1)), (bmax, p1)),
    ]
    shapes[names.kKVCacheStartIndex] = batch()
    if cfg.rope_type == "mrope":
        shapes[names.kRopeCosSin] = batch(cap, r)
    if role != "llm":
        shapes[names.kAttentionMask] = [
            ((1, 1, 1), (bmax, 1, 1), (bmax, 1, 1)),
            ((1, 1, 1), (bmax, _half(p1), math.ceil(_half(p1) / 32)), (bmax, p1, math.ceil(p1 / 32))),
        ]
        shapes[names.kAttentionPosId] = [
            ((1, 1), (bmax, 1), (bmax, 1)),
            ((1, 1), (bmax, _half(p1)), (bmax, p1)),
        ]
    for i in range(int(cfg.num_deepstack_features or 0)):
        shapes[names.deepstack_embeds(i)] = seq(h)
    for i in range(int(cfg.num_attention_layers)):
        shapes[names.k_cache(i)] = batch(hkv, cap, d)
        shapes[names.v_cache(i)] = batch(hkv, cap, d)
    return shapes


# -- network ----------------------------------------------------------------------------------


class _Graph:
    """Thin helpers over an ``INetworkDefinition``: every add_* is checked and every layer named."""

    def __init__(self, trt: Any, network: Any) -> None:
        self.trt = trt
        self.net = network

    def _out(self, layer: Any, name: str) -> Any:
        if layer is None:
            raise EngineError(f"TensorRT refused to add layer {name!r}")
        layer.name = name
        return layer.get_output(0)

    def const(self, array: np.ndarray, name: str) -> Any:
        arr = np.ascontiguousarray(array)
        # add_constant keeps the numpy array alive for as long as the network (pybind keep_alive).
        return self._out(self.net.add_constant(arr.shape, arr), name)

    def scalar(self, value: float | int, dtype: Any, rank: int, name: str) -> Any:
        return self.const(np.full((1,) * rank, value, dtype=dtype), name)

    def ew(self, a: Any, b: Any, op: str, name: str) -> Any:
        return self._out(self.net.add_elementwise(a, b, getattr(self.trt.ElementWiseOperation, op)), name)

    def unary(self, a: Any, op: str, name: str) -> Any:
        return self._out(self.net.add_unary(a, getattr(self.trt.UnaryOperation, op)), name)

    def cast(self, a: Any, dtype: DType, name: str) -> Any:
        if a.dtype == dtype.to_trt(self.trt):
            return a
        return self._out(self.net.add_cast(a, dtype.to_trt(self.trt)), name)

    def reshape(self, a: Any, dims: Sequence[int], name: str) -> Any:
        layer = self.net.add_shuffle(a)
        if layer is not None:
            layer.reshape_dims = tuple(dims)
        return self._out(layer, name)

    def transpose(self, a: Any, perm: Sequence[int], name: str) -> Any:
        layer = self.net.add_shuffle(a)
        if layer is not None:
            layer.first_transpose = tuple(perm)
        return self._out(layer, name)

    def unsqueeze(self, a: Any, axis: int, name: str) -> Any:
        axes = self.const(np.array([axis], dtype=np.int64), name + ".axes")
        return self._out(self.net.add_unsqueeze(a, axes), name)

    def matmul(self, a: Any, b: Any, name: str) -> Any:
        op = self.trt.MatrixOperation.NONE
        return self._out(self.net.add_matrix_multiply(a, op, b, op), name)

    def linear(self, x: Any, w: np.ndarray, name: str) -> Any:
        """``x [B, S, K] @ w [K, N]`` in float32 (``w`` broadcast over the batch)."""
        return self.matmul(x, self.const(w.astype(np.float32)[None], name + ".w"), name)

    def select(self, cond: Any, a: Any, b: Any, name: str) -> Any:
        return self._out(self.net.add_select(cond, a, b), name)

    def dim(self, a: Any, axis: int, name: str) -> Any:
        """``a.shape[axis]`` as an int64 ``[1]`` shape tensor."""
        shape = self._out(self.net.add_shape(a), name + ".shape")
        idx = self.const(np.array([axis], dtype=np.int32), name + ".idx")
        return self._out(self.net.add_gather(shape, idx, 0), name)

    def arange(self, limit: int, length: Any, name: str) -> Any:
        """int32 ``[0, 1, ..., length-1]`` for a runtime ``length`` (int64 ``[1]``) <= ``limit``."""
        full = self.const(np.arange(limit, dtype=np.int32), name + ".table")
        layer = self.net.add_slice(full, (0,), (limit,), (1,))
        if layer is not None:
            layer.set_input(2, length)
        return self._out(layer, name)

    def gather_rows(self, data: Any, indices: Any, name: str) -> Any:
        """``out[b, k, ...] = data[b, indices[b, k], ...]`` (ND gather, one elementwise dim)."""
        idx = self.reshape(indices, (0, 0, 1), name + ".idx")
        layer = self.net.add_gather_v2(data, idx, self.trt.GatherMode.ND)
        if layer is not None:
            layer.num_elementwise_dims = 1
        return self._out(layer, name)

    def input(self, name: str, dtype: DType, shape: Sequence[int]) -> Any:
        t = self.net.add_input(name, dtype.to_trt(self.trt), tuple(shape))
        if t is None:
            raise EngineError(f"TensorRT refused input {name!r} {dtype} {tuple(shape)}")
        return t

    def output(self, t: Any, name: str) -> None:
        t.name = name
        self.net.mark_output(t)


def _validate(cfg: Any, weights: ToyWeights) -> None:
    """Every reason the toy network cannot be built from ``cfg`` and ``weights``, in one
    :class:`~trtio.ConfigError` naming the first field at fault."""
    problems: list[tuple[str, str]] = []
    hq, hkv, d, r = (int(cfg.num_attention_heads), int(cfg.num_kv_heads), int(cfg.head_dim),
                     int(cfg.rotary_dim))
    if hkv <= 0 or hq % hkv:
        problems.append(("num_kv_heads", f"num_attention_heads={hq} must be a multiple of num_kv_heads={hkv}"))
    if r <= 0 or r % 2 or r > d:
        problems.append(("rotary_dim", f"rotary_dim={r} must be even and in [2, head_dim={d}]"))
    nd = int(cfg.num_deepstack_features or 0)
    if nd > int(cfg.num_attention_layers):
        problems.append(("num_deepstack_features",
                         f"num_deepstack_features={nd} exceeds num_attention_layers={cfg.num_attention_layers}"))
    if cfg.rope_type not in ("rope", "mrope"):
        problems.append(("rope_type", f"rope_type={cfg.rope_type!r} must be 'rope' or 'mrope'"))
    for field in ("activation_dtype", "kv_cache_dtype"):
        dt = DType.coerce(getattr(cfg, field))
        if dt not in (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16):
            problems.append((field, f"{field}={dt} must be float32, float16 or bfloat16"))
    if weights.num_layers != int(cfg.num_attention_layers):
        problems.append(("num_attention_layers",
                         f"weights have {weights.num_layers} layers, config {cfg.num_attention_layers}"))
    if weights.is_draft != (config_role(cfg) == "draft"):
        problems.append(("base_model_hidden_size", "weights and config disagree on whether this is an EAGLE draft"))
    if problems:
        raise ConfigError(problems[0][0], "toy engine config: " + "; ".join(text for _, text in problems))


@dataclass(frozen=True)
class _Dims:
    """The numbers of ``docs/toy-model.md`` a network is built from (read once from the config)."""

    role: str
    act: DType
    kv: DType
    h: int
    hq: int
    hkv: int
    d: int
    r: int
    cap: int
    nd: int
    layers: int
    max_step: int
    mrope: bool

    @classmethod
    def of(cls, cfg: Any) -> _Dims:
        return cls(role=config_role(cfg), act=DType.coerce(cfg.activation_dtype), kv=DType.coerce(cfg.kv_cache_dtype),
                   h=int(cfg.hidden_size), hq=int(cfg.num_attention_heads), hkv=int(cfg.num_kv_heads),
                   d=int(cfg.head_dim), r=int(cfg.rotary_dim), cap=int(cfg.max_kv_cache_capacity),
                   nd=int(cfg.num_deepstack_features or 0), layers=int(cfg.num_attention_layers),
                   max_step=max(int(cfg.max_supported_input_length), step_capacity(cfg)),
                   mrope=cfg.rope_type == "mrope")


@dataclass(frozen=True)
class _Inputs:
    """The network's input tensors (None where the role has no such input)."""

    embeds: Any
    hidden_in: Any
    hidden_draft: Any
    ctx: Any
    last_ids: Any
    start: Any
    cos_sin: Any
    mask_words: Any
    pos_ids: Any
    deepstack: list[Any]
    caches: list[tuple[Any, Any]]  # (k_cache, v_cache) per layer


@dataclass(frozen=True)
class _Attention:
    """What every layer's attention shares: which keys each query sees and how its rows are rotated."""

    visible: Any  # bool [B, 1, S, C]
    any_visible: Any  # bool [B, 1, S, 1]: rows with no visible key give zeros, not NaN
    rope: Callable[[Any, str], Any]  # RotaryEmbedding of a [B, heads, S, D] tensor
    q_scale: Any  # 1/sqrt(D): IAttention does not scale
    zero: Any  # float32 0 of rank 4


def build_network(trt: Any, cfg: Any, weights: ToyWeights) -> tuple[Any, Any, list[Any]]:
    """Define the toy model as a strongly typed network for the module ``trt``.

    ``trt`` is the ``tensorrt`` or ``tensorrt_rtx`` module object. Returns ``(builder, network,
    [profile0, profile1])``; the network's inputs and outputs follow ``docs/toy-model.md`` in
    name, dtype, shape and declaration order. Arithmetic is float32 (activations are cast on the
    way in and out) except the Attention layer itself, which runs in ``kv_cache_dtype``: Q is cast
    to it, K and V come straight from the KVCacheUpdate layers, the result is cast back to float32.
    """
    _validate(cfg, weights)
    dims = _Dims.of(cfg)
    builder, network = _create_network(trt, dims.role)
    g = _Graph(trt, network)
    inputs = _add_inputs(g, cfg, dims)
    attention = _attention(g, cfg, dims, inputs)
    x = _input_stream(g, dims, weights, inputs)
    presents = []
    for layer in range(dims.layers):
        x, present = _decoder_layer(g, dims, weights, layer, x, inputs, attention)
        presents.append(present)
    _add_outputs(g, dims, weights, x, inputs.last_ids, presents)
    return builder, network, _profiles(builder, cfg)


def _create_network(trt: Any, role: str) -> tuple[Any, Any]:
    """A builder and an empty strongly typed network named ``toy-<role>`` (checked for the layers it needs)."""
    builder = trt.Builder(trt_logger(trt))
    if builder is None:
        raise EngineError(f"{trt.__name__}.Builder could not be created")
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    if network is None:
        raise EngineError(f"{trt.__name__}: create_network failed")
    _require_layers(trt, network)
    network.name = f"toy-{role}"
    return builder, network


def _add_inputs(g: _Graph, cfg: Any, dims: _Dims) -> _Inputs:
    """Every input of the contract, in its declaration order."""
    f32, i32, i64 = DType.FLOAT32, DType.INT32, DType.INT64
    act, h = dims.act, dims.h
    embeds = g.input(names.kInputsEmbeds, act, (-1, -1, h))
    hidden_in = hidden_draft = None
    if dims.role == "draft":
        hidden_in = g.input(names.kBaseModelHiddenStates, act, (-1, -1, int(cfg.base_model_hidden_size)))
        hidden_draft = g.input(names.kDraftModelHiddenStates, act, (-1, -1, h))
    ctx = g.input(names.kContextLengths, i32, (-1,))
    last_ids = g.input(names.kLastTokenIds, i64, (-1, -1))
    start = g.input(names.kKVCacheStartIndex, i32, (-1,))
    cos_sin = g.input(names.kRopeCosSin, f32, (-1 if dims.mrope else 1, dims.cap, dims.r))
    mask_words = pos_ids = None
    if dims.role != "llm":
        mask_words = g.input(names.kAttentionMask, i32, (-1, -1, -1))
        pos_ids = g.input(names.kAttentionPosId, i32, (-1, -1))
    deepstack = [g.input(names.deepstack_embeds(i), act, (-1, -1, h)) for i in range(dims.nd)]
    cache = (-1, dims.hkv, dims.cap, dims.d)
    caches = [(g.input(names.k_cache(i), dims.kv, cache), g.input(names.v_cache(i), dims.kv, cache))
              for i in range(dims.layers)]
    return _Inputs(embeds, hidden_in, hidden_draft, ctx, last_ids, start, cos_sin, mask_words, pos_ids, deepstack,
                   caches)


def _attention(g: _Graph, cfg: Any, dims: _Dims, inputs: _Inputs) -> _Attention:
    """The visibility mask [B, 1, S, C] (True = attend), its rows that see nothing, and RoPE at each token's
    position (``start + s``, or ``attention_pos_id`` for a tree) from the cos/sin caches."""
    trt, network = g.trt, g.net
    f32 = DType.FLOAT32
    cap, r = dims.cap, dims.r
    step_len = g.dim(inputs.embeds, 1, "step_len")
    s4 = g.reshape(g.arange(dims.max_step, step_len, "steps"), (1, 1, -1, 1), "steps4")
    j4 = g.const(np.arange(cap, dtype=np.int32).reshape(1, 1, 1, cap), "slots4")
    start4 = g.reshape(inputs.start, (-1, 1, 1, 1), "start4")
    ctx4 = g.reshape(inputs.ctx, (-1, 1, 1, 1), "ctx4")
    one4 = g.scalar(1, np.int32, 4, "one4")
    causal_pos4 = g.ew(start4, s4, "SUM", "causal_pos4")  # [B, 1, S, 1]
    below_ctx = g.ew(j4, ctx4, "LESS", "below_ctx")  # [B, 1, 1, C]
    causal_vis = g.ew(
        g.ew(j4, g.ew(causal_pos4, one4, "SUM", "causal_pos4_1"), "LESS", "causal_le"),
        below_ctx, "AND", "causal_vis",
    )
    causal_pos = g.reshape(causal_pos4, (0, -1), "causal_pos")  # [B, S]
    if dims.role == "llm":
        visible, positions = causal_vis, causal_pos
    else:
        visible, positions = _tree_or_causal(g, cfg, inputs.mask_words, inputs.pos_ids, j4, start4, below_ctx,
                                             causal_vis, causal_pos)
    any_visible = g.ew(
        g._out(network.add_reduce(g.cast(visible, f32, "visible_f"), trt.ReduceOperation.MAX, 1 << 3, True),
               "visible_rowmax"),
        g.scalar(0.5, np.float32, 4, "half4"), "GREATER", "any_visible",
    )

    # cos/sin caches for the RotaryEmbedding layer.
    if dims.mrope:
        rows = g.gather_rows(inputs.cos_sin, positions, "rope_rows")  # [B, S, R], per-sequence tables
        cos = g._out(network.add_gather(rows, g.const(np.arange(r // 2, dtype=np.int32), "cos_idx"), 2), "rope_cos")
        sin = g._out(network.add_gather(rows, g.const(np.arange(r // 2, r, dtype=np.int32), "sin_idx"), 2), "rope_sin")
        rope_positions = None
    else:
        table = g.reshape(inputs.cos_sin, (cap, r), "rope_table")
        cos = g._out(network.add_slice(table, (0, 0), (cap, r // 2), (1, 1)), "rope_cos")
        sin = g._out(network.add_slice(table, (0, r // 2), (cap, r // 2), (1, 1)), "rope_sin")
        rope_positions = g.cast(positions, DType.INT64, "positions64")  # rank-2 caches are indexed by position

    def rope(t: Any, name: str) -> Any:
        layer = network.add_rotary_embedding(t, cos, sin, False, r)
        if layer is not None and rope_positions is not None:
            layer.set_input(3, rope_positions)
        return g._out(layer, name)

    return _Attention(visible, any_visible, rope, g.scalar(1.0 / math.sqrt(dims.d), np.float32, 4, "q_scale"),
                      g.scalar(0.0, np.float32, 4, "zero4"))


def _input_stream(g: _Graph, dims: _Dims, weights: ToyWeights, inputs: _Inputs) -> Any:
    """The residual stream entering layer 0, float32 [B, S, H]: the embeddings, or a draft's projections
    ``inputs_embeds @ we + hidden_states_input @ wh + hidden_states_from_draft @ wd``."""
    f32 = DType.FLOAT32
    if dims.role != "draft":
        return g.cast(inputs.embeds, f32, "x0")
    assert weights.we is not None and weights.wh is not None and weights.wd is not None
    return g.ew(
        g.ew(g.linear(g.cast(inputs.embeds, f32, "embeds_f"), weights.we, "fc_embeds"),
             g.linear(g.cast(inputs.hidden_in, f32, "hidden_in_f"), weights.wh, "fc_hidden_in"), "SUM", "x_eh"),
        g.linear(g.cast(inputs.hidden_draft, f32, "hidden_draft_f"), weights.wd, "fc_hidden_draft"), "SUM", "x0",
    )


def _decoder_layer(g: _Graph, dims: _Dims, weights: ToyWeights, layer: int, x: Any, inputs: _Inputs,
                   attention: _Attention) -> tuple[Any, tuple[Any, Any]]:
    """One layer on the stream ``x``: attention through the KVCacheUpdate'd caches, the MLP, the layer's
    deepstack feature. Returns the new stream and the layer's (present_k, present_v)."""
    trt, network = g.trt, g.net
    f32, kv, d = DType.FLOAT32, dims.kv, dims.d
    p = f"l{layer}."

    def heads(t: Any, n: int, name: str) -> Any:  # [B, S, n*D] -> [B, n, S, D]
        t = g.reshape(t, (0, 0, n, d), name + ".split")
        return g.transpose(t, (0, 2, 1, 3), name)

    q = heads(g.linear(x, weights.wq[layer], p + "q_proj"), dims.hq, p + "q")
    k = heads(g.linear(x, weights.wk[layer], p + "k_proj"), dims.hkv, p + "k")
    v = heads(g.linear(x, weights.wv[layer], p + "v_proj"), dims.hkv, p + "v")
    q = g.ew(attention.rope(q, p + "q_rope"), attention.q_scale, "PROD", p + "q_scaled")
    k = attention.rope(k, p + "k_rope")

    k_cache, v_cache = inputs.caches[layer]
    mode = trt.KVCacheMode.LINEAR
    present_k = g._out(network.add_kv_cache_update(k_cache, g.cast(k, kv, p + "k_kv"), inputs.start, mode),
                       p + "k_cache_update")
    present_v = g._out(network.add_kv_cache_update(v_cache, g.cast(v, kv, p + "v_kv"), inputs.start, mode),
                       p + "v_cache_update")

    # Attention runs in the cache's dtype: K and V must be the KVCacheUpdate outputs as they
    # are (TensorRT-RTX 1.7's Myelin fails "Fusing attention ops must leave the graph in a
    # well-formed state" when they are cast to float32 first), and Q must share their type.
    q_kv = g.cast(q, kv, p + "q_kv")
    softmax = trt.AttentionNormalizationOp.SOFTMAX
    if hasattr(network, "add_attention_v2"):
        attn = network.add_attention_v2(q_kv, present_k, present_v, softmax, trt.CausalMaskKind.NONE)
    else:  # older TensorRT releases only have the first version
        attn = network.add_attention(q_kv, present_k, present_v, softmax, False)
    if attn is None:
        raise EngineError(f"TensorRT refused the attention of layer {layer}")
    attn.mask = attention.visible
    attn.decomposable = True
    attn.name = p + "attention"
    a = g.select(attention.any_visible, g.cast(attn.get_output(0), f32, p + "attn_f"), attention.zero,
                 p + "attn_guarded")
    a = g.reshape(g.transpose(a, (0, 2, 1, 3), p + "attn_bshd"), (0, 0, dims.hq * d), p + "attn_flat")
    x = g.ew(x, g.linear(a, weights.wo[layer], p + "o_proj"), "SUM", p + "x_attn")

    up = g._out(network.add_activation(g.linear(x, weights.w1[layer], p + "up"), trt.ActivationType.RELU),
                p + "relu")
    x = g.ew(x, g.linear(up, weights.w2[layer], p + "down"), "SUM", p + "x_mlp")
    if layer < dims.nd:
        x = g.ew(x, g.cast(inputs.deepstack[layer], f32, p + "deepstack_f"), "SUM", p + "x_deepstack")
    return x, (present_k, present_v)


def _add_outputs(g: _Graph, dims: _Dims, weights: ToyWeights, x: Any, last_ids: Any,
                 presents: list[tuple[Any, Any]]) -> None:
    """The outputs in the contract's declaration order: logits of the ``last_token_ids`` rows, the final
    stream, and each layer's present caches."""
    selected = g.reshape(g.gather_rows(x, last_ids, "selected_rows"), (-1, dims.h), "selected_flat")
    g.output(g.matmul(selected, g.const(weights.w_lm.astype(np.float32), "lm_head.w"), "lm_head"), names.kLogits)
    g.output(g.cast(x, dims.act, "hidden_out"), names.kOutputHiddenStates)
    for layer, (present_k, present_v) in enumerate(presents):
        g.output(present_k, names.present_k_cache(layer))
        g.output(present_v, names.present_v_cache(layer))


def _profiles(builder: Any, cfg: Any) -> list[Any]:
    """Profile 0 (prefill) and profile 1 (everything else) of :func:`profile_shapes`."""
    profiles = []
    for which in range(2):
        profile = builder.create_optimization_profile()
        for name, per_profile in profile_shapes(cfg).items():
            lo, opt, hi = per_profile[which]
            profile.set_shape(name, lo, opt, hi)
        profiles.append(profile)
    return profiles


def _tree_or_causal(
    g: _Graph, cfg: Any, mask_words: Any, pos_ids: Any, j4: Any, start4: Any, below_ctx: Any,
    causal_vis: Any, causal_pos: Any,
) -> tuple[Any, Any]:
    """Spec-decode engines: the mask's shape picks causal (``N == 1``) or the packed tree."""
    f32 = DType.FLOAT32
    # Unpack bit i of every int32 word as floor(x / 2**i) mod 2 (floor division keeps this right
    # for negative words; bit 31 needs two divisions because 2**31 is not an int32).
    div_a = np.array([1 << i for i in range(31)] + [1 << 30], dtype=np.int32).reshape(1, 1, 1, 32)
    div_b = np.array([1] * 31 + [2], dtype=np.int32).reshape(1, 1, 1, 32)
    words = g.reshape(mask_words, (0, 0, 0, 1), "tree_words4")  # [B, N, W, 1]
    shifted = g.ew(g.ew(words, g.const(div_a, "tree_div_a"), "FLOOR_DIV", "tree_shift_a"),
                   g.const(div_b, "tree_div_b"), "FLOOR_DIV", "tree_shift")  # [B, N, W, 32]
    two = g.scalar(2, np.int32, 4, "two4")
    bits = g.ew(shifted, g.ew(g.ew(shifted, two, "FLOOR_DIV", "tree_half"), two, "PROD", "tree_even"),
                "SUB", "tree_bits")
    bits = g.unsqueeze(g.reshape(bits, (0, 0, -1), "tree_bits_flat"), 1, "tree_bits4")  # [B, 1, N, 32W]
    bit_count = g.dim(bits, 3, "tree_bit_count")
    max_bits = 32 * math.ceil(step_capacity(cfg) / 32)
    bit_idx = g.reshape(g.arange(max_bits, bit_count, "tree_bit_idx"), (1, 1, -1, 1), "tree_bit_idx4")
    rel = g.ew(j4, start4, "SUB", "tree_rel")  # [B, 1, 1, C]: slot - start = tree node
    onehot = g.cast(g.ew(bit_idx, rel, "EQUAL", "tree_onehot_b"), f32, "tree_onehot")  # [B, 1, 32W, C]
    hits = g.ew(g.matmul(g.cast(bits, f32, "tree_bits_f"), onehot, "tree_hits_f"),
                g.scalar(0.5, np.float32, 4, "tree_half_f"), "GREATER", "tree_hits")  # [B, 1, N, C]
    n4 = g.reshape(g.cast(g.dim(mask_words, 1, "tree_n"), DType.INT32, "tree_n32"), (1, 1, 1, 1), "tree_n4")
    zero4 = g.scalar(0, np.int32, 4, "izero4")
    in_tree = g.ew(
        g.ew(g.unary(g.ew(rel, zero4, "LESS", "tree_rel_neg"), "NOT", "tree_rel_nonneg"),
             g.ew(rel, n4, "LESS", "tree_rel_lt_n"), "AND", "tree_rel_ok"),
        hits, "AND", "tree_in",
    )
    tree_vis = g.ew(below_ctx, g.ew(g.ew(j4, start4, "LESS", "tree_past"), in_tree, "OR", "tree_seen"),
                    "AND", "tree_vis")  # [B, 1, N, C]
    is_causal = g.ew(n4, g.scalar(1, np.int32, 4, "one4_n"), "EQUAL", "is_causal")  # [1, 1, 1, 1]
    visible = g.select(is_causal, causal_vis, tree_vis, "visible")
    positions = g.select(g.reshape(is_causal, (1, 1), "is_causal2"), causal_pos, pos_ids, "positions")
    return visible, positions


# -- contract ---------------------------------------------------------------------------------


def network_contract(network: Any, profiles: Sequence[Any]) -> list[dict[str, Any]]:
    """The network's I/O contract, one dict per tensor in declaration order (inputs, then outputs).

    Keys: ``name``, ``mode`` (``"input"``/``"output"``), ``dtype`` (trtio DType name), ``shape``
    (tuple, -1 = dynamic), ``profiles`` (inputs: ``[(min, opt, max)]`` per profile, the static shape
    three times for a static input; outputs: ``[]``) and ``aliased_input`` (outputs of a
    KVCacheUpdate layer: the cache input they alias; else None).
    """
    aliases: dict[str, str] = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type.name == "KV_CACHE_UPDATE":  # by name: works for tensorrt and tensorrt_rtx alike
            aliases[layer.get_output(0).name] = layer.get_input(0).name
    out: list[dict[str, Any]] = []
    for i in range(network.num_inputs):
        t = network.get_input(i)
        shape = tuple(int(x) for x in t.shape)
        per_profile: list[tuple[tuple[int, ...], ...]] = []
        for profile in profiles:
            if -1 not in shape:  # asking a profile about a static input is a logged API error
                per_profile.append((shape, shape, shape))
                continue
            dims = profile.get_shape(t.name)
            per_profile.append(tuple(tuple(int(x) for x in dm) for dm in dims) if len(dims) == 3 else ())
        out.append(dict(name=t.name, mode="input", dtype=str(DType.from_trt(t.dtype)), shape=shape,
                        profiles=per_profile, aliased_input=None))
    for i in range(network.num_outputs):
        t = network.get_output(i)
        out.append(dict(name=t.name, mode="output", dtype=str(DType.from_trt(t.dtype)),
                        shape=tuple(int(x) for x in t.shape), profiles=[],
                        aliased_input=aliases.get(t.name)))
    return out


def network_engine_io(network: Any, profiles: Sequence[Any]) -> dict[str, Any]:
    """A built network's I/O in the form of :meth:`trtio._engine.EngineIO.to_dict`.

    What an engine built from ``network`` with ``profiles`` will declare: tensors in declaration
    order (inputs, then outputs) with index, name, mode, dtype, shape (-1 = dynamic), location,
    shape-tensor flag, every profile's min / opt / max (inputs; a static input reports its shape
    three times, as TensorRT does) and the input each output aliases (KVCacheUpdate layers).
    """
    rows = network_contract(network, profiles)
    location = {}
    shape_flag = {}
    for t in [network.get_input(i) for i in range(network.num_inputs)] + \
             [network.get_output(i) for i in range(network.num_outputs)]:
        loc = getattr(t, "location", None)  # TensorRT-RTX has no ITensor.location: always device
        location[t.name] = "host" if loc is not None and getattr(loc, "name", str(loc)).endswith("HOST") else "device"
        shape_flag[t.name] = bool(getattr(t, "is_shape_tensor", False))
    tensors = []
    for index, row in enumerate(rows):
        tensors.append({
            "index": index,
            "name": row["name"],
            "mode": row["mode"],
            "dtype": row["dtype"],
            "shape": list(row["shape"]),
            "location": location[row["name"]],
            "is_shape_tensor": shape_flag[row["name"]],
            "profiles": [{"min": list(lo), "opt": list(opt), "max": list(hi)} for lo, opt, hi in row["profiles"]],
            "aliased_input": row["aliased_input"],
        })
    return {"name": str(network.name), "num_profiles": len(profiles), "tensors": tensors}


def contract_diff(got: Mapping[str, Any], want: Mapping[str, Any], *,
                  labels: tuple[str, str] = ("got", "want")) -> list[str]:
    """Every difference between two I/O contracts in :meth:`trtio._engine.EngineIO.to_dict` form.

    Tensors are matched by name (a difference in the set or order of names is reported once, then
    the common tensors are compared field by field: index, mode, dtype, shape, location, shape-tensor
    flag, each profile's min / opt / max, aliasing). An empty list means the contracts are equal.
    """
    a, b = labels
    problems: list[str] = []

    def diff(x: Any, y: Any, path: str) -> None:
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            for key in list(y) + [k for k in x if k not in y]:
                if key not in x:
                    problems.append(f"{path}.{key}: missing in {a} ({b}: {y[key]!r})")
                elif key not in y:
                    problems.append(f"{path}.{key}: missing in {b} ({a}: {x[key]!r})")
                else:
                    diff(x[key], y[key], f"{path}.{key}")
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            if len(x) != len(y):
                problems.append(f"{path}: {len(x)} entries in {a} {_short(x)}, {len(y)} in {b} {_short(y)}")
                return
            for i, (u, v) in enumerate(zip(x, y)):
                diff(u, v, f"{path}[{i}]")
        elif x != y or isinstance(x, bool) != isinstance(y, bool):
            problems.append(f"{path}: {x!r} in {a}, {y!r} in {b}")

    for key in list(want) + [k for k in got if k not in want]:
        if key == "tensors":
            continue
        if key not in got or key not in want:
            problems.append(f"{key}: present only in {a if key in got else b}")
        else:
            diff(got[key], want[key], key)
    gt = {t["name"]: t for t in got.get("tensors", [])}
    wt = {t["name"]: t for t in want.get("tensors", [])}
    gnames, wnames = list(gt), list(wt)
    if gnames != wnames:
        only_a = [n for n in gnames if n not in wt]
        only_b = [n for n in wnames if n not in gt]
        if only_a or only_b:
            problems.append(f"tensor names differ: only in {a}: {only_a}; only in {b}: {only_b}")
        else:
            problems.append(f"tensor order differs: {a} {gnames}, {b} {wnames}")
    for name in wnames:
        if name in gt:
            diff(gt[name], wt[name], name)
    return problems


def _short(x: Sequence[Any]) -> str:
    text = repr(list(x))
    return text if len(text) <= 60 else text[:57] + "..."


# -- building ---------------------------------------------------------------------------------


def resolve_module(module: Any = "auto") -> Any:
    """``"auto"`` (``tensorrt`` when importable, else ``tensorrt_rtx``), a name, or a module object.

    :func:`trtio._trt.import_trt` does the work; it raises :class:`trtio.EngineError` for an unknown
    name or a module that does not import.
    """
    return import_trt(module)


class _ProgressBar:
    """Draws one line per build from TensorRT's IProgressMonitor callbacks (any thread)."""

    def __init__(self, label: str, stream: TextIO, width: int = 30) -> None:
        self.label = label
        self.stream = stream
        self.width = width
        self._lock = threading.Lock()
        self._phases: dict[str, list[Any]] = {}  # name -> [done, total, parent]
        self._order: list[str] = []
        self._drawn = False
        self._last = ""

    def start(self, phase: str, parent: str | None, steps: int) -> None:
        with self._lock:
            self._phases[phase] = [0, max(1, int(steps)), parent]
            self._order.append(phase)
            self._draw()

    def step(self, phase: str, step: int) -> None:
        with self._lock:
            if phase in self._phases:
                self._phases[phase][0] = int(step) + 1
            self._draw()

    def finish(self, phase: str) -> None:
        with self._lock:
            self._phases.pop(phase, None)
            if phase in self._order:
                self._order.remove(phase)
            self._draw()

    def _fraction(self) -> float:
        tops = [p for p in self._order if self._phases[p][2] is None]
        if not tops:
            return 0.0
        done, total, _ = self._phases[tops[0]]
        return min(1.0, int(done) / int(total))

    def _draw(self) -> None:
        frac = self._fraction()
        filled = int(round(frac * self.width))
        phase = self._order[-1] if self._order else ""
        line = f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {frac:4.0%} {phase}"
        if line == self._last:  # TensorRT reports many steps per phase; redraw only on change
            return
        self._last = line
        self.stream.write("\r" + line[:100].ljust(100))
        self.stream.flush()
        self._drawn = True

    def clear(self) -> None:
        """Erase the bar from its line."""
        with self._lock:
            if self._drawn:
                self.stream.write("\r" + " " * 100 + "\r")
                self.stream.flush()
                self._drawn = False


def _progress_monitor(trt: Any, bar: _ProgressBar) -> Any:
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class Monitor(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            try:
                bar.start(phase_name, parent_phase, num_steps)
            except Exception:  # a display glitch must never fail a build
                _log.debug("progress bar failed", exc_info=True)

        def step_complete(self, phase_name: str, step: int) -> bool:
            try:
                bar.step(phase_name, step)
            except Exception:
                _log.debug("progress bar failed", exc_info=True)
            return True

        def phase_finish(self, phase_name: str) -> None:
            try:
                bar.finish(phase_name)
            except Exception:
                _log.debug("progress bar failed", exc_info=True)

    return Monitor()


@dataclass(frozen=True)
class BuiltPlan:
    """One serialized plan: where it went, how big it is and how long the build took."""

    path: Path
    nbytes: int
    seconds: float


def configure_builder(trt: Any, config: Any) -> None:
    """Builder flags the toy plans need: TensorRT-RTX captures an engine's enqueue into a CUDA graph only
    when the engine was built with ``REQUIRE_USER_ALLOCATION`` (trtio allocates every tensor and the
    context memory itself; the executor asks ``is_stream_capturable`` before capturing)."""
    flag = getattr(trt.BuilderFlag, "REQUIRE_USER_ALLOCATION", None)
    if trt.__name__ == "tensorrt_rtx" and flag is not None:
        config.set_flag(flag)


def _require_layers(trt: Any, network: Any) -> None:
    """The KVCacheUpdate and RotaryEmbedding layers exist from TensorRT 10.15 (TensorRT-RTX 1.2) on."""
    missing = [m for m in ("add_kv_cache_update", "add_rotary_embedding") if not hasattr(network, m)]
    if missing:
        raise EngineError(f"{trt.__name__} {getattr(trt, '__version__', '?')} has no {', '.join(missing)}: the toy "
                          f"plans need TensorRT 10.15 or later (or TensorRT-RTX 1.2 or later)")


def build_plan(
    module: Any,
    cfg: Any,
    weights: ToyWeights,
    out_path: str | Path,
    *,
    progress: bool = True,
    label: str | None = None,
    stream: TextIO | None = None,
) -> BuiltPlan:
    """Build the toy network for ``cfg`` with ``module`` and write the serialized plan to ``out_path``.

    With ``progress``, a bar is drawn on ``stream`` (default stderr) while TensorRT builds, when the
    stream is a terminal and the module has ``IProgressMonitor``; a one-line summary follows. Raises
    :class:`~trtio.EngineError` with TensorRT's error log when the build fails.
    """
    trt = resolve_module(module)
    out_path = Path(out_path)
    label = label or out_path.parent.name or "engine"
    stream = stream if stream is not None else sys.stderr
    t0 = time.perf_counter()
    builder, network, profiles = build_network(trt, cfg, weights)
    config = builder.create_builder_config()
    if config is None:
        raise EngineError(f"{trt.__name__}: create_builder_config failed")
    configure_builder(trt, config)
    for i, profile in enumerate(profiles):
        if config.add_optimization_profile(profile) < 0:
            raise EngineError(f"{trt.__name__}: optimization profile {i} rejected")
    bar = None
    monitor = None  # referenced until the build returns: TensorRT calls it from its threads
    interactive = progress and getattr(stream, "isatty", lambda: False)()
    if interactive:
        bar = _ProgressBar(label, stream)
        monitor = _progress_monitor(trt, bar)
        if monitor is not None:
            config.progress_monitor = monitor
    logger = trt_logger(trt)
    logger.take_errors()
    try:
        plan = builder.build_serialized_network(network, config)
    finally:
        if bar is not None:
            bar.clear()
    errors = logger.take_errors()
    if plan is None or plan.nbytes == 0:
        detail = "; ".join(errors) if errors else "no error was logged"
        raise EngineError(f"{trt.__name__}: building {label} failed: {detail}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    data = memoryview(plan)
    with open(out_path, "wb") as f:
        f.write(data)
    seconds = time.perf_counter() - t0
    if progress:
        stream.write(f"built {label}: {out_path} ({len(data) / 1e6:.2f} MB, {seconds:.2f} s)\n")
        stream.flush()
    return BuiltPlan(out_path, len(data), seconds)


