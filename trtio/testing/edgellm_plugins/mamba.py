"""``trt_edgellm::update_ssm_state`` (the Mamba2 state update of a Nemotron-H export) in numpy, read from Edge-LLM
0.11's C++. A Nemotron-H graph's other custom ops are ``causal_conv1d`` (:mod:`.conv1d`) and the AttentionPlugin.

Sources (Edge-LLM 0.11):

- ``cpp/plugins/mamba/mambaPlugin.cpp``: the input order ``x [T, heads, dim], A [heads] (FP32), B [T, groups,
  dstate], C, D [heads], dt [T, heads], dt_bias [heads], state [rows, heads, dim, dstate], query_lengths,
  query_start_offsets, state_indices, execution_phase_marker, context_sequence_count_carrier``; ``enqueue`` (the
  checks; ``query_lengths`` is read in every phase but decode, where each sequence runs its one row; the state pool
  aliased by its output; verify needs the engine's spec-verify flag).
- ``cpp/kernels/mamba/selectiveStateUpdate.cu``: ``selective_state_update_prefill_kernel_simple`` (run for every
  phase modelled here): per head h of group ``h // (heads / groups)``, the pool row loaded to fp32, then per row
  ``t < length``: ``dt = softplus(dt[t, h] + dt_bias[h])`` (``thresholded_softplus``: linear above 20, when
  ``dt_softplus``), ``S = exp(A dt) S + dt B[t] x[t]`` (``S[d, i]``), ``y[t, d] = D x[t, d] + sum_i S[d, i] C[t, i]``
  from the fp32 state; rows at or past the length output zero; the state is written back to the FP16 row once, at
  the end. No gate ``z`` (the graph gates after the op). ``AllowedDims`` / ``AllowedDstates``: head dim and state size
  64, 80, 128 or 256 only (``dispatchDimDstate`` throws otherwise).

On an SM with the CuTe DSL SSD prefill built in, a context step of 128 or more rows a sequence runs a chunked scan of
the same recurrence instead (same math, another summation order). Each sequence ``s`` reads and writes pool row
``state_indices[s]`` only, in place; nothing zeroes a row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio.testing.edgellm_plugins._common import Phase, PluginInputError, ragged_metadata
from trtio.testing.edgellm_plugins._resident import checked_pool, refuse_unmodelled

__all__ = ["update_ssm_state"]

_NAME = "update_ssm_state"
_INPUTS = 13
_SIZES = (64, 80, 128, 256)  # AllowedDims, AllowedDstates
_SOFTPLUS_THRESHOLD = np.float32(20.0)


def _sequence(x: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, dt: np.ndarray,
              dt_bias: np.ndarray, row: np.ndarray, length: int, softplus: bool) -> np.ndarray:
    """One sequence's rows: ``x`` [W, heads, dim], ``b``/``c`` [W, heads, dstate] (already per head), ``dt`` [W,
    heads]; ``row`` [heads, dim, dstate] half, written back once. Returns y [W, heads, dim] half."""
    out = np.zeros(x.shape, np.float16)
    state = row.astype(np.float32)
    for t in range(length):
        step = dt[t].astype(np.float32) + dt_bias.astype(np.float32)
        if softplus:
            step = np.where(step <= _SOFTPLUS_THRESHOLD,
                            np.log1p(np.exp(np.minimum(step, _SOFTPLUS_THRESHOLD))), step).astype(np.float32)
        decay = np.exp(a * step)  # [heads]
        xt = x[t].astype(np.float32)  # [heads, dim]
        state = state * decay[:, None, None] + (step[:, None] * b[t].astype(np.float32))[:, None, :] * xt[:, :, None]
        y = np.einsum("hdi,hi->hd", state, c[t].astype(np.float32)) + d[:, None] * xt
        out[t] = y.astype(np.float16)
    row[...] = state.astype(np.float16)
    return out


def update_ssm_state(node: str, inputs: tuple[np.ndarray, ...], attrs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """One ``update_ssm_state`` node: ``(y [T, heads, dim] half, the SSM state pool)``; the rows of the step's
    sequences are updated in place and the pool itself is returned as ``present_recurrent_state``."""
    plugin = f"{_NAME} {node}"
    if int(attrs.get("use_ddtree") or 0):
        raise PluginInputError(f"{plugin}: use_ddtree = 1 (tree verify inputs) is a mode this numpy model does not "
                               "compute")
    if len(inputs) != _INPUTS:
        raise PluginInputError(f"{plugin}: expected {_INPUTS} inputs, got {len(inputs)}")
    x, a, b, c, d, dt, dt_bias, pool, lengths, offsets, state_indices, phase_marker, context_count = inputs
    if x.ndim != 3 or b.ndim != 3 or c.shape != b.shape or pool.ndim != 4:
        raise PluginInputError(f"{plugin}: invalid token-major input ranks: x {list(x.shape)}, B {list(b.shape)}, C "
                               f"{list(c.shape)}, state {list(pool.shape)}")
    if x.dtype != np.float16 or a.dtype != np.float32:
        raise PluginInputError(f"{plugin}: x must be FP16 and A FP32; got {x.dtype}, {a.dtype}")
    tokens, heads, dim = (int(n) for n in x.shape)
    groups, dstate = int(b.shape[1]), int(b.shape[2])
    for key, derived in (("nheads", heads), ("dim", dim), ("dstate", dstate), ("ngroups", groups)):
        given = int(attrs.get(key) or 0)
        if given and given != derived:
            raise PluginInputError(f"{plugin}: attribute {key} = {given}, the inputs' shapes give {derived}")
    if dim not in _SIZES or dstate not in _SIZES:
        raise PluginInputError(f"{plugin}: no kernel for head dim {dim} / state size {dstate} (built for "
                               f"{', '.join(map(str, _SIZES))})")
    if heads % groups:
        raise PluginInputError(f"{plugin}: heads {heads} are not a multiple of groups {groups}")
    if b.shape[0] != tokens or dt.shape != (tokens, heads) or a.shape != (heads,) or d.shape != (heads,) \
            or dt_bias.shape != (heads,):
        raise PluginInputError(f"{plugin}: B/C [T, groups, dstate], dt [T, heads] and A, D, dt_bias [heads] "
                               f"disagree with x {list(x.shape)}")
    ragged = ragged_metadata(plugin, tokens, np.asarray(lengths), np.asarray(offsets), phase_marker, context_count)
    rows = checked_pool(plugin, pool, np.float16, (heads, dim, dstate), state_indices, ragged.sequences)
    phase = ragged.phase
    if phase is Phase.SPEC_TARGET_VERIFY and not int(attrs.get("use_spec_verify_state") or 0):
        raise PluginInputError(f"{plugin}: SPEC_TARGET_VERIFY requires verify-capable engine metadata")
    refuse_unmodelled(plugin, phase)
    softplus = bool(int(attrs.get("dt_softplus", 1)))
    per_head = heads // groups
    bh, ch = np.repeat(b, per_head, axis=1), np.repeat(c, per_head, axis=1)  # group h // (heads / groups)
    out = np.zeros(x.shape, np.float16)
    w = ragged.width
    for s, row in enumerate(rows):
        lo = s * w
        length = w if phase is Phase.AUTOREGRESSIVE_DECODE else int(lengths[s])  # phaseUsesMambaQueryLengths
        out[lo:lo + w] = _sequence(x[lo:lo + w], a, bh[lo:lo + w], ch[lo:lo + w], d.astype(np.float32),
                                   dt[lo:lo + w], dt_bias, pool[row], length, softplus)
    return out, pool
