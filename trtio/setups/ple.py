"""Gemma 4's per-layer embeddings: what a step's ``ple_embeds=`` fills (the engine's ``ple_token_embeds_i``).

A step gives each token's row ``[batch, seq, L x ple_hidden]`` (host numpy, or a device Tensor such as
:class:`~trtio.embeddings.TokenEmbeddings` gathers); :class:`PleInputs` checks it against the engine's inputs and
copies each layer's columns into its input on the step's stream, before the engine: a device row block by a
:class:`~trtio.gemma4.PleSplit` (kept per source address; a decode makes it part of its plan's device work, so a
steady decode replays it inside the decode's graph), host rows one copy per layer. What a copy reads is kept until
it has run (:meth:`Calls.read <trtio.setups.calls.Calls.read>`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio import names
from trtio._cache import BoundedCache
from trtio.config import LLMEngineConfig
from trtio.cuda.backend import Backend
from trtio.errors import ShapeError
from trtio.gemma4 import PleSplit, split_ple
from trtio.pipeline_io import PipelineIO
from trtio.setups.calls import Calls
from trtio.stream import Stream
from trtio.tensor import Tensor

__all__ = ["PleInputs"]


class PleInputs:
    """The per-layer embedding inputs of one LLM setup's engine (none where its config has no PLE)."""

    def __init__(self, io: PipelineIO, cfg: LLMEngineConfig, backend: Backend) -> None:
        self._io, self._backend = io, backend
        g = cfg.gemma4
        self._g = g if g is not None and g.has_ple else None
        self._splits: BoundedCache[tuple[int, int], PleSplit] = BoundedCache()  # device rows -> the layers

    def wanted(self, ple_embeds: Any) -> bool:
        """Whether the engine takes per-layer embeddings; ``ple_embeds`` given to one that does not is refused."""
        if self._g is None and ple_embeds is not None:
            raise ShapeError("ple_embeds: given, but the engine has no per-layer embedding inputs (ple_token_embeds_i)")
        return self._g is not None

    def stage(self, ple_embeds: Any, rows: tuple[int, ...], s: Stream, calls: Calls) -> PleSplit | None:
        """Check ``ple_embeds`` against a step of ``rows`` (its embeddings' batch and seq) and copy each layer's
        columns into its input on ``s`` (only where :meth:`wanted`): host rows now, one copy per layer; a device
        Tensor's through the :class:`~trtio.gemma4.PleSplit` returned (its producer ordered before ``s``, the tensor
        kept until read), which the caller enqueues on ``s`` before the engine (or makes part of a decode plan's
        work, captured with the engine)."""
        g = self._g
        assert g is not None
        width = g.ple_layers * g.ple_hidden
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
