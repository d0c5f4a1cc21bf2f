"""The backend protocol: the handful of memory, stream, event and graph calls trtio needs.

Two implementations exist: :mod:`trtio._cuda.device` (cuda-python) and :mod:`trtio._cuda.host`
(numpy, synchronous). Everything above this layer only talks to the protocol, so all of
trtio's logic runs, and is tested, on a machine without a GPU.

:class:`Location` (where memory lives) is defined beneath both implementations, in
:mod:`trtio._cuda._location`; import it from here.

Handles are plain ints: pointers, stream handles, event handles and graph-exec handles.
Stream-ordered calls take the stream handle as their last argument.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, runtime_checkable

from trtio._cuda._location import Location, LocationLike
from trtio._cuda.device import CudaBackend, probe_device_count, probe_error
from trtio._cuda.host import HostBackend
from trtio.errors import CudaError, InvalidValueError

__all__ = ["Backend", "Location", "LocationLike", "cuda_available", "destroy_graphs", "get_backend"]


@runtime_checkable
class Backend(Protocol):
    """What a memory backend provides. All sizes are in bytes.

    Backends are shared by every thread: their calls are thread-safe. Graph capture follows
    CUDA's ``cudaStreamCaptureModeThreadLocal``: only the capturing thread is barred from
    allocating, freeing and synchronising while it captures.
    """

    name: str
    device_id: int
    alloc_count: int  # allocations made so far (tests count them: a decode step must make none)
    sync_count: int  # host synchronisations so far (a decode step must make none)

    # memory
    def alloc(self, nbytes: int, location: Location) -> int: ...
    def free(self, ptr: int, location: Location) -> None: ...
    def memcpy(self, dst: int, src: int, nbytes: int, stream: int) -> None: ...
    def memcpy_2d(
        self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, stream: int
    ) -> None: ...
    def memset(self, ptr: int, value: int, nbytes: int, stream: int) -> None: ...
    def fill(self, ptr: int, pattern: bytes, count: int, stream: int) -> None: ...
    def mem_info(self) -> tuple[int, int]: ...
    def is_host_accessible(self, location: Location) -> bool: ...
    def knows_pointer(self, ptr: int, nbytes: int, location: Location) -> bool | None:
        """Whether ``[ptr, ptr + nbytes)`` is memory of ``location`` this backend can vouch for; None: cannot tell."""
        ...

    # streams and events
    def create_stream(self) -> int: ...
    def destroy_stream(self, stream: int) -> None: ...
    def knows_stream(self, stream: int) -> bool | None:
        """Whether ``stream`` is a live stream; None when the backend cannot tell (CUDA: foreign streams)."""
        ...
    def synchronize_stream(self, stream: int) -> None: ...
    def create_event(self) -> int: ...
    def destroy_event(self, event: int) -> None: ...
    def record_event(self, event: int, stream: int) -> None: ...
    def wait_event(self, stream: int, event: int) -> None: ...
    def synchronize_event(self, event: int) -> None: ...
    def query_event(self, event: int) -> bool: ...
    def synchronize(self) -> None: ...

    # graphs
    def begin_capture(self, stream: int) -> None: ...
    def end_capture(self, stream: int) -> int: ...
    def abort_capture(self, stream: int) -> None: ...
    def is_capturing(self, stream: int) -> bool: ...
    def launch_graph(self, graph_exec: int, stream: int) -> None: ...
    def destroy_graph(self, graph_exec: int) -> None: ...

    # what is live: what this backend created and has not destroyed yet (leak tests compare with a baseline)
    @property
    def live_allocations(self) -> int: ...
    @property
    def live_streams(self) -> int: ...
    @property
    def live_events(self) -> int: ...
    @property
    def live_graphs(self) -> int: ...


_lock = threading.Lock()
_backends: dict[str, Backend] = {}
_cuda_probe: bool | None = None


def cuda_available() -> bool:
    """True when cuda-python loads and reports at least one CUDA device. Never raises."""
    global _cuda_probe
    if _cuda_probe is None:
        _cuda_probe = probe_device_count() > 0
    return _cuda_probe


def destroy_graphs(backend: Backend, graphs: dict[Any, int]) -> None:
    """Destroy every graph in ``graphs`` (0 marks one that was not captured) and empty it: each is tried,
    then the first error is raised."""
    live = [g for g in graphs.values() if g]
    graphs.clear()
    errors = []
    for g in live:
        try:
            backend.destroy_graph(g)
        except Exception as exc:  # keep destroying the rest, then report
            errors.append(exc)
    if errors:
        raise errors[0]


def get_backend(kind: str | Backend | None = "auto") -> Backend:
    """Return the shared backend of ``kind``.

    ``"auto"`` (or None) gives ``cuda`` when a CUDA device answers, else ``host``. ``"cuda"``
    raises :class:`CudaError` on a machine without one. A Backend instance is returned as is.
    """
    if kind is None:
        kind = "auto"
    if not isinstance(kind, str):
        return kind
    if kind == "auto":
        kind = "cuda" if cuda_available() else "host"
    if kind not in ("cuda", "host"):
        raise InvalidValueError(f"unknown backend {kind!r}; expected 'auto', 'cuda', 'host' or a Backend instance")
    with _lock:
        backend = _backends.get(kind)
        if backend is None:
            if kind == "cuda":
                if not cuda_available():
                    raise CudaError(
                        "get_backend('cuda')",
                        None,
                        f"no CUDA device is usable here ({probe_error()}); "
                        "use get_backend('host') or 'auto' on machines without a GPU",
                    )
                backend = CudaBackend()
            else:
                backend = HostBackend()
            _backends[kind] = backend
        return backend
