"""NCCL communicators for tensor-parallel engines on GPUs, and their registration with Edge-LLM's plugin.

Edge-LLM 0.11's rank engines all-reduce inside themselves through its ``AllReducePlugin``, which finds the
NCCL communicator of its GPU in a process-wide table of the plugin library. Edge-LLM's runtime creates one
communicator per GPU with ``ncclCommInitAll`` (one process, one thread per rank) and fills the table through
two C functions the plugin library exports (read from the 0.11 plugin library's symbols and machine code;
``docs/edgellm-assumptions.md``, section 7)::

    bool edgellmRegisterNcclCommForAllReducePlugin(int device, void* ncclComm, void* ncclAllReduceFn);
    bool edgellmUnregisterNcclCommForAllReducePlugin(int device, void* ncclComm);

trtio does the same: :class:`NcclCommunicators` makes the communicators with NVIDIA's ``nccl4py`` (the
optional extra ``trtio[tp]``; imported only here, only for a tensor-parallel setup on GPUs) and
:class:`PluginRegistration` calls the plugin library's register function for each device before the engines
first run, and its unregister function on close. A plugin library without the function, or a registration
it refuses, is an :class:`~trtio.EngineError` at setup time rather than a hang at the first step.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Sequence
from typing import Any

from trtio._lifetime import Closeable
from trtio.errors import EngineError

__all__ = ["REGISTER_FUNCTION", "UNREGISTER_FUNCTION", "NcclCommunicators", "PluginRegistration", "import_nccl"]

log = logging.getLogger("trtio")

#: What Edge-LLM's plugin library exports to take a device's communicator and ``ncclAllReduce``.
REGISTER_FUNCTION = "edgellmRegisterNcclCommForAllReducePlugin"
#: ... and to forget it again.
UNREGISTER_FUNCTION = "edgellmUnregisterNcclCommForAllReducePlugin"
_INSTALL = "pip install 'trtio[tp]' (NVIDIA's nccl4py, with libnccl from nvidia-nccl-cu12 or -cu13)"


def import_nccl() -> Any:
    """``nccl.core`` (nccl4py), or an EngineError saying how to install it."""
    try:
        import nccl.core as nccl_core  # noqa: PLC0415 - optional extra, only for tensor parallelism on GPUs
    except ImportError as exc:
        raise EngineError(f"a tensor-parallel engine directory on GPUs needs nccl4py for its NCCL communicators, "
                          f"which cannot be imported ({exc}): {_INSTALL}") from None
    return nccl_core


def _all_reduce_address() -> int:
    """The address of ``ncclAllReduce`` in the libnccl nccl4py uses (cuda.pathfinder loads it once per
    process; dlopen of the same file returns the same library)."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # noqa: PLC0415 - only with nccl4py

        lib = ctypes.CDLL(load_nvidia_dynamic_lib("nccl").abs_path)
        address = ctypes.cast(lib.ncclAllReduce, ctypes.c_void_p).value
    except (ImportError, OSError, AttributeError, RuntimeError) as exc:
        raise EngineError(f"cannot find ncclAllReduce in libnccl ({exc}): {_INSTALL}") from None
    if not address:
        raise EngineError("libnccl exports no ncclAllReduce")
    return int(address)


class NcclCommunicators(Closeable):
    """One NCCL communicator per device of ``devices`` (rank i on ``devices[i]``), made together with nccl4py's
    ``Communicator.init_all`` (``ncclCommInitAll``: one process, no unique id). ``pointers`` are the
    ``ncclComm_t`` values and ``all_reduce_function`` the address of ``ncclAllReduce`` that Edge-LLM's plugin
    calls. :meth:`abort` ends every communicator at once, stopping collectives in flight (a rank failed);
    :meth:`close` finalizes and destroys them (all ranks together, as NCCL requires of one thread)."""

    def __init__(self, devices: Sequence[int]) -> None:
        nccl = import_nccl()
        self._nccl = nccl
        self.devices = tuple(int(d) for d in devices)
        self.all_reduce_function = _all_reduce_address()  # first: nothing to undo if libnccl is unusable
        try:
            self._comms = list(nccl.Communicator.init_all(list(self.devices)))
        except Exception as exc:  # nccl4py raises its own error types
            raise EngineError(f"ncclCommInitAll on devices {list(self.devices)} failed: {exc}") from None
        self._aborted = False
        self._init_lifetime(f"NCCL communicators of devices {list(self.devices)}")

    @property
    def pointers(self) -> tuple[int, ...]:
        self._check_open()
        return tuple(int(c.ptr) for c in self._comms)

    @property
    def aborted(self) -> bool:
        return self._aborted

    def abort(self) -> None:
        """``ncclCommAbort`` every communicator: collectives waiting for a rank that never comes end (the
        communicators are unusable afterwards)."""
        if self._aborted or self._closed:
            return
        self._aborted = True
        for comm in self._comms:
            with contextlib.suppress(Exception):  # abort is best effort: every communicator is tried
                comm.abort()

    def _close_owned(self) -> None:
        if self._aborted:
            return
        try:
            with self._nccl.group():  # one thread manages every rank: finalize together, or it hangs
                for comm in self._comms:
                    comm.finalize()
        finally:
            for comm in self._comms:
                comm.destroy()


def _function(path: str, name: str, argtypes: list[Any]) -> Any:
    """``name`` in the (already loaded) library at ``path`` as a ctypes function returning bool, or None."""
    try:
        fn = getattr(ctypes.CDLL(path), name)
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_bool
    fn.argtypes = argtypes
    return fn


class PluginRegistration(Closeable):
    """The communicators of ``devices`` registered with the plugin libraries (``libraries``: paths of loaded
    libraries, e.g. :func:`trtio._trt.load_plugins`' result) that export :data:`REGISTER_FUNCTION`; every
    such library is told (a process may load Edge-LLM's plugin once under each of several names).
    ``comms[i]`` is device ``devices[i]``'s ``ncclComm_t``, ``all_reduce`` the address of ``ncclAllReduce``.

    EngineError, nothing left registered, where no library exports the function or one refuses a
    registration. :meth:`close` unregisters (where the library exports :data:`UNREGISTER_FUNCTION`)."""

    def __init__(self, libraries: Sequence[str | os.PathLike[str]], devices: Sequence[int], comms: Sequence[int],
                 all_reduce: int) -> None:
        paths = [os.fspath(p) for p in libraries]
        self._entries: list[tuple[str, int, int]] = []  # (library, device, comm) registered
        self._unregister: dict[str, Any] = {}
        register = {p: fn for p in paths
                    if (fn := _function(p, REGISTER_FUNCTION, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]))}
        if not register:
            listed = ", ".join(repr(p) for p in paths) or "none"
            raise EngineError(f"no plugin library loaded here exports {REGISTER_FUNCTION} (loaded: {listed}); "
                              "Edge-LLM's AllReducePlugin finds each rank's NCCL communicator through it: load "
                              "Edge-LLM 0.11's libNvInfer_edgellm_plugin.so (plugins= or EDGELLM_PLUGIN_PATH)")
        self._init_lifetime(f"AllReducePlugin registration of devices {list(devices)}")
        try:
            for path, fn in register.items():
                self._unregister[path] = _function(path, UNREGISTER_FUNCTION, [ctypes.c_int, ctypes.c_void_p])
                for device, comm in zip(devices, comms):
                    if not fn(int(device), ctypes.c_void_p(int(comm)), ctypes.c_void_p(int(all_reduce))):
                        raise EngineError(f"{REGISTER_FUNCTION}(device={device}, comm=0x{int(comm):x}, "
                                          f"ncclAllReduce=0x{int(all_reduce):x}) returned false in {path!r}: the "
                                          "plugin refused the communicator")
                    self._entries.append((path, int(device), int(comm)))
        except BaseException:
            self.close()
            raise

    @property
    def libraries(self) -> tuple[str, ...]:
        """The libraries the communicators were registered with."""
        return tuple(dict.fromkeys(path for path, _, _ in self._entries))

    def _close_owned(self) -> None:
        entries, self._entries = self._entries, []
        for path, device, comm in reversed(entries):
            fn = self._unregister.get(path)
            if fn is None:
                continue  # a library without the function: the next registration of the device replaces it
            if not fn(device, ctypes.c_void_p(comm)):
                log.warning("%s(device=%d, comm=0x%x) returned false in %s: the plugin no longer held it",
                            UNREGISTER_FUNCTION, device, comm, path)
