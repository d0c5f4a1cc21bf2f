import gc
import importlib.util
import warnings

import numpy as np
import pytest

from trtio import CapacityError, ClosedError, CudaError, DType, Location, ShapeError, Stream, Tensor, TrtioError
from trtio.errors import InvalidValueError

HAS_ML = importlib.util.find_spec("ml_dtypes") is not None


def test_empty_reshape_in_place(backend):
    t = Tensor.empty((4, 8), "float16", name="x", backend=backend)
    ptr = t.data_ptr
    assert t.shape == (4, 8) and t.nbytes == 64 and t.capacity == 64
    assert t.reshape((2, 8)) is t
    assert t.shape == (2, 8) and t.nbytes == 32 and t.capacity == 64 and t.data_ptr == ptr
    t.reshape((1, 32))  # a different trailing dim within the same bytes is fine
    assert t.data_ptr == ptr
    t.close()


def test_reshape_past_capacity_names_tensor_shape_and_bytes(backend):
    t = Tensor.empty((4, 8), "float16", name="inputs_embeds", backend=backend)
    with pytest.raises(CapacityError) as info:
        t.reshape((5, 8))
    msg = str(info.value)
    assert "inputs_embeds" in msg and "(5, 8)" in msg and "80 bytes" in msg and "64 bytes" in msg
    assert t.shape == (4, 8), "a failed reshape leaves the view unchanged"
    t.close()


@pytest.mark.parametrize("shape,needle", [((2, -1), "negative"), ((2, 1.5), "non-integer"),
                                          ((True, 2), "non-integer"), ("ab", "non-integer"),
                                          (None, "sequence")])
def test_bad_shapes(host, shape, needle):
    with pytest.raises(ShapeError, match=needle):
        Tensor.empty(shape, "int32", name="bad", backend=host)
    t = Tensor.empty((4,), "int32", name="t", backend=host)
    with pytest.raises(ShapeError, match=needle):
        t.reshape(shape)
    t.close()


def test_numpy_integer_dims_are_accepted(host):
    t = Tensor.empty((np.int64(2), np.int32(3)), "int32", backend=host)
    assert t.shape == (2, 3) and all(type(d) is int for d in t.shape)
    t.close()


def test_copy_round_trip_and_partial_view(backend):
    t = Tensor.empty((4, 8), "float32", name="x", backend=backend)
    data = np.arange(32, dtype=np.float32).reshape(4, 8)
    t.copy_from(data)
    np.testing.assert_array_equal(t.to_numpy(), data)
    t.reshape((2, 8))
    t.copy_from(np.full((2, 8), -1, np.float32))  # writes only the first 64 bytes
    t.reshape((4, 8))
    got = t.to_numpy()
    assert (got[:2] == -1).all()
    np.testing.assert_array_equal(got[2:], data[2:])
    t.close()


def test_tensor_to_tensor_copies_view_bytes_on_a_stream(backend):
    s = Stream.create(backend)
    a = Tensor.empty((16,), "int32", backend=backend)
    b = Tensor.empty((16,), "int32", Location.PINNED, backend=backend)
    a.copy_from(np.arange(16, dtype=np.int32), s)
    b.fill_(-5)
    a.reshape((4,))
    b.reshape((4,))
    b.copy_from(a, s)
    s.synchronize()
    b.reshape((16,))
    np.testing.assert_array_equal(np.asarray(b), [0, 1, 2, 3] + [-5] * 12)
    out = np.empty(4, np.int32)
    a.copy_to(out, s)
    np.testing.assert_array_equal(out, [0, 1, 2, 3])
    for x in (a, b, s):
        x.close()


def test_copy_with_wrong_dtype_or_size_is_refused(backend):
    t = Tensor.empty((4,), "int32", name="context_lengths", backend=backend)
    with pytest.raises(TrtioError, match=r"context_lengths.*int64 does not match int32"):
        t.copy_from(np.zeros(4, np.int64))
    with pytest.raises(TrtioError, match=r"context_lengths.*20 bytes.*16 bytes"):
        t.copy_from(np.zeros(5, np.int32))
    other = Tensor.empty((4,), "float32", name="other", backend=backend)
    with pytest.raises(TrtioError, match="float32 does not match int32"):
        t.copy_from(other)
    with pytest.raises(TrtioError, match="bytes"):
        t.copy_to(np.zeros(3, np.int32))
    t.close()
    other.close()


def test_use_after_close_raises_and_close_is_idempotent(backend):
    t = Tensor.empty((4,), "int32", name="gone", backend=backend)
    t.close()
    t.close()
    for op in (lambda: t.shape, lambda: t.data_ptr, lambda: t.reshape((2,)),
               lambda: t.copy_from(np.zeros(4, np.int32)), lambda: t.to_numpy(), lambda: t.zero_()):
        with pytest.raises(ClosedError, match="'gone' is closed"):
            op()
    with Tensor.empty((2,), "int8", backend=backend) as t2:
        pass
    assert t2.is_closed


def test_view_of_closed_tensor_is_unusable(backend):
    t = Tensor.empty((4,), "int32", name="base", backend=backend)
    v = t.view(DType.UINT8)
    assert v.shape == (16,) and v.data_ptr == t.data_ptr
    t.close()
    with pytest.raises(ClosedError, match="view of closed tensor 'base'"):
        v.data_ptr


def test_unclosed_tensor_is_freed_with_a_warning(host):
    before = host.live_allocations
    t = Tensor.empty((4,), "int32", name="leaky", backend=host)
    assert host.live_allocations == before + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del t
        gc.collect()
    assert host.live_allocations == before
    assert any("leaky" in str(w.message) and w.category is ResourceWarning for w in caught)


def test_wrap_checks_alignment_null_and_capacity(backend):
    owner = Tensor.empty((1024,), "uint8", backend=backend)
    w = Tensor.wrap(owner.data_ptr + 256, (16,), "int32", Location.DEVICE, owner, name="w", backend=backend)
    assert w.data_ptr == owner.data_ptr + 256
    with pytest.raises(TrtioError, match=r"'u'.*not 256-byte aligned \(off by 4\)"):
        Tensor.wrap(owner.data_ptr + 4, (4,), "int32", Location.DEVICE, owner, name="u", backend=backend)
    with pytest.raises(TrtioError, match="null pointer"):
        Tensor.wrap(0, (4,), "int32", Location.DEVICE, name="n", backend=backend)
    with pytest.raises(CapacityError, match="capacity 8 bytes"):
        Tensor.wrap(owner.data_ptr, (4,), "int32", capacity=8, backend=backend)
    owner.close()


def test_zero_size_tensor_allocates_nothing(host):
    before = host.alloc_count
    t = Tensor.empty((0, 8), "float16", name="absent", backend=host)
    assert host.alloc_count == before and t.data_ptr == 0 and t.is_empty
    t.close()


@pytest.mark.parametrize("dtype,value", [("float32", 1.5), ("float16", -2.0), ("int32", -7),
                                         ("int64", 1 << 40), ("int8", -3), ("uint8", 200), ("bool", True)])
def test_fill_and_zero(backend, dtype, value):
    for loc in (Location.DEVICE, Location.PINNED):
        t = Tensor.empty((3, 5), dtype, loc, backend=backend)
        t.fill_(value)
        np.testing.assert_array_equal(t.to_numpy(), np.full((3, 5), value, dtype=DType.coerce(dtype).numpy))
        t.zero_()
        assert not t.to_numpy().any()
        t.close()


@pytest.mark.skipif(not HAS_ML, reason="ml_dtypes not installed")
def test_bf16_to_numpy_and_fill(backend):
    import ml_dtypes

    t = Tensor.empty((2, 3), "bfloat16", backend=backend)
    data = np.array([[1.0, 2.5, -3.0], [0.5, 8.0, 1e10]], dtype=ml_dtypes.bfloat16)
    t.copy_from(data)
    got = t.to_numpy()
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got, data)
    t.fill_(0.25)
    assert (t.to_numpy().astype(np.float32) == 0.25).all()
    t.close()


def test_packed_int4_travels_as_bytes(host):
    t = Tensor.empty((3, 5), DType.INT4, backend=host)
    assert t.nbytes == 8  # 15 nibbles round up to 8 bytes
    raw = np.arange(8, dtype=np.uint8)
    t.copy_from(raw)
    np.testing.assert_array_equal(t.to_numpy(), raw)
    with pytest.raises(TrtioError, match="packed int4 supports only 0"):
        t.fill_(3)
    t.close()


def test_view_changes_dtype_not_memory(host):
    t = Tensor.from_numpy(np.array([[1, 2], [3, 4]], np.int32), backend=host)
    v = t.view(DType.UINT8)
    assert v.shape == (2, 8) and v.dtype is DType.UINT8
    assert v.to_numpy()[0, 0] == 1
    with pytest.raises(ShapeError, match="cannot be viewed"):
        Tensor.empty((3,), "uint8", backend=host).view(DType.INT32)
    t.close()


def test_reshape_and_copy_do_not_allocate(backend):
    t = Tensor.empty((8, 64), "float16", backend=backend)
    staging = Tensor.empty((8, 64), "float16", Location.PINNED, backend=backend)
    src = np.ones((2, 64), np.float16)
    s = Stream.create(backend)
    before = backend.alloc_count
    for n in (1, 2, 4, 8, 2):
        t.reshape((n, 64))
        staging.reshape((n, 64))
        staging.copy_from(np.ones((n, 64), np.float16))
        t.copy_from(staging, s)
    t.reshape((2, 64)).copy_from(src, s)
    t.zero_(s)
    assert backend.alloc_count == before
    s.synchronize()
    for x in (t, staging, s):
        x.close()


def test_array_interface_for_host_accessible_memory(backend):
    t = Tensor.empty((2, 3), "int32", Location.PINNED, backend=backend)
    t.fill_(4)
    arr = np.asarray(t)
    assert arr.shape == (2, 3) and (arr == 4).all()
    assert arr.__array_interface__["data"][0] == t.data_ptr  # no copy
    t.close()
    if backend.name == "cuda":
        d = Tensor.empty((2,), "int32", backend=backend)
        assert not hasattr(d, "__array_interface__")
        d.close()


def test_dlpack_on_host_is_zero_copy(host):
    t = Tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), backend=host)
    arr = np.from_dlpack(t)
    assert arr.__array_interface__["data"][0] == t.data_ptr
    t.fill_(2.0)
    assert (arr == 2.0).all()
    t.reshape((2, 4))
    assert np.from_dlpack(t).shape == (2, 4), "exports the current view"
    del arr
    gc.collect()
    t.close()


def test_dlpack_refuses_types_it_cannot_carry(host):
    t = Tensor.empty((4,), DType.FP8, backend=host)
    with pytest.raises(BufferError, match=r"DLPack cannot carry fp8.*view\(trtio.DType.UINT8\)"):
        t.__dlpack__()
    with pytest.raises(BufferError, match="without copying"):
        Tensor.empty((4,), "int32", backend=host).__dlpack__(copy=True)
    t.close()


def test_cuda_array_interface_only_for_cuda_device_memory(host):
    t = Tensor.empty((4,), "int32", backend=host)
    assert not hasattr(t, "__cuda_array_interface__")
    t.close()


def test_repr_shows_name_shape_dtype_location_pointer(host):
    t = Tensor.empty((2, 3), "float16", name="logits", backend=host)
    r = repr(t)
    assert "'logits'" in r and "(2, 3)" in r and "float16" in r and "device" in r and hex(t.data_ptr) in r
    t.close()
    assert "closed" in repr(t)


# -- GPU interop ----------------------------------------------------------------------------

@pytest.mark.gpu
def test_dlpack_into_torch_without_copy(cuda):
    torch = pytest.importorskip("torch")
    s = Stream.create(cuda)
    t = Tensor.from_numpy(np.arange(24, dtype=np.float32).reshape(4, 6), backend=cuda, stream=s)
    x = torch.from_dlpack(t)
    assert x.is_cuda and x.data_ptr() == t.data_ptr and tuple(x.shape) == (4, 6)
    torch.cuda.synchronize()
    assert x[1, 2].item() == 8.0
    x.fill_(3.0)  # writes through the shared memory
    torch.cuda.synchronize()
    assert (t.to_numpy() == 3.0).all()
    del x
    t.close()
    s.close()


@pytest.mark.gpu
def test_bf16_through_dlpack_into_torch(cuda):
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    data = np.array([[1.0, -2.5], [0.125, 3.0]], dtype=ml_dtypes.bfloat16)
    t = Tensor.from_numpy(data, backend=cuda)
    x = torch.from_dlpack(t)
    assert x.dtype == torch.bfloat16 and x.data_ptr() == t.data_ptr
    torch.cuda.synchronize()
    assert x.float().cpu().tolist() == [[1.0, -2.5], [0.125, 3.0]]
    del x
    t.close()


@pytest.mark.gpu
def test_dlpack_and_cuda_array_interface_into_cupy_without_copy(cuda):
    cp = pytest.importorskip("cupy")
    t = Tensor.from_numpy(np.arange(10, dtype=np.int32), backend=cuda)
    a = cp.from_dlpack(t)
    assert a.data.ptr == t.data_ptr
    assert int(a[7]) == 7
    b = cp.asarray(t)  # through __cuda_array_interface__
    assert b.data.ptr == t.data_ptr
    b[0] = 42
    cp.cuda.runtime.deviceSynchronize()
    assert t.to_numpy()[0] == 42
    del a, b
    t.close()


@pytest.mark.gpu
def test_dlpack_orders_consumer_stream_after_producer(cuda):
    """Exporting to a consumer stream makes it wait for trtio's last write to the tensor."""
    torch = pytest.importorskip("torch")
    producer = Stream.create(cuda)
    n = 16 << 20
    t = Tensor.empty((n,), "int32", backend=cuda)
    for i in range(20):
        for _ in range(3):
            t.fill_(-1, producer)
        t.fill_(i, producer)
        consumer = torch.cuda.Stream()
        with torch.cuda.stream(consumer):
            x = torch.utils.dlpack.from_dlpack(t.__dlpack__(stream=consumer.cuda_stream))
            total = int((x == i).sum().item())
        assert total == n, f"iteration {i}"
    producer.synchronize()
    t.close()
    producer.close()


@pytest.mark.gpu
def test_reads_on_another_stream_wait_for_the_last_write(cuda):
    """to_numpy / copies on stream B see a write trtio issued on stream A, with no explicit sync."""
    torch = pytest.importorskip("torch")
    a = Stream.create(cuda)
    t = Tensor.empty((1 << 20,), "int32", backend=cuda)
    t.fill_(0, a)
    a.synchronize()
    for i in range(1, 11):
        with torch.cuda.stream(torch.cuda.ExternalStream(a.handle)):
            torch.cuda._sleep(2_000_000)  # the write lands ~1 ms after it is issued
        t.fill_(i, a)
        assert (t.to_numpy() == i).all(), f"iteration {i}: read before the write on stream A finished"
    a.synchronize()
    t.close()
    a.close()


@pytest.mark.gpu
def test_mark_written_orders_reads_after_a_foreign_write(cuda):
    """A write by another library (torch here) on stream A, announced with mark_written, is seen by reads."""
    torch = pytest.importorskip("torch")
    a = Stream.create(cuda)
    t = Tensor.empty((1 << 20,), "int32", backend=cuda)
    t.fill_(0, a)
    a.synchronize()
    x = torch.from_dlpack(t)
    ext = torch.cuda.ExternalStream(a.handle)
    for i in range(1, 11):
        with torch.cuda.stream(ext):
            torch.cuda._sleep(2_000_000)
            x.fill_(i)
        t.mark_written(a)
        assert (t.to_numpy() == i).all(), f"iteration {i}"
    a.synchronize()
    del x
    t.close()
    a.close()


# -- wrap: what is not a pointer ----------------------------------------------------------------------
@pytest.mark.parametrize("ptr,error,needle", [
    (-256, InvalidValueError, "pointer -256 is negative"),
    (True, TypeError, "is a bool, not a pointer"),
    (np.bool_(True), TypeError, "is a bool"),
    (256.0, TypeError, "a pointer is an int address, got float"),
    ("0x100", TypeError, "got str"),
    (0, InvalidValueError, "null pointer"),
    (1 << 64, InvalidValueError, "runs past the 64-bit address space"),
])
def test_wrap_refuses_what_is_not_a_pointer(backend, ptr, error, needle):
    with pytest.raises(error, match=rf"tensor 'w'.*{needle}"):
        Tensor.wrap(ptr, (4,), "float32", Location.DEVICE, name="w", backend=backend)


def test_wrap_of_zero_bytes_may_have_no_address(backend):
    t = Tensor.wrap(0, (0, 4), "float32", Location.DEVICE, name="absent", backend=backend)
    assert t.is_empty and t.data_ptr == 0


def test_host_backend_refuses_device_pointers_it_did_not_allocate(host):
    owner = Tensor.empty((256,), "uint8", name="owner", backend=host)
    stray = np.zeros(1024, np.uint8)
    aligned = (stray.ctypes.data + 255) // 256 * 256
    with pytest.raises(InvalidValueError, match=r"tensor 'w'.*not inside device memory the host backend allocated"):
        Tensor.wrap(aligned, (4,), "float32", Location.DEVICE, name="w", backend=host)
    with pytest.raises(InvalidValueError, match="not inside"):
        Tensor.wrap(owner.data_ptr, (65,), "float32", Location.DEVICE, owner, name="w", backend=host)  # 260 > 256
    inside = Tensor.wrap(owner.data_ptr, (64,), "float32", Location.DEVICE, owner, name="w", backend=host)
    assert inside.data_ptr == owner.data_ptr
    host_tensor = Tensor.wrap(stray.ctypes.data, (4,), "float32", Location.HOST, stray, name="h", backend=host)
    assert host_tensor.data_ptr == stray.ctypes.data, "host memory may be anything"
    owner.close()


@pytest.mark.parametrize("capacity,error", [(-1, InvalidValueError), (True, TypeError), (16.0, TypeError)])
def test_bad_capacities_are_refused(host, capacity, error):
    with pytest.raises(error, match="tensor 'c'.*capacity"):
        Tensor.empty((0,), "int32", name="c", backend=host, capacity=capacity)


# -- copies: shapes must match ----------------------------------------------------------------------
def test_copies_refuse_another_shape_of_the_same_bytes(backend):
    t = Tensor.empty((4, 4), "float32", name="x", backend=backend)
    data = np.arange(16, dtype=np.float32).reshape(2, 8)
    with pytest.raises(ShapeError, match=r"tensor 'x'.*shape \(2, 8\) \(64 bytes\) does not match the view \(4, 4\)"):
        t.copy_from(data)
    with pytest.raises(ShapeError, match=r"tensor 'x'.*\(2, 8\)"):
        t.copy_to(np.empty((2, 8), np.float32))
    other = Tensor.empty((2, 8), "float32", name="y", backend=backend)
    with pytest.raises(ShapeError, match=r"tensor 'x'.*tensor 'y'.*\(2, 8\)"):
        t.copy_from(other)
    with pytest.raises(ShapeError, match=r"tensor 'y'.*tensor 'x'"):
        t.copy_to(other)
    t.reshape((2, 8)).copy_from(data)  # a flat copy, asked for explicitly
    np.testing.assert_array_equal(t.reshape((16,)).to_numpy(), data.ravel())
    t.close()
    other.close()


def test_packed_types_copy_their_flat_bytes(host):
    t = Tensor.empty((4, 4), "int4", name="q", backend=host)
    raw = np.arange(8, dtype=np.uint8)
    t.copy_from(raw)
    np.testing.assert_array_equal(t.to_numpy(), raw)
    with pytest.raises(ShapeError, match=r"bytes of the view \(4, 4\)"):
        t.copy_from(raw.reshape(2, 4))
    t.close()


def test_copy_from_a_tensor_of_another_backend_is_refused(host):
    from trtio._cuda.host import HostBackend

    a = Tensor.empty((4,), "int32", name="a", backend=host)
    b = Tensor.empty((4,), "int32", name="b", backend=HostBackend())
    with pytest.raises(TrtioError, match="tensor 'a'.*another backend"):
        a.copy_from(b)
    a.close()
    b.close()


def test_copy_from_a_tensor_over_the_same_bytes_copies_nothing_and_one_partly_over_them_is_refused(backend):
    """Two views of the same bytes: nothing to copy (no device operation). Bytes that overlap without starting at
    the same address: a copy between them is undefined, so it is refused, naming both, and nothing changes."""
    values = np.arange(256, dtype=np.float16).reshape(2, 128)
    base = Tensor.empty((2, 256), "float16", name="base", backend=backend)
    try:
        base.copy_from(np.zeros((2, 256), np.float16))
        head = Tensor.wrap(base.data_ptr, (2, 128), "float16", Location.DEVICE, base, name="head", backend=backend)
        same = Tensor.wrap(base.data_ptr, (2, 128), "float16", Location.DEVICE, base, name="same", backend=backend)
        later = Tensor.wrap(base.data_ptr + 256, (2, 128), "float16", Location.DEVICE, base, name="later",
                            backend=backend)  # 256 bytes on: inside head's 512
        head.copy_from(values)
        ops = getattr(backend, "op_count", None)
        assert same.copy_from(head) is same
        assert ops is None or backend.op_count == ops, "the same bytes: no copy"
        np.testing.assert_array_equal(same.to_numpy(), values)
        for dst, src in ((head, later), (later, head)):
            with pytest.raises(InvalidValueError, match=f"tensor '{dst.name}': copy_from\\(tensor '{src.name}'\\): "
                                                        "its 512 bytes at 0x[0-9a-f]+ overlap"):
                dst.copy_from(src)
        np.testing.assert_array_equal(head.to_numpy(), values)
    finally:
        base.close()


# -- fill_: values the dtype cannot hold ------------------------------------------------------------
@pytest.mark.parametrize("dtype,value,needle", [
    ("int32", 1.5, r"int32 holds integers; 1.5 is not one \(it would be stored as 1\)"),
    ("int8", 300, r"300 is outside int8's range \[-128, 127\]"),
    ("uint8", -1, r"-1 is outside uint8's range \[0, 255\]"),
    ("int32", float("nan"), r"int32 holds integers in \[-2147483648, 2147483647\], not nan"),
    ("int64", float("inf"), "not inf"),
    ("int8", np.float32(2.5), "not one"),
    ("bool", 2, "a bool tensor takes True, False, 0 or 1"),
    ("float16", 1e40, "cannot be represented in float16"),
    ("float16", 10**400, "cannot be represented in float16"),
    ("int4", 1, "packed int4 supports only 0"),
])
def test_fill_refuses_values_the_dtype_cannot_hold(backend, dtype, value, needle):
    t = Tensor.empty((4,), dtype, name="f", backend=backend)
    with pytest.raises(InvalidValueError, match=rf"tensor 'f': fill_\(.*\): .*{needle}"):
        t.fill_(value)
    t.close()


@pytest.mark.parametrize("value", [1 + 2j, "1", None, b"\x01"])
def test_fill_takes_real_numbers_only(host, value):
    t = Tensor.empty((4,), "float32", name="f", backend=host)
    with pytest.raises(TypeError, match="tensor 'f': fill_ takes a real number"):
        t.fill_(value)
    t.close()


@pytest.mark.parametrize("dtype,value,expected", [
    ("int32", 2.0, 2), ("int8", -128, -128), ("int64", np.int64(2**40), 2**40), ("bool", True, True),
    ("bool", 0, False), ("float16", float("inf"), np.inf), ("float32", float("nan"), None),
    ("float16", 65504, 65504), ("int32", True, 1),
])
def test_fill_keeps_representable_values(backend, dtype, value, expected):
    t = Tensor.empty((3,), dtype, backend=backend).fill_(value)
    got = t.to_numpy()
    if expected is None:
        assert np.isnan(got).all()
    else:
        assert (got == expected).all()
    t.close()


@pytest.mark.skipif(not HAS_ML, reason="ml_dtypes not installed")
def test_fill_refuses_what_fp8_cannot_hold(host):
    t = Tensor.empty((4,), "fp8", name="q", backend=host)
    with pytest.raises(InvalidValueError, match="cannot be represented in fp8"):
        t.fill_(1000.0)
    with pytest.raises(InvalidValueError, match="fp8 has no infinity"):
        t.fill_(float("-inf"))
    t.fill_(448.0)
    t.close()


# -- allocation errors name the tensor and the bytes ------------------------------------------------
def test_an_impossible_allocation_names_the_tensor_and_the_bytes(host):
    with pytest.raises(CudaError, match=r"cudaMalloc: cudaErrorMemoryAllocation: tensor 'huge' \(shape "
                                        r"\(2199023255552,\) of float32\): 8796093022208 bytes of device memory"):
        Tensor.empty((2**41,), "float32", name="huge", backend=host)


def test_an_unknown_location_lists_the_locations(host):
    with pytest.raises(InvalidValueError, match=r"location of tensor 'x': 'gpu' is not a memory location; "
                                                r"expected one of 'device', 'pinned', 'host'"):
        Tensor.empty((4,), "int32", "gpu", name="x", backend=host)
    t = Tensor.empty((4,), "int32", "PINNED", name="x", backend=host)
    assert t.location is Location.PINNED
    t.close()


@pytest.mark.parametrize("stream,error", [(0, InvalidValueError), (-2, InvalidValueError), (True, TypeError),
                                          (1.0, TypeError)])
def test_dlpack_consumer_streams_follow_the_standard(stream, error):
    from trtio._tensor import _consumer_stream  # what a CUDA export makes of the consumer's stream argument

    with pytest.raises(error, match=r"tensor 'x': __dlpack__\(stream="):
        _consumer_stream("x", stream)
    assert (_consumer_stream("x", None), _consumer_stream("x", 2), _consumer_stream("x", -1)) == (1, 2, -1)


@pytest.mark.gpu
def test_dlpack_export_refuses_stream_zero(cuda):
    t = Tensor.empty((4,), "int32", name="x", backend=cuda)
    t.zero_(Stream.create(cuda))
    with pytest.raises(InvalidValueError, match="0 is ambiguous"):
        t.__dlpack__(stream=0)
    t.close()
