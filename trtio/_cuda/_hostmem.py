"""Aligned pageable host memory, owned by numpy arrays and addressed by int pointers."""

from __future__ import annotations

import ctypes
import threading

import numpy as np

ALIGNMENT = 256


class HostHeap:
    """Hands out 256-byte aligned host buffers; each stays alive until :meth:`free`. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, tuple[np.ndarray, int]] = {}  # pointer -> (owning array, bytes asked)

    def alloc(self, nbytes: int) -> int:
        """A new buffer of ``nbytes``; raises MemoryError (or ValueError for sizes numpy refuses)."""
        raw = np.empty(int(nbytes) + ALIGNMENT, dtype=np.uint8)
        base = raw.ctypes.data
        ptr = (base + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        with self._lock:
            self._live[ptr] = (raw, int(nbytes))
        return ptr

    def free(self, ptr: int) -> bool:
        """Release the buffer at ``ptr``; False when ``ptr`` is not the start of a live buffer."""
        return self.release(ptr) is not None

    def release(self, ptr: int) -> np.ndarray | None:
        """Forget the buffer at ``ptr`` and hand over the array that owns its bytes (the caller decides when
        they go); None when ``ptr`` is not the start of a live buffer."""
        with self._lock:
            found = self._live.pop(ptr, None)
        return None if found is None else found[0]

    def size(self, ptr: int) -> int:
        """The bytes asked for the live buffer at ``ptr`` (0 when there is none)."""
        found = self._live.get(ptr)
        return 0 if found is None else found[1]

    def owns(self, ptr: int) -> bool:
        """True when ``ptr`` is the start of a live buffer."""
        return ptr in self._live

    def contains(self, ptr: int, nbytes: int) -> bool:
        """True when ``[ptr, ptr + nbytes)`` lies inside one live buffer (not a hot path: a scan)."""
        with self._lock:
            return any(start <= ptr and ptr + nbytes <= start + size for start, (_, size) in self._live.items())

    @property
    def live_count(self) -> int:
        return len(self._live)


def host_view(ptr: int, nbytes: int) -> np.ndarray:
    """A uint8 numpy view of ``nbytes`` at host address ``ptr`` (no copy, no ownership)."""
    if nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
    return np.frombuffer(memoryview(buf), dtype=np.uint8)


def host_fill(ptr: int, pattern: bytes, count: int) -> None:
    """Write ``pattern`` (1, 2, 4 or 8 bytes) ``count`` times from ``ptr``."""
    width = len(pattern)
    view = host_view(ptr, width * count).view(f"u{width}")
    view[:] = np.frombuffer(pattern, dtype=f"u{width}")[0]
