"""DecodePlan: what a checked decode laid out, kept for the decodes after it (``docs/architecture.md``, "Steps").

A decode of every active sequence is checked in full once (slots, shapes, capacity, pages), stages its inputs
and leaves a :class:`DecodePlan`: its dims, the device work before its engine, the slots it advances and how
many more steps it stays valid (``room``: no page to take, within the KV capacity). The next decode whose plan
still holds runs it as it is, fed only its embeddings (Gemma 4: and the device PLE tensor whose split the plan's
work runs, :meth:`DecodePlan.takes_ple`); :class:`~trtio.setups.llm.LLMSetup` has one run path
for both (``LLMSetup._run_plan``).

A plan holds while nothing changed since it was made: the setup's version (``SetupBase._epoch``: every other
call of the setup moves it on: an admission, a release, a prefill, a reset, a snapshot), the engine's host
lengths (only a run of the plan advances them), the step block's uploads (only the plan's own step may have
written the block) and no streaming snapshot waiting to be ordered.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from trtio.dims import InferenceDims
from trtio.engine import DeviceWork
from trtio.foreign import TorchDeviceInput
from trtio.stream import Stream
from trtio.tensor import Tensor


class Planned(Protocol):
    """What a plan reads of its setup (an :class:`~trtio.setups.llm.LLMSetup`) to tell whether it holds."""

    _epoch: int
    _broken: str | None
    _closed: bool
    _streaming_pending: bool

    @property
    def _host_lengths(self) -> np.ndarray: ...

    @property
    def _uploads(self) -> int: ...

    def _torch_reader(self, shape: tuple[int, int, int]) -> TorchDeviceInput | None: ...

__all__ = ["DecodePlan", "Planned"]


class DecodePlan:
    """A decode of ``slots`` as a checked decode laid it out (see the module docstring).

    The lengths of the plan's slots grow by one per run: added to the lengths array's bytes as one little-endian
    number with a 1 in each of those slots' 64-bit lanes (no lane nears 2**63), an eighth of a numpy call's cost.
    """

    __slots__ = ("version", "shape", "dtype", "dst", "embeds_nbytes", "near", "far", "array", "bytes_view", "nbytes",
                 "lengths", "value", "ones", "room", "work", "dims", "uploads", "torch", "ple")

    def __init__(self, version: int, shape: tuple[int, int, int], dst: Tensor, array: np.ndarray,
                 slots: list[int], room: int, work: tuple[DeviceWork, ...], dims: InferenceDims,
                 uploads: int, ple: Tensor | None = None) -> None:
        assert array.dtype == np.int64 and array.flags.c_contiguous and array.ndim == 1
        self.version = version
        self.shape = shape  # the embeddings a step takes
        self.dtype = dst.dtype.numpy  # their numpy dtype (host inputs)
        self.dst = dst  # io.inputs_embeds: given itself, written in place by the caller
        self.embeds_nbytes = dst.dtype.nbytes(shape[0] * shape[1] * shape[2])  # the bytes a step's embeddings hold
        # Embeddings at an address strictly between these overlap dst's (partly_over, where they are not dst's own)
        self.near, self.far = dst.data_ptr - self.embeds_nbytes, dst.data_ptr + self.embeds_nbytes
        self.array = array  # the engine's host lengths (every slot)
        self.bytes_view = array.data.cast("B")
        self.nbytes = array.nbytes
        self.lengths = array.tobytes()  # as the last run left them
        self.value = int.from_bytes(self.lengths, "little")  # the same, as one number
        self.ones = sum(1 << (64 * slot) for slot in slots)  # a 1 in the lane of each of the plan's slots
        self.room = room  # runs left before a page to take or the KV capacity
        self.work = work  # the device work before the engine
        self.dims = dims
        self.uploads = uploads  # the step block's uploads after the plan's step staged it
        self.torch: TorchDeviceInput | None = None  # the reader of torch tensors of its embeddings, once fed one
        # Gemma 4: the device per-layer embeddings whose split into the layers' inputs is part of ``work`` (address,
        # shape, dtype); None where the plan's work gathers none
        self.ple = (ple._ptr, ple._shape, ple._dtype) if ple is not None else None

    def holds(self, setup: Planned) -> bool:
        """Whether the next decode of every active sequence of ``setup`` is this plan's (see module docstring)."""
        lengths = self.array
        return self.version == setup._epoch and self.room > 0 and setup._host_lengths is lengths \
            and lengths.tobytes() == self.lengths and setup._broken is None and not setup._closed \
            and setup._uploads == self.uploads and not setup._streaming_pending

    def takes_ple(self, x: Any) -> bool:
        """Whether ``x`` (a decode's ``ple_embeds``) is the device tensor whose split the plan's work runs: a
        Tensor at the same address, of the same shape and dtype, open."""
        ple = self.ple
        return ple is not None and type(x) is Tensor and x._ptr == ple[0] and x._shape == ple[1] \
            and x._dtype is ple[2] and not x._closed

    def read(self, x: Any, s: Stream, setup: Planned) -> Any:
        """``x`` as this plan's embeddings, with its producer ordered before ``s``: the Tensor itself (of the
        plan's shape and dtype), the device address of a torch CUDA tensor (read through its public attributes,
        :class:`~trtio.foreign.TorchDeviceInput`) or a C-contiguous numpy array; None for anything else (the
        decode is then checked in full, which names what is wrong or converts it)."""
        kind = type(x)
        if kind is Tensor:  # io.inputs_embeds written in place, or a device tensor of the same kind
            if x._shape != self.shape or x is not self.dst and (
                    x._dtype is not self.dst._dtype or x._backend is not self.dst._backend or x._closed):
                return None
            if x is not self.dst and x._last_stream is not None:
                x._order_consumer(s._handle)
            return x
        if kind is np.ndarray:
            if x.shape != self.shape or x.dtype != self.dtype or not x.flags.c_contiguous:
                return None
            return x
        reader = self.torch
        if reader is None:
            reader = self.torch = setup._torch_reader(self.shape)
        if reader is None or kind is not reader.tensor_type:
            return None
        return reader.read(x, s._handle)  # None: not one the plan takes as it is

    def advance(self) -> bytes:
        """A run of the plan succeeded: its slots' lengths grow by one (host array and the plan's record of it);
        one run less is left. Returns the lengths array's bytes now."""
        value = self.value + self.ones
        now = value.to_bytes(self.nbytes, "little")
        self.value = value
        self.lengths = now
        self.bytes_view[:] = now
        self.room -= 1
        return now

