"""Staging: every upload of host values to the device goes through one kind of pinned ring.

:class:`UploadRing` is trtio's one staging ring, with its one fencing rule. It holds ``RING_SLOTS`` slots
of pinned host memory; an upload takes the next slot (:meth:`UploadRing.take`), writes its values there,
enqueues the copy from the slot to the device on the step's stream and gives the slot back
(:meth:`UploadRing.put`). The fencing rule: an event is recorded after every ``FENCE_EVERY`` uploads on a
stream (a quarter of the slots on a larger ring, at most half of them on a smaller one; and on the old stream
when the next upload comes on another), and covers their slots; a slot is written again only once its
event has completed. A step never waits for the device unless the host runs
``RING_SLOTS`` uploads ahead of it (the oldest slot's copy has not run yet): then the upload waits for
that copy's event, the ring's only flow control (``fence_waits`` counts it). A large upload (``WARM_BYTES``
or more: a verify tree's embeddings) takes the slot of the ring's last upload again where that upload's copy
has run (asked of its event, without waiting): its bytes are still in the host's caches, where the ring's
next slot, written a few megabytes of uploads ago, is not.

The same fence keeps a step's inputs alive (``DESIGN`` of input lifetimes, ``docs/architecture.md``): an
input trtio does not own (a numpy or foreign array, a Tensor view) that a step's copies read is handed to
the ring with the step's slot (``put(..., keep=x)``, or :meth:`UploadRing.hold` where the step stages no
bytes), and the ring references it until the slot's event has completed, so a caller may drop or reuse it
as soon as the step returns.

:class:`StepStaging` lays a step's small per-step inputs out twice with the same offsets: once in device
memory (the tensors the engine binds; addresses fixed for life) and once in pinned host memory (the
twins). A step writes its values into numpy views of the twins and :meth:`StepStaging.upload` moves every
value written since the last upload with **one** copy on the step's stream, through its ring.

Many step values repeat from step to step (query offsets, state indices, a repeated tree's mask). A
value made with :func:`constant` (read-only, owning its data) is remembered once uploaded: writing the
same object again costs nothing, as the device block still holds it. The block's device tensors are
written by their StepStaging only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from trtio._checks import is_int
from trtio._cuda._hostmem import host_view
from trtio._cuda.backend import Backend, Location, LocationLike
from trtio._dtypes import DType, DTypeLike
from trtio._lifetime import Closeable
from trtio._memory import Arena, TensorRequest, align_up
from trtio._stream import Event, Stream, StreamLike, as_stream
from trtio._tensor import Tensor
from trtio.errors import CapacityError, ClosedError, InvalidValueError, TrtioError

__all__ = ["FENCE_EVERY", "HOLD_SLOTS", "INPUT_RING_SLOTS", "RING_SLOTS", "StagedGroup", "StepStaging", "UploadRing",
           "constant"]

RING_SLOTS = 8  # uploads a host may run ahead of the device before an upload waits
FENCE_EVERY = 4  # uploads on one stream covered by one fence event (fewer when the next comes on another)
INPUT_RING_SLOTS = 4  # slots of a ring of large inputs (a step's embeddings): each holds a whole step's worth
# Slots of a setup's ring of inputs in flight (no memory): calls a host may run ahead of the device before the one
# after waits, where every call reads an input it does not own (a device loop fed torch tensors).
HOLD_SLOTS = 64
#: An upload of at least this many bytes takes the slot of the ring's last upload again where that upload's copy has
#: run (:meth:`UploadRing.take`): its bytes are still in the host's caches, where a slot the ring goes round to (a
#: verify tree's embeddings are megabytes: a few slots of them outgrow the caches) is not.
WARM_BYTES = 1 << 18


_FREE, _UNFENCED = -1, -2  # a ring slot nothing reads any more; one whose copy no event covers yet


class UploadRing(Closeable):
    """``slots`` pinned slots that uploads go through, fenced by trtio's one rule (see the module docstring).

    ``host`` (pinned or host memory, e.g. an arena's slice from :meth:`request`) holds the slots:
    ``host.capacity // slots`` bytes each, rounded down to the dtype's items; None makes a ring without memory,
    whose slots only keep inputs alive (:meth:`hold`). The ring owns its fence events,
    not ``host``: :meth:`close` destroys the events and drops what it kept alive. It follows trtio's close
    protocol (:mod:`trtio._lifetime`).
    """

    def __init__(self, host: Tensor | None, backend: Backend, *, slots: int = RING_SLOTS, title: str = "") -> None:
        what = title or f"upload ring {host.name if host is not None else ''!r}"
        if host is not None and host.location is Location.DEVICE:
            raise InvalidValueError(f"{what}: the ring must be pinned or host memory, not {host.location}")
        if host is not None and host.backend is not backend:
            raise InvalidValueError(f"{what}: the ring's memory lives on {host.backend!r}, not on {backend!r}")
        if not is_int(slots) or slots < 1:
            raise InvalidValueError(f"{what}: slots = {slots!r}, expected a whole number >= 1")
        self.host = host
        self.slots = int(slots)
        item = host.dtype.itemsize if host is not None and host.dtype.itemsize else 1
        #: Bytes one upload may stage (a slot; 0 for a ring without memory, which only keeps inputs alive).
        self.slot_capacity = host.capacity // self.slots // item * item if host is not None else 0
        self._base = host.data_ptr if host is not None and host.capacity else 0
        self._views = [host_view(self._base + c * self.slot_capacity, self.slot_capacity) for c in range(self.slots)]
        self._backend = backend
        self._fences: list[Event] = []
        try:
            for _ in range(self.slots):
                self._fences.append(Event.create(backend))
        except BaseException:
            for ev in self._fences:
                ev.close()
            raise
        self._init_lifetime(what)
        # Per slot: the fence event covering its last use (an index into _fences), _UNFENCED while its group is
        # open, _FREE when nothing can still read it; and what its use keeps alive until then.
        self._cover = [_FREE] * self.slots
        self._kept: list[Any] = [None] * self.slots
        self._done = [True] * self.slots  # per event: known to have completed since it was recorded
        self._group: list[int] = []  # slots put since the last fence, all on _group_stream
        self._group_stream: Stream | None = None
        self._groups = 0  # fences recorded (the next one is _fences[_groups % slots])
        self._next = 0  # the slot the next take() hands out
        self._fence_every = max(1, min(max(FENCE_EVERY, self.slots // 4), self.slots // 2))
        self.fence_waits = 0  # host waits the fence forced (telemetry)

    @staticmethod
    def request(name: str, slot_shape: Sequence[int], dtype: DTypeLike, slots: int = RING_SLOTS,
                location: LocationLike = Location.PINNED) -> TensorRequest:
        """The arena request of a ring of ``slots`` slots of ``slot_shape`` (``[slots, *slot_shape]``)."""
        return TensorRequest.of(name, (slots, *slot_shape), dtype, location)

    # -- the rule ---------------------------------------------------------------------------------
    def take(self, warm: bool = False) -> int:
        """The next slot, free to write: its last use's fence waited for where it has not completed (the host
        is ``slots`` uses ahead of the device), what that use kept alive let go. A full group left open by
        :meth:`put` (``fence=False``) is fenced first. ``warm`` (a large upload: :data:`WARM_BYTES`): the slot of
        the last use instead where that use has completed (its bytes still in the host's caches; asked with one
        event query, after one record where its group is open); the ring's order stays as it was."""
        if self._closed:
            self._check_open()
        if len(self._group) >= self._fence_every:
            self._fence_group()
        c = self._next
        if warm:
            last = c - 1 if c else self.slots - 1
            if last != c and self._has_run(last):
                c = last
        ev = self._cover[c]
        if ev != _FREE:
            if ev == _UNFENCED:
                ev = self._fence_group()
            if not self._done[ev]:
                if not self._fences[ev].query():
                    self.fence_waits += 1
                    self._fences[ev].synchronize()
                self._done[ev] = True
            self._cover[c] = _FREE
            self._kept[c] = None
        return c

    def _has_run(self, c: int) -> bool:
        """Whether slot ``c``'s last use has completed (asked of the device without waiting; its group fenced
        first where it is open)."""
        ev = self._cover[c]
        if ev == _FREE:
            return True
        if ev == _UNFENCED:
            ev = self._fence_group()
        if not self._done[ev]:
            if not self._fences[ev].query():
                return False
            self._done[ev] = True
        return True

    def put(self, c: int, stream: Stream, keep: Any = None, *, fence: bool = True) -> None:
        """Slot ``c`` (from :meth:`take`) is in use by work enqueued on ``stream``: it is fenced by the rule,
        and ``keep`` (inputs that work reads; None: none) is referenced until the fence has completed.

        ``fence=False`` makes no backend call (the end of a step, after its work: nothing may fail there): the
        slot joins the open group, which the next :meth:`take` fences once full. Only for uses whose streams are
        ordered one after the other already (a setup's calls, by its stream rule), so that one event on the
        last stream covers the whole group."""
        group = self._group
        if fence and group and stream is not self._group_stream:  # an event on that stream covers its uses
            self._fence_group()
        group.append(c)
        self._group_stream = stream
        self._cover[c] = _UNFENCED
        self._kept[c] = keep
        if fence and len(group) >= self._fence_every:
            self._fence_group()
        self._next = c + 1 if c + 1 < self.slots else 0

    def _fence_group(self) -> int:
        """Record an event after the open group's uses, on their stream; returns its index. An event is reused
        ``slots`` fences later, when every slot it covered has been taken again (each group holds a use, and a
        slot is checked before the use that would reuse it)."""
        ev = self._groups % self.slots
        stream = self._group_stream
        assert stream is not None
        # Nothing changes until the fence is made: a failed record leaves the group open, fenced by the next one.
        if stream.is_closed:  # closed since its uploads (rare): no event can follow them there, so wait for all
            self.fence_waits += 1
            self._backend.synchronize()
            self._done[ev] = True
        else:
            self._fences[ev].record(stream)
            self._done[ev] = False
        self._groups += 1
        for c in self._group:
            self._cover[c] = ev
        self._group.clear()
        return ev

    def wait(self) -> None:
        """Block the host until every use of every slot has finished (and let go of what they kept)."""
        self._check_open()
        if self._group:
            self._fence_group()
        for ev, done in enumerate(self._done):
            if not done:
                self.fence_waits += 1
                self._fences[ev].synchronize()
                self._done[ev] = True
        self._cover = [_FREE] * self.slots
        self._kept = [None] * self.slots

    # -- uses -------------------------------------------------------------------------------------
    def view(self, c: int) -> np.ndarray:
        """Slot ``c``'s bytes (uint8), for the host to write."""
        return self._views[c]

    def address(self, c: int) -> int:
        return self._base + c * self.slot_capacity

    def hold(self, keep: Any, stream: Stream) -> None:
        """Keep ``keep`` alive until the work enqueued on ``stream`` so far has completed (a slot whose bytes
        are not used: a step that copies inputs without staging them)."""
        self.put(self.take(), stream, keep)

    def upload(self, values: np.ndarray, device: Tensor, stream: StreamLike = None, *, reshape: bool = True,
               keep: Any = None) -> Tensor:
        """Stage ``values`` in the next slot and copy them to ``device`` on ``stream``; returns ``device``.

        ``device`` is reshaped to ``values.shape`` first (within its capacity), unless ``reshape`` is False (its
        view stays: whoever binds it sets it, and the values land at its start). ``keep``: inputs the step's
        other copies read, kept alive with this upload's slot."""
        if self._closed:
            self._check_open()
        if type(values) is not np.ndarray:
            values = np.asarray(values)
        n = values.nbytes
        if reshape:
            if device._shape != values.shape:
                device.reshape(values.shape)  # within its capacity, or CapacityError naming the tensor
        elif n > device.capacity:
            device.reshape(values.shape)  # refused, naming the tensor
        if n > self.slot_capacity:
            self._too_big(values, "values")
        self._check_dtype(values, device)
        s = as_stream(stream, self._backend)
        c = self._write(values)
        if n:
            self._backend.memcpy(device.data_ptr, self.address(c), n, s.handle)
        device._last_stream = s
        self.put(c, s, keep)
        return device

    def upload_rows(self, values: np.ndarray, device: Tensor, offset: int, pitch: int,
                    stream: StreamLike = None) -> None:
        """Stage ``values`` ([rows, ...], C-contiguous) and copy row ``i`` of them to byte ``offset + i * pitch``
        of ``device`` (one 2D copy on ``stream``): new rows among a block's that stay as they are."""
        if self._closed:
            self._check_open()
        rows = int(values.shape[0])
        width = values.nbytes // rows if rows else 0
        if rows and offset + (rows - 1) * pitch + width > device.capacity:
            raise CapacityError(f"{self._what}: {rows} rows of {width} bytes every {pitch} from byte {offset} pass "
                                f"tensor {device.name!r}'s {device.capacity} bytes")
        if values.nbytes > self.slot_capacity:
            self._too_big(values, "rows")
        self._check_dtype(values, device)
        s = as_stream(stream, self._backend)
        c = self._write(values)
        if values.nbytes:
            self._backend.memcpy_2d(device.data_ptr + offset, pitch, self.address(c), width, width, rows, s.handle)
        device._last_stream = s
        self.put(c, s)

    def _write(self, values: np.ndarray) -> int:
        """``values`` (checked to fit) written into the next slot; returns the slot."""
        c = self.take(values.nbytes >= WARM_BYTES)
        if values.nbytes:
            flat = values.reshape(-1) if values.flags.c_contiguous else np.ascontiguousarray(values).reshape(-1)
            self._views[c][:values.nbytes] = flat.view(np.uint8)
        return c

    def _check_dtype(self, values: np.ndarray, device: Tensor) -> None:
        dt = device.dtype
        if values.dtype != dt.storage_numpy and values.dtype != dt.numpy:
            raise TrtioError(f"{self._what}: values of numpy dtype {values.dtype} cannot be uploaded into tensor "
                             f"{device.name!r} of {dt}")

    def _too_big(self, values: np.ndarray, what: str) -> None:
        raise CapacityError(f"{self._what}: {what} of shape {values.shape} ({values.nbytes} bytes) do not fit "
                            f"tensor {self.host.name if self.host is not None else ''!r}'s {self.slot_capacity}-byte "
                            f"slots")

    def _close_owned(self) -> None:
        self._kept = [None] * self.slots
        with contextlib.ExitStack() as release:  # every fence is closed; the first failure raises
            for ev in self._fences:
                release.callback(ev.close)


def constant(values: np.ndarray) -> np.ndarray:
    """``values`` as a read-only array that owns its data: a step value :meth:`StepStaging.write` may skip
    when the device block already holds it (the caller keeps and reuses the object)."""
    out = np.array(values, copy=True)
    out.flags.writeable = False
    return out


def _ring_name(names: Sequence[str]) -> str:
    return f"host_ring_{names[0]}" if names else "host_ring"


class StagedGroup:
    """Constants a step writes together into names next to each other in a :class:`StepStaging` block, laid
    out once (:meth:`StepStaging.group`): the names, the values (kept: their ids key nothing stale), the
    byte range and its bytes, and the (name, value) pairs."""

    __slots__ = ("staging", "names", "values", "lo", "hi", "image", "pairs")

    def __init__(self, staging: StepStaging, names: tuple[str, ...], values: tuple[np.ndarray, ...], lo: int,
                 hi: int, image: np.ndarray) -> None:
        self.staging = staging
        self.names = names
        self.values = values
        self.lo, self.hi = lo, hi
        self.image = image
        self.pairs = dict(zip(names, values))


class StepStaging(Closeable):
    """Per-step device tensors with a pinned twin block (see module docstring). Follows the close protocol:
    :meth:`close` releases the fences (the arena stays its owner's)."""

    def __init__(self, arena: Arena, names: Sequence[str], *, title: str) -> None:
        """``arena`` holds each ``name`` in device memory and its pinned twin ``host_<name>``, each set
        consecutive and in the same order (so one copy of a byte range moves any set of them), and the
        ring of upload slots (:meth:`requests` asks for all of it). The arena stays its owner's;
        :meth:`close` releases only the fences."""
        self.title = title
        self._backend = arena.backend
        self.tensors: dict[str, Tensor] = {n: arena[n] for n in names}
        pinned = {n: arena[f"host_{n}"] for n in names}
        used = [n for n in names if self.tensors[n].capacity]
        self._dev_base = self.tensors[used[0]].data_ptr if used else 0
        self._pin_base = pinned[used[0]].data_ptr if used else 0
        # name: (pinned view, byte offset, itemsize, values it holds, device tensor)
        self._slots: dict[str, tuple[np.ndarray, int, int, int, Tensor]] = {}
        for n in used:
            dev, pin = self.tensors[n], pinned[n]
            offset = dev.data_ptr - self._dev_base
            if dev.location is not Location.DEVICE or pin.location is not Location.PINNED or \
                    pin.data_ptr - self._pin_base != offset or pin.capacity != dev.capacity:
                raise TrtioError(f"{title}: {n!r} and its pinned twin are not laid out alike (offsets "
                                 f"{offset} and {pin.data_ptr - self._pin_base}); request the device tensors and "
                                 f"their twins consecutively, in the same order")
            view = host_view(pin.data_ptr, pin.capacity).view(dev.dtype.storage_numpy)
            self._slots[n] = (view, offset, view.itemsize, view.size, dev)
        self._end = max((off + self.tensors[n].capacity for n, (_v, off, _i, _s, _t) in self._slots.items()),
                        default=0)
        ring = arena[_ring_name(names)]
        if ring.location is not Location.PINNED or ring.capacity < RING_SLOTS * self._end:
            raise TrtioError(f"{title}: the upload ring {ring.name!r} holds {ring.capacity} pinned bytes, "
                             f"{RING_SLOTS} slots of the block need {RING_SLOTS * self._end}")
        self._twins = host_view(self._pin_base, self._end) if self._end else np.zeros(0, np.uint8)
        self.ring = UploadRing(ring, self._backend, title=f"{title} upload ring")
        self._lo, self._hi = self._end, 0  # byte range written since the last upload
        self._written: dict[str, np.ndarray] = {}  # constants written since the last upload
        # write_group's byte images, by the ids of their constants (each record keeps its constants)
        self._images: dict[tuple[int, ...], StagedGroup] = {}
        self._adjacent: set[tuple[tuple[str, ...], int]] = set()  # (names, end byte) _image found next to each other
        self._held: dict[str, np.ndarray] = {}  # constants the device block holds (uploaded, not overwritten since)
        # write_at's constants by name and first element: those written since the last upload, those held
        self._written_at: dict[str, dict[int, np.ndarray]] = {}
        self._held_at: dict[str, dict[int, np.ndarray]] = {}
        self._last_streams = list(self.tensors.values())
        self._streamed: Stream | None = None  # the stream the last upload marked on them (only uploads write them)
        self._init_lifetime(title)
        self.uploads = 0  # copies made: a step that leaves device-made values in the block compares it
        self.skipped = 0  # writes of a constant the device block already held (telemetry)

    @staticmethod
    def requests(device: Sequence[TensorRequest]) -> list[TensorRequest]:
        """The arena requests of a step block: the device tensors, then their pinned twins, in order, then
        the pinned upload ring (``RING_SLOTS`` copies of the block)."""
        block = sum(align_up(r.nbytes) for r in device)
        return [TensorRequest(r.name, r.shape, r.dtype, Location.DEVICE) for r in device] + \
            [TensorRequest(f"host_{r.name}", r.shape, r.dtype, Location.PINNED) for r in device] + \
            [TensorRequest(_ring_name([r.name for r in device]), (RING_SLOTS * block,), DType.UINT8, Location.PINNED)]

    def write(self, name: str, values: np.ndarray) -> Tensor:
        """Put ``values`` into the pinned twin of ``name``; returns the device tensor, whose bytes arrive
        with the next :meth:`upload`. The device tensor's view is left to whoever binds it (an executor
        views every binding at the step's shape), so a step pays no reshape per value.

        A constant (:func:`constant`: read-only, owning its data) the device block already holds from an
        earlier upload is not written again: steps share their offsets, ones and identity rows."""
        self.write_all((name,), (values,))
        return self.tensors[name]

    def write_all(self, names: tuple[str, ...], values: tuple[np.ndarray, ...]) -> None:
        """:meth:`write` of each of ``values`` into the name at its place in ``names``, in order, in one call (a
        step that writes several values pays one call, not one each); a value that does not fit raises as
        :meth:`write` does, the earlier ones written."""
        held, slots, held_at, written_at, written = self._held, self._slots, self._held_at, self._written_at, \
            self._written
        lo_all, hi_all = self._lo, self._hi
        try:
            for name, v in zip(names, values, strict=True):
                if held.get(name) is v:
                    self.skipped += 1
                    continue
                slot = slots.get(name)
                n = v.size
                if slot is None or n > slot[3] or self._closed:
                    self._refuse(name, v)
                view, lo, itemsize, _size, _tensor = slot  # type: ignore[misc]  # _refuse raised where slot is None
                view[:n] = v if v.ndim == 1 else v.reshape(-1)
                hi = lo + n * itemsize
                if lo < lo_all:
                    lo_all = lo
                if hi > hi_all:
                    hi_all = hi
                if name in held:
                    del held[name]
                if name in held_at or name in written_at:  # write_at's constants there are overwritten
                    held_at.pop(name, None)
                    written_at.pop(name, None)
                flags = v.flags
                if not flags.writeable and flags.owndata:
                    written[name] = v
        finally:  # what was written before a value that does not fit goes with the next upload
            self._lo, self._hi = lo_all, hi_all

    def write_at(self, name: str, at: int, values: np.ndarray) -> None:
        """:meth:`write` of ``values`` into the elements ``at .. at + values.size - 1`` of ``name``; the others
        keep what they hold. A :func:`constant` the device block already holds at ``at`` (written there and
        uploaded, and nothing written over any of its elements since) is not written again: values that
        repeat each in a place of their own (a draft round's levels) cost no copy."""
        held = self._held_at.get(name)
        if held is not None and held.get(at) is values:
            self.skipped += 1
            return
        slot = self._slots.get(name)
        n = values.size
        if slot is None or not 0 <= at <= slot[3] - n or self._closed:
            self._refuse(name, values, at)
        view, off, itemsize, _size, _tensor = slot  # type: ignore[misc]  # _refuse raised where slot is None
        view[at:at + n] = values if values.ndim == 1 else values.reshape(-1)
        lo = off + at * itemsize
        hi = lo + n * itemsize
        if lo < self._lo:
            self._lo = lo
        if hi > self._hi:
            self._hi = hi
        self._held.pop(name, None)
        self._written.pop(name, None)
        written = self._written_at.get(name)
        for placed in (held, written):  # what lay in these elements is gone (on the host, and after the upload)
            if placed:
                for start in [a for a, v in placed.items() if a < at + n and at < a + v.size]:
                    del placed[start]
        flags = values.flags
        if not flags.writeable and flags.owndata:
            if written is None:
                written = self._written_at[name] = {}
            written[at] = values

    def write_group(self, names: tuple[str, ...], values: tuple[np.ndarray, ...]) -> None:
        """:meth:`write` of several :func:`constant` s that steps write together (a tree's lengths, logits rows,
        parents, depths and mask) into ``names``, which lie next to each other in the block: one copy of their
        bytes, laid out once per set of constants (the unused end of each value's room holds zeros). A step
        that writes one set again and again prepares it once (:meth:`group`) and writes it with
        :meth:`write_prepared`."""
        key = tuple(map(id, values))
        found = self._images.get(key)
        if found is None or found.names != names or any(a is not b for a, b in zip(found.values, values)):
            found = self.group(names, values)
            if len(self._images) >= 64:
                self._images.clear()
            self._images[key] = found
        self.write_prepared(found)

    def group(self, names: tuple[str, ...], values: tuple[np.ndarray, ...]) -> StagedGroup:
        """``values`` (constants) laid out for ``names`` (next to each other in the block), for
        :meth:`write_prepared`; refuses what :meth:`write_group` would."""
        lo, hi, image = self._image(names, values)
        return StagedGroup(self, names, values, lo, hi, image)

    def write_prepared(self, group: StagedGroup) -> None:
        """:meth:`write_group` of a set :meth:`group` laid out (of this block): nothing is looked up or
        checked again but what the device block holds."""
        held = self._held
        names, values = group.names, group.values
        if held.get(names[0]) is values[0]:  # rare where device work rewrites the names: the full test then
            for n, v in group.pairs.items():
                if held.get(n) is not v:
                    break
            else:
                self.skipped += len(names)
                return
        if self._closed or group.staging is not self:
            if self._closed:
                raise ClosedError(f"{self.title} is closed")
            raise TrtioError(f"{self.title}: write_prepared takes a group this block laid out (group()), not "
                             f"{group.staging.title}'s")
        lo, hi = group.lo, group.hi
        self._twins[lo:hi] = group.image
        if lo < self._lo:
            self._lo = lo
        if hi > self._hi:
            self._hi = hi
        if held:
            for n in names:
                if n in held:
                    del held[n]
        self._written.update(group.pairs)
        if self._held_at or self._written_at:  # write_at's constants in these names are overwritten
            for n in names:
                self._held_at.pop(n, None)
                self._written_at.pop(n, None)

    def _image(self, names: tuple[str, ...], values: tuple[np.ndarray, ...]) -> tuple[int, int, np.ndarray]:
        """The bytes :meth:`write_group` copies for ``values`` into ``names``: (first byte, end, the bytes).
        Refuses names that are not next to each other, and values that are no constants or do not fit."""
        if self._closed:
            raise ClosedError(f"{self.title} is closed")
        slots = [self._slots.get(n) for n in names]
        for n, v, slot in zip(names, values, slots):
            if slot is None or v.size > slot[3]:
                self._refuse(n, v)
            if v.flags.writeable or not v.flags.owndata:
                raise TrtioError(f"{self.title}: write_group takes constants (trtio._staging.constant); {n!r} is not")
        lo = slots[0][1]  # type: ignore[index]
        end = slots[-1][1] + values[-1].size * slots[-1][2]  # type: ignore[index]
        if (names, end) not in self._adjacent:  # names found next to each other once stay so
            inside = sorted(off for _v, off, _i, _s, _t in self._slots.values() if lo <= off < end)
            if inside != [slot[1] for slot in slots]:  # type: ignore[index]
                raise TrtioError(f"{self.title}: write_group names {list(names)}, which are not next to each other "
                                 f"in the block")
            self._adjacent.add((names, end))
        image = np.zeros(end - lo, np.uint8)
        for v, slot in zip(values, slots):
            view, off, itemsize, _size, _t = slot  # type: ignore[misc]
            image[off - lo:off - lo + v.size * itemsize] = v.reshape(-1).astype(view.dtype, copy=False).view(np.uint8)
        return lo, end, image

    def _refuse(self, name: str, values: np.ndarray, at: int = 0) -> None:
        """Why :meth:`write` (:meth:`write_at` from element ``at``) cannot write ``values`` into ``name``
        (raised)."""
        if self._closed:
            raise ClosedError(f"{self.title} is closed")
        slot = self._slots.get(name)
        where = f" from element {at}" if at else ""
        raise CapacityError(f"{self.title}: {name!r} holds {0 if slot is None else slot[3]} values, "
                            f"a step asked for {values.size} ({values.shape}){where}")

    def upload(self, stream: Stream) -> None:
        """One copy of everything written since the last upload, on ``stream``, through the ring."""
        if self._closed:  # its device block may be freed already: never copy into it
            raise ClosedError(f"{self.title} is closed")
        lo, hi = self._lo, self._hi
        if hi <= lo:
            return
        ring = self.ring
        c = ring.take()
        ring.view(c)[lo:hi] = self._twins[lo:hi]
        self._backend.memcpy(self._dev_base + lo, ring.address(c) + lo, hi - lo, stream.handle)
        ring.put(c, stream)
        self.uploads += 1
        if stream is not self._streamed:  # the block's tensors were last written on another stream
            for t in self._last_streams:
                t._last_stream = stream
            self._streamed = stream
        self._lo, self._hi = self._end, 0
        if self._written:
            self._held.update(self._written)
            self._written.clear()
        if self._written_at:
            for name, placed in self._written_at.items():
                self._held_at.setdefault(name, {}).update(placed)
            self._written_at.clear()

    @property
    def fence_waits(self) -> int:
        """Host waits the ring's fence forced (telemetry)."""
        return self.ring.fence_waits

    @property
    def pending(self) -> bool:
        """Whether values were written since the last upload (the next upload has something to copy)."""
        return self._hi > self._lo

    def forget(self) -> None:
        """Trust nothing the device block held: every constant is uploaded again when next written (after
        device work that failed half way may have left anything there)."""
        self._held.clear()
        self._written.clear()
        self._held_at.clear()
        self._written_at.clear()

    def overwritten(self, names: Sequence[str]) -> None:
        """``names`` are written on the device by work a step enqueues (not by an upload): the block no
        longer holds the constants last uploaded to them, so writing one again uploads it."""
        held, held_at = self._held, self._held_at
        if held:
            for n in held.keys() & names:  # the names held, found in one pass in C (usually none)
                del held[n]
        if held_at:
            for n in held_at.keys() & names:
                del held_at[n]

    def device_wrote(self, name: str, values: np.ndarray) -> None:
        """Device work already enqueued writes ``values`` (a :func:`constant`) into ``name``, not an upload: the
        block holds them once it has run, so writing the same constant again copies nothing. Their twin is set to
        them too, so an upload of a byte range over ``name`` copies them again rather than older bytes."""
        slot = self._slots.get(name)
        n = values.size
        if slot is None or n > slot[3] or self._closed:
            self._refuse(name, values)
        flags = values.flags
        if flags.writeable or not flags.owndata:
            raise TrtioError(f"{self.title}: device_wrote takes a constant (trtio._staging.constant); {name!r}'s "
                             "is not")
        slot[0][:n] = values if values.ndim == 1 else values.reshape(-1)  # type: ignore[index]  # (slot: see above)
        if self._written or self._held_at or self._written_at:
            self._written.pop(name, None)
            self._held_at.pop(name, None)
            self._written_at.pop(name, None)
        self._held[name] = values

    def _close_owned(self) -> None:
        self._held.clear()
        self._written.clear()
        self._held_at.clear()
        self._written_at.clear()
        self.ring.close()
