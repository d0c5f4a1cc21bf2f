"""``trt_edgellm::ViTAttentionPlugin`` (a vision encoder's ragged self-attention) in numpy, read from Edge-LLM's C++.

Source: ``cpp/plugins/vitAttentionPlugin/vitAttentionPlugin.cpp`` (the five-input IPluginV3 version the 0.11
exporter's ``models/ops.py::vit_attention_plugin`` targets: inputs ``q, k, v [total_S, H, D]`` half,
``cu_seqlens [segments + 1]`` INT32, ``max_seqlen_carrier [max_seqlen]`` INT32 whose extent alone is read;
attributes ``num_heads``, ``head_size``, ``attention_scale``, ``qkv_scales``; the public NVIDIA repository holds
it, the v0.11 mirror indexes no copy) and ``cpp/kernels/contextAttentionKernels/contextFMHARunner.cpp`` (what
``enqueue`` runs: FMHA-v2 with ``SEPARATE_Q_K_V`` layout and the ``PADDING`` mask, ``cu_q_seqlens = cu_kv_seqlens
= cu_seqlens``, batch = the extent of ``cu_seqlens`` minus one, the padded length ``s`` = the carrier's extent).

So each ``cu_seqlens`` segment attends to itself, every query row seeing every key row of its segment (no causal
mask), the scores scaled by ``attention_scale`` (``resolveAttentionScale``: ``1 / sqrt(head_size)`` where absent).
``dispatchFMHAKernel`` launches ``ceil(s / unroll)`` query tiles: a segment longer than the carrier's extent has
query rows no tile covers, which the kernel leaves unwritten; rows outside every segment are never written either.
The model refuses both, and every input the plugin's format checks and ``canImplement`` refuse (FP16 only, head
sizes 64, 72, 80, 128, 256). Qwen2.5-VL's windowed blocks pass ``cu_window_seqlens`` and a constant carrier of the
window's patch count; its full blocks and Qwen3-VL's pass ``cu_seqlens`` and the runtime's ``max_seqlen_carrier``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio.testing.edgellm_plugins._common import PluginInputError

__all__ = ["vit_attention_plugin"]

_NAME = "ViTAttentionPlugin"
# ContextFMHARunner::canImplement with SEPARATE_Q_K_V and PADDING (72 and 80 are for ViTs only).
_HEAD_SIZES = (64, 72, 80, 128, 256)


def _segments(plugin: str, cu_seqlens: np.ndarray, total: int, carrier: int) -> list[tuple[int, int]]:
    """``cu_seqlens`` checked: INT32 ``[B + 1]`` with B >= 1, starting at 0, non-decreasing, ending at ``total``
    (rows past its end are never written), each segment at most ``carrier`` rows (the launch's padded length)."""
    if cu_seqlens.ndim != 1 or cu_seqlens.dtype != np.int32:
        raise PluginInputError(f"{plugin}: cu_seqlens must be INT32 [segments + 1], got {cu_seqlens.dtype} "
                               f"{list(cu_seqlens.shape)}")
    if cu_seqlens.shape[0] < 2:
        raise PluginInputError(f"{plugin}: cu_seqlens has {cu_seqlens.shape[0]} entries; a launch needs at least "
                               "one segment (batch = entries - 1)")
    cu = cu_seqlens.astype(np.int64)
    if cu[0] != 0:
        raise PluginInputError(f"{plugin}: cu_seqlens[0] = {int(cu[0])}; the first segment starts at row 0")
    steps = np.diff(cu)
    if (steps < 0).any():
        i = int(np.flatnonzero(steps < 0)[0])
        raise PluginInputError(f"{plugin}: cu_seqlens {cu.tolist()} decreases at entry {i + 1}")
    if cu[-1] != total:
        raise PluginInputError(f"{plugin}: cu_seqlens ends at {int(cu[-1])}, but Q has {total} rows (rows outside "
                               "every segment are never written; a segment past the rows reads out of bounds)")
    longest = int(steps.max())
    if longest > carrier:
        i = int(np.argmax(steps))
        raise PluginInputError(f"{plugin}: segment {i} has {longest} rows, more than max_seqlen_carrier's extent "
                               f"{carrier} (the kernel's padded length: rows past it are never computed)")
    return [(int(a), int(b)) for a, b in zip(cu[:-1], cu[1:])]


def vit_attention_plugin(node: str, inputs: tuple[np.ndarray, ...], given: dict[str, Any]) -> tuple[np.ndarray]:
    """One ViTAttentionPlugin node: the attention output ``[total_S, H, D]`` half (see the module docstring)."""
    plugin = f"{_NAME} {node}"
    if len(inputs) != 5:
        raise PluginInputError(f"{plugin}: expected 5 inputs (q, k, v, cu_seqlens, max_seqlen_carrier), got "
                               f"{len(inputs)}")
    q, k, v, cu_seqlens, carrier = (np.asarray(x) for x in inputs)
    heads, size = int(given.get("num_heads") or 0), int(given.get("head_size") or 0)
    if heads <= 0 or size <= 0:
        raise PluginInputError(f"{plugin}: requires both num_heads and head_size > 0, got {heads} and {size}")
    if size not in _HEAD_SIZES:
        raise PluginInputError(f"{plugin}: head_size {size}: the FMHA kernels implement {list(_HEAD_SIZES)} "
                               "(ContextFMHARunner::canImplement)")
    for what, x in (("Q", q), ("K", k), ("V", v)):
        if x.dtype != np.float16 or x.ndim != 3 or x.shape[1:] != (heads, size):
            raise PluginInputError(f"{plugin}: {what} must be half [total_S, {heads}, {size}], got {x.dtype} "
                                   f"{list(x.shape)}")
    if not q.shape == k.shape == v.shape:
        raise PluginInputError(f"{plugin}: Q, K and V must have one shape, got {list(q.shape)}, {list(k.shape)}, "
                               f"{list(v.shape)}")
    if carrier.ndim != 1 or carrier.dtype != np.int32:
        raise PluginInputError(f"{plugin}: max_seqlen_carrier must be INT32 [max_seqlen], got {carrier.dtype} "
                               f"{list(carrier.shape)}")
    scale = given.get("attention_scale")
    scale = float(scale) if scale is not None and float(scale) > 0 else 1.0 / float(np.sqrt(size))
    out = np.zeros(q.shape, np.float16)
    for start, end in _segments(plugin, cu_seqlens, int(q.shape[0]), int(carrier.shape[0])):
        if end == start:
            continue
        qs = q[start:end].astype(np.float32)
        ks = k[start:end].astype(np.float32)
        vs = v[start:end].astype(np.float32)
        scores = np.matmul(qs.transpose(1, 0, 2), ks.transpose(1, 2, 0)) * np.float32(scale)  # [H, Q, K]
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        out[start:end] = np.matmul(weights, vs.transpose(1, 0, 2)).transpose(1, 0, 2).astype(np.float16)
    return (out,)
