"""RoPE cos/sin tables in Edge-LLM's layout: each position row is ``[cos(0..R/2) | sin(0..R/2)]``."""

from __future__ import annotations

import numpy as np

__all__ = ["rope_cos_sin_table"]


def rope_cos_sin_table(max_positions: int, rotary_dim: int, theta: float = 10000.0, batch: int = 1) -> np.ndarray:
    """float32 ``[batch, max_positions, rotary_dim]``: row p holds cos and sin of ``p * theta^(-2i/R)``.

    Angles are computed in float64 and rounded once. ``batch > 1`` replicates the table per slot
    (MRoPE's text-only initialisation).
    """
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
    half = rotary_dim // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rotary_dim)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    table = np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    return np.ascontiguousarray(np.broadcast_to(table, (batch, max_positions, rotary_dim)))
