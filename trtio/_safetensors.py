"""Reading ``.safetensors`` files with numpy alone.

Edge-LLM's engine directories carry the token embedding table (``embedding.safetensors``) and the EAGLE3
draft-to-target vocabulary map (``d2t.safetensors``) in this format; trtio reads them here rather than with
the ``safetensors`` package (a trtio dependency, which :meth:`trtio.LoraAdapter.load` uses), whose numpy loader
refuses the BF16 and FP8 tensors these files hold (numpy has no such dtypes; here they are widened to float32 by
:func:`bf16_to_float32` and :func:`e4m3_to_float32`). The
format: an 8-byte little-endian header length ``N``, ``N`` bytes of JSON
(``{name: {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}``), then the
data, each tensor's offsets relative to the end of the header, little-endian and C-contiguous.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from trtio._checks import is_int
from trtio.errors import ConfigError

__all__ = ["SafeTensor", "read_safetensors", "bf16_to_float32", "e4m3_to_float32"]

# safetensors dtype tag -> numpy dtype. Types numpy has no name for come back as their raw storage.
_NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
          "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
_RAW = {"BF16": "<u2", "F8_E4M3": "u1", "F8_E5M2": "u1"}
_MAX_HEADER = 100 << 20  # the safetensors package refuses headers over 100 MB too
_MAX_NDIM = 64  # numpy's limit


@dataclass(frozen=True)
class SafeTensor:
    """One tensor of a file: its dtype tag as written (``"F16"``, ``"BF16"``, ...) and its elements.

    ``array`` is read-only: a memory map of the file for tensors of 1 MiB or more. For ``BF16`` and the
    ``F8_*`` types it holds the raw storage (uint16 / uint8); :func:`bf16_to_float32` and
    :func:`e4m3_to_float32` decode it.
    """

    dtype: str
    array: np.ndarray


def read_safetensors(path: str | os.PathLike[str], names: Iterable[str] | None = None) -> dict[str, SafeTensor]:
    """The tensors of the file at ``path`` (those in ``names``, where given), by name.

    Raises :class:`~trtio.ConfigError` naming the file for a missing or malformed file, a tensor whose
    bytes do not match its shape and dtype, or a name in ``names`` that the file does not hold.
    """
    where = os.fspath(path)
    try:
        size = os.path.getsize(where)
        with open(where, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ConfigError(where, f"is not a safetensors file: {size} bytes, shorter than its 8-byte header "
                                         "length")
            (n,) = struct.unpack("<Q", head)
            if n > min(_MAX_HEADER, size - 8):
                raise ConfigError(where, f"is not a safetensors file: header length {n} does not fit the "
                                         f"{size}-byte file")
            raw = fh.read(n)
    except FileNotFoundError:
        raise ConfigError(where, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(where, "is a directory, not a safetensors file") from None
    except OSError as exc:
        raise ConfigError(where, f"cannot be read ({type(exc).__name__}: {exc.strerror or exc})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ConfigError(where, f"is not a safetensors file: its header is not JSON ({detail})") from None
    if not isinstance(header, dict):
        raise ConfigError(where, "is not a safetensors file: its header is not a JSON object")
    header.pop("__metadata__", None)
    wanted = list(header) if names is None else list(names)
    missing = [name for name in wanted if name not in header]
    if missing:
        raise ConfigError(where, f"holds no tensor {missing[0]!r} (it holds {sorted(header)})")
    data_start = 8 + n
    out = {}
    for name in wanted:
        out[name] = _tensor(where, name, header[name], data_start, size)
    return out


def _tensor(where: str, name: str, info: object, data_start: int, size: int) -> SafeTensor:
    what = f"{where}: {name}"
    if not isinstance(info, dict):
        raise ConfigError(what, f"expected an object with dtype, shape and data_offsets, got {info!r}")
    tag, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(tag, str) or (tag not in _NUMPY and tag not in _RAW):
        raise ConfigError(what, f"dtype {tag!r} is not one trtio reads ({', '.join([*_NUMPY, *_RAW])})")
    if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
        raise ConfigError(what, f"shape must be a list of ints >= 0, got {shape!r}")
    if len(shape) > _MAX_NDIM:
        raise ConfigError(what, f"shape has {len(shape)} dimensions; trtio reads at most {_MAX_NDIM}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(is_int(o) for o in offsets)):
        raise ConfigError(what, f"data_offsets must be [begin, end], got {offsets!r}")
    dtype = np.dtype(_NUMPY.get(tag) or _RAW[tag])
    begin, end = offsets
    count = math.prod(int(d) for d in shape)  # Python ints: a huge shape must not wrap around to a small count
    if not 0 <= begin <= end:
        raise ConfigError(what, f"data_offsets {offsets} must be [begin, end] with 0 <= begin <= end")
    if end - begin != count * dtype.itemsize:
        raise ConfigError(what, f"data_offsets {offsets} hold {end - begin} bytes, but {tag} {shape} takes "
                                f"{count * dtype.itemsize}")
    if data_start + end > size:
        raise ConfigError(what, f"its data ends at byte {data_start + end}, past the end of the {size}-byte file "
                                "(truncated?)")
    if count * dtype.itemsize < (1 << 20):
        with open(where, "rb") as fh:
            fh.seek(data_start + begin)
            array = np.frombuffer(fh.read(end - begin), dtype=dtype).reshape(shape)
    else:
        array = np.memmap(where, dtype=dtype, mode="r", offset=data_start + begin, shape=tuple(shape))
    return SafeTensor(tag, array)


def bf16_to_float32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 elements given as their uint16 storage, as float32 (exact)."""
    return (np.asarray(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _e4m3_table() -> np.ndarray:
    b = np.arange(256)
    exp, man = (b >> 3) & 0xF, (b & 7).astype(np.float64)
    value = np.where(exp == 0, man * 2.0 ** -9, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    value = np.where((exp == 15) & (man == 7), np.nan, value)  # e4m3fn: no infinities, one NaN per sign
    return np.where(b & 0x80, -value, value).astype(np.float32)


_E4M3 = _e4m3_table()


def e4m3_to_float32(raw: np.ndarray) -> np.ndarray:
    """float8 e4m3fn elements given as their uint8 storage, as float32 (exact)."""
    return _E4M3[np.asarray(raw, dtype=np.uint8)]
