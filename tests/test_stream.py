import numpy as np
import pytest

from trtio import ClosedError, Event, Location, Stream, Tensor
from trtio.stream import as_stream


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
    with pytest.raises(ClosedError):
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
