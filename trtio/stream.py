"""Streams and events: thin owners of backend handles.

Anything stream-ordered in trtio takes ``stream=``; :func:`as_stream` converts what callers
pass (a :class:`Stream`, an int handle, any object with ``__cuda_stream__`` such as a torch,
CuPy or cuda.core stream, or None for trtio's own default stream) once, at the API boundary.
trtio never falls back to CUDA's legacy default stream.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from trtio.cuda.backend import Backend, get_backend
from trtio.errors import ClosedError

__all__ = ["Stream", "Event", "StreamLike", "as_stream"]

StreamLike = Any  # Stream | int | object with __cuda_stream__ | None

_default_lock = threading.Lock()
_defaults: dict[int, Stream] = {}


def _destroy_stream(backend: Backend, handle: int) -> None:
    try:
        backend.destroy_stream(handle)
    except Exception:  # finalizers must not raise
        pass


def _destroy_event(backend: Backend, handle: int) -> None:
    try:
        backend.destroy_event(handle)
    except Exception:
        pass


class Stream:
    """A stream handle on a backend; owned (destroyed on close) or borrowed."""

    __slots__ = ("_handle", "_backend", "_owned", "_closed", "_finalizer", "__weakref__")

    def __init__(self, handle: int, backend: Backend, *, owned: bool = False) -> None:
        self._handle = int(handle)
        self._backend = backend
        self._owned = owned
        self._closed = False
        self._finalizer = (
            weakref.finalize(self, _destroy_stream, backend, self._handle) if owned else None
        )

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
        if self._closed:
            raise ClosedError(f"stream 0x{self._handle:x} is closed")
        return self._handle

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def synchronize(self) -> None:
        """Block the host until all work issued on this stream has finished."""
        self._backend.synchronize_stream(self.handle)

    def wait(self, event: Event) -> None:
        """Make this stream wait for ``event`` (no host synchronisation)."""
        event.wait(self)

    def close(self) -> None:
        """Destroy an owned stream; borrowed streams are only forgotten. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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


class Event:
    """A synchronisation event (no timing)."""

    __slots__ = ("_handle", "_backend", "_closed", "_finalizer", "__weakref__")

    def __init__(self, handle: int, backend: Backend) -> None:
        self._handle = int(handle)
        self._backend = backend
        self._closed = False
        self._finalizer = weakref.finalize(self, _destroy_event, backend, self._handle)

    @classmethod
    def create(cls, backend: Backend | str | None = None) -> Event:
        be = get_backend(backend)
        return cls(be.create_event(), be)

    @property
    def handle(self) -> int:
        if self._closed:
            raise ClosedError(f"event 0x{self._handle:x} is closed")
        return self._handle

    @property
    def is_closed(self) -> bool:
        return self._closed

    def record(self, stream: StreamLike = None) -> Event:
        """Capture the work issued on ``stream`` so far. Returns self."""
        s = as_stream(stream, self._backend)
        self._backend.record_event(self.handle, s.handle)
        return self

    def wait(self, stream: StreamLike = None) -> None:
        """Make ``stream`` wait until the recorded work has finished (no host synchronisation)."""
        s = as_stream(stream, self._backend)
        self._backend.wait_event(s.handle, self.handle)

    def synchronize(self) -> None:
        """Block the host until the recorded work has finished."""
        self._backend.synchronize_event(self.handle)

    def query(self) -> bool:
        """True when the recorded work has finished."""
        return self._backend.query_event(self.handle)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> Event:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Event(0x{self._handle:x}, {self._backend.name}{', closed' if self._closed else ''})"
