"""trtio's CUDA kernels run on the CPU, through trtio's own launches.

The kernel sources (``trtio._cuda.kernels.TRTIO_KERNELS`` and a family's :class:`~trtio._cuda.kernels.KernelSource`) are
compiled by the host's C++ compiler behind a prelude that makes each block one thread: blocks run one after another,
in grid order, so every kernel's strided loops (``for (j = threadIdx.x; ...; j += blockDim.x)``) cover every element
and ``__syncthreads()`` has no one to wait for. A kernel that indexes by the thread's place in the grid
(``blockIdx.x * blockDim.x + threadIdx.x``) and never waits for its block runs its block's threads one after another.

:func:`kernels_on_host` gives a backend that names itself ``cuda`` but keeps its memory on the host, so trtio's ops
take their kernel path, and replaces ``kernels.Launch`` by a launch that runs the compiled kernel in stream order
with the very arguments trtio packs for ``cuLaunchKernel``. Each launch first checks those arguments against the
kernel's parameters, parsed from the preprocessed source: their number, and each one's size (a 4-byte int where the
kernel takes 8 bytes would shift every later parameter on a GPU; a struct passed by value: its size as the compiler
lays it out).

What it checks: each kernel's indexing and arithmetic, and the parameters trtio passes it. What it cannot: races
between the threads of a block, memory ordering, the speed. The one CUDA-only instruction (the half-to-float ``cvt``
of the replay kernel) is replaced by a plain conversion, and the replacement is checked to happen.
"""

from __future__ import annotations

import atexit
import ctypes
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trtio import _ops as ops
from trtio._cuda import kernels
from trtio._cuda.backend import Backend, get_backend
from trtio._cuda.host import HostBackend

_PRELUDE = r"""
#include <cstdint>
#include <cstring>
struct trtio_dim3 { unsigned x, y, z; };
static trtio_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
struct int4 { int x, y, z, w; };
static inline int4 make_int4(int x, int y, int z, int w) { int4 v = {x, y, z, w}; return v; }
static inline float trtio_host_half(unsigned short h) {  // IEEE half bits to float (subnormals, inf and NaN too)
    unsigned sign = (h >> 15) & 1u, exp = (h >> 10) & 31u, man = h & 1023u, bits;
    if (exp == 31u) bits = (sign << 31) | 0x7f800000u | (man << 13);
    else if (exp != 0u) bits = (sign << 31) | ((exp + 112u) << 23) | (man << 13);
    else if (man == 0u) bits = sign << 31;
    else {
        exp = 113u;
        while (!(man & 1024u)) { man <<= 1; --exp; }
        bits = (sign << 31) | (exp << 23) | ((man & 1023u) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
#define __global__
#define __device__
#define __forceinline__ inline
#define __syncthreads() ((void)0)
extern "C" void trtio_host_block(unsigned x, unsigned y, unsigned z) { blockIdx.x = x; blockIdx.y = y; blockIdx.z = z; }
extern "C" void trtio_host_grid(unsigned x, unsigned y, unsigned z) { gridDim.x = x; gridDim.y = y; gridDim.z = z; }
extern "C" void trtio_host_threads(unsigned n) { blockDim.x = n; }
extern "C" void trtio_host_thread(unsigned x) { threadIdx.x = x; }
"""

# The device's half conversion, an instruction, and its host replacement.
_HALF_ASM = 'asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));'
_HALF_HOST = "f = trtio_host_half(h);"
_KERNEL = re.compile(r'extern "C"\s+void\s+(\w+)\s*\((.*?)\)\s*\{', re.S)


def host_compiler() -> str | None:
    """The host's C++ compiler (``c++`` or ``g++``), or None."""
    return shutil.which("c++") or shutil.which("g++")


class _Compiled:
    """One kernel source built for the host: the library and each kernel's parameter sizes (bytes)."""

    def __init__(self, source: kernels.KernelSource, folder: Path, compiler: str) -> None:
        text = source.source.replace(_HALF_ASM, _HALF_HOST)
        assert "asm(" not in text, f"{source.key}: an instruction the host harness does not replace"
        cpp = folder / f"{source.key}.cpp"
        cpp.write_text(_PRELUDE + text)
        flags = ["-std=c++17", "-O1", "-fPIC", "-Wno-unknown-pragmas"]
        expanded = subprocess.run([compiler, *flags, "-E", "-P", str(cpp)], check=True, capture_output=True,
                                  text=True).stdout
        params = {name: [_size(p) for p in _split(given)] for name, given in _KERNEL.findall(expanded)}
        missing = set(source.names) - set(params)
        assert not missing, f"{source.key}: kernels {sorted(missing)} not found in the source"
        structs = sorted({p for sizes in params.values() for p in sizes if isinstance(p, str)})
        # a struct passed by value: its size, from the compiler
        cpp.write_text(_PRELUDE + text + "".join(f'extern "C" unsigned long long trtio_sizeof_{n}() '
                                                 f"{{ return sizeof({n}); }}\n" for n in structs))
        lib = folder / f"{source.key}.so"
        subprocess.run([compiler, *flags, "-shared", "-o", str(lib), str(cpp)], check=True, capture_output=True)
        self.lib = ctypes.CDLL(str(lib))
        sizes = {}
        for n in structs:
            fn = getattr(self.lib, f"trtio_sizeof_{n}")
            fn.restype = ctypes.c_ulonglong
            sizes[n] = int(fn())
        self.params = {name: [sizes.get(p, p) if isinstance(p, str) else p for p in ps] for name, ps in params.items()}
        self.threads = {name: _by_thread(text, name) for name in source.names}


def _by_thread(text: str, name: str) -> bool:
    """Whether kernel ``name`` of source ``text`` indexes by the thread's place in the grid (its block's threads then
    run one after another: one thread a block would leave elements out); such a kernel must not wait for its block."""
    at = text.index("{", text.index(f" {name}("))
    depth, end = 0, at
    for end in range(at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            break
    body = text[at:end]
    by_thread = "blockIdx.x * blockDim.x" in body
    assert not (by_thread and "__syncthreads" in body), f"{name}: its threads cannot run one after another"
    return by_thread


def _split(params: str) -> list[str]:
    return [p.strip() for p in params.replace("\n", " ").split(",") if p.strip()]


def _size(param: str) -> int | str:
    """A parameter's size in bytes (a struct passed by value: its type's name, whose size the compiler gives)."""
    if "*" in param:
        return 8
    words = param.replace("const", " ").split()[:-1]  # the type, without the parameter's name
    if words[-1] in ("int", "unsigned") and "long" not in words:
        return 4
    if "long" in words:
        return 8
    return words[-1]


def _c_value(arg: Any) -> Any:
    if isinstance(arg, ctypes.Structure):
        return arg
    dtype = np.asarray(arg).dtype
    return {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
            np.dtype(np.uint64): ctypes.c_uint64}[dtype](arg.item())


_one_launch = threading.Lock()


def _launch_class(backend: HostBackend, built: Callable[[kernels.KernelSource], _Compiled]) -> type:
    """``kernels.Launch``'s stand-in for ``backend``: the same arguments, checked against the kernel's parameters;
    a call runs every block in stream order (recorded while the stream is captured, as any host work)."""

    class HostLaunch:
        def __init__(self, device_id: int, name: str, grid: int | tuple[int, ...], block: int, *args: Any,
                     source: kernels.KernelSource = kernels.TRTIO_KERNELS) -> None:
            compiled = built(source)
            params = compiled.params[name]
            assert len(args) == len(params), f"{name}: {len(args)} arguments for {len(params)} parameters"
            for i, (arg, want) in enumerate(zip(args, params)):
                got = ctypes.sizeof(arg) if isinstance(arg, ctypes.Structure) else np.asarray(arg).dtype.itemsize
                assert got == want, f"{name}: argument {i} has {got} bytes, the parameter {want}"
            self.name = name
            self._values = [_c_value(a) for a in args]
            self._fn = getattr(compiled.lib, name)
            self._fn.argtypes = [type(v) for v in self._values]
            self._fn.restype = None
            self._lib = compiled.lib
            self._grid = (grid, 1, 1) if isinstance(grid, int) else (tuple(grid) + (1, 1))[:3]
            self._threads = block if compiled.threads[name] else 1

        def __call__(self, stream: int) -> None:
            def run() -> None:
                with _one_launch:  # the block and thread indices are the library's globals
                    self._run()

            backend.launch_host_func(stream, run)

        def _run(self) -> None:
            lib, (gx, gy, gz), threads = self._lib, self._grid, self._threads
            lib.trtio_host_grid(gx, gy, gz)  # (no kernel of trtio reads gridDim; set for one that would)
            lib.trtio_host_threads(threads)
            for z in range(gz):
                for y in range(gy):
                    for x in range(gx):
                        lib.trtio_host_block(x, y, z)
                        for t in range(threads):
                            lib.trtio_host_thread(t)
                            self._fn(*self._values)

    return HostLaunch


class KernelsOnHost(HostBackend):
    """The host backend under the cuda backend's name: trtio's ops take their kernel path, on host memory."""

    name = "cuda"
    device_id = 0

    def __repr__(self) -> str:
        return "KernelsOnHost()"


_built: dict[tuple[str, str], _Compiled] = {}  # per source, built once a process (in a folder removed at its exit)
_folder: list[Path] = []


def _build(source: kernels.KernelSource, compiler: str) -> _Compiled:
    found = _built.get((source.key, source.source))
    if found is None:
        if not _folder:
            _folder.append(Path(tempfile.mkdtemp(prefix="trtio-host-kernels-")))
            atexit.register(shutil.rmtree, _folder[0], True)
        found = _built[(source.key, source.source)] = _Compiled(source, _folder[0], compiler)
    return found


def kernels_on_host(monkeypatch: pytest.MonkeyPatch) -> KernelsOnHost:
    """A :class:`KernelsOnHost` backend, with ``kernels.Launch`` and ``kernels.kernels`` replaced (for the test
    ``monkeypatch`` serves) by the host-compiled kernels; skips where no C++ compiler is found."""
    compiler = host_compiler()
    if compiler is None:
        pytest.skip("no C++ compiler on this machine: the kernels cannot be built for the host")

    def built(source: kernels.KernelSource) -> _Compiled:
        return _build(source, compiler)

    backend = KernelsOnHost()
    monkeypatch.setattr(ops, "_job_launches", {})  # copy launches packed for another test's backend stay there
    monkeypatch.setattr(kernels, "Launch", _launch_class(backend, built))
    monkeypatch.setattr(kernels, "kernels", lambda device_id, source=kernels.TRTIO_KERNELS: built(source).params)
    return backend


@pytest.fixture(name="backend", params=["host", "kernels", pytest.param("cuda", marks=pytest.mark.gpu)])
def host_kernels_and_cuda(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """A test module's ``backend`` where it imports this: the host backend's numpy ops, trtio's CUDA kernels built
    for the CPU (:func:`kernels_on_host`), and the cuda backend where a GPU answers."""
    if request.param == "kernels":
        return kernels_on_host(monkeypatch)
    return get_backend(request.param)
