"""FaultyBackend: a backend that makes chosen calls fail, to test what a failure mid-step leaves behind.

trtio's rule for failures (``docs/faults.md``): a public call that raises leaves its object exactly as
it was before the call, so that the same call can be retried; or, where that is impossible, the object
says it is broken and refuses every later call (except ``reset`` and ``close``) with one clear error.
:class:`FaultyBackend` is how trtio's tests check that rule, and how a runtime author can check their own
loop against it, without a GPU or a real fault::

    faulty = FaultyBackend("host")               # wraps get_backend("host"); FaultyBackend("cuda") on a GPU

    def fresh():                                 # a setup after a prefill, its engine's enqueue watched too
        setup = trtio.create_for_llm(engine, cfg, backend=faulty)
        faulty.watch(setup)
        setup.prefill(prompt, lengths)
        return setup

    setup = fresh()
    with faulty.recording() as calls:            # which calls does one decode step make?
        logits = setup.decode(x)
    want = logits.to_numpy()
    for call in calls:                           # make each of them fail in turn
        setup = fresh()
        faulty.fail(*call)
        with pytest.raises(trtio.TrtioError):
            setup.decode(x)
        assert (setup.decode(x).to_numpy() == want).all()   # the retry gives what a fault-free step gives

Every call is forwarded to the wrapped backend. A call made to fail (:meth:`FaultyBackend.fail`) raises the
:class:`~trtio.errors.CudaError` the real backend raises for that call, naming the CUDA call, and does
nothing else: CUDA reports a failed enqueue, allocation or creation synchronously, before any of its work
reaches the device. The exception is ``end_capture``: a failed ``cudaStreamEndCapture`` still ends the
capture (CUDA does), so the stream is not left capturing. The engine calls of a watched executor
(:meth:`FaultyBackend.watch`) fail as TensorRT's do: ``execute_async_v3`` returns False, and
``is_stream_capturable`` answers False (TensorRT-RTX's way of refusing a CUDA-graph capture).

Counts: :attr:`FaultyBackend.counts` counts every call of every method named in :data:`FAULTABLE` and
:data:`ENGINE_CALLS`, and a fault's ``nth`` counts calls of its method from the moment it was armed.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from trtio._cuda.backend import Backend, Location, get_backend
from trtio.errors import CudaError, InvalidValueError, NotAvailableError

__all__ = ["ENGINE_CALLS", "FAULTABLE", "Call", "FaultyBackend"]

# Errors CUDA returns at once from a call that it refused, leaving the context usable (not a sticky error such
# as cudaErrorIllegalAddress, after which every later call fails too).
_VALUE, _HANDLE, _MEMORY = "cudaErrorInvalidValue", "cudaErrorInvalidResourceHandle", "cudaErrorMemoryAllocation"
_RESOURCES = "cudaErrorLaunchOutOfResources"

#: The backend methods a fault can be armed on: the CUDA call each stands for and the error it raises.
FAULTABLE: dict[str, tuple[str, str]] = {
    "alloc": ("cudaMalloc", _MEMORY),
    "free": ("cudaFree", _VALUE),
    "memcpy": ("cudaMemcpyAsync", _VALUE),
    "memcpy_2d": ("cudaMemcpy2DAsync", _VALUE),
    "memset": ("cudaMemsetAsync", _VALUE),
    "fill": ("cuMemsetD32Async", _VALUE),
    "host_fill": ("cudaStreamSynchronize", _HANDLE),
    "launch_host_func": ("cudaLaunchHostFunc", _RESOURCES),
    "create_stream": ("cudaStreamCreateWithFlags", _MEMORY),
    "destroy_stream": ("cudaStreamDestroy", _HANDLE),
    "synchronize_stream": ("cudaStreamSynchronize", _HANDLE),
    "create_event": ("cudaEventCreateWithFlags", _MEMORY),
    "destroy_event": ("cudaEventDestroy", _HANDLE),
    "record_event": ("cudaEventRecord", _HANDLE),
    "wait_event": ("cudaStreamWaitEvent", _HANDLE),
    "synchronize_event": ("cudaEventSynchronize", _HANDLE),
    "query_event": ("cudaEventQuery", _HANDLE),
    "synchronize": ("cudaDeviceSynchronize", _HANDLE),
    "begin_capture": ("cudaStreamBeginCapture", "cudaErrorStreamCaptureUnsupported"),
    "end_capture": ("cudaStreamEndCapture", "cudaErrorStreamCaptureInvalidated"),
    "launch_graph": ("cudaGraphLaunch", _RESOURCES),
    "destroy_graph": ("cudaGraphExecDestroy", _HANDLE),
}

#: The engine calls of a watched executor a fault can be armed on (they fail as TensorRT's do: False).
ENGINE_CALLS = ("execute_async_v3", "is_stream_capturable")

_ALLOC_CALLS = {Location.DEVICE: "cudaMalloc", Location.PINNED: "cudaMallocHost", Location.HOST: "malloc"}
_FREE_CALLS = {Location.DEVICE: "cudaFree", Location.PINNED: "cudaFreeHost", Location.HOST: "free"}
_OPTIONAL = ("launch_host_func", "host_fill")  # calls one backend has and the other has not


class Call(NamedTuple):
    """One call a :meth:`FaultyBackend.recording` saw: its method and which call of that method it was (1 for
    the first since the recording began). ``faulty.fail(*call)`` makes the same call of a replay fail."""

    method: str
    nth: int


class _Fault:
    __slots__ = ("method", "nth", "error", "seen")

    def __init__(self, method: str, nth: int, error: str | None) -> None:
        self.method = method
        self.nth = nth
        self.error = error
        self.seen = 0


class FaultyBackend:
    """A backend that forwards every call to ``backend`` and makes the calls armed with :meth:`fail` fail
    (see module docstring). It is a :class:`~trtio._cuda.backend.Backend`: pass it as ``backend=`` to the
    factories, and everything made from it (tensors, streams, events, graphs) calls through it.

    ``backend``: the backend to wrap (``"host"``, ``"cuda"``, a Backend; default: ``get_backend()``). The
    ReferenceEngine's host work and the live counts (``live_allocations`` ...) are the wrapped backend's,
    so a test may compare them with the wrapped backend's own baseline.

    Thread-safe; faults count the calls of every thread.
    """

    def __init__(self, backend: Backend | str | None = None) -> None:
        self.inner: Backend = get_backend(backend)
        if isinstance(self.inner, FaultyBackend):
            raise InvalidValueError("FaultyBackend: wrap the backend itself, not another FaultyBackend")
        self.name = self.inner.name  # code that asks which backend it runs on gets the wrapped one's answer
        self.device_id = self.inner.device_id
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._recordings: list[tuple[list[Call], Counter[str]]] = []  # each open recording and its counts
        self.counts: Counter[str] = Counter()  # calls of each faultable method and engine call, ever
        self.failed: list[Call] = []  # the calls made to fail, in order (nth as armed)

    # -- what the backend is: the wrapped one's name, device and counts ------------------------------
    @property
    def alloc_count(self) -> int:
        return self.inner.alloc_count

    @alloc_count.setter
    def alloc_count(self, value: int) -> None:
        self.inner.alloc_count = value

    @property
    def sync_count(self) -> int:
        return self.inner.sync_count

    @sync_count.setter
    def sync_count(self, value: int) -> None:
        self.inner.sync_count = value

    def __getattr__(self, name: str) -> Any:
        # The wrapped backend's extras (the host backend's op_count and launch_host_func, the cuda backend's
        # host_fill): present here exactly where they are present there, the calls among them faultable.
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__") or not hasattr(inner, name):
            raise NotAvailableError(f"FaultyBackend: {inner!r} has no {name!r}")
        found = getattr(inner, name)
        if name in _OPTIONAL:
            return lambda *args: self._call(name, found, *args)
        return found

    def __repr__(self) -> str:
        armed = ", ".join(f"{f.method}#{f.nth}" for f in self._faults)
        return f"FaultyBackend({self.inner!r}{', armed: ' + armed if armed else ''})"

    # -- faults ----------------------------------------------------------------------------------------
    def fail(self, method: str, nth: int = 1, *, error: str | None = None) -> None:
        """Make the ``nth`` call of ``method`` from now on fail (1: the next one), once. ``method`` is one of
        :data:`FAULTABLE` or :data:`ENGINE_CALLS`; ``error`` replaces the CUDA error name it raises."""
        if method not in FAULTABLE and method not in ENGINE_CALLS:
            raise InvalidValueError(f"FaultyBackend.fail: {method!r} is not a call a fault can be armed on; expected "
                                    f"one of {sorted(FAULTABLE) + list(ENGINE_CALLS)}")
        if isinstance(nth, bool) or not isinstance(nth, int) or nth < 1:
            raise InvalidValueError(f"FaultyBackend.fail: nth = {nth!r}; expected an int >= 1 (1: the next call)")
        with self._lock:
            self._faults.append(_Fault(method, nth, error))

    @property
    def armed(self) -> list[Call]:
        """The faults armed that have not fired yet (``nth`` counted from when each was armed)."""
        with self._lock:
            return [Call(f.method, f.nth) for f in self._faults]

    def clear(self) -> None:
        """Disarm every fault that has not fired."""
        with self._lock:
            self._faults.clear()

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[Call]]:
        """Record every faultable call (and engine call of a watched executor) made inside the block, in
        order, as :class:`Call` s numbered from the block's start: the positions a fault can be armed at."""
        calls: list[Call] = []
        entry = (calls, Counter[str]())
        with self._lock:
            self._recordings.append(entry)
        try:
            yield calls
        finally:
            with self._lock:
                self._recordings = [r for r in self._recordings if r is not entry]

    def _fires(self, method: str) -> _Fault | None:
        """Count a call of ``method``; the fault it fires, if one does."""
        with self._lock:
            self.counts[method] += 1
            for calls, seen in self._recordings:
                seen[method] += 1
                calls.append(Call(method, seen[method]))
            for f in self._faults:
                if f.method == method:
                    f.seen += 1
                    if f.seen == f.nth:
                        self._faults.remove(f)
                        self.failed.append(Call(method, f.nth))
                        return f
        return None

    def _error(self, fault: _Fault, call: str | None = None) -> CudaError:
        cuda_call, name = FAULTABLE[fault.method]
        return CudaError(call or cuda_call, fault.error or name,
                         f"made to fail by FaultyBackend (call {fault.nth} of {fault.method} since armed)")

    def _call(self, method: str, fn: Callable[..., Any], *args: Any) -> Any:
        fault = self._fires(method)
        if fault is not None:
            raise self._error(fault)
        return fn(*args)

    # -- memory ----------------------------------------------------------------------------------------
    def alloc(self, nbytes: int, location: Location) -> int:
        fault = self._fires("alloc")
        if fault is not None:
            raise self._error(fault, _ALLOC_CALLS[location])
        return self.inner.alloc(nbytes, location)

    def free(self, ptr: int, location: Location) -> None:
        fault = self._fires("free")
        if fault is not None:
            raise self._error(fault, _FREE_CALLS[location])
        self.inner.free(ptr, location)

    def memcpy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._call("memcpy", self.inner.memcpy, dst, src, nbytes, stream)

    def memcpy_2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, stream: int) -> None:
        self._call("memcpy_2d", self.inner.memcpy_2d, dst, dpitch, src, spitch, width, height, stream)

    def memset(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        self._call("memset", self.inner.memset, ptr, value, nbytes, stream)

    def fill(self, ptr: int, pattern: bytes, count: int, stream: int) -> None:
        self._call("fill", self.inner.fill, ptr, pattern, count, stream)

    def mem_info(self) -> tuple[int, int]:
        return self.inner.mem_info()

    def is_host_accessible(self, location: Location) -> bool:
        return self.inner.is_host_accessible(location)

    def knows_pointer(self, ptr: int, nbytes: int, location: Location) -> bool | None:
        return self.inner.knows_pointer(ptr, nbytes, location)

    # -- streams and events ----------------------------------------------------------------------------
    def create_stream(self) -> int:
        result: int = self._call("create_stream", self.inner.create_stream)
        return result

    def destroy_stream(self, stream: int) -> None:
        self._call("destroy_stream", self.inner.destroy_stream, stream)

    def knows_stream(self, stream: int) -> bool | None:
        return self.inner.knows_stream(stream)

    def synchronize_stream(self, stream: int) -> None:
        self._call("synchronize_stream", self.inner.synchronize_stream, stream)

    def create_event(self) -> int:
        result: int = self._call("create_event", self.inner.create_event)
        return result

    def destroy_event(self, event: int) -> None:
        self._call("destroy_event", self.inner.destroy_event, event)

    def record_event(self, event: int, stream: int) -> None:
        self._call("record_event", self.inner.record_event, event, stream)

    def wait_event(self, stream: int, event: int) -> None:
        self._call("wait_event", self.inner.wait_event, stream, event)

    def synchronize_event(self, event: int) -> None:
        self._call("synchronize_event", self.inner.synchronize_event, event)

    def query_event(self, event: int) -> bool:
        result: bool = self._call("query_event", self.inner.query_event, event)
        return result

    def synchronize(self) -> None:
        self._call("synchronize", self.inner.synchronize)

    # -- graphs ----------------------------------------------------------------------------------------
    def begin_capture(self, stream: int) -> None:
        self._call("begin_capture", self.inner.begin_capture, stream)

    def end_capture(self, stream: int) -> int:
        fault = self._fires("end_capture")
        if fault is not None:
            # CUDA ends the capture even when it reports it failed: the stream is not left capturing.
            self.inner.destroy_graph(self.inner.end_capture(stream))
            raise self._error(fault)
        return self.inner.end_capture(stream)

    def abort_capture(self, stream: int) -> None:
        self.inner.abort_capture(stream)

    def is_capturing(self, stream: int) -> bool:
        return self.inner.is_capturing(stream)

    def launch_graph(self, graph_exec: int, stream: int) -> None:
        self._call("launch_graph", self.inner.launch_graph, graph_exec, stream)

    def destroy_graph(self, graph_exec: int) -> None:
        self._call("destroy_graph", self.inner.destroy_graph, graph_exec)

    # -- what is live ----------------------------------------------------------------------------------
    @property
    def live_allocations(self) -> int:
        return self.inner.live_allocations

    @property
    def live_streams(self) -> int:
        return self.inner.live_streams

    @property
    def live_events(self) -> int:
        return self.inner.live_events

    @property
    def live_graphs(self) -> int:
        return self.inner.live_graphs

    # -- engines ---------------------------------------------------------------------------------------
    def watch(self, target: Any) -> None:
        """Route the engine calls of ``target`` (an :class:`~trtio._engine.EngineExecutor`, or a setup: each of
        its engines' executors) through this backend's faults: ``execute_async_v3`` (a fault: it returns False
        without enqueueing, as TensorRT does when an enqueue fails) and ``is_stream_capturable`` (a fault: it
        answers False, refusing the CUDA-graph capture; unfaulted it answers as the engine's context does, or
        True where the context has no such call). Watching twice is harmless."""
        engines = getattr(target, "engines", None)
        executors = [e.executor for e in engines()] if callable(engines) else [target]
        for ex in executors:
            ctx = getattr(ex, "context", None)
            if ctx is None:
                raise InvalidValueError(f"FaultyBackend.watch: {ex!r} has no execution context to watch (closed?)")
            if not isinstance(ctx, _WatchedContext):
                ex.context = _WatchedContext(ctx, self)

    def _engine_call(self, method: str) -> bool:
        """Whether a watched engine's ``method`` call fails (answers False)."""
        return self._fires(method) is not None


class _WatchedContext:
    """An execution context whose ``execute_async_v3`` and ``is_stream_capturable`` may fail; the rest is the
    context's own."""

    def __init__(self, context: Any, faulty: FaultyBackend) -> None:
        self._context = context
        self._faulty = faulty

    def __getattr__(self, name: str) -> Any:
        context = self.__dict__.get("_context")
        if context is None or name.startswith("__") or not hasattr(context, name):
            raise NotAvailableError(f"execution context {context!r} has no {name!r}")
        return getattr(context, name)

    def execute_async_v3(self, stream_handle: int) -> bool:
        if self._faulty._engine_call("execute_async_v3"):
            return False
        return bool(self._context.execute_async_v3(stream_handle))

    def is_stream_capturable(self, stream_handle: int) -> bool:
        if self._faulty._engine_call("is_stream_capturable"):
            return False
        own = getattr(self._context, "is_stream_capturable", None)
        return True if own is None else bool(own(stream_handle))
