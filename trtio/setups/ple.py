"""Gemma 4's per-layer embeddings: what a step's ``ple_embeds=`` fills (the engine's ``ple_token_embeds_i``).

A step gives each token's row ``[batch, seq, L x ple_hidden]`` (host numpy, or a device Tensor such as
:class:`~trtio.embeddings.TokenEmbeddings` gathers); :class:`PleInputs` checks it against the engine's inputs and
copies each layer's columns into its input on the step's stream, before the engine: a device row block by a
:class:`~trtio.gemma4.PleSplit` (kept per source address; a decode makes it part of its plan's device work, so a
steady decode replays it inside the decode's graph), host rows one copy per layer. What a copy reads is kept until
it has run (:meth:`Calls.read <trtio.setups.calls.Calls.read>`).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from trtio import names
from trtio._cache import BoundedCache
from trtio.config import LLMEngineConfig
from trtio.cuda.backend import Backend
from trtio.engine import DeviceWork
from trtio.errors import ShapeError
from trtio.gemma4 import PleSplit, split_ple
from trtio.pipeline_io import PipelineIO
from trtio.setups.calls import Calls
from trtio.setups.decode_plan import DecodePlan
from trtio.stream import Stream, StreamLike
from trtio.tensor import Tensor

__all__ = ["PleInputs", "Staging"]


class Staging(Protocol):
    """What :meth:`PleInputs.prepare` uses of a setup (:class:`~trtio.setups.base.SetupBase`)."""

    _calls: Calls

    def _refuse_unusable(self) -> None: ...

    def _stream(self, stream: StreamLike) -> Stream: ...


class PleInputs:
    """The per-layer embedding inputs of one LLM setup's engine (none where its config has no PLE)."""

    def __init__(self, io: PipelineIO, cfg: LLMEngineConfig, backend: Backend) -> None:
        self._io, self._backend = io, backend
        g = cfg.gemma4
        self._g = g if g is not None and g.has_ple else None
        self._splits: BoundedCache[tuple[int, int], PleSplit] = BoundedCache()  # device rows -> the layers
        # A decode's work with a split after it, one tuple per pair (a graph is found by its work's identity)
        self._works: BoundedCache[tuple[tuple[DeviceWork, ...], PleSplit], tuple[DeviceWork, ...]] = BoundedCache()

    def wanted(self, ple_embeds: Any) -> bool:
        """Whether the engine takes per-layer embeddings; ``ple_embeds`` given to one that does not is refused."""
        if self._g is None and ple_embeds is not None:
            raise ShapeError("ple_embeds: given, but the engine has no per-layer embedding inputs (ple_token_embeds_i)")
        return self._g is not None

    def prepare(self, ple_embeds: Any, inputs_embeds: Any, setup: Staging, stream: StreamLike = None, *,
                now: bool = False) -> PleSplit | None:
        """A step of ``setup``'s: where the engine takes per-layer embeddings (:meth:`wanted`), a closed or broken
        setup is refused before anything is copied, then :meth:`stage` on the step's stream; a device tensor's
        split is enqueued ``now`` or returned to the caller (a decode: in its plan's work)."""
        if not self.wanted(ple_embeds):
            return None
        setup._refuse_unusable()
        s = setup._stream(stream)
        split = self.stage(ple_embeds, inputs_embeds, s, setup._calls)
        if split is not None and now:
            split.enqueue(s)
        return split

    def stage(self, ple_embeds: Any, inputs_embeds: Any, s: Stream, calls: Calls) -> PleSplit | None:
        """Check ``ple_embeds`` against a step's ``inputs_embeds`` (their batch and seq) and copy each layer's
        columns into its input on ``s`` (only where :meth:`wanted`): host rows now, one copy per layer; a device
        Tensor's through the :class:`~trtio.gemma4.PleSplit` returned (its producer ordered before ``s``, the tensor
        kept until read), which the caller enqueues on ``s`` before the engine (or makes part of a decode plan's
        work, captured with the engine)."""
        g = self._g
        assert g is not None
        width = g.ple_layers * g.ple_hidden
        rows = (tuple(inputs_embeds.shape) if hasattr(inputs_embeds, "shape") else np.shape(inputs_embeds))[:2]
        if ple_embeds is None:
            raise ShapeError(f"ple_embeds: required by the engine's ple_token_embeds_0 .. {g.ple_layers - 1} inputs: "
                             f"give each token's row, [batch, seq, {g.ple_layers} x {g.ple_hidden} = {width}]")
        shape = tuple(ple_embeds.shape) if hasattr(ple_embeds, "shape") else np.shape(ple_embeds)
        if len(rows) != 2 or shape != (*rows, width):
            raise ShapeError(f"ple_embeds: expected [batch, seq, {width}] = {[*rows, width]} (the inputs_embeds' "
                             f"batch and seq), got {list(shape)}")
        n = int(rows[0]) * int(rows[1])
        dtype = self._io.inputs_embeds.dtype
        if isinstance(ple_embeds, Tensor):  # on the device (TokenEmbeddings): every layer's columns in one launch
            if ple_embeds.dtype != dtype:
                raise ShapeError(f"ple_embeds: expected {dtype}, got {ple_embeds.dtype}")
            calls.read(ple_embeds)
            key = (ple_embeds.data_ptr, n)
            split = self._splits.get(key)
            if split is None:
                dsts = tuple(self._io.member(names.ple_token_embeds(i)).data_ptr for i in range(g.ple_layers))
                split = self._splits.put(key, PleSplit(self._backend, dsts, ple_embeds.data_ptr,
                                                       g.ple_hidden * dtype.itemsize, n))
            if ple_embeds._last_stream is not None:  # its producer ordered before the step's stream
                ple_embeds._order_consumer(s._handle)
            return split
        arr = np.asarray(ple_embeds)
        for i, part in enumerate(split_ple(arr.reshape(n, width), g)):
            host = np.ascontiguousarray(part, dtype=dtype.numpy)
            calls.read(host)
            self._io.member(names.ple_token_embeds(i)).reshape((n, g.ple_hidden)).copy_from(host, s)
        return None

    def plan_work(self, work: tuple[DeviceWork, ...], split: PleSplit) -> tuple[DeviceWork, ...]:
        """A decode plan's device work: a step's ``work``, then ``split`` (the same tuple for the same pair)."""
        return self._works.get((work, split)) or self._works.put((work, split), (*work, split))

    def steady(self, plan: DecodePlan, ple_embeds: Any, inputs_embeds: Any, s: Stream,
               calls: Calls) -> tuple[bool, bool]:
        """For a decode whose ``plan`` holds: (whether the plan takes these ``ple_embeds``, whether host rows were
        copied now). A plan whose work splits a device tensor takes that tensor (kept until read, its producer
        ordered before ``s``) and nothing else; one without takes host rows (copied now) or none where the engine
        has no PLE inputs; a new device tensor is not taken (a checked decode makes a plan that splits it)."""
        if plan.ple is not None:
            if not plan.takes_ple(ple_embeds):
                return False, False
            calls.read(ple_embeds)
            if ple_embeds._last_stream is not None:
                ple_embeds._order_consumer(s._handle)
            return True, False
        if ple_embeds is None and self._g is None:
            return True, False
        if type(ple_embeds) is Tensor or not self.wanted(ple_embeds):
            return False, False
        self.stage(ple_embeds, inputs_embeds, s, calls)
        return True, True
