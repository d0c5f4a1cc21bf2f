"""The all-reduce of tensor-parallel ranks in one process, and where a rank engine finds its communicator.

Edge-LLM's ``AllReducePlugin`` finds the NCCL communicator of the GPU it runs on in a process-wide table
that the runtime fills, one entry per device, before the engines run (:mod:`trtio._nccl` fills it on GPUs).
The host backend has the same arrangement without NCCL, so that a tensor-parallel setup runs, and is
tested, on a machine without a GPU:

* a :class:`HostGroup` is the ranks' in-process all-reduce: each rank hands in its partial sums, every rank
  gets their sum (added in rank order, so every rank holds the same bits), and :meth:`HostGroup.abort` makes
  every rank waiting in it, or arriving later, raise :class:`CollectiveAbortedError` at once, so that a rank
  whose step failed never leaves the others waiting;
* :func:`register` puts a rank's communicator in the process-wide table under its device, and
  :func:`communicator` looks it up, as the plugin does. On the host, "devices" are labels: the device of the
  calling thread is what :func:`set_thread_device` last set there (the host's ``cudaSetDevice``), which a
  tensor-parallel setup's rank threads do when they start.

A device holds one communicator at a time: registering a second one while the first is registered is an
:class:`~trtio.EngineError` (two setups on one device would make each rank engine reach the other setup's
ranks). The table holds communicators weakly: a setup collected without ``close()`` frees its devices.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from trtio._checks import is_int
from trtio._lifetime import Closeable
from trtio.errors import EngineError, InvalidValueError

__all__ = ["CollectiveAbortedError", "HostCommunicator", "HostGroup", "communicator", "register", "set_thread_device",
           "thread_device", "unregister"]

#: How long a rank waits in a host all-reduce for the others before it gives up (a safety net: a failed
#: rank aborts the group at once).
WAIT_SECONDS = 120.0

_table_lock = threading.Lock()
# device -> its communicator, held weakly: a setup collected without close() frees its devices
_table: dict[int, weakref.ref[HostCommunicator]] = {}
_thread = threading.local()


class CollectiveAbortedError(EngineError):
    """A rank's all-reduce was aborted: another rank of its step failed, or the group was closed."""


class HostGroup(Closeable):
    """The in-process all-reduce of ``size`` ranks (see the module docstring); :meth:`member` is rank r's
    communicator. Partial sums are float32 numpy arrays of one shape on every rank."""

    def __init__(self, size: int, *, timeout: float = WAIT_SECONDS) -> None:
        if not is_int(size) or size < 1:
            raise InvalidValueError(f"HostGroup: size must be an int >= 1, got {size!r}")
        size = int(size)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise InvalidValueError(f"HostGroup: timeout must be a number of seconds > 0, got {timeout!r}")
        self._size = size
        self._timeout = timeout
        self._barrier = threading.Barrier(size)
        self._aborted = False  # abort() was called (else a broken barrier is a wait that timed out)
        # Two sets of slots, used in turn: a rank may reach the next all-reduce while a slower one still
        # reads this one's parts, but it cannot pass the next barrier before that rank arrives there.
        self._parts: list[list[Any]] = [[None] * size, [None] * size]
        self._calls = [0] * size
        self._members = [HostCommunicator(self, r) for r in range(size)]
        self._init_lifetime(f"host all-reduce group of {size} ranks")

    @property
    def size(self) -> int:
        return self._size

    def member(self, rank: int) -> HostCommunicator:
        """Rank ``rank``'s communicator (``0 <= rank < size``)."""
        if not is_int(rank) or not 0 <= rank < self._size:
            raise InvalidValueError(f"HostGroup.member: rank must be an int in 0..{self._size - 1}, got {rank!r}")
        return self._members[int(rank)]

    @property
    def aborted(self) -> bool:
        return self._barrier.broken

    def abort(self) -> None:
        """Make every rank waiting in an all-reduce, and every later one, raise CollectiveAbortedError (until
        :meth:`reset`)."""
        self._aborted = True
        self._barrier.abort()

    def reset(self) -> None:
        """Make the group usable again after :meth:`abort`; call it only while no rank is inside an all-reduce."""
        self._aborted = False
        self._barrier.reset()
        self._calls = [0] * self._size
        for parts in self._parts:
            parts[:] = [None] * self._size

    def _all_reduce(self, rank: int, partial: Any) -> Any:
        self._check_open()
        call = self._calls[rank]
        self._calls[rank] = call + 1
        parts = self._parts[call % 2]
        parts[rank] = partial
        try:
            self._barrier.wait(self._timeout)
        except threading.BrokenBarrierError:
            if self._closed:
                why = "the group is closed"
            elif self._aborted:
                why = "the group was aborted (another rank's step failed)"
            else:  # threading.Barrier breaks itself when a wait times out
                why = f"a rank did not arrive within {self._timeout:g} s; the group is aborted until reset()"
            raise CollectiveAbortedError(f"all-reduce of rank {rank} of {self._size}: {why}") from None
        # Every rank reads the same parts: each finds the same mismatch, so no rank returns while another raises.
        shapes = [np.shape(p) for p in parts]
        if any(sh != shapes[0] for sh in shapes):
            raise InvalidValueError(f"all-reduce of rank {rank} of {self._size}: the ranks' partial sums differ in "
                                    f"shape ({', '.join(f'rank {r}: {list(sh)}' for r, sh in enumerate(shapes))}); "
                                    "every rank must hand in the same shape")
        try:
            total = np.array(parts[0], dtype=np.float32, copy=True)
            for other in parts[1:]:
                total += np.asarray(other, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InvalidValueError(f"all-reduce of rank {rank} of {self._size}: a partial sum is not an array of "
                                    f"numbers ({exc})") from None
        return total

    def _close_owned(self) -> None:
        self._barrier.abort()


class HostCommunicator:
    """Rank ``rank``'s end of a :class:`HostGroup`: what a rank engine on the host backend all-reduces with."""

    __slots__ = ("_group", "rank", "__weakref__")

    def __init__(self, group: HostGroup, rank: int) -> None:
        self._group = group
        self.rank = rank

    @property
    def size(self) -> int:
        return self._group.size

    def all_reduce(self, partial: Any) -> Any:
        """The sum over the group's ranks of each rank's ``partial`` (float32, a new array); blocks until every
        rank has handed its part in. CollectiveAbortedError when the group is aborted meanwhile."""
        return self._group._all_reduce(self.rank, partial)

    def __repr__(self) -> str:
        return f"HostCommunicator(rank={self.rank}, size={self.size})"


# -- the process-wide table ---------------------------------------------------------------------


def register(devices: Sequence[int], members: Sequence[HostCommunicator]) -> None:
    """Put ``members[i]`` in the table under ``devices[i]``; refused (nothing registered) where a device
    already holds one, where a device is named twice, or where the lists differ in length."""
    devices, members = list(devices), list(members)
    if len(devices) != len(members):
        raise InvalidValueError(f"register: {len(devices)} devices for {len(members)} communicators; one device each")
    bad = [d for d in devices if not is_int(d)]
    if bad:
        raise InvalidValueError(f"register: device {bad[0]!r} is not a device id (an int)")
    twice = [d for d in devices if devices.count(d) > 1]
    if twice:
        raise InvalidValueError(f"register: device {twice[0]} is named twice; a device holds one communicator (a rank "
                                "engine there would reach another rank's)")
    with _table_lock:
        taken = [d for d in devices if d in _table and _table[d]() is not None]
        if taken:
            raise EngineError(f"host device {taken[0]} already has a tensor-parallel communicator registered (a "
                              "tensor-parallel setup on it is open): close that setup first")
        for d, m in zip(devices, members):
            _table[d] = weakref.ref(m)


def unregister(devices: Sequence[int], members: Sequence[HostCommunicator]) -> None:
    """Remove each of ``members`` from the table (an entry another communicator holds stays)."""
    with _table_lock:
        for d, m in zip(devices, members):
            entry = _table.get(d)
            if entry is not None and entry() is m:
                del _table[d]


def communicator(device: int | None = None) -> HostCommunicator:
    """The communicator registered for ``device`` (default: the calling thread's, :func:`thread_device`);
    EngineError naming the device where none is registered (as Edge-LLM's plugin reports it)."""
    if device is None:
        device = thread_device()
    if device is not None and not is_int(device):
        raise InvalidValueError(f"all-reduce: device {device!r} is not a device id (an int)")
    with _table_lock:
        entry = _table.get(device) if device is not None else None
        found = entry() if entry is not None else None
    if found is None:
        where = "this thread has no device set (set_thread_device)" if device is None else f"host device {device}"
        raise EngineError(f"all-reduce: no communicator is registered for {where}; a tensor-parallel setup "
                          "registers one per rank before its engines run")
    return found


def set_thread_device(device: int | None) -> None:
    """Make ``device`` the calling thread's host device (None: none): the host's ``cudaSetDevice``."""
    _thread.device = device


def thread_device() -> int | None:
    """The calling thread's host device (:func:`set_thread_device`), or None."""
    device: int | None = getattr(_thread, "device", None)
    return device
