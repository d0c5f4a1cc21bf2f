"""``trt_edgellm::gated_delta_net`` (Qwen3.5's Gated DeltaNet) in numpy, read from Edge-LLM 0.11's C++ and kernels.

Sources (Edge-LLM 0.11):

- ``cpp/plugins/gatedDeltaNet/gatedDeltaNetPlugin.cpp``: the input order ``q, k, v, a, b, A_log, dt_bias,
  recurrent_state, query_lengths, query_start_offsets, state_indices, execution_phase_marker,
  context_sequence_count_carrier``; ``enqueue`` (the checks; prefill for context phases and a multi-row proposal,
  decode for decode and a one-row proposal; verify and the diffusion phases need engine flags); the constructor
  (``CuteDslGDNRunner::canImplement``: key and value heads of 128 only).
- ``cpp/kernels/gdnKernels/cuteDslGDNRunner.cpp`` (the pool ``[rows, value heads, k, v]`` FP32, K-major, indexed by
  ``state_indices``) and the CuTe DSL kernels it runs, ``kernelSrcs/gdn_cutedsl/gdn_prefill.py`` and
  ``gdn_decode.py``: per token, ``g = exp(-exp(A_log) softplus(a + dt_bias))`` (softplus linear above 20),
  ``beta = sigmoid(b)``, q and k L2-normalised (``rsqrt(sum + 1e-6)``), q scaled by ``k_dim ** -0.5``; then
  ``H = g H``, ``v' = beta (v - H^T k)``, ``H += k v'^T``, ``o = H^T q``; value head ``hv`` reads key head
  ``hv // (HV / H)``. The state stays FP32 in the pool; rows at or past ``query_lengths[s]`` output zero and leave
  the state as it is (decode too: a sequence of length 0 writes nothing).

Each sequence ``s`` reads and writes pool row ``state_indices[s]`` only, in place; nothing zeroes a row.

The linear spec-verify (phase 5 on a node built with ``use_mtp``; ``gatedDeltaNetPlugin.cpp`` ``mtpActive``,
``cuteDslGDNRunner.cpp::runDecodeMTP``, ``kernelSrcs/gdn_cutedsl/gdn_decode_mtp.py``): the sequences' pool rows are
gathered into the workspace (``launchGdnStateGather``) and the kernel evolves that copy over all W rows of each
sequence (``num_valid_t = seq_len``: ``query_lengths`` unread), writing the state after row t to the third output
``intermediate_recurrent_state`` row ``s * W + t`` (FP32); the pool is left as it was. In the other phases a
``use_mtp`` node's third output is not written; this model marks it NaN.

The tree verify (phase 5 on a node built with ``use_ddtree``, which takes ``tree_parent_ids`` and ``tree_depths``
after the 13 inputs; ``gatedDeltaNetPlugin.cpp`` ``ddtreeActive``,
``cpp/kernels/gdnKernels/gdnTreeChunkKernels.{h,cu}``) is stateless: each node's output is the recurrence along its
root path from the gathered pool row (the kernel's chunk form of it), a padding node's is zero, and **no state is
written**: the third output's row of each sequence (``W`` rows of ``[HV, K, V]`` FP32) holds at its head the
*replay stash* the runtime's commit (``gdnTreeReplayCommitBatched``) advances the slot's state with along the
accepted path: per node, packed at ``gdnTreeStashNodeBytes`` intervals, ``[L2-normalised k fp32 H*128 | gate g =
exp(log g) fp32 HV | beta fp32 HV | v fp16 HV*128]`` (``stashOffsets``); the row's tail is the kernel's scratch
(NaN here).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio.testing.edgellm_plugins._common import Phase, PluginInputError, ragged_metadata
from trtio.testing.edgellm_plugins._resident import checked_pool, linear_verify, refuse_unmodelled, tree_nodes

__all__ = ["gated_delta_net"]

_NAME = "gated_delta_net"
_INPUTS = 13
_HEAD = 128  # CuteDslGDNRunner::canImplement: kDim == 128 && vDim == 128
_SOFTPLUS_THRESHOLD = np.float32(20.0)
_L2_EPS = np.float32(1e-6)


def _softplus(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.where(x <= _SOFTPLUS_THRESHOLD, np.log1p(np.exp(np.minimum(x, _SOFTPLUS_THRESHOLD))), x)
    return out.astype(np.float32)


def _l2(x: np.ndarray) -> np.ndarray:
    """The kernels' L2 norm over the head: ``x * rsqrt(sum(x^2) + 1e-6)`` in fp32."""
    out: np.ndarray = x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + _L2_EPS)
    return out


def _sequence(q: np.ndarray, k: np.ndarray, v: np.ndarray, a: np.ndarray, b: np.ndarray, a_log: np.ndarray,
              dt_bias: np.ndarray, state: np.ndarray, length: int, group: int, scale: np.float32,
              after: np.ndarray | None = None) -> np.ndarray:
    """The recurrence over the first ``length`` rows of one sequence: ``q``/``k`` [W, H, K], ``v`` [W, HV, V],
    ``a``/``b`` [W, HV] (half), ``state`` [HV, K, V] fp32 updated in place; ``after`` [W, HV, K, V], where given,
    gets the state after each row. Returns o [W, HV, V] half."""
    out = np.zeros(v.shape, np.float16)
    decay = np.exp(a_log.astype(np.float32))
    bias = dt_bias.astype(np.float32)
    for t in range(length):
        qt = np.repeat(_l2(q[t].astype(np.float32)), group, axis=0) * scale  # [HV, K]
        kt = np.repeat(_l2(k[t].astype(np.float32)), group, axis=0)
        g = np.exp(-decay * _softplus(a[t].astype(np.float32) + bias))  # [HV]
        beta = np.float32(1.0) / (np.float32(1.0) + np.exp(-b[t].astype(np.float32)))
        state *= g[:, None, None]
        v_new = (v[t].astype(np.float32) - np.einsum("hkv,hk->hv", state, kt)) * beta[:, None]
        state += kt[:, :, None] * v_new[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", state, qt).astype(np.float16)
        if after is not None:
            after[t] = state
    return out


_MAX_TREE = 64  # kGDN_TREE_CHUNK_MAX_NODES


def stash_layout(heads: int, value_heads: int) -> tuple[int, int, int, int]:
    """``stashOffsets``: the byte offsets of g, beta and v in a node's stash cell, and the cell's size (k at 0)."""
    g = heads * _HEAD * 4
    beta = g + value_heads * 4
    v = beta + value_heads * 4
    return g, beta, v, v + value_heads * _HEAD * 2


def _tree_verify(q: np.ndarray, k: np.ndarray, v: np.ndarray, a: np.ndarray, b: np.ndarray, a_log: np.ndarray,
                 dt_bias: np.ndarray, h0: np.ndarray, nodes: list[list[int] | None], group: int, scale: np.float32,
                 stash: np.ndarray) -> np.ndarray:
    """One sequence's tree verify (module docstring): ``q`` .. ``b`` its W rows, ``h0`` [HV, K, V] its pool row (not
    written), ``stash`` the bytes of its W intermediate rows. Returns o [W, HV, V] half."""
    out = np.zeros(v.shape, np.float16)
    heads, value_heads = q.shape[1], v.shape[1]
    g_at, beta_at, v_at, cell = stash_layout(heads, value_heads)
    decay = np.exp(a_log.astype(np.float32))
    for n, path in enumerate(nodes):
        base = n * cell
        gate = np.exp(-decay * _softplus(a[n].astype(np.float32) + dt_bias.astype(np.float32))).astype(np.float32)
        beta = (np.float32(1.0) / (np.float32(1.0) + np.exp(-b[n].astype(np.float32)))).astype(np.float32)
        stash[base:base + g_at] = np.frombuffer(_l2(k[n].astype(np.float32)).astype(np.float32).tobytes(), np.uint8)
        stash[base + g_at:base + beta_at] = np.frombuffer(gate.tobytes(), np.uint8)
        stash[base + beta_at:base + v_at] = np.frombuffer(beta.tobytes(), np.uint8)
        stash[base + v_at:base + cell] = np.frombuffer(v[n].astype(np.float16).tobytes(), np.uint8)
        if path is None:
            continue
        rows = np.array(path)
        state = h0.copy()
        out[n] = _sequence(q[rows], k[rows], v[rows], a[rows], b[rows], a_log, dt_bias, state, len(path), group,
                           scale)[-1]
    return out


def gated_delta_net(node: str, inputs: tuple[np.ndarray, ...], attrs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """One ``gated_delta_net`` node: ``(o [T, HV, V] half, the recurrent state pool[, intermediate states])``; the
    rows of the step's sequences are updated in place (but in the verify) and the pool itself is returned as
    ``present_recurrent_state``; a node built with ``use_mtp`` also returns the per-token states of a verify."""
    plugin = f"{_NAME} {node}"
    ddtree = bool(int(attrs.get("use_ddtree") or 0))
    if len(inputs) != _INPUTS + 2 * ddtree:
        raise PluginInputError(f"{plugin}: expected {_INPUTS + 2 * ddtree} inputs, got {len(inputs)}")
    q, k, v, a, b, a_log, dt_bias, pool, lengths, offsets, state_indices, phase_marker, context_count = \
        inputs[:_INPUTS]
    k_dim, v_dim = int(attrs.get("k_dim", _HEAD)), int(attrs.get("v_dim", _HEAD))
    if k_dim != _HEAD or v_dim != _HEAD:
        raise PluginInputError(f"{plugin}: cannot implement k_dim={k_dim} v_dim={v_dim}: the CuTe DSL GDN is only "
                               f"built for k=v={_HEAD}")
    if q.ndim != 3 or v.ndim != 3 or k.shape != q.shape or q.dtype != np.float16 or v.dtype != np.float16:
        raise PluginInputError(f"{plugin}: Q, K and V must be FP16 of rank 3 (Q and K alike); got q {list(q.shape)}, "
                               f"k {list(k.shape)}, v {list(v.shape)}")
    heads, value_heads = int(q.shape[1]), int(v.shape[1])
    if q.shape[2] != k_dim or v.shape[2] != v_dim:
        raise PluginInputError(f"{plugin}: q head size {q.shape[2]} / v head size {v.shape[2]} disagree with "
                               f"k_dim {k_dim} / v_dim {v_dim}")
    if value_heads % heads:
        raise PluginInputError(f"{plugin}: value heads {value_heads} are not a multiple of key heads {heads} (the "
                               "kernels read key head hv // (HV / H))")
    if a_log.dtype != np.float32 or a.shape != (q.shape[0], value_heads) or b.shape != a.shape:
        raise PluginInputError(f"{plugin}: A_log must be FP32 [HV], a and b [T, HV={value_heads}]; got A_log "
                               f"{a_log.dtype}, a {list(a.shape)}, b {list(b.shape)}")
    ragged = ragged_metadata(plugin, int(q.shape[0]), np.asarray(lengths), np.asarray(offsets), phase_marker,
                             context_count)
    rows = checked_pool(plugin, pool, np.float32, (value_heads, k_dim, v_dim), state_indices, ragged.sequences)
    phase = ragged.phase
    if phase in (Phase.DIFFUSION_DENOISE, Phase.DIFFUSION_COMMIT) and not int(attrs.get("use_diffusion_state") or 0):
        raise PluginInputError(f"{plugin}: diffusion phase requires diffusion-capable engine metadata")
    mtp = bool(int(attrs.get("use_mtp") or 0)) or ddtree
    out = np.zeros(v.shape, np.float16)
    scale = np.float32(k_dim ** -0.5)
    group = value_heads // heads
    w = ragged.width
    if ddtree and phase is Phase.SPEC_TARGET_VERIFY:
        parents, depths = (np.asarray(t) for t in inputs[_INPUTS:])
        if parents.shape != (q.shape[0],) or depths.shape != (q.shape[0],):
            raise PluginInputError(f"{plugin}: DDTree requires flat tree_parent_ids/tree_depths shape "
                                   f"[T_exec={q.shape[0]}]")
        if w > _MAX_TREE:
            raise PluginInputError(f"{plugin}: DDTree chunk-form verify supports seq_len <= {_MAX_TREE}, got {w}")
        written = np.full((q.shape[0], value_heads, k_dim, v_dim), np.nan, np.float32)
        stash = written.view(np.uint8).reshape(ragged.sequences, written[:w].nbytes)
        for s, row in enumerate(rows):
            lo = s * w
            out[lo:lo + w] = _tree_verify(q[lo:lo + w], k[lo:lo + w], v[lo:lo + w], a[lo:lo + w], b[lo:lo + w],
                                          a_log, dt_bias, pool[row], tree_nodes(plugin, parents[lo:lo + w],
                                                                                  depths[lo:lo + w]),
                                          group, scale, stash[s])
        return out, pool, written
    verify = linear_verify(plugin, phase, attrs, ragged.width)
    if not verify:
        refuse_unmodelled(plugin, phase)
    states = np.full((q.shape[0], value_heads, k_dim, v_dim), np.nan, np.float32) if mtp else None
    for s, row in enumerate(rows):
        lo = s * w
        # verify: a gathered copy of the row, every row of the W (query_lengths unread); else the row in place
        state = pool[row].copy() if verify else pool[row]
        length = w if verify else int(lengths[s])
        out[lo:lo + w] = _sequence(q[lo:lo + w], k[lo:lo + w], v[lo:lo + w], a[lo:lo + w], b[lo:lo + w], a_log,
                                   dt_bias, state, length, group, scale,
                                   after=states[lo:lo + w] if verify and states is not None else None)
    return (out, pool) if states is None else (out, pool, states)
