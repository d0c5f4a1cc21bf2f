"""Host cost of the CUDA calls a step makes, through cuda.bindings' runtime and driver APIs (H200 check).

Usage: PYTHONPATH=. python3 scripts/api_costs.py
"""

from __future__ import annotations

import time
from collections.abc import Callable


def timeit(name: str, fn: Callable[[], object], n: int = 3000) -> None:
    for _ in range(200):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    print(f"{name:50s} {(time.perf_counter() - t) / n * 1e6:7.2f} us")


def main() -> None:
    from cuda.bindings import driver as drv
    from cuda.bindings import runtime as rt

    from trtio import get_backend
    from trtio._cuda import kernels
    from trtio._cuda.backend import Location

    be = get_backend("cuda")
    s = be.create_stream()
    h = be.alloc(4096, Location.PINNED)
    d = be.alloc(1 << 20, Location.DEVICE)
    e = be.create_event()
    kind = rt.cudaMemcpyKind.cudaMemcpyDefault
    cs = drv.CUstream(s)
    ce = drv.CUevent(e)
    timeit("rt.cudaMemcpyAsync (int stream)", lambda: rt.cudaMemcpyAsync(d, h, 64, kind, s))
    timeit("drv.cuMemcpyAsync (int stream)", lambda: drv.cuMemcpyAsync(d, h, 64, s))
    timeit("drv.cuMemcpyAsync (CUstream)", lambda: drv.cuMemcpyAsync(d, h, 64, cs))
    timeit("drv.cuMemcpyHtoDAsync (CUstream)", lambda: drv.cuMemcpyHtoDAsync(d, h, 64, cs))
    timeit("be.memcpy", lambda: be.memcpy(d, h, 64, s))
    timeit("rt.cudaMemcpy2DAsync", lambda: rt.cudaMemcpy2DAsync(d, 256, h, 128, 128, 8, kind, s))
    timeit("rt.cudaEventRecord", lambda: rt.cudaEventRecord(e, s))
    timeit("drv.cuEventRecord (objects)", lambda: drv.cuEventRecord(ce, cs))
    timeit("rt.cudaEventQuery", lambda: rt.cudaEventQuery(e))
    timeit("drv.cuEventQuery (object)", lambda: drv.cuEventQuery(ce))
    timeit("rt.cudaMemsetAsync", lambda: rt.cudaMemsetAsync(d, 0, 4096, s))
    timeit("drv.cuMemsetD8Async", lambda: drv.cuMemsetD8Async(d, 0, 4096, cs))
    be.synchronize_stream(s)
    # graph of one memset
    be.begin_capture(s)
    rt.cudaMemsetAsync(d, 0, 64, s)
    g = be.end_capture(s)
    cg = drv.CUgraphExec(g)
    timeit("rt.cudaGraphLaunch", lambda: rt.cudaGraphLaunch(g, s))
    timeit("drv.cuGraphLaunch (objects)", lambda: drv.cuGraphLaunch(cg, cs))
    be.synchronize_stream(s)
    # kernels
    kernels.kernels(be.device_id)
    job = (d, 0, d + 65536, d + 131072, 4, 64, 64, 64, 16, 16)  # 4 rows of 64 bytes, indices at d + 131072
    packed = kernels.copy_jobs(be.device_id, [job], 8192, 128)
    timeit("kernels.Launch (trtio_copy_jobs)", lambda: packed(s))
    k = kernels.kernels(be.device_id)["trtio_copy_jobs"]
    err, fn = drv.cuKernelGetFunction(k.handle)
    print("cuKernelGetFunction", err)
    import ctypes

    table = kernels.CopyJobs(n=1, span=8192)
    table.job[0] = kernels.CopyJob(*job, 0, 1)
    arr = (ctypes.c_void_p * 1)(ctypes.addressof(table))
    addr = ctypes.addressof(arr)
    rt.cudaMemsetAsync(d + 131072, 0, 64, s)
    print("raw launch", drv.cuLaunchKernel(fn, 4, 1, 1, 128, 1, 1, 0, cs, addr, 0))
    be.synchronize_stream(s)
    timeit("drv.cuLaunchKernel (packed params)", lambda: drv.cuLaunchKernel(fn, 4, 1, 1, 128, 1, 1, 0, cs, addr, 0))
    timeit("drv.cuLaunchKernel (int stream)", lambda: drv.cuLaunchKernel(fn, 4, 1, 1, 128, 1, 1, 0, s, addr, 0))
    cu_launch = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
    cu_launch.argtypes = (ctypes.c_void_p,) + (ctypes.c_uint,) * 6 + (ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                                                                      ctypes.c_void_p)
    fn_ptr = int(fn)
    timeit("ctypes cuLaunchKernel", lambda: cu_launch(fn_ptr, 4, 1, 1, 128, 1, 1, 0, s, addr, None))
    be.synchronize_stream(s)
    # The same driver calls through ctypes (argument types declared once): the floor of a Python call.
    cu = ctypes.CDLL("libcuda.so.1")
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    cu.cuMemcpyHtoDAsync_v2.argtypes = (ctypes.c_uint64, vp, sz, vp)
    cu.cuEventRecord.argtypes = (vp, vp)
    cu.cuEventQuery.argtypes = (vp,)
    cu.cuGraphLaunch.argtypes = (vp, vp)
    timeit("ctypes cuMemcpyHtoDAsync_v2", lambda: cu.cuMemcpyHtoDAsync_v2(d, h, 64, s))
    timeit("ctypes cuEventRecord", lambda: cu.cuEventRecord(e, s))
    timeit("ctypes cuEventQuery", lambda: cu.cuEventQuery(e))
    timeit("ctypes cuGraphLaunch", lambda: cu.cuGraphLaunch(g, s))
    timeit("be.record_event", lambda: be.record_event(e, s))
    timeit("be.query_event", lambda: be.query_event(e))
    timeit("be.launch_graph", lambda: be.launch_graph(g, s))
    timeit("be.synchronize_stream (idle)", lambda: be.synchronize_stream(s), n=1000)
    be.synchronize_stream(s)
    print("done")


if __name__ == "__main__":
    main()
