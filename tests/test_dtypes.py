import importlib.util

import numpy as np
import pytest

from trtio import DType

EXPECTED_BITS = {
    DType.FLOAT32: 32, DType.FLOAT16: 16, DType.BFLOAT16: 16, DType.FP8: 8, DType.INT8: 8,
    DType.INT32: 32, DType.INT64: 64, DType.BOOL: 8, DType.UINT8: 8, DType.INT4: 4, DType.FP4: 4,
    DType.E8M0: 8,
}


def test_every_member_has_bits():
    assert set(EXPECTED_BITS) == set(DType)
    for dt, bits in EXPECTED_BITS.items():
        assert dt.bits == bits


@pytest.mark.parametrize("volume,expected", [(0, 0), (1, 1), (2, 1), (3, 2), (7, 4), (8, 4)])
def test_packed_sizes_round_up(volume, expected):
    assert DType.INT4.nbytes(volume) == expected
    assert DType.FP4.nbytes(volume) == expected


def test_nbytes_of_whole_byte_types():
    assert DType.FLOAT16.nbytes(5) == 10
    assert DType.INT64.nbytes(3) == 24
    assert DType.E8M0.nbytes(3) == 3


@pytest.mark.parametrize("dt,np_dtype", [
    (DType.FLOAT32, np.float32), (DType.FLOAT16, np.float16), (DType.INT8, np.int8),
    (DType.INT32, np.int32), (DType.INT64, np.int64), (DType.BOOL, np.bool_), (DType.UINT8, np.uint8),
])
def test_numpy_round_trip(dt, np_dtype):
    assert dt.numpy == np.dtype(np_dtype)
    assert DType.from_numpy(np_dtype) is dt
    assert DType.from_numpy(np.dtype(np_dtype)) is dt
    assert DType.coerce(np_dtype) is dt


def test_packed_types_have_no_numpy_dtype_but_raw_storage():
    assert DType.INT4.numpy is None and DType.FP4.numpy is None
    assert DType.INT4.storage_numpy == np.dtype(np.uint8)


@pytest.mark.skipif(importlib.util.find_spec("ml_dtypes") is None, reason="ml_dtypes not installed")
def test_ml_dtypes_names_bf16_and_fp8():
    import ml_dtypes

    assert DType.BFLOAT16.numpy == np.dtype(ml_dtypes.bfloat16)
    assert DType.FP8.numpy == np.dtype(ml_dtypes.float8_e4m3fn)
    assert DType.from_numpy(ml_dtypes.bfloat16) is DType.BFLOAT16
    assert DType.from_numpy(ml_dtypes.float8_e4m3fn) is DType.FP8


@pytest.mark.parametrize("name,dt", [
    ("FLOAT", DType.FLOAT32), ("HALF", DType.FLOAT16), ("BF16", DType.BFLOAT16), ("FP8", DType.FP8),
    ("INT8", DType.INT8), ("INT32", DType.INT32), ("INT64", DType.INT64), ("BOOL", DType.BOOL),
    ("UINT8", DType.UINT8), ("INT4", DType.INT4), ("FP4", DType.FP4), ("E8M0", DType.E8M0),
    ("DataType.HALF", DType.FLOAT16),
])
def test_from_trt_names(name, dt):
    assert DType.from_trt(name) is dt
    assert dt.trt_name == name.rsplit(".", 1)[-1]


def test_from_trt_int_values_follow_tensorrt():
    assert DType.from_trt(0) is DType.FLOAT32
    assert DType.from_trt(1) is DType.FLOAT16
    assert DType.from_trt(7) is DType.BFLOAT16
    assert DType.from_trt(8) is DType.INT64
    with pytest.raises(ValueError, match="99"):
        DType.from_trt(99)


@pytest.mark.rtx
def test_from_trt_accepts_every_tensorrt_rtx_enum():
    trt = pytest.importorskip("tensorrt_rtx")
    for name, member in trt.DataType.__members__.items():
        dt = DType.from_trt(member)
        assert dt.trt_name == name
        assert dt.to_trt(trt) == member
        assert DType.from_trt(int(member)) is dt
        assert DType.coerce(member) is dt


def test_coerce_names_and_errors():
    assert DType.coerce("float16") is DType.FLOAT16
    assert DType.coerce("bfloat16") is DType.BFLOAT16
    assert DType.coerce("INT32") is DType.INT32
    assert DType.coerce(DType.FP4) is DType.FP4
    with pytest.raises(ValueError, match="complex64"):
        DType.coerce(np.complex64)
    with pytest.raises(ValueError, match="'float17'"):
        DType.coerce("float17")


def test_interop_codes():
    assert DType.FLOAT16.typestr == "<f2"
    assert DType.BFLOAT16.typestr is None
    assert DType.BFLOAT16.dlpack == (4, 16)
    assert DType.INT4.dlpack is None


@pytest.mark.parametrize("name,dt", [
    ("fp16", DType.FLOAT16), ("bf16", DType.BFLOAT16), ("fp32", DType.FLOAT32), ("fp8", DType.FP8),
    ("int8", DType.INT8), ("FP16", DType.FLOAT16), ("Bf16", DType.BFLOAT16),
])
def test_coerce_accepts_edgellm_short_names(name, dt):
    """Edge-LLM's config.json writes kv_cache_dtype as "fp16" / "fp8" (its runtime also takes int8, bf16, fp32)."""
    assert DType.coerce(name) is dt


def test_short_names_reach_every_dtype_taker():
    from trtio import Tensor
    from trtio._memory import TensorRequest

    assert TensorRequest.of("x", (2,), "bf16").dtype is DType.BFLOAT16
    with Tensor.empty((2, 3), "fp16", location="host", backend="host") as t:
        assert t.dtype is DType.FLOAT16 and t.nbytes == 12


def test_unknown_short_name_lists_the_short_names():
    with pytest.raises(ValueError, match=r"Edge-LLM short name \(fp16, bf16, fp32, fp8, int8\)"):
        DType.coerce("fp12")
