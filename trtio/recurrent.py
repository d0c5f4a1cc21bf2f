"""Recurrent state of hybrid models (Gated DeltaNet: Qwen3.5; Mamba2: Nemotron-H): what an engine declares for it,
how its declaration is checked, and the per-slot work a setup does on it (``docs/architecture.md``, "Hybrid models").

Each recurrent layer ``j`` of a hybrid engine has two pools the engine updates in place, both with one row per
resident sequence slot (``max_batch_size`` rows, Edge-LLM's fixed resident-slot pool): ``conv_state_j``
``[rows, conv_dim, conv_kernel]`` and ``recurrent_state_j`` ``[rows, heads, head_dim, size]`` (GDN FP32: value
heads, key dim, value dim; Mamba2 FP16: heads, head dim, SSM state), aliased by ``present_conv_state_j`` and
``present_recurrent_state_j``. A step's ``state_indices[s]`` is the slot of its sequence ``s``: the engine reads and
writes that row only. The pools are allocated and bound by the engine state (:mod:`trtio.state`) at their full row
count, whatever the step's batch.

:class:`RecurrentStates` is what a setup does with those rows: a new sequence's rows are zeroed on the device before
its prefill reads them (Edge-LLM's ``clearSlot``), a pinned prefix keeps a copy of its slot's rows in a row of a fixed
snapshot pool (``max_prefixes`` rows), and a sequence started from that prefix gets the copy back. Each is one device
operation (a fused row copy, indices read on the device), so admitting sequences costs one launch, no host sync.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import numpy as np

from trtio import names
from trtio._cache import BoundedCache
from trtio._lifetime import Closeable
from trtio.config import LLMEngineConfig
from trtio.cuda.backend import Backend
from trtio.dtypes import DType
from trtio.engine import DeviceWork, EngineIO
from trtio.errors import CapacityError
from trtio.memory import Arena, HostStaging, MemoryReport, TensorRequest
from trtio.ops import RowCopy, fuse
from trtio.pages import PagePool
from trtio.registry import ProfileShapes, TensorSpec
from trtio.stream import Stream
from trtio.tensor import Tensor

__all__ = ["DEFAULT_MAX_PREFIXES", "RecurrentStates", "is_recurrent_state", "recurrent_problems",
           "recurrent_state_names", "recurrent_state_specs"]

#: Snapshot rows a hybrid setup keeps for pinned prefixes unless ``max_prefixes=`` says otherwise.
DEFAULT_MAX_PREFIXES = 4


def recurrent_state_names(cfg: LLMEngineConfig) -> list[tuple[str, str]]:
    """The (input, output) pairs of ``cfg``'s recurrent layers, in the exporter's order: every conv state, then
    every recurrent state."""
    n = cfg.num_recurrent_layers
    return ([(names.conv_state(j), names.present_conv_state(j)) for j in range(n)]
            + [(names.recurrent_state(j), names.present_recurrent_state(j)) for j in range(n)])


def _geometry(cfg: LLMEngineConfig, name: str) -> tuple[DType, tuple[int, ...]]:
    """One slot's row of the pool ``name`` (its dtype and shape without the row dim)."""
    if name.startswith(names.kConvStateTemplate):
        return DType.coerce(cfg.conv_state_dtype), cfg.conv_state_shape
    return DType.coerce(cfg.recurrent_state_dtype), cfg.recurrent_state_shape


def recurrent_state_specs(cfg: LLMEngineConfig, max_batch: int | None = None) -> list[TensorSpec]:
    """What a hybrid engine of the ragged contract declares for its recurrent state: ``conv_state_j`` and
    ``recurrent_state_j`` inputs (rows dynamic in the graph, ``state_pool_rows``; the builder pins both profiles to
    ``max_batch_size`` rows), then their ``present_*`` outputs. Empty for a model without recurrent layers. The
    ReferenceEngine declares these; tests compare them with files the real exporter wrote."""
    rows = max_batch or cfg.max_supported_batch_size
    pairs = recurrent_state_names(cfg)
    inputs, outputs = [], []
    for past, present in pairs:
        dtype, row = _geometry(cfg, past)
        shape = (rows, *row)
        fixed: tuple[ProfileShapes, ...] = ((shape, shape, shape),) * 2
        declared = (-1, *row)
        inputs.append(TensorSpec(past, "input", dtype, shape, fixed, declared=declared))
        outputs.append(TensorSpec(present, "output", dtype, shape, declared=declared))
    return inputs + outputs


def _recurrent_layer(name: str) -> int | None:
    for template in (names.kConvStateTemplate, names.kRecurrentStateTemplate):
        head = template + "_"
        if name.startswith(head) and name[len(head):].isdigit():
            return int(name[len(head):])
    return None


def is_recurrent_state(name: str) -> bool:
    """Whether ``name`` is a recurrent layer's state input (``conv_state_j`` / ``recurrent_state_j``): a pool of one
    row per slot, bound whole whatever the step's batch."""
    return _recurrent_layer(name) is not None


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def recurrent_problems(eio: EngineIO, cfg: LLMEngineConfig, max_batch: int) -> list[str]:
    """Every disagreement between the recurrent state an engine declares and its config: a pool missing or beyond
    the config's recurrent layers, its dtype, its per-slot dims, and a pool with fewer rows than the setup's
    ``max_batch`` slots (``state_indices`` index it by slot)."""
    problems = []
    want = dict(recurrent_state_names(cfg))
    declared = [info.name for info in eio.inputs if _recurrent_layer(info.name) is not None]
    for name in declared:
        if name not in want:
            have = (f"{cfg.num_recurrent_layers} recurrent layers" if cfg.is_hybrid
                    else "no recurrent layer (layer_types)")
            problems.append(f"{name}: the engine declares this recurrent state but the config has {have}")
    for past in want:
        if past not in eio:
            problems.append(f"{past}: the config has {cfg.num_recurrent_layers} recurrent layers but the engine "
                            f"declares no {past}")
            continue
        info = eio[past]
        dtype, row = _geometry(cfg, past)
        field = "conv_state_dtype" if past.startswith(names.kConvStateTemplate) else "recurrent_state_dtype"
        if info.dtype is not dtype:
            problems.append(f"{past}: the engine's state is {info.dtype} but the config's {field} is {dtype}")
        shape, top = info.shape, info.max_shape()
        if len(shape) != 1 + len(row):
            problems.append(f"{past}: expected [rows, {', '.join(str(d) for d in row)}], the engine declares rank "
                            f"{len(shape)} {_fmt(shape)}")
            continue
        for dim, value in enumerate(row, start=1):
            got = shape[dim] if shape[dim] >= 0 else top[dim]
            if got != value:
                problems.append(f"{past}: dim {dim} is {got} in the engine but {value} in the config")
        if 0 <= top[0] < max_batch:
            problems.append(f"{past}: the engine's pool holds {top[0]} rows, fewer than the {max_batch} sequence "
                            f"slots state_indices address")
    return problems


class RecurrentStates(Closeable):
    """What a setup does with a hybrid engine's per-slot state rows (see the module docstring): the pools are the
    engine state's (``pools``: name -> tensor, ``[rows, ...]``); this owns the snapshot pool of ``max_prefixes`` rows
    per pool, the device indices its copies read, and which snapshot rows pinned prefixes hold (:attr:`rows`).

    Every method enqueues on the stream it is given and returns at once (no host sync). Follows trtio's close
    protocol (:mod:`trtio._lifetime`).
    """

    def __init__(self, pools: dict[str, Tensor], max_batch: int, max_prefixes: int, *, backend: Backend,
                 stream: Stream, name: str = "llm") -> None:
        self.name = name
        self.max_batch = max_batch
        self.max_prefixes = max_prefixes
        self._init_lifetime(f"recurrent states of {name!r}")
        self._pools = dict(pools)
        self.rows = PagePool(max_prefixes)  # snapshot rows, held by pinned prefixes
        i32 = DType.INT32
        requests = [TensorRequest.of(f"{past}_snapshots", (max_prefixes, *t.shape[1:]), t.dtype)
                    for past, t in self._pools.items() if max_prefixes]
        requests += [TensorRequest.of("state_fill", (max_batch,), i32),
                     TensorRequest.of("state_sources", (max_batch,), i32),
                     HostStaging.request("host_state_sources", (max_batch,), i32),
                     TensorRequest.of("state_pin_slot", (1,), i32), TensorRequest.of("state_pin_row", (1,), i32),
                     HostStaging.request("host_state_pin_slot", (1,), i32),
                     HostStaging.request("host_state_pin_row", (1,), i32)]
        with contextlib.ExitStack() as undo:  # a constructor that fails frees what it made
            self._arena = Arena(requests, backend=backend, title=f"{name} recurrent snapshots")
            undo.callback(self._arena.close)
            self._snapshots = {past: self._arena[f"{past}_snapshots"] for past in self._pools if max_prefixes}
            self._fill = self._arena["state_fill"]
            self._fill.copy_from(np.full(max_batch, -1, np.int32), stream)  # -1: a zero row (ops.copy_rows)
            self._sources = HostStaging(self._arena["host_state_sources"], self._arena["state_sources"], backend)
            undo.callback(self._sources.close)
            # A pin's source slot and snapshot row, each in a tensor of its own (a row copy reads its indices from
            # a tensor's start).
            self._pin_slot = HostStaging(self._arena["host_state_pin_slot"], self._arena["state_pin_slot"], backend)
            undo.callback(self._pin_slot.close)
            self._pin_row = HostStaging(self._arena["host_state_pin_row"], self._arena["state_pin_row"], backend)
            undo.callback(self._pin_row.close)
            undo.pop_all()
        self._admissions: BoundedCache[tuple[int, bool, int], tuple[DeviceWork, ...]] = BoundedCache()
        self._pins: tuple[DeviceWork, ...] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the snapshot pool (the state pools themselves are the engine state's)."""
        return sum(t.capacity for t in self._snapshots.values())

    def _row_bytes(self, t: Tensor) -> int:
        return t.dtype.nbytes(math.prod(t.shape[1:]))

    # -- admissions ----------------------------------------------------------------------------------
    def admission(self, slots: Tensor, count: int, sources: Sequence[int] | None,
                  stream: Stream) -> tuple[DeviceWork, ...]:
        """Device work that sets the state rows of ``count`` new sequences before the engine reads them: row
        ``slots[i]`` (int32 on the device, read when the work runs: the step's ``state_indices``) of every pool
        becomes zeros, or, where ``sources[i] >= 0``, a copy of snapshot row ``sources[i]`` (a pinned prefix's). The
        sources (None: all zero) are staged on ``stream`` now; the returned work is enqueued by the caller, after
        the step's inputs are uploaded and before the engine. Equal calls return the same work (its launch is
        packed once)."""
        self._check_open()
        restore = sources is not None and any(r >= 0 for r in sources)
        if restore:
            assert sources is not None
            self._sources.upload(np.asarray(sources, np.int32), stream, reshape=False)
        key = (count, restore, slots.data_ptr)
        found = self._admissions.get(key)
        if found is None:
            src_rows = self._sources.device if restore else self._fill
            copies = [RowCopy(pool, self._snapshots.get(past, pool), src_rows, count, self._row_bytes(pool),
                              dst_rows=slots) for past, pool in self._pools.items()]
            found = self._admissions.put(key, fuse(copies))
        return found

    # -- snapshots -------------------------------------------------------------------------------------
    def snapshot(self, slot: int, what: str, stream: Stream) -> int:
        """Copy the state rows of ``slot`` into a free snapshot row, on ``stream``; returns the row (held: give it
        back with ``rows.drop([row])``). A pool with no free row is a CapacityError naming ``max_prefixes``, with
        nothing changed."""
        self._check_open()
        if not self.rows.free:
            raise CapacityError(f"{what}: every one of the {self.max_prefixes} recurrent-state snapshot rows "
                                f"(max_prefixes={self.max_prefixes}) is held by a pinned prefix; release a prefix, or "
                                f"create the setup with a larger max_prefixes")
        row = self.rows.take(1)[0]
        try:
            self._pin_slot.upload(np.array([slot], np.int32), stream, reshape=False)
            self._pin_row.upload(np.array([row], np.int32), stream, reshape=False)
            works = self._pins
            if works is None:
                works = self._pins = fuse([RowCopy(self._snapshots[past], pool, self._pin_slot.device, 1,
                                                   self._row_bytes(pool), dst_rows=self._pin_row.device)
                                           for past, pool in self._pools.items()])
            for w in works:
                w.enqueue(stream)
        except BaseException:
            self.rows.drop([row])
            raise
        return row

    def report(self) -> MemoryReport:
        self._check_open()
        return self._arena.report()

    def _close_owned(self) -> None:
        with contextlib.ExitStack() as release:
            release.callback(self._arena.close)
            release.callback(self._sources.close)
            release.callback(self._pin_slot.close)
            release.callback(self._pin_row.close)

    def __repr__(self) -> str:
        return (f"RecurrentStates({self.name!r}, {len(self._pools)} pools, {self.max_prefixes} snapshot rows, "
                f"{self.rows.free} free)")
