"""Tensor: a fixed-capacity, pointer-stable buffer with a reshapeable view.

A Tensor's ``data_ptr`` and ``capacity`` never change. Its ``shape`` (the current view) can be
changed in place by :meth:`Tensor.reshape` as long as the view fits in the capacity, which is
how one worst-case allocation serves every step of an inference pipeline. Copies move only
the bytes of the current view.

Stream order: copies, ``zero_`` and ``fill_`` whose destination is device memory are issued on
``stream`` (None: the calling thread's trtio default stream) and return before the work
finishes. A tensor remembers the stream of the last trtio work that wrote it (copies, fills,
engine outputs); reading it on another stream (``to_numpy``, ``copy_to``, a copy from it, a
DLPack export) first makes that stream wait for the write.
Destinations in host-accessible memory (PINNED, HOST) are written by the host at once; whoever may
still be reading them (an earlier upload) must be fenced first (``PipelineIO``'s staging pairs do this with events).
"""

from __future__ import annotations

import ctypes
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from trtio._checks import is_int
from trtio._cuda._hostmem import ALIGNMENT, host_fill
from trtio._cuda.backend import Backend, Location, get_backend
from trtio._dtypes import DType, DTypeLike
from trtio._foreign import read_foreign
from trtio._lifetime import Closeable, mark_bound, unmark_bound
from trtio._stream import Event, Stream, StreamLike, as_stream
from trtio.errors import (
    CapacityError,
    ClosedError,
    CudaError,
    ExportError,
    FrozenError,
    InvalidTypeError,
    InvalidValueError,
    NotAvailableError,
    ShapeError,
    TrtioError,
)

__all__ = ["Tensor", "ShapeLike", "fix_view", "mark_bound_memory", "normalize_shape", "unmark_bound_memory", "volume"]

ShapeLike = Sequence[int]

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3
_ADDRESS_LIMIT = 1 << 64
_NULL_PAGE = 4096  # the first page is never mapped (Linux's mmap_min_addr is at least this): small ints are no pointers


def normalize_shape(shape: Any, what: str = "shape") -> tuple[int, ...]:
    """Validate a shape (a sequence of non-negative ints) and return it as a tuple of int."""
    if type(shape) is not tuple and is_int(shape):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShapeError(f"{what} must be a sequence of ints, got {shape!r}") from None
    out = []
    for d in dims:
        if type(d) is not int:  # the common case costs one test: steps reshape every step
            if not is_int(d):
                raise ShapeError(f"{what} {dims!r} has a non-integer dimension {d!r}")
            d = int(d)
        if d < 0:
            raise ShapeError(f"{what} {dims!r} has a negative dimension {d}")
        out.append(d)
    return tuple(out)


def volume(shape: Iterable[int]) -> int:
    return math.prod(shape)


class ViewLog:
    """Internal (executors): the view changes of one group of tensors, those of one owner. ``changes`` counts
    them: an executor whose views were all set since the last change of its group's log need not test them one
    by one (see EngineExecutor.prepare). ``last`` is the ``id`` of the tensor whose reshape made the last change
    (0: the last change was not one reshape): an executor that finds one change since its own, this one's, sets
    this view back alone (an id, not the tensor: tensors hold their log, and a log that held a tensor would keep
    it alive until the garbage collector found the cycle).

    A tensor reports to the log it holds (``Tensor._log``): :data:`VIEWS` until an executor binds it, then its
    executor's (the log of the executors that share one :class:`~trtio._engine.ContextMemory`, which run one at a
    time). A log is written by the one thread that steps its owner, so its count and ``last`` always name the
    same change; a thread that steps another setup writes another log and disturbs no executor of this one.
    An instance, not class attributes of Tensor: writing a class attribute would void the interpreter's caches
    of Tensor's attributes at every step."""

    __slots__ = ("changes", "last")

    def __init__(self) -> None:
        self.changes = 0
        self.last = 0


#: The log of tensors no executor has bound (no executor reads it: nothing watches their views).
VIEWS = ViewLog()
#: The log of tensors whose view never changes (:func:`fix_view`): nothing watches it either.
FIXED_VIEW = ViewLog()


def fix_view(tensor: Tensor) -> None:
    """Keep ``tensor``'s view as it is for good (a LoRA adapter's device copy, :mod:`trtio.families.lora.adapters`):
    a reshape to another shape is refused (:class:`~trtio.errors.FrozenError`), and executors leave it out of the views
    they set again between steps (its binding's shape is its own). Made before any executor binds it."""
    if tensor._log is not VIEWS:
        raise TrtioError(f"tensor {tensor.name!r}: fix_view after an executor bound it (its views are watched)")
    tensor._log = FIXED_VIEW

# Shapes Tensor.reshape was given as tuples, checked (normalize_shape) with their volume: a step's shapes repeat.
_SHAPES: dict[tuple[Any, ...], tuple[tuple[int, ...], int]] = {}


def _checked_view(shape: Any, dtype: DType, capacity: int, name: str) -> tuple[tuple[int, ...], int, bool]:
    """``shape`` checked as a view of ``dtype`` within ``capacity`` bytes (of tensor ``name``): its dims, its bytes,
    and whether it is a tuple of plain ints (then kept as given). Shapes steps give again are checked once."""
    found = None
    plain = False
    if type(shape) is tuple:
        try:
            found = _SHAPES.get(shape)
        except TypeError:  # unhashable: normalize_shape names what is wrong with it
            pass
        plain = True
        for d in shape:  # the very ints it was checked as (a bool, a float or a numpy int hash alike)
            if type(d) is not int:
                found = None
                plain = False
                break
    if found is None:
        dims = normalize_shape(shape, f"new shape of tensor {name!r}")
        found = (dims, volume(dims))
        if plain and dims == shape:
            if len(_SHAPES) >= 1024:
                _SHAPES.clear()
            _SHAPES[dims] = found
    need = dtype.nbytes(found[1])
    if need > capacity:
        raise CapacityError(f"tensor {name!r}: shape {found[0]} of {dtype} needs {need} bytes but the capacity is "
                            f"{capacity} bytes")
    return found[0], need, plain


def _layout(name: str, shape: ShapeLike, dtype: DTypeLike, location: Location, backend: Backend | str | None,
            capacity: int | None) -> tuple[tuple[int, ...], DType, Location, Backend, int]:
    """A new tensor's arguments checked: its shape, dtype, location, backend and capacity in bytes."""
    dims = normalize_shape(shape, f"shape of tensor {name!r}")
    dt = DType.coerce(dtype)
    return (dims, dt, Location.coerce(location, f"location of tensor {name!r}"), get_backend(backend),
            _capacity_for(name, dims, dt, capacity))


def _capacity_for(name: str, shape: tuple[int, ...], dtype: DType, capacity: int | None) -> int:
    """The byte capacity of a new tensor: ``capacity`` if given (it must hold ``shape``), else the shape's bytes."""
    need = dtype.nbytes(volume(shape))
    if capacity is None:
        return need
    if not is_int(capacity):
        raise InvalidTypeError(f"tensor {name!r}: capacity must be an int number of bytes, got {capacity!r}")
    cap = int(capacity)
    if cap < 0:
        raise InvalidValueError(f"tensor {name!r}: capacity {cap} bytes is negative")
    if cap < need:
        raise CapacityError(f"tensor {name!r}: capacity {cap} bytes is smaller than shape {shape} of {dtype} "
                            f"({need} bytes)")
    return cap


def _short(value: object, limit: int = 40) -> str:
    """``repr(value)``, cut short for errors (a 400-digit int is not a message)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _pointer(name: str, ptr: object, cap: int, location: Location, backend: Backend) -> int:
    """Check an address to wrap (see :meth:`Tensor.wrap`) and return it as an int."""
    if isinstance(ptr, (bool, np.bool_)):
        raise InvalidTypeError(f"tensor {name!r}: {ptr!r} is a bool, not a pointer")
    if not is_int(ptr):
        raise InvalidTypeError(f"tensor {name!r}: a pointer is an int address, got {type(ptr).__name__} {ptr!r}")
    address = int(ptr)
    if address < 0:
        raise InvalidValueError(f"tensor {name!r}: pointer {address} is negative; addresses are unsigned")
    if cap and not address:
        raise InvalidValueError(f"tensor {name!r}: cannot wrap a null pointer with {cap} bytes "
                                f"(only an empty tensor, capacity 0, may have address 0)")
    if cap and address < _NULL_PAGE:
        raise InvalidValueError(f"tensor {name!r}: pointer 0x{address:x} lies in the null page (below "
                                f"0x{_NULL_PAGE:x}), where no host or device memory is ever mapped; it is not an "
                                f"address of {cap} bytes")
    if address + cap > _ADDRESS_LIMIT:
        raise InvalidValueError(f"tensor {name!r}: pointer 0x{address:x} with {cap} bytes runs past the "
                                f"64-bit address space")
    if location is not Location.HOST and address % ALIGNMENT:
        raise InvalidValueError(
            f"tensor {name!r}: pointer 0x{address:x} is not {ALIGNMENT}-byte aligned "
            f"(off by {address % ALIGNMENT}); TensorRT needs {ALIGNMENT}-byte aligned {location} addresses")
    if cap and backend.knows_pointer(address, cap, location) is False:
        raise InvalidValueError(
            f"tensor {name!r}: 0x{address:x} .. 0x{address + cap:x} ({cap} bytes) is not inside {location} memory "
            f"the {backend.name} backend allocated; wrap memory from Tensor.empty, an Arena or the backend")
    return address


def partly_over(src: int, dst: int, nbytes: int) -> bool:
    """Whether ``nbytes`` at ``src`` and ``nbytes`` at ``dst`` overlap without being the same bytes: a copy
    between them is undefined (``cudaMemcpyAsync`` does not say which bytes it reads first)."""
    return src != dst and dst - nbytes < src < dst + nbytes


def overlap_error(what: str, src: int, dst: int, nbytes: int, onto: str) -> InvalidValueError:
    """The refusal of :func:`partly_over` memory, naming the input ``what`` and the tensor ``onto``."""
    return InvalidValueError(f"{what}: its {nbytes} bytes at 0x{src:x} overlap {onto} at 0x{dst:x} without starting "
                             f"there; trtio would copy them onto themselves in part, which is undefined: write them "
                             f"at the address of {onto} (read in place, no copy) or in memory of their own")


def mark_bound_memory(tensor: Tensor, user: Any) -> None:
    """Record that ``user`` (an executor) has ``tensor``'s address bound: the object whose close() would
    free that memory (the tensor, the tensor it views, the arena it is a slice of) refuses to close while
    ``user`` is open. Memory of other libraries (a wrapped pointer) is theirs to keep alive."""
    mark_bound(_memory_owner(tensor), user)


def unmark_bound_memory(tensor: Tensor, user: Any) -> None:
    """:func:`mark_bound_memory` undone: ``user`` dropped every binding and graph that held ``tensor``'s address."""
    unmark_bound(_memory_owner(tensor), user)


def _memory_owner(tensor: Tensor) -> Any:
    """The object whose close() frees ``tensor``'s memory (the tensor, the tensor it views, the arena it is a
    slice of)."""
    owner: Any = tensor
    while isinstance(owner, Tensor) and isinstance(owner._owner, Closeable):
        owner = owner._owner
    return owner


def fill_pattern(dt: DType, value: object, name: str) -> bytes:
    """The encoding of one element of ``value`` in ``dt``, refusing (naming tensor ``name``) what ``dt`` cannot
    hold: integer types take integral values in range, bool True/False (or 0/1), floating types any value that
    does not overflow to infinity. A packed type takes only 0: its pattern is empty (the caller zeroes)."""
    if dt.is_packed:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or value != 0:
            raise InvalidValueError(f"tensor {name!r}: fill_({_short(value)}): packed {dt} supports only 0")
        return b""
    npdt = dt.numpy
    if npdt is None:
        raise TrtioError(f"tensor {name!r}: fill_ of {dt} needs ml_dtypes for the value's encoding")

    def refuse(why: str) -> InvalidValueError:
        return InvalidValueError(f"tensor {name!r}: fill_({_short(value)}): {why}")

    if isinstance(value, (bool, np.bool_)):
        return np.asarray(value, dtype=npdt).tobytes()
    if not isinstance(value, numbers.Real):
        raise InvalidTypeError(f"tensor {name!r}: fill_ takes a real number, got {type(value).__name__} "
                               f"{_short(value)}")
    if dt is DType.BOOL:
        if value not in (0, 1):
            raise refuse("a bool tensor takes True, False, 0 or 1")
        return np.asarray(bool(value), dtype=npdt).tobytes()
    if npdt.kind in "iu":
        info = np.iinfo(npdt)
        if is_int(value):
            whole = int(value)
        else:
            real = float(value)
            if not math.isfinite(real):
                raise refuse(f"{dt} holds integers in [{info.min}, {info.max}], not {real}")
            if not real.is_integer():
                raise refuse(f"{dt} holds integers; {real} is not one (it would be stored as {int(real)})")
            whole = int(real)
        if not info.min <= whole <= info.max:
            raise refuse(f"{_short(whole)} is outside {dt}'s range [{info.min}, {info.max}]")
        return np.asarray(whole, dtype=npdt).tobytes()
    try:
        real = float(value)
    except OverflowError:  # an int beyond any float
        real = -math.inf if value < 0 else math.inf
        finite_in = True
    else:
        finite_in = math.isfinite(real)
    with np.errstate(over="ignore", invalid="ignore"):
        encoded = np.asarray(real, dtype=npdt)
    out = float(encoded)
    if finite_in and not math.isfinite(out):
        raise refuse(f"{_short(value)} cannot be represented in {dt} (it would be stored as {out})")
    if math.isinf(real) and out != real:
        raise refuse(f"{dt} has no infinity (it would be stored as {out})")
    return encoded.tobytes()


def _closed_owner(name: str, owner: Any) -> ClosedError:
    """The refusal of tensor ``name`` whose ``owner`` (a tensor it views, an arena, a foreign array) is closed."""
    if isinstance(owner, Tensor):
        return ClosedError(f"tensor {name!r} is a view of closed tensor {owner._name!r}")
    if isinstance(owner, Closeable):
        return ClosedError(f"tensor {name!r} belongs to {owner._what}, which is closed")
    return ClosedError(f"tensor {name!r} belongs to a closed {type(owner).__name__}")


def _free_memory(backend: Backend, ptr: int, location: Location, what: str, nbytes: int) -> None:
    try:
        backend.free(ptr, location)
    except CudaError as exc:
        raise CudaError(exc.call, exc.name, f"{what}: freeing {nbytes} bytes of {location} memory at 0x{ptr:x}: "
                                            f"{exc.detail}") from exc


class Tensor(Closeable):
    """A buffer with a fixed capacity and a reshapeable view (see module docstring).

    Owning tensors (:meth:`empty`) free their memory on :meth:`close`; non-owning ones
    (:meth:`wrap`, arena slices, :meth:`view`) keep their ``owner`` alive instead. Tensors follow
    trtio's close protocol (:mod:`trtio._lifetime`): a failed free raises :class:`CudaError` naming the
    tensor (closed anyway), and a tensor bound in a frozen tensor map refuses to close
    (:class:`FrozenError`).
    """

    __slots__ = (
        "_name", "_dtype", "_location", "_shape", "_nbytes", "_capacity", "_ptr", "_backend",
        "_owner", "_owning", "_frozen", "_last_stream", "_export_event", "_prev_view", "_log",
    )

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: DType, location: Location,
                 capacity: int, backend: Backend, *, name: str = "", owner: Any = None,
                 owning: bool = False) -> None:
        self._name = name
        self._dtype = dtype
        self._location = location
        self._shape = shape
        self._nbytes = dtype.nbytes(volume(shape))
        # The view before the current one, (shape, bytes), where a reshape or an executor changed it: a view
        # that goes back and forth (a runtime's view, then a step's) is set back without checks.
        self._prev_view: tuple[tuple[int, ...], int] | None = None
        self._log = VIEWS  # where its view changes are counted (an executor that binds it gives it its own)
        self._capacity = capacity
        self._ptr = ptr
        self._backend = backend
        self._owner = owner
        self._owning = owning
        self._frozen = False
        self._last_stream: Stream | None = None
        self._export_event: Event | None = None
        what = f"tensor {name!r}"
        if owning and ptr:
            self._init_lifetime(what, _free_memory, backend, ptr, location, what, capacity)
        else:
            self._init_lifetime(what)

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def empty(cls, shape: ShapeLike, dtype: DTypeLike, location: Location = Location.DEVICE, *,
              name: str = "", backend: Backend | str | None = None,
              capacity: int | None = None) -> Tensor:
        """Allocate an uninitialised tensor; ``capacity`` (bytes) defaults to the shape's size.

        A zero-byte tensor allocates nothing and has ``data_ptr == 0`` (an absent feature).
        """
        shape, dt, location, be, cap = _layout(name, shape, dtype, location, backend, capacity)
        ptr = 0
        if cap:
            try:
                ptr = be.alloc(cap, location)
            except CudaError as exc:
                raise CudaError(exc.call, exc.name, f"tensor {name!r} (shape {shape} of {dt}): {cap} bytes of "
                                                    f"{location} memory asked: {exc.detail}") from exc
        return cls(ptr, shape, dt, location, cap, be, name=name, owning=True)

    @classmethod
    def wrap(cls, ptr: int, shape: ShapeLike, dtype: DTypeLike, location: Location = Location.DEVICE,
             owner: Any = None, *, name: str = "", capacity: int | None = None,
             backend: Backend | str | None = None) -> Tensor:
        """View existing memory without owning it; ``owner`` is kept alive by the tensor.

        ``ptr`` is an int address (not a bool): not negative, not 0 unless the capacity is 0, not in
        the never-mapped first page (below 4096), and its ``capacity`` bytes must not run past 64 bits.
        Device and pinned pointers must be 256-byte aligned (TensorRT's requirement for tensor
        addresses). Where the backend can tell, the bytes must lie in memory it allocated (the host
        backend knows its device allocations; CUDA cannot vouch for memory of other libraries, so the
        cuda backend takes the caller's word).
        """
        shape, dt, location, be, cap = _layout(name, shape, dtype, location, backend, capacity)
        address = _pointer(name, ptr, cap, location, be)
        return cls(address, shape, dt, location, cap, be, name=name, owner=owner)

    @classmethod
    def from_numpy(cls, array: np.ndarray, location: Location = Location.DEVICE, stream: StreamLike = None, *,
                   name: str = "", backend: Backend | str | None = None) -> Tensor:
        """A new tensor holding a copy of ``array`` (copied on ``stream``)."""
        array = np.asarray(array)
        t = cls.empty(array.shape, DType.from_numpy(array.dtype), location, name=name, backend=backend)
        try:
            t.copy_from(array, stream=stream)
        except BaseException:
            t.close()  # a factory that fails frees what it allocated
            raise
        return t

    @classmethod
    def from_dlpack(cls, obj: Any, stream: StreamLike = None, *, name: str = "",
                    backend: Backend | str | None = None) -> Tensor:
        """Wrap the memory of ``obj`` (a torch, CuPy, JAX or numpy array: anything with ``__dlpack__``, or
        ``__cuda_array_interface__``) as a non-owning tensor, without a copy; the tensor keeps ``obj``'s
        memory alive.

        CUDA memory becomes a DEVICE tensor of ``backend`` (None: the cuda backend), which must be the
        array's device, and the producer's pending work is ordered before ``stream`` (None: the calling
        thread's trtio default stream) without synchronising the host. Host memory becomes a HOST tensor
        (PINNED for 256-byte aligned pinned memory). The array must be C-contiguous with a dtype trtio
        knows, and device addresses 256-byte aligned. Memory its producer marks read-only (DLPack's flag, the
        CUDA array interface's) is refused: a Tensor can be written. See :mod:`trtio._inputs`.
        """
        f = read_foreign(obj, stream, name=name, backend=backend)
        return cls.wrap(f.ptr, f.shape, f.dtype, f.location, f.owner, name=f.name, backend=f.backend)

    # -- state ----------------------------------------------------------------------------
    def _live(self) -> None:
        if self._closed:
            raise ClosedError(f"tensor {self._name!r} is closed")
        owner = self._owner
        if owner is not None and (owner._closed if isinstance(owner, Closeable)
                                  else getattr(owner, "is_closed", False) is True):
            raise _closed_owner(self._name, owner)

    @property
    def name(self) -> str:
        return self._name

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def location(self) -> Location:
        return self._location

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def shape(self) -> tuple[int, ...]:
        """The current view's shape."""
        self._live()
        return self._shape

    @property
    def ndim(self) -> int:
        self._live()
        return len(self._shape)

    @property
    def numel(self) -> int:
        """Elements of the current view."""
        self._live()
        return volume(self._shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the current view."""
        self._live()
        return self._nbytes

    @property
    def capacity(self) -> int:
        """Bytes available to views; fixed for the tensor's life."""
        return self._capacity

    @property
    def data_ptr(self) -> int:
        """The tensor's address; never changes (0 for a zero-capacity tensor)."""
        self._live()
        return self._ptr

    @property
    def is_frozen(self) -> bool:
        return self._frozen

    @property
    def is_empty(self) -> bool:
        """True for a zero-capacity tensor: Edge-LLM's "feature absent"."""
        return self._capacity == 0

    # -- reshaping --------------------------------------------------------------------------
    def reshape(self, shape: ShapeLike) -> Tensor:
        """Change the view in place (no reallocation); returns self.

        Raises :class:`CapacityError` naming the tensor, the shape and both byte counts when
        the view does not fit.
        """
        if type(shape) is tuple:
            now = self._shape
            if shape == now:
                if self._closed:
                    self._live()
                return self
            prev = self._prev_view
            if prev is not None and shape is prev[0] and not self._closed:  # the view before, checked then
                self._live()
                self._prev_view = (now, self._nbytes)
                self._shape, self._nbytes = shape, prev[1]
                log = self._log
                log.last = id(self)
                log.changes += 1
                return self
        self._live()
        dims, need, plain = _checked_view(shape, self._dtype, self._capacity, self._name)
        if self._log is FIXED_VIEW and dims != self._shape:
            raise FrozenError(f"tensor {self._name!r}: its view {list(self._shape)} is fixed (fix_view); reshape to "
                              f"{list(dims)} refused")
        self._prev_view = (self._shape, self._nbytes)
        # A tuple of plain ints is kept as given (it equals the checked one): given again, the same object is
        # found by identity when it is the view before.
        self._shape = shape if plain else dims  # type: ignore[assignment]
        self._nbytes = need
        log = self._log
        log.last = id(self)
        log.changes += 1
        return self

    def _set_view(self, shape: tuple[int, ...], nbytes: int) -> None:
        """Internal (executors): a view already checked against this tensor's capacity, set without checks."""
        self._prev_view = (self._shape, self._nbytes)
        self._shape = shape
        self._nbytes = nbytes
        log = self._log
        log.last = 0
        log.changes += 1

    def view(self, dtype: DTypeLike) -> Tensor:
        """The same bytes seen with another dtype (last dim rescaled); shares memory, owns nothing."""
        self._live()
        dt = DType.coerce(dtype)
        shape = self._shape
        if shape:
            last_bits = shape[-1] * self._dtype.bits
            if last_bits % dt.bits:
                raise ShapeError(
                    f"tensor {self._name!r}: last dim {shape[-1]} of {self._dtype} cannot be viewed "
                    f"as {dt} ({last_bits} bits is not a multiple of {dt.bits})")
            shape = shape[:-1] + (last_bits // dt.bits,)
        elif self._dtype.bits != dt.bits:
            raise ShapeError(f"tensor {self._name!r}: a 0-d {self._dtype} cannot be viewed as {dt}")
        out = Tensor(self._ptr, shape, dt, self._location, self._capacity, self._backend,
                     name=self._name, owner=self)
        out._last_stream = self._last_stream
        return out

    # -- copies -----------------------------------------------------------------------------
    def copy_from(self, src: Any, stream: StreamLike = None) -> Tensor:
        """Copy ``src`` (numpy array or Tensor) into the current view; returns self.

        dtype and shape must equal the view's (a packed 4-bit type takes its flat bytes, as
        :meth:`to_numpy` returns them); for a flat copy, reshape first. Device destinations are written on
        ``stream`` asynchronously; see the module docstring for host-accessible ones.
        """
        self._live()
        if isinstance(src, Tensor):
            src._live()
            _check_peer(self, src._dtype, src._shape, src._nbytes, f"tensor {src._name!r}", "from")
            if src._backend is not self._backend:
                raise TrtioError(f"tensor {self._name!r} ({self._backend.name}): cannot copy from tensor "
                                 f"{src._name!r} of another backend ({src._backend.name})")
            if partly_over(src._ptr, self._ptr, self._nbytes):
                raise overlap_error(f"tensor {self._name!r}: copy_from(tensor {src._name!r})", src._ptr, self._ptr,
                                    self._nbytes, f"tensor {self._name!r}")
            s = as_stream(stream, self._backend)
            if src._last_stream is not None:
                src._order_consumer(s.handle)
            if src._ptr != self._ptr:  # the same bytes: nothing to copy, s ordered after their writer all the same
                self._backend.memcpy(self._ptr, src._ptr, self._nbytes, s.handle)
            self._last_stream = s
            return self
        array = src if isinstance(src, np.ndarray) else np.asarray(src)
        dt = _numpy_dtype_of(self, array)
        _check_peer(self, dt, array.shape, array.nbytes, "an array", "from", raw=True)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        if self._location is Location.DEVICE:
            s = as_stream(stream, self._backend)
            self._backend.memcpy(self._ptr, array.ctypes.data, self._nbytes, s.handle)
            self._last_stream = s
        elif self._nbytes:
            ctypes.memmove(self._ptr, array.ctypes.data, self._nbytes)
        return self

    def copy_to(self, dst: Any, stream: StreamLike = None) -> Any:
        """Copy the current view into ``dst`` (numpy array or Tensor); returns ``dst``.

        dtype and shape must equal the view's, as for :meth:`copy_from`.

        Into a numpy array the copy has finished when this returns (device to pageable
        memory is synchronous); into a Tensor it is ordered on ``stream``.
        """
        self._live()
        if isinstance(dst, Tensor):
            dst.copy_from(self, stream)
            return dst
        if not isinstance(dst, np.ndarray) or not dst.flags.c_contiguous or not dst.flags.writeable:
            raise TrtioError(f"tensor {self._name!r}: copy_to needs a writeable C-contiguous numpy array or a Tensor")
        dt = _numpy_dtype_of(self, dst)
        _check_peer(self, dt, dst.shape, dst.nbytes, "an array", "to", raw=True)
        s = as_stream(stream, self._backend)
        if self._last_stream is not None:
            self._order_consumer(s.handle)
        self._backend.memcpy(dst.ctypes.data, self._ptr, self._nbytes, s.handle)
        s.synchronize()
        return dst

    def to_numpy(self, stream: StreamLike = None) -> np.ndarray:
        """A host copy of the current view (synchronises ``stream``).

        bf16/fp8 come back as ml_dtypes arrays when ml_dtypes is installed, else as their raw
        unsigned storage; packed 4-bit types come back as a flat uint8 array of their bytes.
        """
        self._live()
        if self._dtype.is_packed:
            out = np.empty(self._nbytes, dtype=np.uint8)
        else:
            out = np.empty(self._shape, dtype=self._dtype.storage_numpy)
        s = as_stream(stream, self._backend)
        if self._last_stream is not None:
            self._order_consumer(s.handle)  # read after the last trtio work that wrote this tensor
        self._backend.memcpy(out.ctypes.data, self._ptr, self._nbytes, s.handle)
        s.synchronize()
        return out

    def zero_(self, stream: StreamLike = None) -> Tensor:
        """Set the current view's bytes to 0; returns self."""
        self._live()
        if self._location is Location.DEVICE:
            s = as_stream(stream, self._backend)
            self._backend.memset(self._ptr, 0, self._nbytes, s.handle)
            self._last_stream = s
        elif self._nbytes:
            ctypes.memset(self._ptr, 0, self._nbytes)
        return self

    def fill_(self, value: Any, stream: StreamLike = None) -> Tensor:
        """Set every element of the current view to ``value``; returns self.

        The value must be representable: integer tensors take integral values within the dtype's
        range (``1.5``, ``nan`` or ``300`` for int8 raise :class:`InvalidValueError`), bool tensors
        True/False (or 0/1), floating tensors any value that does not overflow to infinity.
        """
        self._live()
        pattern = fill_pattern(self._dtype, value, self._name)
        if not pattern:  # a packed type's 0
            return self.zero_(stream)
        count = volume(self._shape)
        if self._location is Location.DEVICE:
            s = as_stream(stream, self._backend)
            self._backend.fill(self._ptr, pattern, count, s.handle)
            self._last_stream = s
        elif count:
            host_fill(self._ptr, pattern, count)
        return self

    def mark_written(self, stream: StreamLike = None) -> None:
        """Record that work on ``stream`` writes this tensor (exports then order consumers after it)."""
        self._live()
        self._last_stream = as_stream(stream, self._backend)

    def _order_consumer(self, consumer_stream: int) -> None:
        """``consumer_stream`` (a handle) waits for the last trtio work that wrote this tensor (none: no wait)."""
        producer = self._last_stream
        if producer is None or producer.is_closed or producer.handle == consumer_stream:
            return
        if self._export_event is None:
            self._export_event = Event.create(self._backend)
        self._backend.record_event(self._export_event.handle, producer.handle)
        self._backend.wait_event(consumer_stream, self._export_event.handle)

    # -- zero-copy exports (DLPack, the CUDA and numpy array interfaces): each orders its consumer after the
    # tensor's last trtio writer (see the module docstring) ---------------------------------------------------
    @property
    def is_host_accessible(self) -> bool:
        return self._backend.is_host_accessible(self._location)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if self._backend.name != "cuda" or self._location is not Location.DEVICE:
            raise NotAvailableError(
                f"tensor {self._name!r} is not CUDA device memory ({self._location} on "
                f"{self._backend.name}); use __array_interface__ or to_numpy()")
        self._live()
        stream = self._last_stream
        return _interface(self, device=True, stream=stream.handle if stream is not None and not stream.is_closed
                          else None)

    @property
    def __array_interface__(self) -> dict[str, Any]:
        if not self.is_host_accessible:
            raise NotAvailableError(
                f"tensor {self._name!r} is in device memory; use __dlpack__, "
                f"__cuda_array_interface__ or to_numpy()")
        self._live()
        return _interface(self, device=False)

    def __dlpack_device__(self) -> tuple[int, int]:
        self._live()
        if self._backend.name == "cuda":
            if self._location is Location.DEVICE:
                return (_DL_CUDA, self._backend.device_id)
            if self._location is Location.PINNED:
                return (_DL_CUDA_HOST, 0)
        return (_DL_CPU, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        """Export the current view without a copy.

        For CUDA device memory, the consumer's ``stream`` (a handle; None or 1 = legacy
        default, 2 = per-thread default, -1 = no ordering) is made to wait for the last trtio
        work that wrote this tensor.
        """
        from trtio import _dlpack

        self._live()
        device = self.__dlpack_device__()
        code = _export_code(self._name, self._dtype, device, dl_device, copy)
        if device[0] == _DL_CUDA and stream != -1:
            self._order_consumer(_consumer_stream(self._name, stream))
        return _dlpack.make_capsule(
            self._ptr, self._shape, type_code=code[0], bits=code[1], device_type=device[0],
            device_id=device[1], owner=self, versioned=_dlpack.parse_max_version(max_version))

    # -- lifetime ---------------------------------------------------------------------------
    def _freeze(self) -> None:
        self._frozen = True

    def _unfreeze(self) -> None:
        self._frozen = False

    def _closable(self) -> bool:
        # A frozen tensor (bound in a frozen tensor map) refuses: freeing it would leave an engine binding
        # pointing at freed memory.
        if self._frozen:
            raise FrozenError(
                f"tensor {self._name!r} is bound in a frozen tensor map; close its PipelineIO instead")
        return super()._closable()

    def _close_owned(self) -> None:
        log = self._log
        log.last = 0
        log.changes += 1  # executors look their views over again (and find this one closed)
        self._owner = None
        self._last_stream = None  # a closed tensor keeps no stream alive (a thread's default stream)
        event, self._export_event = self._export_event, None
        if event is not None:
            event.close()

    def __repr__(self) -> str:
        if self._closed:
            return f"Tensor({self._name!r}, closed)"
        return (f"Tensor({self._name!r}, shape={self._shape}, dtype={self._dtype}, "
                f"location={self._location}, ptr=0x{self._ptr:x}, capacity={self._capacity})")


def _check_peer(t: Tensor, other_dtype: DType, other_shape: tuple[int, ...], other_nbytes: int, other_desc: str,
                verb: str, *, raw: bool = False) -> None:
    """A copy's other side must have ``t``'s dtype and view shape (``raw``: a packed type's flat bytes, as
    ``to_numpy`` gives them)."""
    if other_dtype is not t._dtype:
        raise TrtioError(f"tensor {t._name!r}: cannot copy {verb} {other_desc}: dtype {other_dtype} does not match "
                         f"{t._dtype}")
    want = (t._nbytes,) if raw and t._dtype.is_packed else t._shape
    if other_shape != want:
        raise ShapeError(
            f"tensor {t._name!r}: cannot copy {verb} {other_desc}: its shape {other_shape} ({other_nbytes} bytes) "
            f"does not match {'the bytes of ' if want is not t._shape else ''}the view {t._shape} ({t._nbytes} "
            f"bytes); reshape one of them first (tensor.reshape({other_shape}) for a flat copy)")


def _numpy_dtype_of(t: Tensor, array: np.ndarray) -> DType:
    """The dtype of a numpy array copied to or from ``t``: types numpy cannot name (packed 4-bit, bf16 without
    ml_dtypes) travel as raw storage."""
    if t._dtype.numpy is None and array.dtype == t._dtype.storage_numpy:
        return t._dtype
    try:
        return DType.from_numpy(array.dtype)
    except ValueError:
        raise TrtioError(f"tensor {t._name!r}: numpy dtype {array.dtype} does not match {t._dtype}") from None


def _interface(t: Tensor, *, device: bool, stream: int | None = None) -> dict[str, Any]:
    """``t``'s current view as a CUDA array interface (``device``, with the producer's ``stream``) or a numpy
    array interface (packed types as their flat bytes; types numpy cannot name as unsigned storage)."""
    dt = t._dtype
    typestr = dt.typestr
    if device:
        if typestr is None:
            raise InvalidTypeError(
                f"tensor {t._name!r}: __cuda_array_interface__ has no type string for {dt}; "
                f"export with __dlpack__ or view the bytes: tensor.view(trtio.DType.UINT8)")
        return {"shape": t._shape, "typestr": typestr, "data": (t._ptr, False), "strides": None, "version": 3,
                "stream": stream}
    if typestr is None:
        storage = dt.storage_numpy
        typestr = f"<u{dt.itemsize}" if storage.kind == "V" else storage.newbyteorder("<").str
    shape = (t._nbytes,) if dt.is_packed else t._shape
    return {"shape": shape, "typestr": typestr, "data": (t._ptr, False), "strides": None, "version": 3}


def _export_code(name: str, dtype: DType, device: tuple[int, int], dl_device: Any, copy: bool | None
                 ) -> tuple[int, int]:
    """The DLPack type code of an export of tensor ``name`` (of ``dtype``, on DLPack ``device``), refusing a copy,
    another device, and types DLPack cannot carry."""
    if copy is True:
        raise ExportError(f"tensor {name!r}: trtio exports without copying (copy=True asked)")
    if dl_device is not None and tuple(dl_device) != device:
        raise ExportError(f"tensor {name!r} lives on DLPack device {device}, not {tuple(dl_device)}")
    code = dtype.dlpack
    if code is None:
        raise ExportError(f"tensor {name!r}: DLPack cannot carry {dtype}; export tensor.view(trtio.DType.UINT8) and "
                          f"view it as the type on the consumer side")
    return code


def _consumer_stream(name: str, stream: object) -> int:
    """The consumer's CUDA stream handle from ``__dlpack__(stream=...)`` of tensor ``name``, as the DLPack standard
    defines it."""
    if stream is None:
        return 1  # the consumer did not say: CUDA's legacy default stream
    if not is_int(stream):
        raise InvalidTypeError(f"tensor {name!r}: __dlpack__(stream={stream!r}): a CUDA consumer passes an int "
                               f"stream handle, -1 or None")
    handle = int(stream)
    if handle == 0 or handle < -1 or handle >= _ADDRESS_LIMIT:
        raise InvalidValueError(
            f"tensor {name!r}: __dlpack__(stream={handle}) is not allowed: DLPack takes None or 1 (legacy default "
            f"stream), 2 (per-thread default stream), -1 (no ordering) or a stream handle; 0 is ambiguous")
    return handle
