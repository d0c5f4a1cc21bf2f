"""The backend protocol: the handful of memory, stream, event and graph calls trtio needs.

Two implementations exist: :mod:`trtio.cuda.device` (cuda-python) and :mod:`trtio.cuda.host`
(numpy, synchronous). Everything above this layer only talks to the protocol, so all of
trtio's logic runs, and is tested, on a machine without a GPU.

Handles are plain ints: pointers, stream handles, event handles and graph-exec handles.
Stream-ordered calls take the stream handle as their last argument.
"""

from __future__ import annotations

import enum
import threading
from typing import Any, Protocol, TypeAlias, runtime_checkable

from trtio.errors import CudaError, InvalidValueError

__all__ = ["Backend", "Location", "LocationLike", "cuda_available", "destroy_graphs", "get_backend"]


class Location(enum.Enum):
    """Where a tensor's memory lives."""

    DEVICE = "device"
    PINNED = "pinned"  # page-locked host memory; async copies, visible to the device
    HOST = "host"  # pageable host memory (host-located engine tensors, tests)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def coerce(cls, value: LocationLike, what: str = "location") -> Location:
        """A Location from a member, its value (``"device"``) or its name (``"DEVICE"``).

        Anything else raises :class:`InvalidValueError` naming ``what`` and the locations that exist.
        """
        if isinstance(value, Location):
            return value
        if isinstance(value, str):
            found = _LOCATIONS.get(value.lower())
            if found is not None:
                return found
        raise InvalidValueError(
            f"{what}: {value!r} is not a memory location; expected one of "
            + ", ".join(repr(m.value) for m in cls) + " (trtio.Location.DEVICE, PINNED, HOST)")


LocationLike: TypeAlias = "Location | str"
_LOCATIONS = {m.value: m for m in Location}


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
        from trtio.cuda.device import probe_device_count

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
                    from trtio.cuda.device import probe_error

                    raise CudaError(
                        "get_backend('cuda')",
                        None,
                        f"no CUDA device is usable here ({probe_error()}); "
                        "use get_backend('host') or 'auto' on machines without a GPU",
                    )
                from trtio.cuda.device import CudaBackend

                backend = CudaBackend()
            else:
                from trtio.cuda.host import HostBackend

                backend = HostBackend()
            _backends[kind] = backend
        return backend
