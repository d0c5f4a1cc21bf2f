"""Aligned pageable host memory, owned by numpy arrays and addressed by int pointers."""

from __future__ import annotations

import ctypes

import numpy as np

ALIGNMENT = 256


class HostHeap:
    """Hands out 256-byte aligned host buffers; each stays alive until :meth:`free`."""

    def __init__(self) -> None:
        self._live: dict[int, np.ndarray] = {}

    def alloc(self, nbytes: int) -> int:
        raw = np.empty(int(nbytes) + ALIGNMENT, dtype=np.uint8)
        base = raw.ctypes.data
        ptr = (base + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        self._live[ptr] = raw
        return ptr

    def free(self, ptr: int) -> bool:
        return self._live.pop(ptr, None) is not None

    def owns(self, ptr: int) -> bool:
        return ptr in self._live

    @property
    def live_count(self) -> int:
        return len(self._live)


def host_view(ptr: int, nbytes: int) -> np.ndarray:
    """A uint8 numpy view of ``nbytes`` at host address ``ptr`` (no copy, no ownership)."""
    if nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
    return np.frombuffer(buf, dtype=np.uint8)


def host_fill(ptr: int, pattern: bytes, count: int) -> None:
    """Write ``pattern`` (1, 2, 4 or 8 bytes) ``count`` times from ``ptr``."""
    width = len(pattern)
    view = host_view(ptr, width * count).view(f"u{width}")
    view[:] = np.frombuffer(pattern, dtype=f"u{width}")[0]
