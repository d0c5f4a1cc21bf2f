"""The math of one :class:`~trtio.testing.ReferenceEngine` call, shared by numpy and CuPy and by both contracts.

``docs/toy-model.md`` specifies it. Every function takes the array module ``xp`` (numpy on the host
device, CuPy on the GPU) and a matrix product ``mm``; all arithmetic is float32. Each contract prepares
its views of a step — where the layers write and read K/V, which keys each query sees, the RoPE rows,
the logits rows — and both run :func:`_run_layers`, the one layer loop: :func:`_forward` for trtio's
batch-major contract (contiguous caches written like TensorRT's KVCacheUpdate), :func:`_forward_ragged`
for Edge-LLM 0.11's token-major one (entry-padded rows, paged pools read and written through
``kv_page_table``).

Bad data: ``checked=True`` (the host device) refuses data an engine cannot use with a
:class:`~trtio.InvalidValueError` from the enqueued work. Unchecked (the GPU, where a check would
synchronise the host inside a CUDA graph) it is clipped, with one exception: a ragged sequence whose page
table names a page the step touches that is unmapped (-1) or outside the pool computes NaN in every row
of its outputs (logits, hidden states) and writes no K/V, so a page-table bug fails any comparison of
outputs instead of passing silently.

Storage formats: bf16 is converted with the same integer bit operations on both devices; fp8 (e4m3fn)
by ml_dtypes on the host and by :func:`float32_to_e4m3fn_bits` / :func:`e4m3fn_bits_to_float32` on the
GPU (CuPy has no fp8 dtype; tests hold them to ml_dtypes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio import names
from trtio._contracts import ragged as ragged_contract
from trtio._dtypes import DType
from trtio.errors import InvalidValueError
from trtio.testing.reference_io import _Geometry
from trtio.testing.toy_model import ToyWeights, recurrent_token

__all__ = ["e4m3fn_bits_to_float32", "float32_to_e4m3fn_bits"]

#: Writes a layer's new K and V ([N, S, Hkv, D] float32) and returns the keys and values its queries read:
#: [N, Hkv, K, D] float32 as stored, values zeroed on key slots no query sees.
KVUpdate = Callable[[int, Any, Any], tuple[Any, Any]]


# -- storage formats ---------------------------------------------------------------------------------


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


# -- weights, scratch, bad data ----------------------------------------------------------------------


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
    recurrent: tuple[Any, ...] = ()  # RecurrentWeights whose arrays are of the array module
    tok: Any = None  # a DFlash draft's token rows for its unrolled block (reference_dflash)
    # LoRA (reference_lora): per attention layer, toy weight name -> (A, B) of the bound adapter; () for none
    lora: tuple[Mapping[str, tuple[Any, Any]], ...] = ()

    @classmethod
    def of(cls, w: ToyWeights, to: Callable[[np.ndarray], Any]) -> _Weights:
        def conv(a: np.ndarray | None) -> Any:
            return None if a is None else to(np.ascontiguousarray(a, dtype=np.float32))

        def layers(arrays: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
            return tuple(conv(a) for a in arrays)

        recurrent = tuple(dataclasses.replace(r, **{f.name: conv(getattr(r, f.name)) for f in dataclasses.fields(r)
                                                    if f.name != "kind"}) for r in w.recurrent)
        return cls(wq=layers(w.wq), wk=layers(w.wk), wv=layers(w.wv), wo=layers(w.wo), w1=layers(w.w1),
                   w2=layers(w.w2), we=conv(w.we), wh=conv(w.wh), wd=conv(w.wd), w_lm=conv(w.w_lm),
                   recurrent=recurrent, tok=conv(w.tok))


class _NoScratch:
    """numpy allocates as it likes: marks and releases are no-ops."""

    def mark(self) -> int:
        return 0

    def release(self, mark: int) -> None:
        pass


class _DataError(InvalidValueError):
    """Data an engine cannot use (checked steps only); the context names itself and the call."""


def _check_range(what: str, values: np.ndarray, lo: int, hi: int, rule: str) -> None:
    """Checked steps: data outside ``[lo, hi)`` raises, naming the first bad entry."""
    bad = np.argwhere((values < lo) | (values >= hi))
    if bad.size:
        where = tuple(int(i) for i in bad[0])
        raise _DataError(f"{what}{list(where)} = {int(values[where])} breaks {rule}")


# -- the parts both contracts share ----------------------------------------------------------------


def _rope(xp: Any, rows: Any, r: int) -> Callable[[Any], Any]:
    """Rotate-half RoPE of ``[N, S, heads, D]`` arrays with each position's ``[cos | sin]`` row of ``rows``
    (``[N, S, R]`` float32); dims ``R..D`` are left as they are."""
    half = r // 2
    cos = rows[:, :, None, :half]
    sin = rows[:, :, None, half:r]

    def apply(t: Any) -> Any:
        t1, t2 = t[..., :half], t[..., half:r]
        return xp.concatenate([t1 * cos - t2 * sin, t2 * cos + t1 * sin, t[..., r:]], axis=-1)

    return apply


def _tree_seen(xp: Any, words: Any, rel: Any, rows: int) -> Any:
    """Which key slots each in-flight row sees through its packed mask: ``[N, S, K]`` bool.

    ``words`` int32 ``[N, S, w]``: bit ``i % 32`` of word ``i // 32`` of row ``s`` is set iff row ``s``
    sees in-flight row ``i``; ``rel`` ``[N, K]``: the in-flight row a key slot holds (outside
    ``0 .. rows - 1``, and past the mask's bits: none).
    """
    n, s = words.shape[0], words.shape[1]
    nbits = 32 * words.shape[2]
    in_flight = (rel >= 0) & (rel < rows) & (rel < nbits)
    rel_c = xp.clip(rel, 0, nbits - 1)
    seq_idx = xp.arange(n, dtype=xp.int64)[:, None, None]
    row_idx = xp.arange(s, dtype=xp.int64)[None, :, None]
    word = words[seq_idx, row_idx, (rel_c // 32)[:, None, :]]  # [N, S, K]
    # An arithmetic shift keeps bit k of the word at bit 0, also for negative (bit 31) words.
    return in_flight[:, None, :] & (((word >> (rel_c % 32)[:, None, :]) & 1) == 1)


def _input_stream(xp: Any, mm: Callable[[Any, Any], Any], g: _Geometry, w: _Weights,
                  rows: Callable[[str, int], Any]) -> Any:
    """The residual stream entering layer 0 (float32 ``[N, S, H]``): the embeddings, or for a draft
    ``inputs_embeds @ we + hidden_states_input @ wh + hidden_states_from_draft @ wd``. ``rows(name, width)``
    loads an activation input as ``[N, S, width]`` float32."""
    x = rows(names.kInputsEmbeds, g.h)
    if g.role == "draft":
        x = (mm(x, w.we) + mm(rows(names.kBaseModelHiddenStates, g.hb), w.wh)
             + mm(rows(names.kDraftModelHiddenStates, g.h), w.wd))
    return x


def _attend(xp: Any, mm: Callable[[Any, Any], Any], g: _Geometry, q: Any, keys: Any, values: Any,
            visible: Any) -> Any:
    """Grouped-query attention: ``q`` [N, S, Hq, D] over ``keys`` / ``values`` [N, Hkv, K, D] (float32, as
    stored), ``visible`` [N, S, K] bool; returns [N, S, Hq*D].

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


def _no_all_reduce(partial: Any) -> Any:
    return partial


def _run_layers(xp: Any, mm: Callable[[Any, Any], Any], g: _Geometry, w: _Weights, x: Any,
                rope: Callable[[Any], Any], kv: KVUpdate, visible: Any, deepstack: Callable[[int], Any],
                after_layer: Callable[[int, Any], None], scratch: Any,
                all_reduce: Callable[[Any], Any] = _no_all_reduce,
                recurrent: Callable[[int, Any], Any] | None = None) -> Any:
    """The layer loop of ``docs/toy-model.md`` over ``x`` (float32 ``[N, S, H]``), for either contract.

    Per layer: Q/K/V projections, RoPE on Q and K (``rope``), the new K/V written and the visible ones read
    (``kv``), attention over the keys ``visible`` [N, S, K] allows, the MLP, the deepstack feature of the
    first ``num_deepstack_features`` layers (``deepstack(layer)``), then ``after_layer(i, x)`` (``i``: the decoder
    layer's index, recurrent layers counted; called after a recurrent layer too). Returns
    the final stream. After each layer the stream is kept in one buffer and the layer's scratch is handed
    back (stream order makes the reuse safe), so a step's scratch does not grow with the layer count.

    A tensor-parallel rank holds some of the heads and of the MLP's width (``w`` is its share):
    ``all_reduce`` sums the attention output's and the MLP's partial products over the ranks before each is
    added to the stream, as Edge-LLM's AllReducePlugin does after ``o_proj`` and ``down_proj``.

    A hybrid model (``g.types``) runs its mixers in order: attention layer ``l`` as above, recurrent layer ``j``
    through ``recurrent(j, x)`` (its output, added to the stream; it reads and writes its slots' state itself).
    """
    n, s = x.shape[0], x.shape[1]
    x_keep = xp.empty((n, s, g.h), dtype=xp.float32)
    layer_mark = scratch.mark()
    types = g.types or ("attention",) * g.layers
    layer = -1
    j = -1
    for kind in types:
        if kind != "attention":
            assert recurrent is not None
            j += 1
            x = x + recurrent(j, x)
            after_layer(layer + j + 1, x)
            x_keep[...] = x
            x = x_keep
            scratch.release(layer_mark)
            continue
        layer += 1
        if w.lora and w.lora[layer]:  # x @ W + (x @ A) @ B for each module the adapter changes
            lora = w.lora[layer]
            q = rope(_lin(mm, x, w.wq[layer], lora.get("wq")).reshape(n, s, g.hq, g.d))
            k = rope(_lin(mm, x, w.wk[layer], lora.get("wk")).reshape(n, s, g.hkv, g.d))
            v = _lin(mm, x, w.wv[layer], lora.get("wv")).reshape(n, s, g.hkv, g.d)
            keys, values = kv(layer, k, v)
            x = x + all_reduce(_lin(mm, _attend(xp, mm, g, q, keys, values, visible), w.wo[layer], lora.get("wo")))
            x = x + all_reduce(_lin(mm, xp.maximum(_lin(mm, x, w.w1[layer], lora.get("w1")), 0.0), w.w2[layer],
                                    lora.get("w2")))
        else:
            q = rope(mm(x, w.wq[layer]).reshape(n, s, g.hq, g.d))
            k = rope(mm(x, w.wk[layer]).reshape(n, s, g.hkv, g.d))
            v = mm(x, w.wv[layer]).reshape(n, s, g.hkv, g.d)
            keys, values = kv(layer, k, v)
            x = x + all_reduce(mm(_attend(xp, mm, g, q, keys, values, visible), w.wo[layer]))
            x = x + all_reduce(mm(xp.maximum(mm(x, w.w1[layer]), 0.0), w.w2[layer]))
        if layer < g.nd:
            x = x + deepstack(layer)
        after_layer(layer + j + 1, x)  # the decoder layer's index (a hybrid's recurrent layers counted)
        x_keep[...] = x
        x = x_keep
        scratch.release(layer_mark)
    return x


def _lin(mm: Callable[[Any, Any], Any], x: Any, wt: Any, pair: tuple[Any, Any] | None) -> Any:
    """``x @ wt``, plus ``(x @ A) @ B`` where a LoRA adapter changes the module."""
    y = mm(x, wt)
    return y if pair is None else y + mm(mm(x, pair[0]), pair[1])


def _no_capture(layer: int, x: Any) -> None:
    pass


# -- the batch-major contract ----------------------------------------------------------------------


def _forward(xp: Any, mm: Callable[[Any, Any], Any], g: _Geometry, w: _Weights, io: Mapping[str, Any],
             tree: bool, scratch: Any, *, checked: bool) -> None:
    """One engine call of the batch contract (``docs/toy-model.md``) on the arrays ``io`` (views of the
    bound memory): writes ``logits``, ``hidden_states`` and the new K/V rows of every cache in place.

    ``mm`` is the matrix product (``numpy.matmul``; on the GPU a kernel, because CuPy refuses cuBLAS calls
    while a stream is captured). ``checked``: data that would index out of range raises, else it is clipped.
    """
    emb = io[names.kInputsEmbeds]
    batch, seq, _ = emb.shape
    c, d, hkv = g.cap, g.d, g.hkv

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
        seen = _tree_seen(xp, io[names.kAttentionMask], slots[None, :] - start[:, None], seq)  # [B, S, C]
        visible = below_ctx & ((slots[None, :] < start[:, None])[:, None, :] | seen)
    else:
        pos = write
        visible = below_ctx & (slots[None, None, :] <= write[:, :, None])

    if checked:
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
    rope_rows = table[0][pos] if table.shape[0] == 1 else table[b_idx[:, None], pos]  # [B, S, R]

    # Flat row of cache[b, h, slot] in a [B*Hkv*C, D] view: where KVCacheUpdate writes token (b, s).
    cache_rows = ((b_idx[:, None, None] * hkv + xp.arange(hkv, dtype=xp.int64)[None, None, :]) * c
                  + write[:, :, None]).reshape(-1)
    # Slots no query sees may hold anything (fresh cudaMalloc memory, NaN included): 0 * NaN is NaN,
    # so their values are zeroed before the probability-weighted sum rather than trusted.
    slot_used = visible.any(axis=1)[:, None, :, None]  # [B, 1, C, 1]

    def kv(layer: int, k: Any, v: Any) -> tuple[Any, Any]:
        k_cache = io[names.k_cache(layer)]  # raw [B, Hkv, C, D]
        v_cache = io[names.v_cache(layer)]
        k_cache.reshape(-1, d)[cache_rows] = _store(xp, k.reshape(-1, d), g.kv)
        v_cache.reshape(-1, d)[cache_rows] = _store(xp, v.reshape(-1, d), g.kv)
        keys = _load(xp, k_cache[:batch], g.kv)  # as stored (a fixed-batch cache: its first rows)
        return keys, xp.where(slot_used, _load(xp, v_cache[:batch], g.kv), 0.0)

    def activations(name: str, width: int) -> Any:
        return _load(xp, io[name], g.act)

    x = _input_stream(xp, mm, g, w, activations)
    x = _run_layers(xp, mm, g, w, x, _rope(xp, rope_rows, g.r), kv, visible,
                    lambda layer: activations(names.deepstack_embeds(layer), g.h), _no_capture, scratch)
    io[names.kOutputHiddenStates][...] = _store(xp, x, g.act)
    chosen = x[b_idx[:, None], last].reshape(batch * select, g.h)
    io[names.kLogits][...] = mm(chosen, w.w_lm)


# -- Edge-LLM 0.11's token-major contract ----------------------------------------------------------


def _scatter_rows_host(target: np.ndarray, index: np.ndarray, rows: np.ndarray) -> None:
    """``target[index[i]] = rows[i]`` for every ``index[i] >= 0`` (rows of -1 are written nowhere)."""
    keep = index >= 0
    target[index[keep]] = rows[keep]


def _log_softmax(xp: Any, z: Any) -> Any:
    z = z - z.max(axis=-1, keepdims=True)
    return z - xp.log(xp.exp(z).sum(axis=-1, keepdims=True))


def _check_offsets(io: Mapping[str, Any], ql: np.ndarray, n: int, width: int) -> None:
    """A checked ragged step's entry padding: ``query_start_offsets[i] = i * W``, query lengths within W."""
    offsets = io[names.kQueryStartOffsets].astype(np.int64)
    bad = np.flatnonzero(offsets != np.arange(n + 1) * width)
    if bad.size:
        i = int(bad[0])
        raise _DataError(f"query_start_offsets[{i}] = {int(offsets[i])} breaks entry padding "
                         f"(offset i*W = {i * width}; W = T/S = {width})")
    _check_range("query_lengths", ql, 0, width + 1, f"0 <= query length <= W ({width})")


def _check_rows(g: _Geometry, phase: int, width: int, valid: np.ndarray, write: np.ndarray,
                lengths: np.ndarray | None, picks: np.ndarray, t: int) -> None:
    """A checked ragged step's rows: each valid row's KV slot within a page-table row, a tree phase's attention
    lengths (``lengths``: W for a sequence without rows) and the logits rows within the step."""
    lk = g.seq_slots
    _check_range("past_lengths[s] + j at valid row [s, j] ", np.where(valid, write, 0), 0, lk,
                 f"0 <= slot < the {g.seq_pages} pages x {g.page} slots of a page-table row ({lk})")
    if lengths is not None:
        _check_range("attention_sequence_lengths", lengths, width, lk + 1,
                     f"W ({width}) <= length <= {lk} in phase {phase} (the in-flight rows sit at "
                     f"slots length - W ..)")
    _check_range("logits_indices", picks, 0, t, f"0 <= row < T ({t})")


def _ragged_outputs(xp: Any, mm: Callable[[Any, Any], Any], g: _Geometry, w: _Weights, io: Mapping[str, Any],
                    final: Any, picks: Any, hidden_out: Any) -> None:
    """A ragged step's outputs from the final stream ``[T, H]``: the logits of the rows ``picks`` (a draft's
    log-softmaxed, with their hidden rows), and a base's hidden states where it writes them whole."""
    chosen = final[picks]  # [R, H]
    logits = mm(chosen, w.w_lm)
    if g.role == "draft":
        logits = _log_softmax(xp, logits)
        io[names.kOutputHiddenStates][...] = _store(xp, chosen, g.act)
    elif hidden_out is not None and not g.eagle:
        hidden_out[...] = _store(xp, final, g.act)
    io[names.kLogits][...] = logits


def _ragged_visible(xp: Any, io: Mapping[str, Any], tree: bool, valid: Any, write: Any, asl: Any,
                    slots: Any) -> Any:
    """Which KV slots each row of a ragged step sees ``[S, W, Lk]``: a valid row sees the committed slots and, in a
    tree phase, the in-flight rows its packed mask names (they sit at ``length - W ..``); else the slots up to its
    own, below the sequence's attention length."""
    n, width = valid.shape
    if tree:
        prefix = asl - width  # [S]: committed slots; the W in-flight rows follow them
        words = io[names.kPackedAttentionMask].reshape(n, width, -1)  # int32 [S, W, w]
        seen = _tree_seen(xp, words, slots[None, :] - prefix[:, None], width)  # [S, W, Lk]
        return valid[:, :, None] & ((slots[None, :] < prefix[:, None])[:, None, :] | seen)
    return valid[:, :, None] & (slots[None, None, :] <= write[:, :, None]) & (slots[None, None, :] < asl[:, None, None])


def _forward_ragged(xp: Any, mm: Callable[[Any, Any], Any], scatter: Callable[[Any, Any, Any], None],
                    g: _Geometry, w: _Weights, io: Mapping[str, Any], phase: int, scratch: Any, *,
                    checked: bool, all_reduce: Callable[[Any], Any] = _no_all_reduce) -> None:
    """One step of Edge-LLM 0.11's token-major contract (``docs/toy-model.md``, "A step").

    ``T`` rows are ``S`` sequences of ``W`` rows (entry padding), so the layers run on ``[S, W, ...]``
    views. K/V go through the page table: each layer's pool is viewed as ``[2P * page, Hkv * D]`` rows;
    valid rows scatter into it (``scatter`` skips index -1: padding rows write nothing), and each sequence
    gathers all ``M * page`` slots its page-table row addresses. ``phase`` is the extent of
    ``execution_phase_marker`` (validated). Unchecked, a sequence that touches an unmapped or out-of-pool
    page computes NaN and writes nothing (module docstring). ``all_reduce``: a tensor-parallel rank's
    (:func:`_run_layers`).
    """
    i64 = xp.int64
    t = io[names.kInputsEmbeds].shape[0]
    ql = io[names.kQueryLengths].astype(i64)
    n = ql.shape[0]
    width = t // n
    page, lk, pages2 = g.page, g.seq_slots, 2 * g.pool_pages
    d, hkv, h = g.d, g.hkv, g.h
    tree = phase >= ragged_contract.PHASE_DRAFT
    past = io[names.kPastLengths].astype(i64)
    asl = io[names.kAttentionSequenceLengths].astype(i64)
    table = io[names.kKVPageTable].astype(i64)  # [S, 2, M]: K page ids, V page ids
    picks = io[names.kLogitsIndices].astype(i64)  # [R]
    seq_idx = xp.arange(n, dtype=i64)
    j = xp.arange(width, dtype=i64)
    slots = xp.arange(lk, dtype=i64)

    if checked:
        _check_offsets(io, ql, n, width)
    else:  # the GPU does not look at query_start_offsets: entry padding fixes them to i*W
        ql = xp.clip(ql, 0, width)
    valid = j[None, :] < ql[:, None]  # [S, W]
    write = past[:, None] + j[None, :]  # [S, W]: KV slot of each row (valid rows only)
    has_rows = ql > 0
    if checked:
        _check_rows(g, phase, width, valid, write, np.where(has_rows, asl, width) if tree else None, picks, t)
    # Checked steps have refused whatever these clips would change for a valid row; unchecked ones take them as the
    # answer to bad data. Padding rows are clipped on both and then neither written nor seen.
    write = xp.clip(write, 0, lk - 1)
    picks = xp.clip(picks, 0, t - 1)
    if tree:
        asl = xp.clip(asl, width, lk)
    # Every page a sequence touches: slots below what it writes, and in tree phases below its length.
    # Entries of other pages are never read (-1 included).
    extent = xp.where(has_rows, xp.maximum(asl, past + ql) if tree else past + ql, 0)
    touched = (xp.arange(g.seq_pages, dtype=i64)[None, :] * page < extent[:, None])[:, None, :]  # [S, 1, M]
    if checked:
        _check_range("kv_page_table", np.where(touched, table, 0), 0, pages2,
                     f"0 <= page id < 2 * kv_pool_pages ({pages2}) for every page the step touches")
    unmapped = (touched & ((table < 0) | (table >= pages2))).any(axis=(1, 2))  # [S]; all False when checked
    table = xp.clip(table, 0, pages2 - 1)

    def pool_rows(kind: int, seq: Any, slot: Any) -> Any:
        """Row of the pool viewed [2P * page, Hkv * D] that holds ``slot`` of sequence ``seq``."""
        return table[seq, kind, slot // page] * page + slot % page

    writes = valid & ~unmapped[:, None]  # a sequence with a bad page writes nothing
    dst_k = xp.where(writes, pool_rows(0, seq_idx[:, None], write), -1).reshape(-1)  # [T]
    dst_v = xp.where(writes, pool_rows(1, seq_idx[:, None], write), -1).reshape(-1)
    src_k = pool_rows(0, seq_idx[:, None], slots[None, :]).reshape(-1)  # [S * Lk]
    src_v = pool_rows(1, seq_idx[:, None], slots[None, :]).reshape(-1)

    visible = _ragged_visible(xp, io, tree, valid, write, asl, slots)
    # Slots no valid row sees may hold anything (other sequences' pages, NaN): zero their values.
    slot_used = visible.any(axis=1).reshape(n * lk, 1)

    def kv(layer: int, k: Any, v: Any) -> tuple[Any, Any]:
        pool = io[names.past_key_values(layer)].reshape(pages2 * page, hkv * d)  # raw storage, in place
        scatter(pool, dst_k, _store(xp, k.reshape(t, hkv * d), g.kv))
        scatter(pool, dst_v, _store(xp, v.reshape(t, hkv * d), g.kv))
        keys = _load(xp, pool[src_k], g.kv).reshape(n, lk, hkv, d).transpose(0, 2, 1, 3)
        values = xp.where(slot_used, _load(xp, pool[src_v], g.kv), 0.0).reshape(n, lk, hkv, d).transpose(0, 2, 1, 3)
        return keys, values

    def activations(name: str, width_: int) -> Any:
        return _load(xp, io[name], g.act).reshape(n, width, width_)

    hidden_out = io[names.kOutputHiddenStates] if g.role == "base" else None

    def capture(layer: int, x: Any) -> None:
        """An EAGLE3 base's hidden_states: the stream after each layer it lists, side by side."""
        if hidden_out is not None:
            for col, captured in enumerate(g.eagle):
                if captured == layer:
                    hidden_out[:, col * h:(col + 1) * h] = _store(xp, x.reshape(t, h), g.act)

    x = _input_stream(xp, mm, g, w, activations)
    x = xp.where(unmapped[:, None, None], xp.float32(np.nan), x)
    rope_rows = io[names.kRopeCosSin].reshape(n, width, -1)  # float32 [S, W, R]: each row its own
    rope = _rope(xp, rope_rows, g.r)  # by the rows given, use_rope or not: the table decides, as in the plugin
    recurrent = _recurrent_layers(xp, mm, g, w, io, valid, scratch, checked=checked,
                                  verify=phase == ragged_contract.PHASE_VERIFY) if g.types else None
    x = _run_layers(xp, mm, g, w, x, rope, kv, visible,
                    lambda layer: activations(names.deepstack_embeds(layer), h), capture, scratch, all_reduce,
                    recurrent)

    _ragged_outputs(xp, mm, g, w, io, x.reshape(t, h), picks, hidden_out)


def _recurrent_layers(xp: Any, mm: Callable[[Any, Any], Any], g: _Geometry, w: _Weights, io: Mapping[str, Any],
                      valid: Any, scratch: Any, *, checked: bool, verify: bool = False) -> Callable[[int, Any], Any]:
    """A hybrid step's recurrent layers (``docs/toy-model.md``, "Hybrid models"): ``layer(j, x)`` runs recurrent layer
    ``j`` over ``x`` ([S, W, H] float32), token column by token column, from the state rows of each sequence's slot
    (``state_indices``) and writes them back; padding rows leave the states as they were. Checked steps refuse a slot
    outside the pools or given to two sequences; unchecked ones clip it.

    A spec-decode base's verify (``verify``, an engine declaring ``intermediate_conv_state_j``): the tokens are a
    chain, each token's states are written to its row of ``intermediate_conv_state_j`` /
    ``intermediate_recurrent_state_j`` and the pools are left as they were ("snapshot" mode: accept commits the
    accepted token's row; ``docs/edgellm-assumptions.md`` §11). On a tree base (``mtp_tree_base`` /
    ``dflash_tree_base``) the tokens are a tree: each runs from its parent's states (``tree_parent_ids``: a node of the
    sequence, -1 for the slot's); as Edge-LLM's DDTree plugins do, each node's conv window goes to its row of
    ``intermediate_conv_state_j``, but a Gated DeltaNet layer writes no state: sequence ``s``'s rows of
    ``intermediate_recurrent_state_j`` hold at their head the replay stash (:func:`_write_stash`) and NaN after it,
    and accept replays the stash along the accepted path."""
    slots = io[names.kStateIndices].astype(xp.int64)  # [S]
    n, width = valid.shape
    rows = io[names.conv_state(0)].shape[0]
    if checked:
        _check_range("state_indices", slots, 0, rows, f"0 <= slot < the {rows} rows of the state pools")
        if np.unique(slots).size != slots.size:
            raise _DataError(f"state_indices {slots.tolist()} gives one slot to two sequences of the step")
    else:
        slots = xp.clip(slots, 0, rows - 1)

    def round_to(dtype: DType) -> Callable[[Any], Any]:
        return lambda a: _load(xp, _store(xp, a, dtype), dtype)

    round_conv, round_state = round_to(g.conv_dtype), round_to(g.state_dtype)
    snapshots = verify and names.intermediate_conv_state(0) in io
    parents = None
    if snapshots and g.tree_base:  # each node from its parent's states: [S, W] parent columns, -1 the slot's
        parents = xp.asarray(io[names.kTreeParentIds]).astype(xp.int64).reshape(n, width)
        if checked:
            below = xp.where(valid, parents - xp.arange(width)[None, :], -1)  # a parent precedes its children
            _check_range("tree_parent_ids", xp.where(valid, parents, -1), -1, width, "-1 or a node of the sequence")
            _check_range("tree_parent_ids - the node's column", below, -width - 1, 0, "a parent before its child")

    def layer(j: int, x: Any) -> Any:
        conv_pool, state_pool = io[names.conv_state(j)], io[names.recurrent_state(j)]
        conv = _load(xp, conv_pool[slots], g.conv_dtype)  # [S, C, K] float32: new arrays, kept across tokens
        state = _load(xp, state_pool[slots], g.state_dtype)
        out = xp.empty((n, width, g.h), dtype=xp.float32)
        stash = parents is not None and w.recurrent[j].kind == "gated_deltanet"  # Edge-LLM's stateless tree verify
        if snapshots:  # every row's states after its token, [S, W, ...] views of the step's outputs
            inter_conv = io[names.intermediate_conv_state(j)].reshape(n, width, *conv.shape[1:])
            inter_state = io[names.intermediate_recurrent_state(j)].reshape(n, width, *state.shape[1:])
        if parents is not None:  # a tree's root states (made before the mark: a column's temporaries go after it)
            start_conv, start_state, seqs = conv.copy(), state.copy(), xp.arange(n)
        if stash:  # each node's recurrent state kept here (the step's outputs get the stash instead)
            node_states = xp.empty((n, width, *state.shape[1:]), dtype=xp.float32)
            inter_state[...] = xp.float32(np.nan)  # the plugin's scratch: no state anywhere in these rows
        token_mark = scratch.mark()
        for col in range(width):
            if parents is not None and col:  # the parent's states: a node written before (its row), or the slot's
                par = parents[:, col]
                up = xp.clip(par, 0, width - 1)
                root = (par < 0)[:, None, None]
                conv[...] = xp.where(root, start_conv, _load(xp, inter_conv[seqs, up], g.conv_dtype))
                above = node_states[seqs, up] if stash else _load(xp, inter_state[seqs, up], g.state_dtype)
                state[...] = xp.where(root[..., None], start_state, above)
            fields: list[Any] | None = [] if stash else None
            y, new_conv, new_state = recurrent_token(xp, mm, w.recurrent[j], x[:, col], conv, state, round_conv,
                                                     round_state, fields)
            keep = valid[:, col]
            conv[...] = xp.where(keep[:, None, None], new_conv, conv)
            state[...] = xp.where(keep[:, None, None, None], new_state, state)
            out[:, col] = y
            if snapshots:  # every row's states after its token (a padding row's: its sequence's last)
                inter_conv[:, col] = _store(xp, conv, g.conv_dtype)
                if stash:
                    node_states[:, col] = state
                    _write_stash(xp, inter_state, col, fields)
                else:
                    inter_state[:, col] = _store(xp, state, g.state_dtype)
            scratch.release(token_mark)  # a token's temporaries: the next one reuses their scratch
        if not snapshots:
            conv_pool[slots] = _store(xp, conv, g.conv_dtype)
            state_pool[slots] = _store(xp, state, g.state_dtype)
        return out

    return layer


def _write_stash(xp: Any, inter_state: Any, col: int, fields: Any) -> None:
    """Node ``col``'s cell of each sequence's replay stash, as Edge-LLM's chunk-form tree verify writes it
    (``gdnTreeChunkKernels.{h,cu}``, ``stashOffsets``): sequence ``s``'s rows of ``intermediate_recurrent_state_j``
    (``inter_state[s]``, [W, Hh, D1, D2] FP32) seen as bytes, node ``n``'s cell ``n * cell`` bytes from their start,
    packed ``[L2-normalised k FP32 Hk x D1 | gate FP32 Hh | beta FP32 Hh | v FP16 Hh x D2]``. ``fields``: what
    :func:`~trtio.testing.toy_model.recurrent_token` gave for the node (keys, gate, beta, values)."""
    k, gate, beta, v = fields
    n = inter_state.shape[0]
    parts = [k.astype(xp.float32).reshape(n, -1), gate.astype(xp.float32).reshape(n, -1),
             beta.astype(xp.float32).reshape(n, -1), v.astype(xp.float16).reshape(n, -1)]
    raw = [xp.ascontiguousarray(p).view(xp.uint8) for p in parts]
    cell = sum(r.shape[1] for r in raw)
    region = inter_state.reshape(n, -1).view(xp.uint8)
    at = col * cell
    for r in raw:
        region[:, at:at + r.shape[1]] = r
        at += r.shape[1]
