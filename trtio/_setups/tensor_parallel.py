"""One LLM across N ranks: a tensor-parallel Edge-LLM directory's rank engines stepped in lockstep.

Edge-LLM 0.11 builds a model too large for one GPU as N rank engines (``config_world{N}.json``;
``docs/edgellm-assumptions.md`` section 7): each rank holds some of the attention heads and of the MLP, its own
KV pools (``kv_heads / N`` heads each), and all-reduces inside itself through Edge-LLM's ``AllReducePlugin``;
every rank takes the same step inputs and produces the full logits. :class:`TensorParallelLLMSetup` offers
:class:`~trtio._setups.llm.LLMSetup`'s step API over such ranks, by composition:

* each rank is an ordinary ``LLMSetup`` bound to its rank engine, on its own device, backend and stream, with
  the weights the engine reads from the checkpoint bound as constant inputs, and stepped through its public
  calls only;
* the ranks' threads and what happens when one fails are a :class:`~trtio._setups.ranks.RankGroup`. A step's
  inputs are given once; every rank is handed the same call. Rank 0 works on the caller's stream (its own
  setup orders it after its last call), the others on their own streams, after an event recorded on the
  caller's stream (so a device tensor the caller just wrote is ready); the logits view is rank 0's. A decode
  whose plan holds on every rank (:attr:`LLMSetup.decode_planned`: no check, no staging, a graph replay) is
  enqueued for every rank from the calling thread where the device runs apart from the host (GPUs): nothing in
  it blocks in a collective;
* the communicators (one per rank) are made before the engines and registered where the rank engines look for
  them: on GPUs NCCL through ``nccl4py`` registered with the plugin library (:mod:`trtio._nccl`), on the host
  backend an in-process group (:mod:`trtio._collectives`).

Slots and pages (admissions, releases, pages on demand, pinned prefixes) work as on one engine: every rank
gets the same calls, so every rank's page table makes the same choices (one page-table model, a pool per
rank); :attr:`kv_pages`, :attr:`active` and :attr:`lengths` are rank 0's. A call every rank refuses (bad
input, a slot that is not free, a pool that is short) is refused before any rank changes anything: the ranks
check the same things on the same state. A rank that fails fails the whole step (the group's rules); a step
after which the ranks no longer hold the same sequences leaves the setup broken: every later step raises,
naming the failure, and :meth:`close` still releases everything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from trtio import _collectives as collectives
from trtio._cache import BoundedCache
from trtio._config import LLMEngineConfig
from trtio._cuda.backend import Backend, Location, get_backend
from trtio._engine import EngineExecutor
from trtio._lifetime import Closeable
from trtio._memory import MemoryEntry, MemoryReport
from trtio._pages import Prefix
from trtio._pipeline_io import PipelineIO
from trtio._setups.base import EngineGraphStats
from trtio._setups.binding import BoundEngine
from trtio._setups.calls import Calls, one_thread
from trtio._setups.llm import LLMSetup
from trtio._setups.ranks import RankGroup, check_devices, stop_all
from trtio._setups.sequences import KVPages
from trtio._state import EngineState
from trtio._stream import Event, Stream, StreamLike, as_stream
from trtio._tensor import Tensor
from trtio._tensor_map import TensorMap
from trtio.errors import EngineError, InvalidTypeError

__all__ = ["RankSpec", "TensorParallelLLMSetup", "TensorParallelPrefix", "check_devices", "close_constant",
           "ranks_memory_report"]

T = TypeVar("T")

_cuda_backends: dict[int, Backend] = {}
_cuda_lock = threading.Lock()


def _cuda_backend(device: int) -> Backend:
    """The cuda backend of ``device``; ``device`` is the calling thread's current device afterwards (making the
    shared backend makes device 0 current)."""
    from cuda.bindings import runtime  # noqa: PLC0415 - only for tensor parallelism on GPUs

    from trtio._cuda.device import CudaBackend  # noqa: PLC0415

    found = get_backend("cuda")
    if found.device_id != device:
        with _cuda_lock:
            found = _cuda_backends.get(device) or _cuda_backends.setdefault(device, CudaBackend(device))
    err = runtime.cudaSetDevice(device)[0]
    if err != runtime.cudaError_t.cudaSuccess:
        raise EngineError(f"cudaSetDevice({device}) failed: {err}")
    return found


# -- prefixes --------------------------------------------------------------------------------------------


class TensorParallelPrefix(Prefix):
    """A pinned prefix of a tensor-parallel setup: the same prefix pinned in every rank's pool (see
    :class:`~trtio._pages.Prefix`); releasing it releases every rank's."""

    def __init__(self, owner: object, ranks: Sequence[Prefix]) -> None:
        self._ranks = tuple(ranks)
        super().__init__(owner, ranks[0].tokens, {}, {}, positions=ranks[0].positions)

    def rank(self, rank: int) -> Prefix:
        """Rank ``rank``'s prefix."""
        self._check_open()
        return self._ranks[rank]

    def _close_owned(self) -> None:
        with contextlib.ExitStack() as release:  # every rank's is released; the first failure raises
            for p in self._ranks:
                release.callback(p.release)


# -- the setup ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RankSpec:
    """What one rank is made of: its config, its device, how to load its engine (called on the rank's thread,
    with its device current) and the weight inputs to bind (host arrays by engine input name)."""

    config: LLMEngineConfig
    device: int
    load: Callable[[], Any]
    weights: Mapping[str, np.ndarray]


class TensorParallelLLMSetup(Closeable):
    """:class:`~trtio._setups.llm.LLMSetup`'s step API over the rank engines of a tensor-parallel build (see the
    module docstring); made by ``create_from_engine_dir`` for a ``config_world{N}.json`` directory.

    ``cfg`` is the whole model's config; :attr:`ranks` the bound rank engines, :attr:`rank_setups` the per-rank
    setups (read them, do not step them), :attr:`devices` the device of each rank. ``io`` is rank 0's
    PipelineIO: its ``output_logits`` is what the steps return, and a step given ``io.inputs_embeds`` (written
    in place on the step's stream) copies it to the other ranks.
    """

    visual = None  # no vision encoder: a tensor-parallel directory with visual/ is refused
    audio = None  # no audio encoder: likewise with audio/

    def __init__(self, model: LLMEngineConfig, ranks: Sequence[RankSpec], stream: StreamLike = None, *,
                 backend: str | Backend, graphs: bool = False, plugins: Sequence[str] = ()) -> None:
        kind = backend if isinstance(backend, str) else ("cuda" if backend.name == "cuda" else "host")
        if kind not in ("host", "cuda") or (kind == "cuda" and not isinstance(backend, str)):
            raise InvalidTypeError(f"TensorParallelLLMSetup: backend must be 'host', 'cuda' (a backend per device, "
                                   f"made here) or a host Backend instance, got {backend!r}")
        host: Backend = get_backend("host") if isinstance(backend, str) else backend
        self.cfg = model
        self._kind = kind
        self._devices = tuple(r.device for r in ranks)
        self._group = RankGroup(self._devices, kind, type(self).__name__)
        # The backstop stops the rank threads where the setup is collected unclosed.
        self._init_lifetime(f"this TensorParallelLLMSetup ({len(ranks)} ranks)", stop_all, self._group.workers)
        self._views: list[BoundedCache[tuple[Any, ...], Tensor]] = [BoundedCache() for _ in ranks]
        self._last_inputs: tuple[Any, tuple[int, ...], list[Any]] = (None, (), [])  # _inputs' last answer
        self._owner = object()  # what this setup's prefixes name as their maker
        with contextlib.ExitStack() as stack:
            stack.callback(self._group.stop)
            self._backends = self._group.on_ranks(
                lambda r: host if kind == "host" else _cuda_backend(self._devices[r]))
            self._backend = self._backends[0]
            # one_thread's state (each rank setup keeps its own pools, its own call order and what its copies read)
            self._calls = self._group.on_rank(0, lambda: Calls(self._backend, type(self).__name__, holds=False))
            stack.callback(self._group.on_rank, 0, self._calls.close)
            # Where device work runs apart from the host (GPUs; the dry-run backend runs none), a decode whose plan
            # holds on every rank is enqueued for every rank from the calling thread; the host backend runs device
            # work, the host group's all-reduce included, as it is enqueued: its ranks step on their threads.
            self._enqueue_here = kind == "cuda" or self._backend.name != "host"
            self._make_communicators(stack, plugins)
            caller = as_stream(stream, self._backend) if stream is not None else None
            self._streams: list[Stream] = self._group.on_ranks(lambda r: Stream.create(self._backends[r]))
            for r, s in enumerate(self._streams):
                stack.callback(self._group.on_rank, r, s.close)
            self._constants = self._group.on_ranks(lambda r: self._upload(r, ranks[r].weights))
            for r, consts in enumerate(self._constants):
                for t in consts.values():
                    stack.callback(self._group.on_rank, r, functools.partial(close_constant, t))

            def build(r: int) -> LLMSetup:
                construct = caller if r == 0 and caller is not None else self._streams[r]
                return LLMSetup(ranks[r].load(), ranks[r].config, construct, graphs=graphs, backend=self._backends[r],
                                constants=self._constants[r])

            self._rank_setups: list[LLMSetup] = self._group.on_ranks(build, close=lambda s: s.close())
            for r, setup in enumerate(self._rank_setups):
                stack.callback(self._group.on_rank, r, setup.close)
            self._ready = self._group.on_rank(0, lambda: Event.create(self._backend))  # on rank 0's device
            stack.callback(self._group.on_rank, 0, self._ready.close)
            self._resources = stack.pop_all()
        self.io: PipelineIO = self._rank_setups[0].io

    # -- construction helpers -------------------------------------------------------------------------
    def _make_communicators(self, stack: contextlib.ExitStack, plugins: Sequence[str]) -> None:
        """One communicator per rank, registered where the rank engines look for theirs."""
        if self._kind == "host":
            group = stack.enter_context(collectives.HostGroup(len(self._devices)))
            members = [group.member(r) for r in range(group.size)]
            collectives.register(self._devices, members)
            stack.callback(collectives.unregister, self._devices, members)
            self._group.aborts = group
            return
        from trtio._nccl import NcclCommunicators, PluginRegistration  # noqa: PLC0415 - GPUs only
        from trtio._trt import load_plugins  # noqa: PLC0415 - GPUs only

        libraries = load_plugins(plugins)  # before the engines deserialize: they look their communicator up
        comms = stack.enter_context(NcclCommunicators(self._devices))
        self._group.nccl = comms
        stack.enter_context(PluginRegistration(libraries, self._devices, comms.pointers, comms.all_reduce_function))

    def _upload(self, rank: int, weights: Mapping[str, np.ndarray]) -> dict[str, Tensor]:
        """Rank ``rank``'s weight inputs as device tensors (its thread, its stream; synchronised)."""
        out: dict[str, Tensor] = {}
        s = self._streams[rank]
        try:
            for name, value in weights.items():
                t = Tensor.empty(value.shape, value.dtype, Location.DEVICE, name=name, backend=self._backends[rank])
                out[name] = t
                t.copy_from(value, s)
            s.synchronize()
        except BaseException:
            for t in out.values():
                t.close()
            raise
        return out

    # -- stepping the ranks ----------------------------------------------------------------------------------
    def _lockstep(self, what: str, step: Callable[[int, Stream], T], stream: StreamLike, x: Any = None, *,
                  here: bool = False) -> T:
        """``step(rank, stream)`` on every rank in lockstep (the group's rules, module docstring); rank 0's result.
        ``x``: the step's input, its producer ordered before the caller's stream ahead of the event the other
        ranks wait on. ``here``: every rank's step enqueued from the calling thread."""
        self._check_open()
        s = as_stream(stream, self._backend)
        if type(x) is Tensor and x._last_stream is not None:
            x._order_consumer(s.handle)  # every rank reads x after the event recorded below
        self._ready.record(s)
        jobs: list[Callable[[], T]] = [functools.partial(step, 0, s)]
        jobs += [functools.partial(self._after_ready, step, r) for r in range(1, self._group.size)]
        return self._group.step(what, jobs, self._ranks_agree, here=here)

    def _after_ready(self, step: Callable[[int, Stream], T], rank: int) -> T:
        """Rank ``rank`` (> 0): its stream waits for the caller's, then it steps."""
        rs = self._streams[rank]
        self._backends[rank].wait_event(rs.handle, self._ready.handle)
        return step(rank, rs)

    def _ranks_agree(self) -> bool:
        first = self._rank_setups[0]
        for other in self._rank_setups[1:]:
            if not (np.array_equal(first.active, other.active) and np.array_equal(first.lengths, other.lengths)):
                return False
        return True

    def _inputs(self, x: Any) -> Sequence[Any]:
        """A step's ``inputs_embeds`` as each rank takes it. A Tensor (often rank 0's ``io.inputs_embeds``, written
        in place) is given to the other ranks as a view of its memory at its current shape, which they copy on
        their streams after the caller's: rank 0 reshapes the tensor itself while they read it."""
        if not isinstance(x, Tensor):
            return [x] * self._group.size
        last = self._last_inputs
        if last[0] is x and x._shape == last[1]:  # the same tensor at the same shape as the last step
            x._live()  # refuses a closed tensor here, before any rank reads its memory
            return last[2]
        shape = x.shape  # refuses a closed tensor here, before any rank reads its memory
        out = [x]
        for r in range(1, self._group.size):
            key = (x.data_ptr, shape, x.dtype, x.location)
            view = self._views[r].get(key)
            if view is None:
                view = self._views[r].put(key, Tensor.wrap(x.data_ptr, shape, x.dtype, x.location, name=x.name,
                                                           backend=self._backends[r]))
            out.append(view)
        self._last_inputs = (x, shape, out)
        return out

    def _prefixes(self, prefix: Any, rank: int) -> Any:
        """The prefix argument as rank ``rank`` takes it (each tensor-parallel prefix by its rank's)."""
        if prefix is None:
            return None
        if isinstance(prefix, Prefix):
            return self._rank_prefix(prefix, 0, rank)
        return [None if p is None else self._rank_prefix(p, i, rank) for i, p in enumerate(prefix)]

    def _rank_prefix(self, p: Any, i: int, rank: int) -> Any:
        if not isinstance(p, TensorParallelPrefix):
            return p  # refused by the rank's own checks, naming it
        p.check(self._owner, f"prefill: prefix[{i}]")
        return p.rank(rank)

    # -- public views ----------------------------------------------------------------------------------------
    @property
    def devices(self) -> tuple[int, ...]:
        """The device of each rank (host labels on the host backend)."""
        return self._devices

    @property
    def tp_size(self) -> int:
        return len(self._devices)

    @property
    def contract(self) -> str:
        return self._rank_setups[0].contract

    @property
    def is_broken(self) -> bool:
        """Whether a rank's setup is broken (``reset()`` repairs it, as for one engine), or the ranks no longer
        agree or their communicators were aborted (only ``close()`` remains: every step says so)."""
        return self._group.broken is not None or any(s.is_broken for s in getattr(self, "_rank_setups", ()))

    @property
    def ranks(self) -> list[BoundEngine]:
        """The bound rank engines, by rank."""
        self._check_open()
        return [s.engines()[0] for s in self._rank_setups]

    @property
    def rank_setups(self) -> list[LLMSetup]:
        """Each rank's LLMSetup (for reading; the steps of this setup step them all)."""
        self._check_open()
        return list(self._rank_setups)

    def engines(self) -> list[BoundEngine]:
        return self.ranks

    @property
    def state(self) -> EngineState:
        """Rank 0's KV state."""
        return self._rank_setups[0].state

    @property
    def executor(self) -> EngineExecutor:
        """Rank 0's executor."""
        return self._rank_setups[0].executor

    @property
    def tensor_map(self) -> TensorMap:
        """Rank 0's tensor map."""
        return self._rank_setups[0].tensor_map

    @property
    def graph_stats(self) -> EngineGraphStats:
        """CUDA-graph telemetry of every rank: ``graph_stats["rank0"]``, ...; the counts as attributes are sums."""
        return EngineGraphStats([dataclasses.replace(e, role=f"rank{r}") for r, e in enumerate(self.ranks)])

    @property
    def lengths(self) -> np.ndarray:
        return self._rank_setups[0].lengths

    @property
    def active(self) -> np.ndarray:
        return self._rank_setups[0].active

    @property
    def batch(self) -> int | None:
        return self._rank_setups[0].batch

    @property
    def kv_pages(self) -> KVPages:
        """Rank 0's pool (every rank's pool holds the same pages of its own heads)."""
        self._check_open()
        return self._rank_setups[0].kv_pages

    @property
    def rope_deltas(self) -> np.ndarray:
        """Rank 0's (every rank keeps the same)."""
        return self._rank_setups[0].rope_deltas

    @property
    def decode_planned(self) -> bool:
        """Whether the next decode of every active sequence runs every rank's plan as it is."""
        return all(s.decode_planned for s in self._rank_setups)

    # -- steps ------------------------------------------------------------------------------------------------
    @one_thread
    def prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None, *,
                slots: Sequence[int] | None = None, prefix: Prefix | Sequence[Prefix | None] | None = None,
                past_lengths: Any = None, deepstack_embeds: Sequence[Any] | None = None,
                mrope_positions: Any = None, ple_embeds: Any = None) -> Tensor:
        """:meth:`LLMSetup.prefill` on every rank (the same inputs, copied to each rank's device); rank 0's logits
        view. ``prefix``: prefixes of this setup's :meth:`pin_prefix`. ``ple_embeds`` goes to every rank as given
        (host arrays: each rank stages its own copy)."""
        x = self._inputs(inputs_embeds)
        return self._lockstep("prefill", lambda r, s: self._rank_setups[r].prefill(
            x[r], context_lengths, s, slots=slots, prefix=self._prefixes(prefix, r),
            past_lengths=past_lengths, deepstack_embeds=deepstack_embeds, mrope_positions=mrope_positions,
            ple_embeds=ple_embeds), stream, inputs_embeds)

    @one_thread
    def decode(self, inputs_embeds: Any, stream: StreamLike = None, *, slots: Sequence[int] | None = None,
               ple_embeds: Any = None) -> Tensor:
        """:meth:`LLMSetup.decode` on every rank; rank 0's logits view. No allocation, no host synchronisation.
        Where the device runs apart from the host and every rank's plan holds, every rank's step is enqueued from
        the calling thread (module docstring). ``ple_embeds``: as :meth:`prefill` takes them."""
        x = self._inputs(inputs_embeds)
        here = self._enqueue_here and slots is None and ple_embeds is None and type(inputs_embeds) is Tensor \
            and self.decode_planned
        return self._lockstep("decode", lambda r, s: self._rank_setups[r].decode(x[r], s, slots=slots,
                                                                                 ple_embeds=ple_embeds),
                              stream, inputs_embeds, here=here)

    @one_thread
    def reset(self, stream: StreamLike = None) -> None:
        """End every sequence on every rank (pinned prefixes stay)."""
        self._lockstep("reset", lambda r, s: self._rank_setups[r].reset(s), stream)

    @one_thread
    def populate_streaming(self, stream: StreamLike = None) -> None:
        """:meth:`LLMSetup.populate_streaming` on every rank (Edge-LLM's tensor-parallel engines declare no
        ``hidden_states``: refused by the ranks)."""
        self._lockstep("populate_streaming", lambda r, s: self._rank_setups[r].populate_streaming(s), stream)

    @one_thread
    def release(self, slots: Sequence[int], stream: StreamLike = None) -> None:
        """End the sequences of ``slots`` on every rank (host bookkeeping: rank 0 checks, then every rank
        releases)."""
        self._check_open()
        self._rank_setups[0].release(slots, stream)
        for setup in self._rank_setups[1:]:
            setup.release(slots)

    @one_thread
    def pin_prefix(self, slot: int, tokens: int, stream: StreamLike = None) -> Prefix:
        """Pin the first ``tokens`` KV entries of ``slot``'s sequence in every rank's pool; one
        :class:`TensorParallelPrefix` for all of them. ``stream``: rank 0's (the others' work, where a hybrid
        model has any, goes on their own streams)."""
        self._check_open()
        first = self._rank_setups[0].pin_prefix(slot, tokens, stream)
        pinned = [first]
        try:
            for setup in self._rank_setups[1:]:
                pinned.append(setup.pin_prefix(slot, tokens))
        except BaseException:
            for p in pinned:
                p.release()
            raise
        return TensorParallelPrefix(self._owner, pinned)

    def memory_report(self, *, include_context_memory: bool = True) -> MemoryReport:
        """Every rank's buffers (its setup's and its checkpoint weights), each entry's group naming the rank."""
        self._check_open()
        return ranks_memory_report("create_from_engine_dir (tensor parallel)",
                                   [s.memory_report(include_context_memory=include_context_memory)
                                    for s in self._rank_setups], self._constants)

    def __repr__(self) -> str:
        if self._closed:
            return f"TensorParallelLLMSetup({self.tp_size} ranks, closed)"
        return (f"TensorParallelLLMSetup({self.tp_size} ranks on {self._kind} devices {list(self._devices)}, "
                f"active={self._rank_setups[0].active.tolist()})")

    def _close_owned(self) -> None:
        try:
            self._resources.close()
        finally:
            self._group.stop()


def ranks_memory_report(title: str, reports: Sequence[MemoryReport], weights: Sequence[Mapping[str, Tensor]], *,
                        first_rank: int = 0) -> MemoryReport:
    """One report of each rank's setup report and weight inputs (ranks ``first_rank``, ``first_rank + 1``, ...),
    each entry's group naming its rank."""
    out = MemoryReport(title)
    for r, (report, consts) in enumerate(zip(reports, weights), start=first_rank):
        own = MemoryReport("checkpoint weights")
        for name, t in consts.items():
            own.entries.append(MemoryEntry(name, t.shape, str(t.dtype), str(t.location), t.capacity,
                                           group="checkpoint weights"))
            loc = str(t.location)
            own.allocated[loc] = own.allocated.get(loc, 0) + t.capacity
            own.allocations[loc] = own.allocations.get(loc, 0) + 1
        for part in (report, own):
            for e in part.entries:
                out.entries.append(dataclasses.replace(e, group=f"rank {r}" + (f" {e.group}" if e.group else "")))
            for loc, n in part.allocated.items():
                out.allocated[loc] = out.allocated.get(loc, 0) + n
            for loc, n in part.allocations.items():
                out.allocations[loc] = out.allocations.get(loc, 0) + n
    out.notes.extend(reports[0].notes if reports else ())
    return out


def close_constant(t: Tensor) -> None:
    """Free a weight input once its rank's setup is closed (its tensor map froze it, as the RoPE tables are)."""
    t._unfreeze()
    t.close()
