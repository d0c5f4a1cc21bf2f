"""``trt_edgellm::DFlashTargetKVCacheUpdate`` (a DFlash draft's write of the target's delta into its KV) in numpy,
read from Edge-LLM 0.11's C++.

Sources (Edge-LLM 0.11):

- ``cpp/plugins/dflashTargetKVCacheUpdatePlugin/dflashTargetKVCacheUpdatePlugin.{h,cpp}``: the inputs ``k_delta
  [T_delta, Hkv, D]`` and ``v_delta`` (FP16), ``past_key_value`` (the paged pool ``[2, N, 128, Hkv, D]`` FP16),
  ``rope_cos_sin [T_delta, rotary]`` (FP32), ``delta_positions [T_delta]`` and ``token_to_sequence [T_delta]``
  (INT32; "padding is -1"), ``kv_page_table [B, 2, M]`` (INT32, K page ids in ``[0, N)``, V page ids in ``[N, 2N)``);
  ``enqueue``'s checks (``hasConcretePagedKVContract``: M <= N; the rotary width even, positive and at most D);
  the one output is the pool itself (``getAliasedInput``: written in place).
- ``cpp/kernels/speculative/dflashRuntimeKernels.cu``: ``dflashTargetKVCacheUpdateKernel`` (a row whose sequence is
  outside ``[0, B)`` or whose position is negative writes nothing; K gets non-interleaved RoPE from its own table row,
  ``[cos | sin]`` halves, computed in fp32 from the half values and rounded to half, channels past the rotary width
  passed through; V is copied; both land at ``position`` through ``kv_page_table[sequence, 0 | 1, position // 128]``;
  a column past M or a page id outside its plane is skipped) and ``dflashPrepareDeltaMetadataKernel`` (the runtime's
  padding rows carry -1 in both the position and the sequence).

The kernels skip silently a column past the table, a page id outside the pool and a sequence past B: each means the
runtime wrote a wrong input, so this model raises :class:`~trtio.testing.edgellm_plugins._common.PluginInputError`
on them. A padding row (sequence -1 and position -1) is skipped, as the runtime intends; a row with one of the two
-1 and not the other is refused (the runtime writes both or neither).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio.testing.edgellm_plugins._common import TOKENS_PER_PAGE, PluginInputError, pool_slots

__all__ = ["dflash_target_kv_cache_update"]

_NAME = "DFlashTargetKVCacheUpdate"
_INPUTS = 7


def _rope(k: np.ndarray, cos_sin: np.ndarray) -> np.ndarray:
    """The kernel's RoPE of K ``[T, Hkv, D]`` half with ``cos_sin [T, r]`` fp32 (channel i < r/2 pairs with
    i + r/2): half result, channels past r unchanged."""
    r = cos_sin.shape[1]
    half = r // 2
    cos, sin = cos_sin[:, None, :half].astype(np.float32), cos_sin[:, None, half:r].astype(np.float32)
    kf = k.astype(np.float32)
    out = k.copy()
    out[..., :half] = (kf[..., :half] * cos - kf[..., half:r] * sin).astype(np.float16)
    out[..., half:r] = (kf[..., :half] * sin + kf[..., half:r] * cos).astype(np.float16)
    return out


def _check(plugin: str, k: np.ndarray, v: np.ndarray, pool: np.ndarray, cos_sin: np.ndarray, positions: np.ndarray,
           owners: np.ndarray, table: np.ndarray) -> None:
    """``enqueue``'s checks before the kernel runs."""
    if k.dtype != np.float16 or k.ndim != 3 or min(k.shape) <= 0:
        raise PluginInputError(f"{plugin}: k_delta must be token-major 3D FP16 with positive dimensions, got "
                               f"{k.dtype} {list(k.shape)}")
    if v.dtype != np.float16 or v.shape != k.shape:
        raise PluginInputError(f"{plugin}: v_delta must match k_delta shape and dtype, got {v.dtype} {list(v.shape)}")
    tokens, heads, size = k.shape
    if pool.dtype != np.float16 or pool.ndim != 5 or pool.shape[0] != 2 or pool.shape[1] <= 0 \
            or pool.shape[2] != TOKENS_PER_PAGE or pool.shape[3] != heads or pool.shape[4] != size:
        raise PluginInputError(f"{plugin}: past_key_value must be the paged pool [2, numPages, {TOKENS_PER_PAGE}, "
                               f"{heads}, {size}] FP16, got {pool.dtype} {list(pool.shape)}")
    if table.dtype != np.int32 or table.ndim != 3 or table.shape[0] <= 0 or table.shape[1] != 2 \
            or table.shape[2] <= 0 or table.shape[2] > pool.shape[1]:
        raise PluginInputError(f"{plugin}: kv_page_table must be [B, 2, M] INT32 with M <= the pool's "
                               f"{pool.shape[1]} pages, got {table.dtype} {list(table.shape)}")
    if cos_sin.dtype != np.float32 or cos_sin.ndim != 2 or cos_sin.shape[0] != tokens:
        raise PluginInputError(f"{plugin}: rope_cos_sin must be token-major 2D FP32 [{tokens}, rotary], got "
                               f"{cos_sin.dtype} {list(cos_sin.shape)}")
    if not 0 < cos_sin.shape[1] <= size or cos_sin.shape[1] % 2:
        raise PluginInputError(f"{plugin}: invalid rope_cos_sin shape {list(cos_sin.shape)} (rotary width even, in "
                               f"(0, {size}])")
    for name, arr in (("delta_positions", positions), ("token_to_sequence", owners)):
        if arr.dtype != np.int32 or arr.shape != (tokens,):
            raise PluginInputError(f"{plugin}: delta positions and token owners must be [T_delta={tokens}] INT32, "
                                   f"got {name} {arr.dtype} {list(arr.shape)}")


def dflash_target_kv_cache_update(node: str, inputs: tuple[np.ndarray, ...],
                                  attrs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """One ``DFlashTargetKVCacheUpdate`` node: the pool, its delta rows written in place (``present_key_value``)."""
    plugin = f"{_NAME} {node}"
    del attrs  # the plugin has no fields
    if len(inputs) != _INPUTS:
        raise PluginInputError(f"{plugin}: expected {_INPUTS} inputs and 1 output, got {len(inputs)} inputs")
    k, v, pool, cos_sin, positions, owners, table = inputs
    positions, owners = np.asarray(positions), np.asarray(owners)
    _check(plugin, k, v, pool, cos_sin, positions, owners, np.asarray(table))
    batch = table.shape[0]
    padding = (owners == -1) & (positions == -1)
    bad = np.flatnonzero(~padding & ((owners < 0) | (owners >= batch) | (positions < 0)))
    if bad.size:
        i = int(bad[0])
        raise PluginInputError(f"{plugin}: delta row {i} has token_to_sequence {int(owners[i])} and position "
                               f"{int(positions[i])}: the kernel skips it silently (a padding row carries -1 in both; "
                               f"a real row a sequence in [0, {batch}) and a position >= 0)")
    roped = _rope(k, cos_sin)
    flat = pool.reshape(2 * pool.shape[1] * TOKENS_PER_PAGE, pool.shape[3], pool.shape[4])
    for b in np.unique(owners[~padding]):
        rows = np.flatnonzero(owners == b)
        k_rows, v_rows = pool_slots(plugin, table, int(b), positions[rows].astype(np.int64), pool.shape[1],
                                    "delta write")
        flat[k_rows] = roped[rows]
        flat[v_rows] = v[rows]
    return (pool,)
