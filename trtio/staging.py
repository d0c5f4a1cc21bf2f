"""StepStaging: a step's small per-step inputs, staged to the device with one host write and one copy.

The ragged contract feeds an engine a dozen small per-step tensors (offsets, lengths, positions,
logits rows, tree masks). Uploading each through its own pinned buffer costs a copy (and an API call)
per tensor per step. A StepStaging lays them out twice with the same offsets: once in device memory
(the tensors the engine binds; addresses fixed for life) and once in pinned host memory. A step writes
its values into numpy views of the pinned block and :meth:`StepStaging.upload` moves every value written
since the last upload with **one** copy on the step's stream.

Single-buffered and fenced like :class:`~trtio.memory.HostStaging`: the first write after an upload
waits (on the host) until that upload has finished, which in steady state it already has.

Many step values repeat from step to step (query offsets, state indices, a repeated tree's mask). A
value made with :func:`constant` (read-only, owning its data) is remembered once uploaded: writing the
same object again costs nothing, as the device block still holds it. The block's device tensors are
written by their StepStaging only.
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

__all__ = ["StepStaging", "constant"]


def constant(values: np.ndarray) -> np.ndarray:
    """``values`` as a read-only array that owns its data: a step value :meth:`StepStaging.write` may skip
    when the device block already holds it (the caller keeps and reuses the object)."""
    out = np.array(values, copy=True)
    out.flags.writeable = False
    return out


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
        self._slots: dict[str, tuple[np.ndarray, int, int]] = {}  # name: (pinned view, byte offset, itemsize)
        for n in used:
            dev, pin = self.tensors[n], pinned[n]
            offset = dev.data_ptr - self._dev_base
            if dev.location is not Location.DEVICE or pin.location is not Location.PINNED or \
                    pin.data_ptr - self._pin_base != offset or pin.capacity != dev.capacity:
                raise TrtioError(f"{title}: {n!r} and its pinned twin are not laid out alike (offsets "
                                 f"{offset} and {pin.data_ptr - self._pin_base}); request the device tensors and "
                                 f"their twins consecutively, in the same order")
            view = host_view(pin.data_ptr, pin.capacity).view(dev.dtype.storage_numpy)
            self._slots[n] = (view, offset, view.itemsize)
        self._end = max((off + self.tensors[n].capacity for n, (_v, off, _i) in self._slots.items()), default=0)
        self._lo, self._hi = self._end, 0  # byte range written since the last upload
        self._written: dict[str, np.ndarray] = {}  # constants written since the last upload
        self._held: dict[str, np.ndarray] = {}  # constants the device block holds (uploaded, not overwritten since)
        self._last_streams = list(self.tensors.values())
        self._fence = Event.create(self._backend)
        self._pending = False
        self._closed = False
        self.fence_waits = 0  # host waits the fence forced (telemetry)
        self.skipped = 0  # writes of a constant the device block already held (telemetry)

    @staticmethod
    def requests(device: Sequence[TensorRequest]) -> list[TensorRequest]:
        """The arena requests of a step block: the device tensors, then their pinned twins, in order."""
        return [TensorRequest(r.name, r.shape, r.dtype, Location.DEVICE) for r in device] + \
            [TensorRequest(f"host_{r.name}", r.shape, r.dtype, Location.PINNED) for r in device]

    def write(self, name: str, values: np.ndarray) -> Tensor:
        """Put ``values`` into the pinned twin of ``name``; returns the device tensor, whose bytes arrive
        with the next :meth:`upload`. The device tensor's view is left to whoever binds it (an executor
        views every binding at the step's shape), so a step pays no reshape per value.

        A constant (:func:`constant`: read-only, owning its data) the device block already holds from an
        earlier upload is not written again: steps share their offsets, ones and identity rows."""
        if self._held.get(name) is values:
            self.skipped += 1
            return self.tensors[name]
        if self._closed:
            raise ClosedError(f"{self.title} is closed")
        if self._pending:
            if not self._fence.query():
                self.fence_waits += 1
                self._fence.synchronize()
            self._pending = False
        slot = self._slots.get(name)
        n = values.size
        if slot is None or n > slot[0].size:
            raise CapacityError(f"{self.title}: {name!r} holds {0 if slot is None else slot[0].size} values, "
                                f"a step asked for {n} ({values.shape})")
        view, lo, itemsize = slot
        view[:n] = values.reshape(-1)
        hi = lo + n * itemsize
        if lo < self._lo:
            self._lo = lo
        if hi > self._hi:
            self._hi = hi
        self._held.pop(name, None)
        if not values.flags.writeable and values.flags.owndata:
            self._written[name] = values
        return self.tensors[name]

    def upload(self, stream: Stream) -> None:
        """One copy of everything written since the last upload, on ``stream``; records the fence."""
        if self._closed:  # its device block may be freed already: never copy into it
            raise ClosedError(f"{self.title} is closed")
        lo, hi = self._lo, self._hi
        if hi <= lo:
            return
        self._backend.memcpy(self._dev_base + lo, self._pin_base + lo, hi - lo, stream.handle)
        for t in self._last_streams:
            t._last_stream = stream
        self._fence.record(stream)
        self._pending = True
        self._lo, self._hi = self._end, 0
        if self._written:
            self._held.update(self._written)
            self._written.clear()

    @property
    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._held.clear()
        self._written.clear()
        self._fence.close()

    def __enter__(self) -> StepStaging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

