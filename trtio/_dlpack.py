"""DLPack in pure Python: ``DLManagedTensor`` structs and their capsules, made and consumed with ctypes.

:func:`make_capsule` wraps memory that some Python object owns (a trtio tensor, a numpy array)
in the PyCapsule a DLPack consumer takes: ``numpy.from_dlpack``, ``torch.from_dlpack``, CuPy,
JAX. It copies nothing and orders nothing on any stream; the caller's ``__dlpack__`` does that
before it asks for the capsule.

Lifetime. Every export is kept in a module registry keyed by the address of its
``DLManagedTensor``: the ctypes structs (which the consumer reads through raw pointers) and a
reference to ``owner``. The entry goes when the DLPack deleter runs, which happens exactly once:

- the consumer took the capsule (renamed it ``used_dltensor[_versioned]``) and calls the
  deleter when its own array dies, from any thread (the deleter takes the GIL itself);
- nobody took it: the capsule's destructor calls the deleter when the capsule is freed.

:func:`live_exports` counts entries whose deleter has not run yet; tests use it to prove that no
export leaks.

Known limit. A consumer that refuses a capsule after taking it (numpy for bf16, or for device
memory) drops it while its error is being raised. A ctypes callback cannot leave that error in
place for the consumer to return, so the consumer then reports ``SystemError: ... returned NULL
without setting an exception``. The export is still released, and the lost error is logged as
a warning on this module's logger so the real reason is not gone.

Import. :func:`consume_capsule` is the consumer side: it takes a capsule a producer's ``__dlpack__``
returned, reads what it describes (:class:`DLPackView`) and takes it over as the DLPack standard says
(renames it ``used_dltensor[_versioned]``). The producer's deleter then runs exactly once: when the
view's ``owner`` (:class:`ImportedCapsule`) is released or garbage collected. It copies nothing and
orders nothing either: the producer did that in ``__dlpack__(stream=...)``.
"""

from __future__ import annotations

import ctypes
import logging
import weakref
from dataclasses import dataclass
from typing import Any

from trtio._checks import is_int
from trtio.errors import ExportError, InvalidTypeError, InvalidValueError, ShapeError

__all__ = [
    "kDLCPU",
    "kDLCUDA",
    "kDLCUDAHost",
    "kDLInt",
    "kDLUInt",
    "kDLFloat",
    "kDLBfloat",
    "kDLBool",
    "DLPACK_MAJOR_VERSION",
    "DLPACK_MINOR_VERSION",
    "DLPACK_FLAG_BITMASK_READ_ONLY",
    "DLDevice",
    "DLDataType",
    "DLTensor",
    "DLManagedTensor",
    "DLPackVersion",
    "DLManagedTensorVersioned",
    "make_capsule",
    "parse_max_version",
    "live_exports",
    "DLPackView",
    "ImportedCapsule",
    "consume_capsule",
    "contiguous_strides",
]

_log = logging.getLogger(__name__)

# DLDeviceType (dlpack.h).
kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3

# DLDataTypeCode (dlpack.h).
kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4
kDLBool = 6

# The version written into versioned capsules, and the one flag trtio sets.
DLPACK_MAJOR_VERSION = 1
DLPACK_MINOR_VERSION = 0
DLPACK_FLAG_BITMASK_READ_ONLY = 1

#: The most dimensions a consumed tensor may have (numpy's limit).
MAX_NDIM = 64

_LEGACY_NAME = b"dltensor"
_VERSIONED_NAME = b"dltensor_versioned"


# -- the structs of dlpack.h ----------------------------------------------------------------------
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# void (*deleter)(DLManagedTensor*) and (DLManagedTensorVersioned*). CFUNCTYPE, not PYFUNCTYPE:
# consumers may call it from a thread Python has never seen, and a CFUNCTYPE callback takes the
# GIL itself.
_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _Deleter),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# -- the Python C API -----------------------------------------------------------------------------
# Private prototypes bound to ctypes.pythonapi rather than argtypes set on its shared attributes,
# which any other library in the process may set differently. PYFUNCTYPE keeps the GIL held
# across the call and raises whatever Python error the call leaves set.
def _capi(name: str, restype: Any, *argtypes: Any) -> Any:
    # Any: ctypes prototypes are typed loosely in typeshed, and what a call returns depends on restype.
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


# PyCapsule_New hands back a new reference (py_object). The calls the destructor makes take a
# bare address: its capsule's reference count is already 0, and a py_object would revive it.
_PyCapsule_New = _capi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p)
_PyCapsule_GetName = _capi("PyCapsule_GetName", ctypes.c_char_p, ctypes.c_void_p)
_PyCapsule_IsValid = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_PyCapsule_GetPointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_char_p)
_PyErr_Occurred = _capi("PyErr_Occurred", ctypes.c_void_p)
_Py_IncRef = _capi("Py_IncRef", None, ctypes.py_object)

# void (*PyCapsule_Destructor)(PyObject*): always called with the GIL held.
_CapsuleDestructor = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)


# -- the registry ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Export:
    """What must outlive the consumer's use of one capsule."""

    managed: DLManagedTensor | DLManagedTensorVersioned
    shape: ctypes.Array[ctypes.c_int64]  # int64[ndim], pointed at by dl_tensor.shape
    strides: ctypes.Array[ctypes.c_int64]  # int64[ndim], pointed at by dl_tensor.strides
    owner: object  # owns the memory at dl_tensor.data


_exports: dict[int, _Export] = {}


def live_exports() -> int:
    """How many capsules made by :func:`make_capsule` still wait for their deleter."""
    return len(_exports)


def _release(address: int) -> None:
    # pop, not del: a consumer that calls the deleter twice must not break anything.
    _exports.pop(address, None)


def _take_pending_error(where: str) -> None:
    """Clear a Python error left set by the C code that is calling a ctypes callback.

    A consumer that fails after taking a capsule drops it with its error still set. Python code
    cannot run in that state (every call it makes fails with SystemError), and ctypes gives no way
    to put the error back when the callback returns, so the error is taken here, logged, and lost.
    """
    try:
        _PyErr_Occurred()  # raises the pending error, if there is one
    except BaseException as exc:  # noqa: BLE001 - it is somebody else's error, whatever it is
        _log.warning(
            "%s ran while %s: %s was being raised; ctypes cannot hand it back, so the DLPack "
            "consumer will report SystemError instead", where, type(exc).__name__, exc)


# The two callbacks, wrapped below as ``_deleter`` and ``_capsule_destructor`` (what DLPack and
# CPython call them); each takes the address of the struct / capsule it is about. Wrapped rather
# than decorated, so that type checkers see typed functions.
def _on_delete(managed_address: int) -> None:
    _take_pending_error("the DLPack deleter")
    _release(managed_address)


def _on_capsule_freed(capsule_address: int) -> None:
    _take_pending_error("the DLPack capsule destructor")
    name = _PyCapsule_GetName(capsule_address)
    # A consumer renames the capsule when it takes it; from then on the deleter is its to call.
    if name not in (_LEGACY_NAME, _VERSIONED_NAME):
        return
    if not _PyCapsule_IsValid(capsule_address, name):
        return
    _release(_PyCapsule_GetPointer(capsule_address, name))


# Capsules a consumer leaks can be freed during interpreter shutdown, after this module's globals
# are gone. The C code they point at (the callback thunks) and the capsule names must still be
# there then, so they are given one reference that is never dropped.
_CAPSULE_NAMES = (ctypes.create_string_buffer(_LEGACY_NAME),
                  ctypes.create_string_buffer(_VERSIONED_NAME))
_deleter = _Deleter(_on_delete)
_capsule_destructor = _CapsuleDestructor(_on_capsule_freed)
_Py_IncRef((_deleter, _capsule_destructor, _CAPSULE_NAMES))


# -- export ---------------------------------------------------------------------------------------
def parse_max_version(max_version: object) -> bool:
    """True when a consumer's ``__dlpack__(max_version=...)`` asks for a versioned capsule.

    ``max_version`` is None (a consumer that predates DLPack 1.0: it wants ``"dltensor"``) or a
    ``(major, minor)`` pair; any major version of 1 or more can read the 1.0 struct.
    """
    if max_version is None:
        return False
    try:
        major = max_version[0]  # type: ignore[index]
    except (TypeError, IndexError, KeyError):
        major = None
    if not is_int(major):
        raise InvalidTypeError(
            f"__dlpack__: max_version must be None or a (major, minor) tuple of ints, got {max_version!r}")
    return int(major) >= 1


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides, in elements, of a C-contiguous array of ``shape``."""
    # A zero-length dimension does not zero the strides of the dimensions before it (torch's rule;
    # numpy 2 writes all-zero strides for an empty array, which consumers accept as well).
    strides = []
    step = 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def _as_ints(field: str, values: tuple[int, ...], *, minimum: int | None) -> tuple[int, ...]:
    try:
        items = tuple(values)
    except TypeError:
        raise InvalidTypeError(f"make_capsule: {field} must be a tuple of ints, got {values!r}") from None
    if not all(is_int(v) for v in items):
        raise InvalidTypeError(f"make_capsule: {field} must be a tuple of ints, got {values!r}")
    ints = tuple(int(v) for v in items)
    if minimum is not None and any(v < minimum for v in ints):
        raise ShapeError(f"make_capsule: {field} must not be negative, got {values!r}")
    return ints


def _check_range(field: str, value: int, low: int, high: int) -> int:
    if not is_int(value):
        raise InvalidTypeError(f"make_capsule: {field} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if not low <= value <= high:
        raise InvalidValueError(f"make_capsule: {field} must be in [{low}, {high}], got {value}")
    return value


def make_capsule(ptr: int, shape: tuple[int, ...], *, type_code: int, bits: int, lanes: int = 1,
                 device_type: int, device_id: int, owner: object,
                 strides: tuple[int, ...] | None = None, byte_offset: int = 0,
                 versioned: bool = False, read_only: bool = False) -> object:
    """A DLPack capsule for the memory at ``ptr + byte_offset``; return it from ``__dlpack__``.

    ``shape`` and ``strides`` count elements; ``strides=None`` means C-contiguous, and explicit
    contiguous strides are written anyway. ``versioned`` makes a DLPack 1.0
    ``"dltensor_versioned"`` capsule (use ``parse_max_version(max_version)``), otherwise a legacy
    ``"dltensor"`` one. ``read_only`` sets DLPACK_FLAG_BITMASK_READ_ONLY; a legacy capsule has no
    way to say it, so read-only memory raises BufferError there, as numpy does.

    Nothing is copied and no stream is touched: the consumer reads the memory in place.
    ``owner`` (which keeps the memory allocated) is referenced until the consumer calls the
    deleter, or until the capsule is freed without being consumed.
    """
    if read_only and not versioned:
        raise ExportError(
            "make_capsule: read-only memory cannot be exported through a legacy 'dltensor' capsule, "
            "which cannot mark it read-only; the consumer must ask for max_version >= (1, 0)")
    dims = _as_ints("shape", shape, minimum=0)
    if strides is None:
        steps = contiguous_strides(dims)
    else:
        steps = _as_ints("strides", strides, minimum=None)
        if len(steps) != len(dims):
            raise ShapeError(
                f"make_capsule: strides {tuple(strides)!r} has {len(steps)} entries "
                f"for shape {tuple(shape)!r} of {len(dims)} dimensions")
    address = _check_range("ptr", ptr, 0, 2**64 - 1)
    offset = _check_range("byte_offset", byte_offset, 0, 2**64 - 1)

    managed: DLManagedTensor | DLManagedTensorVersioned
    if versioned:
        managed = DLManagedTensorVersioned()
        managed.version = DLPackVersion(DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION)
        managed.flags = DLPACK_FLAG_BITMASK_READ_ONLY if read_only else 0
        name = _CAPSULE_NAMES[1]
    else:
        managed = DLManagedTensor()
        name = _CAPSULE_NAMES[0]
    # One spare slot: a 0-d tensor still gets real (unread) shape and strides pointers.
    shape_array = (ctypes.c_int64 * max(len(dims), 1))(*dims)
    strides_array = (ctypes.c_int64 * max(len(steps), 1))(*steps)

    tensor = managed.dl_tensor
    tensor.data = address
    tensor.device = DLDevice(_check_range("device_type", device_type, 0, 2**31 - 1),
                             _check_range("device_id", device_id, 0, 2**31 - 1))
    tensor.ndim = len(dims)
    tensor.dtype = DLDataType(_check_range("type_code", type_code, 0, 255),
                              _check_range("bits", bits, 1, 255),
                              _check_range("lanes", lanes, 1, 2**16 - 1))
    tensor.shape = ctypes.cast(shape_array, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = ctypes.cast(strides_array, ctypes.POINTER(ctypes.c_int64))
    tensor.byte_offset = offset
    managed.manager_ctx = None
    managed.deleter = _deleter

    key = ctypes.addressof(managed)
    _exports[key] = _Export(managed, shape_array, strides_array, owner)
    try:
        return _PyCapsule_New(key, ctypes.addressof(name), ctypes.cast(_capsule_destructor,
                                                                        ctypes.c_void_p))
    except BaseException:
        _release(key)
        raise


# -- import ---------------------------------------------------------------------------------------
# Prototypes on capsule objects (the ones above take bare addresses, for the destructor).
_PyCapsule_IsValidObject = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_PyCapsule_GetPointerObject = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_PyCapsule_SetName = _capi("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_void_p)

# A consumed capsule keeps pointing at its new name for as long as it lives: the names are never freed.
_USED_NAMES = (ctypes.create_string_buffer(b"used_dltensor"),
               ctypes.create_string_buffer(b"used_dltensor_versioned"))
_Py_IncRef(_USED_NAMES)


def _call_deleter(deleter: Any, managed_address: int) -> None:
    deleter(managed_address)


class ImportedCapsule:
    """A consumed DLPack tensor, held for its consumer: the producer's deleter runs once, on
    :meth:`release` or when this object is garbage collected. ``producer`` (the object whose
    ``__dlpack__`` made the capsule) is referenced as long as this object lives."""

    __slots__ = ("producer", "_finalizer", "__weakref__")

    def __init__(self, managed_address: int, deleter: Any, producer: object) -> None:
        self.producer = producer
        self._finalizer = weakref.finalize(self, _call_deleter, deleter, managed_address) if deleter else None

    @property
    def released(self) -> bool:
        return self._finalizer is None or not self._finalizer.alive

    def release(self) -> None:
        """Hand the tensor back to its producer now (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()

    def _forget(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()


@dataclass(frozen=True)
class DLPackView:
    """What a consumed capsule describes. ``data`` is the first element's address (``byte_offset``
    applied); ``strides`` count elements (None: C-contiguous). The memory stays valid while ``owner``
    is referenced and not released."""

    data: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    type_code: int
    bits: int
    lanes: int
    device_type: int
    device_id: int
    read_only: bool
    owner: ImportedCapsule

    @property
    def is_c_contiguous(self) -> bool:
        """True when the elements lie in row-major order without gaps (strides of extent-1 dimensions,
        which no index ever steps along, may be anything, as torch writes them)."""
        if self.strides is None or 0 in self.shape:
            return True
        want = contiguous_strides(self.shape)
        return all(dim == 1 or got == need for dim, got, need in zip(self.shape, self.strides, want))


def consume_capsule(capsule: object, producer: object = None) -> DLPackView:
    """Take over the DLPack capsule ``capsule`` (``"dltensor"`` or ``"dltensor_versioned"``) and return
    what it describes; ``producer`` is kept alive beside it.

    Raises BufferError for anything else (an already consumed capsule, another kind of object), a
    versioned capsule of a major version above :data:`DLPACK_MAJOR_VERSION`, or a tensor no array can be
    (ndim outside 0..:data:`MAX_NDIM`, a null shape pointer, a negative dimension, a null data pointer for
    elements); the capsule is then left as it was, for its own destructor to free.
    """
    if _PyCapsule_IsValidObject(capsule, _VERSIONED_NAME):
        versioned, name = True, _VERSIONED_NAME
    elif _PyCapsule_IsValidObject(capsule, _LEGACY_NAME):
        versioned, name = False, _LEGACY_NAME
    else:
        raise ExportError(f"{type(capsule).__name__} is not an unused DLPack capsule "
                          "('dltensor' or 'dltensor_versioned')")
    address = _PyCapsule_GetPointerObject(capsule, name)
    managed: DLManagedTensor | DLManagedTensorVersioned
    read_only = False
    if versioned:
        managed = DLManagedTensorVersioned.from_address(address)
        if managed.version.major > DLPACK_MAJOR_VERSION:
            raise ExportError(f"the capsule is DLPack {managed.version.major}.{managed.version.minor}; trtio reads "
                              f"DLPack {DLPACK_MAJOR_VERSION}.x")
        read_only = bool(managed.flags & DLPACK_FLAG_BITMASK_READ_ONLY)
    else:
        managed = DLManagedTensor.from_address(address)
    tensor = managed.dl_tensor
    ndim = int(tensor.ndim)
    # What the struct says is checked before anything is read through its pointers: a capsule refused here is
    # left as it was, for its own destructor to hand back.
    if not 0 <= ndim <= MAX_NDIM:
        raise ExportError(f"a DLPack tensor of ndim {ndim}; trtio reads 0..{MAX_NDIM} dimensions")
    if ndim and not tensor.shape:
        raise ExportError(f"a DLPack tensor of ndim {ndim} without a shape (a null shape pointer)")
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    if any(d < 0 for d in shape):
        raise ExportError(f"a DLPack tensor of shape {list(shape)}: a dimension is negative")
    if not tensor.data and 0 not in shape:
        raise ExportError(f"a DLPack tensor of shape {list(shape)} at a null data pointer (only an empty tensor "
                          "may have one)")
    strides = tuple(int(tensor.strides[i]) for i in range(ndim)) if tensor.strides else None
    owner = ImportedCapsule(address, managed.deleter, producer)
    try:
        if _PyCapsule_SetName(capsule, ctypes.addressof(_USED_NAMES[1 if versioned else 0])) != 0:
            raise ExportError("PyCapsule_SetName failed on a DLPack capsule")
    except BaseException:
        owner._forget()  # the capsule is still the producer's: its destructor frees it
        raise
    return DLPackView(
        data=(tensor.data or 0) + int(tensor.byte_offset), shape=shape, strides=strides,
        type_code=int(tensor.dtype.code), bits=int(tensor.dtype.bits), lanes=int(tensor.dtype.lanes),
        device_type=int(tensor.device.device_type), device_id=int(tensor.device.device_id),
        read_only=read_only, owner=owner)
