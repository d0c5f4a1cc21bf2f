"""``trt_edgellm::causal_conv1d`` in numpy, read from Edge-LLM 0.11's C++.

Sources (Edge-LLM 0.11):

- ``cpp/plugins/mamba/causalConv1dPlugin.cpp``: ``enqueue`` (the input order ``x, weight, bias, conv_state,
  query_lengths, query_start_offsets, state_indices, execution_phase_marker, context_sequence_count_carrier``, the
  checks, which phase takes which kernel: prefill, chunk and a multi-row proposal the sequential kernel, decode and a
  one-row proposal the shift-insert kernel).
- ``cpp/kernels/mamba/causalConv1d.cu``: ``causalConv1dKernelT`` (out[t] = bias + sum_k w[k] x[t + k - padding],
  positions before the chunk read the pool row's last ``width`` columns, rows at or past ``query_lengths[s]`` are
  zero), ``captureConvStateKernel`` (the row keeps the last ``width`` inputs: the chunk's tail, shifted in after the
  row's newest values when the chunk is shorter than the width), ``causalConv1dDecodeKernel`` (shift the row left by
  one, insert the token, dot with the weight), ``causalConv1dDecodeMTPKernel`` (the linear spec-verify of a node built
  with ``use_mtp``: every one of the W rows of a sequence, ``query_lengths`` unread, shift-inserted into a copy of the
  pool row, the pool itself only read; each row's window stored as ``intermediate_conv_state`` row ``s * W + t``).

- the same file's ``causalConv1dDecodeDDTreeKernel`` (the tree verify of a node built with ``use_ddtree``, which
  takes ``tree_parent_ids`` and ``tree_depths`` after the nine inputs: each node's window is the pool row shifted by
  its root path, at most ``width`` nodes long, and its path's tokens; a padding node outputs zero and stores the row's
  window; the pool is only read).

A node built with ``use_mtp`` or ``use_ddtree`` has a third output, ``intermediate_conv_state [T, conv_dim, width]``,
written only in the verify (phase 5); in the other phases the kernels leave it as it was, which this model marks NaN
(unwritten).

The conv state pool is ``[rows, conv_dim, width]`` in the activations' dtype (FP16); sequence ``s`` reads and writes
row ``state_indices[s]`` only, in place. No activation is applied (the graph applies SiLU after the op).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio.testing.edgellm_plugins._common import Phase, PluginInputError, ragged_metadata
from trtio.testing.edgellm_plugins._resident import checked_pool, linear_verify, refuse_unmodelled, tree_nodes

__all__ = ["causal_conv1d"]

_NAME = "causal_conv1d"
_INPUTS = 9
_MAX_WIDTH = 8  # invokeCausalConv1d: "width<=8"


def _sequential(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, row: np.ndarray, length: int,
                padding: int) -> np.ndarray:
    """``causalConv1dKernelT`` for one sequence: ``x`` [W, D] half, ``row`` [D, K] half (read before the capture).
    Input position p < 0 reads ``row[:, K + p]`` (p >= -K), p in [0, length) reads ``x[p]``, anything else 0; outputs
    at rows >= ``length`` are zero. fp32 accumulation, half result."""
    width, dim = x.shape
    k = weight.shape[1]
    history = np.concatenate([row.astype(np.float32).T, x[:length].astype(np.float32)])  # [K + length, D]
    acc = np.broadcast_to(bias.astype(np.float32), (length, dim)).copy()
    t = np.arange(length)
    for j in range(k):
        p = t + j - padding
        valid = (p >= -k) & (p < length)
        acc[valid] += history[k + p[valid]] * weight[:, j].astype(np.float32)
    out = np.zeros((width, dim), np.float16)
    out[:length] = acc.astype(np.float16)
    return out


def _capture(x: np.ndarray, row: np.ndarray, length: int) -> np.ndarray:
    """``captureConvStateKernel``: the new row [D, K] after ``length`` tokens of ``x``."""
    k = row.shape[1]
    tail = min(length, k)
    new = row.copy()
    new[:, :k - tail] = row[:, tail:]
    new[:, k - tail:] = x[length - tail:length].T
    return new


def _verify(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, pool: np.ndarray, rows: np.ndarray,
            width: int) -> tuple[np.ndarray, np.ndarray]:
    """``causalConv1dDecodeMTPKernel``: for sequence s, its W rows shift-inserted one by one into (a register copy of)
    pool row ``rows[s]``, each output the window's dot with the weight plus the bias (fp32, half result), each window
    stored half as intermediate row ``s * W + t``. The pool is not written."""
    out = np.zeros_like(x)
    states = np.zeros((x.shape[0], *pool.shape[1:]), np.float16)
    wf, bf = weight.astype(np.float32), bias.astype(np.float32)
    for s, row in enumerate(rows):
        window = pool[row].astype(np.float32)
        for t in range(s * width, (s + 1) * width):
            window = np.concatenate([window[:, 1:], x[t].astype(np.float32)[:, None]], axis=1)
            out[t] = (bf + (window * wf).sum(axis=1)).astype(np.float16)
            states[t] = window.astype(np.float16)
    return out, states


def _tree_verify(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, pool: np.ndarray, rows: np.ndarray, width: int,
                 parents: np.ndarray, depths: np.ndarray, plugin: str) -> tuple[np.ndarray, np.ndarray]:
    """``causalConv1dDecodeDDTreeKernel``: node n of sequence s (row ``s * W + n``) convolves the pool row shifted by
    its root path (the path's last ``K`` nodes' inputs appended, in order); a padding node outputs zero and stores the
    row's window. The pool is not written."""
    out = np.zeros_like(x)
    k = pool.shape[2]
    states = np.zeros((x.shape[0], *pool.shape[1:]), np.float16)
    wf, bf = weight.astype(np.float32), bias.astype(np.float32)
    for s, row in enumerate(rows):
        lo = s * width
        base = pool[row].astype(np.float32)
        for n, path in enumerate(tree_nodes(plugin, parents[lo:lo + width], depths[lo:lo + width])):
            if path is None:
                states[lo + n] = pool[row]
                continue
            tail = path[-k:]
            window = np.concatenate([base[:, len(tail):], x[lo + np.array(tail)].astype(np.float32).T], axis=1)
            out[lo + n] = (bf + (window * wf).sum(axis=1)).astype(np.float16)
            states[lo + n] = window.astype(np.float16)
    return out, states


def causal_conv1d(node: str, inputs: tuple[np.ndarray, ...], attrs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """One ``causal_conv1d`` node: ``(out [T, D] half, the conv state pool[, intermediate_conv_state])``; the pool
    rows of the step's sequences are updated in place (but in the verify) and the pool itself is returned as
    ``present_conv_state``; a node built with ``use_mtp`` also returns the per-token windows of a verify."""
    plugin = f"{_NAME} {node}"
    ddtree = bool(int(attrs.get("use_ddtree") or 0))
    if len(inputs) != _INPUTS + 2 * ddtree:
        raise PluginInputError(f"{plugin}: expected {_INPUTS + 2 * ddtree} inputs, got {len(inputs)}")
    x, weight, bias, pool, lengths, offsets, state_indices, phase_marker, context_count = inputs[:_INPUTS]
    if x.ndim != 2 or weight.ndim != 3:
        raise PluginInputError(f"{plugin}: expects rank-2 x/output and rank-3 weight, got x {list(x.shape)}, weight "
                               f"{list(weight.shape)}")
    if x.dtype != np.float16:
        raise PluginInputError(f"{plugin}: only FP16 input is supported; got {x.dtype}")
    ragged = ragged_metadata(plugin, int(x.shape[0]), np.asarray(lengths), np.asarray(offsets), phase_marker,
                             context_count)
    dim, width = int(x.shape[1]), int(weight.shape[2])
    rows = checked_pool(plugin, pool, np.float16, (dim, width), state_indices, ragged.sequences)
    groups = int(attrs.get("groups") or 0) or dim
    if groups != dim:
        raise PluginInputError(f"{plugin}: currently supports depthwise conv only: groups={groups}, dim={dim}")
    phase = ragged.phase
    w = weight.reshape(dim, width)
    mtp = bool(int(attrs.get("use_mtp") or 0)) or ddtree
    if ddtree and phase is Phase.SPEC_TARGET_VERIFY:
        parents, depths = (np.asarray(t) for t in inputs[_INPUTS:])
        if parents.shape != (x.shape[0],) or depths.shape != (x.shape[0],):
            raise PluginInputError(f"{plugin}: DDTree requires flat tree_parent_ids/tree_depths shape "
                                   f"[T_exec={x.shape[0]}]")
        out, states = _tree_verify(x, w, bias, pool, rows, ragged.width, parents, depths, plugin)
        return out, pool, states
    if linear_verify(plugin, phase, attrs, ragged.width):
        out, states = _verify(x, w, bias, pool, rows, ragged.width)
        return out, pool, states
    refuse_unmodelled(plugin, phase)
    unwritten = (np.full((x.shape[0], dim, width), np.nan, np.float16),) if mtp else ()
    out = np.zeros_like(x)
    sequential = phase in (Phase.CONTEXT_PREFILL, Phase.CONTEXT_CHUNK) or ragged.width > 1
    if sequential:
        stride, dilation = int(attrs.get("stride", 1)), int(attrs.get("dilation", 1))
        if stride != 1 or dilation != 1 or width > _MAX_WIDTH:
            raise PluginInputError(f"{plugin}: requires stride=1, dilation=1, width<={_MAX_WIDTH}; got stride "
                                   f"{stride}, dilation {dilation}, width {width}")
        padding = int(attrs.get("padding", 0))
        for s, row in enumerate(rows):
            lo = s * ragged.width
            seq_x, length = x[lo:lo + ragged.width], int(lengths[s])
            before = pool[row].copy()
            out[lo:lo + ragged.width] = _sequential(seq_x, w, bias, before, length, padding)
            pool[row] = _capture(seq_x, before, length)
        return (out, pool, *unwritten)
    for s, row in enumerate(rows):  # causalConv1dDecodeKernel: one token a sequence, query_lengths unread
        shifted = np.concatenate([pool[row][:, 1:], x[s][:, None]], axis=1)
        pool[row] = shifted
        acc = bias.astype(np.float32) + (shifted.astype(np.float32) * w.astype(np.float32)).sum(axis=1)
        out[s] = acc.astype(np.float16)
    return (out, pool, *unwritten)
