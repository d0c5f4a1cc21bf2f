"""Weight inputs an Edge-LLM engine leaves in the model's checkpoint (``checkpoint_weight_bindings``).

Edge-LLM 0.11's builder may keep some weights out of an engine (a tensor-parallel build does so by default
for the LM head): the engine then declares a static input per weight, and the config lists, for each, the
checkpoint tensor it comes from. :func:`parse_bindings` reads that list; :func:`read_weights` reads the
tensors once from the checkpoint's safetensors files and gives each rank its part: the tensor as stored,
sliced along ``tp_shard["axis"]`` into ``tp_shard["size"]`` equal parts (rank r takes part r), or, for
``tp_rank0_only``, the whole tensor on rank 0 and zeros elsewhere, converted to the binding's dtype. What
this reading assumes where Edge-LLM leaves meaning open is in ``docs/edgellm-assumptions.md`` (section 7).

Only what can be read without Edge-LLM's own transforms is accepted: one checkpoint key per binding,
``source_layout`` ``"fp16"`` (the tensor as stored: F16, BF16 or F32), no ``assemble`` recipe, no plugin
resource, safetensors files only. Anything else is a :class:`~trtio.ConfigError` naming the binding.
Bindings whose ``role`` is ``"embedding"`` or ``"ple_embedding"`` describe the runtime's lookup tables, not
engine inputs, and are skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtio._checks import is_int
from trtio._safetensors import SafeTensor, bf16_to_float32, read_safetensors
from trtio.errors import ConfigError

__all__ = ["BINDINGS_KEY", "CheckpointBinding", "checkpoint_directory", "parse_bindings", "read_weights"]

#: The config key that lists the weight inputs left in the checkpoint.
BINDINGS_KEY = "checkpoint_weight_bindings"
_INDEX_FILE = "model.safetensors.index.json"
_LOOKUP_ROLES = ("embedding", "ple_embedding")  # the runtime's tables: not engine inputs
_DTYPES: dict[str, np.dtype[Any]] = {"F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "BF16": np.dtype("<u2")}
# Fields a binding may carry that do not change how trtio reads it.
_IGNORED = {"engine_name", "checkpoint_keys", "source_layout", "dtype", "shape", "tp_shard", "tp_rank0_only", "role",
            "checkpoint_source"}


@dataclass(frozen=True)
class CheckpointBinding:
    """One engine input filled from the checkpoint: its name, the checkpoint tensor, the input's dtype
    (safetensors tag) and rank-local shape, and how ranks share it (``tp_shard`` (axis, parts) or
    ``tp_rank0_only``; neither: every rank holds the whole tensor)."""

    engine_name: str
    checkpoint_key: str
    dtype: str
    shape: tuple[int, ...]
    tp_shard: tuple[int, int] | None = None
    tp_rank0_only: bool = False


def _entry_error(where: str, i: int, key: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {BINDINGS_KEY}[{i}]" + (f".{key}" if key else ""), message)


def parse_bindings(raw: Any, where: str, tp_size: int = 1) -> tuple[CheckpointBinding, ...]:
    """The engine inputs ``raw`` (the config's ``checkpoint_weight_bindings``; None: none) fills from the
    checkpoint, checked. ``where`` names the config file in errors; ``tp_size`` is the directory's rank count
    (a ``tp_shard`` must split into that many parts)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: {BINDINGS_KEY}", f"expected a list of bindings, got {type(raw).__name__}")
    out = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise _entry_error(where, i, "", f"expected an object, got {type(entry).__name__}")
        if entry.get("role") in _LOOKUP_ROLES:
            continue
        name = entry.get("engine_name")
        if not isinstance(name, str) or not name:
            raise _entry_error(where, i, "engine_name", f"expected the engine input's name, got {name!r}")
        if name in seen:
            raise _entry_error(where, i, "engine_name", f"{name!r} is bound twice")
        seen.add(name)
        out.append(_parse_entry(entry, name, where, i, tp_size))
    return tuple(out)


def _parse_entry(entry: Mapping[str, Any], name: str, where: str, i: int, tp_size: int) -> CheckpointBinding:
    keys = entry.get("checkpoint_keys")
    if not isinstance(keys, list) or len(keys) != 1 or not isinstance(keys[0], str):
        raise _entry_error(where, i, "checkpoint_keys", f"{name}: trtio reads a weight from exactly one checkpoint "
                                                        f"tensor, got {keys!r}")
    layout = entry.get("source_layout", "plugin")
    if layout != "fp16":
        raise _entry_error(where, i, "source_layout", f"{name}: is {layout!r}; trtio reads 'fp16' weights (the "
                                                      "tensor as stored) only; other layouts need Edge-LLM's own "
                                                      "transforms")
    unknown = sorted(set(entry) - _IGNORED)
    if unknown:
        raise _entry_error(where, i, unknown[0], f"{name}: trtio does not read weights that need {unknown} "
                                                 "(Edge-LLM's assembled, plugin-resource or .bin weights)")
    source = entry.get("checkpoint_source", "component")
    if source != "component":
        raise _entry_error(where, i, "checkpoint_source", f"{name}: is {source!r}; trtio reads the model's own "
                                                          "checkpoint ('component') only")
    dtype = entry.get("dtype")
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise _entry_error(where, i, "dtype", f"{name}: expected one of {sorted(_DTYPES)}, got {dtype!r}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not shape or not all(is_int(d) and d > 0 for d in shape):
        raise _entry_error(where, i, "shape", f"{name}: expected a list of positive ints, got {shape!r}")
    shard = entry.get("tp_shard")
    rank0 = entry.get("tp_rank0_only", False)
    if not isinstance(rank0, bool):
        raise _entry_error(where, i, "tp_rank0_only", f"{name}: expected true or false, got {rank0!r}")
    split = None
    if shard is not None:
        if rank0:
            raise _entry_error(where, i, "tp_shard", f"{name}: has both tp_shard and tp_rank0_only")
        if not isinstance(shard, Mapping) or not is_int(shard.get("axis")) or not is_int(shard.get("size")):
            raise _entry_error(where, i, "tp_shard", f"{name}: expected {{'axis': int, 'size': int}}, got {shard!r}")
        axis, size = int(shard["axis"]), int(shard["size"])
        if not 0 <= axis < len(shape):
            raise _entry_error(where, i, "tp_shard.axis", f"{name}: axis {axis} is outside the input's "
                                                          f"{len(shape)} dims {shape}")
        if size != tp_size:
            raise _entry_error(where, i, "tp_shard.size", f"{name}: splits into {size} parts, but the directory has "
                                                          f"{tp_size} rank(s)")
        split = (axis, size)
    return CheckpointBinding(name, keys[0], str(dtype), tuple(int(d) for d in shape), split, rank0)


def checkpoint_directory(config_dir: Path, raw: Any, where: str,
                         override: str | os.PathLike[str] | None = None) -> Path:
    """The checkpoint directory a config's weight inputs come from: ``override`` where given, else the
    config's ``checkpoint_dir`` (relative to the config's directory). ConfigError where neither is there."""
    if override is not None:
        if not isinstance(override, (str, os.PathLike)):
            raise ConfigError("checkpoint_dir", f"expected the path of the model's safetensors checkpoint, got "
                                                f"{type(override).__name__} {override!r}")
        path = Path(override)
        what = "checkpoint_dir (given)"
    else:
        if not isinstance(raw, str) or not raw:
            raise ConfigError(f"{where}: checkpoint_dir", f"is {'absent' if raw is None else repr(raw)}, and the "
                                                          f"engines read weights from the checkpoint ({BINDINGS_KEY});"
                                                          " pass checkpoint_dir= with the model's safetensors")
        path = Path(raw)
        if not path.is_absolute():
            path = Path(os.path.normpath(config_dir / path))
        what = f"{where}: checkpoint_dir"
    if not path.is_dir():
        raise ConfigError(what, f"{str(path)!r} is not a directory (the engines read weights from the model's "
                                "safetensors checkpoint there)")
    return path


def _tensor_files(directory: Path, opened: dict[Path, dict[str, SafeTensor]]) -> dict[str, Path]:
    """Checkpoint tensor name -> its safetensors file: from ``model.safetensors.index.json`` where present,
    else from every ``*.safetensors`` file of the directory (read into ``opened``)."""
    index = directory / _INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map")
        except (OSError, ValueError, AttributeError) as exc:
            raise ConfigError(str(index), f"is not a safetensors index ({exc})") from None
        if not isinstance(weight_map, Mapping):
            raise ConfigError(f"{index}: weight_map", "expected an object: tensor name -> file")
        for k, v in weight_map.items():
            if not isinstance(v, str) or not v or Path(v).name != v or v in (".", ".."):
                raise ConfigError(f"{index}: weight_map.{k}", f"expected the name of a safetensors file beside the "
                                                              f"index, got {v!r}")
        return {str(k): directory / v for k, v in weight_map.items()}
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ConfigError(str(directory), "holds no *.safetensors file (the engines read weights from the model's "
                                          "safetensors checkpoint)")
    out: dict[str, Path] = {}
    for file in files:
        opened[file] = read_safetensors(file)
        for name in opened[file]:
            out.setdefault(name, file)
    return out


def _as_dtype(t: SafeTensor, dtype: str, where: str) -> np.ndarray:
    """The stored tensor in the binding's dtype (F16 / F32 values, or BF16 bits)."""
    if t.dtype == dtype:
        return t.array
    if t.dtype not in ("F16", "F32", "BF16") or dtype == "BF16":
        raise ConfigError(where, f"is stored as {t.dtype}; the engine input is {dtype} (trtio converts F16, BF16 "
                                 "and F32 tensors to F16 or F32)")
    values = bf16_to_float32(t.array) if t.dtype == "BF16" else t.array
    out: np.ndarray = np.asarray(values).astype(_DTYPES[dtype])
    return out


def read_weights(bindings: Sequence[CheckpointBinding], directory: Path, tp_size: int,
                 where: str) -> list[dict[str, np.ndarray]]:
    """Each rank's weight inputs (``[rank][engine_name]``, new C-contiguous arrays), read once from the
    checkpoint in ``directory``. ConfigError naming the binding where a tensor is missing or its part does
    not have the binding's shape."""
    opened: dict[Path, dict[str, SafeTensor]] = {}
    files = _tensor_files(directory, opened) if bindings else {}
    per_rank: list[dict[str, np.ndarray]] = [{} for _ in range(tp_size)]
    for b in bindings:
        file = files.get(b.checkpoint_key)
        if file is None:
            raise ConfigError(f"{where}: {BINDINGS_KEY}", f"{b.engine_name}: the checkpoint {directory} holds no "
                                                          f"tensor {b.checkpoint_key!r}")
        if file not in opened:
            opened[file] = read_safetensors(file)
        stored = opened[file].get(b.checkpoint_key)
        if stored is None:
            raise ConfigError(str(file), f"holds no tensor {b.checkpoint_key!r} (its index says it does)")
        full = _as_dtype(stored, b.dtype, f"{file}: {b.checkpoint_key}")
        if full.ndim != len(b.shape):
            raise ConfigError(f"{where}: {BINDINGS_KEY}", f"{b.engine_name}: {b.checkpoint_key} is {list(full.shape)} "
                                                          f"({full.ndim} dims), the engine input {list(b.shape)} "
                                                          f"({len(b.shape)} dims)")
        if b.tp_shard is not None and full.shape[b.tp_shard[0]] % b.tp_shard[1]:
            axis, parts = b.tp_shard
            raise ConfigError(f"{where}: {BINDINGS_KEY}", f"{b.engine_name}: {b.checkpoint_key} {list(full.shape)} "
                                                          f"does not split into {parts} equal parts along axis {axis}")
        for rank in range(tp_size):
            part = _rank_part(full, b, rank)
            if part.shape != b.shape:
                raise ConfigError(f"{where}: {BINDINGS_KEY}", f"{b.engine_name}: rank {rank}'s part of "
                                                              f"{b.checkpoint_key} {list(full.shape)} is "
                                                              f"{list(part.shape)}, the engine input is "
                                                              f"{list(b.shape)}")
            per_rank[rank][b.engine_name] = part
    return per_rank


def _rank_part(full: np.ndarray, b: CheckpointBinding, rank: int) -> np.ndarray:
    if b.tp_shard is not None:
        axis, parts = b.tp_shard
        width = full.shape[axis] // parts
        index = [slice(None)] * full.ndim
        index[axis] = slice(rank * width, (rank + 1) * width)
        return np.ascontiguousarray(full[tuple(index)])
    if b.tp_rank0_only and rank != 0:
        return np.zeros(full.shape, full.dtype)
    return np.ascontiguousarray(full)
