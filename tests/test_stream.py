import gc
import threading
import warnings

import numpy as np
import pytest

from trtio import ClosedError, Event, Location, Stream, Tensor
from trtio._cuda.host import HostBackend
from trtio._stream import as_stream
from trtio.errors import InvalidValueError


class ForeignStream:
    """Stands in for a torch / CuPy / cuda.core stream."""

    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def test_create_close_idempotent(backend):
    s = Stream.create(backend)
    assert s.handle != 0
    s.synchronize()
    s.close()
    s.close()
    assert s.is_closed
    with pytest.raises(ClosedError, match="closed"):
        s.synchronize()


def test_from_handle_accepts_ints_and_cuda_stream_objects(backend):
    owner = Stream.create(backend)
    borrowed = Stream.from_handle(owner.handle, backend)
    assert borrowed == owner and borrowed.handle == owner.handle
    foreign = Stream.from_handle(ForeignStream(owner.handle), backend)
    assert foreign.handle == owner.handle
    assert Stream.from_handle(owner) is owner
    borrowed.close()  # borrowed: forgetting it must not destroy the owner's stream
    owner.synchronize()
    owner.close()


def test_from_handle_rejects_other_objects(host):
    with pytest.raises(TypeError, match="__cuda_stream__"):
        Stream.from_handle("stream", host)


def test_default_stream_is_one_non_default_stream(backend):
    a = Stream.default(backend)
    b = as_stream(None, backend)
    assert a is b
    assert a.handle not in (0, 1, 2), "never CUDA's legacy or per-thread default stream"


def test_stream_exports_cuda_stream_protocol(backend):
    s = Stream.create(backend)
    assert s.__cuda_stream__() == (0, s.handle)
    s.close()


def test_event_record_wait_query(backend):
    s1, s2 = Stream.create(backend), Stream.create(backend)
    e = Event.create(backend)
    assert e.record(s1) is e
    e.wait(s2)
    s2.wait(e)
    e.synchronize()
    assert e.query()
    e.close()
    e.close()
    with pytest.raises(ClosedError, match=rf"^event 0x{e._handle:x} is closed$"):
        e.record(s1)
    s1.close()
    s2.close()


@pytest.mark.gpu
def test_two_streams_ordered_by_an_event(cuda):
    """The consumer waits on the producer's event and always sees the producer's data."""
    n = 8 << 20  # 8M int32 = 32 MiB: the fills take long enough to race without the event
    producer, consumer = Stream.create(cuda), Stream.create(cuda)
    src = Tensor.empty((n,), "int32", backend=cuda)
    dst = Tensor.empty((n,), "int32", backend=cuda)
    out = Tensor.empty((n,), "int32", Location.PINNED, backend=cuda)
    ready = Event.create(cuda)
    for i in range(100):
        for _ in range(4):
            src.fill_(-1, producer)
        src.fill_(i, producer)
        ready.record(producer)
        ready.wait(consumer)
        dst.copy_from(src, consumer)
        out.copy_from(dst, consumer)
        consumer.synchronize()
        got = np.asarray(out)
        assert got[0] == i and got[-1] == i and (got == i).all(), f"iteration {i}"
    producer.synchronize()
    for x in (src, dst, out, ready, producer, consumer):
        x.close()


class TorchLikeStream:
    """Stands in for an older torch.cuda.Stream: a ``cuda_stream`` attribute, no protocol."""

    def __init__(self, handle):
        self.cuda_stream = handle


TorchLikeStream.__name__ = "Stream"


@pytest.mark.parametrize("handle,error,needle", [
    (True, TypeError, "is a bool, not a stream handle"),
    (np.bool_(True), TypeError, "is a bool"),
    (0, InvalidValueError, "legacy default stream, which trtio never uses"),
    (1, InvalidValueError, "legacy default stream"),
    (-5, InvalidValueError, "-5 is not a stream handle"),
    (1 << 64, InvalidValueError, "not a stream handle"),
    (1.0, TypeError, "cannot make a stream of float"),
    ("4096", TypeError, "cannot make a stream of str"),
    (None, TypeError, "Stream.default"),
])
def test_from_handle_refuses_what_is_not_a_stream(backend, handle, error, needle):
    with pytest.raises(error, match=needle):
        Stream.from_handle(handle, backend)


def test_legacy_stream_refused_through_the_protocol_too(backend):
    with pytest.raises(InvalidValueError, match=r"ForeignStream.__cuda_stream__\(\): handle 0 is CUDA's legacy"):
        Stream.from_handle(ForeignStream(0), backend)
    with pytest.raises(InvalidValueError, match="legacy"):
        Stream.from_handle(TorchLikeStream(0), backend)


def test_host_refuses_handles_of_no_stream(host):
    with pytest.raises(InvalidValueError, match="0xdead is not a live stream of the host backend"):
        Stream.from_handle(0xDEAD, host)
    e = Event.create(host)
    with pytest.raises(InvalidValueError, match="0xbeef is not a live stream"):
        e.record(0xBEEF)
    with pytest.raises(InvalidValueError, match="0xbeef"):
        e.wait(0xBEEF)
    s = Stream.create(host)
    assert Stream.from_handle(TorchLikeStream(s.handle), host) == s
    s.close()
    with pytest.raises(InvalidValueError, match="not a live stream"):
        Stream.from_handle(s._handle, host)  # destroyed: no longer a stream
    e.close()


def test_a_stream_is_refused_on_another_backend(host):
    other = HostBackend()
    s = Stream.create(other)
    t = Tensor.empty((4,), "int32", backend=host)
    with pytest.raises(InvalidValueError, match="a stream is only valid on the backend that made it"):
        t.zero_(s)
    with pytest.raises(InvalidValueError, match="belongs to"):
        as_stream(s, host)
    t.close()
    s.close()


def test_default_stream_cannot_be_closed(backend):
    s = Stream.default(backend)
    with s:
        pass
    s.close()
    assert not s.is_closed and s.is_default
    s.synchronize()
    assert as_stream(None, backend) is s
    assert "default stream" in repr(s)


def test_each_thread_has_its_own_default_stream(backend):
    mine = Stream.default(backend)
    theirs = []
    t = threading.Thread(target=lambda: theirs.extend([Stream.default(backend), as_stream(None, backend)]))
    t.start()
    t.join()
    assert theirs[0] is theirs[1], "one default stream per thread and backend"
    assert theirs[0] != mine and theirs[0].handle not in (0, 1, 2)


def test_a_threads_default_stream_goes_when_the_thread_and_its_users_are_gone():
    be = HostBackend()
    kept = []

    def work(keep):
        t = Tensor.empty((4,), "int32", backend=be)
        t.fill_(3)  # on the thread's default stream
        if keep:
            kept.append(Stream.default(be))
        t.close()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for keep in (False, True):
            thread = threading.Thread(target=work, args=(keep,))
            thread.start()
            thread.join()
        gc.collect()
        assert be.live_streams == 1, "destroyed once its thread ended; kept alive while referenced"
        kept[0].synchronize()
        kept.clear()
        gc.collect()
    assert be.live_streams == 0
    assert not [w for w in caught if w.category is ResourceWarning], "a default stream ends silently"


# -- the stream rule (trtio/_stream.py's module docstring) ---------------------------------------------
# Parameters named "stream" that are not a stream= argument: backend handles (int), streams a caller
# converted already (Stream), and text streams (TextIO).
_NOT_STREAM_ARGUMENTS = ("int", "Stream", "TextIO", "TextIO | None")
# The converter itself, and calls in modules whose owners have yet to adopt the rule.
_EXEMPT = {"trtio._stream.as_stream", "trtio._pipeline_io.StreamingPrefillBuffers.release",
           "trtio._pipeline_io.StreamingPrefillBuffers.order_before", "trtio._trees.write_tree_inputs",
           "trtio.testing.toy_runtime.spec_generate"}


def _stream_rule_breaches(modules) -> list[str]:
    import inspect

    found = []
    for mod in modules:
        members = [(n, o) for n, o in vars(mod).items() if getattr(o, "__module__", None) == mod.__name__]
        calls = []
        for name, obj in members:
            if inspect.isfunction(obj) and not name.startswith("_"):
                calls.append((name, obj))
            elif inspect.isclass(obj):
                for attr, f in vars(obj).items():
                    f = f.__func__ if isinstance(f, (classmethod, staticmethod)) else f
                    if inspect.isfunction(f) and (not attr.startswith("_") or attr == "__init__"):
                        calls.append((f"{name}.{attr}", f))
        for qual, f in calls:
            params = inspect.signature(f).parameters
            p = params.get("stream")
            if p is None or p.annotation in _NOT_STREAM_ARGUMENTS or f"{mod.__name__}.{qual}" in _EXEMPT:
                continue
            positional = [q.name for q in params.values() if q.kind is q.POSITIONAL_OR_KEYWORD]
            if p.kind is not p.POSITIONAL_OR_KEYWORD or p.default is not None or positional[-1] != "stream":
                found.append(f"{mod.__name__}.{qual}{inspect.signature(f)}")
    return found


def test_every_stream_argument_is_the_last_positional_one_and_defaults_to_none():
    import importlib
    import pkgutil

    import trtio

    modules = [importlib.import_module(m.name) for m in pkgutil.walk_packages(trtio.__path__, "trtio.")
               if m.name != "trtio.__main__"]
    assert _stream_rule_breaches(modules) == []


def test_the_stream_rule_check_sees_a_keyword_only_or_required_stream():
    import types

    mod = types.ModuleType("fake")

    def upload(values, *, stream=None): ...

    def record(stream, event=None): ...

    def launch(graph: int, stream: "int"): ...  # a backend handle: not a stream= argument

    def _helper(stream, values): ...  # private: it takes what its public caller converted

    for f in (upload, record, launch, _helper):
        f.__module__ = "fake"
        setattr(mod, f.__name__, f)
    assert _stream_rule_breaches([mod]) == ["fake.upload(values, *, stream=None)", "fake.record(stream, event=None)"]
