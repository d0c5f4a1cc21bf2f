"""One LLM across N ranks: a tensor-parallel Edge-LLM directory's rank engines stepped in lockstep.

Edge-LLM 0.11 builds a model too large for one GPU as N rank engines (``config_world{N}.json``; DESIGN §13,
``docs/edgellm-assumptions.md`` section 7): each rank holds some of the attention heads and of the MLP, its own
KV pools (``kv_heads / N`` heads each), and all-reduces inside itself through Edge-LLM's ``AllReducePlugin``;
every rank takes the same step inputs and produces the full logits. :class:`TensorParallelLLMSetup` is an
:class:`~trtio.setups.llm.LLMSetup` over such ranks:

* each rank is an ordinary ``LLMSetup`` bound to its rank engine, on its own device, backend and stream, with
  the weights the engine reads from the checkpoint bound as constant inputs;
* each rank has one persistent thread (:class:`_RankWorker`) that sets its device once and runs everything of
  that rank: loading the engine, binding it, every step, closing. A step's inputs are given once; the calling
  thread hands the same call to every rank thread and waits for all of them. Rank 0 works on the caller's
  stream, the others on their own streams, after an event recorded on the caller's stream (so a device tensor
  the caller just wrote is ready); the logits view is rank 0's;
* the communicators (one per rank) are made before the engines and registered where the rank engines look for
  them: on GPUs NCCL through ``nccl4py`` registered with the plugin library (:mod:`trtio.nccl`), on the host
  backend an in-process group (:mod:`trtio.collectives`).

Slots and pages (§12) work as on one engine: every rank gets the same calls, so every rank's page table makes
the same choices (one page-table model, a pool per rank); :attr:`kv_pages`, :attr:`active` and :attr:`lengths`
are rank 0's. A call every rank refuses (bad input, a slot that is not free, a pool that is short) is refused
before any rank changes anything: the ranks check the same things on the same state.

A rank that fails to enqueue fails the whole step, and no rank is left waiting in a collective: on the host the
group is aborted at once; on GPUs, where every rank refused the step the communicators stay, else they are
aborted (``ncclCommAbort``), which ends collectives in flight. A step after which the ranks no longer hold the
same sequences leaves the setup broken: every later step raises, naming the failure, and :meth:`close` still
releases everything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from trtio import collectives
from trtio.config import LLMEngineConfig
from trtio.cuda.backend import Backend, Location, get_backend
from trtio.engine import EngineExecutor
from trtio.errors import ConfigError, EngineError, InvalidTypeError, TrtioError
from trtio.memory import MemoryEntry, MemoryReport
from trtio.pages import Prefix
from trtio.pipeline_io import PipelineIO
from trtio.setups.base import EngineGraphStats
from trtio.setups.binding import BoundEngine
from trtio.setups.llm import LLMSetup
from trtio.setups.sequences import KVPages
from trtio.state import EngineState
from trtio.stream import Event, Stream, StreamLike, as_stream
from trtio.tensor import Tensor
from trtio.tensor_map import TensorMap

__all__ = ["RankSpec", "TensorParallelLLMSetup", "TensorParallelPrefix", "check_devices", "close_constant",
           "ranks_memory_report"]

T = TypeVar("T")

#: How long the other ranks of a GPU step get to return after one failed, before the communicators are
#: aborted (a rank blocked in an NCCL call waits for the failed one; ranks that only refused return at once).
FAILURE_GRACE_SECONDS = 2.0
#: How long ranks get to return after their communicators were aborted.
ABORT_WAIT_SECONDS = 60.0

_cuda_backends: dict[int, Backend] = {}
_cuda_lock = threading.Lock()


def _cuda_backend(device: int) -> Backend:
    """The cuda backend of ``device`` (created on the calling thread, whose current device it becomes)."""
    from trtio.cuda.device import CudaBackend  # noqa: PLC0415 - only for tensor parallelism on GPUs

    shared = get_backend("cuda")
    if shared.device_id == device:
        return shared
    with _cuda_lock:
        found = _cuda_backends.get(device)
        if found is None:
            found = _cuda_backends[device] = CudaBackend(device)
        return found


# -- rank threads --------------------------------------------------------------------------------------


class _Round:
    """One call handed to ``expect`` of ``size`` ranks: what each returned or raised (by rank), and when the
    caller may go on."""

    def __init__(self, size: int, expect: int | None = None) -> None:
        self.cond = threading.Condition()
        self.left = size if expect is None else expect
        self.results: list[Any] = [None] * size
        self.raised: list[BaseException | None] = [None] * size
        self.done = [False] * size

    @property
    def errors(self) -> dict[int, BaseException]:
        """What raised, by rank."""
        return {r: e for r, e in enumerate(self.raised) if e is not None}

    @property
    def failed(self) -> bool:
        return any(e is not None for e in self.raised)

    def report(self, rank: int, result: Any, error: BaseException | None) -> None:
        with self.cond:
            self.results[rank] = result
            self.raised[rank] = error
            self.done[rank] = True
            self.left -= 1
            self.cond.notify()


class _RankWorker:
    """The persistent thread of one rank: sets the rank's device once, then runs the calls it is handed, in
    order."""

    def __init__(self, rank: int, device: int, kind: str) -> None:
        self.rank = rank
        self.device = device
        self._kind = kind
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], _Round] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"trtio-tp-rank{rank}", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], Any], round_: _Round) -> None:
        self._jobs.put((job, round_))

    def _loop(self) -> None:
        started = self._start()
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, round_ = item
            if started is not None:
                round_.report(self.rank, None, started)
                continue
            try:
                result = job()
            except BaseException as exc:  # handed to the caller, which re-raises it
                round_.report(self.rank, None, exc)
            else:
                round_.report(self.rank, result, None)

    def _start(self) -> BaseException | None:
        """Make the rank's device this thread's; the error, to report for every call, where that fails."""
        try:
            if self._kind == "cuda":
                from cuda.bindings import runtime  # noqa: PLC0415 - GPUs only

                err = runtime.cudaSetDevice(self.device)[0]
                if err != runtime.cudaError_t.cudaSuccess:
                    raise EngineError(f"rank {self.rank}: cudaSetDevice({self.device}) failed: {err}")
            else:
                collectives.set_thread_device(self.device)
        except BaseException as exc:  # reported at the first call
            return exc
        return None

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()


# -- prefixes --------------------------------------------------------------------------------------------


class TensorParallelPrefix(Prefix):
    """A pinned prefix of a tensor-parallel setup: the same prefix pinned in every rank's pool (see
    :class:`~trtio.pages.Prefix`); releasing it releases every rank's."""

    def __init__(self, owner: object, ranks: Sequence[Prefix]) -> None:
        self._ranks = tuple(ranks)
        super().__init__(owner, ranks[0].tokens, {}, {})

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


class TensorParallelLLMSetup(LLMSetup):
    """An :class:`LLMSetup` over the rank engines of a tensor-parallel build (see the module docstring); made by
    ``create_from_engine_dir`` for a ``config_world{N}.json`` directory.

    ``cfg`` is the whole model's config; :attr:`ranks` the bound rank engines, :attr:`rank_setups` the per-rank
    setups (read them, do not step them), :attr:`devices` the device of each rank. ``io`` is rank 0's
    PipelineIO: its ``output_logits`` is what the steps return, and a step given ``io.inputs_embeds`` (written
    in place on the step's stream) copies it to the other ranks.
    """

    def __init__(self, model: LLMEngineConfig, ranks: Sequence[RankSpec], stream: StreamLike = None, *, backend: str,
                 graphs: bool = False, plugins: Sequence[str] = ()) -> None:
        if backend not in ("host", "cuda"):
            raise InvalidTypeError(f"TensorParallelLLMSetup: backend must be 'host' or 'cuda', got {backend!r}")
        self._init_lifetime(f"this TensorParallelLLMSetup ({len(ranks)} ranks)")
        self.cfg = model
        self._kind = backend
        self._devices = tuple(r.device for r in ranks)
        self._broken: str | None = None
        self._owner = object()  # what this setup's prefixes name as their maker
        self._workers: list[_RankWorker] = []
        self._group: collectives.HostGroup | None = None
        self._nccl: Any = None
        with contextlib.ExitStack() as stack:
            stack.callback(self._stop_workers)
            self._workers = [_RankWorker(r, spec.device, backend) for r, spec in enumerate(ranks)]
            self._backends = self._on_ranks(lambda r: get_backend("host") if backend == "host"
                                            else _cuda_backend(self._devices[r]))
            self._backend = self._backends[0]
            self._make_communicators(stack, plugins)
            caller = as_stream(stream, self._backend) if stream is not None else None
            self._streams: list[Stream] = self._on_ranks(lambda r: Stream.create(self._backends[r]))
            for r, s in enumerate(self._streams):
                stack.callback(self._on_rank, r, s.close)
            self._constants = self._on_ranks(lambda r: self._upload(r, ranks[r].weights))
            for r, consts in enumerate(self._constants):
                for t in consts.values():
                    stack.callback(self._on_rank, r, functools.partial(close_constant, t))

            def build(r: int) -> LLMSetup:
                construct = caller if r == 0 and caller is not None else self._streams[r]
                return LLMSetup(ranks[r].load(), ranks[r].config, construct, graphs=graphs, backend=self._backends[r],
                                constants=self._constants[r])

            self._rank_setups: list[LLMSetup] = self._on_ranks(build, close=lambda s: s.close())
            for r, setup in enumerate(self._rank_setups):
                stack.callback(self._on_rank, r, setup.close)
            self._ready = self._on_rank(0, lambda: Event.create(self._backend))  # on rank 0's device
            stack.callback(self._on_rank, 0, self._ready.close)
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
            self._group = group
            return
        from trtio.nccl import NcclCommunicators, PluginRegistration  # noqa: PLC0415 - GPUs only
        from trtio.trt import load_plugins  # noqa: PLC0415 - GPUs only

        libraries = load_plugins(plugins)  # before the engines deserialize: they look their communicator up
        comms = stack.enter_context(NcclCommunicators(self._devices))
        self._nccl = comms
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

    def _stop_workers(self) -> None:
        workers, self._workers = self._workers, []
        for w in workers:
            w.stop()

    # -- running on the ranks ------------------------------------------------------------------------------
    def _on_rank(self, rank: int, fn: Callable[[], T]) -> T:
        """``fn()`` on rank ``rank``'s thread (construction and closing, one rank at a time)."""
        round_ = _Round(len(self._workers), 1)
        self._workers[rank].submit(fn, round_)
        with round_.cond:
            round_.cond.wait_for(lambda: round_.left == 0)
        error = round_.raised[rank]
        if error is not None:
            raise error
        result: T = round_.results[rank]
        return result

    def _on_ranks(self, fn: Callable[[int], T], *, close: Callable[[T], None] | None = None) -> list[T]:
        """``fn(r)`` on every rank's thread at once, during construction: every result, or the first error
        (lowest rank) after the results that were made are closed with ``close``."""
        round_ = self._dispatch([functools.partial(fn, r) for r in range(len(self._workers))])
        with round_.cond:
            round_.cond.wait_for(lambda: round_.left == 0)
        errors = round_.errors
        if errors:
            if close is not None:
                for r, result in enumerate(round_.results):
                    if r not in errors:
                        with contextlib.suppress(Exception):
                            self._on_rank(r, functools.partial(close, result))
            raise errors[min(errors)]
        return list(round_.results)

    def _dispatch(self, jobs: Sequence[Callable[[], Any]]) -> _Round:
        round_ = _Round(len(jobs))
        for worker, job in zip(self._workers, jobs):
            worker.submit(job, round_)
        return round_

    def _step(self, what: str, step: Callable[[int, Stream], T], stream: StreamLike) -> T:
        """Run ``step(rank, stream)`` on every rank in lockstep (see the module docstring); rank 0's result."""
        self._check_open()
        if self._broken is not None:
            raise TrtioError(f"{what}: {self._broken}")
        s = as_stream(stream, self._backend)
        self._ready.record(s)

        def job(r: int) -> Any:
            if r == 0:
                return step(0, s)
            rs = self._streams[r]
            self._backends[r].wait_event(rs.handle, self._ready.handle)
            return step(r, rs)

        round_ = self._dispatch([functools.partial(job, r) for r in range(len(self._workers))])
        with round_.cond:
            round_.cond.wait_for(lambda: round_.left == 0 or round_.failed)
            if round_.left:
                self._after_failure(round_)
        if round_.failed:
            self._settle(what, round_)
        result: T = round_.results[0]
        return result

    def _after_failure(self, round_: _Round) -> None:
        """A rank failed while others still run (``round_.cond`` held): make sure none is left waiting."""
        if self._group is not None:
            self._group.abort()  # the host group: ranks inside an all-reduce raise at once
        elif not round_.cond.wait_for(lambda: round_.left == 0, FAILURE_GRACE_SECONDS):
            self._nccl.abort()  # a rank is blocked in NCCL, waiting for the one that failed
        if not round_.cond.wait_for(lambda: round_.left == 0, ABORT_WAIT_SECONDS):
            failed = min(round_.errors)
            self._broken = (f"rank(s) {[r for r, done in enumerate(round_.done) if not done]} did not return "
                            f"within {ABORT_WAIT_SECONDS:g} s after rank {failed} failed")
            raise EngineError(self._broken) from round_.errors[failed]

    def _settle(self, what: str, round_: _Round) -> None:
        """After a failed step: the ranks' collectives are quiet again, or the setup is broken; raise the
        failure (that of the lowest rank that did not merely see the all-reduce aborted)."""
        errors = round_.errors
        primary = [r for r, e in errors.items() if not isinstance(e, collectives.CollectiveAbortedError)]
        rank = min(primary) if primary else min(errors)
        error = errors[rank]
        if self._group is not None:
            self._group.reset()
        elif len(errors) < len(self._workers):
            self._nccl.abort()  # some ranks enqueued collectives the failed ones never will
        if self._nccl is not None and self._nccl.aborted:
            self._broken = (f"rank {rank} (device {self._devices[rank]}) failed in {what} "
                            f"({type(error).__name__}: {error}) and the NCCL communicators were aborted; close this "
                            "setup and create a new one")
        elif not self._ranks_agree():
            self._broken = (f"rank {rank} (device {self._devices[rank]}) failed in {what} "
                            f"({type(error).__name__}: {error}) after other ranks had finished the step: the "
                            "ranks' sequences differ now; close this setup and create a new one")
        raise error

    def _ranks_agree(self) -> bool:
        first = self._rank_setups[0]
        for other in self._rank_setups[1:]:
            if not (np.array_equal(first.active, other.active) and np.array_equal(first.lengths, other.lengths)):
                return False
        return True

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

    # -- steps ------------------------------------------------------------------------------------------------
    def prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None, *,
                slots: Sequence[int] | None = None, prefix: Prefix | Sequence[Prefix | None] | None = None,
                past_lengths: Any = None, deepstack_embeds: Sequence[Any] | None = None) -> Tensor:
        """:meth:`LLMSetup.prefill` on every rank (the same inputs, copied to each rank's device); rank 0's logits
        view. ``prefix``: prefixes of this setup's :meth:`pin_prefix`."""
        return self._step("prefill", lambda r, s: self._rank_setups[r].prefill(
            inputs_embeds, context_lengths, s, slots=slots, prefix=self._prefixes(prefix, r),
            past_lengths=past_lengths, deepstack_embeds=deepstack_embeds), stream)

    def decode(self, inputs_embeds: Any, stream: StreamLike = None, *, slots: Sequence[int] | None = None) -> Tensor:
        """:meth:`LLMSetup.decode` on every rank; rank 0's logits view. No allocation, no host synchronisation."""
        return self._step("decode", lambda r, s: self._rank_setups[r].decode(inputs_embeds, s, slots=slots), stream)

    def reset(self, stream: StreamLike = None) -> None:
        """End every sequence on every rank (pinned prefixes stay)."""
        self._step("reset", lambda r, s: self._rank_setups[r].reset(s), stream)

    def populate_streaming(self, stream: StreamLike = None) -> None:
        """:meth:`LLMSetup.populate_streaming` on every rank (Edge-LLM's tensor-parallel engines declare no
        ``hidden_states``: refused by the ranks)."""
        self._step("populate_streaming", lambda r, s: self._rank_setups[r].populate_streaming(s), stream)

    def release(self, slots: Sequence[int], stream: StreamLike = None) -> None:
        """End the sequences of ``slots`` on every rank (host bookkeeping: rank 0 checks, then every rank
        releases)."""
        self._check_open()
        self._rank_setups[0].release(slots, stream)
        for setup in self._rank_setups[1:]:
            setup.release(slots)

    def pin_prefix(self, slot: int, tokens: int) -> Prefix:
        """Pin the first ``tokens`` KV entries of ``slot``'s sequence in every rank's pool; one
        :class:`TensorParallelPrefix` for all of them."""
        self._check_open()
        first = self._rank_setups[0].pin_prefix(slot, tokens)
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
            super()._close_owned()
        finally:
            self._stop_workers()


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


def check_devices(devices: Any, size: int, kind: str) -> tuple[int, ...]:
    """``devices`` (None: ``range(size)``) as ``size`` distinct device ids; ConfigError naming ``devices``."""
    if devices is None:
        found = tuple(range(size))
    else:
        if isinstance(devices, (str, bytes)) or not hasattr(devices, "__len__"):
            raise ConfigError("devices", f"expected {size} device ids (one per rank), got {type(devices).__name__} "
                                         f"{devices!r}")
        found = tuple(devices)
        if len(found) != size or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0
                                         for d in found):
            raise ConfigError("devices", f"expected {size} device ids >= 0 (one per rank), got {list(found)}")
        found = tuple(int(d) for d in found)
        if len(set(found)) != size:
            raise ConfigError("devices", f"{list(found)} names a device twice: each rank needs a device of its own")
    if kind == "cuda":
        from trtio.cuda.device import probe_device_count  # noqa: PLC0415 - GPUs only

        count = probe_device_count()
        beyond = [d for d in found if d >= count]
        if beyond:
            raise ConfigError("devices", f"{list(found)}: device {beyond[0]} does not exist here ({count} CUDA "
                                         f"device(s)); a {size}-rank directory needs {size} local GPUs")
    return found

