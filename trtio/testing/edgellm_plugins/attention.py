"""``trt_edgellm::AttentionPlugin`` in numpy, read from Edge-LLM 0.11's C++.

Sources (Edge-LLM 0.11):

- ``cpp/plugins/attentionPlugin/attentionPlugin.cpp``: ``resolveAttentionInputLayout`` (which optional inputs
  follow the six required ones), ``resolveAttentionExecutionMode`` (phase -> mode), ``enqueueImpl`` (which length
  feeds which kernel: ``query_lengths`` in prefill, ``attention_sequence_lengths`` in decode and tree modes).
- ``cpp/kernels/contextAttentionKernels/utilKernels.cu``: ``calCuQCuKVSeqLensAndKVEndIdxs`` (prefill: K/V end =
  ``past_lengths + W``, keys visible ``past_lengths + query_lengths``).
- ``cpp/kernels/posEncoding/applyRopeWriteKV.cu``: ``applyRopeFromPackedToSplitKernel`` (per-head RMSNorm with an
  fp32 sum of squares, non-interleaved RoPE from the token's own table row, K/V written at ``end - W + row``,
  padding rows zeroed and never written, page ids checked against the pool plane).
- ``kernelSrcs/xqa/mha.cu`` (the XQA source Edge-LLM JIT-compiles for decode and tree steps): ``kernel_mha_impl``
  with ``SPEC_DEC`` (a tree step computes the first ``query_lengths[b]`` rows of its W) and ``applyMaskFromInput``
  (the packed mask covers the last W keys, ``ceil(W / 32)`` words a row).
- ``cpp/plugins/utils/raggedPluginMetadata.h``: the carriers' checks (``_common.ragged_metadata``).

Sliding windows and Gemma 4's storage modes (``enqueueImpl``'s ``useBoundedSwaCache`` and ``sharedKV`` paths):

- a ``sliding_window_size`` W layer sees the last W keys, its own included (``slidingWinSize`` W for XQA decode,
  ``W - 1`` left of the query for FMHA prefill);
- ``supports_bounded_kv_cache`` adds the shape-only ``swa_kv_cache_mode`` input. Extent 0 is full storage: the
  same paged kernels as any layer, over a table that maps every page. Extent 1 is bounded storage
  (``boundedSwaKVPageManager`` rotates each sequence's few private pages through its table row, logical page j in
  column j): K/V are written only where the row maps a page (``applyRopeFromPackedToSplitKernel`` skips a negative
  id); a normal prefill attends over the step's own K/V (the dense scratch, not the pool); a chunk attends over the
  resident window ``[past - min(past, W), past)`` gathered from the pool (``calSWAChunkedPrefillMetadata``,
  ``assemblePagedSWAChunkedPrefillFMHAKV``, ``clampSWAResidentLength`` in ``cpp/kernels/common/
  slidingWindowUtils.cuh``) followed by the chunk's own rows, and writes every row of its padded width (no
  ``cuQSeqLens`` on that path); decode reads the window ``[end - W, end)`` from the pool (XQA, paged);
- ``enable_kv_shared`` 1 (a KV-sharing consumer, Gemma 4's full layers past the shared boundary): the packed input
  is Q only, or Q plus the donor's current K/V; the layer never writes. It reads the pool bound to its own
  ``past_key_values_i`` (the runtime binds the donor's), except in bounded prefill, which needs the current K/V
  from its input. With Q only, a prefill over cached tokens is refused: its queries are rotated by
  ``launchApplyRopeQOnly`` with ``kvCacheEndLens`` (``applyRopeWriteKV.cu``), i.e. with row ``past + i`` of a
  table that holds one row per token of the step (the token-aligned RoPE every other path reads at row i).
  (Gemma 4's sliding consumers are exported with ``enable_kv_shared`` 0 and the donor's current K/V: they write the
  donor's values again, into the donor's pool.)

The model computes on the pools it is given, in place: the K/V writes of a layer land in ``past_key_values_i``'s
memory, which is what ``present_key_values_i`` aliases, so a later node of the same step (a KV-shared layer) reads
them, as on the GPU. Modes the parity cases do not exercise (FP8 KV, vision blocks, attention sinks, packed
prefill, a context mask selector) raise :class:`PluginInputError` naming the attribute rather than computing
something unread.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio.testing.edgellm_plugins._common import Phase, PluginInputError, mapped_slots, pool_slots, ragged_metadata

__all__ = ["attention_plugin"]

_NAME = "AttentionPlugin"


class Mode(enum.Enum):
    """``AttentionExecutionMode``."""

    NORMAL_PREFILL = "normal prefill"
    CHUNKED_PREFILL = "chunked prefill"
    VANILLA_DECODING = "vanilla decoding"
    TREE_DECODING = "tree decoding"


def _mode(phase: Phase, tree: bool) -> Mode:
    """``resolveAttentionExecutionMode``."""
    if phase in (Phase.CONTEXT_PREFILL, Phase.DIFFUSION_COMMIT):
        return Mode.NORMAL_PREFILL
    if phase is Phase.CONTEXT_CHUNK:
        return Mode.CHUNKED_PREFILL
    if phase is Phase.AUTOREGRESSIVE_DECODE:
        return Mode.VANILLA_DECODING
    if phase in (Phase.SPEC_DRAFT_PROPOSAL, Phase.DIFFUSION_DENOISE):
        return Mode.TREE_DECODING if tree else Mode.NORMAL_PREFILL
    return Mode.TREE_DECODING  # SPEC_TARGET_VERIFY; phase 8 is refused by ragged_metadata


@dataclass(frozen=True)
class _Layout:
    """``resolveAttentionInputLayout``: the index of each optional input (-1 = absent)."""

    q_norm: int
    k_norm: int
    tree_mask: int
    tree_pos: int
    swa_mode: int
    metadata: int
    count: int


def _layout(attrs: dict[str, Any]) -> _Layout:
    cursor = 6
    q_norm = k_norm = tree_mask = tree_pos = swa_mode = -1
    if attrs["enable_qk_norm"]:
        q_norm, k_norm, cursor = cursor, cursor + 1, cursor + 2
    if attrs["enable_context_mask_selector"]:
        cursor += 1
    if attrs["enable_tree_attention"]:
        tree_mask, tree_pos, cursor = cursor, cursor + 1, cursor + 2
    if attrs["enable_vision_block_attention"]:
        cursor += 1
    if attrs["enable_profile_local_packed_prefill"]:
        cursor += 1
    if attrs["skip_softmax_scale_factor"] > 0:
        cursor += 1
    if attrs["supports_bounded_kv_cache"]:
        swa_mode, cursor = cursor, cursor + 1
    if attrs["enable_attention_sink"]:
        cursor += 1
    return _Layout(q_norm, k_norm, tree_mask, tree_pos, swa_mode, cursor, cursor + 4)


_DEFAULTS: dict[str, Any] = {
    "enable_tree_attention": 0, "enable_fp8_kv_cache": 0, "enable_context_mask_selector": 0,
    "enable_vision_block_attention": 0, "enable_qk_norm": 0, "qk_norm_post_rope": 0, "enable_kv_shared": 0,
    "enable_attention_sink": 0, "enable_contiguous_query_swa": 0, "enable_packed_prefill": 0,
    "enable_profile_local_packed_prefill": 0, "supports_bounded_kv_cache": 0, "sliding_window_size": -1,
    "skip_softmax_scale_factor": 0.0, "attention_scale": None, "rms_norm_eps": 1e-6,
}

# Attributes whose modes no parity case runs: refused by name rather than computed from a guess.
_UNMODELLED = ("enable_fp8_kv_cache", "enable_context_mask_selector", "enable_vision_block_attention",
               "enable_attention_sink", "enable_packed_prefill", "enable_contiguous_query_swa")


def _rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """``loadAndApplyRmsNorm``: fp32 sum of squares over the head, ``half(x * inv_rms) * gamma`` in half."""
    xf = x.astype(np.float32)
    inv = np.float32(1.0) / np.sqrt((xf * xf).sum(axis=-1, keepdims=True) / np.float32(x.shape[-1])
                                    + np.float32(eps))
    out: np.ndarray = (xf * inv).astype(np.float16) * gamma.astype(np.float16)
    return out


def _rope(x: np.ndarray, cos_sin: np.ndarray) -> np.ndarray:
    """``vecApplyRopeNonInterleave``: channels ``[0, r/2)`` and ``[r/2, r)`` rotate as pairs with the row's
    ``[cos | sin]`` halves (r = the table's width); channels past r pass through. ``x`` is ``[T, H, D]`` half,
    ``cos_sin`` ``[T, r]`` fp32; the result is half."""
    r = cos_sin.shape[-1]
    half = r // 2
    cos = cos_sin[:, None, :half].astype(np.float32)
    sin = cos_sin[:, None, half:r].astype(np.float32)
    xf = x.astype(np.float32)
    out = x.copy()
    left, right = xf[..., :half], xf[..., half:r]
    out[..., :half] = (left * cos - right * sin).astype(np.float16)
    out[..., half:r] = (right * cos + left * sin).astype(np.float16)
    return out


def _norm_and_rope(x: np.ndarray, gamma: np.ndarray | None, cos_sin: np.ndarray, eps: float,
                   post_rope: bool) -> np.ndarray:
    if gamma is None:
        return _rope(x, cos_sin)
    if post_rope:  # vecApplyRopeThenRmsNormNonInterleave (HunYuan V1): rotate, then normalize
        return _rms_norm(_rope(x, cos_sin), gamma, eps)
    return _rope(_rms_norm(x, gamma, eps), cos_sin)  # vecApplyRmsNormAndRopeNonInterleave (Qwen3)


def _gamma(inputs: tuple[np.ndarray, ...], index: int, head_size: int, which: str) -> np.ndarray | None:
    """``resolveNormGammaInput``: an empty gamma means no norm; otherwise its length must be ``head_size``."""
    if index < 0:
        return None
    gamma = np.asarray(inputs[index])
    if gamma.shape[0] <= 0:
        return None
    if gamma.shape[0] != head_size:
        raise PluginInputError(f"{_NAME}: {which} gamma length {gamma.shape[0]} must equal head_size {head_size}")
    return gamma


@dataclass(frozen=True)
class _Heads:
    q: int
    kv: int
    size: int


def _attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, visible: np.ndarray, scale: float) -> np.ndarray:
    """Softmax attention in fp32 over half operands (GQA: query head h reads KV head ``h // (Hq / Hkv)``).
    ``q`` ``[R, Hq, D]``, ``keys`` / ``values`` ``[K, Hkv, D]``, ``visible`` ``[R, K]`` bool; ``[R, Hq, D]``
    half."""
    rows, hq, _ = q.shape
    hkv = keys.shape[1]
    group = hq // hkv
    kf = np.repeat(keys.astype(np.float32), group, axis=1)  # [K, Hq, D]
    # A key no row sees is never loaded by the kernels (XQA skips masked tiles): its slot may hold anything (a tree
    # step's padding slot is never written), which must not reach the output as 0 * NaN.
    seen: np.ndarray = np.asarray(visible.any(axis=0))
    vf = np.repeat(np.where(seen[:, None, None], values.astype(np.float32), np.float32(0)), group, axis=1)
    scores = np.matmul(q.astype(np.float32).transpose(1, 0, 2), kf.transpose(1, 2, 0)) * np.float32(scale)  # [Hq, R, K]
    scores = np.where(visible[None], scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    weights = np.exp(scores - peak)
    total = weights.sum(axis=-1, keepdims=True)
    weights = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    out: np.ndarray = np.matmul(weights, vf.transpose(1, 0, 2)).transpose(1, 0, 2).astype(np.float16)
    return out


@dataclass(frozen=True)
class _Step:
    """One node's step, its inputs checked: what every sequence's loop reads."""

    plugin: str
    mode: Mode
    width: int
    sequences: int
    heads: _Heads
    window: int
    scale: float
    shared: bool
    bounded: bool  # swa_kv_cache_mode of extent 1: the bounded SWA pool
    q: np.ndarray  # [T, Hq, D] normed and rotated
    k: np.ndarray | None  # [T, Hkv, D] (None: a KV-shared layer given Q only)
    v: np.ndarray | None
    pool: np.ndarray
    page_table: np.ndarray
    query_lengths: np.ndarray
    past_lengths: np.ndarray
    seq_lengths: np.ndarray
    tree_pos: np.ndarray | None
    tree_mask: np.ndarray | None


def _checked(node: str, inputs: tuple[np.ndarray, ...], given: dict[str, Any]) -> _Step:
    """The checks ``enqueueImpl`` and the kernels make before any work, and the step they describe."""
    attrs = {**_DEFAULTS, **{k: v for k, v in given.items() if v is not None}}
    plugin = f"{_NAME} {node}"
    for key in _UNMODELLED:
        if attrs[key]:
            raise PluginInputError(f"{plugin}: {key} = {attrs[key]} is a mode this numpy model does not compute")
    layout = _layout(attrs)
    if len(inputs) != layout.count:
        raise PluginInputError(f"{plugin}: expected {layout.count} inputs for these attributes, got {len(inputs)}")
    qkv, pool, query_lengths, cos_sin, past_lengths, page_table = inputs[:6]
    offsets, seq_lengths, phase_marker, context_count = inputs[layout.metadata:layout.metadata + 4]
    heads = _Heads(int(attrs["num_q_heads"]), int(attrs["num_kv_heads"]), int(attrs["head_size"]))
    bounded = _swa_mode(plugin, attrs, inputs, layout)
    ragged = ragged_metadata(plugin, int(qkv.shape[0]), query_lengths, offsets, phase_marker, context_count)
    mode = _mode(ragged.phase, bool(attrs["enable_tree_attention"]))
    _check_pool(plugin, pool, page_table, heads, ragged.sequences, bounded)
    shared = bool(attrs["enable_kv_shared"])
    width = (heads.q + 2 * heads.kv) * heads.size
    if (not shared and qkv.shape[1] != width) or (shared and qkv.shape[1] not in (heads.q * heads.size, width)):
        raise PluginInputError(f"{plugin}: packed QKV last dim {qkv.shape[1]} does not match enable_kv_shared "
                               f"{int(shared)} (expected {width}{'' if not shared else f' or {heads.q * heads.size}'})")
    if cos_sin.shape[0] != qkv.shape[0]:
        raise PluginInputError(f"{plugin}: rope_rotary_cos_sin has {cos_sin.shape[0]} rows, the step "
                               f"{qkv.shape[0]} tokens (one table row per token)")
    if cos_sin.shape[1] % 2 or cos_sin.shape[1] > heads.size:
        raise PluginInputError(f"{plugin}: rotary width {cos_sin.shape[1]} must be even and at most head_size "
                               f"{heads.size}")
    if mode is Mode.TREE_DECODING and layout.tree_mask < 0:
        raise PluginInputError(f"{plugin}: phase {int(ragged.phase)} is tree decoding, but the layer has no tree "
                               "inputs")
    window = int(attrs["sliding_window_size"])
    if window > 0 and mode is Mode.TREE_DECODING and (np.asarray(seq_lengths) > window).any():
        # enqueueImpl's tree branch hands XQA's spec-dec kernel slidingWinSize W (and contiguousQuerySwa): which keys
        # its window hides once a sequence outgrows it is not read here; while the whole sequence fits, none.
        raise PluginInputError(f"{plugin}: tree decoding with sliding_window_size {window} over a sequence of "
                               f"{int(np.asarray(seq_lengths).max())} tokens (past the window) is a mode this numpy "
                               "model does not compute")
    scale = attrs["attention_scale"]
    eps, post = float(attrs["rms_norm_eps"]), bool(attrs["qk_norm_post_rope"])
    packed = np.asarray(qkv).reshape(qkv.shape[0], -1, heads.size)
    q_gamma = _gamma(inputs, layout.q_norm, heads.size, "q_norm")
    own_kv = packed.shape[1] > heads.q
    prefill = mode in (Mode.NORMAL_PREFILL, Mode.CHUNKED_PREFILL)
    if bounded and prefill and not own_kv:
        raise PluginInputError(f"{plugin}: Bounded shared-KV prefill requires the donor's current K/V in the packed "
                               "input (enable_kv_shared 1 with Q only and swa_kv_cache_mode of extent 1)")
    if shared and not own_kv and prefill and (np.asarray(past_lengths) > 0).any():
        b = int(np.flatnonzero(np.asarray(past_lengths) > 0)[0])
        raise PluginInputError(f"{plugin}: a KV-shared layer given Q only, in a prefill over {int(past_lengths[b])} "
                               f"cached tokens (sequence {b}): enqueueImpl rotates its queries with "
                               "launchApplyRopeQOnly(kvCacheEndLens = past + W), which reads row past + i of the "
                               "step's token-aligned RoPE table (another token's row, or past the table), not row i")
    if bounded and mode is Mode.CHUNKED_PREFILL and ragged.width <= 1:
        raise PluginInputError(f"{plugin}: SWA chunked prefill requires runtimeSeqLen > 1 (bounded SWA storage, "
                               f"padded width {ragged.width})")
    k = v = None
    if own_kv:
        k = _norm_and_rope(packed[:, heads.q:heads.q + heads.kv], _gamma(inputs, layout.k_norm, heads.size, "k_norm"),
                           cos_sin, eps, post)
        v = packed[:, heads.q + heads.kv:]
    return _Step(plugin=plugin, mode=mode, width=ragged.width, sequences=ragged.sequences, heads=heads,
                 window=window, scale=float(scale) if scale is not None else 1.0 / float(np.sqrt(heads.size)),
                 shared=shared, bounded=bounded,
                 q=_norm_and_rope(packed[:, :heads.q], q_gamma, cos_sin, eps, post), k=k, v=v,
                 pool=pool, page_table=page_table, query_lengths=np.asarray(query_lengths),
                 past_lengths=np.asarray(past_lengths), seq_lengths=np.asarray(seq_lengths),
                 tree_pos=np.asarray(inputs[layout.tree_pos]) if layout.tree_pos >= 0 else None,
                 tree_mask=np.asarray(inputs[layout.tree_mask]) if layout.tree_mask >= 0 else None)


def _swa_mode(plugin: str, attrs: dict[str, Any], inputs: tuple[np.ndarray, ...], layout: _Layout) -> bool:
    """Whether the step uses bounded SWA storage: the constructor's capability check, then ``enqueueImpl``'s
    ``swa_kv_cache_mode`` (shape-only: extent 1 bounded, 0 full; its data is never read)."""
    if not attrs["supports_bounded_kv_cache"]:
        return False
    off = [k for k in ("enable_tree_attention", "enable_fp8_kv_cache", "enable_qk_norm",
                       "enable_context_mask_selector") if attrs[k]]
    if int(attrs["sliding_window_size"]) <= 0 or off:
        raise PluginInputError(f"{plugin}: Bounded KV cache capability requires FP16 vanilla sliding-window attention "
                               f"(sliding_window_size {attrs['sliding_window_size']}, {off or 'no other mode'})")
    mode = np.asarray(inputs[layout.swa_mode])
    if mode.ndim != 1 or mode.shape[0] not in (0, 1):
        raise PluginInputError(f"{plugin}: swa_kv_cache_mode must have runtime shape [0] or [1], got "
                               f"{list(mode.shape)}")
    return int(mode.shape[0]) == 1


def _check_pool(plugin: str, pool: np.ndarray, page_table: np.ndarray, heads: _Heads, sequences: int,
                bounded: bool = False) -> None:
    """``hasConcretePagedKVContract``: the pool ``[2, N, 128, Hkv, >= D]``, the table ``[B, 2, M]`` with M <= N
    (not in bounded SWA storage, whose table is sparse over a smaller pool)."""
    if pool.ndim != 5 or pool.shape[0] != 2 or pool.shape[2] != 128 or pool.shape[3] != heads.kv \
            or pool.shape[4] < heads.size:
        raise PluginInputError(f"{plugin}: kv_cache pool {list(pool.shape)} is not [2, N, 128, {heads.kv}, "
                               f">= {heads.size}]")
    if page_table.ndim != 3 or page_table.shape[0] != sequences or page_table.shape[1] != 2:
        raise PluginInputError(f"{plugin}: kv_page_table {list(page_table.shape)} is not INT32 [B={sequences}, 2, M]")
    if not bounded and pool.shape[1] < page_table.shape[2]:
        raise PluginInputError(f"{plugin}: full-cache mode requires at least one physical page ({pool.shape[1]}) "
                               f"per logical page-table column ({page_table.shape[2]})")


@dataclass(frozen=True)
class _Rows:
    """Sequence b's rows of the step: which write K/V, which the attention kernel computes (and which of those
    have their Q zeroed: tree padding), their positions (= KV slots) and the keys they see."""

    rows: np.ndarray
    writes: np.ndarray  # bool [W]
    computed: np.ndarray  # bool [W]
    zero_q: np.ndarray  # bool [W]
    positions: np.ndarray
    start: int
    key_end: int


def _rows(step: _Step, b: int) -> _Rows:
    """Where sequence b's rows write and read: prefill from ``past_lengths`` (``calCuQCuKVSeqLensAndKVEndIdxs``),
    decode and tree from ``attention_sequence_lengths - W`` (``applyRopeFromPackedToSplitKernel``).

    Tree decoding (``enqueueImpl``'s tree branch; ``applyRopeFromPackedToSplitKernel`` with ``tokenPosIds``;
    XQA's spec-dec ``kernel_mha_impl``): ``attention_position_ids`` marks padding only (-1: Q zeroed, no K/V
    write; the RoPE row is the token's own, ``tokenAlignedRope``); every other row of the W writes its K/V at
    ``length - W + row``, whatever ``query_lengths`` says (Edge-LLM's proposal pads with position 0 past the
    tree); the kernel computes the first ``query_lengths[b]`` rows (``actualQSeqLen = qSeqLens[idxReq]``) and leaves
    the output of the others unwritten."""
    w, plugin = step.width, step.plugin
    rows = np.arange(b * w, (b + 1) * w)
    none = np.zeros(w, bool)
    if step.mode in (Mode.NORMAL_PREFILL, Mode.CHUNKED_PREFILL):
        past, qlen = int(step.past_lengths[b]), int(step.query_lengths[b])
        if past < 0:
            raise PluginInputError(f"{plugin}: past_lengths[{b}] = {past} is negative")
        if step.mode is Mode.NORMAL_PREFILL and past:
            # splitLenForFallback: "It is only safe to compact the split-KV workspace to runtimeSeqLen when the
            # prefill starts from an empty KV cache"; a step over a cached prefix is phase 2 (kContextChunk).
            raise PluginInputError(f"{plugin}: normal prefill (phase 1) with past_lengths[{b}] = {past}: normal "
                                   "prefill assumes an empty cache (its FP8/bounded kernels compact K/V to the chunk); "
                                   "a step over a cached prefix is phase 2")
        valid = np.arange(w) < qlen
        return _Rows(rows, valid, valid, none, past + np.arange(w), past, past + qlen)
    end = int(step.seq_lengths[b])
    start = end - w
    if start < 0:
        raise PluginInputError(f"{plugin}: attention_sequence_lengths[{b}] = {end} is below the step width {w} "
                               f"({step.mode.value} writes rows at length - W + row)")
    if step.mode is Mode.VANILLA_DECODING:
        every = np.ones(w, bool)
        return _Rows(rows, every, every, none, start + np.arange(w), start, end)
    assert step.tree_pos is not None
    padding = step.tree_pos[rows] == -1
    computed = np.arange(w) < int(step.query_lengths[b])
    return _Rows(rows, ~padding, computed, computed & padding, start + np.arange(w), start, end)


def attention_plugin(node: str, inputs: tuple[np.ndarray, ...], given: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """One AttentionPlugin node: ``(attention output [T, Hq, D] half, the KV pool)``. The pool is written in
    place (unless the layer is KV-shared) and returned as the ``present`` output. Rows the kernel does not compute
    are zero in the output."""
    step = _checked(node, inputs, given)
    heads, pool = step.heads, step.pool
    flat = pool.reshape(2 * pool.shape[1] * 128, heads.kv, pool.shape[4])
    out = np.zeros((step.q.shape[0], heads.q, heads.size), np.float16)
    for b in range(step.sequences):
        seq = _rows(step, b)
        if step.k is not None and not step.shared:
            _write(step, b, seq, flat)
        mine = seq.rows[seq.computed]
        if not mine.size:
            continue
        query_pos = seq.positions[seq.computed]
        keys, values, key_pos = _keys(step, b, seq, flat, query_pos)
        q = step.q[mine]
        if step.mode is Mode.TREE_DECODING:
            assert step.tree_mask is not None
            visible = _tree_visible(step.plugin, b, step.tree_mask[mine], seq.writes, seq.writes[seq.computed],
                                    seq.start, seq.key_end)
            q = np.where(seq.zero_q[seq.computed][:, None, None], np.float16(0), q)
        else:
            visible = key_pos[None, :] <= query_pos[:, None]
            if step.window > 0:  # the last `window` keys, the query's own included (slidingWinSize; FMHA gets W - 1)
                visible &= key_pos[None, :] > query_pos[:, None] - step.window
        out[mine] = _attend(q, keys, values, visible, step.scale)
    return out, pool


def _write(step: _Step, b: int, seq: _Rows, flat: np.ndarray) -> None:
    """The K/V writes of sequence b (``applyRopeFromPackedToSplitKernel``, ``writeKVCache``): each valid row at its
    slot through the page table. Full storage: every slot must be mapped. Bounded SWA storage: an unmapped page
    skips the write (it lies behind the window), but a slot among the last W of the sequence after the step is
    one a later step reads, so its page unmapped is the runtime's error; a bounded chunk passes no ``cuQSeqLens``,
    so its padding rows write too (at ``past + row``, beyond the sequence's end, where nothing reads them)."""
    assert step.k is not None and step.v is not None
    size, pool_pages = step.heads.size, step.pool.shape[1]
    every = step.bounded and step.mode is Mode.CHUNKED_PREFILL
    rows = seq.rows if every else seq.rows[seq.writes]
    slots = seq.positions if every else seq.positions[seq.writes]
    if not rows.size:
        return
    if not step.bounded:
        k_rows, v_rows = pool_slots(step.plugin, step.page_table, b, slots, pool_pages, "K/V write")
        flat[k_rows, :, :size] = step.k[rows]
        flat[v_rows, :, :size] = step.v[rows]
        return
    k_ok, k_rows, v_ok, v_rows = mapped_slots(step.plugin, step.page_table, b, slots, pool_pages, "K/V write")
    live = (slots < seq.key_end) & (slots >= seq.key_end - step.window)
    lost = np.flatnonzero(live & ~(k_ok & v_ok))
    if lost.size:
        slot = int(slots[lost[0]])
        raise PluginInputError(f"{step.plugin}: bounded SWA: sequence {b} writes slot {slot}, inside the window of "
                               f"its end {seq.key_end}, but swa_kv_page_table maps no page for column "
                               f"{slot // 128}: the kernel skips the write and a later step reads garbage")
    flat[k_rows[k_ok], :, :size] = step.k[rows[k_ok]]
    flat[v_rows[v_ok], :, :size] = step.v[rows[v_ok]]


def _keys(step: _Step, b: int, seq: _Rows, flat: np.ndarray,
          query_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The keys and values sequence b's rows attend over, and their positions. Full storage (and every
    non-sliding layer): the paged pool ``[0, end)``, every page mapped. Bounded SWA storage: a normal prefill's own
    rows (the dense scratch); a chunk's resident window ``[past - min(past, W), past)`` from the pool, then its own
    rows; a decode's window ``[end - W, end)`` from the pool. A gathered page that is unmapped reads as zeros on the
    GPU: raised where a valid row sees the slot."""
    size, pool_pages = step.heads.size, step.pool.shape[1]
    if step.bounded and step.mode in (Mode.NORMAL_PREFILL, Mode.CHUNKED_PREFILL):
        assert step.k is not None and step.v is not None
        own = seq.rows[seq.computed]
        past = seq.start
        resident = np.arange(past - min(past, step.window), past) if step.mode is Mode.CHUNKED_PREFILL \
            else np.arange(0)
        k_res, v_res = _gather(step, b, flat, resident, query_pos, "resident window read")
        return (np.concatenate([k_res, step.k[own]]), np.concatenate([v_res, step.v[own]]),
                np.concatenate([resident, seq.positions[seq.computed]]))
    if step.bounded:  # decode: XQA over the window through the sparse table
        slots = np.arange(max(0, seq.key_end - step.window), seq.key_end)
        k_read, v_read = _gather(step, b, flat, slots, query_pos, "K/V read")
        return k_read, v_read, slots
    slots = np.arange(seq.key_end)
    k_rows, v_rows = pool_slots(step.plugin, step.page_table, b, slots, pool_pages, "K/V read")
    return flat[k_rows, :, :size], flat[v_rows, :, :size], slots


def _gather(step: _Step, b: int, flat: np.ndarray, slots: np.ndarray, query_pos: np.ndarray,
            what: str) -> tuple[np.ndarray, np.ndarray]:
    """K and V of ``slots`` through a bounded SWA table row (zeros where unmapped, as the gather reads them);
    raises where an unmapped slot is one a valid query sees."""
    size = step.heads.size
    k_ok, k_rows, v_ok, v_rows = mapped_slots(step.plugin, step.page_table, b, slots, step.pool.shape[1], what)
    seen = ((slots[None, :] <= query_pos[:, None]) & (slots[None, :] > query_pos[:, None] - step.window)).any(axis=0)
    lost = np.flatnonzero(seen & ~(k_ok & v_ok))
    if lost.size:
        slot = int(slots[lost[0]])
        raise PluginInputError(f"{step.plugin}: bounded SWA: sequence {b} {what} of slot {slot} (inside its window) "
                               f"finds no page in swa_kv_page_table column {slot // 128}: the kernel reads zeros")
    keys = np.where(k_ok[:, None, None], flat[k_rows, :, :size], np.float16(0))
    values = np.where(v_ok[:, None, None], flat[v_rows, :, :size], np.float16(0))
    return keys.astype(np.float16), values.astype(np.float16)


def _tree_visible(plugin: str, b: int, mask_rows: np.ndarray, written: np.ndarray, real: np.ndarray, start: int,
                  key_end: int) -> np.ndarray:
    """XQA's spec-dec mask (``applyMaskFromInput``): the keys ``[0, start)`` before the step's W in-flight slots are
    visible to every computed row; in-flight slot ``start + j`` is visible to row i where bit ``j % 32`` of word
    ``j // 32`` of its mask row is set (LSB first). The kernel reads ``ceil(W / 32)`` words a row at that stride
    (``nbPackedMasksPerRow``, the mask pointer shifted by ``idxReq * W`` rows), so a mask of another width is
    misread: refused. A bit on a row that wrote nothing (position -1) reads a stale slot: refused where the row
    is ``real`` (a padding row's own output is never read)."""
    w = written.shape[0]
    words = mask_rows.astype(np.int64) & 0xFFFFFFFF
    cols = np.arange(w)
    if words.shape[1] != -(-w // 32):
        raise PluginInputError(f"{plugin}: packed_attention_mask has {words.shape[1]} words a row; the tree kernel "
                               f"reads ceil(W / 32) = {-(-w // 32)} a row for the step's width W = {w}")
    bits = ((words[:, cols // 32] >> (cols % 32)) & 1).astype(bool)  # [computed rows, W]
    stale = bits & ~written[None, :] & real[:, None]
    if stale.any():
        r, c = (int(x) for x in np.argwhere(stale)[0])
        raise PluginInputError(f"{plugin}: sequence {b}: a tree row's mask sees column {c}, a padding row "
                               "(position -1) whose K/V is never written")
    visible = np.zeros((bits.shape[0], key_end), bool)
    visible[:, :start] = True
    visible[:, start:start + w] = bits
    return visible
