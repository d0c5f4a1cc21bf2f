"""Streams and events: thin owners of backend handles.

Anything stream-ordered in trtio takes ``stream=``; :func:`as_stream` converts what callers
pass (a :class:`Stream`, an int handle, any object with ``__cuda_stream__`` such as a torch,
CuPy or cuda.core stream, or None for trtio's own default stream) once, at the API boundary.
trtio never falls back to CUDA's legacy default stream.
"""

from __future__ import annotations

import threading
from typing import Any

from trtio._lifetime import Closeable
from trtio.cuda.backend import Backend, get_backend

__all__ = ["Stream", "Event", "StreamLike", "as_stream"]

StreamLike = Any  # Stream | int | object with __cuda_stream__ | None

_default_lock = threading.Lock()
_defaults: dict[int, Stream] = {}


class Stream(Closeable):
    """A stream handle on a backend; owned (destroyed on close) or borrowed.

    Follows trtio's close protocol (:mod:`trtio._lifetime`).
    """

    __slots__ = ("_handle", "_backend", "_owned")

    def __init__(self, handle: int, backend: Backend, *, owned: bool = False) -> None:
        self._handle = int(handle)
        self._backend = backend
        self._owned = owned
        what = f"stream 0x{self._handle:x}"
        if owned:
            self._init_lifetime(what, backend.destroy_stream, self._handle)
        else:
            self._init_lifetime(what)

    @classmethod
    def create(cls, backend: Backend | str | None = None) -> Stream:
        """A new non-blocking stream, destroyed on :meth:`close`."""
        be = get_backend(backend)
        return cls(be.create_stream(), be, owned=True)

    @classmethod
    def from_handle(cls, handle: Any, backend: Backend | str | None = None) -> Stream:
        """Borrow an existing stream: an int handle or any object with ``__cuda_stream__``."""
        if isinstance(handle, Stream):
            return handle
        if hasattr(handle, "__cuda_stream__"):
            proto = handle.__cuda_stream__
            version, raw = proto() if callable(proto) else proto
            handle = raw
        elif hasattr(handle, "cuda_stream"):  # torch.cuda.Stream before __cuda_stream__ existed
            handle = handle.cuda_stream
        if isinstance(handle, bool) or not isinstance(handle, int):
            try:
                handle = int(handle)
            except (TypeError, ValueError):
                raise TypeError(
                    f"cannot make a stream of {type(handle).__name__}: expected a trtio.Stream, "
                    "an int handle or an object with __cuda_stream__"
                ) from None
        return cls(handle, get_backend(backend), owned=False)

    @classmethod
    def default(cls, backend: Backend | str | None = None) -> Stream:
        """trtio's default stream of ``backend``: one non-blocking stream, created once."""
        be = get_backend(backend)
        key = id(be)
        stream = _defaults.get(key)
        if stream is None:
            with _default_lock:
                stream = _defaults.get(key)
                if stream is None:
                    stream = cls(be.create_stream(), be, owned=False)
                    _defaults[key] = stream
        return stream

    @property
    def handle(self) -> int:
        self._check_open()
        return self._handle

    @property
    def backend(self) -> Backend:
        return self._backend

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def synchronize(self) -> None:
        """Block the host until all work issued on this stream has finished."""
        self._backend.synchronize_stream(self.handle)

    def wait(self, event: Event) -> None:
        """Make this stream wait for ``event`` (no host synchronisation)."""
        self._check_open()
        event.wait(self)

    def close(self) -> None:
        """Destroy an owned stream; borrowed streams are only forgotten. Idempotent.

        A failure to destroy the stream raises (the stream is closed anyway).
        """
        super().close()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._handle == self._handle and other._backend is self._backend

    def __hash__(self) -> int:
        return hash((self._handle, id(self._backend)))

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("owned" if self._owned else "borrowed")
        return f"Stream(0x{self._handle:x}, {self._backend.name}, {state})"


def as_stream(stream: StreamLike, backend: Backend | str | None = None) -> Stream:
    """Convert a ``stream=`` argument; None means trtio's default stream of ``backend``."""
    if stream is None:
        return Stream.default(backend)
    if isinstance(stream, Stream):
        return stream
    return Stream.from_handle(stream, backend)


class Event(Closeable):
    """A synchronisation event (no timing); follows trtio's close protocol (:mod:`trtio._lifetime`)."""

    __slots__ = ("_handle", "_backend")

    def __init__(self, handle: int, backend: Backend) -> None:
        self._handle = int(handle)
        self._backend = backend
        self._init_lifetime(f"event 0x{self._handle:x}", backend.destroy_event, self._handle)

    @classmethod
    def create(cls, backend: Backend | str | None = None) -> Event:
        be = get_backend(backend)
        return cls(be.create_event(), be)

    @property
    def handle(self) -> int:
        self._check_open()
        return self._handle

    @property
    def backend(self) -> Backend:
        return self._backend

    def record(self, stream: StreamLike = None) -> Event:
        """Capture the work issued on ``stream`` so far. Returns self."""
        self._check_open()
        s = as_stream(stream, self._backend)
        self._backend.record_event(self._handle, s.handle)
        return self

    def wait(self, stream: StreamLike = None) -> None:
        """Make ``stream`` wait until the recorded work has finished (no host synchronisation)."""
        self._check_open()
        s = as_stream(stream, self._backend)
        self._backend.wait_event(s.handle, self._handle)

    def synchronize(self) -> None:
        """Block the host until the recorded work has finished."""
        self._backend.synchronize_event(self.handle)

    def query(self) -> bool:
        """True when the recorded work has finished."""
        return self._backend.query_event(self.handle)

    def close(self) -> None:
        """Destroy the event. Idempotent; a failure to destroy it raises (the event is closed anyway)."""
        super().close()

    def __repr__(self) -> str:
        return f"Event(0x{self._handle:x}, {self._backend.name}{', closed' if self._closed else ''})"
