"""The math of a DFlash block draft's step (``docs/toy-model.md``, "DFlash drafts"), numpy and CuPy alike.

One call of Edge-LLM 0.11's ``dflash_draft`` graph, in two parts:

1. the delta (``DFlashTargetKVCacheUpdate``): each row ``i`` with ``dflash_delta_token_to_sequence[i] = s >= 0``
   projects its base features, ``c = dflash_target_hidden_concat[i] @ wh``, and writes every attention layer's
   ``k = rope(c @ wk[l])`` (with its row of ``dflash_delta_rope_cos_sin``) and ``v = c @ wv[l]`` into sequence
   ``s``'s slot ``dflash_delta_positions[i]`` through its ``kv_page_table`` row; rows of -1 write nothing;
2. the block: each sequence's ``W`` rows at slots ``past_lengths[s] + j``, positions their
   ``rope_rotary_cos_sin`` rows, attending to the committed slots (below ``past_lengths``, the delta included) and
   to the block rows its ``packed_attention_mask`` row names; logits (log-softmax) for every row.

The toy draft predicts its block by unrolling it, one column at a time: column ``c``'s stream entering the layers
is ``inputs_embeds[c] @ we``, plus ``tok[g]`` for ``c >= 1`` where ``g`` is column ``c - 1``'s greedy token; it
sits at slot ``past + c`` and sees the committed slots and the columns before it that its mask row names. Column
``c`` guesses the token at position ``past + c + 1``: row ``j >= 1``'s logits are column ``j - 1``'s (the guess
for its own position, as a DFlash draft's), row 0's are column 0's too. (A real DFlash draft predicts its block in
one bidirectional pass; an unrolled toy agrees with its base for most of a block.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from trtio import names
from trtio.families.spec.dflash_bindings import DFLASH_DELTA_INPUTS
from trtio.testing.reference_io import _Geometry
from trtio.testing.reference_math import (
    _check_range,
    _load,
    _log_softmax,
    _rope,
    _run_layers,
    _store,
    _tree_seen,
    _Weights,
)

__all__ = ["forward_dflash"]


def _write_delta(xp: Any, mm: Callable[[Any, Any], Any], scatter: Callable[[Any, Any, Any], None], g: _Geometry,
                 w: _Weights, io: Mapping[str, Any], pool_rows: Callable[[int, Any, Any], Any], n: int, *,
                 checked: bool) -> None:
    """Part 1: the delta rows' K/V written into the draft's pools."""
    i64 = xp.int64
    seq = io[DFLASH_DELTA_INPUTS[2]].astype(i64)
    pos = io[DFLASH_DELTA_INPUTS[1]].astype(i64)
    if checked:
        _check_range(DFLASH_DELTA_INPUTS[2], np.asarray(seq), -1, n, f"-1 <= sequence < the step's {n}")
        _check_range(DFLASH_DELTA_INPUTS[1], np.asarray(np.where(seq >= 0, pos, 0)), 0, g.seq_slots,
                     f"0 <= slot < the {g.seq_slots} slots of a page-table row")
    keep = seq >= 0
    seq_c, pos_c = xp.clip(seq, 0, n - 1), xp.clip(pos, 0, g.seq_slots - 1)
    td, d, hkv = seq.shape[0], g.d, g.hkv
    c = mm(_load(xp, io[names.kDFlashTargetHiddenConcat], g.act), w.wh)  # [Td, H]
    rope = _rope(xp, io[DFLASH_DELTA_INPUTS[0]].reshape(td, 1, -1), g.r)
    dst_k = xp.where(keep, pool_rows(0, seq_c, pos_c), -1)
    dst_v = xp.where(keep, pool_rows(1, seq_c, pos_c), -1)
    for layer in range(g.layers):
        pool = io[names.past_key_values(layer)].reshape(2 * g.pool_pages * g.page, hkv * d)
        k = rope(mm(c, w.wk[layer]).reshape(td, 1, hkv, d))
        scatter(pool, dst_k, _store(xp, k.reshape(td, hkv * d), g.kv))
        scatter(pool, dst_v, _store(xp, mm(c, w.wv[layer]).reshape(td, hkv * d), g.kv))


def forward_dflash(xp: Any, mm: Callable[[Any, Any], Any], scatter: Callable[[Any, Any, Any], None], g: _Geometry,
                   w: _Weights, io: Mapping[str, Any], scratch: Any, *, checked: bool) -> None:
    """One DFlash draft step (see module docstring) on the arrays ``io``; writes ``logits`` and the pools."""
    i64 = xp.int64
    t = io[names.kInputsEmbeds].shape[0]
    n = io[names.kQueryLengths].shape[0]
    width = t // n
    page, lk, pages2 = g.page, g.seq_slots, 2 * g.pool_pages
    past = io[names.kPastLengths].astype(i64)
    table = io[names.kKVPageTable].astype(i64)
    if checked:
        _check_range("past_lengths[s] + W", np.asarray(past) + width, 0, lk + 1,
                     f"a block within the {lk} slots of a page-table row")
        touched = (np.arange(g.seq_pages)[None, :] * page < (np.asarray(past) + width)[:, None])[:, None, :]
        _check_range("kv_page_table", np.where(touched, np.asarray(table), 0), 0, pages2,
                     f"0 <= page id < {pages2} for every page the step touches")
    table = xp.clip(table, 0, pages2 - 1)
    past = xp.clip(past, 0, lk - width)
    seq_idx = xp.arange(n, dtype=i64)
    slots = xp.arange(lk, dtype=i64)

    def pool_rows(kind: int, seq: Any, slot: Any) -> Any:
        return table[seq, kind, slot // page] * page + slot % page

    _write_delta(xp, mm, scatter, g, w, io, pool_rows, n, checked=checked)

    # Part 2: the block, unrolled one column at a time.
    emb = _load(xp, io[names.kInputsEmbeds], g.act).reshape(n, width, g.h)
    rope_rows = io[names.kRopeCosSin].reshape(n, width, -1)
    words = io[names.kPackedAttentionMask].reshape(n, width, -1)
    src_k = pool_rows(0, seq_idx[:, None], slots[None, :]).reshape(-1)
    src_v = pool_rows(1, seq_idx[:, None], slots[None, :]).reshape(-1)
    logits = io[names.kLogits].reshape(n, width, -1)
    guess = xp.zeros(n, dtype=i64)  # each column's greedy tokens, kept across the columns' scratch
    for col in range(max(1, width - 1)):
        column_mark = scratch.mark()
        x = mm(emb[:, col:col + 1], w.we)
        if col:
            x = x + w.tok[guess][:, None, :]
        write = past + col  # [S]
        rel = slots[None, :] - past[:, None]  # [S, Lk]: the block row a slot holds
        seen = _tree_seen(xp, words[:, col:col + 1], rel, width)  # [S, 1, Lk]
        visible = (slots[None, None, :] < past[:, None, None]) | (seen & (rel <= col)[:, None, :])
        used = visible.reshape(n * lk, 1)
        dst_k, dst_v = pool_rows(0, seq_idx, write), pool_rows(1, seq_idx, write)

        def kv(layer: int, k: Any, v: Any, dst_k: Any = dst_k, dst_v: Any = dst_v, used: Any = used) -> Any:
            pool = io[names.past_key_values(layer)].reshape(pages2 * page, g.hkv * g.d)
            scatter(pool, dst_k, _store(xp, k.reshape(n, -1), g.kv))
            scatter(pool, dst_v, _store(xp, v.reshape(n, -1), g.kv))
            keys = _load(xp, pool[src_k], g.kv).reshape(n, lk, g.hkv, g.d).transpose(0, 2, 1, 3)
            values = xp.where(used, _load(xp, pool[src_v], g.kv), 0.0).reshape(n, lk, g.hkv, g.d).transpose(0, 2, 1, 3)
            return keys, values

        out = _run_layers(xp, mm, g, w, x, _rope(xp, rope_rows[:, col:col + 1], g.r), kv, visible,
                          lambda layer: 0.0, lambda layer, x: None, scratch)
        row = _log_softmax(xp, mm(out.reshape(n, g.h), w.w_lm))
        logits[:, col + 1 if col + 1 < width else 0] = row
        if col == 0:
            logits[:, 0] = row
        guess[...] = row.argmax(axis=-1)
        scratch.release(column_mark)  # a column's temporaries: the next one reuses their scratch
