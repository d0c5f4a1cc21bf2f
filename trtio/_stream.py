"""Streams and events: thin owners of backend handles, and trtio's one rule for ``stream=``.

The stream rule
---------------
Every stream-ordered call in trtio takes ``stream: StreamLike = None`` as its last
positional-or-keyword parameter (options after it are keyword-only), so ``t.copy_from(x, s)`` and
``t.copy_from(x, stream=s)`` both work everywhere. The call converts it once, at its entry, with
:func:`as_stream` (:data:`StreamLike`: a :class:`Stream`, an int handle, or any object with
``__cuda_stream__`` such as a torch, CuPy or cuda.core stream), and orders all its work on it.

``stream=None`` means the same thing everywhere: the calling thread's trtio default stream of the
backend the call works on (:meth:`Stream.default`), a non-blocking stream of that thread's own, so
threads that each capture CUDA graphs with ``stream=None`` never record each other's work. It is
never CUDA's legacy default stream, which trtio does not use at all (handles 0 and 1 are refused).

The one exception is ``Tensor.__dlpack__(stream=...)``, whose keyword and meaning the DLPack
protocol fixes: it is the consumer's stream handle, which trtio orders after its own writes.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np

from trtio._checks import is_int
from trtio._cuda.backend import Backend, get_backend
from trtio._lifetime import Closeable
from trtio.errors import InvalidTypeError, InvalidValueError

__all__ = ["Stream", "Event", "StreamLike", "SupportsCudaStream", "as_stream"]

# CUDA's special stream handles: 0 and cudaStreamLegacy (1) are the legacy default stream.
_LEGACY_HANDLES = (0, 1)
_HANDLE_LIMIT = 1 << 64


@runtime_checkable
class SupportsCudaStream(Protocol):
    """A stream of another library, through the CUDA stream protocol (cuda.core, PyTorch, cuda.bindings).

    ``__cuda_stream__()`` returns ``(version, handle)`` with ``version == 0``.
    """

    def __cuda_stream__(self) -> tuple[int, int]: ...


class _ThreadDefaults(threading.local):
    """Each thread's default streams, by backend; they go when the thread ends."""

    def __init__(self) -> None:
        self.streams: dict[int, Stream] = {}


_thread_defaults = _ThreadDefaults()


def _stream_handle(obj: object) -> tuple[int, str]:
    """The raw handle of a stream-like object (not a trtio Stream), and how to name it in errors."""
    value: object
    if isinstance(obj, SupportsCudaStream):
        where = f"{type(obj).__name__}.__cuda_stream__()"
        proto: object = obj.__cuda_stream__
        got: Any = proto() if callable(proto) else proto  # some producers expose the tuple itself
        try:
            _version, value = got
        except (TypeError, ValueError):
            raise InvalidTypeError(f"{where} returned {got!r}; the CUDA stream protocol returns "
                                   "(version, handle)") from None
    elif type(obj).__name__ in ("Stream", "ExternalStream") and isinstance(
            getattr(obj, "cuda_stream", getattr(obj, "ptr", None)), int):
        # torch.cuda.Stream before it had __cuda_stream__ (.cuda_stream); cupy.cuda.Stream (.ptr).
        where = f"{type(obj).__module__}.{type(obj).__name__}"
        value = getattr(obj, "cuda_stream", getattr(obj, "ptr", None))
    elif type(obj).__name__ in ("CUstream", "cudaStream_t"):  # cuda.bindings handles: int() gives the address
        where = f"cuda.bindings {type(obj).__name__}"
        value = int(obj)  # type: ignore[call-overload]  # cuda.bindings handle types define __int__
    else:
        where = "stream handle"
        value = obj
    if isinstance(value, (bool, np.bool_)):
        raise InvalidTypeError(f"{where}: {value!r} is a bool, not a stream handle")
    if not is_int(value):
        raise InvalidTypeError(
            f"cannot make a stream of {type(obj).__name__} {obj!r}: expected a trtio.Stream, an int handle "
            "or an object with __cuda_stream__ (cuda.core, PyTorch, CuPy streams)")
    handle = int(value)
    if not 0 <= handle < _HANDLE_LIMIT:
        raise InvalidValueError(f"{where}: {handle} is not a stream handle (handles are unsigned 64-bit addresses)")
    if handle in _LEGACY_HANDLES:
        raise InvalidValueError(
            f"{where}: handle {handle} is CUDA's legacy default stream, which trtio never uses (it synchronises "
            "with every other blocking stream and cannot be captured into a CUDA graph); pass a stream of your own "
            "(trtio.Stream.create(), torch.cuda.Stream(), cupy.cuda.Stream(non_blocking=True)) or None for this "
            "thread's trtio default stream")
    return handle, where


class Stream(Closeable):
    """A stream handle on a backend: owned (destroyed on close), borrowed, or a thread's default stream.

    Follows trtio's close protocol (:mod:`trtio._lifetime`): :meth:`close` destroys an owned stream
    (a failure raises, and the stream is closed anyway) and forgets a borrowed one. A thread's default
    stream cannot be closed: ``close()`` leaves it open (see :meth:`default`).
    """

    __slots__ = ("_handle", "_backend", "_owned", "_is_default")

    def __init__(self, handle: int, backend: Backend, *, owned: bool = False, _default_of: str | None = None) -> None:
        self._handle = int(handle)
        self._backend = backend
        self._owned = owned
        self._is_default = _default_of is not None
        if self._is_default:
            # Its expected end is the garbage collector, when its thread is gone: no warning then.
            self._init_lifetime(f"default stream 0x{self._handle:x} of thread {_default_of!r}",
                                backend.destroy_stream, self._handle, warn=False)
        elif owned:
            self._init_lifetime(f"stream 0x{self._handle:x}", backend.destroy_stream, self._handle)
        else:
            self._init_lifetime(f"stream 0x{self._handle:x}")

    @classmethod
    def create(cls, backend: Backend | str | None = None) -> Stream:
        """A new non-blocking stream, destroyed on :meth:`close`."""
        be = get_backend(backend)
        return cls(be.create_stream(), be, owned=True)

    @classmethod
    def from_handle(cls, handle: StreamLike, backend: Backend | str | None = None) -> Stream:
        """Borrow an existing stream: an int handle or any object with ``__cuda_stream__``.

        Refused: bools; negative handles and handles past 64 bits; 0 and 1, CUDA's legacy default
        stream, which trtio never uses; and handles the backend knows are not its streams (the host
        backend made every stream it has). A trtio Stream is returned as it is.
        """
        if isinstance(handle, Stream):
            return _same_backend(handle, backend)
        if handle is None:
            raise InvalidTypeError("Stream.from_handle(None): None means the thread's default stream; "
                                   "use Stream.default()")
        raw, where = _stream_handle(handle)
        be = get_backend(backend)
        if be.knows_stream(raw) is False:
            raise InvalidValueError(f"{where}: 0x{raw:x} is not a live stream of the {be.name} backend; pass a "
                                    f"stream made by trtio.Stream.create() on it")
        return cls(raw, be, owned=False)

    @classmethod
    def default(cls, backend: Backend | str | None = None) -> Stream:
        """The calling thread's trtio default stream of ``backend``: a non-blocking stream of its own.

        Each thread gets its own, created on first use, so threads using ``stream=None`` never
        order (or capture) each other's work. It lives while anything references it (the thread,
        a setup created with ``stream=None``, a tensor last written on it) and is destroyed after
        that, e.g. once its thread has ended and the objects that used it are gone.

        A default stream cannot be closed: :meth:`close` on it does nothing (``with
        Stream.default():`` is harmless), since other code of the thread relies on it.
        """
        be = get_backend(backend)
        streams = _thread_defaults.streams
        stream = streams.get(id(be))  # the stream keeps its backend alive, so the id cannot be reused
        if stream is None:
            stream = cls(be.create_stream(), be, owned=True, _default_of=threading.current_thread().name)
            streams[id(be)] = stream
        return stream

    @property
    def handle(self) -> int:
        self._check_open()
        return self._handle

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def is_default(self) -> bool:
        """True for a thread's trtio default stream (which cannot be closed)."""
        return self._is_default

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def synchronize(self) -> None:
        """Block the host until all work issued on this stream has finished."""
        self._backend.synchronize_stream(self.handle)

    def wait(self, event: Event) -> None:
        """Make this stream wait for ``event`` (no host synchronisation)."""
        self._check_open()
        if not isinstance(event, Event):
            raise InvalidTypeError(f"{self._what}: wait() takes a trtio.Event, got {type(event).__name__} {event!r}")
        event.wait(self)

    def _closable(self) -> bool:
        return not self._is_default and super()._closable()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._handle == self._handle and other._backend is self._backend

    def __hash__(self) -> int:
        return hash((self._handle, id(self._backend)))

    def __repr__(self) -> str:
        if self._is_default:
            return f"Stream(0x{self._handle:x}, {self._backend.name}, {self._what})"
        state = "closed" if self._closed else ("owned" if self._owned else "borrowed")
        return f"Stream(0x{self._handle:x}, {self._backend.name}, {state})"


StreamLike: TypeAlias = Stream | SupportsCudaStream | int | None
"""What a ``stream=`` argument takes: a trtio Stream, an object with ``__cuda_stream__`` (cuda.core,
PyTorch, cuda.bindings), an int handle, or None for the calling thread's trtio default stream. At run
time older torch streams (``.cuda_stream``) and CuPy streams (``.ptr``) are accepted too."""


def _same_backend(stream: Stream, backend: Backend | str | None) -> Stream:
    if backend is None or isinstance(backend, str) or stream._backend is backend:
        return stream
    raise InvalidValueError(f"{stream!r} belongs to the {stream._backend.name} backend ({stream._backend!r}), "
                            f"not to {backend!r}; a stream is only valid on the backend that made it")


def as_stream(stream: StreamLike, backend: Backend | str | None = None) -> Stream:
    """Convert a ``stream=`` argument; None means the calling thread's trtio default stream of ``backend``."""
    if stream is None:
        if backend is not None and type(backend) is not str:  # a Backend: this thread's stream of it, once made
            found = _thread_defaults.streams.get(id(backend))
            if found is not None:
                return found
        return Stream.default(backend)
    if isinstance(stream, Stream):
        if backend is None or stream._backend is backend:
            return stream
        return _same_backend(stream, backend)
    return Stream.from_handle(stream, backend)


class Event(Closeable):
    """A synchronisation event (no timing); follows trtio's close protocol (:mod:`trtio._lifetime`):
    :meth:`close` destroys it, and a failure to destroy it raises (the event is closed anyway)."""

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

    def __repr__(self) -> str:
        return f"Event(0x{self._handle:x}, {self._backend.name}{', closed' if self._closed else ''})"
