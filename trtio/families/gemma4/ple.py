"""Gemma 4's per-layer embeddings: what a step's ``ple_embeds=`` fills (the engine's ``ple_token_embeds_i``).

A step gives each token's row ``[batch, seq, L x ple_hidden]`` (host numpy, or a device Tensor such as
:class:`~trtio._embeddings.TokenEmbeddings` gathers); :class:`PleInputs` checks it against the engine's inputs and
copies each layer's columns into its input on the step's stream, before the engine: a device row block by a
:class:`PleSplit` (kept per source address; a decode makes it part of its plan's device work, so a steady decode
replays it inside the decode's graph), host rows one copy per layer. What a copy reads is kept until it has run
(:meth:`Calls.read <trtio._setups.calls.Calls.read>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio import names
from trtio._cache import BoundedCache
from trtio._cuda._hostmem import host_view
from trtio._cuda.backend import Backend
from trtio._cuda.kernels import MAX_COPY_JOBS
from trtio._engine import DeviceWork
from trtio._hashing import hash_once
from trtio._ops import Copy2D, _copy_jobs, _host_work
from trtio._pipeline_io import PipelineIO
from trtio._setups.calls import Calls
from trtio._setups.decode_plan import DecodePlan
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio.errors import ShapeError
from trtio.families.gemma4.gemma4_config import Gemma4Config
from trtio.features import Ready

__all__ = ["PleInputs", "PleSplit", "split_ple"]



class PleInputs:
    """The per-layer embedding inputs of one LLM setup's engine (none where its config has no PLE)."""

    def __init__(self, io: PipelineIO, g: Gemma4Config, backend: Backend) -> None:
        self._io, self._backend = io, backend
        self._g = g if g.has_ple else None
        self._splits: BoundedCache[tuple[int, int], PleSplit] = BoundedCache()  # device rows -> the layers
        # A decode's work with a split after it, one tuple per pair (a graph is found by its work's identity)
        self._works: BoundedCache[tuple[tuple[DeviceWork, ...], PleSplit], tuple[DeviceWork, ...]] = BoundedCache()

    def wanted(self, ple_embeds: Any) -> bool:
        """Whether the engine takes per-layer embeddings; ``ple_embeds`` given to one that does not is refused."""
        if self._g is None and ple_embeds is not None:
            raise ShapeError("ple_embeds: given, but the engine has no per-layer embedding inputs (ple_token_embeds_i)")
        return self._g is not None

    def prepare(self, ple_embeds: Any, inputs_embeds: Any, ready: Ready, *, now: bool = False) -> PleSplit | None:
        """A step's: where the engine takes per-layer embeddings (:meth:`wanted`), the setup made ready (``ready``:
        a closed or broken one refused before anything is copied; the step's stream), then :meth:`stage` on the
        step's stream; a device tensor's split is enqueued ``now`` or returned to the caller (a decode: in its plan's
        work)."""
        if not self.wanted(ple_embeds):
            return None
        s, calls = ready()
        split = self.stage(ple_embeds, _rows(inputs_embeds), s, calls)
        if split is not None and now:
            split.enqueue(s)
        return split

    def check(self, ple_embeds: Any, rows: tuple[int, ...]) -> None:
        """Refuse ``ple_embeds`` (where :meth:`wanted`) that do not give each of a step's ``rows`` (its batch and seq)
        the layers' columns, or a device tensor of another dtype than the activations'."""
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
        dtype = self._io.inputs_embeds.dtype
        if isinstance(ple_embeds, Tensor) and ple_embeds.dtype != dtype:
            raise ShapeError(f"ple_embeds: expected {dtype}, got {ple_embeds.dtype}")

    def stage(self, ple_embeds: Any, rows: tuple[int, ...], s: Stream, calls: Calls) -> PleSplit | None:
        """Check ``ple_embeds`` against a step's ``rows`` (its batch and seq: :meth:`check`) and copy each layer's
        columns into its input on ``s`` (only where :meth:`wanted`): host rows now, one copy per layer; a device
        Tensor's through the :class:`PleSplit` returned (its producer ordered before ``s``, the tensor kept until
        read), which the caller enqueues on ``s`` before the engine (or makes part of a decode plan's work, captured
        with the engine)."""
        g = self._g
        assert g is not None
        self.check(ple_embeds, rows)
        width = g.ple_layers * g.ple_hidden
        n = int(rows[0]) * int(rows[1])
        dtype = self._io.inputs_embeds.dtype
        if isinstance(ple_embeds, Tensor):  # on the device (TokenEmbeddings): every layer's columns in one launch
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
        if plan.held is not None:
            if not plan.takes(ple_embeds):
                return False, False
            calls.read(ple_embeds)
            if ple_embeds._last_stream is not None:
                ple_embeds._order_consumer(s._handle)
            return True, False
        if ple_embeds is None and self._g is None:
            return True, False
        if type(ple_embeds) is Tensor or not self.wanted(ple_embeds):
            return False, False
        self.stage(ple_embeds, _rows(inputs_embeds), s, calls)
        return True, True


def _rows(inputs_embeds: Any) -> tuple[int, ...]:
    """A step's batch and seq, from its embeddings (an array or an array-like)."""
    shape = tuple(inputs_embeds.shape) if hasattr(inputs_embeds, "shape") else np.shape(inputs_embeds)
    return tuple(int(d) for d in shape[:2])


def split_ple(ple_embeds: np.ndarray, g: Gemma4Config) -> list[np.ndarray]:
    """``ple_embeds`` ``[..., L * ple_hidden]`` as the L per-layer inputs (columns ``i * ple_hidden ..``)."""
    width = g.ple_layers * g.ple_hidden
    if ple_embeds.shape[-1] != width:
        raise ShapeError(f"ple_embeds: expected {width} columns ({g.ple_layers} layers x {g.ple_hidden}), got "
                         f"shape {tuple(ple_embeds.shape)}")
    return [ple_embeds[..., i * g.ple_hidden:(i + 1) * g.ple_hidden] for i in range(g.ple_layers)]


@hash_once
@dataclass(frozen=True)
class PleSplit:
    """A step's per-layer embeddings ``[rows, L x width]`` (device address ``src``) split into the layers' inputs
    (``dsts``, each ``[rows, width]``): on the cuda backend one copy kernel per :data:`MAX_COPY_JOBS` layers (a
    launch takes that many copies), one host work elsewhere. Bytes: ``width`` per layer row."""

    backend: Backend
    dsts: tuple[int, ...]
    src: int
    width: int
    rows: int

    def enqueue(self, stream: Stream) -> None:
        be, w, n, pitch = self.backend, self.width, self.rows, self.width * len(self.dsts)
        if be.name == "cuda":
            jobs = tuple(Copy2D(be, d, w, self.src + i * w, pitch, w, n).job() for i, d in enumerate(self.dsts))
            for first in range(0, len(jobs), MAX_COPY_JOBS):
                _copy_jobs(be, jobs[first:first + MAX_COPY_JOBS])(stream.handle)
            return
        src, dsts = self.src, self.dsts

        def run() -> None:
            rows = host_view(src, n * pitch).reshape(n, len(dsts), w)
            for i, d in enumerate(dsts):
                host_view(d, n * w).reshape(n, w)[:] = rows[:, i]

        _host_work(be, stream, run)
