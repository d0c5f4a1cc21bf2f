"""Arena: every tensor of a plan carved from one allocation per location; and MemoryReport.

An arena is planned in full before it allocates: a list of :class:`TensorRequest` becomes one
backend allocation per location (device, pinned, host), sliced at 256-byte aligned offsets
(TensorRT's address alignment). The slices are non-owning :class:`Tensor` objects whose owner
is the arena, so their pointers are stable for the arena's life.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trtio._checks import is_int
from trtio._cuda._hostmem import ALIGNMENT
from trtio._cuda.backend import Backend, Location, LocationLike, get_backend
from trtio._dtypes import DType, DTypeLike
from trtio._lifetime import Closeable
from trtio._tensor import ShapeLike, Tensor, normalize_shape, volume
from trtio.errors import CudaError, InvalidTypeError, InvalidValueError, TrtioError, UnknownNameError

__all__ = ["Arena", "TensorRequest", "MemoryReport", "MemoryEntry", "align_up", "planned_report"]


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
        offsets, sizes = _layout(self._requests, alignment)
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
        return _report(self._title, self._requests, self._offsets, self._sizes)

    def _close_owned(self) -> None:
        for t in self._tensors.values():
            t._unfreeze()
            t.close()

    def __repr__(self) -> str:
        sizes = ", ".join(f"{loc}={n}" for loc, n in self._sizes.items())
        return f"Arena({self._title!r}, {len(self._tensors)} tensors, {sizes}{', closed' if self._closed else ''})"


def _layout(requests: Sequence[TensorRequest], alignment: int) -> tuple[dict[str, int], dict[Location, int]]:
    """Where an arena puts each request of bytes (its offset in its location's block) and each block's size."""
    offsets: dict[str, int] = {}
    sizes: dict[Location, int] = {}
    for r in requests:
        if r.nbytes == 0:
            continue
        at = sizes.get(r.location, 0)
        offsets[r.name] = at
        sizes[r.location] = at + align_up(r.nbytes, alignment)
    return offsets, sizes


def _report(title: str, requests: Sequence[TensorRequest], offsets: dict[str, int],
            sizes: dict[Location, int]) -> MemoryReport:
    rep = MemoryReport(title)
    for r in requests:
        rep.entries.append(MemoryEntry(r.name, r.shape, str(r.dtype), str(r.location), r.nbytes, offsets.get(r.name)))
    for loc, size in sizes.items():
        rep.allocated[str(loc)] = size
        rep.allocations[str(loc)] = 1
    return rep


def planned_report(requests: Sequence[TensorRequest], title: str, alignment: int = ALIGNMENT) -> MemoryReport:
    """The report an :class:`Arena` of ``requests`` would give, without allocating (memory made later, e.g. a
    LoRA adapter's device copy at its worst case, in ``trtio plan``)."""
    return _report(title, requests, *_layout(requests, alignment))
