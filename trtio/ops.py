"""Stream-ordered device operations on tensor rows, for both backends.

The step helpers move rows between buffers whose indices change every step (RoPE rows gathered at each
token's position, hidden-state rows of accepted tree nodes). Each operation here is one device
operation: a kernel on the cuda backend (:mod:`trtio.cuda.kernels`), one numpy pass on the host
backend (run in stream order, recorded while the stream is captured). Indices are read when the work
runs, from device tensors the caller staged, so a captured graph replays with fresh indices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trtio.cuda._hostmem import host_view
from trtio.cuda.backend import Backend
from trtio.stream import Stream
from trtio.tensor import Tensor

__all__ = ["KVLayout", "commit_kv", "copy_rows", "warm_up"]

_BLOCK = 128


def warm_up(backend: Backend) -> None:
    """Compile the device kernels now (a setup calls this so that no step compiles)."""
    if backend.name == "cuda":
        from trtio.cuda import kernels

        kernels.kernels(backend.device_id)


def copy_rows(dst: Tensor, src: Tensor, src_rows: Tensor, count: int, *, row_bytes: int, stream: Stream,
              dst_rows: Tensor | None = None) -> None:
    """For ``i < count``: row ``dst_rows[i]`` (``i`` without ``dst_rows``) of ``dst`` becomes row
    ``src_rows[i]`` of ``src``, or zeros where that index is negative. Rows are ``row_bytes`` wide from
    each tensor's address; ``dst`` and ``src`` must not overlap. Index tensors are int32 on the device.

    An index outside a tensor's capacity raises on the host backend (from the enqueued work) and is
    skipped on the cuda backend (checking would synchronise the host).
    """
    if count <= 0:
        return
    be = dst.backend
    dst_cap, src_cap = dst.capacity // row_bytes, src.capacity // row_bytes
    if be.name == "cuda":
        from trtio.cuda import kernels

        kernels.launch(be.device_id, "trtio_copy_rows", stream.handle, count, _BLOCK,
                       kernels.ptr(dst.data_ptr), kernels.ptr(dst_rows.data_ptr if dst_rows is not None else 0),
                       kernels.ptr(src.data_ptr), kernels.ptr(src_rows.data_ptr), np.int32(count),
                       np.int64(row_bytes), np.int64(dst_cap), np.int64(src_cap))
        return
    d_ptr, s_ptr, si_ptr = dst.data_ptr, src.data_ptr, src_rows.data_ptr
    di_ptr = dst_rows.data_ptr if dst_rows is not None else 0
    what = f"copy_rows {src.name!r} -> {dst.name!r}"

    def run() -> None:
        s_idx = host_view(si_ptr, 4 * count).view(np.int32).astype(np.int64)
        d_idx = host_view(di_ptr, 4 * count).view(np.int32).astype(np.int64) if di_ptr else np.arange(count)
        for label, idx, cap in (("source", s_idx, src_cap), ("destination", d_idx, dst_cap)):
            bad = np.flatnonzero(idx >= cap) if label == "source" else np.flatnonzero((idx < 0) | (idx >= cap))
            if bad.size:
                raise ValueError(f"{what}: {label} row {int(idx[bad[0]])} at index {int(bad[0])} is outside the "
                                 f"{cap} rows of the tensor")
        out = host_view(d_ptr, dst_cap * row_bytes).reshape(dst_cap, row_bytes)
        rows = host_view(s_ptr, src_cap * row_bytes).reshape(src_cap, row_bytes)[np.maximum(s_idx, 0)]
        rows[s_idx < 0] = 0
        out[d_idx] = rows

    launch = getattr(be, "launch_host_func", None)
    if launch is None:
        raise TypeError(f"backend {be.name!r} cannot run host work in stream order")
    launch(stream.handle, run)


@dataclass(frozen=True)
class KVLayout:
    """Where a token's cache entry lives, per sequence slot: the geometry :func:`commit_kv` walks.

    ``paged``: pools ``[2, P, page, H, D]`` read through ``page_table`` [B, 2, M] (K ids in row 0, V ids in
    row 1); else contiguous caches ``[B, H, C, D]``. ``entry_bytes`` is one piece of an entry: ``D``
    elements for a contiguous cache (one piece per head), ``H * D`` for a pool (a K piece and a V piece).
    """

    paged: bool
    heads: int
    capacity: int  # contiguous: slots per sequence; paged: page size
    entry_bytes: int
    pool_pages: int = 0
    max_pages: int = 0


def commit_kv(caches: Sequence[Tensor], table: Tensor, moves: Tensor, batch: int, stride: int, layout: KVLayout,
              *, stream: Stream, page_table: Tensor | None = None) -> None:
    """Move cache entries of every cache in one device operation: for each sequence slot ``b < batch``,
    row ``b`` of ``moves`` (int32 ``[batch, stride]``) is ``[n, src0, dst0, src1, dst1, ...]``; entry ``src_i``
    of sequence ``b`` is copied to ``dst_i`` in order, in every cache. ``table`` holds the caches' addresses
    (uint64, on the device). Moves are read when the work runs (a captured graph replays fresh paths).
    """
    be = moves.backend
    n_caches = len(caches)
    if layout.paged:
        chunks, chunk_stride, seq_stride, slot_stride = 2, 0, 0, 0
    else:
        chunks, slot_stride = layout.heads, layout.entry_bytes
        chunk_stride = layout.capacity * layout.entry_bytes
        seq_stride = layout.heads * chunk_stride
    if be.name == "cuda":
        from trtio.cuda import kernels

        pt = page_table.data_ptr if page_table is not None else 0
        kernels.launch(be.device_id, "trtio_kv_commit", stream.handle, (n_caches, batch), _BLOCK,
                       kernels.ptr(table.data_ptr), kernels.ptr(moves.data_ptr), np.int32(stride),
                       np.int32(1 if layout.paged else 0), np.int64(layout.entry_bytes), np.int32(chunks),
                       np.int64(chunk_stride), np.int64(seq_stride), np.int64(slot_stride), kernels.ptr(pt),
                       np.int32(layout.max_pages), np.int32(layout.capacity), np.int64(2 * layout.pool_pages))
        return
    ptrs = [t.data_ptr for t in caches]
    sizes = [t.capacity for t in caches]
    unit = math.gcd(layout.entry_bytes, *[p - min(ptrs) for p in ptrs]) if len(ptrs) > 1 else layout.entry_bytes
    mv_ptr = moves.data_ptr
    pt_ptr = page_table.data_ptr if page_table is not None else 0

    def run() -> None:
        rows = host_view(mv_ptr, 4 * batch * stride).view(np.int32).reshape(batch, stride)
        n = rows[:, 0].astype(np.int64)
        if (n < 0).any() or (2 * n + 1 > stride).any():
            raise ValueError(f"commit_kv: move counts {n.tolist()} do not fit rows of {stride} ints")
        seq = np.repeat(np.arange(batch), n)
        pairs = np.concatenate([rows[b, 1:1 + 2 * int(n[b])].reshape(-1, 2) for b in range(batch)]) \
            if n.sum() else np.zeros((0, 2), np.int32)
        src, dst = pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)
        if layout.paged:
            pages = host_view(pt_ptr, 4 * batch * 2 * layout.max_pages).view(np.int32)
            pages = pages.reshape(batch, 2, layout.max_pages).astype(np.int64)
            page = layout.capacity
            if (np.maximum(src, dst) // page >= layout.max_pages).any():
                raise ValueError(f"commit_kv: a slot past the {layout.max_pages} pages of a sequence")
            # Entry rows in the pool viewed [2P * page, H * D]: K pieces (table row 0), then V pieces (row 1).
            s_rows = np.concatenate([pages[seq, h, src // page] * page + src % page for h in (0, 1)])
            d_rows = np.concatenate([pages[seq, h, dst // page] * page + dst % page for h in (0, 1)])
        else:
            cap = layout.capacity
            if (np.maximum(src, dst) >= cap).any():
                raise ValueError(f"commit_kv: a slot past the cache capacity {cap}")
            heads = np.arange(layout.heads)
            # Entry rows in the cache viewed [B * H * C, D]: one piece per head.
            s_rows = ((seq[:, None] * layout.heads + heads) * cap + src[:, None]).reshape(-1)
            d_rows = ((seq[:, None] * layout.heads + heads) * cap + dst[:, None]).reshape(-1)
        # One gather/scatter over every cache: view the span they share as rows of `unit` bytes (a piece of
        # an entry is `pieces` consecutive rows) and offset each cache's rows by its distance from the first.
        piece = layout.entry_bytes // unit
        base = min(ptrs)
        first = np.array([(p - base) // unit for p in ptrs], np.int64)[:, None]
        s_all = ((first + s_rows[None, :] * piece)[..., None] + np.arange(piece)).reshape(-1)
        d_all = ((first + d_rows[None, :] * piece)[..., None] + np.arange(piece)).reshape(-1)
        view = host_view(base, max(p + z for p, z in zip(ptrs, sizes)) - base).reshape(-1, unit)
        # Reading every source before writing equals the in-order moves: a path is increasing, so no
        # source is overwritten by an earlier move.
        view[d_all] = view[s_all]

    launch = getattr(be, "launch_host_func", None)
    if launch is None:
        raise TypeError(f"backend {be.name!r} cannot run host work in stream order")
    launch(stream.handle, run)
