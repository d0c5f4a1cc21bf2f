"""The close protocol: how every trtio object that owns a resource gives it back.

This module is the one statement of the protocol; :class:`Closeable` implements it. Tensors,
arenas, streams, events and staging pairs follow it, and so must every new owner of memory,
handles, graphs or execution contexts.

The protocol
------------
1. ``close()`` releases what the object owns. It is idempotent: a second call does nothing.
2. An error while releasing is **raised** from ``close()``, naming the object. The object is
   closed anyway, and nothing is ever released twice: a release that failed is not retried by a
   later ``close()`` nor by the garbage collector (a double free is worse than a leak).
3. ``is_closed`` says whether ``close()`` has run.
4. ``with obj:`` closes ``obj`` when the block ends, with or without an exception; entering a
   closed object raises :class:`~trtio.errors.ClosedError`.
5. After ``close()``, every public method, and every property that reads the resource, raises
   :class:`~trtio.errors.ClosedError` naming the object (``"tensor 'logits' is closed"``).
   Properties that only describe the object (``name``, ``dtype``, ``capacity``, ``backend``,
   ``is_closed``) and ``repr`` keep answering.
6. Backstop: an object that is garbage collected without ``close()`` is released by a
   ``weakref.finalize`` callback, which **warns** with a :class:`ResourceWarning` naming the
   object and **swallows** errors from the release (it runs wherever the collector runs, and at
   interpreter exit the CUDA driver may already be gone). Backstops do not run at interpreter
   exit: the process gives everything back then.
7. An object closes what it owns first, then releases its own resource (an arena closes its slices,
   then frees its blocks). If both fail, the release's error is raised with the first one as its
   context. An object that owns nothing (a borrowed stream, a view) follows the same protocol with
   nothing to release.
8. A factory that fails half way closes what it already built (``contextlib.ExitStack``).
9. Memory an open executor has bound is not freed under it: ``close()`` of the object that would
   free it (an owning tensor, an arena) raises :class:`~trtio.errors.FrozenError` naming the
   executors, and frees nothing, until they are closed (:func:`mark_bound`, :func:`open_binders`), or until
   each of them has let the memory go (:func:`unmark_bound`: it dropped every binding and graph that held it).

How to adopt it
---------------
Derive from :class:`Closeable` (it has ``__slots__``, so slotted classes stay slotted; do not
declare ``__weakref__``, ``_closed``, ``_what`` or ``_finalizer`` again, not even as class
attributes; a class with another slotted base cannot add it). In ``__init__``, once the resource
exists (and before anything can call ``_check_open``), call
``self._init_lifetime(what, release, *args)``: ``what`` names the object in errors and warnings
(``"stream 0x1000"``), ``release(*args)`` frees the resource and must not refer to the object
itself (the finalizer would keep it alive). Objects without a resource call
``self._init_lifetime(what)``. Override ``_close_owned()`` to close what the object owns, and
call ``self._check_open()`` at the top of every public method. A subclass that must refuse to
close (a tensor still bound to an engine) overrides ``_closable()``; no subclass writes ``close``,
``__enter__`` or ``__exit__`` again::

    class Buffer(Closeable):
        __slots__ = ("_ptr", "_backend")

        def __init__(self, backend: Backend, nbytes: int) -> None:
            self._backend = backend
            self._ptr = backend.alloc(nbytes, Location.DEVICE)
            self._init_lifetime(f"buffer 0x{self._ptr:x}", backend.free, self._ptr, Location.DEVICE)

        def zero(self, stream: StreamLike = None) -> None:
            self._check_open()
            ...
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Self

from trtio.errors import ClosedError, FrozenError

__all__ = ["Closeable", "mark_bound", "open_binders", "unmark_bound"]

# Who has bound what: a resource (an arena, an owning tensor) -> the executors whose engines hold addresses
# in it. Weak both ways: neither a dropped resource nor a dropped executor is kept alive by this.
_binders: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()
_binders_lock = threading.RLock()


def mark_bound(resource: Any, user: Any) -> None:
    """Record that ``user`` (an object with ``name`` and ``is_closed``, e.g. an EngineExecutor) has bound
    memory that ``resource`` frees on close; ``resource.close()`` is refused while ``user`` is open."""
    with _binders_lock:
        users = _binders.get(resource)
        if users is None:
            users = _binders[resource] = weakref.WeakSet()
        users.add(user)


def unmark_bound(resource: Any, user: Any) -> None:
    """Record that ``user`` no longer holds memory of ``resource`` bound (it dropped every binding and captured
    graph that pointed there): :func:`mark_bound` undone for that user alone."""
    with _binders_lock:
        users = _binders.get(resource)
        if users is not None:
            users.discard(user)


def open_binders(resource: Any) -> list[str]:
    """Names of the open users that have bound memory of ``resource`` (see :func:`mark_bound`)."""
    with _binders_lock:
        try:
            users = _binders.get(resource)
        except TypeError:  # not weakly referenceable: nothing can have been recorded
            return []
        found = list(users) if users else []
    return sorted({str(u.name) for u in found if not u.is_closed})


def _backstop(what: str, warn: bool, release: Callable[..., object], args: tuple[Any, ...]) -> None:
    """The finalizer: release what ``close()`` never did; warn, never raise."""
    if warn:
        warnings.warn(f"trtio: {what} was never closed; released by the garbage collector",
                      ResourceWarning, stacklevel=2)
    try:
        release(*args)
    except Exception:  # noqa: BLE001 - a finalizer must not raise (the driver may be gone already)
        pass


class Closeable:
    """Base of every trtio object that owns a resource (see the module docstring for the protocol)."""

    __slots__ = ("_closed", "_what", "_finalizer", "__weakref__")

    _closed: bool
    _what: str
    _finalizer: weakref.finalize[..., Any] | None

    def _init_lifetime(self, what: str, release: Callable[..., object] | None = None, *args: Any,
                       warn: bool = True) -> None:
        """Start the object's life. ``release(*args)`` frees its resource (None: it owns nothing).

        ``warn=False`` makes the backstop release silently, for objects whose expected end is the
        garbage collector (a thread's default stream).
        """
        self._closed = False
        self._what = what
        self._finalizer = None
        if release is not None:
            finalizer = weakref.finalize(self, _backstop, what, warn, release, args)
            finalizer.atexit = False
            self._finalizer = finalizer

    @property
    def is_closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._closed

    def _check_open(self) -> None:
        """Raise :class:`ClosedError` naming the object if it is closed."""
        if self._closed:
            raise ClosedError(f"{self._what} is closed")

    def _close_owned(self) -> None:
        """Close what this object owns, before its own resource is released (override)."""

    def _closable(self) -> bool:
        """Checked by :meth:`close` before anything is released (override to refine): raise to refuse
        (:class:`FrozenError` naming who still uses the object), or return False for an object that
        ``close()`` leaves open (a thread's default stream). Here: refused while an open executor has
        the object's memory bound (:func:`mark_bound`)."""
        users = open_binders(self)
        if users:
            raise FrozenError(f"{self._what} is bound by open executor(s) {users}: freeing it would leave their "
                              f"engines (and captured graphs) using freed memory; close them (or the setup) first")
        return True

    def close(self) -> None:
        """Release what the object owns. Idempotent; a failed release raises, and the object is closed anyway.

        Refused (:class:`FrozenError`, nothing released) while an open executor has its memory bound."""
        if self._closed or not self._closable():
            return
        self._closed = True
        try:
            self._close_owned()
        finally:
            finalizer = self._finalizer
            self._finalizer = None
            # detach() hands the release to exactly one caller, even against a racing collector.
            info = finalizer.detach() if finalizer is not None else None
            if info is not None:
                _what, _warn, release, args = info[2]
                release(*args)

    def __enter__(self) -> Self:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
