"""Step inputs: what a step is given, checked and taken as it is or converted, before any work.

:func:`as_input` is what a step calls on each array argument it takes (embeddings, trees, paths, lengths,
deepstack features). It accepts:

* a numpy array, a list or a scalar: returned as numpy, as they are (the caller converts host data);
* a trtio :class:`~trtio._tensor.Tensor`: returned as it is;
* any object with ``__dlpack__`` and ``__dlpack_device__`` (torch, CuPy, JAX, numpy >= 1.22) or with
  ``__cuda_array_interface__`` (v3), read without a copy (:mod:`trtio._foreign`). Host memory (DLPack's kDLCPU and
  kDLCUDAHost) comes back as a numpy view; CUDA memory as a non-owning :class:`~trtio._tensor.Tensor` on the
  backend's device, which a step binds in place where it can and otherwise copies device to device on its
  stream. Either keeps the producer's memory alive for as long as it is referenced.

:func:`as_embeds`, :func:`host_input` and :func:`check_lengths` are the setups' checks of embeddings, of the inputs
the host reads while it lays a step out, and of lengths; :func:`not_partly_over` refuses embeddings that overlap
the buffer they are copied into.

Foreign arrays are read in place, so they must be C-contiguous; device arrays are never converted, so their dtype
must be the binding's. Everything that can be checked is checked before anything happens, and a refusal names the
input: another CUDA device than the backend's, CUDA memory on the host backend or for an input the host reads, a
wrong dtype, a wrong rank, a strided view (:class:`~trtio.errors.ShapeError` for dtype and shape,
:class:`~trtio.errors.InvalidValueError` for memory in the wrong place, :class:`~trtio.errors.InvalidTypeError`
for an object that is no array). What the producer will not export is refused with its reason (torch: a tensor
that needs a gradient, a conjugated one); trtio also refuses a torch tensor with the negative bit set, whose
memory holds its values negated, which torch's DLPack export hands over as it is.

Stream order. The producer's pending writes are ordered before trtio's stream, never by synchronising the host:
DLPack's ``__dlpack__(stream=trtio's stream handle)`` asks the producer to make that stream wait for its work, and
a CUDA array interface ``stream`` makes trtio's stream wait for it through an event. DLPack gives a capsule's
dtype and shape only after that handshake, so a DLPack refusal can follow it; the handshake only orders trtio's
stream and changes no data. A planned decode (``LLMSetup.decode``) fed a plain torch CUDA tensor of its shape and
dtype reads it without a capsule, through torch's public attributes (:class:`trtio._foreign.TorchDeviceInput`):
torch's current stream is ordered before trtio's by an event, and needs none where it is trtio's stream. Every other
step fed embeddings as a plain torch tensor of the activation dtype (host or CUDA memory; the spec phases, a prefill)
reads it the same way (:class:`trtio._foreign.TorchEmbeds`), and a buffer fed again costs no new object.

Lifetime. A step keeps every input it does not own (the object given) referenced until the copies it enqueued
to read it have run (``docs/architecture.md``, "Rules every module follows"): the caller may drop it as soon as
the call returns. Writing into it again is the caller's to order after the step (produce inputs on trtio's
stream itself, torch: ``with torch.cuda.stream(torch.cuda.ExternalStream(stream.handle))``).

In place. Embeddings written straight into the step's own input, through a view of its bytes
(``torch.from_dlpack(setup.io.inputs_embeds.reshape(shape))``, written with ``out=`` or ``copy_``), and handed
over as that view, are read where they are: no copy. Write them after the last step that read them, in that
step's stream order (again: torch on trtio's stream).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from trtio._cuda.backend import Backend, Location, get_backend
from trtio._dlpack import kDLCPU, kDLCUDAHost
from trtio._dtypes import DType, DTypeLike
from trtio._foreign import (
    Foreign,
    asarray,
    check_host,
    check_rank,
    consume,
    cuda_array_interface,
    dlpack_device,
    from_cuda_array_interface,
    from_dlpack_device,
    host_array,
    rank_set,
)
from trtio._stream import StreamLike
from trtio._tensor import Tensor, overlap_error, partly_over
from trtio.errors import InvalidValueError, ShapeError

__all__ = ["as_embeds", "as_input", "check_lengths", "host_input", "is_device_array", "ml_max",
           "not_partly_over"]


# -- the adapter ------------------------------------------------------------------------------------


def as_input(obj: Any, what: str, stream: StreamLike = None, *, dtype: DTypeLike | None,
             ndim: int | tuple[int, ...] | None, backend: Backend | str | None,
             device_ok: bool = True) -> np.ndarray | Tensor:
    """``obj`` as a step input named ``what``: a numpy array (host data) or a Tensor (device data).

    ``dtype`` is the binding's element type: a device array must have it; host data must be of its kind
    (floating, integer or bool) and is returned unconverted. None accepts any dtype. ``ndim`` is the rank
    (or the ranks) the input may have; None accepts any. ``backend`` is the setup's, ``stream`` the
    stream the step runs on (trtio's stream that foreign producers order their pending work before).
    ``device_ok=False`` is for inputs the host reads (lengths, trees): device memory is refused there, since
    reading it would synchronise, and the result is always a numpy array.

    Nothing is copied and the host is never synchronised; see the module docstring for what is refused,
    stream order and lifetime.
    """
    be = get_backend(backend)
    want = None if dtype is None else DType.coerce(dtype)
    found_ranks = rank_set(ndim)
    if isinstance(obj, Tensor):
        return _checked_tensor(obj, what, want, found_ranks, be, device_ok)
    if isinstance(obj, np.ndarray):
        check_host(obj, what, want, found_ranks)
        return obj
    device = dlpack_device(obj, what)
    if device is not None:
        if device[0] in (kDLCPU, kDLCUDAHost):
            array = host_array(consume(obj, what, None, device), what)
            check_host(array, what, want, found_ranks)
            return array
        return _tensor(from_dlpack_device(obj, what, device, want, found_ranks, be, device_ok, stream, name=what))
    interface = cuda_array_interface(obj)
    if interface is not None:
        return _tensor(from_cuda_array_interface(obj, interface, what, want, found_ranks, be, device_ok, stream,
                                                 name=what))
    array = asarray(obj, what)
    check_host(array, what, want, found_ranks)
    return array


def _checked_tensor(t: Tensor, what: str, want: DType | None, ranks: tuple[int, ...] | None, be: Backend,
                    device_ok: bool) -> np.ndarray | Tensor:
    """A trtio tensor as it is; for an input the host reads, a numpy view of its host memory."""
    shape = t.shape  # checks that it is open
    if t.backend is not be:
        raise InvalidValueError(f"{what}: tensor {t.name!r} belongs to the {t.backend.name} backend, the step runs on "
                                f"the {be.name} backend")
    if want is not None and t.dtype is not want:
        raise ShapeError(f"{what}: expected {want} elements, got tensor {t.name!r} of {t.dtype}")
    check_rank(what, shape, ranks)
    if device_ok:
        return t
    if t.location is Location.DEVICE:
        raise InvalidValueError(f"{what}: tensor {t.name!r} is in device memory, but the host reads this input when "
                                "it lays out the step (reading device memory would synchronise); pass it in host "
                                "memory (numpy, a HOST or PINNED tensor)")
    return np.asarray(t)




def _tensor(f: Foreign) -> Tensor:
    return Tensor.wrap(f.ptr, f.shape, f.dtype, f.location, f.owner, name=f.name, backend=f.backend)


# -- the setups' checks ---------------------------------------------------------------------------------


def not_partly_over(x: Tensor, what: str, dst: Tensor, onto: str) -> None:
    """Refuse device embeddings ``x`` whose bytes overlap ``dst`` (the step's buffer they are copied into) without
    starting at its address: the step would copy them onto themselves in part (see
    :func:`~trtio._tensor.partly_over`). At its address they are read in place."""
    if partly_over(x._ptr, dst._ptr, x._nbytes):
        raise overlap_error(what, x._ptr, dst._ptr, x._nbytes, onto)


def as_embeds(x: Any, what: str, dtype: DType, hidden: int, backend: Backend, stream: StreamLike = None) -> Any:
    """Embeddings ``x`` ([batch, seq, hidden]) checked: a device array (a Tensor, or any foreign array read in
    place through DLPack or CUDA's array interface, its producer's work ordered before ``stream``) must be of
    ``dtype``; host data is converted to it (refusing values the conversion would turn into inf or NaN)."""
    if not isinstance(x, (np.ndarray, Tensor)) and (hasattr(x, "__dlpack__") or hasattr(x, "__cuda_array_interface__")):
        x = as_input(x, what, stream, dtype=dtype if is_device_array(x) else None, ndim=3, backend=backend)
    if isinstance(x, Tensor):
        shape = x.shape  # checks it is open
        if x.dtype is not dtype or len(shape) != 3 or shape[2] != hidden:
            raise ShapeError(f"{what}: expected a [batch, seq, {hidden}] {dtype} tensor, got {shape} {x.dtype}")
        return x
    arr = np.asarray(x)
    if arr.ndim != 3 or arr.shape[2] != hidden:
        raise ShapeError(f"{what}: expected shape [batch, seq, {hidden}], got {arr.shape}")
    want = dtype.numpy
    if want is not None and arr.dtype != want:
        if arr.dtype.kind != "f":
            raise ShapeError(f"{what}: expected {dtype} values, got {arr.dtype}")
        # A conversion must not turn values into inf or NaN silently (1e6 overflows float16).
        top = float(np.finfo(want).max) if want.kind == "f" else float(ml_max(want))
        bad = ~np.isfinite(arr) | (np.abs(arr) > top)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InvalidValueError(f"{what}{list(where)} = {arr[where]!r} is not a finite {dtype} value (|x| <= "
                                    f"{top:g}); converting {arr.dtype} to {dtype} would make it inf or NaN")
        arr = arr.astype(want)
    return np.ascontiguousarray(arr)


def is_device_array(x: Any) -> bool:
    """Whether an input (a trtio Tensor or a foreign array) lives in device memory (then it is never converted)."""
    if isinstance(x, Tensor):
        return x.location is Location.DEVICE
    probe = getattr(x, "__dlpack_device__", None)
    if probe is not None:
        try:
            return int(probe()[0]) not in (kDLCPU, kDLCUDAHost)
        except Exception:  # noqa: BLE001 - as_input names what is wrong with it
            return True
    return hasattr(x, "__cuda_array_interface__")


def ml_max(dtype: np.dtype) -> float:
    """The largest finite value of an ml_dtypes float type (bfloat16, float8)."""
    import ml_dtypes

    return float(cast(Any, ml_dtypes).finfo(dtype).max)  # ml_dtypes' finfo is untyped


def host_input(obj: Any, what: str, backend: Backend | str | None) -> Any:
    """An input the host reads when it lays a step out (lengths, trees, parents, paths): Python and numpy
    values as they are; a foreign array in host memory (a CPU torch tensor) as a numpy view; device
    memory refused (reading it would synchronise), naming ``what``."""
    if isinstance(obj, (np.ndarray, list, tuple, int)) or not (
            hasattr(obj, "__dlpack__") or hasattr(obj, "__cuda_array_interface__")):
        return obj  # the step's own checks read it, and name what is wrong with it
    return as_input(obj, what, dtype=None, ndim=None, backend=backend, device_ok=False)


def check_lengths(ctx: Any, batch: int, limit: int, what: str) -> np.ndarray:
    """``ctx`` (host data) as ``batch`` int64 lengths, each in 1..``limit``; ShapeError naming ``what``."""
    arr = np.asarray(ctx)
    if arr.shape != (batch,) or arr.dtype.kind not in "iu":
        raise ShapeError(f"{what}: expected {batch} integer lengths (one per sequence), "
                         f"got {arr.dtype} {arr.shape}")
    if arr.size and (arr.min() < 1 or arr.max() > limit):
        bad = int(np.flatnonzero((arr < 1) | (arr > limit))[0])
        raise ShapeError(f"{what}[{bad}] = {int(arr[bad])} is outside 1..{limit}")
    return arr.astype(np.int64)
