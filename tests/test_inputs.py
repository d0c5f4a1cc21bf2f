"""trtio._inputs and Tensor.from_dlpack: foreign arrays in, read in place, ordered, kept alive, refused clearly.

Host memory is tested with numpy and torch (CPU); CUDA memory, without a GPU, through a host backend that
calls itself ``cuda`` (:class:`FakeCudaBackend`): its "device" memory is host memory it allocated, so every
path of the adapter (zero copy, the stream handshakes, the refusals) runs here, on what a producer of CUDA
memory hands over. The ``gpu`` tests repeat the essentials with torch and CuPy on a real device.
"""

from __future__ import annotations

import contextlib
import gc
import types
import warnings
import weakref
from typing import Any

import numpy as np
import pytest

import trtio
from trtio import InvalidTypeError, InvalidValueError, Location, ShapeError, Stream, Tensor
from trtio._cuda.host import HostBackend
from trtio._dlpack import kDLCPU, kDLCUDA, kDLFloat, live_exports, make_capsule, parse_max_version
from trtio._inputs import as_input

try:
    import torch
except ImportError:  # CI installs the CPU build (.ci/requirements.txt); elsewhere these tests skip
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


class FakeCudaBackend(HostBackend):
    """The host backend under the cuda backend's name: DLPack exports of its DEVICE tensors say kDLCUDA, so
    they stand in for CUDA arrays of another library. Records the events recorded and waited for."""

    name = "cuda"

    def __init__(self, device_id: int = 0) -> None:
        super().__init__()
        self.device_id = device_id
        self.orders: list[tuple[str, int]] = []

    def record_event(self, event: int, stream: int) -> None:
        super().record_event(event, stream)
        self.orders.append(("record", stream))

    def wait_event(self, stream: int, event: int) -> None:
        super().wait_event(stream, event)
        self.orders.append(("wait", stream))


class Producer:
    """A foreign array behind ``__dlpack__``: the memory of ``target`` (a trtio Tensor or a numpy array)
    described as the test says (device, dtype code and bits, shape, strides, address offset).
    ``asked`` records the keyword arguments of every ``__dlpack__`` call."""

    def __init__(self, target: Any, *, device: tuple[int, int], shape: tuple[int, ...], code: int = kDLFloat,
                 bits: int = 16, strides: tuple[int, ...] | None = None, offset: int = 0,
                 read_only: bool = False) -> None:
        self.target = target
        self.read_only = read_only
        self.device = device
        self.shape = shape
        self.code, self.bits = code, bits
        self.strides = strides
        self.offset = offset
        self.asked: list[dict[str, Any]] = []

    def _address(self) -> int:
        if isinstance(self.target, Tensor):
            return self.target.data_ptr
        return int(self.target.ctypes.data)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, **kwargs: Any) -> object:
        self.asked.append({"stream": stream, "max_version": max_version, **kwargs})
        return make_capsule(self._address(), self.shape, type_code=self.code, bits=self.bits,
                            device_type=self.device[0], device_id=self.device[1], owner=self.target,
                            strides=self.strides, byte_offset=self.offset,
                            versioned=parse_max_version(max_version), read_only=self.read_only)


class CudaArray:
    """A foreign CUDA array behind ``__cuda_array_interface__`` (v3) over a trtio DEVICE tensor's memory."""

    def __init__(self, target: Tensor, *, typestr: str = "<f2", shape: tuple[int, ...] | None = None,
                 strides: tuple[int, ...] | None = None, stream: Any = None, read_only: bool = False,
                 **extra: Any) -> None:
        self.target = target
        self.__cuda_array_interface__ = {
            "shape": tuple(target.shape) if shape is None else shape, "typestr": typestr,
            "data": (target.data_ptr, read_only), "strides": strides, "version": 3, "stream": stream, **extra}


def assert_kept_alive(make: Any, consume: Any) -> None:
    """What ``consume(producer)`` returns keeps ``make()``'s producer alive, and only that: the producer goes with
    it."""
    producer = make()
    alive = weakref.ref(producer)
    view = consume(producer)
    del producer
    gc.collect()
    assert alive() is not None, "the view keeps its producer alive"
    del view
    gc.collect()
    assert alive() is None, "the producer goes with the view"


@pytest.fixture
def fake() -> FakeCudaBackend:
    return FakeCudaBackend()


def _device_tensor(be: Any, values: np.ndarray) -> Tensor:
    t = Tensor.empty(values.shape, values.dtype, Location.DEVICE, backend=be)
    t.copy_from(values, stream=Stream.default(be))
    return t


def _embeds(shape: tuple[int, ...] = (2, 1, 8)) -> np.ndarray:
    return (np.arange(int(np.prod(shape))) * 0.25).astype(np.float16).reshape(shape)


# -- host memory ------------------------------------------------------------------------------------


def test_numpy_and_lists_pass_through_as_numpy(host: Any) -> None:
    x = _embeds()
    assert as_input(x, "inputs_embeds", dtype="float16", ndim=3, backend=host, stream=None) is x
    got = as_input([[3, 4]], "context_lengths", dtype="int32", ndim=2, backend=host, stream=None)
    assert isinstance(got, np.ndarray)
    assert got.tolist() == [[3, 4]]


def test_host_data_keeps_its_dtype_for_the_caller_to_convert(host: Any) -> None:
    """Host values of the binding's kind come back unconverted (the setups convert them, checking overflow)."""
    x = np.ones((1, 1, 8), np.float32)
    got = as_input(x, "inputs_embeds", dtype="float16", ndim=3, backend=host, stream=None)
    assert got is x and got.dtype == np.float32


def test_numpy_through_dlpack_is_read_in_place_and_kept_alive(host: Any) -> None:
    values = _embeds()
    producer = Producer(values, device=(kDLCPU, 0), shape=values.shape)
    alive = weakref.ref(producer)

    got = as_input(producer, "inputs_embeds", dtype="float16", ndim=3, backend=host, stream=None)

    assert isinstance(got, np.ndarray) and got.dtype == np.float16 and got.shape == (2, 1, 8)
    assert got.ctypes.data == values.ctypes.data, "a view of the producer's memory, not a copy"
    assert producer.asked[0]["stream"] is None, "host memory: no stream is passed"
    values[1, 0, 3] = 7
    assert got[1, 0, 3] == 7
    del producer
    gc.collect()
    assert alive() is not None, "the view keeps its producer alive"
    del got
    gc.collect()
    assert alive() is None


def test_a_legacy_producer_without_max_version_is_asked_again(host: Any) -> None:
    values = _embeds()

    class Legacy(Producer):
        def __dlpack__(self, *, stream: Any = None) -> object:  # type: ignore[override]
            return super().__dlpack__(stream=stream)

    producer = Legacy(values, device=(kDLCPU, 0), shape=values.shape)
    got = as_input(producer, "inputs_embeds", dtype="float16", ndim=3, backend=host, stream=None)
    assert got.ctypes.data == values.ctypes.data
    assert producer.asked == [{"stream": None, "max_version": None}]


@needs_torch
def test_a_cpu_torch_tensor_is_read_in_place(host: Any) -> None:
    t = torch.arange(16, dtype=torch.float16).reshape(2, 1, 8)
    got = as_input(t, "inputs_embeds", dtype="float16", ndim=3, backend=host, stream=None)
    assert isinstance(got, np.ndarray)
    assert got.ctypes.data == t.data_ptr()
    np.testing.assert_array_equal(got, t.numpy())
    del t, got
    assert_kept_alive(lambda: torch.zeros(2, 1, 8, dtype=torch.float16),
                      lambda p: as_input(p, "inputs_embeds", dtype="float16", ndim=3, backend=host, stream=None))


@needs_torch
def test_torch_bfloat16_and_integer_lengths(host: Any) -> None:
    pytest.importorskip("ml_dtypes")
    bf = torch.tensor([[[1.5, -2.0]]], dtype=torch.bfloat16)
    got = as_input(bf, "inputs_embeds", dtype="bfloat16", ndim=3, backend=host, stream=None)
    assert got.dtype.name == "bfloat16"
    assert got.astype(np.float32).tolist() == [[[1.5, -2.0]]]
    lengths = as_input(torch.tensor([5, 3]), "context_lengths", dtype="int32", ndim=1, backend=host, stream=None,
                       device_ok=False)
    assert lengths.dtype == np.int64 and lengths.tolist() == [5, 3]


# -- refusals of host data --------------------------------------------------------------------------


@needs_torch
@pytest.mark.parametrize(("make", "error", "needle"), [
    (lambda: torch.zeros(2, 8, dtype=torch.float16), ShapeError,
     "inputs_embeds: expected 3 dimensions, got 2: shape [2, 8]"),
    (lambda: torch.zeros(1, 8, 2, dtype=torch.float16).transpose(1, 2), ShapeError,
     "inputs_embeds: a strided (non-contiguous) view of shape [1, 2, 8]"),
    (lambda: torch.zeros(1, 1, 8, dtype=torch.int64), ShapeError,
     "inputs_embeds: expected floating values for a float16 input, got int64"),
    (lambda: torch.zeros(1, 1, 8, dtype=torch.float64), InvalidTypeError,
     "inputs_embeds: DLPack elements float64 have no trtio dtype"),
    (lambda: torch.zeros(1, 1, 8, dtype=torch.complex64), InvalidTypeError,
     "inputs_embeds: DLPack elements complex64 have no trtio dtype"),
    (lambda: torch._neg_view(torch.ones(1, 1, 8, dtype=torch.float16)), InvalidValueError,
     "inputs_embeds: a torch tensor with the negative bit set"),
])
def test_torch_cpu_refusals_name_the_input(host: Any, make: Any, error: type[Exception], needle: str) -> None:
    with pytest.raises(error) as info:
        as_input(make(), "inputs_embeds", dtype="float16", ndim=3, backend=host, stream=None)
    assert needle in str(info.value)


@pytest.mark.parametrize(("value", "error", "needle"), [
    ("abc", InvalidTypeError, "lengths: expected an array of numbers"),
    ([[1, 2], [3]], ShapeError, "lengths: cannot read list as an array"),
    (np.array([1.0, 2.0]), ShapeError, "lengths: expected integer values for a int32 input, got float64"),
    (np.zeros((2, 2), np.int32), ShapeError, "lengths: expected 1 dimensions, got 2"),
])
def test_host_refusals_name_the_input(host: Any, value: Any, error: type[Exception], needle: str) -> None:
    with pytest.raises(error) as info:
        as_input(value, "lengths", dtype="int32", ndim=1, backend=host, stream=None)
    assert needle in str(info.value)


def test_memory_of_another_kind_is_refused_before_export(host: Any) -> None:
    producer = Producer(_embeds(), device=(4, 0), shape=(2, 1, 8))  # OpenCL
    with pytest.raises(InvalidValueError, match=r"inputs_embeds: Producer lives in OpenCL memory"):
        as_input(producer, "inputs_embeds", dtype="float16", ndim=3, backend=host, stream=None)
    assert producer.asked == []


# -- CUDA memory (through a fake cuda backend) ------------------------------------------------------


def test_a_cuda_array_on_the_host_backend_is_refused_before_export(host: Any, fake: FakeCudaBackend) -> None:
    src = _device_tensor(fake, _embeds())
    producer = Producer(src, device=(kDLCUDA, 0), shape=src.shape)
    with pytest.raises(InvalidValueError) as info:
        as_input(producer, "inputs_embeds", dtype="float16", ndim=3, backend=host, stream=None)
    assert str(info.value) == ("inputs_embeds: Producer is on CUDA device 0, but the step runs on the host backend, "
                               "which has no CUDA device; pass host memory (numpy, a CPU tensor)")
    assert producer.asked == [], "refused before the producer was asked for anything"


def test_a_cuda_array_on_another_device_is_refused_before_export(fake: FakeCudaBackend) -> None:
    src = _device_tensor(fake, _embeds())
    producer = Producer(src, device=(kDLCUDA, 1), shape=src.shape)
    with pytest.raises(InvalidValueError) as info:
        as_input(producer, "inputs_embeds", dtype="float16", ndim=3, backend=fake, stream=None)
    assert "inputs_embeds: Producer is on CUDA device 1, the step runs on device 0" in str(info.value)
    assert producer.asked == []


def test_device_memory_is_refused_where_the_host_reads_the_input(fake: FakeCudaBackend) -> None:
    src = _device_tensor(fake, np.array([3, 4], np.int32))
    producer = Producer(src, device=(kDLCUDA, 0), shape=(2,), code=0, bits=32)
    with pytest.raises(InvalidValueError, match="context_lengths: Producer is on CUDA device 0, but the host reads "
                                                "this input"):
        as_input(producer, "context_lengths", dtype="int32", ndim=1, backend=fake, stream=None, device_ok=False)
    assert producer.asked == []
    with pytest.raises(InvalidValueError, match="context_lengths: tensor '' is in device memory"):
        as_input(src, "context_lengths", dtype="int32", ndim=1, backend=fake, stream=None, device_ok=False)


def test_a_cuda_array_is_wrapped_in_place_with_trtio_stream_passed(fake: FakeCudaBackend) -> None:
    values = _embeds()
    src = _device_tensor(fake, values)
    producer = Producer(src, device=(kDLCUDA, 0), shape=src.shape)
    step = Stream.create(fake)
    syncs = fake.sync_count

    got = as_input(producer, "inputs_embeds", dtype="float16", ndim=3, backend=fake, stream=step)

    assert isinstance(got, Tensor)
    assert got.data_ptr == src.data_ptr, "zero copy: the producer's own address"
    assert (got.shape, got.dtype, got.location, got.backend) == ((2, 1, 8), trtio.DType.FLOAT16, Location.DEVICE,
                                                                 fake)
    assert producer.asked[0]["stream"] == step.handle, "DLPack: the producer orders its work before trtio's stream"
    assert fake.sync_count == syncs, "nothing synchronises the host"
    np.testing.assert_array_equal(got.to_numpy(), values)


def test_a_wrapped_cuda_array_keeps_its_producer_until_it_is_dropped(fake: FakeCudaBackend) -> None:
    gc.collect()
    baseline = live_exports()
    src = _device_tensor(fake, _embeds())
    producer = Producer(src, device=(kDLCUDA, 0), shape=src.shape)
    alive = weakref.ref(producer)
    got = as_input(producer, "inputs_embeds", dtype="float16", ndim=3, backend=fake, stream=None)
    del producer
    gc.collect()
    assert alive() is not None
    assert live_exports() == baseline + 1, "the capsule is held, its deleter not called yet"
    del got
    gc.collect()
    assert alive() is None
    assert live_exports() == baseline, "the producer's deleter ran once the tensor went"


def test_stream_none_means_this_threads_default_stream(fake: FakeCudaBackend) -> None:
    src = _device_tensor(fake, _embeds())
    producer = Producer(src, device=(kDLCUDA, 0), shape=src.shape)
    as_input(producer, "inputs_embeds", dtype="float16", ndim=3, backend=fake, stream=None)
    assert producer.asked[0]["stream"] == Stream.default(fake).handle


@pytest.mark.parametrize(("kwargs", "error", "needle"), [
    ({"bits": 32}, ShapeError,
     "inputs_embeds: expected float16 elements, got float32; trtio reads device arrays in place and never converts"),
    ({"shape": (16,), "bits": 16}, ShapeError, "inputs_embeds: expected 3 dimensions, got 1: shape [16]"),
    ({"shape": (2, 1, 4), "strides": (8, 8, 2)}, ShapeError,
     "inputs_embeds: a strided (non-contiguous) view of shape [2, 1, 4]"),
    ({"offset": 2}, InvalidValueError, "is not 256-byte aligned (off by 2: a view into another array?)"),
    ({"code": 5, "bits": 32}, InvalidTypeError, "inputs_embeds: DLPack elements complex32 have no trtio dtype"),
])
def test_cuda_array_refusals_name_the_input(fake: FakeCudaBackend, kwargs: dict[str, Any], error: type[Exception],
                                            needle: str) -> None:
    src = _device_tensor(fake, _embeds())
    options: dict[str, Any] = {"shape": src.shape, **kwargs}
    producer = Producer(src, device=(kDLCUDA, 0), **options)
    with pytest.raises(error) as info:
        as_input(producer, "inputs_embeds", dtype="float16", ndim=3, backend=fake, stream=None)
    assert needle in str(info.value)


def test_extent_one_dimensions_may_have_any_stride(fake: FakeCudaBackend) -> None:
    """torch writes arbitrary strides for dimensions of extent 1; no index steps along them."""
    src = _device_tensor(fake, _embeds())
    producer = Producer(src, device=(kDLCUDA, 0), shape=(2, 1, 8), strides=(8, 1, 1))
    got = as_input(producer, "inputs_embeds", dtype="float16", ndim=3, backend=fake, stream=None)
    assert isinstance(got, Tensor) and got.data_ptr == src.data_ptr


def _aligned_cpu_tensor(dtype: Any, shape: tuple[int, ...]) -> Any:
    """A contiguous CPU torch tensor at a 256-byte aligned address (a view into a larger one)."""
    count = int(np.prod(shape))
    base = torch.zeros(count + 256, dtype=dtype)
    skip = (-base.data_ptr() % 256) // base.element_size()
    return base[skip:skip + count].view(shape)


@needs_torch
def test_the_steady_torch_reader_takes_only_what_dlpack_would_export() -> None:
    """The capsule-less read a steady decode makes of a torch input (trtio._foreign.TorchDeviceInput), run on CPU
    tensors: the fake cuda backend on "device -1" (what get_device() says of a host tensor) stands in for a GPU,
    and torch's current stream is the test's. Everything DLPack would refuse, or the step could not take as it
    is, is passed over (None, nothing ordered); a producer on another stream is ordered before the step's."""
    from trtio._dtypes import DType
    from trtio._foreign import torch_device_input

    assert torch_device_input(HostBackend(), DType.FLOAT16, (2, 1, 8)) is None, "the host backend takes no reader"
    fake = FakeCudaBackend(device_id=-1)
    half = torch_device_input(fake, DType.FLOAT16, (2, 1, 8))
    single = torch_device_input(fake, DType.FLOAT32, (2, 1, 8))
    assert half is not None and single is not None
    torch_stream, step_stream = fake.create_stream(), fake.create_stream()
    current = {-1: torch_stream}
    half._current_stream = single._current_stream = \
        lambda index: types.SimpleNamespace(cuda_stream=current.get(index, -99), native_handle=current.get(index, -99))
    x = _aligned_cpu_tensor(torch.float16, (2, 1, 8))
    assert half.read(x, torch_stream) == x.data_ptr() and fake.orders == [], "torch on the step's stream: no event"
    assert half.read(x, step_stream) == x.data_ptr()
    assert fake.orders == [("record", torch_stream), ("wait", step_stream)]
    y = _aligned_cpu_tensor(torch.float32, (2, 1, 8))
    assert single.read(y, torch_stream) == y.data_ptr(), "float32 is read"
    fake.orders.clear()

    class Sub(torch.Tensor):
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.zeros(1, 8, dtype=torch.float16)] * 2)  # no shape: torch raises
    emptied = _aligned_cpu_tensor(torch.float16, (2, 1, 8)).clone()
    emptied.untyped_storage().resize_(0)  # its shape stays, its data pointer is null
    passed_over = {
        "another dtype": (half, _aligned_cpu_tensor(torch.float32, (2, 1, 8))),
        "another shape": (half, x.view(2, 8)),
        "a 4-D shape": (half, x.view(2, 1, 1, 8)),
        "a strided view": (half, _aligned_cpu_tensor(torch.float16, (2, 1, 16))[..., ::2]),
        "a gradient": (half, _aligned_cpu_tensor(torch.float16, (2, 1, 8)).requires_grad_()),
        "a gradient, grad mode off": (half, _aligned_cpu_tensor(torch.float16, (2, 1, 8)).requires_grad_()),
        "the negative bit": (single, torch._neg_view(_aligned_cpu_tensor(torch.float32, (2, 1, 8)))),
        "a misaligned address": (half, torch.zeros(16 + 256, dtype=torch.float16)[
            (-x.data_ptr() % 256) // 2 + 1:][:16].view(2, 1, 8)),
        "another device": (torch_device_input(FakeCudaBackend(device_id=0), DType.FLOAT16, (2, 1, 8)), x),
        "a nested tensor": (half, nested),
        "a tensor without storage": (half, emptied),
    }
    assert type(x.as_subclass(Sub)) is not half.tensor_type, "a subclass is not what the caller reads"
    for what, (reader, t) in passed_over.items():
        assert reader is not None and type(t) is reader.tensor_type
        with torch.no_grad() if "grad mode off" in what else contextlib.nullcontext():
            assert reader.read(t, step_stream) is None, what
    assert fake.orders == [], "nothing passed over was ordered"
    assert single.read(_aligned_cpu_tensor(torch.float32, (2, 1, 8)), torch_stream) is not None, "float32 is read"


# -- CUDA array interface ---------------------------------------------------------------------------


def test_a_cuda_array_interface_is_read_in_place_after_its_stream(fake: FakeCudaBackend) -> None:
    values = _embeds()
    src = _device_tensor(fake, values)
    producer_stream, step = Stream.create(fake), Stream.create(fake)
    syncs = fake.sync_count

    got = as_input(CudaArray(src, stream=producer_stream.handle), "inputs_embeds", dtype="float16", ndim=3,
                   backend=fake, stream=step)

    assert isinstance(got, Tensor) and got.data_ptr == src.data_ptr
    assert fake.orders == [("record", producer_stream.handle), ("wait", step.handle)], \
        "trtio's stream waits for an event recorded on the producer's stream"
    assert fake.sync_count == syncs
    np.testing.assert_array_equal(got.to_numpy(), values)


@pytest.mark.parametrize("same", [True, False])
def test_no_event_when_the_interface_needs_no_order(fake: FakeCudaBackend, same: bool) -> None:
    src = _device_tensor(fake, _embeds())
    step = Stream.create(fake)
    as_input(CudaArray(src, stream=step.handle if same else None), "inputs_embeds", dtype="float16", ndim=3,
             backend=fake, stream=step)
    assert fake.orders == []


def test_a_cuda_array_interface_keeps_its_producer_alive(fake: FakeCudaBackend) -> None:
    assert_kept_alive(lambda: CudaArray(_device_tensor(fake, _embeds())),
                      lambda p: as_input(p, "inputs_embeds", dtype="float16", ndim=3, backend=fake, stream=None))


@pytest.mark.parametrize(("kwargs", "error", "needle"), [
    ({"typestr": "<f4"}, ShapeError, "inputs_embeds: expected float16 elements, got float32"),
    ({"typestr": "<c8"}, InvalidTypeError, "inputs_embeds: elements of type '<c8' have no trtio dtype"),
    ({"shape": (2, 2, 2), "strides": (8, 2, 4)}, ShapeError, "inputs_embeds: a strided (non-contiguous) view"),
    ({"stream": 0}, InvalidValueError, "inputs_embeds: __cuda_array_interface__ stream 0 is not a stream handle"),
    ({"mask": object()}, InvalidTypeError, "inputs_embeds: __cuda_array_interface__ has a mask"),
])
def test_cuda_array_interface_refusals(fake: FakeCudaBackend, kwargs: dict[str, Any], error: type[Exception],
                                       needle: str) -> None:
    array = CudaArray(_device_tensor(fake, _embeds()), **kwargs)
    with pytest.raises(error) as info:
        as_input(array, "inputs_embeds", dtype="float16", ndim=3, backend=fake, stream=None)
    assert needle in str(info.value)
    assert fake.orders == [], "refused before any stream was ordered"


def test_a_cuda_array_interface_on_the_host_backend_is_refused(host: Any, fake: FakeCudaBackend) -> None:
    with pytest.raises(InvalidValueError, match="the step runs on the host backend"):
        as_input(CudaArray(_device_tensor(fake, _embeds())), "inputs_embeds", dtype="float16", ndim=3, backend=host,
                 stream=None)


# -- trtio tensors ----------------------------------------------------------------------------------


def test_trtio_tensors_pass_through_after_their_checks(host: Any, fake: FakeCudaBackend) -> None:
    t = _device_tensor(host, _embeds())
    assert as_input(t, "inputs_embeds", dtype="float16", ndim=3, backend=host, stream=None) is t
    with pytest.raises(ShapeError, match="inputs_embeds: expected float32 elements, got tensor '' of float16"):
        as_input(t, "inputs_embeds", dtype="float32", ndim=3, backend=host, stream=None)
    with pytest.raises(InvalidValueError, match="belongs to the host backend, the step runs on the cuda backend"):
        as_input(t, "inputs_embeds", dtype="float16", ndim=3, backend=fake, stream=None)
    lengths = Tensor.empty((2,), "int32", Location.HOST, backend=host).fill_(3)
    got = as_input(lengths, "context_lengths", dtype="int32", ndim=1, backend=host, stream=None, device_ok=False)
    assert isinstance(got, np.ndarray) and got.tolist() == [3, 3]


# -- Tensor.from_dlpack -----------------------------------------------------------------------------


@needs_torch
def test_from_dlpack_wraps_a_cpu_tensor_without_a_copy() -> None:
    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    alive = weakref.ref(t)
    wrapped = Tensor.from_dlpack(t, name="ids")
    assert (wrapped.name, wrapped.shape, wrapped.dtype, wrapped.location) == ("ids", (2, 3), trtio.DType.INT32,
                                                                              Location.HOST)
    assert wrapped.data_ptr == t.data_ptr()
    t[1, 2] = 40
    del t
    gc.collect()
    assert alive() is not None
    assert wrapped.to_numpy().tolist() == [[0, 1, 2], [3, 4, 40]]
    wrapped.close()
    gc.collect()
    assert alive() is None, "close() drops the producer"


@needs_torch
def test_a_negated_torch_tensor_is_refused_where_dlpack_would_hand_it_over() -> None:
    """torch's DLPack export hands a negative-bit tensor's memory over as it is, the negation of its values
    (torch refuses only the conjugate bit): Tensor.from_dlpack and a decode refuse it, naming it, and the
    decode changes nothing; its values negated back (resolve_neg) are read as they are."""
    t = torch._neg_view(torch.arange(1, 7, dtype=torch.float32).reshape(2, 3))
    with pytest.raises(InvalidValueError, match=r"Tensor.from_dlpack\(x\): a torch tensor with the negative bit"):
        Tensor.from_dlpack(t, name="x")
    with Tensor.from_dlpack(t.resolve_neg()) as resolved:
        assert resolved.to_numpy().tolist() == [[-1, -2, -3], [-4, -5, -6]]
    logits = []
    for negated in (True, False):
        setup, cfg = _toy_llm("ragged")
        with setup:
            prompt = np.full((1, 3, cfg.hidden_size), 0.1, np.float16)
            step = np.linspace(-1, 1, cfg.hidden_size, dtype=np.float16).reshape(1, 1, -1)
            setup.prefill(prompt, [3])
            if negated:
                x = torch._neg_view(torch.from_numpy(-step))  # stands for step's values, holds -step
                with pytest.raises(InvalidValueError, match="inputs_embeds: a torch tensor with the negative bit"):
                    setup.decode(x)
                assert setup.lengths.tolist() == [3], "the refused step changed nothing"
                logits.append(setup.decode(x.resolve_neg()).to_numpy())
            else:
                logits.append(setup.decode(step).to_numpy())
    np.testing.assert_array_equal(logits[0], logits[1])


def test_from_dlpack_wraps_device_memory_on_the_stream_given(fake: FakeCudaBackend) -> None:
    values = _embeds()
    src = _device_tensor(fake, values)
    producer = Producer(src, device=(kDLCUDA, 0), shape=src.shape)
    wrapped = Tensor.from_dlpack(producer, backend=fake)
    assert wrapped.location is Location.DEVICE and wrapped.data_ptr == src.data_ptr
    assert producer.asked[0]["stream"] == Stream.default(fake).handle, "stream=None: the thread's default stream"
    step = Stream.create(fake)
    Tensor.from_dlpack(producer, step, backend=fake)
    assert producer.asked[1]["stream"] == step.handle
    np.testing.assert_array_equal(wrapped.to_numpy(), values)


def test_from_dlpack_refuses_read_only_memory_which_steps_still_read(fake: FakeCudaBackend) -> None:
    """Memory its producer marks read-only (numpy over immutable bytes; DLPack's read-only flag on device memory;
    the CUDA array interface's) is not wrapped as a Tensor, which can be written: refused naming it, the bytes
    untouched, nothing ordered for the CUDA array interface. A step, which only reads its inputs, takes each."""
    values = np.linspace(-1, 1, 64, dtype=np.float16)
    frozen = values.tobytes()
    array = np.frombuffer(frozen, dtype=np.float16).reshape(1, 1, 64)
    assert not array.flags.writeable
    with pytest.raises(InvalidValueError, match=r"Tensor.from_dlpack\(ndarray\): the array is read-only"):
        Tensor.from_dlpack(array)
    src = _device_tensor(fake, _embeds())
    producer_stream = Stream.create(fake)
    device_kinds = {"DLPack": lambda ro: Producer(src, device=(kDLCUDA, 0), shape=src.shape, read_only=ro),
                    "CAI": lambda ro: CudaArray(src, stream=producer_stream.handle, read_only=ro)}
    for kind, make in device_kinds.items():
        with pytest.raises(InvalidValueError, match="the array is read-only"):
            Tensor.from_dlpack(make(True), backend=fake)
        assert kind == "DLPack" or fake.orders == [], "refused before the producer's stream was ordered"
        got = as_input(make(True), "inputs_embeds", dtype="float16", ndim=3, backend=fake, stream=None)
        assert isinstance(got, Tensor) and got.data_ptr == src.data_ptr, kind
        assert Tensor.from_dlpack(make(False), backend=fake).data_ptr == src.data_ptr, kind
        fake.orders.clear()
    logits = []
    for fed in (array, array.copy()):  # a step fed the read-only array, and one fed a writable copy
        setup, _cfg = _toy_llm("ragged")
        with setup:
            setup.prefill(np.full((1, 3, 64), 0.1, np.float16), [3])
            logits.append(setup.decode(fed).to_numpy())
    np.testing.assert_array_equal(logits[0], logits[1])
    assert frozen == values.tobytes()


def test_from_dlpack_refusals(fake: FakeCudaBackend) -> None:
    with pytest.raises(InvalidTypeError, match=r"Tensor.from_dlpack\(list\): list has neither __dlpack__"):
        Tensor.from_dlpack([1, 2])
    src = _device_tensor(fake, _embeds())
    with pytest.raises(ShapeError, match="a strided"):
        Tensor.from_dlpack(Producer(src, device=(kDLCUDA, 0), shape=(2, 2), strides=(1, 2)), backend=fake)
    with pytest.raises(InvalidValueError, match="is on CUDA device 3, the step runs on device 0"):
        Tensor.from_dlpack(Producer(src, device=(kDLCUDA, 3), shape=(2,)), backend=fake)


# -- on a GPU ---------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_torch_cuda_tensors_are_read_in_place_without_a_host_sync(cuda: Any) -> None:
    torch_ = pytest.importorskip("torch")
    if not torch_.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    step = Stream.create(cuda)
    x = torch_.arange(16, device="cuda", dtype=torch_.float16).reshape(2, 1, 8)
    dst = Tensor.empty((2, 1, 8), "float16", backend=cuda)
    syncs = cuda.sync_count
    with torch_.cuda.stream(torch_.cuda.ExternalStream(step.handle)):
        got = as_input(x, "inputs_embeds", dtype="float16", ndim=3, backend=cuda, stream=step)
        assert isinstance(got, Tensor) and got.data_ptr == x.data_ptr()
        dst.copy_from(got, step)
    assert cuda.sync_count == syncs
    np.testing.assert_array_equal(dst.to_numpy(step), x.cpu().numpy())


@pytest.mark.gpu
def test_the_steady_torch_reader_orders_the_stream_torch_cuda_calls_current(cuda: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The capsule-less reader of a steady decode (trtio._foreign.TorchDeviceInput) takes torch's current stream
    through the cheapest public call torch has: the stream it orders before the step's is the one
    ``torch.cuda.current_stream()`` names, for a stream of torch's, the default one and the step's own (then
    nothing is ordered)."""
    import trtio._foreign as foreign
    from trtio._dtypes import DType

    torch_ = pytest.importorskip("torch")
    if not torch_.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    reader = foreign.torch_device_input(cuda, DType.FLOAT16, (2, 1, 8))
    assert reader is not None
    ordered: list[tuple[int, int]] = []
    monkeypatch.setattr(foreign, "_order_after", lambda be, producer, consumer: ordered.append((producer, consumer)))
    step = Stream.create(cuda)
    x = torch_.zeros((2, 1, 8), device="cuda", dtype=torch_.float16)
    for s in (torch_.cuda.Stream(), torch_.cuda.default_stream(), torch_.cuda.ExternalStream(step.handle)):
        ordered.clear()
        with torch_.cuda.stream(s):
            assert reader.read(x, step.handle) == x.data_ptr()
            want = torch_.cuda.current_stream().cuda_stream
        assert ordered == ([] if want == step.handle else [(want, step.handle)]), s


@pytest.mark.gpu
def test_a_torch_producer_stream_with_pending_work_is_honoured(cuda: Any) -> None:
    """The embeddings are written on a side stream, behind a long kernel, just before trtio reads them on its
    own stream; without DLPack's stream handshake the copy would read the zeros."""
    torch_ = pytest.importorskip("torch")
    if not torch_.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    step = Stream.create(cuda)
    side = torch_.cuda.Stream()
    x = torch_.zeros((4, 1, 4096), device="cuda", dtype=torch_.float16)
    torch_.cuda.synchronize()
    dst = Tensor.empty(tuple(x.shape), "float16", backend=cuda)
    with torch_.cuda.stream(side):
        torch_.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the write
        x.fill_(3.0)
        got = as_input(x, "inputs_embeds", dtype="float16", ndim=3, backend=cuda, stream=step)
    dst.copy_from(got, step)
    assert (dst.to_numpy(step) == 3.0).all()


_SLOW_FILL = r"""
#include <cuda_fp16.h>
extern "C" __global__ void slow_fill(__half* out, int n, long long spin) {
    long long start = clock64();
    while (clock64() - start < spin) {}
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half(5.0f);
}
"""


@pytest.mark.gpu
@pytest.mark.parametrize("via", ["dlpack", "cai"])
def test_cupy_arrays_are_read_in_place_after_their_stream(cuda: Any, via: str) -> None:
    """A CuPy kernel on a side stream spins, then writes the embeddings; trtio's copy on its own stream must
    see the written values: through DLPack's stream handshake, or the array interface's ``stream`` field."""
    cupy = pytest.importorskip("cupy")
    kernel = cupy.RawKernel(_SLOW_FILL, "slow_fill")
    step = Stream.create(cuda)
    side = cupy.cuda.Stream(non_blocking=True)
    x = cupy.zeros((2, 1, 2048), dtype=cupy.float16)
    cupy.cuda.runtime.deviceSynchronize()
    syncs = cuda.sync_count
    with side:
        kernel((16,), (256,), (x, np.int32(x.size), np.int64(200_000_000)))
        obj = x if via == "dlpack" else CupyInterfaceOnly(x)
        got = as_input(obj, "inputs_embeds", dtype="float16", ndim=3, backend=cuda, stream=step)
    assert isinstance(got, Tensor) and got.data_ptr == x.data.ptr
    dst = Tensor.empty((2, 1, 2048), "float16", backend=cuda)
    dst.copy_from(got, step)
    assert cuda.sync_count == syncs
    assert (dst.to_numpy(step) == 5).all()


class CupyInterfaceOnly:
    """A CuPy array seen only through ``__cuda_array_interface__`` (its ``stream`` is CuPy's current stream)."""

    def __init__(self, array: Any) -> None:
        self.array = array

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        interface: dict[str, Any] = self.array.__cuda_array_interface__
        return interface


@pytest.mark.gpu
def test_from_dlpack_of_a_torch_cuda_tensor_keeps_it_alive(cuda: Any) -> None:
    torch_ = pytest.importorskip("torch")
    if not torch_.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    x = torch_.arange(512, device="cuda", dtype=torch_.float32)
    ptr = x.data_ptr()
    wrapped = Tensor.from_dlpack(x)
    del x
    gc.collect()
    torch_.cuda.empty_cache()
    assert wrapped.data_ptr == ptr
    np.testing.assert_array_equal(wrapped.to_numpy(), np.arange(512, dtype=np.float32))


# -- step inputs through the setups ------------------------------------------------------------------------


class DLPackOnly:
    """A numpy array seen only through ``__dlpack__`` / ``__dlpack_device__`` (what numpy >= 1.22 exports)."""

    def __init__(self, array: np.ndarray) -> None:
        self._a = array

    def __dlpack__(self, **kw: Any) -> Any:
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self) -> Any:
        return self._a.__dlpack_device__()


def _toy_llm(contract: str) -> Any:
    from trtio.testing import ReferenceEngine
    from trtio.testing.toy_engines import RaggedToyEngines, ToyEngines

    if contract == "ragged":
        cfg = RaggedToyEngines.load().llm_config
    else:
        cfg = ToyEngines.load().llm.base
    return trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg), cfg


@pytest.mark.parametrize("contract", ["batch", "ragged"])
@pytest.mark.parametrize("kind", ["numpy-dlpack", pytest.param("torch-cpu", marks=needs_torch)])
def test_a_setup_takes_foreign_host_arrays_as_its_step_inputs(contract: str, kind: str) -> None:
    """Embeddings and lengths given as foreign host arrays (numpy through DLPack, CPU torch tensors) give the
    logits numpy inputs give."""
    from trtio.testing import toy_embedding

    table = toy_embedding(512, 64)
    prompts = np.zeros((2, 5, 64), np.float16)
    prompts[0, :5], prompts[1, :3] = table[[5, 6, 7, 8, 9]], table[[10, 11, 12]]
    lens = np.array([5, 3], np.int64)
    step = table[[1, 2]][:, None].astype(np.float16)

    def wrap(a: np.ndarray) -> Any:
        return DLPackOnly(a) if kind == "numpy-dlpack" else torch.from_numpy(a)

    got, want = [], []
    for out, conv in ((got, wrap), (want, lambda a: a)):
        setup, _cfg = _toy_llm(contract)
        with setup:
            out.append(setup.prefill(conv(prompts), conv(lens)).to_numpy())
            out.append(setup.decode(conv(step)).to_numpy())
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@needs_torch
def test_a_speculative_setup_takes_trees_paths_and_lengths_as_cpu_tensors() -> None:
    from trtio.testing import ReferenceEngine, ToyWeights, toy_embedding
    from trtio.testing.toy_engines import RaggedToyEngines

    bundle = RaggedToyEngines.load().deployment(1, 2, 3)
    assert bundle.draft is not None
    table = toy_embedding(512, 64)
    bw = ToyWeights.generate(bundle.base, 0)
    dw = ToyWeights.generate_draft(bundle.draft, bw, 0)

    def run(conv: Any) -> list[np.ndarray]:
        with trtio.create_for_spec_decode(ReferenceEngine.from_config(bundle.base, device="host", weights=bw),
                                          ReferenceEngine.from_config(bundle.draft, device="host", weights=dw),
                                          bundle) as sd:
            x = table[[[3, 4, 5, 6]]].astype(np.float16)
            out = [sd.base_prefill(conv(x), conv(np.array([4]))).to_numpy()]
            out.append(sd.draft_prefill(conv(table[[[4, 5, 6, 7]]].astype(np.float16)), conv(np.array([4]))).to_numpy())
            out.append(sd.draft_propose(conv(table[[[8]]].astype(np.float16)), parents=conv(np.array([-1]))).to_numpy())
            out.append(sd.verify(conv(table[[[7, 8, 9]]].astype(np.float16)), conv(np.array([-1, 0, 1]))).to_numpy())
            sd.accept(conv(np.array([[0, 1]])))
            out.append(sd.draft_accept(conv(table[[[8, 2]]].astype(np.float16)), conv(np.array([2]))).to_numpy())
        return out

    for g, w in zip(run(torch.from_numpy), run(lambda a: a)):
        np.testing.assert_array_equal(g, w)


@needs_torch
@pytest.mark.parametrize(("make", "needle"), [
    (lambda: (torch.arange(256, dtype=torch.float16).reshape(2, 1, 128) / 256)[:, :, ::2],
     r"inputs_embeds: a strided \(non-contiguous\) view of shape \[2, 1, 64\]"),
    (lambda: torch.zeros((2, 64), dtype=torch.float16),
     r"inputs_embeds: expected 3 dimensions, got 2: shape \[2, 64\]"),
])
def test_a_setup_refuses_foreign_embeddings_naming_the_input(make: Any, needle: str) -> None:
    """Foreign arrays are read in place: a strided view is refused (pass it contiguous), as is a wrong rank;
    before any work, naming the input."""
    setup, _cfg = _toy_llm("ragged")
    with setup:
        setup.prefill(np.zeros((2, 3, 64), np.float16), [3, 3])
        ops = setup.io.backend.op_count
        with pytest.raises(ShapeError, match=needle):
            setup.decode(make())
        assert setup.io.backend.op_count == ops and setup.lengths.tolist() == [3, 3]


def test_a_setup_refuses_device_memory_where_the_host_reads_the_input(fake: FakeCudaBackend) -> None:
    """Lengths are read by the host when a step is laid out: a device array there is refused (reading it would
    synchronise), naming the input, before any work."""
    setup, _cfg = _toy_llm("ragged")
    with setup:
        lengths = Producer(_device_tensor(fake, np.array([3, 3], np.int64)), device=(kDLCUDA, 0), shape=(2,),
                           code=0, bits=64)
        with pytest.raises(InvalidValueError, match=r"context_lengths: .* is on CUDA device 0, but the host reads "
                                                    r"this input"):
            setup.prefill(np.zeros((2, 3, 64), np.float16), lengths)
        assert setup.batch is None


def _gpu_llm(cuda: Any) -> Any:
    from trtio.testing import ReferenceEngine
    from trtio.testing.toy_engines import RaggedToyEngines

    pytest.importorskip("cupy")
    cfg = RaggedToyEngines.load().llm_config
    return trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="gpu"), cfg, graphs=True, backend=cuda)


@pytest.mark.gpu
@pytest.mark.parametrize("lib", ["torch", "cupy"])
def test_a_greedy_loop_driven_by_device_arrays_gives_the_numpy_tokens_without_host_syncs(cuda: Any, lib: str) -> None:
    """Embedding gather and argmax on the device (torch or CuPy, on trtio's stream), the setup fed their arrays
    directly: the tokens of the numpy loop, and no host synchronisation by trtio in any step."""
    from trtio.testing import greedy_generate, toy_embedding

    table = toy_embedding(512, 64)
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    with _gpu_llm(cuda) as setup:
        want = greedy_generate(setup, table, prompts, 12)
    step = Stream.create(cuda)
    x = np.zeros((2, 5, 64), np.float16)
    for i, p in enumerate(prompts):
        x[i, :len(p)] = table[p]
    with _gpu_llm(cuda) as setup:
        if lib == "torch":
            t = pytest.importorskip("torch")
            ctx = t.cuda.stream(t.cuda.ExternalStream(step.handle))
        else:
            cp = pytest.importorskip("cupy")
            ctx = cp.cuda.ExternalStream(step.handle)
        with ctx:
            if lib == "torch":
                dev_table = t.from_numpy(table.astype(np.float16)).cuda()
                logits = setup.prefill(t.from_numpy(x).cuda(), [5, 3], step)
                toks = [t.from_dlpack(logits).argmax(-1)]
            else:
                dev_table = cp.asarray(table.astype(np.float16))
                logits = setup.prefill(cp.asarray(x), [5, 3], step)
                toks = [cp.from_dlpack(logits).argmax(-1)]
            syncs = None
            for i in range(11):
                logits = setup.decode(dev_table[toks[-1]][:, None], step)
                toks.append((t.from_dlpack(logits) if lib == "torch" else cp.from_dlpack(logits)).argmax(-1))
                if i == 0:  # the first decode captures its graph (a one-time synchronisation); none after it
                    syncs = cuda.sync_count
            assert cuda.sync_count == syncs, "no step after the first synchronised the host"
            got = [[int(v) for v in (tk.cpu().numpy() if lib == "torch" else tk.get())] for tk in toks]
    assert [[got[s][i] for s in range(12)] for i in range(2)] == want
    step.close()


@pytest.mark.gpu
def test_a_greedy_loop_driven_by_jax_arrays_gives_the_numpy_tokens_without_host_syncs(
        cuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """JAX on the GPU: the embedding gather and the argmax in JAX, the setup fed JAX arrays (DLPack, read in
    place) and its logits read back by JAX: the numpy loop's tokens, and no host synchronisation by trtio in any
    step after the first (its graph capture)."""
    from trtio.testing import greedy_generate, toy_embedding

    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX takes memory as it needs it
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU here")
    table = toy_embedding(512, 64)
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    with _gpu_llm(cuda) as setup:
        want = greedy_generate(setup, table, prompts, 12)
    x = np.zeros((2, 5, 64), np.float16)
    for i, p in enumerate(prompts):
        x[i, :len(p)] = table[p]
    dev_table = jax.device_put(table.astype(np.float16), gpu)
    with _gpu_llm(cuda) as setup:
        logits = setup.prefill(jax.device_put(x, gpu), [5, 3])
        toks = [jnp.argmax(jnp.from_dlpack(logits), axis=-1)]
        syncs = None
        for i in range(11):
            embeds = dev_table[toks[-1]][:, None]
            assert embeds.devices() == {gpu}
            logits = setup.decode(embeds)
            toks.append(jnp.argmax(jnp.from_dlpack(logits), axis=-1))
            if i == 0:  # the first decode captures its graph (a one-time synchronisation); none after it
                syncs = cuda.sync_count
        assert cuda.sync_count == syncs, "no step after the first synchronised the host"
        got = [np.asarray(tk).tolist() for tk in toks]
    assert [[got[s][i] for s in range(12)] for i in range(2)] == want


@pytest.mark.gpu
def test_a_step_waits_for_embeddings_written_on_another_stream(cuda: Any) -> None:
    """The embeddings are written on a side stream behind a long kernel, just before the step runs on trtio's
    stream: the step's logits are those of the written embeddings, not of the zeros before them."""
    t = pytest.importorskip("torch")
    from trtio.testing import toy_embedding

    table = toy_embedding(512, 64)
    with _gpu_llm(cuda) as setup:
        setup.prefill(table[[[5, 6, 7]]].astype(np.float16), [3])
        want = setup.decode(table[[[9]]].astype(np.float16)).to_numpy()
    with _gpu_llm(cuda) as setup:
        setup.prefill(table[[[5, 6, 7]]].astype(np.float16), [3])
        side = t.cuda.Stream()
        x = t.zeros((1, 1, 64), device="cuda", dtype=t.float16)
        t.cuda.synchronize()
        with t.cuda.stream(side):
            t.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the write
            x.copy_(t.from_numpy(table[[[9]]].astype(np.float16)).cuda(non_blocking=True))
            got = setup.decode(x).to_numpy()
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)


def _numpy_fed_decodes(cuda: Any, table: np.ndarray, steps: list[Any]) -> list[np.ndarray]:
    """The logits of decodes fed ``table``'s rows of ``steps`` as numpy, after a prefill of tokens 5, 6, 7."""
    with _gpu_llm(cuda) as setup:
        setup.prefill(table[[[5, 6, 7]]], [3])
        return [setup.decode(table[tok]).to_numpy() for tok in steps]


@pytest.mark.gpu
def test_a_steady_decode_waits_for_a_torch_tensor_written_on_another_stream(cuda: Any) -> None:
    """The steady decode reads torch's CUDA tensors without DLPack's capsule (``torch_device_input``): its
    producer's stream must still be ordered before the step. Three decodes make the step steady; then the
    embeddings are written on a side stream behind a long kernel just before the step: its logits are those of
    the written embeddings (the numpy-fed run's), not of the zeros before them."""
    t = pytest.importorskip("torch")
    from trtio.testing import toy_embedding

    table = toy_embedding(512, 64).astype(np.float16)
    steps = [[[9]], [[11]], [[13]], [[17]]]
    want = _numpy_fed_decodes(cuda, table, steps)
    with _gpu_llm(cuda) as setup:
        s = Stream.create(cuda)
        setup.prefill(table[[[5, 6, 7]]], [3], s)
        x = t.zeros((1, 1, 64), device="cuda", dtype=t.float16)
        for tok, w in zip(steps[:3], want):  # torch on trtio's stream: the steady path needs no event
            with t.cuda.stream(t.cuda.ExternalStream(s.handle)):
                x.copy_(t.from_numpy(table[tok]).cuda(non_blocking=True))
                np.testing.assert_allclose(setup.decode(x, s).to_numpy(s), w, atol=2e-3, rtol=2e-3)
        hits = setup.graph_stats.hits
        side = t.cuda.Stream()
        t.cuda.synchronize()
        with t.cuda.stream(side):
            t.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the write
            x.copy_(t.from_numpy(table[steps[3]]).cuda(non_blocking=True))
            got = setup.decode(x, s).to_numpy(s)
        assert setup.graph_stats.hits > hits, "the step was a steady replay"
        s.close()
    np.testing.assert_allclose(got, want[3], atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
def test_a_steady_decode_reads_a_new_torch_tensor_each_step_in_place(cuda: Any) -> None:
    """On the GPU's torch: a steady decode fed a new torch CUDA tensor each step (as ``table[ids]`` gives) reads
    each through torch's public attributes, replays its graph, and its logits are the numpy-fed run's; a tensor
    with the negative bit is refused."""
    t = pytest.importorskip("torch")
    from trtio.testing import toy_embedding

    table = toy_embedding(512, 64).astype(np.float16)
    steps = [[[9]], [[11]], [[13]], [[17]], [[19]], [[23]]]
    want = _numpy_fed_decodes(cuda, table, steps)
    with _gpu_llm(cuda) as setup:
        s = Stream.create(cuda)
        setup.prefill(table[[[5, 6, 7]]], [3], s)
        device_table = t.from_numpy(table).cuda()
        with t.cuda.stream(t.cuda.ExternalStream(s.handle)):
            for i, (tok, w) in enumerate(zip(steps, want)):
                hits = setup.graph_stats.hits
                x = device_table[t.tensor(tok, device="cuda")]  # a new [1, 1, 64] tensor
                np.testing.assert_allclose(setup.decode(x, s).to_numpy(s), w, atol=2e-3, rtol=2e-3)
                if i >= 2:
                    assert setup.graph_stats.hits > hits, f"step {i}: a steady replay"
            with pytest.raises(InvalidValueError, match="negative bit"):
                setup.decode(t._neg_view(device_table[t.tensor(steps[0], device="cuda")]), s)
        s.close()


@pytest.mark.gpu
def test_a_steady_decode_fed_torch_over_its_own_input_reads_it_in_place(cuda: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch runtime writes each step's embeddings in place, through a torch view of io.inputs_embeds (torch on
    trtio's stream), and hands that view over: the steady step reads them where they are, with no copy onto
    themselves, and its logits are the numpy-fed run's."""
    t = pytest.importorskip("torch")
    from trtio.testing import toy_embedding

    table = toy_embedding(512, 64).astype(np.float16)
    steps = [[[9]], [[11]], [[13]], [[17]], [[19]]]
    want = _numpy_fed_decodes(cuda, table, steps)
    with _gpu_llm(cuda) as setup:
        s = Stream.create(cuda)
        setup.prefill(table[[[5, 6, 7]]], [3], s)
        np.testing.assert_allclose(setup.decode(table[steps[0]], s).to_numpy(s), want[0], atol=2e-3, rtol=2e-3)
        dst = setup.io.inputs_embeds.data_ptr
        copies: list[tuple[int, int]] = []
        real = cuda.memcpy

        def memcpy(to: int, src: int, nbytes: int, stream: int) -> None:
            copies.append((to, src))
            real(to, src, nbytes, stream)

        with t.cuda.stream(t.cuda.ExternalStream(s.handle)):
            view = t.from_dlpack(setup.io.inputs_embeds.reshape((1, 1, 64)))  # the decode step's input
            assert view.data_ptr() == dst
            for i, (tok, w) in enumerate(zip(steps[1:], want[1:])):
                view.copy_(t.from_numpy(table[tok]).cuda(non_blocking=True))
                hits = setup.graph_stats.hits
                monkeypatch.setattr(cuda, "memcpy", memcpy)
                got = setup.decode(view, s)
                monkeypatch.undo()
                np.testing.assert_allclose(got.to_numpy(s), w, atol=2e-3, rtol=2e-3)
                assert (dst, dst) not in copies, f"step {i + 1} copied its input onto itself"
                if i >= 2:  # captured by then: a steady replay, and no copy of the input at all
                    assert setup.graph_stats.hits > hits, "a steady step"
                    assert [c for c in copies if c[0] == dst] == []
                copies.clear()
            del view
        s.close()


@pytest.mark.gpu
def test_a_steady_decode_refuses_a_torch_tensor_of_another_dtype_or_view(cuda: Any) -> None:
    """What the steady path does not take (another dtype, a strided view, a tensor that needs a gradient, a
    nested tensor torch gives no shape of, a tensor whose storage was resized to nothing, a negated view) goes
    the general way and is refused there, naming the input, with nothing enqueued and the setup usable."""
    t = pytest.importorskip("torch")
    from trtio.testing import toy_embedding

    table = toy_embedding(512, 64).astype(np.float16)
    with _gpu_llm(cuda) as setup:
        setup.prefill(table[[[5, 6, 7]]], [3])
        for tok in (9, 11):
            setup.decode(t.from_numpy(table[[[tok]]]).cuda())
        lengths = setup.lengths.tolist()
        bad = [(t.zeros((1, 1, 64), device="cuda", dtype=t.float32), ShapeError, "float16"),
               (t.zeros((1, 1, 128), device="cuda", dtype=t.float16)[..., ::2], ShapeError, "contiguous"),
               (t.zeros((1, 1, 64), device="cuda", dtype=t.float16, requires_grad=True), InvalidValueError,
                "inputs_embeds")]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch: nested tensors are a prototype
            nested = t.nested.nested_tensor([t.zeros((1, 64), device="cuda", dtype=t.float16)])
        emptied = t.zeros((1, 1, 64), device="cuda", dtype=t.float16)
        emptied.untyped_storage().resize_(0)
        bad += [(nested, InvalidValueError, "DLPack"), (emptied, InvalidTypeError, "null data pointer"),
                (t._neg_view(t.zeros((1, 1, 64), device="cuda", dtype=t.float16)), InvalidValueError, "negative bit")]
        for x, error, needle in bad:
            with pytest.raises(error, match=needle) as info:
                setup.decode(x)
            assert "inputs_embeds" in str(info.value)
            assert setup.lengths.tolist() == lengths, "a refused step changed nothing"
        setup.decode(t.from_numpy(table[[[13]]]).cuda())
        assert setup.lengths.tolist() == [n + 1 for n in lengths]


@pytest.mark.gpu
def test_torch_embeddings_partly_over_the_steps_own_input_are_refused(cuda: Any) -> None:
    """A torch view of io.inputs_embeds 256 bytes on (four sequences' embeddings hold 512) would be copied onto
    itself in part: the steady decode (its capsule-less reader), a checked decode (slots=, through DLPack) and a
    prefill refuse it, naming the input, with nothing changed; the setup then decodes as before."""
    t = pytest.importorskip("torch")
    from trtio.testing import toy_embedding

    table = toy_embedding(512, 64).astype(np.float16)
    step = table[[[9], [10], [11], [12]]]
    with _gpu_llm(cuda) as setup:
        s = Stream.create(cuda)
        setup.prefill(table[[[1, 2], [3, 4], [5, 6], [7, 8]]], [2, 2, 2, 2], s)
        with t.cuda.stream(t.cuda.ExternalStream(s.handle)):
            whole = t.from_dlpack(setup.io.inputs_embeds.reshape((8, 1, 64)))
            over = whole[2:6]  # 256 bytes on
            assert over.data_ptr() == setup.io.inputs_embeds.data_ptr + 256 and over.is_contiguous()
            attempts = {"steady": lambda: setup.decode(over, s),
                        "slots=": lambda: setup.decode(over, s, slots=setup.active.tolist()),
                        "prefill": lambda: setup.prefill(over, [1, 1, 1, 1], s)}
            for what, attempt in attempts.items():
                for _ in range(3):  # steady again after a refused step
                    setup.decode(t.from_numpy(step).cuda(), s)
                lengths = setup.lengths.tolist()
                with pytest.raises(InvalidValueError, match="inputs_embeds: its 512 bytes at 0x[0-9a-f]+ overlap"):
                    attempt()
                assert setup.lengths.tolist() == lengths, what
        s.close()


# -- hostile producers: refused naming the input, nothing read, nothing leaked ----------------------------


class Liar(Producer):
    """A producer whose ``__dlpack_device__`` says ``says`` while its capsule describes memory of ``device``."""

    def __init__(self, target: Any, *, says: tuple[int, int], **kw: Any) -> None:
        super().__init__(target, **kw)
        self.says = says

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.says


def test_a_capsule_of_another_device_than_dlpack_device_says_is_refused(host: Any, fake: FakeCudaBackend) -> None:
    """Device memory behind a producer that says kDLCPU would be read by the host as host memory (a crash on a
    GPU); host memory behind one that says kDLCUDA would be bound as device memory. Both are refused, naming
    the input and both devices, and the capsule is handed back."""
    gc.collect()
    before = live_exports()
    src = _device_tensor(fake, _embeds())
    says_host = Liar(src, says=(kDLCPU, 0), device=(kDLCUDA, 0), shape=src.shape)
    with pytest.raises(InvalidValueError) as info:
        as_input(says_host, "inputs_embeds", dtype="float16", ndim=3, backend=host, stream=None)
    assert str(info.value).startswith("inputs_embeds: Liar.__dlpack_device__() says host (kDLCPU) (device 0), but "
                                      "its capsule holds memory of CUDA (kDLCUDA) (device 0)")
    with pytest.raises(InvalidValueError, match=r"says host \(kDLCPU\).*holds memory of CUDA"):
        Tensor.from_dlpack(says_host, backend=host)
    says_cuda = Liar(_embeds(), says=(kDLCUDA, 0), device=(kDLCPU, 0), shape=(2, 1, 8))
    with pytest.raises(InvalidValueError, match=r"inputs_embeds: Liar.__dlpack_device__\(\) says CUDA \(kDLCUDA\) "
                                                r"\(device 0\), but its capsule holds memory of host \(kDLCPU\)"):
        as_input(says_cuda, "inputs_embeds", dtype="float16", ndim=3, backend=fake, stream=None)
    del says_host, says_cuda, info
    gc.collect()
    assert live_exports() == before, "every refused capsule was handed back to its producer"


class _Raises:
    def __init__(self, where: str, error: BaseException) -> None:
        self.where, self.error = where, error

    def __dlpack_device__(self) -> tuple[int, int]:
        if self.where == "device":
            raise self.error
        return (kDLCPU, 0)

    def __dlpack__(self, **kwargs: Any) -> object:
        raise self.error


@pytest.mark.parametrize(("where", "error", "needle"), [
    ("dlpack", KeyError("boom"), "x: _Raises.__dlpack__() failed (KeyError: 'boom')"),
    ("dlpack", AttributeError("no"), "x: _Raises.__dlpack__() failed (AttributeError: no)"),
    ("device", RuntimeError("dev"), "x: _Raises.__dlpack_device__() failed (RuntimeError: dev)"),
    ("device", KeyError("k"), "x: _Raises.__dlpack_device__() failed (KeyError: 'k')"),
])
def test_a_producer_that_raises_anything_is_a_trtio_error_naming_the_input(host: Any, where: str,
                                                                           error: BaseException, needle: str) -> None:
    with pytest.raises(InvalidValueError) as info:
        as_input(_Raises(where, error), "x", dtype=None, ndim=None, backend=host, stream=None)
    assert str(info.value) == needle
    with pytest.raises(InvalidValueError, match="failed"):
        Tensor.from_dlpack(_Raises(where, error), backend=host)


class _Device:
    def __init__(self, device: Any) -> None:
        self.device = device

    def __dlpack_device__(self) -> Any:
        return self.device

    def __dlpack__(self, **kwargs: Any) -> object:
        raise AssertionError("never asked: the device is checked first")


@pytest.mark.parametrize("device", [(1.5, 0), (kDLCPU, "0"), (True, 0)])
def test_a_dlpack_device_of_no_ints_is_refused(host: Any, device: Any) -> None:
    with pytest.raises(InvalidTypeError, match=r"x: _Device.__dlpack_device__\(\) did not give a \(device type, "
                                               r"device id\) pair of ints"):
        as_input(_Device(device), "x", dtype=None, ndim=None, backend=host, stream=None)
