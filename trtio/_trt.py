"""The one place trtio imports TensorRT: module selection, plugin libraries, plan loading, and the
logger bridge.

The engine module is a parameter (``"tensorrt"``, ``"tensorrt_rtx"``, ``"auto"`` or a module
object), never a ``sys.modules`` patch. TensorRT's log goes to the ``trtio.trt`` logger (its name kept when the
module became private).
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from trtio._cuda.backend import cuda_available
from trtio._cuda.device import probe_error
from trtio.errors import EngineError

__all__ = ["import_trt", "module_of", "load_engine", "load_plugins", "loaded_plugins", "plan_format", "trt_logger",
           "KNOWN_MODULES", "PLAN_MAGICS", "PLUGIN_LIBRARY", "PLUGIN_PATH_ENV"]

log = logging.getLogger("trtio.trt")  # a logger name users configure: kept whatever the module is called

KNOWN_MODULES = ("tensorrt", "tensorrt_rtx")
#: The first four bytes of a serialized plan, per builder (TensorRT writes ``ftrt``, TensorRT-RTX
#: ``vtrt``), and the module that deserializes it.
PLAN_MAGICS = {b"ftrt": ("TensorRT", "tensorrt"), b"vtrt": ("TensorRT-RTX", "tensorrt_rtx")}
#: The environment variable naming Edge-LLM's plugin library (its loader sets it to the library file).
PLUGIN_PATH_ENV = "EDGELLM_PLUGIN_PATH"
#: The file name of Edge-LLM's TensorRT plugin library (what ``EDGELLM_PLUGIN_PATH`` names).
PLUGIN_LIBRARY = "libNvInfer_edgellm_plugin.so"

_KEPT_ERRORS = 20  # TensorRT errors a logger bridge keeps for messages
_lock = threading.Lock()
_loggers: dict[str, Any] = {}
# realpath -> handle. Never unloaded: a plugin library registers creators that TensorRT keeps pointers to.
_plugins: dict[str, ctypes.CDLL] = {}


def _first_importable(names: Iterable[str]) -> tuple[ModuleType | None, str]:
    """The first of ``names`` that imports, or None and why each one did not."""
    errors = []
    for name in names:
        try:
            return importlib.import_module(name), ""
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    return None, "; ".join(errors)


def import_trt(module: str | ModuleType = "auto") -> ModuleType:
    """Resolve ``module``: "auto" tries tensorrt, then tensorrt_rtx."""
    if isinstance(module, ModuleType):
        return module
    if module == "auto":
        found, why = _first_importable(KNOWN_MODULES)
        if found is None:
            raise EngineError(f"neither tensorrt nor tensorrt_rtx can be imported ({why})")
        return found
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
                # The latest errors, for messages that explain a failure, and how many were ever logged: a
                # caller marks the count before a call and reads the errors logged after it.
                self._errors: deque[str] = deque(maxlen=_KEPT_ERRORS)
                self.error_count = 0
                self._errors_lock = threading.Lock()

            def log(self, sev: Any, msg: str) -> None:
                level = levels.get(sev, logging.INFO)
                if level >= logging.ERROR:
                    with self._errors_lock:
                        self._errors.append(msg)
                        self.error_count += 1
                log.log(level, "%s", msg)

            def errors_since(self, mark: int) -> list[str]:
                """The errors logged after :attr:`error_count` was ``mark`` (the latest ones kept)."""
                with self._errors_lock:
                    new = min(self.error_count - mark, len(self._errors))
                    return list(self._errors)[len(self._errors) - new:] if new > 0 else []

            def take_errors(self) -> list[str]:
                """The errors kept so far, forgetting them (a caller that owns the module's log for a while)."""
                with self._errors_lock:
                    errors = list(self._errors)
                    self._errors.clear()
                return errors

        bridge = _Bridge()
        _loggers[key] = bridge
        return bridge


def _plugin_entries(plugins: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]) -> list[tuple[str, str]]:
    if isinstance(plugins, (str, os.PathLike)):
        plugins = [plugins]
    entries = [(os.fspath(p), "plugins") for p in plugins]
    from_env = os.environ.get(PLUGIN_PATH_ENV, "").strip()
    if from_env:
        entries.append((from_env, PLUGIN_PATH_ENV))
    return entries


def load_plugins(plugins: Iterable[str | os.PathLike[str]] | str | os.PathLike[str] = ()) -> list[str]:
    """Load TensorRT plugin libraries so that their creators register: the paths in ``plugins``, then the
    one named by ``EDGELLM_PLUGIN_PATH`` (when set and not empty).

    Each library is opened with ``ctypes.CDLL(path, mode=RTLD_GLOBAL)`` once per process (by its real
    path) and stays loaded. ``EDGELLM_PLUGIN_PATH`` names one library file, as Edge-LLM's own loader
    sets and reads it; a directory there (or in ``plugins``) is refused, naming the library file inside
    when it is there. Import the TensorRT module first (:func:`load_engine` does), so that the plugin's
    ``libnvinfer`` dependency resolves to the copy the module loaded. Returns the real paths, in order.
    Raises :class:`EngineError` naming the path for a missing, directory or unloadable library.
    """
    loaded = []
    for path, source in _plugin_entries(plugins):
        loaded.append(_load_plugin(path, source))
    return loaded


def loaded_plugins() -> tuple[str, ...]:
    """The real paths of the plugin libraries loaded so far, in load order."""
    with _lock:
        return tuple(_plugins)


def _load_plugin(path: str, source: str) -> str:
    where = f"plugin library {path!r} (from {source})"
    if not os.path.exists(path):
        raise EngineError(f"{where} does not exist")
    if os.path.isdir(path):
        inside = os.path.join(path, PLUGIN_LIBRARY)
        hint = f"; did you mean {inside!r}?" if os.path.isfile(inside) else ""
        raise EngineError(f"{where} is a directory; {source} names the library file itself (Edge-LLM's is "
                          f"{PLUGIN_LIBRARY}){hint}")
    real = os.path.realpath(path)
    with _lock:
        if real in _plugins:
            return real
        try:
            handle = ctypes.CDLL(real, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise EngineError(f"{where} cannot be loaded: {exc}") from None
        _plugins[real] = handle
    log.info("loaded TensorRT plugin library %s (from %s)", real, source)
    return real


def plan_format(data: bytes) -> tuple[str, str] | None:
    """``(builder, module)`` of a serialized plan from its magic (``("TensorRT-RTX", "tensorrt_rtx")`` for
    ``vtrt``), or None for a ``?trt`` magic trtio does not know (TensorRT decides)."""
    return PLAN_MAGICS.get(bytes(data[:4]))


def _check_plan_header(path: str, data: bytes) -> None:
    """Refuse what is certainly not a plan: every TensorRT / TensorRT-RTX plan begins with a 4-byte magic
    ending in ``trt`` (``ftrt``, ``vtrt``). Anything else would only reach TensorRT to fail there,
    where no GPU means a misleading "no CUDA device" instead."""
    if len(data) >= 4 and data[1:4] == b"trt":
        return
    known = " or ".join(f"{magic.decode()!r} ({name})" for magic, (name, _) in PLAN_MAGICS.items())
    hint = ""
    for magic, (name, _) in PLAN_MAGICS.items():
        at = data.find(magic, 1, 1 << 16)
        if at > 0:
            hint = (f"; a {name} plan seems to start at byte {at} (a wrapper format with a metadata prefix? "
                    "TensorRT needs the bare plan)")
            break
    else:
        if data[:4] == b"\x7fELF":
            hint = "; it is an ELF shared library (a plugin library goes in plugins=, not here)"
        elif data.lstrip()[:1] in (b"{", b"["):
            hint = "; it looks like JSON text (a config?)"
        elif data[:2] == b"PK":
            hint = "; it looks like a zip archive"
        elif data[:1] == b"\x08":
            hint = "; it may be an ONNX model (build a plan from it first)"
    raise EngineError(f"{path!r} ({len(data)} bytes) is not a TensorRT plan: a plan starts with {known}, this file "
                      f"starts with {bytes(data[:8])!r}{hint}")


def _module_for(module: str | ModuleType, fmt: tuple[str, str] | None) -> ModuleType:
    """``module``; for "auto", the module that wrote the plan first, then the other one."""
    if module != "auto" or fmt is None:
        return import_trt(module)
    found, why = _first_importable([fmt[1]] + [m for m in KNOWN_MODULES if m != fmt[1]])
    if found is None:
        raise EngineError(f"this is a {fmt[0]} plan, which needs {fmt[1]}, and no TensorRT module can be imported "
                          f"({why})")
    return found


def load_engine(path: str | os.PathLike[str], module: str | ModuleType = "auto", *,
                plugins: Iterable[str | os.PathLike[str]] | str | os.PathLike[str] = ()) -> Any:
    """Deserialize a plan file with ``module``; raise :class:`EngineError` naming the file and why.

    ``module="auto"`` uses the module the plan's magic names (``ftrt``: tensorrt, ``vtrt``:
    tensorrt_rtx), falling back to the other one. Before deserializing, the plugin libraries in
    ``plugins`` and in ``EDGELLM_PLUGIN_PATH`` are loaded (see :func:`load_plugins`), so that the
    creators of Edge-LLM's ``libNvInfer_edgellm_plugin.so`` are registered. A file that does not start
    like a plan is refused before TensorRT is asked. The returned engine keeps its runtime (and the
    runtime its logger) alive: TensorRT's Python binding ties their lifetimes.
    """
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
    _check_plan_header(path, data)
    fmt = plan_format(data)
    trt = _module_for(module, fmt)
    load_plugins(plugins)
    logger = trt_logger(trt)
    mark = logger.error_count
    try:
        runtime = trt.Runtime(logger)
    except Exception as exc:
        raise EngineError(f"{trt.__name__}.Runtime could not be created: {exc}") from exc
    if runtime is None:
        raise EngineError(f"{trt.__name__}.Runtime could not be created (no usable GPU?)")
    raised: list[str] = []
    try:
        engine = runtime.deserialize_cuda_engine(data)
    except Exception as exc:
        engine = None
        raised.append(str(exc))
    if engine is None:
        why = "; ".join(logger.errors_since(mark) + raised) or "TensorRT gave no reason"
        head = (f"plan file {path!r} ({len(data)} bytes) could not be deserialized with {trt.__name__} "
                f"{getattr(trt, '__version__', '?')}")
        if fmt is not None and fmt[1] != trt.__name__ and trt.__name__ in KNOWN_MODULES:
            head += f" (it is a {fmt[0]} plan, which needs {fmt[1]})"
        if not cuda_available():
            raise EngineError(f"{head}: no usable CUDA device here ({probe_error()}), and TensorRT needs one to "
                              f"load a plan; if the file is also corrupt or truncated, TensorRT's log says so: {why}")
        raise EngineError(f"{head}: corrupt or truncated, or built for another TensorRT version or GPU ({why})")
    return engine
