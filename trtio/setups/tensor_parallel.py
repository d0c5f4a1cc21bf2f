"""One LLM across N ranks: a tensor-parallel Edge-LLM directory's rank engines stepped in lockstep.

Edge-LLM 0.11 builds a model too large for one GPU as N rank engines (``config_world{N}.json``;
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

Slots and pages (admissions, releases, pages on demand, pinned prefixes) work as on one engine: every rank
gets the same calls, so every rank's page table makes the same choices (one page-table model, a pool per
rank); :attr:`kv_pages`, :attr:`active` and :attr:`lengths` are rank 0's. A call every rank refuses (bad
input, a slot that is not free, a pool that is short) is refused before any rank changes anything: the ranks
check the same things on the same state.

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
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from trtio import collectives
from trtio._cache import BoundedCache
from trtio.config import LLMEngineConfig
from trtio.cuda.backend import Backend, Location, get_backend
from trtio.engine import EngineExecutor
from trtio.errors import ConfigError, EngineError, InvalidTypeError, TrtioError
from trtio.memory import MemoryEntry, MemoryReport
from trtio.pages import Prefix, PrefixReturns
from trtio.pipeline_io import PipelineIO
from trtio.setups.base import EngineGraphStats, one_thread
from trtio.setups.binding import BoundEngine
from trtio.setups.llm import LLMSetup, _Steady
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
_POLL_SECONDS = 0.05  # how often the caller looks for a failed rank while it waits for another one

_cuda_backends: dict[int, Backend] = {}
_cuda_lock = threading.Lock()


def _cuda_backend(device: int) -> Backend:
    """The cuda backend of ``device``; ``device`` is the calling thread's current device afterwards (making the
    shared backend makes device 0 current)."""
    from cuda.bindings import runtime  # noqa: PLC0415 - only for tensor parallelism on GPUs

    from trtio.cuda.device import CudaBackend  # noqa: PLC0415

    found = get_backend("cuda")
    if found.device_id != device:
        with _cuda_lock:
            found = _cuda_backends.get(device) or _cuda_backends.setdefault(device, CudaBackend(device))
    err = runtime.cudaSetDevice(device)[0]
    if err != runtime.cudaError_t.cudaSuccess:
        raise EngineError(f"cudaSetDevice({device}) failed: {err}")
    return found


# -- rank threads --------------------------------------------------------------------------------------


class _RankWorker:
    """The persistent thread of one rank: sets the rank's device once, then runs the calls it is given, one at a
    time. A call is handed over and waited for through two locks (the cheapest hand-off Python has): :meth:`start`
    releases ``_go``, the thread releases ``_done`` when the call has returned or raised. ``on_error()(rank)``
    runs on the rank's thread as soon as a call raises (before ``_done``): ``on_error`` is a weak reference (a
    :class:`weakref.WeakMethod`), so the thread does not keep its setup alive."""

    def __init__(self, rank: int, device: int, kind: str,
                 on_error: Callable[[], Callable[[int], None] | None]) -> None:
        self.rank = rank
        self.device = device
        self._kind = kind
        self._on_error = on_error
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self._job: Callable[[], Any] | None = None
        self._stopping = False
        self.abandoned = False  # a call never returned: the thread is left to itself
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"trtio-tp-rank{rank}", daemon=True)
        self._thread.start()

    def start(self, job: Callable[[], Any]) -> None:
        """Hand ``job`` to the thread (the previous call has been waited for)."""
        if self.abandoned:
            raise EngineError(f"rank {self.rank}: its thread is still in a call that never returned")
        self._job = job
        self._go.release()

    def wait(self, timeout: float = -1) -> bool:
        """Whether the call returned (or raised) within ``timeout`` seconds (-1: wait as long as it takes)."""
        return self._done.acquire(timeout=timeout)

    def outcome(self) -> Any:
        """What the call that was waited for returned; what it raised is raised."""
        if self.error is not None:
            raise self.error
        return self.result

    def _loop(self) -> None:
        failed_start = self._start()
        while True:
            self._go.acquire()
            if self._stopping:
                return
            job, self._job = self._job, None
            try:
                if failed_start is not None:
                    raise failed_start
                assert job is not None
                self.result, self.error = job(), None
            except BaseException as exc:  # handed to the caller, which raises it
                self.result, self.error = None, exc
                on_error = self._on_error()
                if on_error is not None:
                    on_error(self.rank)
            del job  # the call's closure (and the setup it names) is not kept by an idle thread
            self._done.release()

    def _start(self) -> BaseException | None:
        """Make the rank's device this thread's; the error, raised for every call, where that fails."""
        try:
            if self._kind == "cuda":
                from cuda.bindings import runtime  # noqa: PLC0415 - GPUs only

                err = runtime.cudaSetDevice(self.device)[0]
                if err != runtime.cudaError_t.cudaSuccess:
                    raise EngineError(f"rank {self.rank}: cudaSetDevice({self.device}) failed: {err}")
            else:
                collectives.set_thread_device(self.device)
        except BaseException as exc:  # raised at the first call
            return exc
        return None

    def stop(self) -> None:
        """End the thread (no call may be running; an abandoned thread is left to end with the process)."""
        if self.abandoned:
            return
        self._stopping = True
        self._go.release()
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

    def __init__(self, model: LLMEngineConfig, ranks: Sequence[RankSpec], stream: StreamLike = None, *,
                 backend: str | Backend, graphs: bool = False, plugins: Sequence[str] = ()) -> None:
        kind = backend if isinstance(backend, str) else ("cuda" if backend.name == "cuda" else "host")
        if kind not in ("host", "cuda") or (kind == "cuda" and not isinstance(backend, str)):
            raise InvalidTypeError(f"TensorParallelLLMSetup: backend must be 'host', 'cuda' (a backend per device, "
                                   f"made here) or a host Backend instance, got {backend!r}")
        host: Backend = get_backend("host") if isinstance(backend, str) else backend
        self._workers: list[_RankWorker] = []  # filled in place: the backstop below stops what it holds then
        self._init_lifetime(f"this TensorParallelLLMSetup ({len(ranks)} ranks)", _stop_all, self._workers)
        self.cfg = model
        self._kind = kind
        self._devices = tuple(r.device for r in ranks)
        self._broken: str | None = None
        self._views: list[BoundedCache[tuple[Any, ...], Tensor]] = [BoundedCache() for _ in ranks]
        self._last_inputs: tuple[Any, tuple[int, ...], list[Any]] = (None, (), [])  # _inputs' last answer
        self._owner = object()  # what this setup's prefixes name as their maker
        self._failure = threading.Event()  # a rank's call raised (set on its thread)
        self._stepping = False
        self._plan: _SteadyPlan | None = None  # the steady decode the last decode left (see _steady_plan)
        self._in_use = threading.Lock()  # one_thread: the setup's public calls, one thread at a time
        self._returns = PrefixReturns()  # one_thread's page lock (each rank setup keeps its own pools)
        self._reads: list[Any] = []  # (each rank setup keeps what its own copies read)
        self._read_slot = None
        self._group: collectives.HostGroup | None = None
        self._nccl: Any = None
        with contextlib.ExitStack() as stack:
            stack.callback(self._stop_workers)
            failed = weakref.WeakMethod(self._rank_failed)  # the threads must not keep the setup alive
            self._workers.extend(_RankWorker(r, spec.device, kind, failed) for r, spec in enumerate(ranks))
            self._backends = self._on_ranks(lambda r: host if kind == "host" else _cuda_backend(self._devices[r]))
            self._backend = self._backends[0]
            # A steady decode replays every rank's graph. Where device work runs apart from the host (GPUs; the
            # dry-run backend runs none), this thread enqueues every rank's replay: nothing in it blocks the host.
            # The host backend runs device work, the host group's all-reduce included, as it is enqueued: its
            # ranks run at once, on their threads.
            self._replays_here = kind == "cuda" or self._backend.name != "host"
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
        _stop_all(self._workers)

    # -- running on the ranks ------------------------------------------------------------------------------
    def _on_rank(self, rank: int, fn: Callable[[], T]) -> T:
        """``fn()`` on rank ``rank``'s thread (construction and closing, one rank at a time)."""
        worker = self._workers[rank]
        worker.start(fn)
        worker.wait()
        result: T = worker.outcome()
        return result

    def _on_ranks(self, fn: Callable[[int], T], *, close: Callable[[T], None] | None = None) -> list[T]:
        """``fn(r)`` on every rank's thread at once, during construction: every result, or the first error
        (lowest rank) after the results that were made are closed with ``close``."""
        for r, worker in enumerate(self._workers):
            worker.start(functools.partial(fn, r))
        for worker in self._workers:
            worker.wait()
        failed = [w for w in self._workers if w.error is not None]
        if failed:
            if close is not None:
                for worker in self._workers:
                    if worker.error is None:
                        with contextlib.suppress(Exception):
                            self._on_rank(worker.rank, functools.partial(close, worker.result))
            raise failed[0].outcome()
        return [w.result for w in self._workers]

    def _rank_failed(self, rank: int) -> None:
        """On rank ``rank``'s thread, as its call raises: during a step, no other rank may wait for it."""
        self._failure.set()
        if self._stepping and self._group is not None:
            self._group.abort()  # ranks inside the host all-reduce raise at once

    def _step(self, what: str, step: Callable[[int, Stream], T], stream: StreamLike, *, here: bool = False) -> T:
        """Run ``step(rank, stream)`` on every rank in lockstep (see the module docstring); rank 0's result.
        ``here``: rank 0's step runs on the calling thread while the others run on theirs (a step that only
        replays graphs: it never blocks the host in a collective)."""
        self._check_open()
        if self._broken is not None:  # beyond reset(): a rank's own brokenness is refused (and repaired) by it
            raise TrtioError(f"{what}: this TensorParallelLLMSetup is broken: {self._broken}")
        s = as_stream(stream, self._backend)
        self._ready.record(s)
        self._failure.clear()
        self._stepping = True
        workers = self._workers
        try:
            if not here:
                workers[0].start(functools.partial(step, 0, s))
            for r in range(1, len(workers)):
                workers[r].start(functools.partial(self._after_ready, step, r))
            if here:
                self._here(step, s)
            for worker in workers[1:] if here else workers:
                if not worker.wait(_POLL_SECONDS):
                    self._wait_failing(worker)
        finally:
            self._stepping = False
        if self._failure.is_set():
            self._settle(what)
        result: T = self._workers[0].result
        return result

    def _here(self, step: Callable[[int, Stream], T], s: Stream) -> None:
        """Rank 0's step on the calling thread, as its own thread would run it: with rank 0's device the
        thread's for the call, its result or error kept where :meth:`_settle` reads them."""
        worker = self._workers[0]
        before: int | None = None
        moved = False
        try:  # whatever fails is rank 0's error: the other ranks' calls are waited for
            before, moved = self._use_device(self._devices[0]), True
            worker.result, worker.error = step(0, s), None
        except BaseException as exc:  # raised by _step, as a rank thread's error is
            worker.result, worker.error = None, exc
            self._rank_failed(0)
        finally:
            if moved:
                self._use_device(before)

    def _use_device(self, device: int | None) -> int | None:
        """Make ``device`` this thread's (cuda: current, None: leave it; host: :func:`collectives.set_thread_device`);
        the one it had."""
        if self._kind == "cuda":
            from cuda.bindings import runtime  # noqa: PLC0415 - GPUs only

            err, before = runtime.cudaGetDevice()
            if err == runtime.cudaError_t.cudaSuccess and device is not None and before != device:
                err = runtime.cudaSetDevice(device)[0]
            if err != runtime.cudaError_t.cudaSuccess:
                raise EngineError(f"cudaGetDevice / cudaSetDevice({device}) failed: {err}")
            return int(before)
        before = collectives.thread_device()
        collectives.set_thread_device(device)
        return before

    @staticmethod
    def _set_cuda_device(device: int) -> None:
        from cuda.bindings import runtime  # noqa: PLC0415 - GPUs only

        err = runtime.cudaSetDevice(device)[0]
        if err != runtime.cudaError_t.cudaSuccess:
            raise EngineError(f"cudaSetDevice({device}) failed: {err}")

    def _steady_plan(self) -> _SteadyPlan | None:
        """After a decode of every active sequence: the plan of the steady decodes that may follow it, where every
        rank's step left the same steady state (see :class:`_SteadyPlan`); None elsewhere (the host backend,
        whose ranks run their steps on their threads)."""
        if not self._replays_here:
            return None
        first = self._rank_setups[0]._steady
        if first is None:
            return None
        others = []
        for r in range(1, len(self._rank_setups)):
            setup = self._rank_setups[r]
            st = setup._steady
            if st is None or st.lengths != first.lengths or st.ones != first.ones or st.room != first.room or \
                    st.shape != first.shape or st.dtype != first.dtype:
                return None
            copy = _InputCopy(self._backends[r], st.dst._ptr, first.dst._ptr, st.embeds_nbytes)
            others.append(_RankStep(setup, st, self._streams[r], self._backends[r], self._devices[r], copy))
        return _SteadyPlan(self._rank_setups[0], first, tuple(others), self._ready.handle, self._kind == "cuda")

    def _replay_plan(self, plan: _SteadyPlan, x: Any, stream: StreamLike) -> Tensor:
        """A steady decode of ``plan`` fed ``x`` (checked by rank 0's :meth:`LLMSetup._steady_input`, which
        stands for every rank: they hold the same slots and lengths), every rank's enqueued from this thread (see
        ``_replays_here``): rank 0's on the caller's stream, each other rank's on its own stream after the
        caller's work so far (the ``_ready`` event), with the rank's device the thread's; the lengths worked out
        once. Fed rank 0's ``io.inputs_embeds`` (written in place), each other rank's step is one launch of its
        graph, which copies that input first (see :class:`_RankStep`); fed anything else, the rank copies it,
        then replays. A rank that fails ends the step as in :meth:`_step` (the ranks after it never start; those
        before it have stepped: the setup is broken, their collectives aborted)."""
        first = plan.first
        s = as_stream(stream, self._backend)
        if s._closed:
            s._check_open()
        sh = s._handle
        if type(x) is Tensor and x is not first.dst and x._last_stream is not None:
            x._order_consumer(sh)  # x's producer before the caller's stream: every rank reads x after _ready
        ready = plan.ready
        self._backend.record_event(ready, sh)
        value = first.value + first.ones
        now = value.to_bytes(first.nbytes, "little")
        cuda = plan.cuda  # elsewhere no device work runs here: the thread's device is not read
        outer = self._use_device(self._devices[0]) if cuda else None
        rank: _RankStep | None = None  # the rank > 0 stepping
        try:
            plan.setup._steady_rank(first, x, s, value, now)
            own = x is first.dst
            for rank in plan.others:
                if cuda:
                    self._set_cuda_device(rank.device)
                rank.backend.wait_event(rank.handle, ready)
                if own and rank.executor.replay_again(rank.stream, rank.copying):
                    rank.setup._steady_done(rank.steady, value, now)  # its lengths are rank 0's
                else:
                    rank.step(None if own else x, value, now)
        except BaseException as exc:
            self._plan = None
            for w in self._workers:
                w.result = w.error = None
            if rank is None:
                self._workers[0].error = exc
            else:
                self._workers[plan.others.index(rank) + 1].error = exc
                rank.failed()
        finally:
            if outer is not None:
                self._set_cuda_device(outer)
        if self._plan is None:
            self._settle("decode")
        return self.io.output_logits

    def _after_ready(self, step: Callable[[int, Stream], T], rank: int) -> T:
        """Rank ``rank`` (> 0): its stream waits for the caller's, then it steps."""
        rs = self._streams[rank]
        self._backends[rank].wait_event(rs.handle, self._ready.handle)
        return step(rank, rs)

    def _wait_failing(self, worker: _RankWorker) -> None:
        """Wait for ``worker``'s call; once another rank has failed, make sure it is not left waiting for that one
        (GPUs: after a grace period, the communicators are aborted)."""
        waited = 0.0
        while not worker.wait(_POLL_SECONDS):
            if not self._failure.is_set():
                continue
            waited += _POLL_SECONDS
            if self._nccl is not None and waited >= FAILURE_GRACE_SECONDS and not self._nccl.aborted:
                self._nccl.abort()  # the rank is blocked in NCCL, waiting for the one that failed
            if waited >= FAILURE_GRACE_SECONDS + ABORT_WAIT_SECONDS:
                failed = next(w for w in self._workers if w.error is not None)
                worker.abandoned = True
                self._broken = (f"rank {worker.rank} did not return within {ABORT_WAIT_SECONDS:g} s after rank "
                                f"{failed.rank} failed")
                raise EngineError(self._broken) from failed.error

    def _settle(self, what: str) -> None:
        """After a failed step: the ranks' collectives are quiet again, or the setup is broken; raise the
        failure (that of the lowest rank that did not merely see the all-reduce aborted)."""
        failed = [w for w in self._workers if w.error is not None]
        primary = [w for w in failed if not isinstance(w.error, collectives.CollectiveAbortedError)]
        first = (primary or failed)[0]
        error = first.error
        assert error is not None
        if self._group is not None:
            self._group.reset()
        elif len(failed) < len(self._workers) and not self._nccl.aborted:
            self._nccl.abort()  # some ranks enqueued collectives the failed ones never will
        where = f"rank {first.rank} (device {self._devices[first.rank]}) failed in {what} ({type(error).__name__}: " \
                f"{error})"
        if self._nccl is not None and self._nccl.aborted:
            self._broken = f"{where} and the NCCL communicators were aborted; close this setup and create a new one"
        elif not self._ranks_agree():
            self._broken = (f"{where} after other ranks had finished the step: the ranks' sequences differ now; close "
                            "this setup and create a new one")
        if len(failed) < len(self._workers) or len(primary) < len(failed):
            add_note = getattr(error, "add_note", None)  # Python 3.11+
            if add_note is not None:
                add_note(f"tensor-parallel {what}: {where}; the other ranks' steps were abandoned")
        raise error

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
            return [x] * len(self._workers)
        last = self._last_inputs
        if last[0] is x and x._shape == last[1]:  # the same tensor at the same shape as the last step
            x._live()  # refuses a closed tensor here, before any rank reads its memory
            return last[2]
        shape = x.shape  # refuses a closed tensor here, before any rank reads its memory
        out = [x]
        for r in range(1, len(self._workers)):
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
    def is_broken(self) -> bool:
        """Whether a rank's setup is broken (``reset()`` repairs it, as for one engine), or the ranks no longer
        agree or their communicators were aborted (only ``close()`` remains: every step says so)."""
        return self._broken is not None or any(s.is_broken for s in getattr(self, "_rank_setups", ()))

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
    @one_thread
    def prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None, *,
                slots: Sequence[int] | None = None, prefix: Prefix | Sequence[Prefix | None] | None = None,
                past_lengths: Any = None, deepstack_embeds: Sequence[Any] | None = None,
                mrope_positions: Any = None) -> Tensor:
        """:meth:`LLMSetup.prefill` on every rank (the same inputs, copied to each rank's device); rank 0's logits
        view. ``prefix``: prefixes of this setup's :meth:`pin_prefix`."""
        x = self._inputs(inputs_embeds)
        return self._step("prefill", lambda r, s: self._rank_setups[r].prefill(
            x[r], context_lengths, s, slots=slots, prefix=self._prefixes(prefix, r),
            past_lengths=past_lengths, deepstack_embeds=deepstack_embeds, mrope_positions=mrope_positions), stream)

    @property
    def rope_deltas(self) -> np.ndarray:
        """Rank 0's (every rank keeps the same)."""
        return self._rank_setups[0].rope_deltas

    @one_thread
    def decode(self, inputs_embeds: Any, stream: StreamLike = None, *, slots: Sequence[int] | None = None) -> Tensor:
        """:meth:`LLMSetup.decode` on every rank; rank 0's logits view. No allocation, no host synchronisation."""
        plan = self._plan
        if plan is not None and slots is None and self._broken is None and not self._closed:
            # A steady step (see LLMSetup.decode) on every rank: rank 0's checks stand for every rank, where no
            # rank's steady state moved since the plan was made (no call of this setup but a steady decode; a
            # call of a rank's own moves its epoch, and a steady step that fails drops the plan).
            first = plan.setup
            xs = first._steady_input(plan.first, inputs_embeds) if first._steady is plan.first else None
            if xs is not None:
                for setup, epoch in plan.checks:
                    if setup._epoch != epoch:
                        break
                else:
                    return self._replay_plan(plan, xs, stream)
        self._plan = None
        x = self._inputs(inputs_embeds)
        here = False
        if slots is None and not self._replays_here:
            # A steady step on every rank replays each rank's graph: on the host backend, whose all-reduce runs as
            # it is enqueued, rank 0's on this thread and the others' on theirs.
            here = all((held := setup._steady) is not None and setup._steady_input(held, xr) is not None
                       for setup, xr in zip(self._rank_setups, x))
        out = self._step("decode", lambda r, s: self._rank_setups[r].decode(x[r], s, slots=slots), stream, here=here)
        if slots is None:
            self._plan = self._steady_plan()
        return out

    @one_thread
    def reset(self, stream: StreamLike = None) -> None:
        """End every sequence on every rank (pinned prefixes stay)."""
        self._step("reset", lambda r, s: self._rank_setups[r].reset(s), stream)

    @one_thread
    def populate_streaming(self, stream: StreamLike = None) -> None:
        """:meth:`LLMSetup.populate_streaming` on every rank (Edge-LLM's tensor-parallel engines declare no
        ``hidden_states``: refused by the ranks)."""
        self._step("populate_streaming", lambda r, s: self._rank_setups[r].populate_streaming(s), stream)

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
            super()._close_owned()
        finally:
            self._stop_workers()


@dataclasses.dataclass(frozen=True)
class _InputCopy:
    """A rank's copy of rank 0's step input (``nbytes`` from address ``src``, rank 0's ``io.inputs_embeds``, to
    ``dst``, the rank's), as a value (see :class:`~trtio.ops.RowCopy`): device work before the rank's engine,
    captured in its graph, so a steady step of a rank fed rank 0's input is one graph launch. Equal values are
    the same copy."""

    backend: Backend
    dst: int
    src: int
    nbytes: int

    def enqueue(self, stream: Stream) -> None:
        self.backend.memcpy(self.dst, self.src, self.nbytes, stream.handle)


class _RankStep:
    """The steady step of one rank > 0 in a :class:`_SteadyPlan`: its setup, steady state and executor
    (``setup``, ``steady``, ``executor``), stream and its handle, backend, device, and
    the device work before its engine, fed rank 0's ``io.inputs_embeds`` (``copying``: the steady state's own and
    :class:`_InputCopy`; once the rank's last step ran it, the next is
    :meth:`~trtio.engine.EngineExecutor.replay_again`) or anything else (``plain``: the steady state's own, the
    input copied before). Rank 0's checks stand for it (see :class:`_SteadyPlan`); it is enqueued after the
    rank's stream waits for the caller's."""

    __slots__ = ("setup", "steady", "stream", "handle", "backend", "device", "plain", "copying", "executor")

    def __init__(self, setup: LLMSetup, steady: _Steady, stream: Stream, backend: Backend, device: int,
                 copy: _InputCopy) -> None:
        self.setup = setup
        self.steady = steady
        self.stream = stream
        self.handle = stream.handle
        self.backend = backend
        self.device = device
        self.plain = steady.work
        self.copying = steady.work + (copy,)
        self.executor = setup.executor

    def step(self, x: Any, value: int, now: bytes) -> None:
        """The step fed ``x`` (None: rank 0's input, copied by the rank's graph), checked by rank 0's checks:
        :meth:`LLMSetup._steady_rank` with the work before the engine that ``x`` needs."""
        st = self.steady
        if x is None:
            st.work = self.copying
            self.setup._steady_rank(st, st.dst, self.stream, value, now)
        else:
            st.work = self.plain
            self.setup._steady_rank(st, x, self.stream, value, now)

    def failed(self) -> None:
        """After the rank's step raised: as :meth:`LLMSetup._steady_rank` leaves a failed step."""
        self.setup._steady_failed()


class _SteadyPlan:
    """The steady decode of every rank that a decode of every active sequence left (see
    :meth:`TensorParallelLLMSetup._steady_plan`): rank 0's setup and steady state (``setup``, ``first``); each
    other rank's step (:class:`_RankStep`); the handle of the event the other ranks wait on; whether the ranks are
    GPUs. Every rank's steady state is as rank 0's (the same slots, lengths and room): rank 0's checks stand for
    all of them."""

    __slots__ = ("setup", "first", "others", "checks", "ready", "cuda")

    def __init__(self, setup: LLMSetup, first: _Steady, others: tuple[_RankStep, ...], ready: int,
                 cuda: bool) -> None:
        self.setup = setup
        self.first = first
        self.others = others
        self.checks = tuple((o.setup, o.steady.epoch) for o in others)  # each other rank's setup and its epoch
        self.ready = ready
        self.cuda = cuda


def _stop_all(workers: list[_RankWorker]) -> None:
    """End every rank thread of ``workers`` (and forget them)."""
    stopping = list(workers)
    workers.clear()
    for w in stopping:
        w.stop()


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

