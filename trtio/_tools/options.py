"""What the ``trtio`` command's options name: a backend, a toy engine directory; and why CUDA is not there.

Errors here speak the command line (``--backend host``), not the Python API (``get_backend('host')``): the
command's users type options, not calls.
"""

from __future__ import annotations

import os
from pathlib import Path

from trtio._cuda.backend import Backend, cuda_available, get_backend
from trtio.errors import ConfigError

__all__ = ["backend_option", "cuda_status", "engine_path"]


def _major(version: str) -> int | None:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def cuda_status() -> str:
    """Why CUDA is or is not usable here, in a user's words: no NVIDIA driver at all, a driver older than the
    installed cuda-python needs (which one to update or pin), or what the CUDA runtime reported."""
    if cuda_available():
        return "a CUDA device answers"
    from trtio._cuda.device import probe_error

    try:
        from cuda import bindings
        from cuda.bindings import driver
    except ImportError:
        return "cuda-python is not installed (pip install cuda-python)"
    try:
        err, version = driver.cuDriverGetVersion()
    except Exception:  # cuda-python raises its own loader error where libcuda cannot be found
        return "no NVIDIA driver is installed: libcuda cannot be loaded"
    if int(err) != 0:
        return f"the NVIDIA driver does not answer ({probe_error()})"
    have, need = int(version) // 1000, _major(getattr(bindings, "__version__", ""))
    if need is not None and have < need:
        return (f"the NVIDIA driver supports CUDA {have}.{int(version) % 1000 // 10}, but cuda-python "
                f"{bindings.__version__} needs a CUDA {need} driver: update the driver, or install the cuda-python of "
                f"its CUDA (pip install 'cuda-python<{have + 1}')")
    return f"no CUDA device answers ({probe_error()})"


def backend_option(value: str, flag: str = "--backend", *, takes_auto: bool = True) -> Backend:
    """The backend an option names (``auto``, ``host``, ``cuda``). ``cuda`` where no device answers is a
    ConfigError naming the option, why, and what to pass instead (``takes_auto``: whether the option takes auto)."""
    if value == "cuda" and not cuda_available():
        instead = f"{flag} host" + (", or auto (which picks the host here)" if takes_auto else "")
        raise ConfigError(flag, f"cuda: no CUDA device is usable here: {cuda_status()}; use {instead}")
    return get_backend(value)


def engine_path(text: str | os.PathLike[str]) -> Path:
    """An engine directory or config the command was given: the path when it exists, else a toy engine directory
    of that name (``toy-llm-ragged``, ``toy-eagle``, ...: :func:`trtio.testing.toy_engine_dir`, from a checkout or
    a wheel), else the path as given (the command then says it does not exist). A bare name that is neither is a
    ConfigError listing the toy engines."""
    path = Path(text)
    if path.exists():
        return path
    from trtio.testing.toy_dirs import TOY_DIRECTORIES, toy_engine_dir

    name = os.fspath(text)
    if name in TOY_DIRECTORIES:
        return toy_engine_dir(name)
    if os.sep not in name and "/" not in name:
        raise ConfigError(name, f"no such file or folder here, nor a toy engine directory (the toy engines are "
                                f"{', '.join(TOY_DIRECTORIES)})")
    return path
