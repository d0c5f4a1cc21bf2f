"""trtio._dlpack: capsules numpy can consume, that share memory and never leak an export."""

from __future__ import annotations

import ctypes
import gc
import sys
import weakref
from typing import Any

import numpy as np
import pytest

from trtio._dlpack import (
    DLPACK_FLAG_BITMASK_READ_ONLY,
    DLManagedTensor,
    DLManagedTensorVersioned,
    kDLBfloat,
    kDLBool,
    kDLCPU,
    kDLFloat,
    kDLInt,
    kDLUInt,
    live_exports,
    make_capsule,
    parse_max_version,
)

_DL_CODES = {"f": kDLFloat, "i": kDLInt, "u": kDLUInt, "b": kDLBool}


class Exporter:
    """A host array behind ``__dlpack__``, the way a trtio tensor exports itself.

    ``capsule`` picks the capsule kind: ``"auto"`` follows the consumer's ``max_version``,
    ``"legacy"`` / ``"versioned"`` force one. ``asked`` records the consumer's ``max_version``.
    """

    def __init__(self, array: np.ndarray, *, capsule: str = "auto", dl: tuple[int, int] | None = None,
                 read_only: bool = False) -> None:
        self.array = array
        self.capsule = capsule
        self.dl = dl if dl is not None else (_DL_CODES[array.dtype.kind], array.dtype.itemsize * 8)
        self.read_only = read_only
        self.asked: Any = "not called"

    def __dlpack_device__(self) -> tuple[int, int]:
        return (kDLCPU, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> object:
        self.asked = max_version
        versioned = {"auto": parse_max_version(max_version), "legacy": False, "versioned": True}
        a = self.array
        return make_capsule(
            a.__array_interface__["data"][0], a.shape, type_code=self.dl[0], bits=self.dl[1],
            device_type=kDLCPU, device_id=0, owner=a,
            strides=tuple(s // a.itemsize for s in a.strides),
            versioned=versioned[self.capsule], read_only=self.read_only)


class CapsuleHolder:
    """Hands numpy a capsule made beforehand (``from_dlpack`` only takes producers)."""

    def __init__(self, capsule: object) -> None:
        self._capsule = capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (kDLCPU, 0)

    def __dlpack__(self, **kwargs: Any) -> object:
        capsule, self._capsule = self._capsule, None
        return capsule


# What a consumer does with a capsule, through the C API.
def _capi(name: str, restype: Any, *argtypes: Any) -> Any:
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_name = _capi("PyCapsule_GetName", ctypes.c_char_p, ctypes.py_object)
_capsule_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_capsule_set_name = _capi("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_void_p)
# A capsule keeps the pointer to its name, so the name must outlive every capsule renamed here.
_USED_NAME = ctypes.create_string_buffer(b"used_dltensor")


def _struct(capsule: object) -> DLManagedTensor | DLManagedTensorVersioned:
    """The struct inside an unconsumed capsule; valid only while the capsule lives."""
    name = _capsule_name(capsule)
    kind = DLManagedTensorVersioned if name == b"dltensor_versioned" else DLManagedTensor
    return kind.from_address(_capsule_pointer(capsule, name))


def _data(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.fixture
def baseline() -> int:
    """live_exports() before the test; the test must come back to it."""
    gc.collect()
    return live_exports()


# -- zero copy, every type, every capsule kind --------------------------------------------------------
@pytest.mark.parametrize("capsule", ["auto", "legacy", "versioned"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "int32", "int64", "uint8", "bool"])
def test_numpy_reads_the_same_memory(dtype: str, capsule: str, baseline: int) -> None:
    producer = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    exporter = Exporter(producer, capsule=capsule)
    consumer = np.from_dlpack(exporter)

    assert exporter.asked is not None and exporter.asked[0] >= 1, "numpy 2 asks with max_version"
    assert consumer.dtype == producer.dtype
    assert consumer.shape == (2, 3, 4)
    np.testing.assert_array_equal(consumer, producer)
    assert _data(consumer) == _data(producer)
    producer[1, 2, 3] = 1 if dtype == "bool" else 5
    producer[0, 0, 0] = 0
    np.testing.assert_array_equal(consumer, producer)
    assert live_exports() == baseline + 1

    del consumer
    gc.collect()
    assert live_exports() == baseline


@pytest.mark.parametrize("capsule", ["legacy", "versioned"])
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: np.array(3.5, dtype=np.float32), id="0-d"),
        pytest.param(lambda: np.zeros((0,), np.float32), id="empty"),
        pytest.param(lambda: np.zeros((3, 0, 2), np.int32), id="empty-middle-dim"),
        pytest.param(lambda: np.arange(12, dtype=np.int32).reshape(3, 4).T, id="transposed"),
        pytest.param(lambda: np.arange(40, dtype=np.float32).reshape(5, 8)[1:4, ::3], id="strided"),
        pytest.param(lambda: np.arange(6, dtype=np.int64)[::-1], id="negative-stride"),
    ],
)
def test_shapes_and_strides_survive(make: Any, capsule: str, baseline: int) -> None:
    producer = make()
    consumer = np.from_dlpack(Exporter(producer, capsule=capsule))

    assert consumer.shape == producer.shape
    assert consumer.strides == producer.strides
    np.testing.assert_array_equal(consumer, producer)
    assert _data(consumer) == _data(producer)
    if producer.size:
        producer[(0,) * producer.ndim] = 42
        assert consumer[(0,) * consumer.ndim] == 42, "the consumer sees writes through the producer"

    del consumer
    gc.collect()
    assert live_exports() == baseline


def test_byte_offset_moves_the_first_element(baseline: int) -> None:
    base = np.arange(10, dtype=np.int32)
    capsule = make_capsule(_data(base), (4,), type_code=kDLInt, bits=32, device_type=kDLCPU,
                           device_id=0, owner=base, byte_offset=3 * 4)
    consumer = np.from_dlpack(CapsuleHolder(capsule))
    del capsule

    np.testing.assert_array_equal(consumer, [3, 4, 5, 6])
    base[3] = -1
    assert consumer[0] == -1


# -- the capsule itself -------------------------------------------------------------------------------
def test_legacy_capsule_unless_the_consumer_asks_for_1_0(baseline: int) -> None:
    exporter = Exporter(np.zeros(3, np.float32))
    assert _capsule_name(exporter.__dlpack__()) == b"dltensor"
    assert _capsule_name(exporter.__dlpack__(max_version=None)) == b"dltensor"
    assert _capsule_name(exporter.__dlpack__(max_version=(0, 8))) == b"dltensor"
    assert _capsule_name(exporter.__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"
    assert _capsule_name(exporter.__dlpack__(max_version=(1, 3))) == b"dltensor_versioned"
    gc.collect()
    assert live_exports() == baseline


@pytest.mark.parametrize(
    ("max_version", "versioned"),
    [(None, False), ((0, 8), False), ((1, 0), True), ((1, 2), True), ((2, 0), True),
     ([1, 0], True), ((np.int64(1), 0), True)],
)
def test_parse_max_version(max_version: Any, versioned: bool) -> None:
    assert parse_max_version(max_version) is versioned


@pytest.mark.parametrize("bad", [1, "1.0", (), (1.0, 0)])
def test_parse_max_version_rejects_what_is_not_a_version(bad: Any) -> None:
    with pytest.raises(TypeError, match="max_version must be None or a \\(major, minor\\) tuple"):
        parse_max_version(bad)


def test_versioned_header_and_explicit_contiguous_strides() -> None:
    a = np.zeros((2, 3, 4), np.float16)
    capsule = make_capsule(_data(a), a.shape, type_code=kDLFloat, bits=16, device_type=kDLCPU,
                           device_id=0, owner=a, versioned=True)
    managed = _struct(capsule)

    assert isinstance(managed, DLManagedTensorVersioned)
    assert (managed.version.major, managed.version.minor) == (1, 0)
    assert managed.flags == 0
    t = managed.dl_tensor
    assert t.data == _data(a) and t.byte_offset == 0
    assert (t.device.device_type, t.device.device_id) == (kDLCPU, 0)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (kDLFloat, 16, 1)
    assert t.ndim == 3
    assert t.shape[:3] == [2, 3, 4]
    assert t.strides[:3] == [12, 4, 1], "strides=None still writes C-contiguous strides"


def test_contiguous_strides_of_a_zero_size_tensor(baseline: int) -> None:
    a = np.zeros((3, 0, 2), np.int32)
    capsule = make_capsule(_data(a), a.shape, type_code=kDLInt, bits=32, device_type=kDLCPU,
                           device_id=0, owner=a)
    t = _struct(capsule).dl_tensor
    assert t.strides[:3] == [2, 2, 1], "an empty dimension does not zero the strides before it"

    consumer = np.from_dlpack(CapsuleHolder(capsule))
    del capsule
    assert consumer.shape == (3, 0, 2) and consumer.size == 0
    del consumer
    gc.collect()
    assert live_exports() == baseline


def test_read_only_sets_the_flag_and_numpy_honours_it() -> None:
    producer = np.arange(4, dtype=np.int32)
    exporter = Exporter(producer, capsule="versioned", read_only=True)
    capsule = exporter.__dlpack__(max_version=(1, 0))
    assert _struct(capsule).flags == DLPACK_FLAG_BITMASK_READ_ONLY
    del capsule

    consumer = np.from_dlpack(exporter)
    assert not consumer.flags.writeable
    np.testing.assert_array_equal(consumer, producer)


def test_read_only_cannot_go_through_a_legacy_capsule(baseline: int) -> None:
    a = np.arange(4, dtype=np.int32)
    with pytest.raises(BufferError, match="read-only memory cannot be exported through a legacy"):
        make_capsule(_data(a), a.shape, type_code=kDLInt, bits=32, device_type=kDLCPU, device_id=0,
                     owner=a, read_only=True)
    assert live_exports() == baseline


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"shape": (2, -1)}, ValueError, r"shape must not be negative, got \(2, -1\)"),
        ({"shape": (2.0,)}, TypeError, r"shape must be a tuple of ints"),
        ({"strides": (1,)}, ValueError, r"strides \(1,\) has 1 entries for shape \(2, 3\)"),
        ({"bits": 0}, ValueError, r"bits must be in \[1, 255\], got 0"),
        ({"lanes": 0}, ValueError, r"lanes must be in \[1, 65535\], got 0"),
        ({"ptr": -1}, ValueError, r"ptr must be in"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, Any], error: type, match: str,
                                      baseline: int) -> None:
    a = np.zeros((2, 3), np.float32)
    args: dict[str, Any] = {"ptr": _data(a), "shape": a.shape, "type_code": kDLFloat, "bits": 32,
                            "device_type": kDLCPU, "device_id": 0, "owner": a, **kwargs}
    with pytest.raises(error, match=match):
        make_capsule(**args)
    assert live_exports() == baseline


# -- bf16 ---------------------------------------------------------------------------------------------
def test_bf16_capsule_is_well_formed() -> None:
    a = np.zeros(3, np.uint16)
    capsule = Exporter(a, dl=(kDLBfloat, 16)).__dlpack__()
    t = _struct(capsule).dl_tensor
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (kDLBfloat, 16, 1)


def test_numpy_refuses_bf16_without_crashing_or_leaking(baseline: int,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    # numpy 2 has no DLPack bf16; it raises "Unsupported dtype in DLTensor" and drops the capsule
    # while that error is set. The capsule destructor (a ctypes callback) cannot leave the error in
    # place, so numpy's from_dlpack returns NULL with no error and Python reports SystemError. The
    # export is still released, and the real reason is logged.
    producer = np.zeros(3, np.uint16)
    owner = weakref.ref(producer)
    with pytest.raises(SystemError, match="from_dlpack.*returned NULL without setting an exception"):
        np.from_dlpack(Exporter(producer, dl=(kDLBfloat, 16)))

    assert any("Unsupported dtype" in r.getMessage() and r.name == "trtio._dlpack"
               for r in caplog.records), caplog.text
    gc.collect()
    assert live_exports() == baseline
    del producer
    gc.collect()
    assert owner() is None


# -- lifetime -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("versioned", [False, True])
def test_an_unconsumed_capsule_runs_the_deleter(versioned: bool, baseline: int) -> None:
    owner = np.arange(5, dtype=np.int64)
    alive = weakref.ref(owner)
    capsule = make_capsule(_data(owner), owner.shape, type_code=kDLInt, bits=64,
                           device_type=kDLCPU, device_id=0, owner=owner, versioned=versioned)
    del owner
    gc.collect()
    assert live_exports() == baseline + 1
    assert alive() is not None, "the capsule keeps the owner alive"

    del capsule
    gc.collect()
    assert live_exports() == baseline
    assert alive() is None


@pytest.mark.parametrize("capsule", ["legacy", "versioned"])
def test_a_consumed_capsule_releases_when_the_consumer_dies(capsule: str, baseline: int) -> None:
    owner = np.arange(5, dtype=np.float32)
    alive = weakref.ref(owner)
    consumer = np.from_dlpack(Exporter(owner, capsule=capsule))
    del owner
    gc.collect()
    assert alive() is not None, "the owner lives as long as the consumer, not the exporter"
    assert live_exports() == baseline + 1
    np.testing.assert_array_equal(consumer, np.arange(5, dtype=np.float32))

    del consumer
    gc.collect()
    assert alive() is None
    assert live_exports() == baseline


def test_a_renamed_capsule_leaves_the_deleter_to_the_consumer(baseline: int) -> None:
    owner = np.arange(4, dtype=np.uint8)
    capsule = make_capsule(_data(owner), owner.shape, type_code=kDLUInt, bits=8,
                           device_type=kDLCPU, device_id=0, owner=owner)
    managed_address = _capsule_pointer(capsule, b"dltensor")
    # Copy the function pointer out: the struct is freed by the first call.
    deleter_address = ctypes.cast(DLManagedTensor.from_address(managed_address).deleter,
                                  ctypes.c_void_p).value
    deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(deleter_address)
    assert _capsule_set_name(capsule, ctypes.addressof(_USED_NAME)) == 0
    del capsule
    gc.collect()
    assert live_exports() == baseline + 1, "a consumed capsule's destructor must not delete"

    deleter(managed_address)
    assert live_exports() == baseline
    deleter(managed_address)  # a second call (a consumer bug) changes nothing
    assert live_exports() == baseline


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="starts a thread with pthread_create")
def test_the_deleter_may_run_on_a_thread_python_never_saw(baseline: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    owner = np.arange(4, dtype=np.int32)
    alive = weakref.ref(owner)
    capsule = make_capsule(_data(owner), owner.shape, type_code=kDLInt, bits=32,
                           device_type=kDLCPU, device_id=0, owner=owner, versioned=True)
    del owner
    managed_address = _capsule_pointer(capsule, b"dltensor_versioned")
    managed = DLManagedTensorVersioned.from_address(managed_address)
    assert _capsule_set_name(capsule, ctypes.addressof(_USED_NAME)) == 0
    del capsule

    # The deleter is the thread's start routine: called from C on a thread with no Python state.
    thread = ctypes.c_ulong()
    start = ctypes.cast(managed.deleter, ctypes.c_void_p)
    rc = libc.pthread_create(ctypes.byref(thread), None, start, ctypes.c_void_p(managed_address))
    assert rc == 0, f"pthread_create: {rc}"
    assert libc.pthread_join(thread, None) == 0  # a CDLL call: the GIL is free meanwhile
    gc.collect()
    assert live_exports() == baseline
    assert alive() is None


def test_many_exports_leave_nothing_behind(baseline: int) -> None:
    arrays = [np.full((i % 5, 3), i, dtype=np.int32) for i in range(50)]
    for round_ in range(20):
        consumers = [np.from_dlpack(Exporter(a, capsule=("legacy", "versioned")[round_ % 2]))
                     for a in arrays]
        unconsumed = [Exporter(a).__dlpack__() for a in arrays[::3]]
        assert live_exports() == baseline + len(consumers) + len(unconsumed)
        for i, a in enumerate(arrays):
            assert consumers[i].shape == a.shape
            assert (consumers[i] == i).all()
        del consumers, unconsumed
    gc.collect()
    assert live_exports() == baseline


# -- consuming: a capsule no array can be is refused before anything is read through it -----------------------


def _malformed(change: str) -> tuple[object, np.ndarray]:
    """A capsule over 4 float32s whose struct then says what no producer may say."""
    a = np.arange(4, dtype=np.float32)
    capsule = make_capsule(_data(a), (4,), type_code=kDLFloat, bits=32, device_type=kDLCPU, device_id=0, owner=a)
    t = _struct(capsule).dl_tensor
    if change == "ndim 1000":
        t.ndim = 1000  # reading 1000 dims would run past the 1-entry shape array
    elif change == "ndim 65":
        t.ndim = 65
    elif change == "ndim -3":
        t.ndim = -3
    elif change == "null shape":
        t.shape = ctypes.POINTER(ctypes.c_int64)()
    elif change == "negative dim":
        t.shape[0] = -4
    elif change == "null data":
        t.data = None  # numpy would make an uninitialised array of it: garbage as input
    return capsule, a


@pytest.mark.parametrize(("change", "match"), [
    ("ndim 1000", r"a DLPack tensor of ndim 1000; trtio reads 0\.\.64 dimensions"),
    ("ndim 65", r"a DLPack tensor of ndim 65; trtio reads 0\.\.64 dimensions"),
    ("ndim -3", r"a DLPack tensor of ndim -3; trtio reads 0\.\.64 dimensions"),
    ("null shape", r"a DLPack tensor of ndim 1 without a shape \(a null shape pointer\)"),
    ("negative dim", r"a DLPack tensor of shape \[-4\]: a dimension is negative"),
    ("null data", r"a DLPack tensor of shape \[4\] at a null data pointer \(only an empty tensor may have one\)"),
])
def test_consume_refuses_a_malformed_tensor_and_leaves_the_capsule_to_its_destructor(change: str, match: str,
                                                                                     baseline: int) -> None:
    from trtio._dlpack import consume_capsule
    from trtio.errors import ExportError

    capsule, _ = _malformed(change)
    with pytest.raises(ExportError, match=match):
        consume_capsule(capsule)
    assert _capsule_name(capsule) in (b"dltensor", b"dltensor_versioned"), "not taken: still the producer's"
    del capsule
    gc.collect()
    assert live_exports() == baseline


def test_consume_takes_an_empty_tensor_at_a_null_address(baseline: int) -> None:
    from trtio._dlpack import consume_capsule

    capsule = make_capsule(0, (0, 3), type_code=kDLFloat, bits=32, device_type=kDLCPU, device_id=0, owner=None)
    view = consume_capsule(capsule)
    assert view.shape == (0, 3) and view.data == 0
    view.owner.release()
    del capsule, view
    gc.collect()
    assert live_exports() == baseline
