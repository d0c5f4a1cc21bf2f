"""The host backend: numpy memory, synchronous streams, and graphs that replay recorded calls.

It implements the same protocol as the cuda backend, so every layer above memory runs on a
machine without a GPU. Memory of every location is ordinary host memory at real addresses.
Streams and events are counters; work runs when it is issued, except on a stream that is
being captured, where it is recorded (as CUDA records it) and runs on each graph launch.
Like CUDA, it refuses to synchronise a capturing stream or to allocate during a capture,
so tests on this backend catch what would break a capture on a GPU.
"""

from __future__ import annotations

import ctypes
import itertools
import os
from collections.abc import Callable

from trtio.cuda._hostmem import HostHeap, host_fill
from trtio.cuda.backend import Location
from trtio.errors import CudaError

__all__ = ["HostBackend"]


class HostBackend:
    """Synchronous numpy backend (see module docstring)."""

    name = "host"
    device_id = -1

    def __init__(self) -> None:
        self._heap = HostHeap()
        self._ids = itertools.count(0x1000)
        self._streams: set[int] = set()
        self._events: set[int] = set()
        self._capturing: dict[int, list[Callable[[], None]]] = {}
        self._graphs: dict[int, list[Callable[[], None]]] = {}
        self.alloc_count = 0
        self.sync_count = 0

    def __repr__(self) -> str:
        return "HostBackend()"

    # -- memory ---------------------------------------------------------------------------
    def alloc(self, nbytes: int, location: Location) -> int:
        if nbytes <= 0:
            raise ValueError(f"alloc of {nbytes} bytes: size must be positive")
        if self._capturing:
            raise CudaError("alloc", "cudaErrorStreamCaptureUnsupported",
                            "memory cannot be allocated while a stream is being captured")
        self.alloc_count += 1
        return self._heap.alloc(nbytes)

    def free(self, ptr: int, location: Location) -> None:
        if not self._heap.free(ptr):
            raise CudaError("free", "cudaErrorInvalidValue", f"pointer 0x{ptr:x} was not allocated here")

    def is_host_accessible(self, location: Location) -> bool:
        return True

    def _run(self, stream: int, fn: Callable[[], None]) -> None:
        queue = self._capturing.get(stream)
        if queue is None:
            fn()
        else:
            queue.append(fn)

    def memcpy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        if nbytes:
            self._run(stream, lambda: ctypes.memmove(dst, src, nbytes))

    def memcpy_2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
                  stream: int) -> None:
        def copy() -> None:
            for row in range(height):
                ctypes.memmove(dst + row * dpitch, src + row * spitch, width)

        if width and height:
            self._run(stream, copy)

    def memset(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        if nbytes:
            self._run(stream, lambda: ctypes.memset(ptr, value, nbytes))

    def fill(self, ptr: int, pattern: bytes, count: int, stream: int) -> None:
        if count:
            self._run(stream, lambda: host_fill(ptr, pattern, count))

    def mem_info(self) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    def launch_host_func(self, stream: int, fn: Callable[[], None]) -> None:
        """Run ``fn`` in stream order (recorded instead while ``stream`` is captured)."""
        self._run(stream, fn)

    # -- streams and events ---------------------------------------------------------------
    def create_stream(self) -> int:
        handle = next(self._ids)
        self._streams.add(handle)
        return handle

    def destroy_stream(self, stream: int) -> None:
        self._capturing.pop(stream, None)
        self._streams.discard(stream)

    def synchronize_stream(self, stream: int) -> None:
        if stream in self._capturing:
            raise CudaError("cudaStreamSynchronize", "cudaErrorStreamCaptureUnsupported",
                            f"stream 0x{stream:x} is being captured")
        self.sync_count += 1

    def create_event(self) -> int:
        handle = next(self._ids)
        self._events.add(handle)
        return handle

    def destroy_event(self, event: int) -> None:
        self._events.discard(event)

    def record_event(self, event: int, stream: int) -> None:
        self._check_event("cudaEventRecord", event)

    def wait_event(self, stream: int, event: int) -> None:
        self._check_event("cudaStreamWaitEvent", event)

    def synchronize_event(self, event: int) -> None:
        self._check_event("cudaEventSynchronize", event)
        self.sync_count += 1

    def query_event(self, event: int) -> bool:
        self._check_event("cudaEventQuery", event)
        return True

    def _check_event(self, call: str, event: int) -> None:
        if event not in self._events:
            raise CudaError(call, "cudaErrorInvalidResourceHandle", f"event 0x{event:x} is not live")

    def synchronize(self) -> None:
        self.sync_count += 1

    # -- graphs ---------------------------------------------------------------------------
    def begin_capture(self, stream: int) -> None:
        if stream in self._capturing:
            raise CudaError("cudaStreamBeginCapture", "cudaErrorIllegalState",
                            f"stream 0x{stream:x} is already being captured")
        self._capturing[stream] = []

    def end_capture(self, stream: int) -> int:
        calls = self._capturing.pop(stream, None)
        if calls is None:
            raise CudaError("cudaStreamEndCapture", "cudaErrorIllegalState",
                            f"stream 0x{stream:x} is not being captured")
        handle = next(self._ids)
        self._graphs[handle] = calls
        return handle

    def abort_capture(self, stream: int) -> None:
        self._capturing.pop(stream, None)

    def is_capturing(self, stream: int) -> bool:
        return stream in self._capturing

    def launch_graph(self, graph_exec: int, stream: int) -> None:
        calls = self._graphs.get(graph_exec)
        if calls is None:
            raise CudaError("cudaGraphLaunch", "cudaErrorInvalidResourceHandle",
                            f"graph 0x{graph_exec:x} is not live")

        if stream in self._capturing:
            self._capturing[stream].extend(calls)  # a graph launched into a capture becomes part of it
            return
        for call in calls:
            call()

    def destroy_graph(self, graph_exec: int) -> None:
        self._graphs.pop(graph_exec, None)

    @property
    def live_graphs(self) -> int:
        return len(self._graphs)

    @property
    def live_allocations(self) -> int:
        return self._heap.live_count
