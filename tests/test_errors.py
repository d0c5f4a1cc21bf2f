"""One error family: what trtio raises is a TrtioError, and also the built-in exception callers expect."""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _configs import llm_config

from trtio import names
from trtio._config import FrozenMap
from trtio._cuda.backend import Location
from trtio._cuda.host import HostBackend
from trtio._dlpack import make_capsule
from trtio._dtypes import DType
from trtio._engine import EngineIO
from trtio._json import read_json
from trtio._memory import Arena, MemoryReport, TensorRequest
from trtio._registry import TensorRegistry, TensorSpec
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio._tensor_map import TensorMap
from trtio.edgellm import EngineDir
from trtio.errors import (
    ExportError,
    InvalidTypeError,
    InvalidValueError,
    NotAvailableError,
    ShapeError,
    TrtioError,
    UnknownNameError,
)
from trtio.testing import ReferenceEngine

PACKAGE = Path(__file__).resolve().parents[1] / "trtio"
BUILTIN_ERRORS = {name for name, value in vars(builtins).items()
                  if isinstance(value, type) and issubclass(value, BaseException)}
# Every module raises trtio's errors only (the reference engine too: where TensorRT raises, it raises the
# trtio error that names the same failure).
NOT_YET: set[str] = set()


def _builtin_raises(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in NOT_YET:
            continue
        raises = sorted((node.lineno, node.exc) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                        if isinstance(node, ast.Raise) and node.exc is not None)
        for line, exc in raises:
            target = exc.func if isinstance(exc, ast.Call) else exc
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
            if name in BUILTIN_ERRORS:
                found.append(f"trtio/{rel}:{line}: raise {name}")
    return found


def test_no_module_raises_a_builtin_exception() -> None:
    assert _builtin_raises(PACKAGE) == []


def test_the_scan_sees_a_builtin_raise(tmp_path: Path) -> None:
    (tmp_path / "_tools").mkdir()
    source = "def f(x):\n    if x:\n        raise ValueError(x)\n    raise KeyError\n"
    (tmp_path / "_tools" / "plan.py").write_text(source)
    assert _builtin_raises(tmp_path) == ["trtio/_tools/plan.py:3: raise ValueError",
                                         "trtio/_tools/plan.py:4: raise KeyError"]


def _host_tensor() -> Tensor:
    return Tensor.empty((4,), "float32", name="h", backend="host")


def _arena() -> Arena:
    return Arena([TensorRequest.of("a", (4,), "float32")], backend=HostBackend(), title="plan")


REFUSALS: list[tuple[str, Callable[[], Any], type[TrtioError], type[Exception], str]] = [
    ("tensor map lookup", lambda: TensorMap("m")["x"], UnknownNameError, KeyError, "tensor map 'm' has no binding 'x'"),
    ("tensor map value", lambda: TensorMap("m").set("x", np.zeros(2)), InvalidTypeError, TypeError,
     "'x' must be bound to a trtio.Tensor"),
    ("engine lookup", lambda: EngineIO.from_engine(ReferenceEngine.from_config(llm_config(), device="host"))["x"],
     UnknownNameError, KeyError, "has no tensor 'x'"),
    ("arena lookup", lambda: _arena()["z"], UnknownNameError, KeyError, "arena 'plan' has no tensor 'z'"),
    ("memory report entry", lambda: MemoryReport("r").entry("z"), UnknownNameError, KeyError,
     "memory report 'r' has no entry 'z'"),
    ("arena request", lambda: Arena([("a", (4,))], backend="host"), InvalidTypeError, TypeError,
     "request 0 is a tuple"),
    ("request name", lambda: TensorRequest(3, (4,), DType.FLOAT32), InvalidTypeError, TypeError,
     "name must be a str"),
    ("read-only map", lambda: setattr(FrozenMap({"a": 1}), "b", 2), NotAvailableError, AttributeError, "read-only"),
    ("CUDA interface of host memory", lambda: _host_tensor().__cuda_array_interface__, NotAvailableError,
     AttributeError, "is not CUDA device memory"),
    ("DLPack copy", lambda: _host_tensor().__dlpack__(copy=True), ExportError, BufferError, "without copying"),
    ("read-only legacy capsule", lambda: make_capsule(4096, (1,), type_code=2, bits=32, device_type=1, device_id=0,
                                                      owner=None, read_only=True), ExportError, BufferError,
     "read-only memory cannot be exported"),
    ("capsule shape", lambda: make_capsule(4096, (-1,), type_code=2, bits=32, device_type=1, device_id=0, owner=None),
     ShapeError, ValueError, "shape must not be negative"),
    ("capsule bits", lambda: make_capsule(4096, (1,), type_code=2, bits=0, device_type=1, device_id=0, owner=None),
     InvalidValueError, ValueError, "bits must be in"),
    ("pointer type", lambda: Tensor.wrap("0x100", (4,), "float32", backend="host"), InvalidTypeError, TypeError,
     "a pointer is an int address"),
    ("fill value", lambda: _host_tensor().fill_("1"), InvalidTypeError, TypeError, "fill_ takes a real number"),
    ("stream of a str", lambda: Stream.from_handle("s", "host"), InvalidTypeError, TypeError,
     "cannot make a stream of str"),
    ("stream wait", lambda: Stream.create("host").wait(3), InvalidTypeError, TypeError,
     "wait() takes a trtio.Event"),
    ("layer index", lambda: names.past_key_values(-1), InvalidValueError, ValueError, "layer index"),
    ("TensorRT dtype value", lambda: DType.from_trt(99), InvalidValueError, ValueError, "value 99"),
    ("numpy dtype", lambda: DType.from_numpy(np.complex64), InvalidValueError, ValueError, "complex64"),
    ("registry twice", lambda: TensorRegistry("r", [TensorSpec("x", "input", DType.INT32, (1,))] * 2),
     InvalidValueError, ValueError, "'x' is declared twice"),
    ("registry rank", lambda: TensorRegistry("r", [TensorSpec("x", "input", DType.INT32, (1,) * 9)]), ShapeError,
     ValueError, "rank 9 > 8"),
    ("host alloc", lambda: HostBackend().alloc(0, Location.DEVICE), InvalidValueError,
     ValueError, "size must be positive"),
    ("host fill", lambda: HostBackend().fill(4096, b"abc", 1, 0), InvalidValueError, ValueError,
     "fill pattern must be 1, 2, 4 or 8 bytes"),
    ("config path", lambda: read_json(3), InvalidTypeError, TypeError,
     "a config path must be a str or os.PathLike"),
    ("engine directory path", lambda: EngineDir.open(3), InvalidTypeError, TypeError,
     "expected the path of an engine directory"),
]


@pytest.mark.parametrize("what,call,error,builtin,needle", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals_are_trtio_errors_and_the_builtin_callers_catch(what: str, call: Callable[[], Any],
                                                                  error: type[TrtioError], builtin: type[Exception],
                                                                  needle: str) -> None:
    with pytest.raises(error, match=needle.replace("(", r"\(").replace(")", r"\)")) as info:
        call()
    assert isinstance(info.value, TrtioError) and isinstance(info.value, builtin), what


def test_a_missing_interface_reads_as_absent() -> None:
    """An AttributeError subclass: hasattr() and numpy's protocol probes treat it as "no such interface"."""
    t = _host_tensor()
    assert not hasattr(t, "__cuda_array_interface__")
    assert hasattr(t, "__array_interface__")
