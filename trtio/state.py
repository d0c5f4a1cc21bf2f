"""Engine state bindings: inputs an engine updates in place (KV caches and alike) and KV lengths.

Each past/present pair (an output whose engine-declared alias, or ``present_*`` name, points at
an input) gets one tensor, allocated at the engine's profile-max shape and bound under both
names, so the engine updates it in place and its address never changes. Its bound shape is that
max shape, except a dynamic leading batch dimension, which follows the step's batch (TensorRT's
KVCacheUpdate wants the cache batch to equal the update batch; the row-major layout keeps each
batch slot at the same address whatever the batch).

``kv_lengths`` is the tensor behind ``kvcache_start_index``: viewed as ``[0]`` for an empty-cache
prefill (Edge-LLM's convention) and ``[batch]`` otherwise; ``lengths`` is its host mirror.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from trtio import names
from trtio.cuda.backend import Backend, Location, get_backend
from trtio.dtypes import DType
from trtio.engine import EngineIO
from trtio.errors import EngineError
from trtio.memory import Arena, HostStaging, MemoryReport, TensorRequest
from trtio.stream import StreamLike, as_stream
from trtio.tensor import Tensor
from trtio.tensor_map import TensorMap

__all__ = ["EngineState"]


class EngineState:
    """The in-place state of one engine (see module docstring)."""

    def __init__(self, engine_io: EngineIO, *, max_batch: int, backend: Backend | str | None = None,
                 name: str = "") -> None:
        self.name = name or engine_io.name
        self.max_batch = max_batch
        self.pairs = engine_io.state_pairs()
        be = get_backend(backend)
        requests = []
        self._dynamic_batch: dict[str, bool] = {}
        self._max_shape: dict[str, tuple[int, ...]] = {}
        for past, _present in self.pairs:
            info = engine_io[past]
            shape = info.max_shape()
            if any(d < 0 for d in shape):
                raise EngineError(f"engine {engine_io.name!r}: state input {past!r} has no bounded max shape "
                                  f"({shape}); its profiles must bound every dimension")
            self._max_shape[past] = shape
            self._dynamic_batch[past] = bool(info.shape) and info.shape[0] < 0
            requests.append(TensorRequest(past, shape, info.dtype, Location.DEVICE))
        self.has_start_index = names.kKVCacheStartIndex in engine_io
        requests.append(TensorRequest.of("kv_lengths", (max_batch,), DType.INT32))
        requests.append(TensorRequest.of("host_kv_lengths", (max_batch,), DType.INT32, Location.PINNED))
        self._arena = Arena(requests, backend=be, title=f"{self.name} state")
        self.tensors: dict[str, Tensor] = {past: self._arena[past] for past, _ in self.pairs}
        self.kv_lengths = self._arena["kv_lengths"]
        self._staging = HostStaging(self._arena["host_kv_lengths"], self.kv_lengths, be)
        self.lengths = np.zeros(max_batch, dtype=np.int64)
        self._closed = False

    # -- binding ----------------------------------------------------------------------------------
    def bind(self, tm: TensorMap) -> None:
        """Add every state binding (both names of each pair, and ``kvcache_start_index``) to ``tm``."""
        for past, present in self.pairs:
            tm.add(past, self.tensors[past])
            tm.add(present, self.tensors[past])
        if self.has_start_index:
            tm.add(names.kKVCacheStartIndex, self.kv_lengths)

    def stable_names(self) -> set[str]:
        """Bindings only this state's executor reshapes."""
        return {n for pair in self.pairs for n in pair}

    def shape_for(self, name: str, batch: int) -> tuple[int, ...]:
        """The bound shape of a state tensor for a step of ``batch`` sequences."""
        shape = self._max_shape[name]
        return (batch,) + shape[1:] if self._dynamic_batch[name] else shape

    def shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        """Bound shapes of every state binding (both names of each pair) for ``batch``."""
        out = {}
        for past, present in self.pairs:
            out[past] = out[present] = self.shape_for(past, batch)
        return out

    # -- KV bookkeeping -----------------------------------------------------------------------------
    def commit_path(self, seq: int, start: int, path: Sequence[int], stream: StreamLike = None) -> None:
        """Move each cache entry of slot ``start + path[j]`` to ``start + j`` (every layer, K and V) for
        sequence slot ``seq``: the accepted path of a verified tree becomes consecutive cache entries.

        ``path`` is strictly increasing, so every entry is read before a later move overwrites it.
        """
        s = as_stream(stream, self._arena.backend)
        for j, node in enumerate(path):
            if node == j:
                continue
            for past, _present in self.pairs:
                t = self.tensors[past]
                shape = self._max_shape[past]
                if len(shape) != 4:
                    raise EngineError(f"state {past!r}: {shape} is not a [batch, heads, capacity, head_dim] cache")
                _, heads, cap, hd = shape
                es = t.dtype.itemsize
                pitch = cap * hd * es
                base = t.data_ptr + seq * heads * pitch
                self._arena.backend.memcpy_2d(base + (start + j) * hd * es, pitch, base + (start + node) * hd * es,
                                              pitch, hd * es, heads, s.handle)

    # -- kv lengths -------------------------------------------------------------------------------
    def upload_start_index(self, values: np.ndarray | None, stream: StreamLike = None) -> Tensor:
        """Stage int32 ``values`` [batch] into ``kv_lengths``; None views it as ``[0]`` (empty cache)."""
        if values is None:
            return self.kv_lengths.reshape((0,))
        return self._staging.upload(np.asarray(values, dtype=np.int32), stream)

    def reset(self, stream: StreamLike = None, *, clear: bool = False) -> None:
        """Forget every cached token (lengths to 0); ``clear=True`` also zeroes the state tensors."""
        self.lengths[:] = 0
        if clear:
            for t in self.tensors.values():
                t.zero_(stream)

    # -- reporting and lifetime ---------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return sum(t.capacity for t in self.tensors.values())

    def memory_report(self) -> MemoryReport:
        return self._arena.report()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._staging.close()
        for t in self.tensors.values():
            t._unfreeze()
        for t in (self.kv_lengths,):
            t._unfreeze()
        self._arena.close()


    def __enter__(self) -> EngineState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
    def __repr__(self) -> str:
        return (f"EngineState({self.name!r}, {len(self.pairs)} pairs, "
                f"{math.ceil(self.nbytes / (1 << 20))} MiB)")
