"""Foreign arrays read in place: DLPack and CUDA-array-interface arrays (torch, CuPy, JAX, numpy) as memory
trtio can wrap, checked and stream-ordered (see :mod:`trtio._inputs`, which takes them as step inputs, and
:meth:`Tensor.from_dlpack <trtio._tensor.Tensor.from_dlpack>`, which wraps them).

Foreign arrays are read in place, so they must be C-contiguous; device arrays are never converted, so
their dtype must be the one asked for. Stream order: the producer's pending writes are ordered before
trtio's stream, never by synchronising the host: DLPack's ``__dlpack__(stream=trtio's stream handle)`` asks
the producer to make that stream wait for its work, and a CUDA array interface ``stream`` makes trtio's
stream wait for it through an event.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._checks import is_int
from trtio._cuda._hostmem import ALIGNMENT
from trtio._cuda.backend import Backend, Location, get_backend
from trtio._dlpack import (
    DLPackView,
    consume_capsule,
    contiguous_strides,
    kDLBfloat,
    kDLBool,
    kDLCPU,
    kDLCUDA,
    kDLCUDAHost,
    kDLFloat,
    kDLInt,
    kDLUInt,
)
from trtio._dtypes import DType
from trtio._stream import StreamLike, as_stream
from trtio.errors import InvalidTypeError, InvalidValueError, ShapeError, TrtioError

__all__ = ["Foreign", "read_foreign"]

_DEVICE_NAMES = {kDLCPU: "host (kDLCPU)", kDLCUDA: "CUDA (kDLCUDA)", kDLCUDAHost: "pinned host (kDLCUDAHost)",
                 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm", 11: "ROCm host", 13: "CUDA managed",
                 14: "oneAPI"}
_CODE_NAMES = {kDLInt: "int", kDLUInt: "uint", kDLFloat: "float", kDLBfloat: "bfloat", kDLBool: "bool", 5: "complex"}
_BY_DLPACK = {member.dlpack: member for member in DType if member.dlpack is not None}
_FLOATS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.FP8)
_INTEGERS = (DType.INT8, DType.INT32, DType.INT64, DType.UINT8)


# -- the adapter ------------------------------------------------------------------------------------


def read_foreign(obj: Any, stream: StreamLike = None, *, name: str = "",
                 backend: Backend | str | None = None) -> Foreign:
    """What :meth:`Tensor.from_dlpack <trtio._tensor.Tensor.from_dlpack>` wraps: ``obj``'s memory, read
    without a copy (the record keeps the producer alive).

    ``obj`` has ``__dlpack__`` (or, failing that, ``__cuda_array_interface__``) and is C-contiguous. CUDA
    memory becomes a DEVICE tensor of ``backend`` (None: the cuda backend), which must be the array's
    device; the producer's pending work is ordered before ``stream`` (None: the calling thread's trtio
    default stream). Host memory becomes a HOST tensor (PINNED for 256-byte aligned kDLCUDAHost memory) of
    ``backend`` (None: the default backend).
    """
    what = f"Tensor.from_dlpack({name or type(obj).__name__})"
    device = dlpack_device(obj, what)
    if device is not None:
        if device[0] in (kDLCPU, kDLCUDAHost):
            be = get_backend(backend)
            view = consume(obj, what, None, device)
            if view.read_only:
                raise _read_only(what)
            found = _dtype_of(view, what)
            _check_view(what, found, view.shape, None, None, view.is_c_contiguous)
            pinned = device[0] == kDLCUDAHost and view.data % ALIGNMENT == 0
            return _wrap(view.data, view.shape, found, Location.PINNED if pinned else Location.HOST, view.owner,
                         what, be, name=name)
        be = get_backend("cuda" if backend is None else backend)
        return from_dlpack_device(obj, what, device, None, None, be, True, stream, name=name, writable=True)
    interface = cuda_array_interface(obj)
    if interface is None:
        raise InvalidTypeError(f"{what}: {type(obj).__name__} has neither __dlpack__ / __dlpack_device__ nor "
                               "__cuda_array_interface__; pass a torch, CuPy, JAX or numpy array")
    be = get_backend("cuda" if backend is None else backend)
    return from_cuda_array_interface(obj, interface, what, None, None, be, True, stream, name=name, writable=True)


def _read_only(what: str) -> InvalidValueError:
    """The refusal of read-only memory where a trtio Tensor would wrap it: a Tensor can be written
    (``copy_from``, ``fill_``, its exports), and writing where the producer said not to (a numpy array over
    ``bytes``, an immutable array) would corrupt it. A step reads its inputs only, so it takes such memory."""
    return InvalidValueError(f"{what}: the array is read-only (its producer says so), and a trtio Tensor can be "
                             "written; wrap a writable copy (numpy: a.copy()), or pass the array to a step as it is")


# -- checks -----------------------------------------------------------------------------------------


def rank_set(ndim: int | tuple[int, ...] | None) -> tuple[int, ...] | None:
    if ndim is None:
        return None
    return (ndim,) if isinstance(ndim, int) else tuple(ndim)


def _rank_text(ranks: tuple[int, ...]) -> str:
    return " or ".join(str(r) for r in ranks)


def _family(dt: DType) -> str:
    if dt in _FLOATS:
        return "floating"
    if dt in _INTEGERS:
        return "integer"
    return "bool" if dt is DType.BOOL else dt.name


def _numpy_family(dt: np.dtype) -> str | None:
    if dt.kind == "f":
        return "floating"
    if dt.kind in "iu":
        return "integer"
    if dt.kind == "b":
        return "bool"
    try:
        return _family(DType.from_numpy(dt))  # ml_dtypes' bfloat16 and float8 (kind 'V')
    except (TrtioError, ValueError, TypeError):
        return None


def check_rank(what: str, shape: tuple[int, ...], ranks: tuple[int, ...] | None) -> None:
    if ranks is not None and len(shape) not in ranks:
        raise ShapeError(f"{what}: expected {_rank_text(ranks)} dimensions, got {len(shape)}: shape {list(shape)}")


def check_host(array: np.ndarray, what: str, want: DType | None, ranks: tuple[int, ...] | None) -> None:
    """Host data: the binding's kind of values (converted by the caller) and its rank."""
    if want is not None and _numpy_family(array.dtype) != _family(want):
        raise ShapeError(f"{what}: expected {_family(want)} values for a {want} input, got {array.dtype}")
    check_rank(what, array.shape, ranks)


def _check_view(what: str, found: DType, shape: tuple[int, ...], want: DType | None,
                ranks: tuple[int, ...] | None, contiguous: bool) -> None:
    """Memory read in place: exactly the binding's dtype, its rank, and no gaps between elements."""
    if want is not None and found is not want:
        raise ShapeError(f"{what}: expected {want} elements, got {found}; trtio reads device arrays in place and "
                         f"never converts them (convert on the producer's side, e.g. torch: .to(torch.{want}))")
    check_rank(what, shape, ranks)
    if not contiguous:
        raise ShapeError(f"{what}: a strided (non-contiguous) view of shape {list(shape)}; trtio reads foreign arrays "
                         "in place and needs them C-contiguous (torch: .contiguous(), CuPy: cupy.ascontiguousarray)")


def _check_device(obj: Any, what: str, device: tuple[int, int], be: Backend, device_ok: bool) -> None:
    """CUDA memory is usable when the step takes it, the backend is CUDA and the device is the backend's."""
    kind, index = device
    if kind != kDLCUDA:
        name = _DEVICE_NAMES.get(kind, f"type {kind}")
        raise InvalidValueError(f"{what}: {type(obj).__name__} lives in {name} memory (DLPack device {device}); "
                                "trtio takes host and CUDA memory")
    _check_cuda(obj, what, index, be, device_ok)


def _check_cuda(obj: Any, what: str, index: int | None, be: Backend, device_ok: bool) -> None:
    where = "CUDA device memory" if index is None else f"CUDA device {index}"
    if not device_ok:
        raise InvalidValueError(f"{what}: {type(obj).__name__} is on {where}, but the host reads this input when it "
                                "lays out the step (reading device memory would synchronise); pass it in host memory "
                                "(numpy, a CPU tensor)")
    if be.name != "cuda":
        raise InvalidValueError(f"{what}: {type(obj).__name__} is on {where}, but the step runs on the {be.name} "
                                "backend, which has no CUDA device; pass host memory (numpy, a CPU tensor)")
    if index is not None and index != be.device_id:
        raise InvalidValueError(f"{what}: {type(obj).__name__} is on CUDA device {index}, the step runs on device "
                                f"{be.device_id}; move it there first (torch: .to('cuda:{be.device_id}'))")


# -- DLPack -----------------------------------------------------------------------------------------


def dlpack_device(obj: Any, what: str) -> tuple[int, int] | None:
    """``obj.__dlpack_device__()`` as (device type, device id); None when ``obj`` does not speak DLPack."""
    probe = getattr(obj, "__dlpack_device__", None)
    if probe is None or not hasattr(obj, "__dlpack__"):
        return None
    try:
        found = probe()
    except Exception as exc:  # the producer's own error, whatever it is: named, with the input
        raise InvalidValueError(f"{what}: {type(obj).__name__}.__dlpack_device__() failed "
                                f"({type(exc).__name__}: {exc})") from exc
    try:
        kind, index = found
    except (TypeError, ValueError) as exc:
        raise InvalidTypeError(f"{what}: {type(obj).__name__}.__dlpack_device__() did not give a (device type, "
                               f"device id) pair of ints: {exc}") from None
    if not (is_int(kind) and is_int(index)):
        raise InvalidTypeError(f"{what}: {type(obj).__name__}.__dlpack_device__() did not give a (device type, "
                               f"device id) pair of ints: got {found!r}")
    return int(kind), int(index)


def check_not_negated(obj: Any, what: str) -> None:
    """Refuse a torch tensor with the negative bit set (``torch._neg_view``, or the imaginary part of a
    conjugated complex tensor): its memory holds its values negated, and torch's ``__dlpack__`` hands that
    memory over as it is (it refuses only the conjugate bit). A torch tensor always speaks DLPack, so this is
    asked before its capsule (:func:`consume`). trtio never imports torch: a program that has not imported it
    holds no torch tensor."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and obj.is_neg():
        raise InvalidValueError(f"{what}: a torch tensor with the negative bit set (torch._neg_view, or the "
                                "imaginary part of a conjugated tensor): its memory holds its values negated, and "
                                "DLPack would hand that memory over as it is; pass x.resolve_neg()")


def consume(obj: Any, what: str, handle: int | None, device: tuple[int, int] | None = None) -> DLPackView:
    """Ask ``obj`` for a capsule (``handle``: the consumer's CUDA stream handle, None for host memory) and
    take it over. Producers that predate DLPack 1.0 do not take ``max_version``; they are asked again
    without it. ``device``: what ``__dlpack_device__`` said; a capsule of another device is refused (and
    handed back), since its memory would be read as the wrong kind. A negated torch tensor is refused
    first (:func:`check_not_negated`)."""
    check_not_negated(obj, what)
    exporter = obj.__dlpack__
    try:
        try:
            capsule = exporter(stream=handle, max_version=(1, 0))
        except TypeError:
            capsule = exporter(stream=handle)
    except TypeError as exc:
        raise InvalidTypeError(f"{what}: {type(obj).__name__}.__dlpack__(stream=...) failed ({exc}); trtio passes "
                               "its stream so that the producer orders its pending work before it") from None
    except (BufferError, ValueError, RuntimeError) as exc:
        raise InvalidValueError(f"{what}: {type(obj).__name__} refused to export itself through DLPack: "
                                f"{exc}") from None
    except Exception as exc:  # the producer's own error, whatever it is: named, with the input
        raise InvalidValueError(f"{what}: {type(obj).__name__}.__dlpack__() failed ({type(exc).__name__}: "
                                f"{exc})") from exc
    try:
        view = consume_capsule(capsule, obj)
    except BufferError as exc:
        raise InvalidTypeError(f"{what}: {type(obj).__name__}.__dlpack__() returned {exc}") from None
    if device is not None:
        found = (view.device_type, view.device_id)
        host = (kDLCPU, kDLCUDAHost)  # both are host memory: read alike
        same = (found[0] == device[0] or (found[0] in host and device[0] in host)) and (
            device[0] != kDLCUDA or found[1] == device[1])
        if not same:
            view.owner.release()
            raise InvalidValueError(f"{what}: {type(obj).__name__}.__dlpack_device__() says {_device_text(device)}, "
                                    f"but its capsule holds memory of {_device_text(found)}; trtio reads memory only "
                                    "where the producer says it is")
    return view


def _device_text(device: tuple[int, int]) -> str:
    return f"{_DEVICE_NAMES.get(device[0], f'DLPack device type {device[0]}')} (device {device[1]})"


def from_dlpack_device(obj: Any, what: str, device: tuple[int, int], want: DType | None,
                       ranks: tuple[int, ...] | None, be: Backend, device_ok: bool, stream: StreamLike = None, *,
                       name: str, writable: bool = False) -> Foreign:
    """A DLPack array in device memory as DEVICE memory: checked where it lives, then exported with trtio's
    stream (the producer orders its pending work before it), then checked for dtype, rank and layout (and,
    ``writable``, refused where the producer marked it read-only)."""
    _check_device(obj, what, device, be, device_ok)
    view = consume(obj, what, as_stream(stream, be).handle, device)
    if writable and view.read_only:
        raise _read_only(what)
    found = _dtype_of(view, what)
    _check_view(what, found, view.shape, want, ranks, view.is_c_contiguous)
    return _wrap(view.data, view.shape, found, Location.DEVICE, view.owner, what, be, name=name)


def _dtype_of(view: DLPackView, what: str) -> DType:
    found = _BY_DLPACK.get((view.type_code, view.bits)) if view.lanes == 1 else None
    if found is None:
        code = _CODE_NAMES.get(view.type_code, f"type code {view.type_code}")
        lanes = f" x {view.lanes} lanes" if view.lanes != 1 else ""
        raise InvalidTypeError(f"{what}: DLPack elements {code}{view.bits}{lanes} have no trtio dtype; trtio takes "
                               + ", ".join(str(d) for d in _BY_DLPACK.values()))
    return found


class _HostMemory:
    """An ``__array_interface__`` over memory a DLPack capsule gave; numpy keeps it (and so the capsule's
    owner) as the array's base."""

    __slots__ = ("__array_interface__", "_owner")

    def __init__(self, interface: dict[str, Any], owner: object) -> None:
        self.__array_interface__ = interface
        self._owner = owner


def host_array(view: DLPackView, what: str) -> np.ndarray:
    found = _dtype_of(view, what)
    _check_view(what, found, view.shape, None, None, view.is_c_contiguous)
    element = found.numpy
    if element is None:
        raise ShapeError(f"{what}: host {found} values need ml_dtypes to be read as numpy (pip install ml_dtypes)")
    if not view.data or 0 in view.shape:
        return np.empty(view.shape, element)  # nothing to read; DLPack allows a null address here
    # bf16 and fp8 have no standard typestr: read their bytes as unsigned ints, then view them as the type.
    typestr = found.typestr or f"<u{found.itemsize}"
    interface = {"shape": view.shape, "typestr": typestr, "data": (view.data, view.read_only), "strides": None,
                 "version": 3}
    array = np.asarray(_HostMemory(interface, view.owner))
    return array if array.dtype == element else array.view(element)


# -- CUDA array interface ---------------------------------------------------------------------------


def cuda_array_interface(obj: Any) -> dict[str, Any] | None:
    try:
        interface = obj.__cuda_array_interface__
    except AttributeError:  # trtio's own tensors raise it for host memory
        return None
    return interface if isinstance(interface, dict) else None


def from_cuda_array_interface(obj: Any, interface: dict[str, Any], what: str, want: DType | None,
                              ranks: tuple[int, ...] | None, be: Backend, device_ok: bool, stream: StreamLike = None,
                              *, name: str, writable: bool = False) -> Foreign:
    """A CUDA array interface (v3) array as DEVICE memory, after ordering its ``stream`` before ours
    (``writable``: refused first where the interface marks it read-only)."""
    _check_cuda(obj, what, None, be, device_ok)
    shape, found, ptr, strides, producer, read_only = _parse_interface(interface, what)
    if writable and read_only:
        raise _read_only(what)
    contiguous = strides is None or 0 in shape or all(
        dim == 1 or got == need * found.itemsize for dim, got, need in zip(shape, strides, contiguous_strides(shape)))
    _check_view(what, found, shape, want, ranks, contiguous)
    index = _pointer_device(be, ptr)
    if index is not None and index != be.device_id:
        _check_cuda(obj, what, index, be, device_ok)
    s = as_stream(stream, be)
    if producer is not None and producer != s.handle:
        _order_after(be, producer, s.handle)
    return _wrap(ptr, shape, found, Location.DEVICE, obj, what, be, name=name)


def _parse_interface(interface: dict[str, Any], what: str
                     ) -> tuple[tuple[int, ...], DType, int, tuple[int, ...] | None, int | None, bool]:
    """(shape, dtype, address, strides in bytes or None, the producer's stream or None, read-only) of a CAI
    dict."""
    def bad(detail: str) -> InvalidTypeError:
        return InvalidTypeError(f"{what}: __cuda_array_interface__ {detail}")

    try:
        shape = tuple(int(d) for d in interface["shape"])
        typestr = str(interface["typestr"])
        ptr, read_only = interface["data"]
        ptr = int(ptr or 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise bad(f"lacks a valid shape, typestr or data ({type(exc).__name__}: {exc})") from None
    if interface.get("mask") is not None:
        raise bad("has a mask; trtio takes unmasked arrays")
    try:
        found = DType.from_numpy(np.dtype(typestr))
    except (TrtioError, ValueError, TypeError):
        raise InvalidTypeError(f"{what}: elements of type {typestr!r} have no trtio dtype; trtio takes "
                               + ", ".join(repr(d.typestr) for d in DType if d.typestr)) from None
    if np.dtype(typestr).byteorder == ">":
        raise bad(f"typestr {typestr!r} is big-endian; CUDA memory is little-endian")
    strides = interface.get("strides")
    stream = interface.get("stream")
    if stream is not None:
        if isinstance(stream, bool) or not isinstance(stream, (int, np.integer)) or int(stream) <= 0:
            raise InvalidValueError(f"{what}: __cuda_array_interface__ stream {stream!r} is not a stream handle "
                                    "(v3 allows None, 1, 2 or a handle; 0 is not allowed)")
        stream = int(stream)
    return shape, found, ptr, None if strides is None else tuple(int(s) for s in strides), stream, bool(read_only)


def _pointer_device(be: Backend, ptr: int) -> int | None:
    """The CUDA device ``ptr`` belongs to, where the driver can tell (None: it cannot, or no driver)."""
    from trtio._cuda.device import CudaBackend

    if not ptr or not isinstance(be, CudaBackend):
        return None
    try:
        from cuda.bindings import driver

        err, ordinal = driver.cuPointerGetAttribute(
            driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
    except Exception:  # no driver, or a pointer CUDA does not know
        return None
    return int(ordinal) if int(err) == 0 else None


class _OrderEvent:
    """One event per thread and backend, recorded on a producer's stream and waited for by trtio's. One
    suffices: a wait takes the event as it was recorded when the wait was enqueued."""

    __slots__ = ("handle", "__weakref__")

    def __init__(self, be: Backend) -> None:
        self.handle = be.create_event()
        weakref.finalize(self, be.destroy_event, self.handle)


class _ThreadEvents(threading.local):
    def __init__(self) -> None:
        self.events: dict[int, tuple[Backend, _OrderEvent]] = {}


_thread_events = _ThreadEvents()


def _order_after(be: Backend, producer: int, consumer: int) -> None:
    """Make stream ``consumer`` wait for the work enqueued on stream ``producer`` so far (no host sync)."""
    held = _thread_events.events.get(id(be))
    if held is None or held[0] is not be:
        held = _thread_events.events[id(be)] = (be, _OrderEvent(be))
    event = held[1].handle
    be.record_event(event, producer)
    be.wait_event(consumer, event)


# -- torch's CUDA tensors, without a capsule ----------------------------------------------------------


class TorchDeviceInput:
    """A plain torch CUDA tensor of one shape and dtype on one device, read as DLPack would export it, without
    its capsule (what a steady decode fed torch's tensors reads: see :func:`torch_device_input`). Made once per
    step shape; :meth:`read` then pays only torch's public calls (no capsule), and no event where torch runs on
    the step's stream (``torch.cuda.ExternalStream(stream.handle)``)."""

    __slots__ = ("tensor_type", "_dtype", "shape", "_device", "_backend", "_current_stream", "_handle")

    def __init__(self, torch: Any, torch_dtype: Any, shape: tuple[int, ...], be: Backend) -> None:
        self.tensor_type = torch.Tensor
        self._dtype = torch_dtype
        self.shape = shape
        self._device = be.device_id
        self._backend = be
        # The device's current stream, as torch.cuda.current_stream says it: where torch has the device-generic
        # torch.accelerator.current_stream (a torch.Stream made in C, its cudaStream_t in native_handle), that one,
        # which costs a fraction of making a torch.cuda.Stream in Python at every step.
        current = getattr(getattr(torch, "accelerator", None), "current_stream", None)
        if current is not None and hasattr(getattr(torch, "Stream", None), "native_handle"):
            self._current_stream, self._handle = current, "native_handle"
        else:
            self._current_stream, self._handle = torch.cuda.current_stream, "cuda_stream"

    def read(self, obj: Any, consumer: int) -> int | None:
        """The device address of ``obj``, a plain torch tensor (the caller checked: ``type(obj) is
        reader.tensor_type``), where it is one of this shape and dtype on this device, C-contiguous at a
        256-byte aligned address (not null), with its producer's pending work (torch's current stream of the
        device) ordered before stream ``consumer`` first, as ``__dlpack__(stream=consumer)`` orders it. None,
        having done nothing, for anything else: the caller takes the general path
        (:func:`trtio._inputs.as_input`), which names what is wrong. ``get_device()`` is -1 on the host. Neither
        a gradient (DLPack refuses it) nor the negative bit (the general path refuses it:
        :func:`check_not_negated`) may be set. A tensor torch cannot say these of (a nested one has no single
        shape: torch raises RuntimeError) is passed over too."""
        try:
            if obj.get_device() != self._device or obj.dtype is not self._dtype or obj.shape != self.shape or \
                    obj.requires_grad or not obj.is_contiguous() or obj.is_neg():
                return None
            ptr: int = obj.data_ptr()
        except RuntimeError:
            return None
        if ptr % ALIGNMENT or not ptr:  # null: a tensor whose storage was resized to nothing
            return None
        producer = getattr(self._current_stream(self._device), self._handle)
        if producer != consumer:
            _order_after(self._backend, producer, consumer)
        return ptr


_TORCH_DTYPES = {DType.FLOAT32: "float32", DType.FLOAT16: "float16", DType.BFLOAT16: "bfloat16", DType.INT8: "int8",
                 DType.INT32: "int32", DType.INT64: "int64", DType.UINT8: "uint8", DType.BOOL: "bool"}


def torch_device_input(be: Backend, dtype: DType, shape: tuple[int, ...]) -> TorchDeviceInput | None:
    """The reader of torch CUDA tensors of ``shape`` and ``dtype`` on ``be``'s device (:class:`TorchDeviceInput`),
    or None where none can be: ``be`` is not the cuda backend, torch is not imported (trtio never imports it), or
    ``dtype`` has no torch dtype."""
    torch = sys.modules.get("torch")
    name = _TORCH_DTYPES.get(dtype)
    if torch is None or be.name != "cuda" or name is None or not hasattr(torch, name):
        return None
    return TorchDeviceInput(torch, getattr(torch, name), shape, be)


#: How :class:`TorchEmbeds` makes a DEVICE Tensor over a torch tensor's memory: Tensor.wrap's signature.
Wrap = Callable[..., Any]


class TorchEmbeds:
    """What a setup's steps read of the torch tensors they are fed as embeddings, ``[batch, seq, hidden]`` of its
    activation dtype (any batch and seq), without DLPack's capsule: a plain torch tensor, C-contiguous, neither
    needing a gradient nor with the negative bit, in host memory (read as a numpy view of it) or on the cuda
    backend's device (read as a DEVICE Tensor over it, at a 256-byte aligned address, its producer's pending work
    ordered before the step's stream as :class:`TorchDeviceInput` orders it). :meth:`read` pays only torch's public
    calls; the view of a tensor read before at the same address and shape is the one made then, so a runtime that
    feeds the same buffers every round makes no new object (the views of the last :attr:`KEPT` tensors are kept,
    and with them those tensors, as a setup keeps the inputs its calls read). Anything else is passed over (None)
    to the general path (:func:`trtio._inputs.as_embeds`), which converts it or names what is wrong with it."""

    KEPT = 4

    __slots__ = ("tensor_type", "_dtype", "_trtio", "_numpy", "_bits", "_device", "_backend", "_wrap",
                 "_current_stream", "_handle", "_made")

    def __init__(self, torch: Any, torch_dtype: Any, dtype: DType, be: Backend, wrap: Wrap) -> None:
        self.tensor_type = torch.Tensor
        self._dtype = torch_dtype
        self._trtio = dtype
        self._wrap = wrap  # Tensor.wrap (trtio._tensor imports this module)
        self._numpy = dtype.numpy  # None: numpy cannot hold it (host tensors go the general way)
        # numpy has no bfloat16 of its own: such host tensors are read as int16 and viewed as ml_dtypes' type
        self._bits = torch.int16 if dtype is DType.BFLOAT16 else None
        self._device = be.device_id if be.name == "cuda" else None  # the CUDA device read in place (None: none)
        self._backend = be
        current = getattr(getattr(torch, "accelerator", None), "current_stream", None)
        if current is not None and hasattr(getattr(torch, "Stream", None), "native_handle"):
            self._current_stream, self._handle = current, "native_handle"
        else:
            self._current_stream, self._handle = getattr(torch.cuda, "current_stream", None), "cuda_stream"
        self._made: dict[int, tuple[Any, int, tuple[int, ...], Any]] = {}  # id -> (tensor, address, shape, view)

    def read(self, obj: Any, hidden: int, stream: StreamLike = None) -> Any:
        """``obj`` (the caller checked: ``type(obj) is reader.tensor_type``) as the step reads it: a numpy view of
        host memory, or a DEVICE Tensor over the device's memory with its producer (torch's current stream of the
        device) ordered before ``stream`` first; None, having done nothing, for anything else. A tensor torch
        cannot say these of (a nested one has no single shape: torch raises RuntimeError) is passed over too."""
        try:
            shape = obj.shape
            if len(shape) != 3 or shape[2] != hidden or obj.dtype is not self._dtype or obj.requires_grad or \
                    not obj.is_contiguous() or obj.is_neg():
                return None
            device = obj.get_device()
            ptr: int = obj.data_ptr()
        except RuntimeError:
            return None
        on_device = device == self._device
        if not on_device and (device != -1 or not obj.is_cpu):  # another device, or no memory (meta)
            return None
        found = self._made.get(id(obj))  # kept with its tensor: the id is that tensor's
        if found is not None and found[1] == ptr and found[2] == shape:
            view = found[3]
        else:
            view = self._view(obj, ptr, tuple(shape), on_device)
            if view is None:
                return None
        if on_device:
            producer = getattr(self._current_stream(device), self._handle)
            consumer = as_stream(stream, self._backend).handle
            if producer != consumer:
                _order_after(self._backend, producer, consumer)
        return view

    def _view(self, obj: Any, ptr: int, shape: tuple[int, ...], on_device: bool) -> Any:
        """The view of ``obj`` read the first time (kept, with ``obj``, among the last :attr:`KEPT`); None where it
        cannot be made here (a null or unaligned device address, a host dtype numpy cannot hold)."""
        view: Any
        if on_device:
            if not ptr or ptr % ALIGNMENT:
                return None
            view = self._wrap(ptr, shape, self._trtio, Location.DEVICE, obj, name="inputs_embeds",
                              backend=self._backend)
        elif self._numpy is None:
            return None
        else:
            view = obj.numpy() if self._bits is None else obj.view(self._bits).numpy().view(self._numpy)
        made = self._made
        made.pop(id(obj), None)  # what it was before (another address or shape)
        if len(made) >= self.KEPT:
            del made[next(iter(made))]  # the oldest
        made[id(obj)] = (obj, ptr, shape, view)
        return view


def torch_embeds(be: Backend, dtype: DType, wrap: Wrap) -> TorchEmbeds | None:
    """The reader of torch embeddings of ``dtype`` for a setup on ``be`` (:class:`TorchEmbeds`; ``wrap``:
    :meth:`Tensor.wrap <trtio._tensor.Tensor.wrap>`), or None where torch is not imported (trtio never imports it)
    or ``dtype`` has no torch dtype."""
    torch = sys.modules.get("torch")
    name = _TORCH_DTYPES.get(dtype)
    if torch is None or name is None or not hasattr(torch, name):
        return None
    return TorchEmbeds(torch, getattr(torch, name), dtype, be, wrap)


# -- results ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Foreign:
    """A foreign array's memory, read in place: where it is, its shape and dtype, the backend it belongs to,
    and the object that keeps it alive (a tensor made of it must hold ``owner``)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: DType
    location: Location
    owner: object
    backend: Backend
    name: str


def _wrap(ptr: int, shape: tuple[int, ...], dtype: DType, location: Location, owner: object, what: str,
          be: Backend, *, name: str) -> Foreign:
    nbytes = dtype.nbytes(int(np.prod(shape, dtype=np.int64)))
    if location is not Location.HOST and nbytes and ptr % ALIGNMENT:
        raise InvalidValueError(
            f"{what}: its address 0x{ptr:x} is not {ALIGNMENT}-byte aligned (off by {ptr % ALIGNMENT}: a view into "
            f"another array?); trtio tensors need {ALIGNMENT}-byte aligned {location} addresses: pass an array of its "
            "own (torch: .clone(), CuPy: .copy())")
    return Foreign(ptr if nbytes else 0, shape, dtype, location, owner, be, name)


def asarray(obj: Any, what: str) -> np.ndarray:
    """Anything else (lists, scalars, objects numpy reads) as numpy; what numpy cannot make an array of
    numbers from is refused."""
    try:
        array = np.asarray(obj)
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"{what}: cannot read {type(obj).__name__} as an array ({exc})") from None
    if array.dtype.kind not in "biuf" and _numpy_family(array.dtype) is None:
        raise InvalidTypeError(f"{what}: expected an array of numbers (numpy, a list, or any array with __dlpack__ or "
                               f"__cuda_array_interface__), got {type(obj).__name__} (read as {array.dtype})")
    return array
