"""The one place trtio imports TensorRT: module selection, plan loading, and the logger bridge.

The engine module is a parameter (``"tensorrt"``, ``"tensorrt_rtx"``, ``"auto"`` or a module
object), never a ``sys.modules`` patch. TensorRT's log goes to the ``trtio.trt`` logger.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from types import ModuleType
from typing import Any

from trtio.errors import EngineError

__all__ = ["import_trt", "module_of", "load_engine", "trt_logger", "KNOWN_MODULES"]

log = logging.getLogger("trtio.trt")

KNOWN_MODULES = ("tensorrt", "tensorrt_rtx")

_lock = threading.Lock()
_loggers: dict[str, Any] = {}
_keepalive: dict[int, Any] = {}  # id(engine) -> runtime: an engine must not outlive its runtime


def import_trt(module: str | ModuleType = "auto") -> ModuleType:
    """Resolve ``module``: "auto" tries tensorrt, then tensorrt_rtx."""
    if isinstance(module, ModuleType):
        return module
    if module == "auto":
        errors = []
        for name in KNOWN_MODULES:
            try:
                return importlib.import_module(name)
            except ImportError as exc:
                errors.append(f"{name}: {exc}")
        raise EngineError("neither tensorrt nor tensorrt_rtx can be imported (" + "; ".join(errors) + ")")
    if module not in KNOWN_MODULES:
        raise EngineError(f"unknown TensorRT module {module!r}; expected 'auto', " +
                          " or ".join(repr(m) for m in KNOWN_MODULES) + ", or a module object")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise EngineError(f"TensorRT module {module!r} cannot be imported: {exc}") from exc


def module_of(engine: Any) -> ModuleType:
    """The module that defines ``engine``'s type (and so its enums): tensorrt, tensorrt_rtx or the
    ReferenceEngine's module."""
    mod = sys.modules.get(type(engine).__module__)
    if mod is None:
        raise EngineError(f"cannot find the module of engine type {type(engine).__name__}")
    return mod


def trt_logger(trt: ModuleType) -> Any:
    """An ``ILogger`` of ``trt`` that forwards to the ``trtio.trt`` logger (one per module)."""
    key = trt.__name__
    with _lock:
        existing = _loggers.get(key)
        if existing is not None:
            return existing
        severity = trt.ILogger.Severity
        levels = {
            severity.INTERNAL_ERROR: logging.CRITICAL,
            severity.ERROR: logging.ERROR,
            severity.WARNING: logging.WARNING,
            severity.INFO: logging.DEBUG,  # TensorRT's INFO is chatty: keep it below trtio's own INFO
            severity.VERBOSE: logging.DEBUG,
        }

        class _Bridge(trt.ILogger):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                trt.ILogger.__init__(self)
                self.errors: list[str] = []  # the latest errors, for messages that explain a failure
                self._errors_lock = threading.Lock()

            def log(self, sev: Any, msg: str) -> None:
                level = levels.get(sev, logging.INFO)
                if level >= logging.ERROR:
                    with self._errors_lock:
                        self.errors.append(msg)
                        del self.errors[:-20]
                log.log(level, "%s", msg)

            def take_errors(self) -> list[str]:
                with self._errors_lock:
                    errors, self.errors = self.errors, []
                return errors

        bridge = _Bridge()
        _loggers[key] = bridge
        return bridge


def load_engine(path: str | os.PathLike[str], module: str | ModuleType = "auto") -> Any:
    """Deserialize a plan file with ``module``; raise :class:`EngineError` naming the file and why."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise EngineError(f"plan file {path!r} does not exist") from None
    except IsADirectoryError:
        raise EngineError(f"{path!r} is a directory, not a plan file") from None
    if not data:
        raise EngineError(f"plan file {path!r} is empty")
    trt = import_trt(module)
    logger = trt_logger(trt)
    before = len(logger.errors)
    try:
        runtime = trt.Runtime(logger)
    except Exception as exc:
        raise EngineError(f"{trt.__name__}.Runtime could not be created: {exc}") from exc
    if runtime is None:
        raise EngineError(f"{trt.__name__}.Runtime could not be created (no usable GPU?)")
    try:
        engine = runtime.deserialize_cuda_engine(data)
    except Exception as exc:
        engine = None
        logger.errors.append(str(exc))
    if engine is None:
        why = "; ".join(logger.errors[before:]) or "TensorRT gave no reason"
        head = (f"plan file {path!r} ({len(data)} bytes) could not be deserialized with {trt.__name__} "
                f"{getattr(trt, '__version__', '?')}")
        from trtio.cuda.backend import cuda_available
        from trtio.cuda.device import probe_error

        if not cuda_available():
            raise EngineError(f"{head}: no usable CUDA device here ({probe_error()}), and TensorRT needs one to "
                              f"load a plan; if the file is also corrupt or truncated, TensorRT's log says so: {why}")
        raise EngineError(f"{head}: corrupt or truncated, or built for another TensorRT version or GPU ({why})")
    _keepalive[id(engine)] = runtime
    return engine
