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
place). Only phases 1-3 (prefill, restored prefill, decode) exist: trtio binds no speculative Gemma 4 phase.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio import names
from trtio.errors import InvalidValueError

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


def toy_ple_embedding(cfg: Any, seed: int = 0) -> np.ndarray:
    """The toy per-layer embedding table (``ple_embedding.safetensors``' ``"weight"``): float16 ``[vocab, L x
    ple_hidden]``, drawn from its own generator (``default_rng(seed + 7927)``) so it never shifts the weights."""
    g = cfg.gemma4
    rng = np.random.default_rng(int(seed) + 7927)
    return rng.standard_normal((int(cfg.vocab_size), g.ple_layers * g.ple_hidden), dtype=np.float32).astype(np.float16)


def _rope(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE of ``x`` [S, W, heads, D] with ``rows`` [S, W, R] (``[cos | sin]``); dims R.. unrotated."""
    r = rows.shape[-1]
    half = r // 2
    cos, sin = rows[:, :, None, :half], rows[:, :, None, half:r]
    x1, x2 = x[..., :half], x[..., half:r]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., r:]], axis=-1)


def _attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """``q`` [S, W, Hq, d] over ``keys`` / ``values`` [S, K, Hkv, d] where ``visible`` [S, W, K]; [S, W, Hq*d]."""
    s, w, hq, d = q.shape
    hkv = keys.shape[2]
    k = np.repeat(keys, hq // hkv, axis=2)
    v = np.repeat(values, hq // hkv, axis=2)
    scores = np.einsum("swhd,skhd->shwk", q, k) / np.float32(math.sqrt(d))
    scores = np.where(visible[:, None], scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    seen = np.isfinite(top)
    p = np.where(seen, np.exp(scores - np.where(seen, top, 0.0)), 0.0)
    p = p / np.where(seen, p.sum(axis=-1, keepdims=True), 1.0)
    out: np.ndarray = np.einsum("shwk,skhd->swhd", p, v).reshape(s, w, hq * d).astype(np.float32)
    return out


def gemma4_forward(cfg: Any, w: Gemma4Weights, io: Mapping[str, np.ndarray]) -> None:
    """One step (see the module docstring) over ``io``: name -> numpy array of every binding (pools
    ``[2, P, page, Hkv, d]`` written in place, ``logits`` written). Raises :class:`InvalidValueError` naming the
    binding for data the step cannot use (an unmapped page a row must read or write, a slot past the table)."""
    g = cfg.gemma4
    page = int(cfg.kv_page_size)
    emb = io[names.kInputsEmbeds].astype(np.float32)
    t, h = emb.shape
    ql = io[names.kQueryLengths].astype(np.int64)
    n = ql.shape[0]
    width = t // n
    past = io[names.kPastLengths].astype(np.int64)
    asl = io[names.kAttentionSequenceLengths].astype(np.int64)
    bounded = io[names.kSwaKVCacheMode].shape[0] == 1
    tables = {False: io[names.kKVPageTable].astype(np.int64), True: io[names.kSwaKVPageTable].astype(np.int64)}
    m = tables[False].shape[2]
    lk = m * page
    j = np.arange(width)
    valid = j[None, :] < ql[:, None]  # [S, W]
    pos = past[:, None] + j[None, :]  # [S, W]: each row's slot
    if (np.where(valid, pos, 0) >= lk).any() or (asl > lk).any():
        raise InvalidValueError(f"past_lengths / attention_sequence_lengths: a slot is past the {m} pages of a "
                                "page-table row")
    slots = np.arange(int(asl.max(initial=1)))  # no row sees a slot at or past its sequence's length
    causal = valid[:, :, None] & (slots[None, None, :] <= pos[:, :, None]) & (slots[None, None, :] < asl[:, None, None])
    in_flight = (slots[None, :] >= past[:, None]) & (slots[None, :] < (past + ql)[:, None])  # [S, K]
    window = int(g.sliding_window) or lk
    rope = {True: io[names.kRopeCosSinSliding].reshape(n, width, -1),
            False: io[names.kRopeCosSinFull].reshape(n, width, -1)}
    x = emb.reshape(n, width, h)
    step_kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # a donor's K/V of the step's rows, for its consumers
    seq = np.arange(n)[:, None]
    for layer in range(g.num_layers):
        sliding = g.is_sliding(layer)
        d, hkv = g.head_dims[layer], g.kv_heads[layer]
        table = tables[sliding]
        pool = io[names.past_key_values(layer)]  # [2, P, page, Hkv, d]: the donor's for a consumer
        pages2 = 2 * pool.shape[1]  # K pages, then V pages (a V id is its K id + P)
        flat = pool.reshape(pages2 * page, hkv, d)
        visible = causal & ((pos[:, :, None] - slots[None, None, :]) < window) if sliding else causal
        q = _rope((x @ w.wq[layer]).reshape(n, width, -1, d), rope[sliding])
        donor = g.donors[layer]
        if donor < 0:
            k = _rope((x @ w.wk[layer]).reshape(n, width, hkv, d), rope[sliding])
            v = (x @ w.wv[layer]).reshape(n, width, hkv, d)
            step_kv[layer] = (k, v)
        else:
            k, v = step_kv[donor]
        # Past slots a valid row sees must be mapped; the step's own rows come from the step.
        read = visible.any(axis=1) & ~in_flight  # [S, K]
        ids = table[:, :, slots // page]  # [S, 2, K]: K and V page ids of each slot
        bad = read[:, None, :] & ((ids < 0) | (ids >= pages2))
        if bad.any():
            s, kind, slot = (int(a[0]) for a in np.nonzero(bad))
            raise InvalidValueError(f"{'swa_kv_page_table' if sliding else 'kv_page_table'}: layer {layer} reads "
                                    f"slot {slot} of sequence {s}, whose page id {int(ids[s, kind, slot])} is unmapped "
                                    f"or outside the {pages2} pages of {names.past_key_values(layer)}")
        rows = np.clip(ids, 0, pages2 - 1) * page + (slots % page)[None, None, :]  # [S, 2, K]
        keys = np.where(read[:, :, None, None], flat[rows[:, 0]].astype(np.float32), 0.0)
        values = np.where(read[:, :, None, None], flat[rows[:, 1]].astype(np.float32), 0.0)
        rel = np.clip(slots[None, :] - past[:, None], 0, width - 1)  # [S, K]: the step row of an in-flight slot
        keys = np.where(in_flight[:, :, None, None], k[seq, rel], keys)
        values = np.where(in_flight[:, :, None, None], v[seq, rel], values)
        if donor < 0:  # store the step's rows where their pages are mapped
            wid = np.stack([table[seq, 0, pos // page], table[seq, 1, pos // page]])  # [2, S, W]
            if not bounded or not sliding:
                miss = valid[None] & ((wid < 0) | (wid >= pages2))
                if miss.any():
                    kind, s, r = (int(a[0]) for a in np.nonzero(miss))
                    raise InvalidValueError(f"kv_page_table: layer {layer} writes slot {int(pos[s, r])} of sequence "
                                            f"{s} to unmapped page {int(wid[kind, s, r])}")
            store = valid & (wid >= 0).all(axis=0) & (wid < pages2).all(axis=0)
            flat[wid[0][store] * page + pos[store] % page] = k[store].astype(pool.dtype)
            flat[wid[1][store] * page + pos[store] % page] = v[store].astype(pool.dtype)
        x = x + _attend(q, keys, values, visible) @ w.wo[layer]
        x = x + np.maximum(x @ w.w1[layer], 0.0) @ w.w2[layer]
        if g.has_ple:
            x = x + io[names.ple_token_embeds(layer)].astype(np.float32).reshape(n, width, -1) @ w.w_ple[layer]
    picks = io[names.kLogitsIndices].astype(np.int64)
    io[names.kLogits][...] = x.reshape(t, h)[picks] @ w.w_lm
