"""Element types: one table for sizes, numpy, TensorRT and the interop protocols.

TensorRT's own helpers cannot be trusted for this (``trt.nptype`` knows no bf16/fp8,
``DataType.itemsize`` is fractional for int4/fp4 and ``None`` for e8m0), so trtio owns the table.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from trtio._checks import is_int
from trtio.errors import InvalidValueError

__all__ = ["DType", "DTypeLike"]

@functools.cache
def _ml_dtypes() -> ModuleType | None:
    """ml_dtypes (numpy names for bf16 / fp8 / e8m0; optional), imported on first use: it takes longer to
    import than the rest of trtio, and most programs never ask for those types."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - exercised where ml_dtypes is absent
        return None
    return ml_dtypes


@functools.cache
def _ml_dtype(name: str) -> np.dtype | None:
    ml = _ml_dtypes()
    if ml is None or not hasattr(ml, name):
        return None
    dt: np.dtype = np.dtype(getattr(ml, name))
    return dt


# DLPack type codes (dlpack.h): kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLBool.
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_BOOL = 0, 1, 2, 4, 6


@dataclass(frozen=True)
class _Info:
    name: str
    bits: int
    trt_name: str
    trt_value: int
    numpy_name: str | None  # numpy / ml_dtypes name of the element type, None if numpy has none
    raw_numpy: str  # the unsigned storage type used when numpy has no element type
    dlpack: tuple[int, int] | None  # (type code, bits); None: exported as raw bytes
    typestr: str | None  # __cuda_array_interface__ / __array_interface__ typestr


class DType(enum.Enum):
    """An element type. ``DType.FLOAT16.bits == 16``; ``DType.INT4.nbytes(3) == 2``."""

    FLOAT32 = _Info("float32", 32, "FLOAT", 0, "float32", "uint32", (_DL_FLOAT, 32), "<f4")
    FLOAT16 = _Info("float16", 16, "HALF", 1, "float16", "uint16", (_DL_FLOAT, 16), "<f2")
    BFLOAT16 = _Info("bfloat16", 16, "BF16", 7, "bfloat16", "uint16", (_DL_BFLOAT, 16), None)
    FP8 = _Info("fp8", 8, "FP8", 6, "float8_e4m3fn", "uint8", None, None)
    INT8 = _Info("int8", 8, "INT8", 2, "int8", "uint8", (_DL_INT, 8), "|i1")
    INT32 = _Info("int32", 32, "INT32", 3, "int32", "uint32", (_DL_INT, 32), "<i4")
    INT64 = _Info("int64", 64, "INT64", 8, "int64", "uint64", (_DL_INT, 64), "<i8")
    BOOL = _Info("bool", 8, "BOOL", 4, "bool", "uint8", (_DL_BOOL, 8), "|b1")
    UINT8 = _Info("uint8", 8, "UINT8", 5, "uint8", "uint8", (_DL_UINT, 8), "|u1")
    INT4 = _Info("int4", 4, "INT4", 9, None, "uint8", None, None)
    FP4 = _Info("fp4", 4, "FP4", 10, None, "uint8", None, None)
    E8M0 = _Info("e8m0", 8, "E8M0", 11, "float8_e8m0fnu", "uint8", None, None)

    # -- properties -----------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return self.value.bits

    @property
    def trt_name(self) -> str:
        """The member name in ``tensorrt.DataType`` (``"HALF"`` for FLOAT16)."""
        return self.value.trt_name

    @property
    def itemsize(self) -> int:
        """Bytes per element, rounded up (1 for the packed 4-bit types)."""
        return max(1, self.value.bits // 8)

    @property
    def is_packed(self) -> bool:
        """True for sub-byte types stored two elements per byte."""
        return self.value.bits < 8

    @property
    def numpy(self) -> np.dtype | None:
        """The numpy dtype of one element, or None where numpy (and ml_dtypes) have none."""
        name = self.value.numpy_name
        if name is None:
            return None
        if name in ("bfloat16", "float8_e4m3fn", "float8_e8m0fnu"):
            return _ml_dtype(name)
        return np.dtype(name)

    @property
    def storage_numpy(self) -> np.dtype:
        """The dtype trtio uses for host copies: ``numpy`` when it exists, else raw unsigned storage."""
        dt = self.numpy
        return dt if dt is not None else np.dtype(self.value.raw_numpy)

    @property
    def dlpack(self) -> tuple[int, int] | None:
        """(DLPack type code, bits), or None when DLPack cannot carry the type."""
        return self.value.dlpack

    @property
    def typestr(self) -> str | None:
        """The array-interface typestr, or None when the protocol has no standard one."""
        return self.value.typestr

    def nbytes(self, volume: int) -> int:
        """Bytes for ``volume`` elements; packed sub-byte types are rounded up to whole bytes."""
        return (int(volume) * self.value.bits + 7) // 8

    def to_trt(self, module: Any) -> Any:
        """The matching ``module.DataType`` member of a TensorRT or TensorRT-RTX module."""
        return getattr(module.DataType, self.value.trt_name)

    def __repr__(self) -> str:
        return f"DType.{self.name}"

    def __str__(self) -> str:
        return self.value.name

    # -- conversions ----------------------------------------------------------------------
    @classmethod
    def from_trt(cls, x: Any) -> DType:
        """From a TensorRT / TensorRT-RTX ``DataType`` member, its name (``"HALF"``), or its int value."""
        if isinstance(x, DType):
            return x
        if is_int(x):
            for member in cls:
                if member.value.trt_value == int(x):
                    return member
            raise InvalidValueError(f"unknown TensorRT DataType value {int(x)}")
        name = getattr(x, "name", None)
        if not isinstance(name, str):
            name = str(x)
        key = name.rsplit(".", 1)[-1]
        for member in cls:
            if key.upper() == member.value.trt_name or key.lower() == member.value.name:
                return member
        raise InvalidValueError(
            f"unknown TensorRT DataType {x!r}; expected one of "
            + ", ".join(m.value.trt_name for m in cls)
        )

    @classmethod
    def from_numpy(cls, x: Any) -> DType:
        """From a numpy dtype (or anything ``np.dtype`` accepts), ml_dtypes' bf16/fp8 included."""
        if isinstance(x, DType):
            return x
        try:
            dt = x if isinstance(x, np.dtype) else np.dtype(x)
        except TypeError as exc:
            raise InvalidValueError(f"{x!r} is not a numpy dtype") from exc
        found = _FROM_NUMPY.get(dt)
        if found is None:
            for member in cls:
                if member.value.numpy_name is not None and dt.name == member.value.numpy_name:
                    found = _FROM_NUMPY[dt] = member
                    break
            else:
                raise InvalidValueError(f"numpy dtype {dt} has no trtio DType")
        return found

    @classmethod
    def coerce(cls, x: DTypeLike) -> DType:
        """Accept a DType, a trtio name (``"float16"``), an Edge-LLM short name (``"fp16"``, ``"bf16"``,
        ``"fp32"``, ``"fp8"``, ``"int8"``, as its ``config.json`` writes ``kv_cache_dtype``), a TensorRT
        name/enum or a numpy dtype."""
        if isinstance(x, DType):
            return x
        if isinstance(x, str):
            for member in cls:
                if x == member.value.name or x.upper() == member.name:
                    return member
            alias = _SHORT_NAMES.get(x.lower())
            if alias is not None:
                return cls[alias]
            try:
                return cls.from_trt(x)
            except ValueError:
                pass
        elif type(x).__name__ == "DataType":
            return cls.from_trt(x)
        try:
            return cls.from_numpy(x)
        except ValueError:
            raise InvalidValueError(
                f"{x!r} is not a dtype trtio knows; expected a trtio.DType, one of "
                + ", ".join(m.value.name for m in cls)
                + ", an Edge-LLM short name (" + ", ".join(_SHORT_NAMES) + "), a numpy dtype or a TensorRT DataType"
            ) from None


DTypeLike = Any  # DType | np.dtype | str | tensorrt.DataType

# Edge-LLM's short dtype names (config.json's kv_cache_dtype, its runtime's dtype strings) -> DType member.
_SHORT_NAMES: dict[str, str] = {"fp16": "FLOAT16", "bf16": "BFLOAT16", "fp32": "FLOAT32", "fp8": "FP8", "int8": "INT8"}

_FROM_NUMPY: dict[np.dtype, DType] = {}  # memo for DType.from_numpy (hot in copies)
