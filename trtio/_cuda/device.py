"""The cuda backend: device and pinned memory, streams, events and graphs through cuda-python.

cuda.core selects the device and makes its primary context current (the context torch and
CuPy use too); the calls below it go through cuda.bindings' runtime and driver modules. Every
call's status is checked: a failure raises :class:`CudaError` with the call, the CUDA error
name and CUDA's description. cuda-python is imported lazily, so ``import trtio`` works with
no driver.
"""

from __future__ import annotations

import threading
from typing import Any

from trtio._cuda._hostmem import HostHeap, host_fill
from trtio._cuda._location import Location
from trtio.errors import CudaError, InvalidValueError

__all__ = ["CudaBackend", "probe_device_count", "probe_error"]

_probe_error: str = ""
_SIZE_LIMIT = 1 << 64  # cudaMalloc takes a size_t


def _runtime() -> Any:
    from cuda.bindings import runtime

    return runtime


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def probe_device_count() -> int:
    """Number of CUDA devices, 0 when cuda-python, the driver or a device is missing. Never raises."""
    global _probe_error
    try:
        rt = _runtime()
        err, count = rt.cudaGetDeviceCount()
    except Exception as exc:  # ImportError, or the loader's RuntimeError without a driver
        _probe_error = f"cuda-python could not be loaded: {exc}"
        return 0
    if err != rt.cudaError_t.cudaSuccess:
        _probe_error = f"cudaGetDeviceCount returned {_error_name(err)}"
        return 0
    if count == 0:
        _probe_error = "cudaGetDeviceCount found no device"
    return int(count)


def probe_error() -> str:
    return _probe_error or "unknown reason"


def _error_name(err: Any) -> str:
    try:
        rt = _runtime()
        if isinstance(err, rt.cudaError_t):
            return str(rt.cudaGetErrorName(err)[1].decode())
        drv = _driver()
        return str(drv.cuGetErrorName(err)[1].decode())
    except Exception:
        return str(err)


def _error_text(err: Any) -> str:
    try:
        rt = _runtime()
        if isinstance(err, rt.cudaError_t):
            return str(rt.cudaGetErrorString(err)[1].decode())
        return str(_driver().cuGetErrorString(err)[1].decode())
    except Exception:
        return ""


def _check(call: str, result: Any) -> Any:
    """Raise CudaError unless the (status, *values) tuple reports success; return the values."""
    status = result[0] if isinstance(result, tuple) else result
    if int(status) != 0:
        raise CudaError(call, _error_name(status), _error_text(status))
    if not isinstance(result, tuple) or len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


class CudaBackend:
    """cuda-python backend (see module docstring). One instance per process and device; thread-safe.

    It counts what it creates and destroys (``live_allocations``, ``live_streams``,
    ``live_events``, ``live_graphs``), so that leak tests can compare them with a baseline.
    """

    name = "cuda"

    def __init__(self, device_id: int = 0) -> None:
        self.device_id = device_id
        self.alloc_count = 0
        self.sync_count = 0
        self._rt = _runtime()
        self._drv = _driver()
        self._host = HostHeap()
        self._lock = threading.Lock()
        self._live = {"allocations": 0, "streams": 0, "events": 0, "graphs": 0}
        try:
            from cuda.core import Device

            self._device = Device(device_id)
            self._device.set_current()
            self.device_name = self._device.name
            self.compute_capability = tuple(self._device.compute_capability)
        except Exception as exc:
            raise CudaError("cuda.core.Device.set_current", None, str(exc)) from exc
        _check("cudaSetDevice", self._rt.cudaSetDevice(device_id))
        # The calls a step makes, bound once: a step makes a handful, so their Python overhead counts.
        rt = self._rt
        self._ok = rt.cudaError_t.cudaSuccess
        self._not_ready = rt.cudaError_t.cudaErrorNotReady
        self._kind = rt.cudaMemcpyKind.cudaMemcpyDefault
        self._memcpy_async = rt.cudaMemcpyAsync
        self._memcpy_2d_async = rt.cudaMemcpy2DAsync
        self._memset_async = rt.cudaMemsetAsync
        self._event_record = rt.cudaEventRecord
        self._event_query = rt.cudaEventQuery
        self._graph_launch = rt.cudaGraphLaunch

    def __repr__(self) -> str:
        return f"CudaBackend(device={self.device_id}, name={self.device_name!r})"

    def _count(self, what: str, delta: int) -> None:
        with self._lock:
            self._live[what] += delta

    @property
    def live_allocations(self) -> int:
        return self._live["allocations"]

    @property
    def live_streams(self) -> int:
        return self._live["streams"]

    @property
    def live_events(self) -> int:
        return self._live["events"]

    @property
    def live_graphs(self) -> int:
        return self._live["graphs"]

    # -- memory ---------------------------------------------------------------------------
    def alloc(self, nbytes: int, location: Location) -> int:
        if nbytes <= 0:
            raise InvalidValueError(f"alloc of {nbytes} bytes: size must be positive")
        call = {Location.DEVICE: "cudaMalloc", Location.PINNED: "cudaMallocHost"}.get(location, "malloc")
        if nbytes >= _SIZE_LIMIT:
            raise CudaError(call, "cudaErrorMemoryAllocation", f"{nbytes} bytes of {location} memory asked; "
                                                               f"sizes are 64-bit")
        if location is Location.DEVICE:
            ptr = int(_check(call, self._rt.cudaMalloc(nbytes)))
        elif location is Location.PINNED:
            ptr = int(_check(call, self._rt.cudaMallocHost(nbytes)))
        else:
            try:
                ptr = self._host.alloc(nbytes)
            except (MemoryError, ValueError) as exc:
                raise CudaError(call, "cudaErrorMemoryAllocation",
                                f"{nbytes} bytes of {location} memory could not be allocated ({exc})") from None
        with self._lock:
            self.alloc_count += 1
            self._live["allocations"] += 1
        return ptr

    def free(self, ptr: int, location: Location) -> None:
        if location is Location.DEVICE:
            _check("cudaFree", self._rt.cudaFree(ptr))
        elif location is Location.PINNED:
            _check("cudaFreeHost", self._rt.cudaFreeHost(ptr))
        elif not self._host.free(ptr):
            raise CudaError("free", "cudaErrorInvalidValue", f"pointer 0x{ptr:x} was not allocated here")
        self._count("allocations", -1)

    def is_host_accessible(self, location: Location) -> bool:
        return location is not Location.DEVICE

    def knows_pointer(self, ptr: int, nbytes: int, location: Location) -> bool | None:
        """None: device memory may come from anywhere (torch, CuPy, a pool), which trtio cannot vouch for."""
        return None

    def knows_stream(self, stream: int) -> bool | None:
        """None: streams of other libraries are legitimate, and CUDA offers no safe way to check a handle."""
        return None

    def memcpy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        if nbytes > 0:
            err = self._memcpy_async(dst, src, nbytes, self._kind, stream)[0]
            if err != self._ok:
                _check("cudaMemcpyAsync", (err,))
        elif nbytes < 0:  # cuda-python would raise a bare OverflowError for the size_t
            raise CudaError("cudaMemcpyAsync", "cudaErrorInvalidValue", f"negative size {nbytes}")

    def memcpy_2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
                  stream: int) -> None:
        if min(width, height, dpitch, spitch) < 0:
            raise CudaError("cudaMemcpy2DAsync", "cudaErrorInvalidValue",
                            f"width {width}, height {height}, pitches {dpitch} / {spitch}: sizes must not be negative")
        if width and height:
            err = self._memcpy_2d_async(dst, dpitch, src, spitch, width, height, self._kind, stream)[0]
            if err != self._ok:
                _check("cudaMemcpy2DAsync", (err,))

    def memset(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        if nbytes > 0:
            err = self._memset_async(ptr, value, nbytes, stream)[0]
            if err != self._ok:
                _check("cudaMemsetAsync", (err,))
        elif nbytes < 0:
            raise CudaError("cudaMemsetAsync", "cudaErrorInvalidValue", f"negative size {nbytes}")

    def fill(self, ptr: int, pattern: bytes, count: int, stream: int) -> None:
        """Device fill with 1/2/4/8-byte patterns through the driver's memset kernels."""
        if count <= 0:
            if count < 0:
                raise CudaError("cuMemsetD8Async", "cudaErrorInvalidValue", f"negative count {count}")
            return
        drv = self._drv
        width = len(pattern)
        value = int.from_bytes(pattern, "little")
        if width == 1:
            _check("cuMemsetD8Async", drv.cuMemsetD8Async(ptr, value, count, stream))
        elif width == 2:
            _check("cuMemsetD16Async", drv.cuMemsetD16Async(ptr, value, count, stream))
        elif width == 4:
            _check("cuMemsetD32Async", drv.cuMemsetD32Async(ptr, value, count, stream))
        elif width == 8:
            lo, hi = value & 0xFFFFFFFF, value >> 32
            # Two strided 2D fills write the low and high words of every 8-byte element.
            _check("cuMemsetD2D32Async", drv.cuMemsetD2D32Async(ptr, 8, lo, 1, count, stream))
            _check("cuMemsetD2D32Async", drv.cuMemsetD2D32Async(ptr + 4, 8, hi, 1, count, stream))
        else:
            raise InvalidValueError(f"fill pattern must be 1, 2, 4 or 8 bytes, got {width}")

    def host_fill(self, ptr: int, pattern: bytes, count: int, stream: int) -> None:
        """Fill pageable host memory after the stream's earlier work (synchronises the stream)."""
        self.synchronize_stream(stream)
        host_fill(ptr, pattern, count)

    def mem_info(self) -> tuple[int, int]:
        free, total = _check("cudaMemGetInfo", self._rt.cudaMemGetInfo())
        return int(free), int(total)

    # -- streams and events ---------------------------------------------------------------
    def create_stream(self) -> int:
        flags = self._rt.cudaStreamNonBlocking
        handle = int(_check("cudaStreamCreateWithFlags", self._rt.cudaStreamCreateWithFlags(flags)))
        self._count("streams", 1)
        return handle

    def destroy_stream(self, stream: int) -> None:
        _check("cudaStreamDestroy", self._rt.cudaStreamDestroy(stream))
        self._count("streams", -1)

    def synchronize_stream(self, stream: int) -> None:
        with self._lock:
            self.sync_count += 1
        _check("cudaStreamSynchronize", self._rt.cudaStreamSynchronize(stream))

    def create_event(self) -> int:
        flags = self._rt.cudaEventDisableTiming
        handle = int(_check("cudaEventCreateWithFlags", self._rt.cudaEventCreateWithFlags(flags)))
        self._count("events", 1)
        return handle

    def destroy_event(self, event: int) -> None:
        _check("cudaEventDestroy", self._rt.cudaEventDestroy(event))
        self._count("events", -1)

    def record_event(self, event: int, stream: int) -> None:
        err = self._event_record(event, stream)[0]
        if err != self._ok:
            _check("cudaEventRecord", (err,))

    def wait_event(self, stream: int, event: int) -> None:
        _check("cudaStreamWaitEvent", self._rt.cudaStreamWaitEvent(stream, event, 0))

    def synchronize_event(self, event: int) -> None:
        with self._lock:
            self.sync_count += 1
        _check("cudaEventSynchronize", self._rt.cudaEventSynchronize(event))

    def query_event(self, event: int) -> bool:
        err = self._event_query(event)[0]
        if err == self._ok:
            return True
        if err == self._not_ready:
            return False
        _check("cudaEventQuery", (err,))
        return True

    def synchronize(self) -> None:
        with self._lock:
            self.sync_count += 1
        _check("cudaDeviceSynchronize", self._rt.cudaDeviceSynchronize())

    # -- graphs ---------------------------------------------------------------------------
    def begin_capture(self, stream: int) -> None:
        mode = self._rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        _check("cudaStreamBeginCapture", self._rt.cudaStreamBeginCapture(stream, mode))

    def end_capture(self, stream: int) -> int:
        graph = _check("cudaStreamEndCapture", self._rt.cudaStreamEndCapture(stream))
        try:
            graph_exec = _check("cudaGraphInstantiate", self._rt.cudaGraphInstantiate(graph, 0))
        finally:
            # cuda.bindings handles do not own their resource: destroy the template explicitly.
            _check("cudaGraphDestroy", self._rt.cudaGraphDestroy(graph))
        self._count("graphs", 1)
        return int(graph_exec)

    def abort_capture(self, stream: int) -> None:
        if not self.is_capturing(stream):
            return
        err, graph = self._rt.cudaStreamEndCapture(stream)
        if int(err) == 0 and graph is not None and int(graph):
            self._rt.cudaGraphDestroy(graph)

    def is_capturing(self, stream: int) -> bool:
        status = _check("cudaStreamIsCapturing", self._rt.cudaStreamIsCapturing(stream))
        return bool(status != self._rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone)

    def launch_graph(self, graph_exec: int, stream: int) -> None:
        err = self._graph_launch(graph_exec, stream)[0]
        if err != self._ok:
            _check("cudaGraphLaunch", (err,))

    def destroy_graph(self, graph_exec: int) -> None:
        _check("cudaGraphExecDestroy", self._rt.cudaGraphExecDestroy(graph_exec))
        self._count("graphs", -1)
