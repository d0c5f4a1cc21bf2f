"""The toy Gemma 4 model: one step of Edge-LLM 0.11's token-major contract with Gemma 4's bindings, on numpy.

Its layers are ``docs/toy-model.md``'s with Gemma 4's five features (``docs/edgellm-assumptions.md`` §10):

* each attention layer ``l`` has its own KV heads and head dim (``cfg.gemma4``), its weights drawn for them;
* a sliding layer sees keys at most ``W - 1`` positions back (``pos - key < W``) and reads and writes its pool
  through ``swa_kv_page_table``; with ``swa_kv_cache_mode`` of length 1 (bounded) a row whose page is unmapped is
  not stored (it is behind the window of the step's end) and the step's own rows are read from the step itself
  (Edge-LLM's "transient current K/V"), so a step never needs a page behind its window;
* sliding layers rotate with ``rope_rotary_cos_sin_sliding``, full layers with ``rope_rotary_cos_sin_full``;
* a KV-sharing consumer computes no K/V: it reads its own ``past_key_values_l`` binding (which the runtime binds
  to its donor's pool) and the donor's K/V of the step's rows, and writes nothing;
* after layer ``l`` the stream takes ``ple_token_embeds_l @ w_ple[l]`` (per-layer embeddings).

:func:`gemma4_forward` computes one step on a dict of numpy arrays (the engine's bindings, pools written in
place), on numpy (the host device, ``checked``: data the step cannot use raises) or CuPy (the GPU: every product
one plain kernel, ``mm``, and the pool writes another, ``scatter``, so an execute can be captured into a CUDA
graph; nothing synchronises the host, so bad data is not raised: a sequence that reads a page it needs unmapped, or
writes an unmapped page of a full-storage table, computes NaN and writes nothing, as ``reference_math``'s ragged
step does). Only phases 1-3 (prefill, restored prefill, decode) exist: trtio binds no speculative Gemma 4 phase.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio import names
from trtio.errors import InvalidValueError
from trtio.testing.reference_math import _NoScratch, _scatter_rows_host

__all__ = ["Gemma4Weights", "gemma4_forward", "toy_ple_embedding"]


def _draw(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@dataclass(frozen=True)
class Gemma4Weights:
    """Per layer ``wq [H, Hq*d]``, ``wk`` / ``wv [H, Hkv*d]``, ``wo [Hq*d, H]``, ``w1 [H, 2H]``, ``w2 [2H, H]``,
    ``w_ple [ple, H]`` (none without PLE); ``w_lm [H, V]``. Drawn in that order from ``default_rng(seed)``."""

    wq: tuple[np.ndarray, ...]
    wk: tuple[np.ndarray, ...]
    wv: tuple[np.ndarray, ...]
    wo: tuple[np.ndarray, ...]
    w1: tuple[np.ndarray, ...]
    w2: tuple[np.ndarray, ...]
    w_ple: tuple[np.ndarray, ...]
    w_lm: np.ndarray

    @classmethod
    def generate(cls, cfg: Any, seed: int = 0) -> Gemma4Weights:
        g = cfg.gemma4
        h, hq = int(cfg.hidden_size), int(cfg.num_attention_heads)
        rng = np.random.default_rng(seed)
        out: dict[str, list[np.ndarray]] = {k: [] for k in ("wq", "wk", "wv", "wo", "w1", "w2", "w_ple")}
        for layer in range(g.num_layers):
            d, hkv = g.head_dims[layer], g.kv_heads[layer]
            out["wq"].append(_draw(rng, (h, hq * d), 1.0 / math.sqrt(h)))
            out["wk"].append(_draw(rng, (h, hkv * d), 1.0 / math.sqrt(h)))
            out["wv"].append(_draw(rng, (h, hkv * d), 1.0 / math.sqrt(h)))
            out["wo"].append(_draw(rng, (hq * d, h), 0.5 / math.sqrt(hq * d)))
            out["w1"].append(_draw(rng, (h, 2 * h), 1.0 / math.sqrt(h)))
            out["w2"].append(_draw(rng, (2 * h, h), 0.5 / math.sqrt(2 * h)))
            if g.has_ple:
                out["w_ple"].append(_draw(rng, (g.ple_hidden, h), 1.0 / math.sqrt(g.ple_hidden)))
        w_lm = _draw(rng, (h, int(cfg.output_vocab_size)), 1.0 / math.sqrt(h))
        return cls(**{k: tuple(v) for k, v in out.items()}, w_lm=w_lm)

    def to(self, convert: Callable[[np.ndarray], Any]) -> Gemma4Weights:
        """The same weights, each array converted (``cupy.asarray``: on the GPU)."""
        layers: dict[str, Any] = {f.name: tuple(convert(a) for a in getattr(self, f.name))
                                  for f in dataclasses.fields(self) if f.name != "w_lm"}
        return Gemma4Weights(**layers, w_lm=convert(self.w_lm))


def toy_ple_embedding(cfg: Any, seed: int = 0) -> np.ndarray:
    """The toy per-layer embedding table (``ple_embedding.safetensors``' ``"weight"``): float16 ``[vocab, L x
    ple_hidden]``, drawn from its own generator (``default_rng(seed + 7927)``) so it never shifts the weights."""
    g = cfg.gemma4
    rng = np.random.default_rng(int(seed) + 7927)
    return rng.standard_normal((int(cfg.vocab_size), g.ple_layers * g.ple_hidden), dtype=np.float32).astype(np.float16)


def _rope(xp: Any, x: Any, rows: Any) -> Any:
    """Rotate-half RoPE of ``x`` [S, W, heads, D] with ``rows`` [S, W, R] (``[cos | sin]``); dims R.. unrotated."""
    r = rows.shape[-1]
    half = r // 2
    cos, sin = rows[:, :, None, :half], rows[:, :, None, half:r]
    x1, x2 = x[..., :half], x[..., half:r]
    return xp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., r:]], axis=-1)


def _attend(xp: Any, mm: Callable[[Any, Any], Any], q: Any, keys: Any, values: Any, visible: Any) -> Any:
    """``q`` [S, W, Hq, d] over ``keys`` / ``values`` [S, K, Hkv, d] where ``visible`` [S, W, K]; [S, W, Hq*d]."""
    s, w, hq, d = q.shape
    hkv = keys.shape[2]
    f32 = xp.float32
    k = xp.ascontiguousarray(xp.repeat(keys, hq // hkv, axis=2).transpose(0, 2, 3, 1))  # [S, Hq, d, K]
    v = xp.ascontiguousarray(xp.repeat(values, hq // hkv, axis=2).transpose(0, 2, 1, 3))  # [S, Hq, K, d]
    scores = mm(xp.ascontiguousarray(q.transpose(0, 2, 1, 3)), k) / f32(math.sqrt(d))  # [S, Hq, W, K]
    scores = xp.where(visible[:, None], scores, f32(-np.inf))
    top = scores.max(axis=-1, keepdims=True)
    seen = xp.isfinite(top)
    p = xp.where(seen, xp.exp(scores - xp.where(seen, top, f32(0))), f32(0))
    p = p / xp.where(seen, p.sum(axis=-1, keepdims=True), f32(1))
    return mm(p, v).transpose(0, 2, 1, 3).reshape(s, w, hq * d).astype(f32)


@dataclass
class _Kind:
    """What every layer of one kind (sliding or full) reads and writes: which slots each row sees ``[S, W, K]``,
    the slots read from the pool ``[S, K]``, their pool rows ``[S, 2, K]`` (K, V) and the pool rows of the step's
    own K and V ``[T]`` each (-1: not stored)."""

    visible: Any
    read: Any
    rows: Any
    dst: tuple[Any, ...]


def _kinds(xp: Any, g: Any, io: Mapping[str, Any], bounded: bool, page: int, valid: Any, pos: Any, causal: Any,
           in_flight: Any, slots: Any, checked: bool) -> tuple[dict[bool, _Kind], Any]:
    """Each layer kind's :class:`_Kind`, and which sequences touch a page they must not ([S] bool; all False
    when ``checked``: those raise, naming the table, layer, sequence and slot)."""
    i64 = xp.int64
    n, width = valid.shape
    seq = xp.arange(n, dtype=i64)[:, None]
    window = int(g.sliding_window)
    out: dict[bool, _Kind] = {}
    bad = xp.zeros(n, dtype=bool)
    for sliding in sorted({g.is_sliding(layer) for layer in range(g.num_layers)}):
        layer = next(i for i in range(g.num_layers) if g.is_sliding(i) == sliding)
        name = names.kSwaKVPageTable if sliding else names.kKVPageTable
        table = io[name].astype(i64)  # [S, 2, M]
        m = table.shape[2]
        pages2 = 2 * io[names.past_key_values(layer)].shape[1]  # K pages, then V pages (a V id is its K id + P)
        visible = causal & ((pos[:, :, None] - slots[None, None, :]) < window) if sliding and window else causal
        read = visible.any(axis=1) & ~in_flight  # [S, K]: past slots a valid row sees; the step's own come from it
        ids = table[:, :, slots // page]  # [S, 2, K]
        miss = read[:, None, :] & ((ids < 0) | (ids >= pages2))
        at = xp.clip(pos // page, 0, m - 1)
        wid = xp.stack([table[seq, 0, at], table[seq, 1, at]])  # [2, S, W]: the page of each row's slot
        unstored = valid[None] & ((wid < 0) | (wid >= pages2))
        must_store = not (bounded and sliding)  # a bounded window does not store rows behind the step's end
        if checked:
            if miss.any():
                s, kind, slot = (int(a[0]) for a in np.nonzero(miss))
                raise InvalidValueError(f"{name}: layer {layer} reads slot {slot} of sequence {s}, whose page id "
                                        f"{int(ids[s, kind, slot])} is unmapped or outside the {pages2} pages of "
                                        f"{names.past_key_values(layer)}")
            if must_store and unstored.any():
                kind, s, r = (int(a[0]) for a in np.nonzero(unstored))
                raise InvalidValueError(f"{name}: layer {layer} writes slot {int(pos[s, r])} of sequence {s} to "
                                        f"unmapped page {int(wid[kind, s, r])}")
        else:
            bad = bad | miss.any(axis=(1, 2))
            if must_store:
                bad = bad | unstored.any(axis=(0, 2))
        rows = xp.clip(ids, 0, pages2 - 1) * page + (slots % page)[None, None, :]
        store = valid & ~unstored.any(axis=0)
        dst = tuple(xp.where(store, wid[c] * page + pos % page, -1) for c in (0, 1))
        out[sliding] = _Kind(visible, read, rows, dst)
    for each in out.values():  # a bad sequence writes nothing (its rows are NaN from the first layer on)
        each.dst = tuple(xp.where(bad[:, None], -1, d).reshape(-1) for d in each.dst)
    return out, bad


def gemma4_forward(cfg: Any, w: Gemma4Weights, io: Mapping[str, Any], *, xp: Any = np,
                   mm: Callable[[Any, Any], Any] | None = None,
                   scatter: Callable[[Any, Any, Any], None] = _scatter_rows_host, scratch: Any = None,
                   checked: bool = True) -> None:
    """One step (see the module docstring) over ``io``: name -> array of every binding (pools ``[2, P, page, Hkv,
    d]`` written in place, ``logits`` written). ``xp``: numpy or CuPy; ``mm``: the matrix product (default
    ``xp.matmul``); ``scatter``: ``target[index[i]] = rows[i]`` for ``index[i] >= 0``; ``scratch``: the GPU's bump
    allocator, released after each layer. ``checked`` (numpy only): data the step cannot use (a slot past a
    page-table row, a page a row must read or write unmapped) raises :class:`InvalidValueError` naming the binding;
    unchecked, such a sequence computes NaN and writes nothing (module docstring)."""
    g = cfg.gemma4
    mm = mm or xp.matmul
    scratch = scratch if scratch is not None else _NoScratch()
    i64, f32 = xp.int64, xp.float32
    page = int(cfg.kv_page_size)
    emb = io[names.kInputsEmbeds].astype(f32)
    t, h = emb.shape
    ql = io[names.kQueryLengths].astype(i64)
    n = ql.shape[0]
    width = t // n
    past = io[names.kPastLengths].astype(i64)
    asl = io[names.kAttentionSequenceLengths].astype(i64)
    bounded = io[names.kSwaKVCacheMode].shape[0] == 1
    lk = io[names.kKVPageTable].shape[2] * page
    j = xp.arange(width, dtype=i64)
    if not checked:
        ql = xp.clip(ql, 0, width)
    valid = j[None, :] < ql[:, None]  # [S, W]
    pos = past[:, None] + j[None, :]  # [S, W]: each row's slot
    if checked and ((np.where(valid, pos, 0) >= lk).any() or (asl > lk).any()):
        raise InvalidValueError(f"past_lengths / attention_sequence_lengths: a slot is past the {lk // page} pages of "
                                "a page-table row")
    pos = xp.clip(pos, 0, lk - 1)  # padding rows (and, unchecked, bad data): neither seen nor stored past here
    # Slots a row may see: up to the longest sequence (checked: the host's work grows with it), all of a row (GPU)
    slots = xp.arange(int(asl.max(initial=1)) if checked else lk, dtype=i64)
    causal = valid[:, :, None] & (slots[None, None, :] <= pos[:, :, None]) & (slots[None, None, :] < asl[:, None, None])
    in_flight = (slots[None, :] >= past[:, None]) & (slots[None, :] < (past + ql)[:, None])  # [S, K]
    kinds, bad = _kinds(xp, g, io, bounded, page, valid, pos, causal, in_flight, slots, checked)
    rel = xp.clip(slots[None, :] - past[:, None], 0, width - 1)  # [S, K]: the step row of an in-flight slot
    seq = xp.arange(n, dtype=i64)[:, None]
    rope = {True: io[names.kRopeCosSinSliding].reshape(n, width, -1),
            False: io[names.kRopeCosSinFull].reshape(n, width, -1)}
    # The donors' K/V of the step's rows, for their consumers: kept across the layers' scratch releases
    step_kv = {d: (xp.empty((n, width, g.kv_heads[d], g.head_dims[d]), dtype=f32),
                   xp.empty((n, width, g.kv_heads[d], g.head_dims[d]), dtype=f32)) for d in set(g.donors) if d >= 0}
    x_keep = xp.empty((n, width, h), dtype=f32)
    x_keep[...] = xp.where(bad[:, None, None], f32(np.nan), emb.reshape(n, width, h))
    x = x_keep
    mark = scratch.mark()
    for layer in range(g.num_layers):
        sliding = g.is_sliding(layer)
        kind = kinds[sliding]
        d, hkv = g.head_dims[layer], g.kv_heads[layer]
        pool = io[names.past_key_values(layer)]  # [2, P, page, Hkv, d]: the donor's for a consumer
        flat = pool.reshape(-1, hkv * d)
        q = _rope(xp, mm(x, w.wq[layer]).reshape(n, width, -1, d), rope[sliding])
        donor = g.donors[layer]
        if donor < 0:
            k = _rope(xp, mm(x, w.wk[layer]).reshape(n, width, hkv, d), rope[sliding])
            v = mm(x, w.wv[layer]).reshape(n, width, hkv, d)
            if layer in step_kv:
                step_kv[layer][0][...] = k
                step_kv[layer][1][...] = v
        else:
            k, v = step_kv[donor]
        keys = xp.where(kind.read[:, :, None], flat[kind.rows[:, 0]].astype(f32), f32(0)).reshape(n, -1, hkv, d)
        values = xp.where(kind.read[:, :, None], flat[kind.rows[:, 1]].astype(f32), f32(0)).reshape(n, -1, hkv, d)
        keys = xp.where(in_flight[:, :, None, None], k[seq, rel], keys)
        values = xp.where(in_flight[:, :, None, None], v[seq, rel], values)
        if donor < 0:  # store the step's rows where their pages are mapped
            scatter(flat, kind.dst[0], k.reshape(t, hkv * d).astype(pool.dtype))
            scatter(flat, kind.dst[1], v.reshape(t, hkv * d).astype(pool.dtype))
        x = x + mm(_attend(xp, mm, q, keys, values, kind.visible), w.wo[layer])
        x = x + mm(xp.maximum(mm(x, w.w1[layer]), f32(0)), w.w2[layer])
        if g.has_ple:
            x = x + mm(io[names.ple_token_embeds(layer)].astype(f32).reshape(n, width, -1), w.w_ple[layer])
        x_keep[...] = x
        x = x_keep
        scratch.release(mark)
    picks = xp.clip(io[names.kLogitsIndices].astype(i64), 0, t - 1)
    io[names.kLogits][...] = mm(x.reshape(t, h)[picks], w.w_lm)
