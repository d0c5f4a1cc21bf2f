"""Stream-ordered device operations on tensor rows, for both backends.

The step helpers move rows between buffers whose indices change every step (RoPE rows gathered at each
token's position, hidden-state rows of accepted tree nodes). Each operation here is one device
operation: a kernel on the cuda backend (:mod:`trtio.cuda.kernels`), one numpy pass on the host
backend (run in stream order, recorded while the stream is captured). Indices are read when the work
runs, from device tensors the caller staged, so a captured graph replays with fresh indices.
"""

from __future__ import annotations

import numpy as np

from trtio.cuda._hostmem import host_view
from trtio.cuda.backend import Backend
from trtio.stream import Stream
from trtio.tensor import Tensor

__all__ = ["copy_rows", "warm_up"]

_BLOCK = 128


def warm_up(backend: Backend) -> None:
    """Compile the device kernels now (a setup calls this so that no step compiles)."""
    if backend.name == "cuda":
        from trtio.cuda import kernels

        kernels.kernels(backend.device_id)


def copy_rows(dst: Tensor, src: Tensor, src_rows: Tensor, count: int, *, row_bytes: int, stream: Stream,
              dst_rows: Tensor | None = None) -> None:
    """For ``i < count``: row ``dst_rows[i]`` (``i`` without ``dst_rows``) of ``dst`` becomes row
    ``src_rows[i]`` of ``src``, or zeros where that index is negative. Rows are ``row_bytes`` wide from
    each tensor's address; ``dst`` and ``src`` must not overlap. Index tensors are int32 on the device.

    An index outside a tensor's capacity raises on the host backend (from the enqueued work) and is
    skipped on the cuda backend (checking would synchronise the host).
    """
    if count <= 0:
        return
    be = dst.backend
    dst_cap, src_cap = dst.capacity // row_bytes, src.capacity // row_bytes
    if be.name == "cuda":
        from trtio.cuda import kernels

        kernels.launch(be.device_id, "trtio_copy_rows", stream.handle, count, _BLOCK,
                       kernels.ptr(dst.data_ptr), kernels.ptr(dst_rows.data_ptr if dst_rows is not None else 0),
                       kernels.ptr(src.data_ptr), kernels.ptr(src_rows.data_ptr), np.int32(count),
                       np.int64(row_bytes), np.int64(dst_cap), np.int64(src_cap))
        return
    d_ptr, s_ptr, si_ptr = dst.data_ptr, src.data_ptr, src_rows.data_ptr
    di_ptr = dst_rows.data_ptr if dst_rows is not None else 0
    what = f"copy_rows {src.name!r} -> {dst.name!r}"

    def run() -> None:
        s_idx = host_view(si_ptr, 4 * count).view(np.int32).astype(np.int64)
        d_idx = host_view(di_ptr, 4 * count).view(np.int32).astype(np.int64) if di_ptr else np.arange(count)
        for label, idx, cap in (("source", s_idx, src_cap), ("destination", d_idx, dst_cap)):
            bad = np.flatnonzero(idx >= cap) if label == "source" else np.flatnonzero((idx < 0) | (idx >= cap))
            if bad.size:
                raise ValueError(f"{what}: {label} row {int(idx[bad[0]])} at index {int(bad[0])} is outside the "
                                 f"{cap} rows of the tensor")
        out = host_view(d_ptr, dst_cap * row_bytes).reshape(dst_cap, row_bytes)
        rows = host_view(s_ptr, src_cap * row_bytes).reshape(src_cap, row_bytes)[np.maximum(s_idx, 0)]
        rows[s_idx < 0] = 0
        out[d_idx] = rows

    launch = getattr(be, "launch_host_func", None)
    if launch is None:
        raise TypeError(f"backend {be.name!r} cannot run host work in stream order")
    launch(stream.handle, run)
