import ctypes
import threading
import time

import numpy as np
import pytest
from _threads import run_at_once

import trtio
from trtio import CudaError, Location
from trtio._cuda._hostmem import host_view
from trtio._cuda.backend import cuda_available
from trtio._cuda.host import HostBackend


def test_auto_backend_is_host_without_a_gpu():
    if cuda_available():
        assert trtio.get_backend().name == "cuda"
    else:
        assert trtio.get_backend().name == "host"
        assert trtio.get_backend("auto") is trtio.get_backend("host")


def test_cuda_backend_refused_clearly_without_a_device():
    if cuda_available():
        pytest.skip("a CUDA device answers here")
    with pytest.raises(CudaError, match=r"get_backend\('cuda'\).*no CUDA device"):
        trtio.get_backend("cuda")


def test_unknown_backend_kind():
    with pytest.raises(ValueError, match="'tpu'"):
        trtio.get_backend("tpu")


def test_backend_instance_passes_through(host):
    assert trtio.get_backend(host) is host


def _pattern(backend, n, value):
    """A host buffer (pinned on cuda) filled with `value`."""
    ptr = backend.alloc(n, Location.PINNED)
    ctypes.memset(ptr, value, n)
    return ptr


def test_memcpy_memset_and_2d(backend):
    s = backend.create_stream()
    dev = backend.alloc(1024, Location.DEVICE)
    src = _pattern(backend, 1024, 7)
    dst = backend.alloc(1024, Location.PINNED)
    backend.memset(dev, 0, 1024, s)
    backend.memcpy(dev + 256, src, 100, s)  # a partial copy into the middle
    backend.memcpy(dst, dev, 1024, s)
    backend.synchronize_stream(s)
    out = host_view(dst, 1024)
    assert out[:256].sum() == 0 and (out[256:356] == 7).all() and out[356:].sum() == 0
    # 2D: 4 rows of 8 bytes, source pitch 16, destination pitch 32
    backend.memset(dev, 0, 1024, s)
    backend.memcpy_2d(dev, 32, src, 16, 8, 4, s)
    backend.memcpy(dst, dev, 128, s)
    backend.synchronize_stream(s)
    rows = host_view(dst, 128).reshape(4, 32)
    assert (rows[:, :8] == 7).all() and rows[:, 8:].sum() == 0
    for p, loc in ((dev, Location.DEVICE), (src, Location.PINNED), (dst, Location.PINNED)):
        backend.free(p, loc)
    backend.destroy_stream(s)


@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_fill_patterns(backend, width):
    s = backend.create_stream()
    dev = backend.alloc(256, Location.DEVICE)
    out = backend.alloc(256, Location.PINNED)
    value = {1: 0xAB, 2: 0xBEEF, 4: 0xDEADBEEF, 8: 0x0123456789ABCDEF}[width]
    backend.fill(dev, value.to_bytes(width, "little"), 64 // width * 2, s)
    backend.memcpy(out, dev, 128, s)
    backend.synchronize_stream(s)
    got = host_view(out, 128).view(f"<u{width}")
    assert (got == value).all()
    backend.free(dev, Location.DEVICE)
    backend.free(out, Location.PINNED)
    backend.destroy_stream(s)


def test_graph_replays_copies_with_new_data(backend):
    """A captured copy reads its source at replay time: new staged data flows through."""
    s = backend.create_stream()
    staging = backend.alloc(64, Location.PINNED)
    dev = backend.alloc(64, Location.DEVICE)
    out = backend.alloc(64, Location.PINNED)
    backend.begin_capture(s)
    assert backend.is_capturing(s)
    backend.memcpy(dev, staging, 64, s)
    backend.memcpy(out, dev, 64, s)
    graph = backend.end_capture(s)
    assert not backend.is_capturing(s)
    for i in range(5):
        host_view(staging, 64)[:] = i + 1
        backend.launch_graph(graph, s)
        backend.synchronize_stream(s)
        assert (host_view(out, 64) == i + 1).all()
    backend.destroy_graph(graph)
    for p, loc in ((staging, Location.PINNED), (dev, Location.DEVICE), (out, Location.PINNED)):
        backend.free(p, loc)
    backend.destroy_stream(s)


def test_host_capture_records_instead_of_running(host):
    s = host.create_stream()
    buf = host.alloc(16, Location.DEVICE)
    host.memset(buf, 1, 16, s)
    host.begin_capture(s)
    host.memset(buf, 9, 16, s)
    assert (host_view(buf, 16) == 1).all(), "captured work must not run at capture time"
    g = host.end_capture(s)
    host.launch_graph(g, s)
    assert (host_view(buf, 16) == 9).all()
    host.destroy_graph(g)
    host.free(buf, Location.DEVICE)


def test_host_times_the_device_work_it_runs_not_what_it_records(host):
    """``work_seconds`` (the benchmark's "device work" column) grows by the time the work itself takes:
    host work run in stream order and graph replays, not captures or work that ran elsewhere."""
    s = host.create_stream()
    nap = 0.02

    def work() -> None:
        time.sleep(nap)

    before = host.work_seconds
    host.launch_host_func(s, work)
    ran = host.work_seconds - before
    assert nap <= ran < nap + 1.0
    host.begin_capture(s)
    host.launch_host_func(s, work)
    g = host.end_capture(s)
    assert host.work_seconds - before == ran, "a capture records the work and runs none"
    host.launch_graph(g, s)
    assert host.work_seconds - before >= ran + nap, "a replay runs it"
    time.sleep(nap)  # host time outside the backend's work is not counted
    host.destroy_graph(g)
    assert host.work_seconds - before < 2 * nap + 1.0
    host.destroy_stream(s)


def test_host_refuses_what_a_capture_forbids(host):
    s = host.create_stream()
    host.begin_capture(s)
    with pytest.raises(CudaError, match="cudaErrorStreamCaptureUnsupported"):
        host.synchronize_stream(s)
    with pytest.raises(CudaError, match="cudaErrorStreamCaptureUnsupported"):
        host.alloc(16, Location.DEVICE)
    with pytest.raises(CudaError, match="already being captured"):
        host.begin_capture(s)
    host.abort_capture(s)
    assert not host.is_capturing(s)
    with pytest.raises(CudaError, match="not being captured"):
        host.end_capture(s)


def test_free_of_unknown_pointer_is_an_error(backend):
    buf = np.zeros(16, np.uint8)
    with pytest.raises(CudaError, match=rf"pointer 0x{buf.ctypes.data:x} was not allocated here"):
        backend.free(buf.ctypes.data, Location.HOST)


def test_mem_info(backend):
    free, total = backend.mem_info()
    assert 0 < free <= total


def test_events_on_backend(backend):
    s = backend.create_stream()
    e = backend.create_event()
    backend.record_event(e, s)
    backend.wait_event(s, e)
    backend.synchronize_event(e)
    assert backend.query_event(e)
    backend.destroy_event(e)
    backend.destroy_stream(s)


@pytest.mark.gpu
def test_cuda_errors_name_call_and_error(cuda):
    with pytest.raises(CudaError) as info:
        cuda.alloc(1 << 62, Location.DEVICE)
    assert info.value.call == "cudaMalloc"
    assert info.value.name == "cudaErrorMemoryAllocation"
    assert "cudaMalloc: cudaErrorMemoryAllocation" in str(info.value)


# -- what is live ------------------------------------------------------------------------------------
def test_live_counters_follow_creates_and_destroys(backend):
    before = (backend.live_allocations, backend.live_streams, backend.live_events, backend.live_graphs)
    s = backend.create_stream()
    e = backend.create_event()
    ptr = backend.alloc(256, Location.DEVICE)
    backend.begin_capture(s)
    backend.memset(ptr, 0, 256, s)
    g = backend.end_capture(s)
    assert (backend.live_allocations, backend.live_streams, backend.live_events, backend.live_graphs) == tuple(
        n + 1 for n in before)
    backend.destroy_graph(g)
    backend.free(ptr, Location.DEVICE)
    backend.destroy_event(e)
    backend.destroy_stream(s)
    assert (backend.live_allocations, backend.live_streams, backend.live_events, backend.live_graphs) == before


def test_host_refuses_to_destroy_what_is_not_live(host):
    with pytest.raises(CudaError, match="cudaStreamDestroy.*0xdead"):
        host.destroy_stream(0xDEAD)
    with pytest.raises(CudaError, match="cudaEventDestroy.*0xbeef"):
        host.destroy_event(0xBEEF)
    with pytest.raises(CudaError, match="cudaGraphExecDestroy"):
        host.destroy_graph(0xF00D)


def test_host_knows_its_streams_and_device_allocations(host):
    s = host.create_stream()
    assert host.knows_stream(s) is True and host.knows_stream(0xDEAD) is False
    ptr = host.alloc(1000, Location.DEVICE)
    assert host.knows_pointer(ptr, 1000, Location.DEVICE) is True
    assert host.knows_pointer(ptr + 512, 488, Location.DEVICE) is True
    assert host.knows_pointer(ptr + 512, 489, Location.DEVICE) is False, "runs past the allocation"
    buf = np.zeros(64, np.uint8)
    assert host.knows_pointer(buf.ctypes.data, 64, Location.DEVICE) is False
    assert host.knows_pointer(buf.ctypes.data, 64, Location.HOST) is None, "any host memory may be wrapped"
    host.free(ptr, Location.DEVICE)
    assert host.knows_pointer(ptr, 1000, Location.DEVICE) is False
    host.destroy_stream(s)


def test_host_allocation_beyond_memory_is_a_cuda_error(host):
    with pytest.raises(CudaError, match=r"cudaMalloc: cudaErrorMemoryAllocation: 8796093022208 bytes of device"):
        host.alloc(1 << 43, Location.DEVICE)
    with pytest.raises(CudaError, match="cudaErrorMemoryAllocation"):
        host.alloc(1 << 70, Location.PINNED)


# -- threads -------------------------------------------------------------------------------------------
def _in_thread(fn):
    """Run ``fn`` on a new thread; return what it returned, raise what it raised."""
    out = {}

    def main():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            out["error"] = exc

    t = threading.Thread(target=main)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_host_capture_rules_apply_to_the_capturing_thread_only(host):
    """As cudaStreamCaptureModeThreadLocal: other threads may allocate and synchronise during a capture."""
    s = host.create_stream()
    other = host.create_stream()
    e = host.create_event()
    host.begin_capture(s)
    try:
        ptr = _in_thread(lambda: host.alloc(64, Location.DEVICE))
        _in_thread(lambda: host.free(ptr, Location.DEVICE))
        _in_thread(host.synchronize)
        _in_thread(lambda: host.synchronize_stream(other))
        _in_thread(lambda: host.synchronize_event(e))
        assert _in_thread(lambda: host.query_event(e))
        with pytest.raises(CudaError, match="cudaErrorStreamCaptureUnsupported"):
            _in_thread(lambda: host.synchronize_stream(s))  # the captured stream itself: from any thread
        with pytest.raises(CudaError, match="cudaErrorStreamCaptureWrongThread"):
            _in_thread(lambda: host.end_capture(s))
        for call in (lambda: host.alloc(64, Location.DEVICE), lambda: host.free(0x1000, Location.DEVICE),
                     host.synchronize, lambda: host.synchronize_stream(other), lambda: host.synchronize_event(e),
                     lambda: host.query_event(e)):
            with pytest.raises(CudaError, match=f"cudaErrorStreamCaptureUnsupported.*capturing stream 0x{s:x}"):
                call()
    finally:
        host.destroy_graph(host.end_capture(s))
    host.free(host.alloc(64, Location.DEVICE), Location.DEVICE)
    for h in (s, other):
        host.destroy_stream(h)
    host.destroy_event(e)


def test_host_backend_state_is_consistent_under_threads():
    be = HostBackend()

    def work():
        for _ in range(300):
            s = be.create_stream()
            e = be.create_event()
            p = be.alloc(256, Location.DEVICE)
            be.record_event(e, s)
            be.synchronize_stream(s)
            be.free(p, Location.DEVICE)
            be.destroy_event(e)
            be.destroy_stream(s)

    run_at_once([work] * 8)
    assert be.alloc_count == 8 * 300 and be.sync_count == 8 * 300
    assert (be.live_allocations, be.live_streams, be.live_events) == (0, 0, 0)


def test_negative_sizes_are_refused_not_taken_as_huge(backend):
    s = backend.create_stream()
    ptr = backend.alloc(256, Location.DEVICE)
    for call, name in ((lambda: backend.memcpy(ptr, ptr, -1, s), "cudaMemcpyAsync"),
                       (lambda: backend.memset(ptr, 0, -1, s), "cudaMemsetAsync"),
                       (lambda: backend.fill(ptr, b"\0\0\0\0", -1, s), "cuMemsetD8Async"),
                       (lambda: backend.memcpy_2d(ptr, 16, ptr, 16, -8, 2, s), "cudaMemcpy2DAsync")):
        with pytest.raises(CudaError, match=f"{name}: cudaErrorInvalidValue"):
            call()
    backend.free(ptr, Location.DEVICE)
    backend.destroy_stream(s)


def test_host_memcpy_2d_refuses_rows_wider_than_the_pitch(host):
    s = host.create_stream()
    ptr = host.alloc(256, Location.DEVICE)
    with pytest.raises(CudaError, match="width must fit in both pitches"):
        host.memcpy_2d(ptr, 8, ptr + 128, 16, 12, 4, s)
    host.free(ptr, Location.DEVICE)
    host.destroy_stream(s)
