"""Gated DeltaNet's replay commit: a DDTree base's recurrent states advanced along the accepted path at accept.

A hybrid base built as a DDTree base (``mtp_tree_base``, ``dflash_tree_base``: Edge-LLM 0.11's builder makes every
DFlash base one) verifies its Gated DeltaNet layers statelessly (``gatedDeltaNetPlugin.cpp``, ``use_ddtree``;
``cpp/kernels/gdnKernels/gdnTreeChunkKernels.{h,cu}``): no state is written anywhere; at the head of each sequence's
rows of ``intermediate_recurrent_state_j`` (its ``W`` rows of ``[Hv, Dk, Dv]`` FP32, ``W`` the step's nodes per
sequence) the plugin leaves a *replay stash*, one cell per node ``gdnTreeStashNodeBytes`` apart (:func:`stash_layout`):
the node's L2-normalised keys (FP32, one vector per key head), its gate ``g = exp(log g)`` and ``beta`` (FP32, one
per value head) and its values (FP16). Edge-LLM's runtime commits it with ``replayCommitAcceptedTreeStates``
(``mambaCacheManager.cpp``) -> ``gdnTreeReplayCommitBatched``: per layer, value head and accepted node in path order,
the slot's state ``S`` ``[Dk, Dv]`` of that head becomes

    S = g S;   v' = beta (v - S^T k);   S += k v'^T

(value head ``j`` reads key head ``j // (Hv / Hk)``; the key heads ``Hk`` from ``conv_dim``:
:attr:`HybridConfig.gdn_key_heads`). :class:`GdnReplay` does this for every sequence of an accept and every layer in
one device operation on the step's stream: the paths are staged into a device block made at bind (one upload), and
the work reads them there when it runs (a CUDA graph that captured it replays with fresh paths). On the host backend
it is numpy run in stream order; on the cuda backend the kernel :data:`REPLAY_KERNELS`, compiled when the commit is
made (at bind: no step compiles). Edge-LLM's limits hold: a verify of at most :data:`MAX_NODES` nodes a sequence
(``kGDN_TREE_CHUNK_MAX_NODES``: the plugin refuses more) and accepted paths of at most :data:`MAX_ACCEPT` nodes
(``kGDN_TREE_CHUNK_MAX_ACCEPT``: the commit kernel silently skips a longer one); :func:`tree_problem` names a tree
past them before it is verified.

The cuda kernel has not run on a GPU yet (``docs/edgellm-assumptions.md`` §11.2): ``tests/test_hybrid_replay.py``
compares it with the host version where a GPU is present.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trtio._cache import BoundedCache
from trtio._cuda import kernels
from trtio._cuda._hostmem import host_view
from trtio._cuda.backend import Backend
from trtio._dtypes import DType
from trtio._lifetime import Closeable
from trtio._memory import Arena, MemoryReport, TensorRequest
from trtio._ops import _host_work
from trtio._staging import StepStaging
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio.errors import InvalidTypeError
from trtio.families.hybrid.hybrid_config import HybridConfig

__all__ = ["MAX_ACCEPT", "MAX_NODES", "REPLAY_KERNELS", "GdnReplay", "replay_reference", "stash_layout",
           "tree_problem"]

MAX_NODES = 64  # kGDN_TREE_CHUNK_MAX_NODES: the chunk-form verify's nodes per sequence
MAX_ACCEPT = 16  # kGDN_TREE_CHUNK_MAX_ACCEPT: the replay commit's accepted nodes per sequence
_HEAD = 4  # a staged path row: slot, the sequence's first verify row, the path's length, unused; then the nodes
_STRIDE = _HEAD + MAX_ACCEPT
_BLOCK = 128

_SOURCE = r"""
// FP16 bits to float (no headers under NVRTC: the conversion instruction itself).
__device__ __forceinline__ float trtio_half(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Gated DeltaNet's replay commit (Edge-LLM's gdnTreeReplayCommitBatched, written plainly). Block (b * hv + head,
// layer) advances value head `head` of sequence b's slot state in layer `layer`'s pool along its accepted path:
// paths[b] = [slot, first, n, unused, node_0 .. node_{n-1}] (`stride` ints a row); layers[2 * layer] is the pool
// (rows of [hv, dk, dv] FP32), layers[2 * layer + 1] the layer's intermediate buffer, whose bytes from
// first * row_bytes hold sequence b's stash: node j's cell at node_j * cell, [k FP32 hk x dk | g FP32 hv | beta FP32
// hv | v FP16 hv x dv] (g, beta and v at g_at, beta_at, v_at). Per node, in path order: S = g S; v' = beta (v - S^T
// k); S += k v'^T, value head `head` reading key head head / (hv / hk). Thread t owns value columns t, t + blockDim.x,
// ...: a column's update reads and writes only its own column, so no barrier is needed. A slot outside the pool, a
// length outside the row or a cell outside the buffer (`cap` bytes) leaves the sequence as it was (an index is data,
// never a reason to fault; every thread of the block decides alike, before any write).
extern "C" __global__ void trtio_gdn_replay(const unsigned long long* __restrict__ layers,
                                            const int* __restrict__ paths, int stride, int hv, int hk, int dk, int dv,
                                            long long row_bytes, long long cell, long long g_at, long long beta_at,
                                            long long v_at, long long cap, int pool_rows) {
    int b = blockIdx.x / hv, head = blockIdx.x % hv, layer = blockIdx.y;
    const int* path = paths + (long long)b * stride;
    int slot = path[0], n = path[2];
    long long first = path[1];
    if (slot < 0 || slot >= pool_rows || n < 0 || n > stride - 4 || first < 0) return;
    for (int i = 0; i < n; ++i) {
        long long node = path[4 + i];
        if (node < 0 || first * row_bytes + (node + 1) * cell > cap) return;
    }
    float* s = (float*)layers[2 * layer] + ((long long)slot * hv + head) * dk * dv;
    const char* stash = (const char*)layers[2 * layer + 1] + first * row_bytes;
    int kh = head / (hv / hk);
    for (int i = 0; i < n; ++i) {
        const char* c = stash + (long long)path[4 + i] * cell;
        const float* k = (const float*)c + (long long)kh * dk;
        float g = ((const float*)(c + g_at))[head];
        float beta = ((const float*)(c + beta_at))[head];
        const unsigned short* v = (const unsigned short*)(c + v_at) + (long long)head * dv;
        for (int col = threadIdx.x; col < dv; col += blockDim.x) {
            float seen = 0.f;
            for (int r = 0; r < dk; ++r) {
                float x = s[(long long)r * dv + col] * g;
                s[(long long)r * dv + col] = x;
                seen += x * k[r];
            }
            float vn = (trtio_half(v[col]) - seen) * beta;
            for (int r = 0; r < dk; ++r) s[(long long)r * dv + col] += k[r] * vn;
        }
    }
}
"""

#: The cuda backend's kernel (compiled once per device, when the first :class:`GdnReplay` of the device is made).
REPLAY_KERNELS = kernels.KernelSource("trtio_gdn_replay", _SOURCE, ("trtio_gdn_replay",))


def stash_layout(key_heads: int, value_heads: int, dk: int, dv: int) -> tuple[int, int, int, int]:
    """``stashOffsets`` (``gdnTreeChunkKernels.cu``) for a head of ``dk`` keys and ``dv`` values (Edge-LLM's are
    128 and 128): the byte offsets of g, beta and v in a node's cell and the cell's size (the keys at 0)."""
    g = key_heads * dk * 4
    beta = g + value_heads * 4
    v = beta + value_heads * 4
    return g, beta, v, v + value_heads * dv * 2


def tree_problem(parents: np.ndarray, real: np.ndarray) -> str | None:
    """What Edge-LLM's chunk-form GDN tree verify and replay commit cannot take in a verify tree (``parents`` [B, N],
    -1 for roots and padding; ``real`` [B, N]): more than :data:`MAX_NODES` nodes a sequence, or a node deeper than a
    path of :data:`MAX_ACCEPT` nodes reaches (its path could be accepted); None where the tree fits."""
    n = parents.shape[1]
    if n > MAX_NODES:
        return (f"{n} nodes a sequence, more than the {MAX_NODES} Edge-LLM's chunk-form Gated DeltaNet tree verify "
                f"takes (kGDN_TREE_CHUNK_MAX_NODES)")
    if n <= MAX_ACCEPT:
        return None
    up = np.where(real, parents, -1)
    for _ in range(MAX_ACCEPT - 1):  # after d steps, a node whose d-th ancestor exists is deeper than d
        up = np.where(up >= 0, np.take_along_axis(parents, np.maximum(up, 0), axis=1), -1)
        if not (up >= 0).any():
            return None
    return (f"a node deeper than {MAX_ACCEPT - 1} levels below the root: its path of more than {MAX_ACCEPT} nodes "
            f"is more than Edge-LLM's Gated DeltaNet replay commit takes (kGDN_TREE_CHUNK_MAX_ACCEPT)")


def replay_reference(state: np.ndarray, stash: np.ndarray, nodes: Sequence[int], key_heads: int) -> None:
    """The replay of ``nodes`` (a path, in order) from one sequence's stash bytes ``stash`` into ``state`` ([Hv, Dk,
    Dv] FP32, in place): the host backend's commit, and the tests' reference."""
    hv, dk, dv = state.shape
    g_at, beta_at, v_at, cell = stash_layout(key_heads, hv, dk, dv)
    group = hv // key_heads
    for node in nodes:
        c = stash[node * cell:(node + 1) * cell]
        k = np.repeat(c[:g_at].view(np.float32).reshape(key_heads, dk), group, axis=0)  # [Hv, Dk]
        g = c[g_at:beta_at].view(np.float32)
        beta = c[beta_at:v_at].view(np.float32)
        v = c[v_at:cell].view(np.float16).reshape(hv, dv).astype(np.float32)
        state *= g[:, None, None]
        seen = np.einsum("hkv,hk->hv", state, k)
        state += k[:, :, None] * ((v - seen) * beta[:, None])[:, None, :]


class GdnReplay(Closeable):
    """The replay commit of one hybrid base's Gated DeltaNet layers (see the module docstring): :meth:`attach` gives
    it the pools and the intermediate buffers once; :meth:`commit` enqueues an accept's. Owns the staged paths' block
    (``max_batch`` rows) and, on the cuda backend, the table of the layers' addresses. Follows trtio's close protocol
    (:mod:`trtio._lifetime`)."""

    def __init__(self, hybrid: HybridConfig, max_batch: int, *, backend: Backend, name: str = "base") -> None:
        self.name = name
        self.max_batch = max_batch
        self._backend = backend
        key_heads = hybrid.gdn_key_heads
        if key_heads is None or DType.coerce(hybrid.recurrent_state_dtype) is not DType.FLOAT32:
            raise InvalidTypeError(f"{name}: the Gated DeltaNet replay commit takes FP32 states and key heads from "
                                   f"conv_dim (HybridConfig.gdn_key_heads); got {hybrid}")
        self.key_heads = key_heads
        self.shape = hybrid.recurrent_state_shape  # (Hv, Dk, Dv)
        self.layers = hybrid.num_layers
        hv, dk, dv = self.shape
        self._layout = stash_layout(key_heads, hv, dk, dv)
        self._row_bytes = hv * dk * dv * 4  # one intermediate row
        self._init_lifetime(f"replay commit of {name!r}")
        requests = StepStaging.requests([TensorRequest.of("replay_paths", (max_batch, _STRIDE), DType.INT32)])
        requests.append(TensorRequest.of("replay_layers", (2 * self.layers,), DType.INT64))
        self._arena = Arena(requests, backend=backend, title=f"{name} replay commit")
        try:
            self._paths = StepStaging(self._arena, ["replay_paths"], title=f"{name} accepted paths (replay)")
        except BaseException:
            self._arena.close()
            raise
        self._rows = np.zeros((max_batch, _STRIDE), np.int32)
        self._pools: list[Tensor] = []
        self._stash: list[Tensor] = []
        self._launches: BoundedCache[int, Any] = BoundedCache()
        if backend.name == "cuda":  # compiled now: no step compiles
            kernels.kernels(backend.device_id, REPLAY_KERNELS)

    def attach(self, pools: Sequence[Tensor], stash: Sequence[Tensor], stream: Stream) -> None:
        """Commit into ``pools`` (``recurrent_state_j``, layer order) from ``stash`` (``intermediate_recurrent_state_j``
        of the same layers); the layers' addresses are written to the device table on ``stream``."""
        self._check_open()
        self._pools, self._stash = list(pools), list(stash)
        table = np.array([p for pair in zip(self._pools, self._stash) for p in (pair[0].data_ptr, pair[1].data_ptr)],
                         np.int64)  # addresses (below 2^63)
        self._arena["replay_layers"].copy_from(table, stream)

    def commit(self, slots: np.ndarray, rows: np.ndarray, lengths: np.ndarray, nodes: int, stream: Stream) -> None:
        """Replay each sequence's accepted path into its slot of every layer's pool, on ``stream``: sequence ``i``
        (slot ``slots[i]``) accepted verify rows ``rows[i, :lengths[i]]`` (row ``i * nodes + node``: ``nodes`` the
        verify's nodes a sequence). One upload of the paths and one device operation; no host sync."""
        self._check_open()
        b = len(slots)
        out = self._rows[:b]
        out[:, 0] = slots
        first = np.arange(b, dtype=np.int64) * nodes
        out[:, 1] = first
        out[:, 2] = lengths
        width = rows.shape[1]
        out[:, _HEAD:_HEAD + width] = np.where(rows >= 0, rows - first[:, None], -1)
        device = self._paths.write("replay_paths", out)
        self._paths.upload(stream)
        if self._backend.name == "cuda":
            self._launch(b, device)(stream.handle)
            return
        self._host(b, device, stream)

    def _launch(self, b: int, paths: Tensor) -> Any:
        """The packed launch for a batch of ``b`` (kept per batch size)."""
        found = self._launches.get(b)
        if found is None:
            hv, dk, dv = self.shape
            g_at, beta_at, v_at, cell = self._layout
            cap = self._stash[0].capacity
            found = self._launches.put(b, kernels.Launch(
                self._backend.device_id, "trtio_gdn_replay", (b * hv, self.layers), _BLOCK,
                kernels.ptr(self._arena["replay_layers"].data_ptr), kernels.ptr(paths.data_ptr), np.int32(_STRIDE),
                np.int32(hv), np.int32(self.key_heads), np.int32(dk), np.int32(dv), np.int64(self._row_bytes),
                np.int64(cell), np.int64(g_at), np.int64(beta_at), np.int64(v_at), np.int64(cap),
                np.int32(self._pools[0].shape[0]), source=REPLAY_KERNELS))
        return found

    def _host(self, b: int, paths: Tensor, stream: Stream) -> None:
        """The host backend's version: numpy in ``stream``'s order, reading the staged paths when it runs."""
        hv, dk, dv = self.shape
        pools = [(p.data_ptr, p.shape[0]) for p in self._pools]
        stashes = [(t.data_ptr, t.capacity) for t in self._stash]
        paths_ptr, heads, row_bytes, cell = paths.data_ptr, self.key_heads, self._row_bytes, self._layout[3]

        def run() -> None:
            staged = host_view(paths_ptr, 4 * b * _STRIDE).view(np.int32).reshape(b, _STRIDE)
            for slot, first, n, _, *path in staged.tolist():
                nodes = path[:n]
                for (pool, rows), (stash, cap) in zip(pools, stashes):
                    lo = first * row_bytes
                    if not 0 <= slot < rows or not 0 <= n <= MAX_ACCEPT or first < 0 or \
                            any(node < 0 or lo + (node + 1) * cell > cap for node in nodes):
                        continue  # as the kernel: the sequence as it was
                    state = host_view(pool + slot * row_bytes, row_bytes).view(np.float32).reshape(hv, dk, dv)
                    replay_reference(state, host_view(stash + lo, cap - lo), nodes, heads)

        _host_work(self._backend, stream, run)

    def report(self) -> MemoryReport:
        self._check_open()
        return self._arena.report()

    def _close_owned(self) -> None:
        try:
            self._paths.close()
        finally:
            self._arena.close()

    def __repr__(self) -> str:
        return (f"GdnReplay({self.name!r}, {self.layers} layers, {self.key_heads} key heads, value heads x dk x dv "
                f"{self.shape})")

