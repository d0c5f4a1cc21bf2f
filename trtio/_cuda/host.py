"""The host backend: numpy memory, synchronous streams, and graphs that replay recorded calls.

It implements the same protocol as the cuda backend, so every layer above memory runs on a
machine without a GPU. Memory of every location is ordinary host memory at real addresses.
Streams and events are counters; work runs when it is issued, except on a stream that is
being captured, where it is recorded (as CUDA records it) and runs on each graph launch.

Like CUDA in ``cudaStreamCaptureModeThreadLocal`` (the mode the cuda backend captures in), it
refuses what would break a capture: synchronising a stream that is being captured (from any
thread), and allocating, freeing, synchronising or querying an event from the thread that is
capturing. Other
threads may allocate, synchronise and work on their own streams meanwhile. Ending a capture from
another thread than the one that began it is refused too (``cudaErrorStreamCaptureWrongThread``).
So tests on this backend catch what would break a capture on a GPU.

Thread safety: the backend's shared state (streams, events, captures, graphs, the heap and the
counters) is guarded by a lock; work issued on a stream runs on the issuing thread.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
import time
from collections.abc import Callable

from trtio._cuda._hostmem import HostHeap, host_fill
from trtio._cuda._location import Location
from trtio.errors import CudaError, InvalidValueError

__all__ = ["HostBackend"]

_ALLOC_CALL = {Location.DEVICE: "cudaMalloc", Location.PINNED: "cudaMallocHost", Location.HOST: "malloc"}
_FREE_CALL = {Location.DEVICE: "cudaFree", Location.PINNED: "cudaFreeHost", Location.HOST: "free"}


class _Capture:
    """The calls recorded on one stream being captured, and the thread capturing it."""

    __slots__ = ("calls", "thread")

    def __init__(self, thread: int) -> None:
        self.calls: list[Callable[[], object]] = []
        self.thread = thread


class HostBackend:
    """Synchronous numpy backend (see module docstring)."""

    name = "host"
    device_id = -1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap = HostHeap()
        self._ids = itertools.count(0x1000)
        self._streams: set[int] = set()
        self._events: set[int] = set()
        self._capturing: dict[int, _Capture] = {}  # stream -> its capture
        self._capture_threads: dict[int, int] = {}  # thread id -> streams it is capturing
        self._graphs: dict[int, list[Callable[[], object]]] = {}
        self._total_memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        self.alloc_count = 0  # allocations made so far (a decode step must make none)
        self.sync_count = 0  # host synchronisations so far (a decode step must make none)
        self.op_count = 0  # device operations enqueued so far (copies, fills, host work, graph launches)
        self.work_seconds = 0.0  # time spent running them (numpy's share of a step: benchmarks report it)

    def __repr__(self) -> str:
        return "HostBackend()"

    def _refuse_while_capturing(self, call: str, what: str) -> None:
        """CUDA's thread-local capture mode: the capturing thread may not allocate, free or synchronise."""
        thread = threading.get_ident()
        if thread in self._capture_threads:
            with self._lock:
                streams = ", ".join(f"0x{s:x}" for s, c in self._capturing.items() if c.thread == thread)
            raise CudaError(call, "cudaErrorStreamCaptureUnsupported",
                            f"{what} while this thread is capturing stream {streams} into a CUDA graph")

    # -- memory ---------------------------------------------------------------------------
    def alloc(self, nbytes: int, location: Location) -> int:
        call = _ALLOC_CALL[location]
        if nbytes <= 0:
            raise InvalidValueError(f"alloc of {nbytes} bytes: size must be positive")
        self._refuse_while_capturing(call, "memory cannot be allocated")
        if nbytes > self._total_memory:
            raise CudaError(call, "cudaErrorMemoryAllocation",
                            f"{nbytes} bytes of {location} memory asked; the host has {self._total_memory} bytes")
        try:
            ptr = self._heap.alloc(nbytes)
        except (MemoryError, ValueError) as exc:  # numpy: out of memory, or a size it cannot represent
            raise CudaError(call, "cudaErrorMemoryAllocation",
                            f"{nbytes} bytes of {location} memory could not be allocated ({exc})") from None
        with self._lock:
            self.alloc_count += 1
        return ptr

    def free(self, ptr: int, location: Location) -> None:
        call = _FREE_CALL[location]
        self._refuse_while_capturing(call, "memory cannot be freed")
        if not self._heap.free(ptr):
            raise CudaError(call, "cudaErrorInvalidValue", f"pointer 0x{ptr:x} was not allocated here")

    def is_host_accessible(self, location: Location) -> bool:
        return True

    def knows_pointer(self, ptr: int, nbytes: int, location: Location) -> bool | None:
        """Whether ``[ptr, ptr + nbytes)`` lies in memory of ``location`` this backend allocated.

        Device memory is checked against the live allocations; host and pinned memory may be any
        host memory (a numpy array, a registered buffer), so the answer is None (cannot tell).
        """
        if location is not Location.DEVICE:
            return None
        return self._heap.contains(ptr, max(nbytes, 1))

    def _run(self, stream: int, fn: Callable[[], object]) -> None:
        # Lock-free when the stream is not being captured (the common case, and a hot path).
        self.op_count += 1  # telemetry: benchmarks and tests count a step's device operations
        if stream in self._capturing:
            with self._lock:
                capture = self._capturing.get(stream)
                if capture is not None:
                    capture.calls.append(fn)
                    return
        t0 = time.perf_counter()
        fn()
        self.work_seconds += time.perf_counter() - t0

    def memcpy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        if nbytes > 0:
            self._run(stream, lambda: ctypes.memmove(dst, src, nbytes))
        elif nbytes < 0:  # memmove would take it as a huge size_t
            raise CudaError("cudaMemcpyAsync", "cudaErrorInvalidValue", f"negative size {nbytes}")

    def memcpy_2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
                  stream: int) -> None:
        def copy() -> None:
            for row in range(height):
                ctypes.memmove(dst + row * dpitch, src + row * spitch, width)

        if min(width, height, dpitch, spitch) < 0 or (height > 1 and width > min(dpitch, spitch)):
            raise CudaError("cudaMemcpy2DAsync", "cudaErrorInvalidValue",
                            f"width {width}, height {height}, pitches {dpitch} / {spitch}: sizes must not be "
                            f"negative and the width must fit in both pitches")
        if width and height:
            self._run(stream, copy)

    def memset(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        if nbytes > 0:
            self._run(stream, lambda: ctypes.memset(ptr, value, nbytes))
        elif nbytes < 0:
            raise CudaError("cudaMemsetAsync", "cudaErrorInvalidValue", f"negative size {nbytes}")

    def fill(self, ptr: int, pattern: bytes, count: int, stream: int) -> None:
        if len(pattern) not in (1, 2, 4, 8):
            raise InvalidValueError(f"fill pattern must be 1, 2, 4 or 8 bytes, got {len(pattern)}")
        if count > 0:
            self._run(stream, lambda: host_fill(ptr, pattern, count))
        elif count < 0:
            raise CudaError("cuMemsetD8Async", "cudaErrorInvalidValue", f"negative count {count}")

    def mem_info(self) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    def launch_host_func(self, stream: int, fn: Callable[[], None]) -> None:
        """Run ``fn`` in stream order (recorded instead while ``stream`` is captured)."""
        self._run(stream, fn)

    # -- streams and events ---------------------------------------------------------------
    def create_stream(self) -> int:
        with self._lock:
            handle = next(self._ids)
            self._streams.add(handle)
        return handle

    def destroy_stream(self, stream: int) -> None:
        with self._lock:
            if stream not in self._streams:
                raise CudaError("cudaStreamDestroy", "cudaErrorInvalidResourceHandle",
                                f"stream 0x{stream:x} is not live")
            self._streams.discard(stream)
            capture = self._capturing.pop(stream, None)
            if capture is not None:
                self._forget_capture_thread(capture.thread)

    def knows_stream(self, stream: int) -> bool | None:
        """Whether ``stream`` is a live stream of this backend (it made every stream it knows)."""
        return stream in self._streams

    def _check_stream(self, call: str, stream: int) -> None:
        if stream not in self._streams:
            raise CudaError(call, "cudaErrorInvalidResourceHandle", f"stream 0x{stream:x} is not a live stream")

    def synchronize_stream(self, stream: int) -> None:
        self._check_stream("cudaStreamSynchronize", stream)
        if stream in self._capturing:
            raise CudaError("cudaStreamSynchronize", "cudaErrorStreamCaptureUnsupported",
                            f"stream 0x{stream:x} is being captured")
        self._refuse_while_capturing("cudaStreamSynchronize", f"stream 0x{stream:x} cannot be synchronised")
        with self._lock:
            self.sync_count += 1

    def create_event(self) -> int:
        with self._lock:
            handle = next(self._ids)
            self._events.add(handle)
        return handle

    def destroy_event(self, event: int) -> None:
        with self._lock:
            if event not in self._events:
                raise CudaError("cudaEventDestroy", "cudaErrorInvalidResourceHandle", f"event 0x{event:x} is not live")
            self._events.discard(event)

    def record_event(self, event: int, stream: int) -> None:
        self._check_event("cudaEventRecord", event)
        self._check_stream("cudaEventRecord", stream)

    def wait_event(self, stream: int, event: int) -> None:
        self._check_event("cudaStreamWaitEvent", event)
        self._check_stream("cudaStreamWaitEvent", stream)

    def synchronize_event(self, event: int) -> None:
        self._check_event("cudaEventSynchronize", event)
        self._refuse_while_capturing("cudaEventSynchronize", f"event 0x{event:x} cannot be synchronised")
        with self._lock:
            self.sync_count += 1

    def query_event(self, event: int) -> bool:
        self._check_event("cudaEventQuery", event)
        self._refuse_while_capturing("cudaEventQuery", f"event 0x{event:x} cannot be queried")
        return True

    def _check_event(self, call: str, event: int) -> None:
        if event not in self._events:
            raise CudaError(call, "cudaErrorInvalidResourceHandle", f"event 0x{event:x} is not live")

    def synchronize(self) -> None:
        self._refuse_while_capturing("cudaDeviceSynchronize", "the device cannot be synchronised")
        with self._lock:
            self.sync_count += 1

    # -- graphs ---------------------------------------------------------------------------
    def _forget_capture_thread(self, thread: int) -> None:
        left = self._capture_threads.get(thread, 0) - 1
        if left > 0:
            self._capture_threads[thread] = left
        else:
            self._capture_threads.pop(thread, None)

    def begin_capture(self, stream: int) -> None:
        self._check_stream("cudaStreamBeginCapture", stream)
        thread = threading.get_ident()
        with self._lock:
            if stream in self._capturing:
                raise CudaError("cudaStreamBeginCapture", "cudaErrorIllegalState",
                                f"stream 0x{stream:x} is already being captured")
            self._capturing[stream] = _Capture(thread)
            self._capture_threads[thread] = self._capture_threads.get(thread, 0) + 1

    def end_capture(self, stream: int) -> int:
        with self._lock:
            capture = self._capturing.get(stream)
            if capture is None:
                raise CudaError("cudaStreamEndCapture", "cudaErrorIllegalState",
                                f"stream 0x{stream:x} is not being captured")
            if capture.thread != threading.get_ident():
                raise CudaError("cudaStreamEndCapture", "cudaErrorStreamCaptureWrongThread",
                                f"stream 0x{stream:x} is being captured by another thread")
            del self._capturing[stream]
            self._forget_capture_thread(capture.thread)
            handle = next(self._ids)
            self._graphs[handle] = capture.calls
        return handle

    def abort_capture(self, stream: int) -> None:
        with self._lock:
            capture = self._capturing.pop(stream, None)
            if capture is not None:
                self._forget_capture_thread(capture.thread)

    def is_capturing(self, stream: int) -> bool:
        return stream in self._capturing

    def launch_graph(self, graph_exec: int, stream: int) -> None:
        self.op_count += 1
        calls = self._graphs.get(graph_exec)
        if calls is None:
            raise CudaError("cudaGraphLaunch", "cudaErrorInvalidResourceHandle",
                            f"graph 0x{graph_exec:x} is not live")
        if stream in self._capturing:
            with self._lock:
                capture = self._capturing.get(stream)
                if capture is not None:
                    capture.calls.extend(calls)  # a graph launched into a capture becomes part of it
                    return
        t0 = time.perf_counter()
        for call in calls:
            call()
        self.work_seconds += time.perf_counter() - t0

    def destroy_graph(self, graph_exec: int) -> None:
        with self._lock:
            if self._graphs.pop(graph_exec, None) is None:
                raise CudaError("cudaGraphExecDestroy", "cudaErrorInvalidResourceHandle",
                                f"graph 0x{graph_exec:x} is not live")

    # -- what is live (leak tests compare these with a baseline) -------------------------------
    @property
    def live_allocations(self) -> int:
        return self._heap.live_count

    @property
    def live_streams(self) -> int:
        return len(self._streams)

    @property
    def live_events(self) -> int:
        return len(self._events)

    @property
    def live_graphs(self) -> int:
        return len(self._graphs)
