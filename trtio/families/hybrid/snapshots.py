"""A hybrid spec-decode base's verify states and their commit at accept.

A hybrid base (Qwen3.5's Gated DeltaNet) verifies a chain of tokens per sequence from the state rows of its slot (a
tree, each node from its parent's states, where it was built as a DDTree base: ``mtp_tree_base`` /
``dflash_tree_base``) and writes per token row of the step ``intermediate_conv_state_j`` ``[T, conv_dim, k]`` and
``intermediate_recurrent_state_j`` ``[T, ...]`` per recurrent layer j (``docs/edgellm-assumptions.md`` §11.2: the
verify leaves the slot pools as they were). :meth:`IntermediateStates.commit` then sets, per sequence, every layer's
pools of its slot from them, on the device, no host sync:

- "snapshot" (a base built for chains): row ``s*W + i`` holds the states after node ``i``; the accepted path's last
  node's row is copied into the slot (one fused launch of strided copies: one copy per sequence and kind where the
  buffers are evenly spaced, as arenas lay them out);
- a Gated DeltaNet DDTree base: the conv rows are each node's window (copied as above), but the recurrent rows hold
  Edge-LLM's replay stash, which :class:`~trtio.families.hybrid.replay.GdnReplay` advances the slot's state with along
  the accepted path.

Mamba2's "replay" mode and a Mamba2 DDTree base are refused at setup (:meth:`HybridConfig.check_runs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from trtio import names
from trtio._cache import BoundedCache
from trtio._config import LLMEngineConfig
from trtio._cuda.backend import Backend
from trtio._lifetime import Closeable
from trtio._memory import Arena, MemoryReport, TensorRequest
from trtio._ops import Copy2D, fuse
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio._tensor_map import TensorMap
from trtio.families.hybrid.hybrid_config import HybridConfig, intermediate_state_specs
from trtio.families.hybrid.replay import GdnReplay

__all__ = ["IntermediateStates", "is_chain"]


def is_chain(parents: np.ndarray, real: np.ndarray) -> bool:
    """Whether every real node ``i > 0`` of a verify tree (``parents`` [B, N], ``real`` [B, N]) has parent ``i - 1``:
    the only tree a hybrid base verifies unless built as a tree base (its recurrence runs the rows in order)."""
    n = parents.shape[1]
    return bool(np.all((parents[:, 1:] == np.arange(n - 1)) | ~real[:, 1:]))


class IntermediateStates(Closeable):
    """The per-token state buffers a hybrid base's verify writes (``rows`` token rows each: the longest verify step)
    and the commit of the accepted ones into the slot pools ``pools`` (the engine state's ``conv_state_j`` /
    ``recurrent_state_j``). ``replay``: the base is a Gated DeltaNet DDTree base, whose recurrent rows hold a replay
    stash (module docstring; ``max_batch`` sequences an accept). Follows trtio's close protocol
    (:mod:`trtio._lifetime`)."""

    def __init__(self, cfg: LLMEngineConfig, rows: int, *, backend: Backend, name: str = "base",
                 replay: bool = False, max_batch: int = 0) -> None:
        self.name = name
        self.rows = rows
        self._init_lifetime(f"intermediate states of {name!r}")
        specs = intermediate_state_specs(cfg)
        hybrid = cfg.feature(HybridConfig) or HybridConfig()
        self._arena = Arena([TensorRequest.of(s.name, (rows, *s.engine_shape[1:]), s.dtype) for s in specs],
                            backend=backend, title=f"{name} intermediate states")
        self.replay: GdnReplay | None = None
        if replay:
            try:
                self.replay = GdnReplay(hybrid, max_batch, backend=backend, name=name)
            except BaseException:
                self._arena.close()
                raise
        self.tensors: dict[str, Tensor] = {s.name: self._arena[s.name] for s in specs}
        self._layers = hybrid.num_layers
        # (pool addresses, intermediate addresses, bytes of one row) per kind copied, in layer order (set by attach)
        self._kinds: list[tuple[list[int], list[int], int]] = []
        self._backend = backend
        self._works: BoundedCache[tuple[tuple[int, ...], tuple[int, ...]], tuple[Any, ...]] = BoundedCache()

    def attach(self, pools: Mapping[str, Tensor], tm: TensorMap, stream: Stream) -> None:
        """Commit into ``pools`` (the base's engine state: ``conv_state_j`` / ``recurrent_state_j``) and add every
        ``intermediate_*`` buffer to the base's map ``tm`` (bound at the step's token rows); ``stream``: where the
        replay's table of layer addresses is written."""
        self._check_open()
        n = self._layers
        for pool, inter in ((names.conv_state, names.intermediate_conv_state),
                            (names.recurrent_state, names.intermediate_recurrent_state)):
            ps, its = [pools[pool(j)] for j in range(n)], [self.tensors[inter(j)] for j in range(n)]
            if pool is names.recurrent_state and self.replay is not None:
                self.replay.attach(ps, its, stream)
                continue
            self._kinds.append(([p.data_ptr for p in ps], [t.data_ptr for t in its], its[0].capacity // self.rows))
        for name, t in self.tensors.items():
            tm.add(name, t)

    def commit(self, slots: np.ndarray, rows: np.ndarray, lengths: np.ndarray, nodes: int, stream: Stream) -> None:
        """The accepted paths' states into each sequence's slot, on ``stream``: sequence ``i`` (slot ``slots[i]``)
        accepted verify rows ``rows[i, :lengths[i]]`` (row ``i * nodes + node``; ``rows`` -1 past each path). The
        copied kinds take the path's last row (one fused launch; equal calls reuse their work), a replay the whole
        path (:meth:`GdnReplay.commit`)."""
        self._check_open()
        self.copy_last(slots, rows[np.arange(len(slots)), lengths - 1], stream)
        if self.replay is not None:
            self.replay.commit(slots, rows, lengths, nodes, stream)

    def copy_last(self, slots: np.ndarray, last: np.ndarray, stream: Stream) -> None:
        """Copy verify row ``last[i]`` of every copied kind's intermediate buffers into slot ``slots[i]`` of its pools,
        on ``stream`` (one fused launch; equal calls reuse their work)."""
        key = (tuple(int(s) for s in slots), tuple(int(r) for r in last))
        works = self._works.get(key)
        if works is None:
            copies: list[Any] = []
            for slot, r in zip(*key):
                for pools, inters, row in self._kinds:
                    copies += _strided(self._backend, pools, slot * row, inters, r * row, row)
            works = self._works.put(key, fuse(copies))
        for w in works:
            w.enqueue(stream)

    def report(self) -> MemoryReport:
        self._check_open()
        return self._arena.report()

    def _close_owned(self) -> None:
        try:
            if self.replay is not None:
                self.replay.close()
        finally:
            self._arena.close()

    def __repr__(self) -> str:
        return f"IntermediateStates({self.name!r}, {len(self.tensors)} buffers of {self.rows} rows)"


def _strided(be: Backend, dst: list[int], dst_off: int, src: list[int], src_off: int, row: int) -> list[Copy2D]:
    """One row per layer from ``src[l] + src_off`` to ``dst[l] + dst_off``: one strided copy where both lists are
    evenly spaced, else one per layer."""
    def stride(ptrs: list[int]) -> int:
        s = ptrs[1] - ptrs[0] if len(ptrs) > 1 else row
        return s if s > 0 and all(p == ptrs[0] + i * s for i, p in enumerate(ptrs)) else 0

    ds, ss = stride(dst), stride(src)
    if ds and ss:
        return [Copy2D(be, dst[0] + dst_off, ds, src[0] + src_off, ss, row, len(dst))]
    return [Copy2D(be, d + dst_off, row, s + src_off, row, row, 1) for d, s in zip(dst, src)]
