"""Rank threads: N persistent threads, one per rank of a tensor-parallel setup, stepped in lockstep.

Each rank has one thread (:class:`RankWorker`) that sets its device once and runs everything of that rank: loading
its engine, binding it, every step, closing. :class:`RankGroup` hands a call to every rank's thread and waits for
all of them, and owns what happens when one fails: no rank may be left waiting in a collective for a rank that
failed. On the host the in-process group is aborted at once; on GPUs, where every rank refused the step the
communicators stay, else they are aborted (``ncclCommAbort``) after a grace period, which ends collectives in
flight. The group says when the ranks' state no longer agrees (a step some ranks finished and others did not):
the setup is broken then, for good.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from trtio import _collectives as collectives
from trtio.errors import ConfigError, EngineError

__all__ = ["ABORT_WAIT_SECONDS", "FAILURE_GRACE_SECONDS", "RankGroup", "RankWorker", "check_devices", "use_device"]

T = TypeVar("T")

#: How long the other ranks of a GPU step get to return after one failed, before the communicators are
#: aborted (a rank blocked in an NCCL call waits for the failed one; ranks that only refused return at once).
FAILURE_GRACE_SECONDS = 2.0
#: How long ranks get to return after their communicators were aborted.
ABORT_WAIT_SECONDS = 60.0
_POLL_SECONDS = 0.05  # how often the caller looks for a failed rank while it waits for another one


def use_device(kind: str, device: int | None) -> int | None:
    """Make ``device`` this thread's (cuda: current, None: leave it; host: :func:`collectives.set_thread_device`);
    returns the one it had."""
    if kind == "cuda":
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


class RankWorker:
    """The persistent thread of one rank: sets the rank's device once, then runs the calls it is given, one at a
    time. A call is handed over and waited for through two locks (the cheapest hand-off Python has): :meth:`start`
    releases ``_go``, the thread releases ``_done`` when the call has returned or raised. ``on_error()(rank)``
    runs on the rank's thread as soon as a call raises (before ``_done``): ``on_error`` is a weak reference (a
    :class:`weakref.WeakMethod`), so the thread does not keep its group alive."""

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
            use_device(self._kind, self.device)
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


class RankGroup:
    """The threads of N ranks (one :class:`RankWorker` each) and what happens when one fails (module docstring).

    ``aborts``: the in-process group of the host ranks (aborted when a rank fails, so ranks inside its all-reduce
    raise at once), or None; ``nccl``: the GPU ranks' NCCL communicators (aborted after a grace period where a
    rank is left waiting), or None. ``broken`` says why the ranks can no longer be stepped (None: they can)."""

    def __init__(self, devices: Sequence[int], kind: str, title: str) -> None:
        self.title = title  # what a refusal calls the ranks' setup
        self.devices = tuple(devices)
        self.kind = kind
        self.workers: list[RankWorker] = []
        self.aborts: collectives.HostGroup | None = None
        self.nccl: Any = None
        self.broken: str | None = None
        self._failure = threading.Event()  # a rank's call raised (set on its thread)
        self._stepping = False
        failed = weakref.WeakMethod(self.rank_failed)  # the threads must not keep the group alive
        self.workers.extend(RankWorker(r, d, kind, failed) for r, d in enumerate(self.devices))

    @property
    def size(self) -> int:
        return len(self.devices)

    def rank_failed(self, rank: int) -> None:
        """On rank ``rank``'s thread, as its call raises: during a step, no other rank may wait for it."""
        self._failure.set()
        if self._stepping and self.aborts is not None:
            self.aborts.abort()  # ranks inside the host all-reduce raise at once

    def on_rank(self, rank: int, fn: Callable[[], T]) -> T:
        """``fn()`` on rank ``rank``'s thread (construction and closing, one rank at a time)."""
        worker = self.workers[rank]
        worker.start(fn)
        worker.wait()
        result: T = worker.outcome()
        return result

    def on_ranks(self, fn: Callable[[int], T], *, close: Callable[[T], None] | None = None) -> list[T]:
        """``fn(r)`` on every rank's thread at once, during construction: every result, or the first error
        (lowest rank) after the results that were made are closed with ``close``."""
        for r, worker in enumerate(self.workers):
            worker.start(functools.partial(fn, r))
        for worker in self.workers:
            worker.wait()
        failed = [w for w in self.workers if w.error is not None]
        if failed:
            if close is not None:
                for worker in self.workers:
                    if worker.error is None:
                        with contextlib.suppress(Exception):
                            self.on_rank(worker.rank, functools.partial(close, worker.result))
            raise failed[0].outcome()
        return [w.result for w in self.workers]

    def step(self, what: str, jobs: Sequence[Callable[[], T]], agree: Callable[[], bool], *,
             here: bool = False) -> T:
        """Run ``jobs[r]()`` for every rank in lockstep: each on its rank's thread (``here``: every job on the
        calling thread, one after the other, with each rank's device current: steps that only enqueue, never
        block in a collective); rank 0's result. A failure is settled as the module docstring says (``agree``:
        whether the ranks' state still agrees) and raised."""
        if self.broken is not None:
            raise EngineError(f"{what}: this {self.title} is broken: {self.broken}")
        self._failure.clear()
        self._stepping = True
        workers = self.workers
        try:
            if here:
                self._here(jobs)
            else:
                for worker, job in zip(workers, jobs):
                    worker.start(job)
                for worker in workers:
                    if not worker.wait(_POLL_SECONDS):
                        self._wait_failing(worker)
        finally:
            self._stepping = False
        if self._failure.is_set():
            self._settle(what, agree)
        result: T = workers[0].result
        return result

    def _here(self, jobs: Sequence[Callable[[], Any]]) -> None:
        """Every rank's job on the calling thread in rank order, each with its rank's device current; a rank that
        fails ends the step (the ranks after it never start), its error kept where :meth:`_settle` reads it."""
        for w in self.workers:
            w.result = w.error = None
        outer = use_device(self.kind, None)
        try:
            for worker, job in zip(self.workers, jobs):
                try:
                    use_device(self.kind, worker.device)
                    worker.result = job()
                except BaseException as exc:  # raised by step(), as a rank thread's error is
                    worker.error = exc
                    self.rank_failed(worker.rank)
                    break
        finally:
            use_device(self.kind, outer)

    def _wait_failing(self, worker: RankWorker) -> None:
        """Wait for ``worker``'s call; once another rank has failed, make sure it is not left waiting for that one
        (GPUs: after a grace period, the communicators are aborted)."""
        waited = 0.0
        while not worker.wait(_POLL_SECONDS):
            if not self._failure.is_set():
                continue
            waited += _POLL_SECONDS
            if self.nccl is not None and waited >= FAILURE_GRACE_SECONDS and not self.nccl.aborted:
                self.nccl.abort()  # the rank is blocked in NCCL, waiting for the one that failed
            if waited >= FAILURE_GRACE_SECONDS + ABORT_WAIT_SECONDS:
                failed = next(w for w in self.workers if w.error is not None)
                worker.abandoned = True
                self.broken = (f"rank {worker.rank} did not return within {ABORT_WAIT_SECONDS:g} s after rank "
                               f"{failed.rank} failed")
                raise EngineError(self.broken) from failed.error

    def _settle(self, what: str, agree: Callable[[], bool]) -> None:
        """After a failed step: the ranks' collectives are quiet again, or the setup is broken; raise the
        failure (that of the lowest rank that did not merely see the all-reduce aborted)."""
        failed = [w for w in self.workers if w.error is not None]
        primary = [w for w in failed if not isinstance(w.error, collectives.CollectiveAbortedError)]
        first = (primary or failed)[0]
        error = first.error
        assert error is not None
        if self.aborts is not None:
            self.aborts.reset()
        elif self.nccl is not None and len(failed) < len(self.workers) and not self.nccl.aborted:
            self.nccl.abort()  # some ranks enqueued collectives the failed ones never will
        where = f"rank {first.rank} (device {self.devices[first.rank]}) failed in {what} ({type(error).__name__}: " \
                f"{error})"
        if self.nccl is not None and self.nccl.aborted:
            self.broken = f"{where} and the NCCL communicators were aborted; close this setup and create a new one"
        elif not agree():
            self.broken = (f"{where} after other ranks had finished the step: the ranks' sequences differ now; close "
                           "this setup and create a new one")
        if len(failed) < len(self.workers) or len(primary) < len(failed):
            error.add_note(f"tensor-parallel {what}: {where}; the other ranks' steps were abandoned")
        raise error

    def stop(self) -> None:
        """End every rank thread (and forget them)."""
        stop_all(self.workers)


def stop_all(workers: list[RankWorker]) -> None:
    """End every rank thread of ``workers`` (and forget them)."""
    stopping = list(workers)
    workers.clear()
    for w in stopping:
        w.stop()


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
        from trtio._cuda.device import probe_device_count  # noqa: PLC0415 - GPUs only

        count = probe_device_count()
        beyond = [d for d in found if d >= count]
        if beyond:
            raise ConfigError("devices", f"{list(found)}: device {beyond[0]} does not exist here ({count} CUDA "
                                         f"device(s)); a {size}-rank directory needs {size} local GPUs")
    return found
