"""Reading the ``onnx-io*.txt`` fixtures: the inputs and outputs of graphs NVIDIA's Edge-LLM 0.11 exporter wrote."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from trtio import DType

ONNX_DTYPES = {"FLOAT16": DType.FLOAT16, "FLOAT": DType.FLOAT32, "INT32": DType.INT32, "INT64": DType.INT64,
              "INT8": DType.INT8}


def parse_onnx_io(path: Path, graph: str | None = None) -> dict[str, tuple[str, DType, tuple[int, ...]]]:
    """name -> (io, dtype, shape with -1 for every symbolic dim), in the file's order; ``graph`` picks one graph
    of a file that lists several (the ``## ...`` header it ends with, e.g. ``"visual/model.onnx"``)."""
    out: dict[str, tuple[str, DType, tuple[int, ...]]] = {}
    io = ""
    take = graph is None
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            take = graph is None or line.rstrip().endswith(graph)
            continue
        if not take:
            continue
        if line.strip() in ("inputs:", "outputs:"):
            io = line.strip()[:-2]
            continue
        m = re.match(r"^\s+(\S+)\s+(FLOAT16|FLOAT|INT32|INT64|INT8)\s+(\[.*\])\s*$", line)
        if m and io:
            dims = ast.literal_eval(m.group(3))
            out[m.group(1)] = (io, ONNX_DTYPES[m.group(2)], tuple(d if isinstance(d, int) else -1 for d in dims))
    return out
