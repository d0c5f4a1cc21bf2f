"""StepStaging: a step's small per-step inputs, staged to the device with one host write and one copy.

The ragged contract feeds an engine a dozen small per-step tensors (offsets, lengths, positions,
logits rows, tree masks). Uploading each through its own pinned buffer costs a copy (and an API call)
per tensor per step. A StepStaging lays them out twice with the same offsets: once in device memory
(the tensors the engine binds; addresses fixed for life) and once in pinned host memory. A step writes
its values into numpy views of the pinned block and :meth:`StepStaging.upload` moves every value written
since the last upload with **one** copy on the step's stream.

Single-buffered and fenced like :class:`~trtio.memory.HostStaging`: the first write after an upload
waits (on the host) until that upload has finished, which in steady state it already has.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trtio.cuda._hostmem import host_view
from trtio.cuda.backend import Location
from trtio.errors import CapacityError, ClosedError, TrtioError
from trtio.memory import Arena, TensorRequest
from trtio.stream import Event, Stream
from trtio.tensor import Tensor

__all__ = ["StepStaging"]


class StepStaging:
    """Per-step device tensors with a pinned twin block (see module docstring)."""

    def __init__(self, arena: Arena, names: Sequence[str], *, title: str) -> None:
        """``arena`` holds each ``name`` in device memory and its pinned twin ``host_<name>``, each set
        consecutive and in the same order (so one copy of a byte range moves any set of them). The arena
        stays its owner's; :meth:`close` releases only the fence."""
        self.title = title
        self._backend = arena.backend
        self.tensors: dict[str, Tensor] = {n: arena[n] for n in names}
        pinned = {n: arena[f"host_{n}"] for n in names}
        used = [n for n in names if self.tensors[n].capacity]
        self._dev_base = self.tensors[used[0]].data_ptr if used else 0
        self._pin_base = pinned[used[0]].data_ptr if used else 0
        self._offsets: dict[str, int] = {}
        self._views: dict[str, np.ndarray] = {}
        for n in used:
            dev, pin = self.tensors[n], pinned[n]
            offset = dev.data_ptr - self._dev_base
            if dev.location is not Location.DEVICE or pin.location is not Location.PINNED or \
                    pin.data_ptr - self._pin_base != offset or pin.capacity != dev.capacity:
                raise TrtioError(f"{title}: {n!r} and its pinned twin are not laid out alike (offsets "
                                 f"{offset} and {pin.data_ptr - self._pin_base}); request the device tensors and "
                                 f"their twins consecutively, in the same order")
            self._offsets[n] = offset
            self._views[n] = host_view(pin.data_ptr, pin.capacity).view(dev.dtype.storage_numpy)
        self._end = max((self._offsets[n] + self.tensors[n].capacity for n in used), default=0)
        self._span = (self._end, 0)  # byte range written since the last upload: (lo, hi)
        self._fence = Event.create(self._backend)
        self._pending = False
        self._closed = False
        self.fence_waits = 0  # host waits the fence forced (telemetry)

    @staticmethod
    def requests(device: Sequence[TensorRequest]) -> list[TensorRequest]:
        """The arena requests of a step block: the device tensors, then their pinned twins, in order."""
        return [TensorRequest(r.name, r.shape, r.dtype, Location.DEVICE) for r in device] + \
            [TensorRequest(f"host_{r.name}", r.shape, r.dtype, Location.PINNED) for r in device]

    def write(self, name: str, values: np.ndarray) -> Tensor:
        """Put ``values`` into the pinned twin of ``name``; returns the device tensor, whose bytes arrive
        with the next :meth:`upload`. The device tensor's view is left to whoever binds it (an executor
        views every binding at the step's shape), so a step pays no reshape per value."""
        if self._closed:
            raise ClosedError(f"{self.title} is closed")
        if self._pending:
            if not self._fence.query():
                self.fence_waits += 1
                self._fence.synchronize()
            self._pending = False
        view = self._views.get(name)
        n = values.size
        if view is None or n > view.size:
            raise CapacityError(f"{self.title}: {name!r} holds {0 if view is None else view.size} values, "
                                f"a step asked for {n} ({values.shape})")
        view[:n] = values.reshape(-1)
        lo = self._offsets[name]
        hi = lo + n * view.itemsize
        span = self._span
        if lo < span[0] or hi > span[1]:
            self._span = (min(span[0], lo), max(span[1], hi))
        return self.tensors[name]

    def upload(self, stream: Stream) -> None:
        """One copy of everything written since the last upload, on ``stream``; records the fence."""
        if self._closed:  # its device block may be freed already: never copy into it
            raise ClosedError(f"{self.title} is closed")
        lo, hi = self._span
        if hi <= lo:
            return
        self._backend.memcpy(self._dev_base + lo, self._pin_base + lo, hi - lo, stream.handle)
        for t in self.tensors.values():
            t._last_stream = stream
        self._fence.record(stream)
        self._pending = True
        self._span = (self._end, 0)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fence.close()

    def __enter__(self) -> StepStaging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

