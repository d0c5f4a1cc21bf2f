"""The GPU side of a :class:`~trtio.testing.ReferenceEngine`: CuPy on raw device memory, capturable into CUDA graphs.

Every temporary CuPy makes during an execute comes from a :class:`_BumpAllocator` over the context
memory, reset at the start of each execute (and after each layer), so an execute hands out the same
addresses each time, never calls ``cudaMalloc`` and never synchronises the host. The matrix products are
one plain CUDA kernel (:class:`_GpuMatmul`) rather than cuBLAS (CuPy refuses cuBLAS calls during a
capture), so replayed graphs and direct executes agree bit for bit; the ragged contract's page-table
writes are another small kernel (:class:`_GpuScatterRows`) that skips padding rows without a host sync.
:func:`_scratch_bound` and :func:`_ragged_scratch_bound` size the context memory an engine reports
(``device_memory_size_v2``) for that scratch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from trtio.errors import EngineError
from trtio.testing.reference_io import _Geometry

#: TensorRT's alignment for tensor addresses and for user-managed context memory.
ADDRESS_ALIGNMENT = 256


def _align(n: int, alignment: int = ADDRESS_ALIGNMENT) -> int:
    return (int(n) + alignment - 1) // alignment * alignment


def _scratch_bound(g: _Geometry, batch: int, seq: int, select: int) -> int:
    """Bytes of GPU scratch one execute needs at most for a step of ``batch`` x ``seq`` tokens.

    Counts every float32 / int64 temporary the batch step (``reference_math._forward``) makes (each
    kind of array times a generous number of copies), for the persistent part (inputs, masks,
    positions), one layer (scratch is released after each layer) and the outputs, plus alignment and a
    1 MiB margin.
    """
    t = batch * seq
    f4, i8 = 4, 8
    q = t * g.hq * g.d * f4
    kv = t * g.hkv * g.d * f4
    cache = batch * g.hkv * g.cap * g.d * f4
    scores = batch * g.hq * seq * g.cap * f4
    x = t * g.h * f4
    mask = batch * seq * g.cap * i8
    persistent = (
        16 * mask  # visibility, tree bits and their temporaries
        + 12 * t * g.r * f4  # rope rows, cos, sin
        + 16 * x + 6 * t * max(g.hb, 1) * f4  # activation loads, draft input projections, x buffers
        + 8 * t * g.hkv * i8 + 16 * t * i8 + 16 * batch * select * i8  # indices
    )
    per_layer = (
        8 * q + 24 * kv  # projections, RoPE, cache conversions of the new K/V
        + 6 * cache  # cache reads converted to float32
        + 10 * scores  # scores, mask, softmax
        + 4 * batch * g.hq * seq * g.d * f4  # attention output and its transposes
        + 10 * x + 4 * t * g.f * f4  # residuals, MLP, deepstack
    )
    final = 10 * x + 3 * batch * select * g.h * f4 + 3 * batch * select * g.vout * f4
    allocations = 512 * ADDRESS_ALIGNMENT  # alignment waste, a few hundred allocations
    return _align(persistent + per_layer + final + allocations + (1 << 20))


def _ragged_scratch_bound(g: _Geometry, tokens: int, seqs: int, select: int) -> int:
    """:func:`_scratch_bound` for a ragged step of ``tokens`` rows, ``seqs`` sequences and ``select``
    logits rows. Per sequence the step gathers every slot its page-table row addresses (``M * page``),
    so the caches read count ``seqs * M * page`` slots; scores and masks count ``tokens * M * page``
    whatever the split into sequences. FP8 pools add their bit conversions (a few uint32 temporaries
    per element), which the generous copy counts cover.
    """
    t, lk = tokens, g.seq_slots
    f4, i8 = 4, 8
    q = t * g.hq * g.d * f4
    kv = t * g.hkv * g.d * f4
    cache = seqs * lk * g.hkv * g.d * f4
    scores = t * g.hq * lk * f4
    x = t * g.h * f4
    mask = t * lk * i8
    persistent = (
        16 * mask  # visibility, tree bits and their temporaries
        + 12 * t * g.r * f4  # RoPE rows, cos, sin
        + 16 * x + 6 * t * max(g.hb, 1) * f4  # activation loads, draft input projections, x buffers
        + 16 * seqs * lk * i8  # page-table gathers: pool rows of every addressable slot, slots in use
        + 24 * t * i8 + 16 * seqs * (g.seq_pages + 2) * i8 + 16 * select * i8  # row, sequence and page indices
    )
    per_layer = (
        8 * q + 32 * kv  # projections, RoPE, storage conversions of the new K/V
        + 12 * cache  # pool gathers converted to float32
        + 10 * scores  # scores, mask, softmax
        + 4 * t * g.hq * g.d * f4  # attention output and its transposes
        + 10 * x + 4 * t * g.f * f4  # residuals, MLP, deepstack, EAGLE3 hidden-state stores
    )
    final = 10 * x + 3 * select * g.h * f4 + 8 * select * g.vout * f4  # logits, draft log-softmax
    if g.types:  # a hybrid's recurrent layer: its slots' states and output kept, one token's temporaries at a time
        c, k = g.conv
        hh, d1, d2 = g.state
        per_layer += 4 * x + 4 * seqs * (c * k + hh * d1 * d2) * f4 \
            + 32 * seqs * (c * k + hh * d1 * d2 + c + g.h) * f4
    allocations = 512 * ADDRESS_ALIGNMENT
    return _align(persistent + per_layer + final + allocations + (1 << 20))


# -- CuPy -----------------------------------------------------------------------------------------


def _import_cupy() -> Any:
    import cupy  # noqa: PLC0415 - optional dependency, imported only for the gpu device

    return cupy


_MATMUL_SOURCE = r"""
extern "C" __global__ void trtio_reference_bmm(
        const float* a, const float* b, float* out, long long batch, long long m, long long n, long long k,
        long long sab, long long sam, long long sak, long long sbb, long long sbk, long long sbn) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= batch * m * n) return;
    long long col = i % n, row = (i / n) % m, mat = i / (m * n);
    const float* pa = a + mat * sab + row * sam;
    const float* pb = b + mat * sbb + col * sbn;
    float acc = 0.0f;
    for (long long j = 0; j < k; ++j) acc += pa[j * sak] * pb[j * sbk];
    out[i] = acc;
}
"""


class _GpuMatmul:
    """float32 ``a @ b`` as one plain CUDA kernel: ``[..., M, K] @ [K, N]`` or matching batch dims.

    Not cuBLAS: CuPy refuses cuBLAS calls while a stream is captured, and one fixed kernel also
    makes a replayed graph and a direct execute add in the same order. Toy sizes only.
    """

    def __init__(self, cupy: Any) -> None:
        self._cupy = cupy
        self._kernel = cupy.RawKernel(_MATMUL_SOURCE, "trtio_reference_bmm")
        self._kernel.compile()  # now, not in the first (maybe captured) execute

    def __call__(self, a: Any, b: Any) -> Any:
        cp = self._cupy
        k, n = b.shape[-2], b.shape[-1]
        if b.ndim == 2:  # [..., K] rows times one matrix
            a3, b3 = a.reshape(1, -1, k), b.reshape(1, k, n)
        else:  # the same batch dims on both sides; reshape copies only where a view cannot do
            a3, b3 = a.reshape(-1, a.shape[-2], k), b.reshape(-1, k, n)
        batch, m = a3.shape[0], a3.shape[1]
        out = cp.empty((*a.shape[:-1], n), dtype=cp.float32)
        total = batch * m * n
        if total:
            sa = [st // 4 for st in a3.strides]
            sb = [st // 4 for st in b3.strides]
            i64 = np.int64
            self._kernel(((total + 255) // 256,), (256,),
                         (a3, b3, out, i64(batch), i64(m), i64(n), i64(k),
                          i64(sa[0]), i64(sa[1]), i64(sa[2]), i64(sb[0]), i64(sb[1]), i64(sb[2])))
        return out


_SCATTER_SOURCE = r"""
extern "C" __global__ void trtio_reference_scatter_rows(
        const unsigned char* rows, unsigned char* target, const long long* index, long long n, long long row_bytes) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * row_bytes) return;
    long long dst = index[i / row_bytes];
    if (dst < 0) return;
    target[dst * row_bytes + i % row_bytes] = rows[i];
}
"""


class _GpuScatterRows:
    """``target[index[i]] = rows[i]`` for ``index[i] >= 0``, byte for byte (any storage dtype).

    CuPy's fancy assignment has no "skip this row"; boolean indexing would synchronise the host.
    ``target`` and ``rows`` are C-contiguous 2-D arrays of one dtype and row width.
    """

    def __init__(self, cupy: Any) -> None:
        self._cupy = cupy
        self._kernel = cupy.RawKernel(_SCATTER_SOURCE, "trtio_reference_scatter_rows")
        self._kernel.compile()

    def __call__(self, target: Any, index: Any, rows: Any) -> None:
        cp = self._cupy
        rows = cp.ascontiguousarray(rows)
        index = cp.ascontiguousarray(index, dtype=cp.int64)
        row_bytes = rows.shape[1] * rows.itemsize
        total = index.shape[0] * row_bytes
        if total:
            self._kernel(((total + 255) // 256,), (256,),
                         (rows, target, index, np.int64(index.shape[0]), np.int64(row_bytes)))


class _StreamRef:
    """A raw stream handle in the CUDA stream protocol, for ``cupy.cuda.Stream.from_external``."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _cupy_stream(cupy: Any, handle: int, device_id: int) -> Any:
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_StreamRef(handle))
    return cupy.cuda.ExternalStream(handle, device_id)


@contextlib.contextmanager
def gpu_scope(streams: dict[int, Any], stream_handle: int, device_id: int, scratch: Any) -> Iterator[Any]:
    """What a reference engine's GPU execute runs inside: CuPy (yielded) on the engine's device, on the caller's
    stream (CuPy's view of it kept in ``streams`` per handle), allocating from ``scratch`` reset for this run."""
    cupy = _import_cupy()
    ext = streams.get(stream_handle)
    if ext is None:
        ext = streams[stream_handle] = _cupy_stream(cupy, stream_handle, device_id)
    scratch.reset()
    with cupy.cuda.Device(device_id), ext, cupy.cuda.using_allocator(scratch):
        yield cupy


class _BumpAllocator:
    """CuPy allocator over one block of context memory: hands out 256-byte aligned slices.

    Nothing is freed one by one; :meth:`reset` (start of each execute) and :meth:`release`
    (after each layer) move the offset back. Slices are handed out in the same order every
    execute, so a CUDA graph captured from one execute replays on the same addresses.
    """

    def __init__(self, cupy: Any, what: str, base: int, size: int, device_id: int) -> None:
        self._cupy = cupy
        self.what = what
        self.base = int(base)
        self.size = int(size)
        self.device_id = device_id
        self.offset = 0
        self.peak = 0
        self.count = 0

    def __call__(self, nbytes: int) -> Any:
        need = _align(max(int(nbytes), 1))
        if self.offset + need > self.size:
            raise EngineError(
                f"{self.what}: context memory exhausted: a temporary of {int(nbytes)} bytes needs "
                f"{self.offset + need} bytes in all, but the context memory holds {self.size} "
                f"(engine.device_memory_size_v2 underestimates this step; please report it)")
        ptr = self.base + self.offset
        self.offset += need
        self.peak = max(self.peak, self.offset)
        self.count += 1
        mem = self._cupy.cuda.UnownedMemory(ptr, need, self, self.device_id)
        return self._cupy.cuda.MemoryPointer(mem, 0)

    def reset(self) -> None:
        self.offset = 0

    def mark(self) -> int:
        return self.offset

    def release(self, mark: int) -> None:
        self.offset = mark


def compute_device(device: str, null_compute: bool, who: str) -> str:
    """Where a reference engine computes: ``"host"`` or ``"gpu"`` (``"auto"``: the GPU where CUDA and CuPy are
    usable); a GPU engine that computes needs CuPy (EngineError naming ``who`` otherwise)."""
    if device == "auto":
        return "gpu" if _gpu_usable() else "host"
    if device == "gpu" and not null_compute:
        try:
            _import_cupy()
        except ImportError as exc:
            raise EngineError(f"{who}: device='gpu' needs CuPy ({exc}); use device='host'") from None
    return device


def _gpu_usable() -> bool:
    from trtio._cuda.backend import cuda_available  # noqa: PLC0415 - avoid importing the backend early

    if not cuda_available():
        return False
    try:
        _import_cupy()
    except ImportError:
        return False
    return True
