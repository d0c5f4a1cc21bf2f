"""Foreign arrays in: step inputs from torch, CuPy, JAX, numpy or anything that speaks DLPack or CUDA's array
interface, read in place.

:func:`as_input` is what a step calls on each array argument it takes (embeddings, trees, paths, lengths,
deepstack features). It accepts:

* a numpy array, a list or a scalar: returned as numpy, as they are (the caller converts host data, as it
  always has);
* a trtio :class:`~trtio.tensor.Tensor`: returned as it is;
* any object with ``__dlpack__`` and ``__dlpack_device__`` (torch, CuPy, JAX, numpy >= 1.22) or with
  ``__cuda_array_interface__`` (v3): read without a copy. Host memory (DLPack's kDLCPU and kDLCUDAHost)
  comes back as a numpy view; CUDA memory as a non-owning :class:`~trtio.tensor.Tensor` on the backend's
  device, which a step binds in place where it can and otherwise copies device to device on its stream.
  Either keeps the producer's memory alive for as long as it is referenced.

Foreign arrays are read in place, so they must be C-contiguous; device arrays are never converted, so
their dtype must be the binding's. Everything that can be checked is checked before anything happens, and
a refusal names the input: another CUDA device than the backend's, CUDA memory on the host backend or for
an input the host reads, a wrong dtype, a wrong rank, a strided view (:class:`~trtio.errors.ShapeError`
for dtype and shape, :class:`~trtio.errors.InvalidValueError` for memory in the wrong place,
:class:`~trtio.errors.InvalidTypeError` for an object that is no array). What the producer will not export
is refused with its reason (torch: a tensor that needs a gradient, a conjugated one); trtio also refuses a
torch tensor with the negative bit set, whose memory holds its values negated, which torch's DLPack export
hands over as it is.

Stream order. The producer's pending writes are ordered before trtio's stream, never by synchronising the
host: DLPack's ``__dlpack__(stream=trtio's stream handle)`` asks the producer to make that stream wait for
its work, and a CUDA array interface ``stream`` makes trtio's stream wait for it through an event. DLPack
gives a capsule's dtype and shape only after that handshake, so a DLPack refusal can follow it; the
handshake only orders trtio's stream and changes no data. A steady decode (``LLMSetup.decode``) fed a plain
torch CUDA tensor of its shape and dtype reads it without a capsule (:class:`trtio.foreign.TorchDeviceInput`):
torch's current stream is ordered before trtio's by an event, and needs none where it is trtio's stream. A
tensor like the last one read is recognised in one call, the input check of ``torch.compile`` (a private
torch API, used only where it passes trtio's own test of it); any other is checked through torch's public
attributes.

Lifetime. A step reads a device input asynchronously on its stream: keep the array, and do not write it,
until that work has run. The simplest way is to produce inputs on trtio's stream itself (torch:
``with torch.cuda.stream(torch.cuda.ExternalStream(stream.handle))``), where the producer's allocator
reuses memory in that stream's order.

In place. Embeddings written straight into the step's own input, through a view of its bytes
(``torch.from_dlpack(setup.io.inputs_embeds.reshape(shape))``, written with ``out=`` or ``copy_``), and handed
over as that view, are read where they are: no copy. Write them after the last step that read them, in that
step's stream order (again: torch on trtio's stream).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio._dlpack import kDLCPU, kDLCUDAHost
from trtio.cuda.backend import Backend, Location, get_backend
from trtio.dtypes import DType, DTypeLike
from trtio.errors import InvalidValueError, ShapeError
from trtio.foreign import (
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
from trtio.stream import StreamLike
from trtio.tensor import Tensor

__all__ = ["as_input"]


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
