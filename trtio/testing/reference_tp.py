"""Tensor parallelism for :class:`~trtio.testing.ReferenceEngine` rank engines: how they all-reduce.

A rank engine of a tensor-parallel directory computes its share of the toy model (its attention heads and its
part of the MLP) and sums the partial outputs of every rank twice per layer, after the attention output and
after the MLP, as Edge-LLM's ``AllReducePlugin`` does. Like the plugin, it finds the communicator of the
device it runs on when it runs, in a table trtio's tensor-parallel setup filled before:

* :class:`HostAllReduce` (the host backend): the communicator :func:`trtio._collectives.communicator` gives
  for the calling thread's host device;
* :class:`PluginAllReduce` (GPUs): the NCCL communicator and ``ncclAllReduce`` that trtio registered through
  ``edgellmRegisterNcclCommForAllReducePlugin`` of a stand-in plugin library. Edge-LLM's own plugin library
  needs TensorRT and a supported GPU; :data:`STAND_IN_PLUGIN_SOURCE` is a small C library exporting the same
  register and unregister functions (trtio's registration code cannot tell it from the plugin) plus
  ``trtioStandInLookup(device, &comm, &fn)``, which :class:`PluginAllReduce` calls through ctypes.
  :func:`build_stand_in_plugin` compiles it with the C compiler at hand (``cc``, ``gcc`` or ``clang``).

:func:`rank_weights` cuts a rank's share out of the whole model's weights.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from trtio import _collectives as collectives
from trtio.errors import EngineError, InvalidValueError
from trtio.testing.toy_model import ToyWeights

__all__ = ["STAND_IN_PLUGIN_SOURCE", "AllReduce", "HostAllReduce", "PluginAllReduce", "build_stand_in_plugin",
           "rank_weights"]

_NCCL_FLOAT32 = 7  # ncclDataType_t ncclFloat32
_NCCL_SUM = 0  # ncclRedOp_t ncclSum


class AllReduce(Protocol):
    """What a rank engine calls to sum its float32 partial outputs over the ranks: ``xp`` is numpy or CuPy,
    ``stream`` the handle the engine's work is enqueued on; returns the sum (may be ``partial`` itself)."""

    def __call__(self, xp: Any, partial: Any, stream: int) -> Any: ...


class HostAllReduce:
    """The host backend's all-reduce: through the communicator registered for the calling thread's host
    device (:mod:`trtio._collectives`), looked up at every call, as the plugin looks its NCCL path up."""

    def __call__(self, xp: Any, partial: Any, stream: int) -> Any:
        return collectives.communicator().all_reduce(partial)

    def __repr__(self) -> str:
        return "HostAllReduce()"


STAND_IN_PLUGIN_SOURCE = r"""
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#define TRTIO_MAX_DEVICES 256
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static void* comms[TRTIO_MAX_DEVICES];
static void* functions[TRTIO_MAX_DEVICES];

bool edgellmRegisterNcclCommForAllReducePlugin(int device, void* comm, void* fn) {
    if (device < 0 || device >= TRTIO_MAX_DEVICES || comm == NULL || fn == NULL) return false;
    pthread_mutex_lock(&table_lock);
    comms[device] = comm;
    functions[device] = fn;
    pthread_mutex_unlock(&table_lock);
    return true;
}

bool edgellmUnregisterNcclCommForAllReducePlugin(int device, void* comm) {
    bool found = false;
    if (device < 0 || device >= TRTIO_MAX_DEVICES || comm == NULL) return false;
    pthread_mutex_lock(&table_lock);
    if (comms[device] == comm) {
        comms[device] = NULL;
        functions[device] = NULL;
        found = true;
    }
    pthread_mutex_unlock(&table_lock);
    return found;
}

int trtioStandInLookup(int device, void** comm, void** fn) {
    if (device < 0 || device >= TRTIO_MAX_DEVICES) return 0;
    pthread_mutex_lock(&table_lock);
    *comm = comms[device];
    *fn = functions[device];
    pthread_mutex_unlock(&table_lock);
    return *comm != NULL && *fn != NULL;
}
"""


def build_stand_in_plugin(out_dir: str | os.PathLike[str], *, name: str = "libtrtio_standin_allreduce.so",
                          source: str = STAND_IN_PLUGIN_SOURCE) -> Path:
    """Compile ``source`` (default: the stand-in plugin) into the shared library ``out_dir/name``; EngineError
    where no C compiler is found or it fails."""
    compiler = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if compiler is None:
        raise EngineError("build_stand_in_plugin: no C compiler (cc, gcc or clang) on PATH")
    out = Path(out_dir) / name
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "standin.c"
        src.write_text(source)
        done = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(src), "-lpthread"],
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise EngineError(f"build_stand_in_plugin: {compiler} failed: {done.stderr.strip()}")
    return out


class PluginAllReduce:
    """The GPU all-reduce: ``ncclAllReduce`` (float32 sum, in place, on the engine's stream) through the
    communicator registered for the current CUDA device in the stand-in plugin library at ``library``."""

    def __init__(self, library: str | os.PathLike[str]) -> None:
        self.library = os.fspath(library)
        lib = ctypes.CDLL(self.library)
        self._lookup = lib.trtioStandInLookup
        self._lookup.restype = ctypes.c_int
        self._lookup.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
        self._call = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)

    def __call__(self, xp: Any, partial: Any, stream: int) -> Any:
        device = int(xp.cuda.runtime.getDevice())
        comm, fn = ctypes.c_void_p(), ctypes.c_void_p()
        if not self._lookup(device, ctypes.byref(comm), ctypes.byref(fn)):
            raise EngineError(f"AllReducePlugin stand-in: no NCCL path is registered for device {device} in "
                              f"{self.library}")
        partial = xp.ascontiguousarray(partial, dtype=xp.float32)
        ptr = int(partial.data.ptr)
        status = self._call(int(fn.value or 0))(ptr, ptr, int(partial.size), _NCCL_FLOAT32, _NCCL_SUM, comm.value,
                                                 stream)
        if status != 0:
            raise EngineError(f"AllReducePlugin stand-in: ncclAllReduce on device {device} failed with error "
                              f"{status}")
        return partial

    def __repr__(self) -> str:
        return f"PluginAllReduce({self.library!r})"


def rank_weights(weights: ToyWeights, rank: int, size: int, heads: int, kv_heads: int, head_dim: int) -> ToyWeights:
    """Rank ``rank``'s share of the whole model's ``weights`` for ``size`` ranks of ``heads`` attention heads and
    ``kv_heads`` KV heads each (of ``head_dim``): its query heads ``rank * heads ..``, the KV heads they read
    (a contiguous run; where the model has fewer KV heads than ranks, the one KV head, which several ranks then
    hold), the rows of ``wo`` of its heads, and its ``1 / size`` of the MLP's width (``w1`` columns, ``w2``
    rows). The LM head and the draft's input projections are whole on every rank. InvalidValueError where the
    weights do not split so."""
    d = head_dim
    total_q = weights.wq[0].shape[1] // d if weights.wq else 0
    total_kv = weights.wk[0].shape[1] // d if weights.wk else 0
    width = weights.w1[0].shape[1] if weights.w1 else 0
    if total_q != heads * size or not total_kv or total_q % total_kv or width % size:
        raise InvalidValueError(f"rank_weights: the weights ({total_q} heads, {total_kv} KV heads of {d}, MLP width "
                                f"{width}) do not split into {size} ranks of {heads} heads and {kv_heads} KV heads")
    group = total_q // total_kv
    q_lo = rank * heads
    kv_lo, kv_hi = q_lo // group, (q_lo + heads - 1) // group + 1
    if kv_hi - kv_lo != kv_heads:
        raise InvalidValueError(f"rank_weights: rank {rank}'s heads {q_lo}..{q_lo + heads - 1} read KV heads "
                                f"{kv_lo}..{kv_hi - 1}, not {kv_heads} of them")
    f = width // size
    q = slice(q_lo * d, (q_lo + heads) * d)
    kv = slice(kv_lo * d, kv_hi * d)
    mlp = slice(rank * f, (rank + 1) * f)

    def part(arrays: tuple[np.ndarray, ...], cols: slice | None = None, rows: slice | None = None) -> tuple[
            np.ndarray, ...]:
        return tuple(np.ascontiguousarray(a[rows if rows is not None else slice(None),
                                            cols if cols is not None else slice(None)]) for a in arrays)

    return dataclasses.replace(weights, wq=part(weights.wq, cols=q), wk=part(weights.wk, cols=kv),
                               wv=part(weights.wv, cols=kv), wo=part(weights.wo, rows=q),
                               w1=part(weights.w1, cols=mlp), w2=part(weights.w2, rows=mlp))
