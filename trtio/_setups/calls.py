"""A setup's calls: one thread at a time, in call order whatever their streams, their inputs kept alive.

Every setup (:class:`~trtio._setups.llm.LLMSetup`, :class:`~trtio._setups.spec_decode.SpecDecodeSetup`,
:class:`~trtio._setups.tensor_parallel.TensorParallelLLMSetup`,
:class:`~trtio.components.visual.visual_setup.VisualSetup`) holds a
:class:`Calls` and wraps its public calls that change it in :func:`one_thread`. Together they are trtio's rules
for a setup's calls (``docs/architecture.md``, "Rules every module follows"):

* **One thread at a time.** A call made while another thread is inside one of the same setup is refused with a
  TrtioError before anything is read or changed (two interleaved steps would corrupt its lengths, slots and
  pages). A call holds the setup's page lock, which a prefix released from another thread waits for, and first
  takes back the pages of prefixes the garbage collector released (:class:`~trtio._pages.PrefixReturns`).
* **Call order** (:meth:`Calls.stream`). A call on a stream other than the last call's makes its stream wait for
  an event recorded after the last call's work (no host synchronisation), threads' default streams included.
* **Inputs in flight** (:meth:`Calls.read`, :meth:`Calls.hold_reads`). An input the setup does not own that a
  call's copies read (a numpy array over pinned memory, a torch / CuPy / JAX array, a Tensor view) is kept
  referenced until those copies have run: a slot of a ring without memory (:class:`~trtio._staging.UploadRing`),
  taken before the first such copy and given back, fenced by the ring's rule, when the call returns. The last
  input a call read stays referenced until a later call reads another one (it then joins that call's slot), so a
  loop that feeds the same input every step pays no slot for it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from trtio._cuda.backend import Backend
from trtio._lifetime import Closeable
from trtio._pages import PrefixReturns
from trtio._staging import HOLD_SLOTS, UploadRing
from trtio._stream import Event, Stream, StreamLike, as_stream
from trtio.errors import TrtioError

__all__ = ["Calls", "Stepped", "one_thread"]


class Calls(Closeable):
    """The state behind a setup's rules for its calls (module docstring): the lock a call holds, the page lock
    and the returns of collected prefixes, the last call's stream and the event that orders the next after it,
    and the ring that keeps the inputs in flight. ``title`` names the setup in refusals. Follows the close
    protocol: :meth:`close` releases the event and the ring (what it keeps goes)."""

    def __init__(self, backend: Backend, title: str, *, holds: bool = True) -> None:
        self.title = title
        self.backend = backend
        self.in_use = threading.Lock()
        self.returns = PrefixReturns()
        self.last: Stream | None = None  # the last call's stream (None: none since construction)
        self.reads: list[Any] = []  # inputs the running call enqueued copies of and does not own
        self.read_slot: int | None = None  # the ring's slot that keeps them (taken before the first such copy)
        self.kept: Any = None  # the last input read: referenced until another is read (then it joins a slot)
        with contextlib.ExitStack() as stack:
            self._order = stack.enter_context(Event.create(backend))
            self._holds = stack.enter_context(UploadRing(None, backend, slots=HOLD_SLOTS,
                                                         title=f"{title} inputs in flight")) if holds else None
            self._owned = stack.pop_all()
        self._init_lifetime(f"{title}'s calls")

    def stream(self, stream: StreamLike = None) -> Stream:
        """A call's stream (None: this thread's default stream), ordered after the last call's work. Called once
        the call's inputs are checked, before its work."""
        s = as_stream(stream, self.backend)
        if s is not self.last:
            self.follow(s)
        return s

    def follow(self, s: Stream) -> None:
        """``s`` waits for an event recorded after the last call's work (on the last call's stream), and becomes
        the last call's stream."""
        last = self.last
        if last is not None and last != s:
            if last.is_closed:  # no event can follow its work there any more (rare): wait for the device
                self.backend.synchronize()
            else:
                self._order.record(last)
                self._order.wait(s)
        self.last = s

    def read(self, x: Any) -> None:
        """``x`` (an input the setup does not own) is about to be read by a copy the call enqueues: it is kept
        until that copy has run (:meth:`hold_reads`). Called before the copy: the slot that keeps it is taken
        here, so a failure to take it fails the call before that copy. The last input read (:attr:`kept`) is
        referenced already: read again, it takes nothing."""
        if x is self.kept:
            return
        if self.read_slot is None:
            assert self._holds is not None, f"{self.title} keeps no inputs in flight"
            self.read_slot = self._holds.take()
        self.reads.append(x)

    def hold_reads(self) -> None:
        """When a call returns (or raises): the inputs it enqueued copies of (:meth:`read`) go into the ring's
        slot, kept until the slot's fence (recorded at a later call, after everything this one enqueued) has
        completed. No backend call: nothing may fail after the call's work."""
        c, self.read_slot = self.read_slot, None
        reads, self.reads = self.reads, []
        assert c is not None and self.last is not None and self._holds is not None  # a copy ran: on the call's stream
        # The last input read becomes the one kept; the one it replaces joins the slot (its copies ran before).
        reads[-1], self.kept = self.kept, reads[-1]
        self._holds.put(c, self.last, reads, fence=False)

    def _close_owned(self) -> None:
        self.kept = None
        self.reads.clear()
        self._owned.close()


class Stepped(Protocol):
    """What :func:`one_thread` reads of a setup: its :class:`Calls`."""

    _calls: Calls


_S = TypeVar("_S", bound=Stepped)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def one_thread(step: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """A public call of a setup that changes its state (module docstring): refused with a TrtioError, before
    anything is read or changed, while another thread is inside such a call of the same setup; holds the page
    lock, takes back the pages of collected prefixes first, and keeps what the call's copies read."""
    name = step.__name__

    @functools.wraps(step)
    def guarded(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        calls = self._calls
        lock = calls.in_use
        if not lock.acquire(False):
            raise TrtioError(f"{type(self).__name__}.{name}(): another thread is inside a call of this setup; a setup "
                             f"is stepped by one thread at a time (give each thread its own setup, or serialise "
                             f"the calls)")
        try:
            returns = calls.returns
            pages = returns.lock  # held as a `with` block would, without its context-manager calls (every step)
            pages.acquire()
            try:
                returns.collect()
                return step(self, *args, **kwargs)
            finally:
                try:
                    if calls.read_slot is not None:  # inputs the call's copies read (also where it failed later)
                        calls.hold_reads()
                finally:
                    pages.release()
        finally:
            lock.release()

    return guarded
