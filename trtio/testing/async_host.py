"""AsyncHostBackend: the host backend with a device that runs behind the host, as a GPU's does.

trtio's :class:`~trtio._cuda.host.HostBackend` runs device work the moment it is issued, so a step that
forgets to order two streams, or lets a caller reuse an input a queued copy still reads, gives the right
answer on it and a wrong one on a GPU. This backend closes that gap for tests without a GPU:

- **Device work is queued per stream** (copies, fills, host functions, graph launches: each of a graph's
  calls is one operation) and runs **lazily**, when the host waits for it: ``synchronize_stream``,
  ``synchronize_event``, ``synchronize`` (and a copy into pageable host memory, which CUDA makes
  synchronous). Operations of one stream run in issue order; operations of different streams run in an
  order drawn from ``random.Random(seed)``, which honours every stream wait (``wait_event``) and nothing
  else. ``query_event`` reports what has run, and runs nothing.
- **Freed memory is overwritten.** ``free`` fills the buffer with ``poison`` bytes (0xFF: NaN in every
  float type, -1 in every signed integer) the moment its owner frees it, and again whenever a queued copy
  reads it later (as a caching allocator's next user of the block would have written it meanwhile); its
  bytes stay mapped until every queue has drained, so such a copy reads the poison, not a fault.
- **Copies from pageable host memory** (a numpy array the backend did not allocate) take their bytes at
  once, as CUDA's ``cudaMemcpyAsync`` stages pageable memory before it returns; copies into pageable host
  memory wait for the stream's earlier work and run at once. Copies between the backend's own memory
  (device and pinned) are queued.
- :meth:`AsyncHostBackend.pinned` makes a numpy array over pinned memory of the backend that is freed, and
  so overwritten, when the last reference to it goes: a stand-in for a torch pinned tensor whose block
  goes back to a caching allocator while a copy may still read it.

Pass it as ``backend=`` wherever trtio takes one (factories, ``Stream.create``, ``Tensor.empty``,
:meth:`ReferenceEngine.from_config <trtio.testing.ReferenceEngine.from_config>`: engines launch their work
on the backend they are given). A loop that is right on a GPU gives the same answer on it for every
``seed``; a loop that misses a stream wait or drops an input too early gives a wrong one for most seeds::

    be = AsyncHostBackend(seed=3)
    engine = ReferenceEngine.from_config(cfg, backend=be)
    setup = trtio.create_for_llm(engine, cfg, backend=be)

Graph capture, thread-local capture rules and the counters are the host backend's. Work runs on the thread
that waits for it; several threads may wait at once (each operation runs once, in its stream's order).
"""

from __future__ import annotations

import bisect
import ctypes
import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from trtio._cuda._hostmem import host_view
from trtio._cuda._location import Location
from trtio._cuda.host import HostBackend
from trtio.errors import CudaError, InvalidValueError

__all__ = ["AsyncHostBackend"]


class _Wait:
    """A stream wait in a queue: it passes once ``stream`` has run ``count`` operations."""

    __slots__ = ("stream", "count")

    def __init__(self, stream: int, count: int) -> None:
        self.stream = stream
        self.count = count


_Op = Callable[[], object] | _Wait


class AsyncHostBackend(HostBackend):
    """The host backend with queued, lazily run, seeded-interleaved device work (see the module docstring)."""

    def __init__(self, seed: int = 0, *, poison: int = 0xFF) -> None:
        super().__init__()
        if not isinstance(poison, int) or isinstance(poison, bool) or not 0 <= poison <= 255:
            raise InvalidValueError(f"AsyncHostBackend: poison must be a byte value 0..255, got {poison!r}")
        self.seed = seed
        self.poison = poison
        self._rng = random.Random(seed)
        self._cv = threading.Condition()
        self._queues: dict[int, deque[_Op]] = {}
        self._issued: dict[int, int] = {}  # operations enqueued on each stream, ever
        self._ran: dict[int, int] = {}  # operations of each stream that have run
        self._busy: set[int] = set()  # streams whose head operation a thread is running
        self._recorded: dict[int, tuple[int, int]] = {}  # event -> (stream, operations issued there before it)
        self._quarantine: dict[int, np.ndarray] = {}  # freed buffers by address, mapped until the queues drain
        self._starts: list[int] = []  # the live allocations' first bytes, sorted
        self._ends: dict[int, int] = {}  # and each one's end

    def __repr__(self) -> str:
        return f"AsyncHostBackend(seed={self.seed})"

    # -- memory -----------------------------------------------------------------------------------
    def alloc(self, nbytes: int, location: Location) -> int:
        ptr = super().alloc(nbytes, location)
        with self._cv:
            bisect.insort(self._starts, ptr)
            self._ends[ptr] = ptr + int(nbytes)
        return ptr

    def free(self, ptr: int, location: Location) -> None:
        self._refuse_while_capturing("cudaFree" if location is Location.DEVICE else "cudaFreeHost",
                                     "memory cannot be freed")
        raw = self._heap.release(ptr)
        if raw is None:
            super().free(ptr, location)  # raises as the host backend does
            return
        raw.fill(self.poison)
        with self._cv:
            i = bisect.bisect_left(self._starts, ptr)
            del self._starts[i]
            del self._ends[ptr]
            if any(self._queues.values()):
                self._quarantine[ptr] = raw

    def _reread(self, ptr: int, nbytes: int) -> None:
        """Before a queued copy reads ``[ptr, ptr + nbytes)``: a freed buffer there is overwritten again."""
        if self._quarantine:
            for start, raw in list(self._quarantine.items()):
                if start < ptr + nbytes and ptr < start + raw.size:
                    raw.fill(self.poison)

    def _owns(self, ptr: int, nbytes: int) -> bool:
        """Whether ``[ptr, ptr + nbytes)`` lies in one live allocation of this backend (device or pinned)."""
        with self._cv:
            i = bisect.bisect_right(self._starts, ptr) - 1
            return i >= 0 and ptr + nbytes <= self._ends[self._starts[i]]

    def pinned(self, values: Any) -> np.ndarray:
        """A copy of ``values`` in pinned memory of this backend, as a numpy array: when the last reference to
        it (or to any view of it) goes, the memory is freed and overwritten, as a pinned tensor's block that
        goes back to a caching allocator. Steps must keep such an input until their copies have read it."""
        src = np.ascontiguousarray(values)
        nbytes = max(src.nbytes, 1)
        ptr = self.alloc(nbytes, Location.PINNED)
        owner = (ctypes.c_uint8 * nbytes).from_address(ptr)
        weakref.finalize(owner, self.free, ptr, Location.PINNED)
        out: np.ndarray = np.frombuffer(memoryview(owner), np.uint8)[:src.nbytes].view(src.dtype).reshape(src.shape)
        out[...] = src
        return out

    # -- queued work ------------------------------------------------------------------------------
    def _enqueue(self, stream: int, *ops: _Op) -> None:
        with self._cv:
            queue = self._queues.get(stream)
            if queue is None:
                queue = self._queues[stream] = deque()
                self._ran.setdefault(stream, 0)
            queue.extend(ops)
            self._issued[stream] = self._issued.get(stream, 0) + len(ops)

    def _captured(self, stream: int, calls: list[Callable[[], object]]) -> bool:
        """Record ``calls`` into ``stream``'s capture, if it is being captured."""
        if stream not in self._capturing:
            return False
        with self._lock:
            capture = self._capturing.get(stream)
            if capture is None:
                return False
            capture.calls.extend(calls)
            return True

    def _run(self, stream: int, fn: Callable[[], object]) -> None:
        self.op_count += 1
        if not self._captured(stream, [fn]):
            self._enqueue(stream, fn)

    def launch_graph(self, graph_exec: int, stream: int) -> None:
        self.op_count += 1
        calls = self._graphs.get(graph_exec)
        if calls is None:
            raise CudaError("cudaGraphLaunch", "cudaErrorInvalidResourceHandle", f"graph 0x{graph_exec:x} is not live")
        if not self._captured(stream, list(calls)):
            self._enqueue(stream, *calls)

    def memcpy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        if nbytes <= 0:
            super().memcpy(dst, src, nbytes, stream)  # nothing, or the host backend's refusal
            return
        self._copy(dst, src, nbytes, stream, nbytes, lambda d, s: ctypes.memmove(d, s, nbytes))

    def memcpy_2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
                  stream: int) -> None:
        if not width or not height or min(width, height, dpitch, spitch) < 0 or \
                (height > 1 and width > min(dpitch, spitch)):
            super().memcpy_2d(dst, dpitch, src, spitch, width, height, stream)  # nothing, or the refusal
            return

        def copy(d: int, s: int) -> None:
            for row in range(height):
                ctypes.memmove(d + row * dpitch, s + row * spitch, width)

        self._copy(dst, src, spitch * (height - 1) + width, stream, dpitch * (height - 1) + width, copy)

    def _copy(self, dst: int, src: int, src_span: int, stream: int, dst_span: int,
              copy: Callable[[int, int], object]) -> None:
        """A copy, queued or run at once by where its two sides live (see the module docstring)."""
        if stream in self._capturing:  # recorded as the host backend records it, run at each launch
            self._run(stream, lambda: copy(dst, src))
            return
        ours_src, ours_dst = self._owns(src, src_span), self._owns(dst, dst_span)
        if ours_src and ours_dst:
            def queued() -> None:
                self._reread(src, src_span)
                copy(dst, src)

            self._run(stream, queued)
        elif ours_dst:  # from pageable memory: its bytes are taken now
            staged = host_view(src, src_span).copy()
            self._run(stream, lambda: copy(dst, staged.ctypes.data))
        else:  # into pageable memory (synchronous, after the stream's work), or host to host
            if ours_src:
                self._drain(lambda: self._ran.get(stream, 0) >= self._issued.get(stream, 0))
            self.op_count += 1
            copy(dst, src)

    # -- streams and events -----------------------------------------------------------------------
    def record_event(self, event: int, stream: int) -> None:
        super().record_event(event, stream)
        if stream in self._capturing:
            return
        with self._cv:
            self._recorded[event] = (stream, self._issued.get(stream, 0))

    def wait_event(self, stream: int, event: int) -> None:
        super().wait_event(stream, event)
        if stream in self._capturing:
            return
        with self._cv:
            at = self._recorded.get(event)
        if at is not None and at[0] != stream and self._ran.get(at[0], 0) < at[1]:
            self._enqueue(stream, _Wait(*at))

    def _event_done(self, event: int) -> bool:
        at = self._recorded.get(event)
        return at is None or self._ran.get(at[0], 0) >= at[1]

    def query_event(self, event: int) -> bool:
        super().query_event(event)
        with self._cv:
            return self._event_done(event)

    def synchronize_event(self, event: int) -> None:
        super().synchronize_event(event)
        self._drain(lambda: self._event_done(event))

    def synchronize_stream(self, stream: int) -> None:
        super().synchronize_stream(stream)
        self._drain(lambda: self._ran.get(stream, 0) >= self._issued.get(stream, 0))

    def synchronize(self) -> None:
        super().synchronize()
        self._drain(lambda: not any(self._queues.values()) and not self._busy)

    def destroy_event(self, event: int) -> None:
        super().destroy_event(event)
        with self._cv:
            self._recorded.pop(event, None)

    @property
    def pending(self) -> int:
        """Operations enqueued that have not run yet (every stream)."""
        with self._cv:
            return sum(len(q) for q in self._queues.values()) + len(self._busy)

    def _drain(self, done: Callable[[], bool]) -> None:
        """Run queued operations, interleaving streams in the seeded order, until ``done()`` (read under the
        queues' lock). An operation's error is raised here, as a GPU reports a kernel's error at a wait."""
        cv = self._cv
        while True:
            with cv:
                while True:
                    if done():
                        if not self._busy and not any(self._queues.values()):
                            self._quarantine.clear()
                        return
                    ready = [s for s, q in self._queues.items() if q and s not in self._busy and self._ready(q[0])]
                    if ready:
                        break
                    if self._busy:
                        cv.wait()
                        continue
                    blocked = {f"0x{s:x}": f"waits for 0x{q[0].stream:x}" for s, q in self._queues.items()
                               if q and isinstance(q[0], _Wait)}
                    raise CudaError("cudaStreamSynchronize", "cudaErrorLaunchTimeout",
                                    f"the work waited for can never run: every queued stream waits for an event "
                                    f"no queued work will complete ({blocked})")
                stream = ready[self._rng.randrange(len(ready))]
                op = self._queues[stream].popleft()
                self._busy.add(stream)
            try:
                if not isinstance(op, _Wait):
                    t0 = time.perf_counter()
                    op()
                    self.work_seconds += time.perf_counter() - t0
            finally:
                with cv:
                    self._busy.discard(stream)
                    self._ran[stream] += 1
                    cv.notify_all()

    def _ready(self, op: _Op) -> bool:
        return not isinstance(op, _Wait) or self._ran.get(op.stream, 0) >= op.count
