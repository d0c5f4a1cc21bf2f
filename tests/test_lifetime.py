"""The close protocol (trtio._lifetime) and its adoption by every resource owner: Tensor, Arena, Stream, Event,
UploadRing, ContextMemory, EngineExecutor and EngineState."""

from __future__ import annotations

import ast
import gc
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _configs import llm_config

import trtio
import trtio._state
from trtio import ClosedError, CudaError, Event, Location, Stream, Tensor
from trtio._cuda.backend import Backend
from trtio._cuda.host import HostBackend
from trtio._engine import ContextMemory, EngineExecutor, EngineIO
from trtio._lifetime import Closeable
from trtio._memory import Arena, TensorRequest
from trtio._staging import UploadRing
from trtio._state import EngineState
from trtio.testing import ReferenceEngine


# -- the protocol on a toy resource -----------------------------------------------------------------
class Handle(Closeable):
    """A resource whose release appends to a log, or raises; its owned parts may fail to close."""

    __slots__ = ("log", "own_fails")

    def __init__(self, log: list[str], *, fail: bool = False, own_fails: bool = False) -> None:
        self.log = log
        self.own_fails = own_fails
        self._init_lifetime("handle 'h'", _release, log, fail)

    def _close_owned(self) -> None:
        self.log.append("owned")
        if self.own_fails:
            raise RuntimeError("child failed")

    def ping(self) -> str:
        self._check_open()
        return "pong"


def _release(log: list[str], fail: bool) -> None:
    log.append("released")
    if fail:
        raise CudaError("cuFree", "CUDA_ERROR_INVALID_VALUE", "boom")


def test_close_is_idempotent_and_methods_raise_after_it() -> None:
    log: list[str] = []
    h = Handle(log)
    assert h.ping() == "pong" and not h.is_closed
    h.close()
    h.close()
    assert h.is_closed and log == ["owned", "released"]
    with pytest.raises(ClosedError, match="handle 'h' is closed"):
        h.ping()


def test_a_failed_release_raises_once_and_is_never_retried() -> None:
    log: list[str] = []
    h = Handle(log, fail=True)
    with pytest.raises(CudaError, match="boom"):
        h.close()
    assert h.is_closed
    h.close()  # no second release: a double free is worse than a leak
    del h
    gc.collect()  # nor by the finalizer
    assert log == ["owned", "released"]


def test_owned_parts_failing_still_release_the_resource() -> None:
    log: list[str] = []
    h = Handle(log, own_fails=True)
    with pytest.raises(RuntimeError, match="child failed"):
        h.close()
    assert h.is_closed and log == ["owned", "released"]


def test_with_closes_and_a_closed_object_cannot_be_entered() -> None:
    log: list[str] = []
    with Handle(log) as h:
        assert h.ping() == "pong"
    assert h.is_closed and log == ["owned", "released"]
    with pytest.raises(ClosedError), h:
        pass


def test_backstop_warns_and_swallows_release_errors() -> None:
    log: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Handle(log, fail=True)  # dropped without close()
        gc.collect()
    assert log == ["released"], "the backstop releases; it does not close owned parts"
    assert [w.category for w in caught] == [ResourceWarning]
    assert "handle 'h' was never closed" in str(caught[0].message)


class _User:
    """Stands in for an executor: a name, and open until closed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.is_closed = False


def test_a_resource_bound_by_an_open_user_refuses_to_close() -> None:
    from trtio._lifetime import mark_bound, open_binders

    log: list[str] = []
    h = Handle(log)
    a, b = _User("a"), _User("b")
    mark_bound(h, a)
    mark_bound(h, b)
    with pytest.raises(trtio.FrozenError, match=r"handle 'h' is bound by open executor\(s\) \['a', 'b'\]"):
        h.close()
    assert not h.is_closed and log == [], "nothing was released"
    a.is_closed = True
    del b  # a user that is gone binds nothing
    gc.collect()
    assert open_binders(h) == []
    h.close()
    assert h.is_closed and log == ["owned", "released"]


def test_slotted_subclasses_stay_slotted() -> None:
    h = Handle([])
    assert not hasattr(h, "__dict__")
    h.close()


# -- a backend whose frees and destroys fail ----------------------------------------------------------
class FailingFree(HostBackend):
    """Refuses every free / destroy (a driver that reports an error): nothing is released."""

    def free(self, ptr: int, location: Location) -> None:
        raise CudaError("cudaFree", "cudaErrorIllegalAddress", "an illegal memory access was encountered")

    def destroy_stream(self, stream: int) -> None:
        raise CudaError("cudaStreamDestroy", "cudaErrorInvalidResourceHandle", "invalid resource handle")

    def destroy_event(self, event: int) -> None:
        raise CudaError("cudaEventDestroy", "cudaErrorInvalidResourceHandle", "invalid resource handle")


def _requests() -> list[TensorRequest]:
    return [TensorRequest.of("a", (4,), "int32"), TensorRequest.of("p", (4,), "int32", Location.PINNED)]


def test_failed_free_in_arena_close_raises_naming_the_arena_and_leaves_it_closed() -> None:
    be = FailingFree()
    arena = Arena(_requests(), backend=be, title="kv")
    a = arena["a"]
    with pytest.raises(CudaError, match=r"cudaFree: cudaErrorIllegalAddress: arena 'kv': freeing its device block "
                                        r"of 256 bytes.*and 1 more block") as info:
        arena.close()
    assert info.value.name == "cudaErrorIllegalAddress"
    assert arena.is_closed
    arena.close()  # idempotent: the failure is not raised again
    with pytest.raises(ClosedError, match="arena 'kv' is closed"):
        arena["a"]
    with pytest.raises(ClosedError, match="^tensor 'a' is closed$"):
        a.data_ptr


def test_arena_frees_every_block_even_when_one_fails() -> None:
    class FailsDevice(HostBackend):
        def free(self, ptr: int, location: Location) -> None:
            super().free(ptr, location)
            if location is Location.DEVICE:
                raise CudaError("cudaFree", "cudaErrorUnknown")

    be = FailsDevice()
    arena = Arena(_requests(), backend=be)
    with pytest.raises(CudaError, match="device block"):
        arena.close()
    assert be.live_allocations == 0


def test_failed_destroy_in_stream_and_event_close_raises() -> None:
    be = FailingFree()
    s = Stream.create(be)
    with pytest.raises(CudaError, match="cudaStreamDestroy"):
        s.close()
    assert s.is_closed
    s.close()
    e = Event.create(be)
    with pytest.raises(CudaError, match="cudaEventDestroy"):
        e.close()
    assert e.is_closed
    e.close()


def test_failed_free_in_tensor_close_names_the_tensor() -> None:
    t = Tensor.empty((4,), "int32", name="logits", backend=FailingFree())
    with pytest.raises(CudaError, match=r"tensor 'logits': freeing 16 bytes of device memory"):
        t.close()
    assert t.is_closed
    t.close()


def test_unclosed_resources_warn_and_are_released() -> None:
    be = HostBackend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Arena(_requests(), backend=be, title="leaky")
        Stream.create(be)
        Event.create(be)
        gc.collect()
    messages = sorted(str(w.message) for w in caught if w.category is ResourceWarning)
    assert len(messages) == 3 and "arena 'leaky'" in messages[0]
    assert be.live_allocations == 0 and be.live_streams == 0 and be.live_events == 0


# -- every public method of a closed object raises ClosedError ----------------------------------------
def _tensor_calls(t: Tensor) -> Iterator[Callable[[], Any]]:
    yield lambda: t.shape
    yield lambda: t.nbytes
    yield lambda: t.ndim
    yield lambda: t.numel
    yield lambda: t.data_ptr
    yield lambda: t.reshape((2,))
    yield lambda: t.view("uint8")
    yield lambda: t.copy_from(np.zeros(4, np.int32))
    yield lambda: t.copy_to(np.zeros(4, np.int32))
    yield lambda: t.to_numpy()
    yield lambda: t.zero_()
    yield lambda: t.fill_(1)
    yield lambda: t.mark_written(None)
    yield lambda: t.__array_interface__
    yield lambda: t.__dlpack__()
    yield lambda: t.__dlpack_device__()
    yield lambda: t.__enter__()


def test_every_tensor_method_raises_after_close(host: Backend) -> None:
    t = Tensor.empty((4,), "int32", Location.PINNED, name="gone", backend=host)
    t.close()
    for call in _tensor_calls(t):
        with pytest.raises(ClosedError, match="tensor 'gone' is closed"):
            call()
    assert (t.name, t.capacity, t.is_closed) == ("gone", 16, True)
    assert "closed" in repr(t)


def test_every_stream_and_event_method_raises_after_close(host: Backend) -> None:
    s, e = Stream.create(host), Event.create(host)
    s.close()
    e.close()
    live = Stream.create(host)
    for call in (lambda: s.handle, s.synchronize, lambda: s.wait(Event.create(host)), s.__cuda_stream__,
                 s.__enter__):
        with pytest.raises(ClosedError, match=f"stream 0x{s._handle:x} is closed"):
            call()
    for call in (lambda: e.handle, lambda: e.record(live), lambda: e.wait(live), e.synchronize, e.query,
                 e.__enter__):
        with pytest.raises(ClosedError, match=f"event 0x{e._handle:x} is closed"):
            call()
    live.close()


def test_every_arena_and_staging_method_raises_after_close(host: Backend) -> None:
    arena = Arena([TensorRequest.of("host", (4,), "int32", Location.PINNED), TensorRequest.of("dev", (4,), "int32")],
                  backend=host, title="stage")
    ring = UploadRing(arena["host"], host, slots=1)
    ring.close()
    ring.close()
    for call in (lambda: ring.upload(np.zeros(4, np.int32), arena["dev"]), ring.wait, ring.take, ring.__enter__):
        with pytest.raises(ClosedError, match="upload ring 'host' is closed"):
            call()
    arena.close()
    for call in (lambda: arena["dev"], lambda: arena.tensors, arena.report, arena.__enter__):
        with pytest.raises(ClosedError, match="arena 'stage' is closed"):
            call()


# -- every resource owner follows the protocol ---------------------------------------------------------
def _engine() -> ReferenceEngine:
    return ReferenceEngine.from_config(llm_config(), device="host")


OWNERS: dict[str, Callable[[HostBackend], Any]] = {
    "tensor": lambda be: Tensor.empty((4,), "int32", name="t", backend=be),
    "arena": lambda be: Arena(_requests(), backend=be, title="a"),
    "stream": lambda be: Stream.create(be),
    "event": lambda be: Event.create(be),
    "upload ring": lambda be: UploadRing(Tensor.empty((4,), "int32", Location.PINNED, backend=be), be, slots=1),
    "context memory": lambda be: ContextMemory(4096, backend=be),
    "executor": lambda be: EngineExecutor(_engine(), backend=be),
    "engine state": lambda be: EngineState(EngineIO.from_engine(_engine()), llm_config(), max_batch=2, backend=be),
}


@pytest.mark.parametrize("kind", OWNERS)
def test_every_resource_owner_closes_once_and_cannot_be_entered_closed(kind: str) -> None:
    be = HostBackend()
    obj = OWNERS[kind](be)
    assert isinstance(obj, Closeable)
    with obj as entered:
        assert entered is obj and obj.is_closed is False
    assert obj.is_closed is True
    obj.close()  # a second close does nothing
    assert obj.is_closed is True
    with pytest.raises(ClosedError, match="is closed"), obj:
        pass


def test_no_class_writes_the_close_protocol_again() -> None:
    """close, __enter__ and __exit__ come from Closeable (classes refine _closable and _close_owned)."""
    root = Path(trtio.__file__).parent
    not_yet: set[str] = set()
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in not_yet or rel == "_lifetime.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found += [f"{rel}: {node.name}.{f.name}" for f in node.body
                          if isinstance(f, ast.FunctionDef) and f.name in ("close", "__enter__", "__exit__")]
    assert found == []


def _no_resource_warning(caught: list[warnings.WarningMessage]) -> None:
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []


def test_an_executor_that_fails_half_way_frees_the_memory_it_made() -> None:
    be = HostBackend()
    engine = _engine()
    engine.create_execution_context = lambda *args: None  # as TensorRT does when it cannot make one
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(trtio.EngineError, match="create_execution_context returned None"):
            EngineExecutor(engine, backend=be)
        gc.collect()
    assert be.live_allocations == 0
    _no_resource_warning(caught)


def test_an_engine_state_that_fails_half_way_frees_what_it_made(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise CudaError("cuModuleLoadData", "CUDA_ERROR_OUT_OF_MEMORY", "no room for the KV commit kernel")

    monkeypatch.setattr(trtio._state, "KVCommit", refuse)  # the last part the state builds
    be = HostBackend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CudaError, match="no room for the KV commit kernel"):
            EngineState(EngineIO.from_engine(_engine()), llm_config(), max_batch=2, backend=be)
        gc.collect()
    assert (be.live_allocations, be.live_events) == (0, 0)
    _no_resource_warning(caught)
