"""Arena: every tensor of a plan carved from one allocation per location; and MemoryReport.

An arena is planned in full before it allocates: a list of :class:`TensorRequest` becomes one
backend allocation per location (device, pinned, host), sliced at 256-byte aligned offsets
(TensorRT's address alignment). The slices are non-owning :class:`Tensor` objects whose owner
is the arena, so their pointers are stable for the arena's life.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from trtio._checks import is_int
from trtio._lifetime import Closeable
from trtio.cuda._hostmem import ALIGNMENT, host_view
from trtio.cuda.backend import Backend, Location, LocationLike, get_backend
from trtio.dtypes import DType, DTypeLike
from trtio.errors import CapacityError, CudaError, InvalidTypeError, InvalidValueError, TrtioError, UnknownNameError
from trtio.stream import Event, Stream, StreamLike, as_stream
from trtio.tensor import ShapeLike, Tensor, normalize_shape, volume

__all__ = ["Arena", "TensorRequest", "MemoryReport", "MemoryEntry", "HostStaging", "HOST_RING_SLOTS", "align_up"]


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class TensorRequest:
    """One tensor an arena must hold: its name, worst-case shape, dtype and location.

    Validated when made: the shape is a sequence of non-negative ints, the dtype one trtio knows,
    the location one that exists; errors name the tensor. Values are normalised (a tuple of int,
    a :class:`DType`, a :class:`Location`).
    """

    name: str
    shape: tuple[int, ...]
    dtype: DType
    location: Location = Location.DEVICE

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise InvalidTypeError(f"TensorRequest: name must be a str, got {self.name!r}")
        # Normalised in place: the one place a frozen dataclass may set its own fields.
        object.__setattr__(self, "shape", normalize_shape(self.shape, f"shape of tensor {self.name!r}"))
        try:
            object.__setattr__(self, "dtype", DType.coerce(self.dtype))
        except ValueError as exc:
            raise InvalidValueError(f"dtype of tensor {self.name!r}: {exc}") from None
        object.__setattr__(self, "location", Location.coerce(self.location, f"location of tensor {self.name!r}"))

    @classmethod
    def of(cls, name: str, shape: ShapeLike, dtype: DTypeLike,
           location: LocationLike = Location.DEVICE) -> TensorRequest:
        """A request from loose values (any int sequence, a dtype name, a location name)."""
        return cls(name, shape, dtype, location)  # type: ignore[arg-type]  # normalised by __post_init__

    @property
    def nbytes(self) -> int:
        return self.dtype.nbytes(volume(self.shape))


@dataclass(frozen=True)
class MemoryEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str
    location: str
    nbytes: int
    offset: int | None = None  # within its arena block; None for standalone allocations
    group: str = ""


@dataclass
class MemoryReport:
    """Per-tensor bytes, totals per location, and alignment waste; printable and JSON-able."""

    title: str
    entries: list[MemoryEntry] = field(default_factory=list)
    allocated: dict[str, int] = field(default_factory=dict)  # bytes the backend handed out, per location
    allocations: dict[str, int] = field(default_factory=dict)  # backend allocations, per location
    notes: list[str] = field(default_factory=list)

    @property
    def required(self) -> dict[str, int]:
        """Bytes the tensors need, per location (no alignment)."""
        out: dict[str, int] = {}
        for e in self.entries:
            out[e.location] = out.get(e.location, 0) + e.nbytes
        return out

    @property
    def total_allocated(self) -> int:
        return sum(self.allocated.values())

    @property
    def total_required(self) -> int:
        return sum(e.nbytes for e in self.entries)

    @property
    def alignment_waste(self) -> int:
        return self.total_allocated - self.total_required

    @property
    def ratio(self) -> float:
        """Bytes allocated / bytes required (1.0 = no waste)."""
        req = self.total_required
        return self.total_allocated / req if req else 1.0

    def entry(self, name: str) -> MemoryEntry:
        for e in self.entries:
            if e.name == name:
                return e
        raise UnknownNameError(f"memory report {self.title!r} has no entry {name!r}; it holds "
                               f"{[e.name for e in self.entries]}")

    @classmethod
    def combine(cls, title: str, reports: Iterable[MemoryReport]) -> MemoryReport:
        out = cls(title)
        reports = list(reports)
        label = sum(1 for r in reports if r.entries) > 1  # name each entry's part only when there are several
        for r in reports:
            for e in r.entries:
                keep = e.group or not label
                out.entries.append(e if keep else MemoryEntry(**{**asdict(e), "group": r.title}))
            for loc, n in r.allocated.items():
                out.allocated[loc] = out.allocated.get(loc, 0) + n
            for loc, n in r.allocations.items():
                out.allocations[loc] = out.allocations.get(loc, 0) + n
            out.notes.extend(r.notes)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "entries": [asdict(e) for e in self.entries],
            "allocated": dict(self.allocated),
            "allocations": dict(self.allocations),
            "required": self.required,
            "total_allocated": self.total_allocated,
            "total_required": self.total_required,
            "alignment_waste": self.alignment_waste,
            "ratio": self.ratio,
            "notes": list(self.notes),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self) -> str:
        rows = [("tensor", "shape", "dtype", "location", "bytes")]
        for e in self.entries:
            name = f"{e.group}/{e.name}" if e.group else e.name
            rows.append((name, "x".join(map(str, e.shape)) or "scalar", e.dtype, e.location, _fmt_bytes(e.nbytes)))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = [self.title]
        for i, r in enumerate(rows):
            cells = (c.ljust(w) if j < 4 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths)))
            lines.append("  " + "  ".join(cells))
            if i == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        for loc in sorted(set(self.allocated) | set(self.required)):
            lines.append(
                f"  {loc}: required {_fmt_bytes(self.required.get(loc, 0))}, allocated "
                f"{_fmt_bytes(self.allocated.get(loc, 0))} in {self.allocations.get(loc, 0)} allocation(s)")
        lines.append(
            f"  total: required {_fmt_bytes(self.total_required)}, allocated {_fmt_bytes(self.total_allocated)}, "
            f"alignment waste {_fmt_bytes(self.alignment_waste)}, ratio {self.ratio:.4f}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _free_blocks(backend: Backend, blocks: list[tuple[int, Location, int]], what: str) -> None:
    """Free every block, even after a failure; then raise the first failure, naming the arena."""
    failures: list[tuple[BaseException, int, Location, int]] = []
    for ptr, loc, size in blocks:
        try:
            backend.free(ptr, loc)
        except Exception as exc:  # noqa: BLE001 - the other blocks are freed before it is raised
            failures.append((exc, ptr, loc, size))
    if not failures:
        return
    first, ptr, loc, size = failures[0]
    where = f"{what}: freeing its {loc} block of {size} bytes at 0x{ptr:x}"
    if len(failures) > 1:
        where += f" (and {len(failures) - 1} more block(s) that failed to free)"
    if isinstance(first, CudaError):
        raise CudaError(first.call, first.name, f"{where}: {first.detail}" if first.detail else where) from first
    first.add_note(where)
    raise first


class Arena(Closeable):
    """One backend allocation per location, carved into aligned tensor slices.

    Follows trtio's close protocol (:mod:`trtio._lifetime`): :meth:`close` closes every slice and
    frees the blocks; a failed free raises :class:`CudaError` naming the arena and the block (every
    other block is freed first), and the arena is closed anyway.
    """

    def __init__(self, requests: Sequence[TensorRequest], *, backend: Backend | str | None = None,
                 title: str = "arena", alignment: int = ALIGNMENT) -> None:
        for i, r in enumerate(requests):
            if not isinstance(r, TensorRequest):
                raise InvalidTypeError(f"arena {title!r}: request {i} is a {type(r).__name__}, not a TensorRequest")
        names = [r.name for r in requests]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise TrtioError(f"{title}: tensor names must be unique, repeated: {sorted(dup)}")
        if not is_int(alignment) or alignment <= 0 or alignment % ALIGNMENT:
            raise InvalidValueError(f"arena {title!r}: alignment {alignment!r} must be a positive multiple of "
                                    f"{ALIGNMENT} (TensorRT's address alignment)")
        self._backend = get_backend(backend)
        self._title = title
        self._requests = list(requests)
        offsets: dict[str, int] = {}
        sizes: dict[Location, int] = {}
        for r in self._requests:
            if r.nbytes == 0:
                continue
            at = sizes.get(r.location, 0)
            offsets[r.name] = at
            sizes[r.location] = at + align_up(r.nbytes, alignment)
        blocks: list[tuple[int, Location, int]] = []
        what = f"arena {title!r}"
        try:
            for loc, size in sizes.items():
                try:
                    blocks.append((self._backend.alloc(size, loc), loc, size))
                except CudaError as exc:
                    held = [r for r in self._requests if r.location is loc and r.nbytes]
                    big = max(held, key=lambda r: r.nbytes)
                    raise CudaError(exc.call, exc.name, f"{what}: a {loc} block of {size} bytes for {len(held)} "
                                                        f"tensor(s) asked (the largest: tensor {big.name!r}, shape "
                                                        f"{big.shape} of {big.dtype}, {big.nbytes} bytes): "
                                                        f"{exc.detail}") from exc
        except BaseException:
            try:
                _free_blocks(self._backend, blocks, what)  # nothing is left half-allocated
            except Exception:  # noqa: BLE001 - the allocation failure is the error to report
                pass
            raise
        self._init_lifetime(what, _free_blocks, self._backend, list(blocks), what)
        self._blocks = blocks
        self._sizes = sizes
        self._offsets = offsets
        base = {loc: ptr for ptr, loc, _ in blocks}
        self._tensors: dict[str, Tensor] = {}
        for r in self._requests:
            if r.nbytes:
                ptr = base[r.location] + offsets[r.name]
                t = Tensor(ptr, r.shape, r.dtype, r.location, r.nbytes, self._backend, name=r.name, owner=self)
            else:
                t = Tensor(0, r.shape, r.dtype, r.location, 0, self._backend, name=r.name, owner=self)
            self._tensors[r.name] = t

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def title(self) -> str:
        return self._title

    @property
    def tensors(self) -> dict[str, Tensor]:
        """The slices by name, in request order."""
        self._check_open()
        return dict(self._tensors)

    def __getitem__(self, name: str) -> Tensor:
        self._check_open()
        try:
            return self._tensors[name]
        except KeyError:
            raise UnknownNameError(f"{self._what} has no tensor {name!r}; it holds {sorted(self._tensors)}") from None

    @property
    def allocation_count(self) -> int:
        return len(self._blocks)

    def block_size(self, location: Location) -> int:
        return self._sizes.get(location, 0)

    def report(self) -> MemoryReport:
        self._check_open()
        rep = MemoryReport(self._title)
        for r in self._requests:
            rep.entries.append(MemoryEntry(r.name, r.shape, str(r.dtype), str(r.location), r.nbytes,
                                           self._offsets.get(r.name)))
        for loc, size in self._sizes.items():
            rep.allocated[str(loc)] = size
            rep.allocations[str(loc)] = 1
        return rep

    def _close_owned(self) -> None:
        for t in self._tensors.values():
            t._unfreeze()
            t.close()

    def __repr__(self) -> str:
        sizes = ", ".join(f"{loc}={n}" for loc, n in self._sizes.items())
        return f"Arena({self._title!r}, {len(self._tensors)} tensors, {sizes}{', closed' if self._closed else ''})"


#: Slots of the pinned ring a setup's staging pairs upload through: a host may run this many uploads ahead of the
#: device before an upload waits for one (the oldest) to have been copied.
HOST_RING_SLOTS = 4

_FREE, _FENCED, _UNFENCED = 0, 1, 2  # a ring slot nothing reads; one whose copy an event follows; one without


class HostStaging(Closeable):
    """Pinned host memory that feeds a device tensor, through a ring of ``slots`` fenced slots.

    ``host`` holds the ring: ``slots`` equal slots of ``host.capacity // slots`` bytes each
    (:meth:`request` asks an arena for it). Each upload writes its values into the next slot and copies them
    from there on the step's stream, then records that slot's fence event; an upload never writes a slot
    whose copy may not have run yet: the slot's event is asked first (normally complete), and only where the
    host runs ``slots`` uploads ahead of the device does the upload wait for it (``fence_waits`` counts
    those). With one slot an upload waits for the previous one whenever the device is behind. Where the last
    upload's copy has run already (a runtime that read the step's outputs since), the next upload takes that
    slot again: its bytes are still in the host's caches, where a slot the ring goes round to is not (a large
    input, such as a verify tree's embeddings, in between pushes it out).

    The pair owns its fence events, not its tensors (they belong to an arena): :meth:`close` destroys the
    events. It follows trtio's close protocol (:mod:`trtio._lifetime`).
    """

    def __init__(self, host: Tensor, device: Tensor, backend: Backend, *, slots: int = 1) -> None:
        what = f"staging pair {host.name!r} -> {device.name!r}"
        if host.location is Location.DEVICE:
            raise InvalidValueError(f"{what}: the staging tensor must be pinned or host memory, not {host.location}")
        if host.dtype is not device.dtype:
            raise InvalidValueError(f"{what}: dtypes differ ({host.dtype} and {device.dtype})")
        if host.backend is not backend or device.backend is not backend:
            raise InvalidValueError(f"{what}: both tensors must live on {backend!r} (got {host.backend!r} and "
                                    f"{device.backend!r})")
        if not is_int(slots) or slots < 1:
            raise InvalidValueError(f"{what}: slots = {slots!r}, expected a whole number >= 1")
        self.host = host
        self.device = device
        self.slots = int(slots)
        item = host.dtype.itemsize if host.dtype.itemsize else 1
        #: Bytes one upload may stage (a slot).
        self.slot_capacity = host.capacity // self.slots // item * item
        self._base = host.data_ptr if host.capacity else 0
        storage = host.dtype.storage_numpy
        # Each slot as a flat numpy array of the dtype's storage: an upload writes it in one assignment.
        self._flat = [host_view(self._base + c * self.slot_capacity, self.slot_capacity).view(storage)
                      for c in range(self.slots)] if self.slot_capacity and host.dtype.itemsize else None
        self._numpy = host.dtype.numpy  # the dtype values come in (its storage type also taken)
        self._init_lifetime(what)
        self._fences: list[Event] = []
        try:
            for _ in range(self.slots):
                self._fences.append(Event.create(backend))
        except BaseException:
            for ev in self._fences:
                ev.close()
            raise
        # The events' handles, asked and recorded on the backend directly: the pair's own, open until close().
        self._backend = backend
        self._fence_handles = [ev.handle for ev in self._fences]
        self._state = [_FREE] * self.slots  # per slot: free, fenced (its event follows its copy), or unfenced
        self._next = 0  # the slot of the next upload
        self.fence_waits = 0  # host waits the fence forced (telemetry)

    @staticmethod
    def request(name: str, shape: Sequence[int], dtype: DTypeLike, slots: int = HOST_RING_SLOTS,
                location: LocationLike = Location.PINNED) -> TensorRequest:
        """The arena request of a ring of ``slots`` slots of ``shape`` (``[slots, *shape]``)."""
        return TensorRequest.of(name, (slots, *shape), dtype, location)

    def _free_slot(self, c: int) -> None:
        """Slot ``c`` once its last copy is known to have run (waiting for it only where it has not)."""
        state = self._state[c]
        if state == _FENCED:
            if not self._fences[c].query():  # the host is `slots` uploads ahead of the device
                self.fence_waits += 1
                self._fences[c].synchronize()
        elif state == _UNFENCED:  # no event follows that copy (a fence failed to record): wait for the device
            self.fence_waits += 1
            self.device.backend.synchronize()
        self._state[c] = _FREE

    def _fenced(self, c: int, s: Stream) -> None:
        """Slot ``c``'s copy was enqueued on ``s``: record its fence and move on to the next slot."""
        self._next = (c + 1) % self.slots
        try:
            self._backend.record_event(self._fence_handles[c], s.handle)
        except BaseException:
            self._state[c] = _UNFENCED  # its next upload must not overwrite it under the copy
            raise
        self._state[c] = _FENCED

    def wait_fence(self) -> None:
        """Block the host until every upload has finished reading its slot."""
        self._check_open()
        for c in range(self.slots):
            self._free_slot(c)

    def _stage(self, values: np.ndarray, what: str) -> tuple[int, int]:
        """``values`` written into the next free slot: (slot, bytes)."""
        n = values.nbytes
        if n > self.slot_capacity:
            raise CapacityError(f"{self._what}: {what} of shape {values.shape} ({n} bytes) do not fit "
                                f"tensor {self.host.name!r}'s {self.slot_capacity}-byte slots")
        c = self._next
        last = c - 1 if c else self.slots - 1
        state = self._state
        if last != c and state[last] == _FENCED and self._backend.query_event(self._fence_handles[last]):
            c = last  # the last upload's copy has run: its slot is free, and warm in the host's caches
            state[c] = _FREE
        elif state[c]:
            self._free_slot(c)
        flat = self._flat
        if flat is not None and (values.dtype == flat[c].dtype or values.dtype == self._numpy):
            if values.size:
                flat[c][:values.size] = values.reshape(-1).view(flat[c].dtype)
        else:  # another dtype (refused, naming it) or a type numpy cannot hold
            ptr = self._base + c * self.slot_capacity
            Tensor(ptr, values.shape, self.host.dtype, self.host.location, self.slot_capacity, self.host.backend,
                   name=self.host.name, owner=self.host).copy_from(values)
        return c, n

    def upload(self, values: np.ndarray, stream: StreamLike = None, *, reshape: bool = True) -> Tensor:
        """Stage ``values`` and copy them to the device tensor on ``stream``; returns the device tensor.

        The device tensor is reshaped to ``values.shape`` first (within its capacity), unless ``reshape`` is
        False (its view stays: whoever binds it sets it, and the values land at its start)."""
        if self._closed:
            self._check_open()
        if type(values) is not np.ndarray:
            values = np.asarray(values)
        dev = self.device
        n = values.nbytes
        if n > self.slot_capacity:
            self._stage(values, "values")  # refused, naming the staging tensor
        if reshape:
            if dev._shape != values.shape:
                dev.reshape(values.shape)  # within its capacity, or CapacityError naming the tensor
        elif n > dev.capacity:
            dev.reshape(values.shape)  # refused, naming the tensor
        s = as_stream(stream, self._backend)
        c, n = self._stage(values, "values")
        if n:
            self._backend.memcpy(dev.data_ptr, self._base + c * self.slot_capacity, n, s.handle)
        dev._last_stream = s
        self._fenced(c, s)
        return dev

    def upload_rows(self, values: np.ndarray, offset: int, pitch: int, stream: StreamLike = None) -> None:
        """Stage ``values`` ([rows, ...], C-contiguous) and copy row ``i`` of them to byte ``offset + i * pitch``
        of the device tensor (one 2D copy on ``stream``): new rows among a block's that stay as they are."""
        if self._closed:
            self._check_open()
        dev = self.device
        rows = int(values.shape[0])
        width = values.nbytes // rows if rows else 0
        if rows and offset + (rows - 1) * pitch + width > dev.capacity:
            raise CapacityError(f"{self._what}: {rows} rows of {width} bytes every {pitch} from byte {offset} pass "
                                f"tensor {dev.name!r}'s {dev.capacity} bytes")
        s = as_stream(stream, dev.backend)
        c, n = self._stage(values, "rows")
        if n:
            dev.backend.memcpy_2d(dev.data_ptr + offset, pitch, self._base + c * self.slot_capacity, width, width,
                                  rows, s.handle)
        dev._last_stream = s
        self._fenced(c, s)

    def _close_owned(self) -> None:
        with contextlib.ExitStack() as release:  # every fence is closed; the first failure raises
            for ev in self._fences:
                release.callback(ev.close)
