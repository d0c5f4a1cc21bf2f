"""Writing .safetensors files by hand (the tests need no safetensors package): header length, JSON header
padded to 8 bytes, then each tensor's little-endian bytes."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

_TAGS = {"float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64", "int32": "I32", "int16": "I16",
         "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def write_safetensors(path: Path, tensors: dict[str, Any], *, tags: dict[str, str] | None = None,
                      metadata: dict[str, str] | None = None) -> Path:
    """Write ``tensors`` (numpy arrays) to ``path``; ``tags`` overrides a tensor's dtype tag (an array of raw
    uint16 / uint8 storage written as ``"BF16"`` / ``"F8_E4M3"``)."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    blobs, offset = [], 0
    for name, value in tensors.items():
        arr = np.ascontiguousarray(value)
        tag = (tags or {}).get(name) or _TAGS[arr.dtype.name]
        data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path
