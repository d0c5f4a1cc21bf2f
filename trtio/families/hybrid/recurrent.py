"""Recurrent state of hybrid models (Gated DeltaNet: Qwen3.5; Mamba2: Nemotron-H): the per-slot work a setup does on
it (``docs/architecture.md``, "Hybrid models").

Each recurrent layer ``j`` of a hybrid engine has two pools the engine updates in place, both with one row per
resident sequence slot (``max_batch_size`` rows, Edge-LLM's fixed resident-slot pool): ``conv_state_j``
``[rows, conv_dim, conv_kernel]`` and ``recurrent_state_j`` ``[rows, heads, head_dim, size]`` (GDN FP32: value
heads, key dim, value dim; Mamba2 FP16: heads, head dim, SSM state), aliased by ``present_conv_state_j`` and
``present_recurrent_state_j``. A step's ``state_indices[s]`` is the slot of its sequence ``s``: the engine reads and
writes that row only. The pools are allocated and bound by the engine state (:mod:`trtio._state`) at their full row
count, whatever the step's batch.

:class:`RecurrentStates` is what a setup does with those rows: a new sequence's rows are zeroed on the device before
its prefill reads them (Edge-LLM's ``clearSlot``), a pinned prefix keeps a copy of its slot's rows in a row of a fixed
snapshot pool (``max_prefixes`` rows), and a sequence started from that prefix gets the copy back. Each is one device
operation on the cuda backend (strided row copies of every layer's pool, packed into one launch), with no host sync.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from trtio import names
from trtio._cache import BoundedCache
from trtio._cuda.backend import Backend
from trtio._engine import DeviceWork
from trtio._lifetime import Closeable
from trtio._memory import Arena, MemoryReport, TensorRequest
from trtio._ops import AsGraph, Copy2D, OwnGraphs, Zero2D, fuse
from trtio._pages import PagePool
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio.errors import CapacityError

__all__ = ["RecurrentStates"]

class _Group:
    """The pools of one kind (every layer's conv state, or every layer's recurrent state) and their snapshots: row
    ``s`` of layer ``l``'s pool at ``base + l * stride + s * row``, snapshot row ``r`` of layer ``l`` at
    ``snapshots + l * snap_stride + r * row``. Pools an arena laid out evenly (one allocation, sizes a multiple of
    its alignment) are one group of ``layers`` pools; other pools are groups of one."""

    def __init__(self, pools: list[Tensor], snapshots: int, row: int, prefixes: int) -> None:
        self.backend = pools[0].backend
        self.base, self.layers, self.row = pools[0].data_ptr, len(pools), row
        self.stride = pools[1].data_ptr - pools[0].data_ptr if len(pools) > 1 else row
        self.snapshots = snapshots  # the address of this group's first layer's snapshot row 0 (0: none)
        self.snap_stride = prefixes * row


def _groups(pools: list[Tensor], snapshots: Tensor | None, row: int, prefixes: int) -> list[_Group]:
    """``pools`` (one kind, layer order; ``snapshots`` ``[layers, prefixes, ...]``) as the fewest groups: one where
    they are evenly spaced, else one per pool."""
    ptrs = [p.data_ptr for p in pools]
    stride = ptrs[1] - ptrs[0] if len(ptrs) > 1 else 0
    snap = snapshots.data_ptr if snapshots is not None else 0
    if len(ptrs) == 1 or (stride > 0 and all(q == ptrs[0] + i * stride for i, q in enumerate(ptrs))):
        return [_Group(pools, snap, row, prefixes)]
    return [_Group([pool], snap + layer * prefixes * row if snap else 0, row, prefixes)
            for layer, pool in enumerate(pools)]


class RecurrentStates(Closeable):
    """What a setup does with a hybrid engine's per-slot state rows (see the module docstring): the pools are the
    engine state's (``pools``: name -> tensor, ``[rows, ...]``, conv states first, each kind in layer order); this
    owns the snapshot pool (one tensor per kind, ``[layers, max_prefixes, ...]``) and which of its rows pinned
    prefixes hold (:attr:`rows`).

    Each operation is one device launch on the cuda backend (a fused copy of the slot's row in every layer's pool:
    evenly spaced pools, as the engine state's arena lays them out, are one strided copy per kind), enqueued on the
    stream given, no host sync. Follows trtio's close protocol (:mod:`trtio._lifetime`).
    """

    def __init__(self, pools: dict[str, Tensor], max_batch: int, max_prefixes: int, *, backend: Backend,
                 stream: Stream, name: str = "llm") -> None:
        self.name = name
        self.max_batch = max_batch
        self.max_prefixes = max_prefixes
        self._init_lifetime(f"recurrent states of {name!r}")
        self.rows = PagePool(max_prefixes)  # snapshot rows, held by pinned prefixes
        kinds = {template: [t for past, t in pools.items() if past.startswith(template + "_")]
                 for template in (names.kConvStateTemplate, names.kRecurrentStateTemplate)}
        self._kinds = {k: v for k, v in kinds.items() if v}
        requests = [TensorRequest.of(f"{template}_snapshots", (len(ts), max_prefixes, *ts[0].shape[1:]), ts[0].dtype)
                    for template, ts in self._kinds.items()]
        self._arena = Arena(requests, backend=backend, title=f"{name} recurrent snapshots")
        self._groups: list[_Group] = []
        for template, ts in self._kinds.items():
            snaps = self._arena[f"{template}_snapshots"] if max_prefixes else None
            self._groups += _groups(ts, snaps, ts[0].dtype.nbytes(math.prod(ts[0].shape[1:])), max_prefixes)
        self._admissions: BoundedCache[tuple[tuple[int, ...], tuple[int, ...] | None], tuple[DeviceWork, ...]] = \
            BoundedCache()
        self._pins: BoundedCache[tuple[int, int], tuple[DeviceWork, ...]] = BoundedCache()
        self._graphs = OwnGraphs(backend, f"recurrent states of {name!r}: zeroing graphs")

    @property
    def nbytes(self) -> int:
        """Bytes of the snapshot pool (the state pools themselves are the engine state's)."""
        return sum(self._arena[f"{t}_snapshots"].capacity for t in self._kinds)

    # -- admissions ----------------------------------------------------------------------------------
    def admission(self, slots: Sequence[int], sources: Sequence[int] | None) -> tuple[DeviceWork, ...]:
        """Device work that sets the state rows of new sequences before the engine reads them: row ``slots[i]`` of
        every pool becomes zeros, or, where ``sources[i] >= 0``, a copy of snapshot row ``sources[i]`` (a pinned
        prefix's). The caller enqueues it on the step's stream before the engine. Equal calls return the same work
        (its launch packed once): an admission of one sequence then costs one launch (more where the pools are not
        evenly spaced)."""
        self._check_open()
        key = (tuple(slots), None if sources is None else tuple(sources))
        found = self._admissions.get(key)
        if found is None:
            works: list[Any] = []
            for i, slot in enumerate(key[0]):  # one launch per slot: the strided rows of two slots interleave
                src = -1 if key[1] is None else key[1][i]
                fused = fuse([self._row_copy(g, slot, src) for g in self._groups])
                # A slot's zeroing (max_batch of them) as a graph of its own: cheaper for the host to launch
                works += [AsGraph(w, self._graphs, id(self._graphs)) for w in fused] if src < 0 else fused
            found = self._admissions.put(key, tuple(works))
        return found

    def _row_copy(self, g: _Group, slot: int, source: int) -> Any:
        """Slot ``slot``'s row of every layer of ``g``: zeros (``source`` < 0) or snapshot row ``source``."""
        dst = g.base + slot * g.row
        if source < 0:
            return Zero2D(g.backend, dst, g.stride, g.row, g.layers)
        return Copy2D(g.backend, dst, g.stride, g.snapshots + source * g.row, g.snap_stride, g.row, g.layers)

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
            works = self._pins.get((slot, row))
            if works is None:
                works = self._pins.put((slot, row), fuse([
                    Copy2D(g.backend, g.snapshots + row * g.row, g.snap_stride, g.base + slot * g.row, g.stride, g.row,
                           g.layers) for g in self._groups]))
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
        try:
            self._graphs.close()  # before the memory they write
        finally:
            self._arena.close()

    def __repr__(self) -> str:
        return (f"RecurrentStates({self.name!r}, {sum(g.layers for g in self._groups)} pools, {self.max_prefixes} "
                f"snapshot rows, {self.rows.free} free)")
