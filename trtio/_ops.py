"""Stream-ordered device operations on tensor rows, for both backends.

The step helpers move rows between buffers whose indices change every step (RoPE rows gathered at each
token's position, hidden-state rows of accepted tree nodes). Each operation here is one device
operation: a kernel on the cuda backend (:mod:`trtio._cuda.kernels`), one numpy pass on the host
backend (run in stream order, recorded while the stream is captured). Indices are read when the work
runs, from device tensors the caller staged, so a captured graph replays with fresh indices.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtio._cuda._hostmem import host_view
from trtio._cuda.backend import Backend, destroy_graphs
from trtio._hashing import hash_once
from trtio._lifetime import Closeable
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio.errors import InvalidTypeError, InvalidValueError, ShapeError

__all__ = ["CatchUpLayout", "CatchUpTargets", "Copy", "Copy2D", "CopyJobs", "DecodeAdvance", "DraftLevel",
           "DraftTreeBuffers", "KVCommit", "KVLayout",
           "AsGraph", "OwnGraphs", "copy_pages",
           "RowCopy", "TreeStep", "TreeTargets", "Zero", "Zero2D", "copy_rows", "fuse", "warm_up"]

_BLOCK = 128
_ROW_SPAN = 16 * 4 * _BLOCK  # bytes of a row one block copies: a 16-byte word x TRTIO_UNROLL per thread


def warm_up(backend: Backend) -> None:
    """Compile the device kernels now (a setup calls this so that no step compiles)."""
    if backend.name == "cuda":
        from trtio._cuda import kernels

        kernels.kernels(backend.device_id)


def copy_rows(dst: Tensor, src: Tensor, src_rows: Tensor, count: int, *, row_bytes: int, stream: Stream,
              dst_rows: Tensor | None = None) -> None:
    """For ``i < count``: row ``dst_rows[i]`` (``i`` without ``dst_rows``) of ``dst`` becomes row
    ``src_rows[i]`` of ``src``, or zeros where that index is negative; a negative ``dst_rows[i]`` writes
    nothing. Rows are ``row_bytes`` wide from each tensor's address; ``dst`` and ``src`` must not overlap.
    Index tensors are int32 on the device.

    An index outside a tensor's capacity raises on the host backend (from the enqueued work) and is
    skipped on the cuda backend (checking would synchronise the host).
    """
    if count <= 0:
        return
    be = dst.backend
    dst_cap, src_cap = dst.capacity // row_bytes, src.capacity // row_bytes
    if be.name == "cuda":
        job = (dst.data_ptr, dst_rows.data_ptr if dst_rows is not None else 0, src.data_ptr, src_rows.data_ptr,
               count, row_bytes, row_bytes, row_bytes, dst_cap, src_cap)
        _copy_jobs(be, (job,))(stream.handle)
        return
    d_ptr, s_ptr, si_ptr = dst.data_ptr, src.data_ptr, src_rows.data_ptr
    di_ptr = dst_rows.data_ptr if dst_rows is not None else 0
    what = f"copy_rows {src.name!r} -> {dst.name!r}"

    def run() -> None:
        s_idx = host_view(si_ptr, 4 * count).view(np.int32).astype(np.int64)
        d_idx = host_view(di_ptr, 4 * count).view(np.int32).astype(np.int64) if di_ptr else np.arange(count)
        for label, idx, cap in (("source", s_idx, src_cap), ("destination", d_idx, dst_cap)):
            bad = np.flatnonzero(idx >= cap)
            if bad.size:
                raise InvalidValueError(f"{what}: {label} row {int(idx[bad[0]])} at index {int(bad[0])} is outside the "
                                 f"{cap} rows of the tensor")
        # Rows as single void elements: numpy moves each with one memcpy.
        out = _rows(d_ptr, dst_cap, row_bytes)
        rows = _rows(s_ptr, src_cap, row_bytes)[np.maximum(s_idx, 0)]
        if (s_idx < 0).any():
            rows.view(np.uint8).reshape(count, row_bytes)[s_idx < 0] = 0
        keep = d_idx >= 0
        out[d_idx[keep]] = rows[keep]

    _host_work(be, stream, run)


def copy_pages(pools: Sequence[Tensor], pool_pages: int, moves: Sequence[tuple[int, int]], stream: Stream) -> None:
    """For each ``(src, dst)`` of ``moves``: page ``dst`` of every paged KV pool (``[2, P, page, H, D]``, K
    pages then V pages) becomes a copy of page ``src``, K and V. A sequence's copy of a shared page before it
    writes there (copy on write): rare, so enqueued as plain copies, outside any graph. Each pool's page bytes and
    K/V planes come from its own shape (Gemma 4's layers differ in head dim): pools of one geometry spaced evenly in
    memory (one arena) take one 2D copy per page and half (K, V) whatever the layer count. ``pool_pages``: the pages
    of a pool whose shape does not say (not ``[2, P, ...]``)."""
    if not moves or not pools:
        return
    be = pools[0].backend
    geometry = [_page_geometry(p, pool_pages) for p in pools]  # (page bytes, bytes of the K plane)
    stride = pools[1].data_ptr - pools[0].data_ptr if len(pools) > 1 else 0
    even = stride > 0 and all(g == geometry[0] for g in geometry) and \
        all(p.data_ptr == pools[0].data_ptr + i * stride for i, p in enumerate(pools))
    for src, dst in moves:
        for plane in (0, 1):
            if even or len(pools) == 1:
                page_bytes, half = geometry[0]
                base = pools[0].data_ptr + plane * half
                be.memcpy_2d(base + dst * page_bytes, stride or page_bytes, base + src * page_bytes,
                             stride or page_bytes, page_bytes, len(pools), stream.handle)
            else:
                for p, (page_bytes, half) in zip(pools, geometry):
                    base = p.data_ptr + plane * half
                    be.memcpy(base + dst * page_bytes, base + src * page_bytes, page_bytes, stream.handle)


def _page_geometry(pool: Tensor, pool_pages: int) -> tuple[int, int]:
    """``(bytes of one page, bytes of the K plane)`` of a paged pool ``[2, P, page, H, D]``."""
    shape = pool.shape
    if len(shape) == 5 and shape[0] == 2:
        page_bytes = int(np.prod(shape[2:], dtype=np.int64)) * pool.dtype.itemsize
        return page_bytes, int(shape[1]) * page_bytes
    page_bytes = pool.capacity // (2 * pool_pages)
    return page_bytes, pool_pages * page_bytes


def _host_work(be: Backend, stream: Stream, run: Any) -> None:
    """Enqueue ``run`` (the host backend's version of a kernel) in ``stream``'s order."""
    launch = getattr(be, "launch_host_func", None)
    if launch is None:
        raise InvalidTypeError(f"backend {be.name!r} cannot run host work in stream order")
    launch(stream.handle, run)


_job_launches: dict[tuple[Any, ...], Any] = {}  # the packed copy launches of the last few hundred job lists


def _copy_jobs(be: Backend, jobs: tuple[tuple[int, ...], ...]) -> Any:
    """The packed launch of ``trtio_copy_jobs`` for ``jobs`` (see :func:`trtio._cuda.kernels.copy_jobs`)."""
    key = (be.device_id, jobs)
    found = _job_launches.get(key)
    if found is None:
        from trtio._cuda import kernels

        if len(_job_launches) >= 512:
            _job_launches.clear()
        found = _job_launches[key] = kernels.copy_jobs(be.device_id, jobs, _ROW_SPAN, _BLOCK)
    return found


def _kernel(work: Any, name: str, grid: int | tuple[int, ...], *args: Any) -> Any:
    """The packed launch of a frozen work value's kernel, made on its first run and kept on it."""
    found = work.__dict__.get("_launch")
    if found is None:
        from trtio._cuda import kernels

        be = work.backend
        found = work.__dict__["_launch"] = kernels.Launch(be.device_id, name, grid, _BLOCK, *args)
    return found


def _ptr(t: Tensor | None) -> np.uint64:
    return np.uint64(t.data_ptr if t is not None else 0)


def _rows(ptr: int, n: int, row_bytes: int) -> np.ndarray:
    """The host backend's view of ``n`` rows of ``row_bytes`` at a device pointer, a row per (void) element."""
    return host_view(ptr, n * row_bytes).view(np.dtype((np.void, row_bytes)))


def _ints(ptr: int, n: int) -> np.ndarray:
    """The host backend's int32 view of ``n`` values at a device pointer."""
    return host_view(ptr, 4 * n).view(np.int32)


@hash_once
@dataclass(frozen=True)
class RowCopy:
    """:func:`copy_rows` as a value: device work an engine step needs first, enqueued with it, so an
    executor can capture both in one graph (:meth:`EngineExecutor.execute`'s ``before``). Equal values
    (the same tensors, count and row width) are the same work: their indices are read when it runs."""

    dst: Tensor
    src: Tensor
    src_rows: Tensor
    count: int
    row_bytes: int
    dst_rows: Tensor | None = None

    def enqueue(self, stream: Stream) -> None:
        copy_rows(self.dst, self.src, self.src_rows, self.count, row_bytes=self.row_bytes, stream=stream,
                  dst_rows=self.dst_rows)

    def job(self) -> tuple[int, ...]:
        """This copy as a ``trtio_copy_jobs`` job."""
        b = self.row_bytes
        return (self.dst.data_ptr, self.dst_rows.data_ptr if self.dst_rows is not None else 0, self.src.data_ptr,
                self.src_rows.data_ptr, self.count, b, b, b, self.dst.capacity // b, self.src.capacity // b)


@hash_once
@dataclass(frozen=True)
class Zero:
    """The first ``nbytes`` of a device tensor set to 0, as a value (see :class:`RowCopy`)."""

    tensor: Tensor
    nbytes: int

    @property
    def backend(self) -> Backend:
        return self.tensor.backend

    def enqueue(self, stream: Stream) -> None:
        t = self.tensor
        t.backend.memset(t.data_ptr, 0, self.nbytes, stream.handle)
        t._last_stream = stream

    def job(self) -> tuple[int, ...]:
        """This zeroing as a ``trtio_copy_jobs`` job (one row, no source)."""
        return (self.tensor.data_ptr, 0, 0, 0, 1, self.nbytes, 0, 0, 1, 1)


@hash_once
@dataclass(frozen=True)
class Copy2D:
    """``height`` rows of ``width`` bytes from device address ``src`` (rows ``spitch`` apart) to ``dst``
    (``dpitch`` apart), as a value (see :class:`RowCopy`): a copy a captured graph replays from the same
    addresses, so only for buffers that stay in place (a runtime's embedding output)."""

    backend: Backend
    dst: int
    dpitch: int
    src: int
    spitch: int
    width: int
    height: int

    def enqueue(self, stream: Stream) -> None:
        self.backend.memcpy_2d(self.dst, self.dpitch, self.src, self.spitch, self.width, self.height, stream.handle)

    def job(self) -> tuple[int, ...]:
        """This copy as a ``trtio_copy_jobs`` job."""
        h = self.height
        return (self.dst, 0, self.src, 0, h, self.width, self.dpitch, self.spitch, h, h)


@hash_once
@dataclass(frozen=True)
class Zero2D:
    """``height`` rows of ``width`` bytes at device address ``dst`` (rows ``dpitch`` apart) set to 0, as a value
    (see :class:`RowCopy`): one slot's row in each of several evenly spaced pools (a hybrid model's recurrent
    states, zeroed when a sequence takes the slot)."""

    backend: Backend
    dst: int
    dpitch: int
    width: int
    height: int

    def enqueue(self, stream: Stream) -> None:
        if self.backend.name == "cuda":
            _copy_jobs(self.backend, (self.job(),))(stream.handle)
            return
        dst, pitch, width, height = self.dst, self.dpitch, self.width, self.height

        def run() -> None:
            for r in range(height):
                host_view(dst + r * pitch, width)[:] = 0

        _host_work(self.backend, stream, run)

    def job(self) -> tuple[int, ...]:
        """This zeroing as a ``trtio_copy_jobs`` job (rows without a source)."""
        h = self.height
        return (self.dst, 0, 0, 0, h, self.width, self.dpitch, 0, h, h)


Copy = RowCopy | Zero | Copy2D | Zero2D


@hash_once
@dataclass(frozen=True)
class CopyJobs:
    """Copies of which none reads what another writes, as one value (see :class:`RowCopy`): one kernel on
    the cuda backend (a graph node, where each copy alone would be one), the copies in turn elsewhere."""

    copies: tuple[Copy, ...]

    def __post_init__(self) -> None:
        spans = [_spans(c) for c in self.copies]
        for i, (dst, _src) in enumerate(spans):
            for j, (other_dst, other_src) in enumerate(spans):
                if i != j and (_overlap(dst, other_dst) or other_src is not None and _overlap(dst, other_src)):
                    raise InvalidValueError(f"CopyJobs: copy {i} writes memory that copy {j} reads or writes; such "
                                            f"copies must run one after the other")

    def enqueue(self, stream: Stream) -> None:
        first = self.copies[0]
        be = first.dst.backend if isinstance(first, RowCopy) else first.backend
        if be.name != "cuda":
            for c in self.copies:
                c.enqueue(stream)
            return
        found = self.__dict__.get("_launch")
        if found is None:
            found = self.__dict__["_launch"] = _copy_jobs(be, tuple(c.job() for c in self.copies))
        found(stream.handle)
        for c in self.copies:
            if isinstance(c, Zero):
                c.tensor._last_stream = stream


class OwnGraphs(Closeable):
    """CUDA graphs of single device works, each captured at the work's first enqueue and kept
    until :meth:`close` (its owner closes it): launching a one-kernel graph costs the host less than launching the
    kernel it holds (a few µs through cuda-bindings). Works are kept by value (equal works share one graph), so an
    owner uses it for a bounded set of works (one per slot, say). Follows trtio's close protocol."""

    def __init__(self, backend: Backend, title: str) -> None:
        self.backend = backend
        self._graphs: dict[Any, int] = {}
        self._init_lifetime(title, destroy_graphs, backend, self._graphs, warn=False)

    def __len__(self) -> int:
        """Graphs held."""
        return len(self._graphs)

    def launch(self, work: Any, stream: Stream) -> None:
        """Enqueue ``work`` on ``stream``: its graph launched (captured first, once), or the work itself where
        ``stream`` is being captured (the caller's graph then holds it)."""
        be, h = self.backend, stream.handle
        if be.is_capturing(h):
            work.enqueue(stream)
            return
        self._check_open()
        graph = self._graphs.get(work)
        if graph is None:
            be.begin_capture(h)
            try:
                work.enqueue(stream)
            except BaseException:
                be.abort_capture(h)
                raise
            graph = self._graphs[work] = be.end_capture(h)
        be.launch_graph(graph, h)


@dataclass(frozen=True)
class AsGraph:
    """``work`` enqueued as a graph of its own, kept by ``graphs`` (:class:`OwnGraphs`): a device work as any other
    (equal when the work and the owner are)."""

    work: Any
    graphs: OwnGraphs = field(compare=False)
    owner: int = 0  # id(graphs): two owners' graphs of one work are different works

    def enqueue(self, stream: Stream) -> None:
        self.graphs.launch(self.work, stream)


# The bytes a copy touches on one side: rows of ``width`` bytes, ``pitch`` apart, from ``start`` (``height`` rows), and
# the span from the first row's first byte to the last row's end: (first, end, start, pitch, width, height). Rows
# that meet or overlap one another are one row of the whole span (height 1), so pitch > width wherever height > 1.
_Strided = tuple[int, int, int, int, int, int]


def _strided(start: int, pitch: int, width: int, height: int) -> _Strided:
    if height > 1 and pitch < 0:  # the same rows, counted from the lowest
        start, pitch = start + pitch * (height - 1), -pitch
    end = start + pitch * (height - 1) + width if height > 1 else start + width
    if height <= 1 or pitch <= width:
        return (start, end, start, end - start, end - start, 1)
    return (start, end, start, pitch, width, height)


def _spans(c: Copy) -> tuple[_Strided, _Strided | None]:
    """The rows of bytes a copy writes and reads (its tensors' whole capacity for a row copy, whose rows are read
    from the device when it runs)."""
    if isinstance(c, RowCopy):
        return (_strided(c.dst.data_ptr, c.dst.capacity, c.dst.capacity, 1),
                _strided(c.src.data_ptr, c.src.capacity, c.src.capacity, 1))
    if isinstance(c, Zero):
        return _strided(c.tensor.data_ptr, c.nbytes, c.nbytes, 1), None
    if isinstance(c, Zero2D):
        return _strided(c.dst, c.dpitch, c.width, c.height), None
    return _strided(c.dst, c.dpitch, c.width, c.height), _strided(c.src, c.spitch, c.width, c.height)


def _overlap(a: _Strided, b: _Strided) -> bool:
    """Whether a row of ``a`` and a row of ``b`` share a byte: exact, not the spans' first-to-last bytes (a hybrid
    model's state pools, evenly spaced, hold each slot's rows between another slot's). Spans apart (most pairs)
    cost one comparison; rows of one pitch, or a single row against rows, a few more; rows of two pitches one such
    test per row of the fewer."""
    if a[0] >= b[1] or b[0] >= a[1]:
        return False
    if a[5] == 1 and b[5] == 1:
        return True
    if a[5] == 1:
        return _row_meets(a[2], a[2] + a[4], b)
    if b[5] == 1:
        return _row_meets(b[2], b[2] + b[4], a)
    if a[3] == b[3]:  # row i of a and row j of b share a byte iff d - wb < (j - i) p < d + wa, d = a - b
        p, d = a[3], a[2] - b[2]
        m = max((d - b[4]) // p + 1, 1 - a[5])
        return m <= b[5] - 1 and m * p < d + a[4]
    fewer, more = (a, b) if a[5] <= b[5] else (b, a)
    return any(_row_meets(r, r + fewer[4], more) for r in range(fewer[2], fewer[1], fewer[3]))


def _row_meets(lo: int, hi: int, rows: _Strided) -> bool:
    """Whether bytes ``lo .. hi - 1`` meet one of ``rows``' rows (the first that ends after ``lo`` starts before
    ``hi``)."""
    start, pitch, width, height = rows[2], rows[3], rows[4], rows[5]
    j = max((lo - width - start) // pitch + 1, 0)
    return j < height and start + j * pitch < hi


def fuse(copies: Sequence[Any]) -> tuple[Any, ...]:
    """``copies`` (:data:`Copy` values, none reading what another writes) as the fewest works: a
    :class:`CopyJobs` per ``MAX_COPY_JOBS`` of them, a single copy as itself."""
    from trtio._cuda.kernels import MAX_COPY_JOBS

    for c in copies:
        if not isinstance(c, (RowCopy, Zero, Copy2D, Zero2D)):
            raise InvalidTypeError(f"fuse: {type(c).__name__} is not a copy (RowCopy, Zero, Copy2D or Zero2D)")
    if len(copies) < 2:
        return tuple(copies)
    return tuple(CopyJobs(tuple(copies[i:i + MAX_COPY_JOBS])) for i in range(0, len(copies), MAX_COPY_JOBS))


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


class KVCommit(Closeable):
    """Everything :meth:`run` needs to move cache entries of every KV cache of a state in one device
    operation, worked out once (addresses, strides, the host view's row unit)."""

    def __init__(self, caches: Sequence[Tensor], table: Tensor, layout: KVLayout,
                 page_table: Tensor | None = None) -> None:
        self.backend = table.backend
        self.layout = layout
        self.n_caches = len(caches)
        self.table_ptr = table.data_ptr
        self.page_table_ptr = page_table.data_ptr if page_table is not None else 0
        if layout.paged:
            self.chunks, self.chunk_stride, self.seq_stride, self.slot_stride = 2, 0, 0, 0
        else:
            self.chunks, self.slot_stride = layout.heads, layout.entry_bytes
            self.chunk_stride = layout.capacity * layout.entry_bytes
            self.seq_stride = layout.heads * self.chunk_stride
        ptrs = [t.data_ptr for t in caches]
        self.base = min(ptrs)
        # Evenly spaced caches of one size (an arena's), in whole entry pieces: the host moves the pieces of
        # every cache at once through a strided view [caches, pieces]; else rows of the shared unit below.
        piece_bytes = layout.entry_bytes
        sizes = {t.capacity for t in caches}
        steps = {b - a for a, b in zip(ptrs, ptrs[1:])} or {0}
        step = steps.pop()
        even = len(sizes) == 1 and not steps and ptrs == sorted(ptrs) and piece_bytes > 0
        self.stride = step if even and step % piece_bytes == 0 and caches[0].capacity % piece_bytes == 0 else 0
        self.cache_pieces = caches[0].capacity // layout.entry_bytes if self.stride else 0
        # The host view: the span every cache shares, in rows of `unit` bytes (an entry piece is `piece` rows).
        self.unit = math.gcd(layout.entry_bytes, *[p - self.base for p in ptrs])
        self.piece = layout.entry_bytes // self.unit
        self.first = np.array([(p - self.base) // self.unit for p in ptrs], np.int64)[:, None]
        self.span = max(p + t.capacity for p, t in zip(ptrs, caches)) - self.base
        self._graphs: dict[tuple[int, int, int, int], int] = {}  # cuda: its graph per (moves, batch, stride, starts)
        # Its owner (a state) warns when dropped unclosed; the graphs then go silently.
        self._init_lifetime(f"the KV commit of {self.n_caches} caches", destroy_graphs, self.backend, self._graphs,
                            warn=False)

    def _capture(self, key: tuple[int, int, int, int], stream: Stream) -> int:
        """The kernel of ``key`` captured in a graph of its own; 0 after launching it directly, where
        ``stream`` is already being captured (by a caller: the launch joins the caller's graph)."""
        from trtio._cuda import kernels

        self._check_open()
        lay, be = self.layout, self.backend
        moves_ptr, batch, stride, starts_ptr = key
        launch = kernels.Launch(
            be.device_id, "trtio_kv_commit", (self.n_caches, batch), _BLOCK, kernels.ptr(self.table_ptr),
            kernels.ptr(moves_ptr), np.int32(stride), np.int32(1 if lay.paged else 0),
            np.int64(lay.entry_bytes), np.int32(self.chunks), np.int64(self.chunk_stride),
            np.int64(self.seq_stride), np.int64(self.slot_stride), kernels.ptr(self.page_table_ptr),
            np.int32(lay.max_pages), np.int32(lay.capacity), np.int64(2 * lay.pool_pages), kernels.ptr(starts_ptr))
        h = stream.handle
        if be.is_capturing(h):
            launch(h)
            return 0
        be.begin_capture(h)
        try:
            launch(h)
        except BaseException:
            be.abort_capture(h)
            raise
        graph = self._graphs[key] = be.end_capture(h)
        return graph

    def run(self, moves: Tensor, batch: int, stride: int, stream: Stream, *,
            starts: Tensor | None = None) -> None:
        """For each sequence slot ``b < batch``, row ``b`` of ``moves`` (int32 ``[batch, stride]``) is
        ``[start, n, node_0, ..., node_{n-1}]``, an accepted path of ``n`` nodes (``node_0`` the root): entry
        ``start + node_j`` of sequence ``b`` is copied to ``start + j`` for ``j = 1 .. n - 1``, in order, in
        every cache. With ``starts`` (int32 ``[batch]`` on the device: the cached lengths a step staged there),
        ``start`` is ``starts[b]`` and the rows' first ints are not read. Moves and starts are read when the
        work runs (a captured graph replays fresh paths)."""
        lay, be = self.layout, self.backend
        starts_ptr = 0 if starts is None else starts.data_ptr
        if be.name == "cuda":
            key = (moves.data_ptr, batch, stride, starts_ptr)
            graph = self._graphs.get(key)
            fresh = graph is None
            if graph is None:
                graph = self._capture(key, stream)
            if graph:
                try:
                    be.launch_graph(graph, stream.handle)  # a one-kernel graph: cheaper to launch than the kernel
                except BaseException:
                    if fresh:  # a step that fails leaves no graph behind it
                        del self._graphs[key]
                        be.destroy_graph(graph)
                    raise
            return
        mv_ptr = moves.data_ptr

        def run() -> None:
            rows = host_view(mv_ptr, 4 * batch * stride).view(np.int32).reshape(batch, stride).astype(np.int64)
            start, n = rows[:, 0], rows[:, 1]
            if starts_ptr:
                start = host_view(starts_ptr, 4 * batch).view(np.int32).astype(np.int64)
            if (n < 1).any() or (n + 2 > stride).any():
                raise ShapeError(f"commit_kv: path lengths {n.tolist()} do not fit rows of {stride} ints")
            j = np.arange(stride - 2)[None, :]
            seq, at = np.nonzero((j > 0) & (j < n[:, None]))  # every node after each root moves
            src, dst = start[seq] + rows[seq, 2 + at], start[seq] + at
            if lay.paged:
                pages = host_view(self.page_table_ptr, 4 * batch * 2 * lay.max_pages).view(np.int32)
                pages = pages.reshape(batch, 2, lay.max_pages).astype(np.int64)
                page = lay.capacity
                if (np.maximum(src, dst) // page >= lay.max_pages).any():
                    raise InvalidValueError(f"commit_kv: a slot past the {lay.max_pages} pages of a sequence")
                # Entry rows in a pool viewed [2P * page, H * D]: K pieces (table row 0), then V (row 1).
                s_rows = np.concatenate([pages[seq, h, src // page] * page + src % page for h in (0, 1)])
                d_rows = np.concatenate([pages[seq, h, dst // page] * page + dst % page for h in (0, 1)])
            else:
                cap = lay.capacity
                if (np.maximum(src, dst) >= cap).any():
                    raise InvalidValueError(f"commit_kv: a slot past the cache capacity {cap}")
                heads = np.arange(lay.heads)
                # Entry rows in a cache viewed [B * H * C, D]: one piece per head.
                s_rows = ((seq[:, None] * lay.heads + heads) * cap + src[:, None]).reshape(-1)
                d_rows = ((seq[:, None] * lay.heads + heads) * cap + dst[:, None]).reshape(-1)
            moved = s_rows != d_rows  # an entry already in place stays
            s_rows, d_rows = s_rows[moved], d_rows[moved]
            if not s_rows.size:
                return
            # Reading every source before writing equals the in-order moves: a path is increasing, so no
            # source is overwritten by an earlier move.
            if self.stride:
                span = (self.n_caches - 1) * self.stride + self.cache_pieces * lay.entry_bytes
                pieces = _rows(self.base, span // lay.entry_bytes, lay.entry_bytes)
                caches = np.lib.stride_tricks.as_strided(pieces, (self.n_caches, self.cache_pieces),
                                                         (self.stride, lay.entry_bytes), writeable=True)
                caches[:, d_rows] = caches[:, s_rows]
                return
            piece = np.arange(self.piece)
            s_all = ((self.first + s_rows[None, :] * self.piece)[..., None] + piece).reshape(-1)
            d_all = ((self.first + d_rows[None, :] * self.piece)[..., None] + piece).reshape(-1)
            view = _rows(self.base, self.span // self.unit, self.unit)
            view[d_all] = view[s_all]

        _host_work(be, stream, run)


@hash_once
@dataclass(frozen=True)
class DecodeAdvance:
    """A decode step's per-sequence inputs made on the device from its own copy of the lengths, which it
    then advances: for ``i < batch``, ``past[i] = asl[i] - 1 = lengths[i]`` (the ragged contract's past and
    attention lengths, or the batch contract's start index and context lengths), ``positions[i] =
    lengths[i]`` and the MRoPE row ``slots[i] * rope_cap + lengths[i]`` (``i`` for ``slots[i]`` without
    ``slots``: the slot whose table the row is in) when those are given, then ``lengths[i] += 1``. Steady
    decode steps so upload nothing: their graph replays as it is. All tensors are int32 on the device."""

    lengths: Tensor
    batch: int
    past: Tensor
    asl: Tensor
    positions: Tensor | None = None
    rope_rows: Tensor | None = None
    rope_cap: int = 0
    slots: Tensor | None = None

    @property
    def backend(self) -> Backend:
        return self.lengths.backend

    def enqueue(self, stream: Stream) -> None:
        b, cap = self.batch, self.rope_cap
        if self.backend.name == "cuda":
            _kernel(self, "trtio_decode_advance", -(-b // _BLOCK), _ptr(self.lengths), np.int32(b), _ptr(self.past),
                    _ptr(self.asl), _ptr(self.positions), _ptr(self.rope_rows), np.int64(cap),
                    _ptr(self.slots))(stream.handle)
            return
        ptrs = (self.lengths.data_ptr, self.past.data_ptr, self.asl.data_ptr)
        at = self.positions.data_ptr if self.positions is not None else 0
        rope = self.rope_rows.data_ptr if self.rope_rows is not None else 0
        slots = self.slots.data_ptr if self.slots is not None else 0

        def run() -> None:
            lengths, past, asl = (_ints(p, b) for p in ptrs)
            past[:] = lengths
            asl[:] = lengths + 1
            if at:
                _ints(at, b)[:] = lengths
            if rope:
                which = _ints(slots, b) if slots else np.arange(b, dtype=np.int32)
                _ints(rope, b)[:] = which * cap + lengths
            lengths += 1

        _host_work(self.backend, stream, run)


@dataclass(frozen=True, eq=False)
class DraftTreeBuffers:
    """Where a draft tree lives on the device, for :class:`DraftLevel`: the tree itself (``words``: packed
    ancestor words per node, int32 ``[rows, n_words]``; ``nodes``: depth and parent per node, int32
    ``[rows, 2]``), the inputs a level reads (``parents``, ``past``: each sequence's cached length; ``roots``:
    each sequence's root hidden row, else row ``b``) and the step inputs it writes: the new nodes' hidden
    rows (``row_src``, ``row_dst``) and logits rows (int64 ``b * logits_stride + node``), every row's
    ``mask`` and ``position_ids``, and where the contract has them ``query_lengths``, ``positions``,
    ``parent_ids``, ``depths``, MRoPE ``rope_rows`` (with ``rope_cap``), the batch contract's ``start`` index
    (``past``) and context lengths ``ctx`` (``past + width``). ``width``: nodes per sequence.
    One object per setup: levels compare it by identity."""

    words: Tensor
    nodes: Tensor
    parents: Tensor
    past: Tensor
    row_src: Tensor
    row_dst: Tensor
    logits: Tensor
    mask: Tensor
    position_ids: Tensor
    width: int
    n_words: int
    logits_stride: int
    roots: Tensor | None = None
    query_lengths: Tensor | None = None
    positions: Tensor | None = None
    parent_ids: Tensor | None = None
    depths: Tensor | None = None
    rope_rows: Tensor | None = None
    rope_cap: int = 0
    start: Tensor | None = None
    ctx: Tensor | None = None

    #: The step-block inputs a level writes on the device (their host copies are stale after it runs).
    WRITES = ("query_lengths", "logits_indices", "row_src", "row_dst", "positions", "spec_decode_position_ids",
              "spec_tree_parent_ids", "spec_tree_depths", "packed_attention_mask", "rope_rows")


@hash_once
@dataclass(frozen=True)
class DraftLevel:
    """One level of a draft tree, made on the device (kernel ``trtio_draft_level``): the ``k`` nodes ``n0
    .. n0 + k - 1`` of each of ``batch`` sequences hang off ``tree.parents`` (``[k]`` if ``shared``, else
    ``[batch, k]``; parents of the previous level, ``level0 .. level0 + level_k - 1``, or -1 on a round's
    first level). Every input of the proposal step is then rewritten from the tree (see :class:`DraftTreeBuffers`):
    padding rows past the ``n0 + k`` nodes, positions past + depth, each row's packed ancestors, and the new
    nodes' logits and hidden rows (a parent's draft row is ``b * level_k + parent - level0``). The parents
    are read from element ``parents_at`` of ``tree.parents`` on (each level of a round its own slot there, so
    parents that repeat stay in the step block). ``past_from`` (a round's first level only): the round's lengths
    are read there, where the last catch-up's tree step left them (:attr:`TreeTargets.next`), and written into
    ``tree.past`` for the round's later steps, so the round uploads none. Equal values are the same work (parents
    and lengths are read when it runs)."""

    tree: DraftTreeBuffers
    batch: int
    n0: int
    k: int
    level0: int
    level_k: int
    shared: bool
    parents_at: int = 0
    past_from: Tensor | None = None

    @property
    def backend(self) -> Backend:
        return self.tree.words.backend

    def enqueue(self, stream: Stream) -> None:
        t, b, n0, k = self.tree, self.batch, self.n0, self.k
        if self.backend.name == "cuda":
            parents = np.uint64(t.parents.data_ptr + 4 * self.parents_at)  # int32 values
            _kernel(self, "trtio_draft_level", b, parents, np.int32(self.shared), _ptr(t.past),
                    np.int32(t.width), np.int32(t.n_words), np.int32(n0), np.int32(k), np.int32(self.level0),
                    np.int32(self.level_k), _ptr(t.words), _ptr(t.nodes), _ptr(t.roots), _ptr(t.query_lengths),
                    _ptr(t.logits), np.int32(t.logits_stride), _ptr(t.row_src), _ptr(t.row_dst),
                    _ptr(t.positions), _ptr(t.position_ids), _ptr(t.parent_ids), _ptr(t.depths), _ptr(t.mask),
                    _ptr(t.rope_rows), np.int64(t.rope_cap), _ptr(t.start), _ptr(t.ctx),
                    _ptr(self.past_from))(stream.handle)
            return
        _host_work(self.backend, stream, functools.partial(_draft_level_host, self))


def _draft_level_host(level: DraftLevel) -> None:
    """:class:`DraftLevel` in numpy (the host backend's kernel)."""
    t, b, n0, k = level.tree, level.batch, level.n0, level.k
    w, nw = t.width, t.n_words
    parents = _ints(t.parents.data_ptr + 4 * level.parents_at, k if level.shared else b * k)
    par = np.broadcast_to(parents, (b, k)) if level.shared else parents.reshape(b, k)
    words = host_view(t.words.data_ptr, 4 * b * w * nw).view(np.uint32).reshape(b, w, nw)
    nodes = _ints(t.nodes.data_ptr, 2 * b * w).reshape(b, w, 2)
    new = np.arange(n0, n0 + k)
    seq = np.arange(b)[:, None]
    own = np.zeros((k, nw), np.uint32)
    own[np.arange(k), new >> 5] = np.left_shift(1, new & 31).astype(np.uint32)
    if n0 == 0:
        p = np.full((b, k), -1, np.int64)
        words[:, new] = own
        nodes[:, new, 0] = 0
        roots = _ints(t.roots.data_ptr, b)[:, None] if t.roots is not None else seq
        src = np.broadcast_to(roots, (b, k))
    else:
        p = par.astype(np.int64)
        words[:, new] = words[seq, p] | own
        nodes[:, new, 0] = nodes[seq, p, 0] + 1
        src = seq * level.level_k + p - level.level0
    nodes[:, new, 1] = p
    _ints(t.row_src.data_ptr, b * k)[:] = src.reshape(-1)
    _ints(t.row_dst.data_ptr, b * k)[:] = (seq * w + new).reshape(-1)
    host_view(t.logits.data_ptr, 8 * b * k).view(np.int64)[:] = (seq * t.logits_stride + new).reshape(-1)
    real = np.arange(w)[None, :] < n0 + k
    depth = np.where(real, nodes[:, :, 0], 0)
    past = _ints(t.past.data_ptr, b)
    if level.past_from is not None:
        past[:] = _ints(level.past_from.data_ptr, b)
    at = past[:, None] + depth
    if t.start is not None:
        _ints(t.start.data_ptr, b)[:] = past
    if t.ctx is not None:
        _ints(t.ctx.data_ptr, b)[:] = past + w
    _ints(t.position_ids.data_ptr, b * w)[:] = np.where(real, at, 0).reshape(-1)
    _ints(t.mask.data_ptr, b * w * nw)[:] = np.where(real[:, :, None], words, np.uint32(0)).view(np.int32).reshape(-1)
    if t.query_lengths is not None:
        _ints(t.query_lengths.data_ptr, b)[:] = n0 + k
    if t.positions is not None:
        _ints(t.positions.data_ptr, b * w)[:] = np.where(real, at, -1).reshape(-1)
    if t.parent_ids is not None:
        _ints(t.parent_ids.data_ptr, b * w)[:] = np.where(real, nodes[:, :, 1], -1).reshape(-1)
    if t.depths is not None:
        _ints(t.depths.data_ptr, b * w)[:] = depth.reshape(-1)
    if t.rope_rows is not None:
        _ints(t.rope_rows.data_ptr, b * w)[:] = np.where(real, seq * t.rope_cap + at, -1).reshape(-1)


@dataclass(frozen=True, eq=False)
class TreeTargets:
    """The device tensors a :class:`TreeStep` reads (``past``, ``lengths``: real rows per sequence,
    ``depths``: each row's depth; int32, written by the host) and writes, where the contract has them: the
    ragged contract's ``asl``, ``positions``, ``ids`` and MRoPE ``rope_rows`` (with ``rope_cap``); the batch
    contract's ``start`` index, context lengths (``ctx``), position ``ids``, and its mask and token
    selection, copied from the step block's ``mask_src`` and ``select_src``; a draft's lengths after the step
    (``next``: ``past + lengths``), which the next round's first level reads (:attr:`DraftLevel.past_from`). One
    object per setup and engine."""

    past: Tensor
    lengths: Tensor
    depths: Tensor
    asl: Tensor | None = None
    positions: Tensor | None = None
    ids: Tensor | None = None
    rope_rows: Tensor | None = None
    rope_cap: int = 0
    start: Tensor | None = None
    ctx: Tensor | None = None
    mask_src: Tensor | None = None
    mask_dst: Tensor | None = None
    select_src: Tensor | None = None
    select_dst: Tensor | None = None
    next: Tensor | None = None


@hash_once
@dataclass(frozen=True)
class TreeStep:
    """A tree step's (verify, catch-up) inputs that depend on the cached lengths, made on the device
    (kernel ``trtio_tree_step``) from the staged lengths: the step uploads its lengths, the rest of a
    repeated tree being constants the step block already holds. For ``batch`` sequences of ``width`` rows
    (row ``j < lengths[b]`` a node at ``depths[row]``): attention lengths ``past + width`` (``full_width``)
    or ``past + lengths``, positions and ids ``past + depth`` (-1 and ``ids_pad`` on padding), MRoPE rows,
    start index ``past``, context lengths ``past + width``, and ``words`` mask words per row and
    ``select_count`` selected tokens per sequence copied (see :class:`TreeTargets`)."""

    targets: TreeTargets
    batch: int
    width: int
    full_width: bool
    ids_pad: int = -1
    words: int = 0
    select_count: int = 0

    @property
    def backend(self) -> Backend:
        return self.targets.past.backend

    def enqueue(self, stream: Stream) -> None:
        if self.backend.name == "cuda":
            _kernel(self, "trtio_tree_step", self.batch, *self.kernel_args())(stream.handle)
            return
        _host_work(self.backend, stream, functools.partial(_tree_step_host, self))

    def kernel_args(self) -> tuple[Any, ...]:
        """The arguments of ``trtio_tree_step`` (``TRTIO_TREE_STEP_ARGS``), which :class:`CatchUpLayout` passes on."""
        t = self.targets
        return (np.int32(self.width), _ptr(t.past), _ptr(t.lengths), _ptr(t.depths), np.int32(self.full_width),
                _ptr(t.asl), _ptr(t.start), _ptr(t.ctx), _ptr(t.positions), _ptr(t.ids), np.int32(self.ids_pad),
                _ptr(t.rope_rows), np.int64(t.rope_cap), _ptr(t.mask_src), _ptr(t.mask_dst if self.words else None),
                np.int32(self.words), _ptr(t.select_src), _ptr(t.select_dst if self.select_count else None),
                np.int32(self.select_count), _ptr(t.next))


def _tree_step_host(step: TreeStep) -> None:
    """:class:`TreeStep` in numpy (the host backend's kernel)."""
    t, b, w = step.targets, step.batch, step.width
    past = _ints(t.past.data_ptr, b).astype(np.int64)
    lengths = _ints(t.lengths.data_ptr, b)
    real = np.arange(w)[None, :] < lengths[:, None]
    at = past[:, None] + _ints(t.depths.data_ptr, b * w).reshape(b, w)
    if t.asl is not None:
        _ints(t.asl.data_ptr, b)[:] = past + (w if step.full_width else lengths)
    if t.next is not None:
        _ints(t.next.data_ptr, b)[:] = past + lengths
    if t.start is not None:
        _ints(t.start.data_ptr, b)[:] = past
    if t.ctx is not None:
        _ints(t.ctx.data_ptr, b)[:] = past + w
    if t.positions is not None:
        _ints(t.positions.data_ptr, b * w)[:] = np.where(real, at, -1).reshape(-1)
    if t.ids is not None:
        _ints(t.ids.data_ptr, b * w)[:] = np.where(real, at, step.ids_pad).reshape(-1)
    if t.rope_rows is not None:
        _ints(t.rope_rows.data_ptr, b * w)[:] = np.where(real, np.arange(b)[:, None] * t.rope_cap + at, -1).reshape(-1)
    if step.words and t.mask_src is not None and t.mask_dst is not None:
        n = b * w * step.words
        _ints(t.mask_dst.data_ptr, n)[:] = _ints(t.mask_src.data_ptr, n)
    if step.select_count and t.select_src is not None and t.select_dst is not None:
        n = b * step.select_count
        host_view(t.select_dst.data_ptr, 8 * n)[:] = host_view(t.select_src.data_ptr, 8 * n)


@dataclass(frozen=True, eq=False)
class CatchUpTargets:
    """Where a :class:`CatchUpLayout` writes a catch-up's inputs, where the contract has them (int32 unless said):
    the rows a catch-up's gather writes (``dst``: scratch rows) and reads (``src``: the accepted nodes' rows of the
    verify step's outputs), each sequence's query ``lengths`` and ``logits`` row (int64), every row's ``parent_ids``,
    ``depths`` and packed causal ``mask``, and each sequence's root row after the catch-up (``roots``). One object
    per setup and engine."""

    dst: Tensor
    src: Tensor
    lengths: Tensor | None = None
    logits: Tensor | None = None
    parent_ids: Tensor | None = None
    depths: Tensor | None = None
    mask: Tensor | None = None
    roots: Tensor | None = None


@hash_once
@dataclass(frozen=True)
class CatchUpLayout:
    """A catch-up's layout made on the device (kernel ``trtio_catch_up_layout``) from the accepted paths alone, as
    accept() left them: ``moves`` (int32 ``[batch, stride]``, the KV commit's rows ``[start, n, node_0 ..
    node_{n-1}, -1 ...]``, nodes of a verify step of ``nodes`` rows per sequence). For ``batch`` sequences of
    ``width`` rows (row ``j`` real where ``j < n``) it writes :class:`CatchUpTargets`: each path's causal chain
    (what :meth:`~trtio._contracts.ragged.TreeLayout.chains` lays out on the host: query length ``n``, logits row
    ``b * logits_stride + n - 1``, parent ``j - 1``, depth ``j``, ``words`` mask ints a row: node ``j`` sees nodes
    ``0 .. j``, none on padding rows), its scratch rows ``b * scratch + j``, its accepted rows ``b * nodes +
    node_j`` (-1 on padding rows) and its root row ``b * roots_stride + n - 1``; then, with ``tree``, that tree
    step over what it wrote, in the same launch (one graph node). A new pattern of accepted paths so costs no host
    layout and no upload: the rows are read when the work runs."""

    targets: CatchUpTargets
    moves: Tensor
    stride: int
    nodes: int
    batch: int
    width: int
    scratch: int
    words: int = 0
    logits_stride: int = 0
    roots_stride: int = 0
    tree: TreeStep | None = None

    def __post_init__(self) -> None:
        if self.tree is not None and self.tree.batch != self.batch:
            raise InvalidValueError(f"CatchUpLayout: its tree step runs {self.tree.batch} sequences, the layout "
                                    f"{self.batch}")

    @property
    def backend(self) -> Backend:
        return self.moves.backend

    def enqueue(self, stream: Stream) -> None:
        t = self.targets
        if self.backend.name == "cuda":
            tree = self.tree.kernel_args() if self.tree is not None else _NO_TREE_STEP
            _kernel(self, "trtio_catch_up_layout", self.batch, _ptr(self.moves), np.int32(self.stride),
                    np.int32(self.nodes), np.int32(self.width), np.int32(self.scratch), _ptr(t.lengths),
                    _ptr(t.logits), np.int32(self.logits_stride), _ptr(t.parent_ids), _ptr(t.depths), _ptr(t.mask),
                    np.int32(self.words), _ptr(t.dst), _ptr(t.src), _ptr(t.roots), np.int32(self.roots_stride),
                    np.int32(self.tree is not None), *tree)(stream.handle)
            return
        _host_work(self.backend, stream, functools.partial(_catch_up_layout_host, self))


# ``trtio_tree_step``'s arguments where a catch-up's layout runs no tree step (none is read).
_NO_TREE_STEP = (np.int32(0), *(np.uint64(0),) * 3, np.int32(0), *(np.uint64(0),) * 5, np.int32(0), np.uint64(0),
                 np.int64(0), np.uint64(0), np.uint64(0), np.int32(0), np.uint64(0), np.uint64(0), np.int32(0),
                 np.uint64(0))


def _catch_up_layout_host(work: CatchUpLayout) -> None:
    """:class:`CatchUpLayout` in numpy (the host backend's kernel)."""
    t, b, w = work.targets, work.batch, work.width
    rows = _ints(work.moves.data_ptr, b * work.stride).reshape(b, work.stride)
    n = rows[:, 1].astype(np.int64)
    seq = np.arange(b)[:, None]
    j = np.arange(w)[None, :]
    real = j < n[:, None]
    if t.lengths is not None:
        _ints(t.lengths.data_ptr, b)[:] = n
    if t.logits is not None:
        host_view(t.logits.data_ptr, 8 * b).view(np.int64)[:] = seq[:, 0] * work.logits_stride + n - 1
    if t.roots is not None:
        _ints(t.roots.data_ptr, b)[:] = seq[:, 0] * work.roots_stride + n - 1
    if t.parent_ids is not None:
        _ints(t.parent_ids.data_ptr, b * w)[:] = np.tile(np.arange(w) - 1, b)
    if t.depths is not None:
        _ints(t.depths.data_ptr, b * w)[:] = np.tile(np.arange(w), b)
    _ints(t.dst.data_ptr, b * w)[:] = np.where(real, seq * work.scratch + j, -1).reshape(-1)
    nodes = np.full((b, w), -1, np.int64)
    cols = min(w, work.stride - 2)
    nodes[:, :cols] = rows[:, 2:2 + cols]
    _ints(t.src.data_ptr, b * w)[:] = np.where(real, seq * work.nodes + nodes, -1).reshape(-1)
    words = work.words
    if t.mask is not None and words:
        bits = np.where(real, j + 1, 0)[:, :, None] - 32 * np.arange(words)[None, None, :]  # set bits per word
        full = np.left_shift(np.uint64(1), np.clip(bits, 0, 32).astype(np.uint64)) - np.uint64(1)
        _ints(t.mask.data_ptr, b * w * words)[:] = full.astype(np.uint32).view(np.int32).reshape(-1)
    if work.tree is not None:
        _tree_step_host(work.tree)
