"""DecodePlan: what a checked decode laid out, kept for the decodes after it (``docs/architecture.md``, "Steps").

A decode of every active sequence is checked in full once (slots, shapes, capacity, pages), stages its inputs
and leaves a :class:`DecodePlan`: its dims, the device work before its engine, the slots it advances and how
many more steps it stays valid (``room``: no page to take, within the KV capacity). The next decode whose plan
still holds runs it as it is, fed only its embeddings (and the device tensor of a family's step input whose split
the plan's work runs, :meth:`DecodePlan.takes`: Gemma 4's per-layer embeddings); :class:`~trtio._setups.llm.LLMSetup`
has one run path for both (``LLMSetup._run_plan``).

One question tells whether a plan holds: has the setup's version moved since it was made (:meth:`DecodePlan.holds`)?
The version (``SetupBase._epoch``) moves on with every call of the setup but a steady decode: an admission, a
release, a prefill, a reset, a snapshot, a streaming snapshot, a step that broke the setup, close; nothing else
writes what a plan rests on (the engine's host lengths, which only a run of the plan advances; the step block, which
only checked calls upload). A plan also knows what the step block holds after it ran (:meth:`DecodePlan.block_holds`),
so the checked decode after it (its room spent: a page to take) stages nothing its runs left current: one record of
what the device holds, the plan's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from trtio._dims import InferenceDims
from trtio._engine import DeviceWork
from trtio._foreign import TorchDeviceInput
from trtio._stream import Stream
from trtio._tensor import Tensor

__all__ = ["DecodePlan", "TorchReader"]

#: Where a plan gets the reader of torch CUDA tensors of its embeddings' shape (None: torch is not in use).
TorchReader = Callable[[tuple[int, int, int]], "TorchDeviceInput | None"]


class DecodePlan:
    """A decode of ``slots`` as a checked decode laid it out (see the module docstring).

    The lengths of the plan's slots grow by one per run: added to the lengths array's bytes as one little-endian
    number with a 1 in each of those slots' 64-bit lanes (no lane nears 2**63), an eighth of a numpy call's cost.
    """

    __slots__ = ("version", "shape", "dtype", "dst", "embeds_nbytes", "near", "far", "array", "bytes_view", "nbytes",
                 "lengths", "value", "ones", "room", "work", "dims", "uploads", "key", "torch", "held")

    def __init__(self, version: int, shape: tuple[int, int, int], dst: Tensor, array: np.ndarray,
                 slots: list[int], room: int, work: tuple[DeviceWork, ...], dims: InferenceDims,
                 uploads: int, held: Tensor | None = None, key: tuple[int, ...] | None = None) -> None:
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
        self.key = key  # the step's slots as the setup keys them (None: slots 0 .. batch - 1, unslotted)
        self.torch: TorchDeviceInput | None = None  # the reader of torch tensors of its embeddings, once fed one
        # A family's device input whose split into the engine's inputs is part of ``work`` (address, shape, dtype):
        # the plan takes that tensor; None where the plan's work splits none
        self.held = (held._ptr, held._shape, held._dtype) if held is not None else None

    def holds(self, version: int) -> bool:
        """Whether the next decode of every active sequence is this plan's: the setup's version is still ``version``
        and the plan has room left (see the module docstring)."""
        return self.version == version and self.room > 0

    def block_holds(self, uploads: int, batch: int, key: tuple[int, ...] | None) -> bool:
        """Whether the step block holds this plan's decode inputs for a decode of ``batch`` sequences of slots ``key``
        (the block uploaded ``uploads`` times so far), the device's copy of the lengths equal to the host's: nothing
        uploaded since the plan's step (no other step used the block), the same sequences, and the host's lengths
        those its last run left (its runs advance both alike)."""
        return uploads == self.uploads and batch == self.shape[0] and key == self.key \
            and self.array.tobytes() == self.lengths

    def takes(self, x: Any) -> bool:
        """Whether ``x`` (a decode's family input) is the device tensor whose split the plan's work runs: a Tensor at
        the same address, of the same shape and dtype, open."""
        held = self.held
        return held is not None and type(x) is Tensor and x._ptr == held[0] and x._shape == held[1] \
            and x._dtype is held[2] and not x._closed

    def read(self, x: Any, s: Stream, torch_reader: TorchReader) -> Any:
        """``x`` as this plan's embeddings, with its producer ordered before ``s``: the Tensor itself (of the
        plan's shape and dtype), the device address of a torch CUDA tensor (read through its public attributes,
        :class:`~trtio._foreign.TorchDeviceInput`) or a C-contiguous numpy array; None for anything else (the
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
            reader = self.torch = torch_reader(self.shape)
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

