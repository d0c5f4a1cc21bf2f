"""Device kernels trtio launches itself, compiled at run time with NVRTC through cuda.core's ``Program``.

Only the cuda backend uses this module (``trtio._ops`` dispatches; the host backend runs numpy
equivalents). Kernels are compiled once per device on first use — a setup warms them up when it is
created, so no step compiles — and read every index they need from device memory, so a CUDA graph that
captured a launch replays with the indices of the step being replayed.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio.errors import CudaError, InvalidValueError

__all__ = ["KERNEL_NAMES", "MAX_COPY_JOBS", "TRTIO_KERNELS", "CopyJob", "CopyJobs", "KernelSource", "Launch",
           "copy_jobs", "kernels"]

_SOURCE = r"""
#define TRTIO_UNROLL 4

// Bytes [lo, hi) of `out` = the same bytes of `in` (zeros when `in` is null), by the block's threads together:
// in 16-byte words where both addresses and the length allow, each thread issuing all its loads before its
// stores, so TRTIO_UNROLL x blockDim words are in flight at once (a copy is bound by memory latency, not width).
__device__ __forceinline__ void trtio_copy_span(char* __restrict__ out, const char* __restrict__ in, long long lo,
                                                long long hi) {
    unsigned long long a = (unsigned long long)(out + lo) | (in ? (unsigned long long)(in + lo) : 0ull);
    long long n = hi - lo;
    if (((a | (unsigned long long)n) & 15ull) == 0) {
        int4* o = (int4*)(out + lo);
        const int4* s = (const int4*)(in + lo);
        long long words = n >> 4, step = (long long)blockDim.x * TRTIO_UNROLL;
        for (long long w0 = 0; w0 < words; w0 += step) {
            int4 v[TRTIO_UNROLL];
#pragma unroll
            for (int u = 0; u < TRTIO_UNROLL; ++u) {
                long long k = w0 + threadIdx.x + (long long)u * blockDim.x;
                v[u] = (in && k < words) ? s[k] : make_int4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < TRTIO_UNROLL; ++u) {
                long long k = w0 + threadIdx.x + (long long)u * blockDim.x;
                if (k < words) o[k] = v[u];
            }
        }
    } else {
        for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) out[k] = in ? in[k] : (char)0;
    }
}

// Copy jobs, up to TRTIO_MAX_COPY_JOBS made by one launch (none may read what another writes). Job j: for
// i < count, row (dst_rows ? dst_rows[i] : i) of dst (rows dpitch apart) = row (src_rows ? src_rows[i] : i) of
// src (rows spitch apart), `width` bytes; zeros where src is null or the source row is negative; a negative
// destination row writes nothing, and rows outside [0, dst_cap) or [0, src_cap) are skipped (an index is
// data, never a reason to fault). Job j owns blocks [first, first + count * parts): block (i, p) of it copies
// bytes [p * span, (p + 1) * span) of row i, so a wide row is spread over several blocks.
#define TRTIO_MAX_COPY_JOBS 6
struct TrtioCopyJob {
    char* dst;
    const int* dst_rows;
    const char* src;
    const int* src_rows;
    long long count, width, dpitch, spitch, dst_cap, src_cap, first, parts;
};
struct TrtioCopyJobs {
    TrtioCopyJob job[TRTIO_MAX_COPY_JOBS];
    long long n, span;
};

extern "C" __global__ void trtio_copy_jobs(TrtioCopyJobs jobs) {
    long long blk = blockIdx.x;
    int j = 0;
    while (j + 1 < jobs.n && blk >= jobs.job[j + 1].first) ++j;
    const TrtioCopyJob c = jobs.job[j];
    long long local = blk - c.first, i = local / c.parts, lo = (local % c.parts) * jobs.span;
    if (i >= c.count || lo >= c.width) return;
    long long d = c.dst_rows ? (long long)c.dst_rows[i] : i;
    long long s = c.src_rows ? (long long)c.src_rows[i] : i;
    if (d < 0 || d >= c.dst_cap || s >= c.src_cap) return;
    long long hi = lo + jobs.span < c.width ? lo + jobs.span : c.width;
    trtio_copy_span(c.dst + d * c.dpitch, (c.src == nullptr || s < 0) ? nullptr : c.src + s * c.spitch, lo, hi);
}

// Commit accepted tree paths in KV caches: block (c, b) moves, in order, the entries of sequence b's path in
// cache caches[c]: moves[b] = [start, n, node_0, ..., node_{n-1}] moves entry start + node_j to start + j for
// j = 1 .. n - 1 (absolute cache slots); with `starts` (int32 [B], else null) start is starts[b], not the row's
// first int. Each entry is `chunks` pieces of chunk_bytes: a contiguous cache
// [B, H, C, D] has one piece per head (layout 0); a paged pool [2, P, page, H, D] has the K piece (page table
// row 0) and the V piece (row 1, ids already + P) (layout 1). Moves run in order with a barrier between them:
// a later move may overwrite an earlier one's source (path [0, 2, 3]: slot 2 is read by move 1, then written
// by move 2). A move onto itself is skipped. Within a move, the threads share every piece's 16-byte words
// (all of a thread's loads before its stores), so the pieces of an entry are read at once, not one by one.
__device__ __forceinline__ bool trtio_piece(int layout, int b, int ch, long long src, long long dst,
                                            long long chunk_bytes, long long chunk_stride, long long seq_stride,
                                            long long slot_stride, const int* __restrict__ page_table,
                                            int max_pages, int page_size, long long pool_rows, long long* so,
                                            long long* dof) {
    if (layout == 0) {
        *so = b * seq_stride + ch * chunk_stride + src * slot_stride;
        *dof = b * seq_stride + ch * chunk_stride + dst * slot_stride;
        return true;
    }
    const int* pages = page_table + ((long long)b * 2 + ch) * max_pages;
    long long ps = pages[src / page_size], pd = pages[dst / page_size];
    if (ps < 0 || pd < 0 || ps >= pool_rows || pd >= pool_rows) return false;
    *so = (ps * page_size + src % page_size) * chunk_bytes;
    *dof = (pd * page_size + dst % page_size) * chunk_bytes;
    return true;
}

extern "C" __global__ void trtio_kv_commit(const unsigned long long* __restrict__ caches, const int* __restrict__ moves,
                                           int stride, int layout, long long chunk_bytes, int chunks,
                                           long long chunk_stride, long long seq_stride, long long slot_stride,
                                           const int* __restrict__ page_table, int max_pages, int page_size,
                                           long long pool_rows, const int* __restrict__ starts) {
    int c = blockIdx.x;
    int b = blockIdx.y;
    const int* row = moves + (long long)b * stride;
    long long start = starts ? starts[b] : row[0];  // starts: the device's cached lengths, else the row's own
    int n = row[1];
    char* base = (char*)caches[c];
    // 16-byte words when every piece starts on one (the strides are multiples of the piece for layout 0).
    bool words = (((unsigned long long)base | (unsigned long long)chunk_bytes
                   | (unsigned long long)(layout == 0 ? (chunk_stride | seq_stride | slot_stride) : 0)) & 15ull) == 0;
    long long per = words ? chunk_bytes >> 4 : 0, total = per * chunks;
    for (int m = 1; m < n; ++m) {
        long long src = start + row[2 + m], dst = start + m;
        if (src == dst) continue;  // an entry already in place (uniform over the block: no barrier skipped alone)
        if (words) {
            for (long long q0 = 0; q0 < total; q0 += (long long)blockDim.x * TRTIO_UNROLL) {
                int4 v[TRTIO_UNROLL];
                long long to[TRTIO_UNROLL];
#pragma unroll
                for (int u = 0; u < TRTIO_UNROLL; ++u) {
                    long long q = q0 + threadIdx.x + (long long)u * blockDim.x, so, dof;
                    to[u] = -1;
                    if (q < total && trtio_piece(layout, b, (int)(q / per), src, dst, chunk_bytes, chunk_stride,
                                                 seq_stride, slot_stride, page_table, max_pages, page_size,
                                                 pool_rows, &so, &dof)) {
                        long long k = (q % per) << 4;
                        v[u] = *(const int4*)(base + so + k);
                        to[u] = dof + k;
                    }
                }
#pragma unroll
                for (int u = 0; u < TRTIO_UNROLL; ++u) {
                    if (to[u] >= 0) *(int4*)(base + to[u]) = v[u];
                }
            }
        } else {
            for (int ch = 0; ch < chunks; ++ch) {
                long long so, dof;
                if (!trtio_piece(layout, b, ch, src, dst, chunk_bytes, chunk_stride, seq_stride, slot_stride,
                                 page_table, max_pages, page_size, pool_rows, &so, &dof)) continue;
                for (long long k = threadIdx.x; k < chunk_bytes; k += blockDim.x) base[dof + k] = base[so + k];
            }
        }
        __syncthreads();
    }
}

// A decode step's inputs from the device's own lengths, then the lengths advanced: for sequence i < batch,
// past = asl - 1 = lengths[i] (and position = lengths[i], its MRoPE row slot * rope_cap + lengths[i], where
// those are given: slot = slots[i], or i without slots), then lengths[i] += 1. A replayed decode graph so needs
// no upload.
extern "C" __global__ void trtio_decode_advance(int* __restrict__ lengths, int batch, int* __restrict__ past,
                                                int* __restrict__ asl, int* __restrict__ positions,
                                                int* __restrict__ rope_rows, long long rope_cap,
                                                const int* __restrict__ slots) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= batch) return;
    int len = lengths[i];
    past[i] = len;
    asl[i] = len + 1;
    if (positions) positions[i] = len;
    if (rope_rows) rope_rows[i] = (int)((long long)(slots ? slots[i] : i) * rope_cap + len);
    lengths[i] = len + 1;
}

// One level of a draft tree (a proposal step), block b = sequence b of a tree `width` rows wide. The level's
// k new nodes n0 .. n0+k-1 hang off parents_in ([k] shared, else [batch, k]; -1: the root on a round's first
// level). The tree itself lives in tree_words (each node's ancestors and itself, packed, `words` per row) and
// tree_nodes ([row, 2]: depth, parent), written level by level; every input of the step is then rewritten
// from it in full (padding rows included), so other steps may use the inputs between levels. Per new node:
// row_src = the parent's draft hidden row (b * level_k + parent - level0; a root's: roots[b], or b without
// roots), row_dst = b * width + node, logits = b * logits_stride + node. Per row: the packed mask, position
// ids past + depth (0 on padding) and, where given, positions (-1 on padding), parents, depths and MRoPE rows
// b * rope_cap + position; query_lengths[b] = n0 + k, start[b] = past and ctx[b] = past + width where given.
// With past_from (a round's first level after a catch-up), past[b] = past_from[b] first: the round's lengths the
// catch-up's tree step left there. Outputs a contract lacks are null.
extern "C" __global__ void trtio_draft_level(const int* __restrict__ parents_in, int shared,
                                             int* __restrict__ past, int width, int words, int n0, int k,
                                             int level0, int level_k, unsigned int* __restrict__ tree_words,
                                             int* __restrict__ tree_nodes, const int* __restrict__ roots,
                                             int* __restrict__ query_lengths, long long* __restrict__ logits,
                                             int logits_stride, int* __restrict__ row_src,
                                             int* __restrict__ row_dst, int* __restrict__ positions,
                                             int* __restrict__ position_ids, int* __restrict__ parent_ids,
                                             int* __restrict__ depths, int* __restrict__ mask,
                                             int* __restrict__ rope_rows, long long rope_cap,
                                             int* __restrict__ start, int* __restrict__ ctx,
                                             const int* __restrict__ past_from) {
    int b = blockIdx.x;
    long long first = (long long)b * width;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        int node = n0 + i;
        int p = parents_in[shared ? i : b * k + i];
        long long r = first + node;
        unsigned int* own = tree_words + r * words;
        int depth = 0;
        if (n0 == 0 || p < 0) {
            p = -1;
            for (int q = 0; q < words; ++q) own[q] = 0u;
        } else {
            const unsigned int* up = tree_words + (first + p) * words;
            for (int q = 0; q < words; ++q) own[q] = up[q];
            depth = tree_nodes[(first + p) * 2] + 1;
        }
        own[node >> 5] |= 1u << (node & 31);
        tree_nodes[r * 2] = depth;
        tree_nodes[r * 2 + 1] = p;
        int out = b * k + i;
        row_src[out] = n0 == 0 ? (roots ? roots[b] : b) : b * level_k + (p - level0);
        row_dst[out] = (int)r;
        logits[out] = (long long)b * logits_stride + node;
    }
    __syncthreads();
    int n = n0 + k;
    int pl = past_from ? past_from[b] : past[b];
    if (threadIdx.x == 0) {
        if (past_from) past[b] = pl;
        if (query_lengths) query_lengths[b] = n;
        if (start) start[b] = pl;
        if (ctx) ctx[b] = pl + width;
    }
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        long long r = first + j;
        bool real = j < n;
        int depth = real ? tree_nodes[r * 2] : 0;
        position_ids[r] = real ? pl + depth : 0;
        for (int q = 0; q < words; ++q) mask[r * words + q] = real ? (int)tree_words[r * words + q] : 0;
        if (positions) positions[r] = real ? pl + depth : -1;
        if (parent_ids) parent_ids[r] = real ? tree_nodes[r * 2 + 1] : -1;
        if (depths) depths[r] = depth;
        if (rope_rows) rope_rows[r] = real ? (int)(b * rope_cap + pl + depth) : -1;
    }
}

// A tree step's (verify, catch-up) inputs that depend on the cached lengths, block b = sequence b of `width`
// rows: row j < lengths[b] is a node at depth depths[row]. From past[b]: asl = past + (full_width ? width :
// lengths[b]), start = past, ctx = past + width, positions = past + depth (-1 on padding), ids = past + depth
// (ids_pad on padding), MRoPE rows b * rope_cap + position (-1 on padding), the lengths after the step next =
// past + lengths[b] (a draft's: where the next round's first level reads them); the constant mask rows and token
// selection are copied from the step block to the engine's buffers (the batch contract's). Null: not wanted.
#define TRTIO_TREE_STEP_ARGS int width, const int* __restrict__ past, const int* __restrict__ lengths, \
    const int* __restrict__ depths, int full_width, int* __restrict__ asl, int* __restrict__ start, \
    int* __restrict__ ctx, int* __restrict__ positions, int* __restrict__ ids, int ids_pad, \
    int* __restrict__ rope_rows, long long rope_cap, const int* __restrict__ mask_src, int* __restrict__ mask_dst, \
    int words, const long long* __restrict__ select_src, long long* __restrict__ select_dst, int select_count, \
    int* __restrict__ next
#define TRTIO_TREE_STEP_PASS width, past, lengths, depths, full_width, asl, start, ctx, positions, ids, ids_pad, \
    rope_rows, rope_cap, mask_src, mask_dst, words, select_src, select_dst, select_count, next

__device__ void trtio_tree_step_block(TRTIO_TREE_STEP_ARGS) {
    int b = blockIdx.x;
    int pl = past[b], n = lengths[b];
    if (threadIdx.x == 0) {
        if (asl) asl[b] = pl + (full_width ? width : n);
        if (next) next[b] = pl + n;
        if (start) start[b] = pl;
        if (ctx) ctx[b] = pl + width;
    }
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        long long r = (long long)b * width + j;
        bool real = j < n;
        int at = pl + depths[r];
        if (positions) positions[r] = real ? at : -1;
        if (ids) ids[r] = real ? at : ids_pad;
        if (rope_rows) rope_rows[r] = real ? (int)(b * rope_cap + at) : -1;
        if (mask_dst) for (int q = 0; q < words; ++q) mask_dst[r * words + q] = mask_src[r * words + q];
    }
    if (select_dst) {
        long long first = (long long)b * select_count;
        for (int i = threadIdx.x; i < select_count; i += blockDim.x) select_dst[first + i] = select_src[first + i];
    }
}

extern "C" __global__ void trtio_tree_step(TRTIO_TREE_STEP_ARGS) { trtio_tree_step_block(TRTIO_TREE_STEP_PASS); }

// A catch-up's layout, one block per sequence b, from the accepted paths accept() left on the device: moves row b
// (`stride` ints) is [start, n, node_0 .. node_{n-1}, -1 ...], the path of n nodes of a verify step `nodes` rows per
// sequence. Over c_width rows per sequence (row r = b * c_width + j, real where j < n): query lengths n, the logits
// row b * logits_stride + n - 1 (int64), parent ids j - 1 and depths j, the packed causal mask (c_words ints a row:
// node j sees nodes 0 .. j; 0 on padding rows), the scratch rows b * scratch + j and the accepted nodes' rows
// b * nodes + node_j (-1 on padding rows), and the root row b * roots_stride + n - 1. Null: not wanted. With
// tree_step, then trtio_tree_step's work over what it wrote (TRTIO_TREE_STEP_ARGS), in the same launch.
extern "C" __global__ void trtio_catch_up_layout(const int* __restrict__ moves, int stride, int nodes, int c_width,
                                                 int scratch, int* __restrict__ c_lengths,
                                                 long long* __restrict__ c_logits, int logits_stride,
                                                 int* __restrict__ c_parent_ids, int* __restrict__ c_depths,
                                                 int* __restrict__ c_mask, int c_words, int* __restrict__ c_dst,
                                                 int* __restrict__ c_src, int* __restrict__ c_roots, int roots_stride,
                                                 int tree_step, TRTIO_TREE_STEP_ARGS) {
    int b = blockIdx.x;
    const int* row = moves + (long long)b * stride;
    int n = row[1];
    if (threadIdx.x == 0) {
        if (c_lengths) c_lengths[b] = n;
        if (c_logits) c_logits[b] = (long long)b * logits_stride + n - 1;
        if (c_roots) c_roots[b] = b * roots_stride + n - 1;
    }
    for (int j = threadIdx.x; j < c_width; j += blockDim.x) {
        long long r = (long long)b * c_width + j;
        bool real = j < n;
        if (c_parent_ids) c_parent_ids[r] = j - 1;
        if (c_depths) c_depths[r] = j;
        if (c_dst) c_dst[r] = real ? b * scratch + j : -1;
        if (c_src) c_src[r] = real ? b * nodes + row[2 + j] : -1;
        if (c_mask) {
            for (int q = 0; q < c_words; ++q) {
                int bits = real ? j + 1 - q * 32 : 0;  // of bits 0 .. j of the row, those from word q's first on
                c_mask[r * c_words + q] = bits >= 32 ? -1 : bits <= 0 ? 0 : (int)((1u << bits) - 1u);
            }
        }
    }
    if (tree_step) {  // then the tree step of the layout just written (its lengths, depths and mask), in this launch
        __syncthreads();
        trtio_tree_step_block(TRTIO_TREE_STEP_PASS);
    }
}
"""

KERNEL_NAMES = ("trtio_copy_jobs", "trtio_kv_commit", "trtio_decode_advance", "trtio_draft_level",
                "trtio_tree_step", "trtio_catch_up_layout")


@dataclass(frozen=True)
class KernelSource:
    """A module of kernels compiled beside trtio's own (a family's, kept in its folder): ``source`` (CUDA C++, no
    includes), the kernels ``names`` it exports and the module's ``key`` (unique: compiled once per device under
    it). Launch one with :class:`Launch`'s ``source``."""

    key: str
    source: str
    names: tuple[str, ...]


TRTIO_KERNELS = KernelSource("trtio_kernels", _SOURCE, KERNEL_NAMES)

_lock = threading.Lock()
_modules: dict[tuple[int, str], dict[str, Any]] = {}


def kernels(device_id: int, source: KernelSource = TRTIO_KERNELS) -> dict[str, Any]:
    """The compiled kernels of ``source`` (trtio's own by default) on ``device_id`` (compiled on the first call;
    later calls are a lookup)."""
    key = (device_id, source.key)
    found = _modules.get(key)
    if found is not None:
        return found
    with _lock:
        found = _modules.get(key)
        if found is None:
            found = _modules[key] = _compile(device_id, source)
        return found


def _compile(device_id: int, source: KernelSource) -> dict[str, Any]:
    try:
        from cuda.core import Device, Program, ProgramOptions

        major, minor = Device(device_id).compute_capability

        def build() -> dict[str, Any]:
            program = Program(source.source, "c++", ProgramOptions(arch=f"sm_{major}{minor}", name=source.key))
            module = program.compile("cubin", name_expressions=source.names)
            return {name: module.get_kernel(name) for name in source.names}

        # In the device's primary context, popped after: the caller's current device and context stay its own.
        built: dict[str, Any] = _in_primary_context(device_id, build)
        return built
    except Exception as exc:
        raise CudaError(f"nvrtc: compile {source.key}", None, str(exc)) from exc


_functions: dict[tuple[int, str, str], Any] = {}
_C_TYPES = {np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.int64): ctypes.c_int64,
            np.dtype(np.int32): ctypes.c_int32}


def _function(device_id: int, name: str, source: KernelSource = TRTIO_KERNELS) -> Any:
    """The CUfunction of kernel ``name`` of ``source`` on ``device_id`` (looked up once)."""
    found = _functions.get((device_id, source.key, name))
    if found is None:
        from cuda.bindings import driver

        err, found = driver.cuKernelGetFunction(kernels(device_id, source)[name].handle)
        if int(err) != 0:
            raise CudaError(f"cuKernelGetFunction({name})", str(err), "")
        _functions[(device_id, source.key, name)] = found
    return found


MAX_COPY_JOBS = 6  # TRTIO_MAX_COPY_JOBS


class CopyJob(ctypes.Structure):
    """``TrtioCopyJob`` (see ``trtio_copy_jobs``)."""

    _fields_ = [("dst", ctypes.c_uint64), ("dst_rows", ctypes.c_uint64), ("src", ctypes.c_uint64),
                ("src_rows", ctypes.c_uint64), ("count", ctypes.c_int64), ("width", ctypes.c_int64),
                ("dpitch", ctypes.c_int64), ("spitch", ctypes.c_int64), ("dst_cap", ctypes.c_int64),
                ("src_cap", ctypes.c_int64), ("first", ctypes.c_int64), ("parts", ctypes.c_int64)]


class CopyJobs(ctypes.Structure):
    """``TrtioCopyJobs``: the one parameter of ``trtio_copy_jobs``, passed by value."""

    _fields_ = [("job", CopyJob * MAX_COPY_JOBS), ("n", ctypes.c_int64), ("span", ctypes.c_int64)]


def copy_jobs(device_id: int, jobs: Sequence[tuple[int, ...]], span: int, block: int) -> Launch:
    """The launch of ``trtio_copy_jobs`` for ``jobs``: each (dst, dst_rows, src, src_rows, count, width, dpitch,
    spitch, dst_cap, src_cap), addresses as ints (0: none); rows of ``width`` bytes are split in ``span``s."""
    if not 0 < len(jobs) <= MAX_COPY_JOBS:
        raise InvalidValueError(f"copy_jobs: {len(jobs)} jobs, expected 1..{MAX_COPY_JOBS}")
    table = CopyJobs(n=len(jobs), span=span)
    first = 0
    for k, job in enumerate(jobs):
        parts = max(1, -(-job[5] // span))
        table.job[k] = CopyJob(*job, first, parts)
        first += job[4] * parts
    return Launch(device_id, "trtio_copy_jobs", max(first, 1), block, table)


class Launch:
    """One launch of kernel ``name`` with its arguments packed once: a step that relaunches it (with fresh
    data in device memory) pays one ``cuLaunchKernel``. ``args`` are numpy scalars of the kernel's
    parameter types (np.uint64 for pointers, np.int32 / np.int64 for integers) or ctypes structures
    (a struct parameter passed by value); ``source``: the module the kernel is in (trtio's own by default)."""

    def __init__(self, device_id: int, name: str, grid: int | tuple[int, ...], block: int, *args: Any,
                 source: KernelSource = TRTIO_KERNELS) -> None:
        from cuda.bindings import driver

        self.name = name
        self._device_id = device_id
        self._fn = _function(device_id, name, source)
        self._values = [a if isinstance(a, ctypes.Structure) else _C_TYPES[np.asarray(a).dtype](a.item())
                        for a in args]  # kept alive with the array
        self._params = (ctypes.c_void_p * max(len(args), 1))(*[ctypes.addressof(v) for v in self._values])
        g = (grid, 1, 1) if isinstance(grid, int) else (tuple(grid) + (1, 1))[:3]
        self._dims = (*g, block, 1, 1)
        self._launch = driver.cuLaunchKernel
        self._ok = driver.CUresult.CUDA_SUCCESS
        self._no_context = driver.CUresult.CUDA_ERROR_INVALID_CONTEXT

    def __call__(self, stream: int) -> None:
        gx, gy, gz, bx, by, bz = self._dims
        addr = ctypes.addressof(self._params)
        err = self._launch(self._fn, gx, gy, gz, bx, by, bz, 0, stream, addr, 0)[0]
        if err == self._ok:
            return
        if err == self._no_context:  # a thread without the device's context current (driver API)
            err = _in_primary_context(self._device_id,
                                      lambda: self._launch(self._fn, gx, gy, gz, bx, by, bz, 0, stream, addr, 0)[0])
            if err == self._ok:
                return
        raise CudaError(f"cuLaunchKernel({self.name})", str(err), "")


_primary: dict[int, Any] = {}  # device -> its primary context, retained once for the process


def _in_primary_context(device_id: int, call: Callable[[], Any]) -> Any:
    """``call()`` with ``device_id``'s primary context pushed on this thread, and popped after: whatever context
    the caller had current (none, where a launch found none) is current again afterwards."""
    from cuda.bindings import driver

    ctx = _primary.get(device_id)
    if ctx is None:
        err, dev = driver.cuDeviceGet(device_id)
        if err == driver.CUresult.CUDA_SUCCESS:
            err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise CudaError("cuDevicePrimaryCtxRetain", str(err), f"device {device_id}")
        _primary[device_id] = ctx
    err = driver.cuCtxPushCurrent(ctx)[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CudaError("cuCtxPushCurrent", str(err), f"device {device_id}")
    try:
        return call()
    finally:
        driver.cuCtxPopCurrent()


def ptr(value: int) -> np.uint64:
    return np.uint64(value)
