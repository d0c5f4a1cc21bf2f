"""Binding tables: each engine tensor, what the engine declares, and the trtio tensor bound to it.

A setup (``create_for_llm`` / ``create_for_spec_decode``) binds every engine I/O to one trtio
tensor: a :class:`~trtio._pipeline_io.PipelineIO` member, a tensor of the engine's state (a KV cache or paged
pool, bound under both its input and its ``present_*`` name; the ``kvcache_start_index`` lengths;
the ``kv_page_table``) or the shared RoPE table. :func:`binding_labels` names that tensor for every
engine tensor, by identity, from the setup's own tensor maps; :func:`binding_rows` adds what is bound
right now (shape, dtype, address); :func:`engine_rows` describes an engine's declared I/O
(per-profile ranges, aliasing, bytes at the max shape); :func:`check_fits` refuses a config whose
bindings an engine cannot take. ``trtio demo`` and ``trtio inspect`` print these; every row is a
JSON-able dict.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from trtio import names
from trtio._config import LLMEngineConfig
from trtio._contracts import build_registry
from trtio._engine import EngineIO, TensorInfo
from trtio._setups import SetupBase, check_engine
from trtio._tensor import Tensor
from trtio.errors import BindingError, ConfigError

__all__ = ["binding_capacities", "binding_labels", "binding_rows", "check_fits", "engine_rows", "format_binding_table",
           "format_bytes", "format_engine_table", "format_shape", "setup_engines"]


def setup_engines(setup: SetupBase) -> list[tuple[str, Any, Any, Any]]:
    """``(role, executor, tensor_map, state)`` for each engine of ``setup`` ("llm", or "base" and "draft")."""
    return [(e.role, e.executor, e.tensor_map, e.state) for e in setup.engines()]


def _owners(setup: SetupBase) -> dict[int, str]:
    io = setup.io
    owners: dict[int, str] = {}
    for member in io.members:
        value = getattr(io, member, None)
        if isinstance(value, Tensor):
            owners[id(value)] = f"PipelineIO.{member}"
    for i, t in enumerate(io.deepstack_embeds):
        owners[id(t)] = f"PipelineIO.deepstack_embeds[{i}]"
    for role, _executor, _tm, state in setup_engines(setup):
        for past, t in state.tensors.items():
            owners[id(t)] = f"state[{role}].{past}"
        owners[id(state.kv_lengths)] = f"state[{role}].kv_lengths"
        page_table = getattr(state, "page_table", None)
        if page_table is not None:
            owners[id(page_table)] = f"state[{role}].kv_page_table"
    return owners


def _label(t: Tensor, owners: dict[int, str]) -> str:
    label = owners.get(id(t))
    if label is not None:
        return label
    if t.name == names.kRopeCosSin:
        return "rope table (shared)"
    return f"tensor {t.name!r}"


def binding_capacities(setup: SetupBase) -> dict[str, dict[str, int]]:
    """``{role: {engine tensor name: bytes of the trtio tensor bound to it}}``."""
    out: dict[str, dict[str, int]] = {}
    for role, executor, tm, _state in setup_engines(setup):
        out[role] = {info.name: tm[info.name].capacity for info in executor.io.tensors if info.name in tm}
    return out


def binding_labels(setup: SetupBase) -> dict[str, dict[str, str]]:
    """``{role: {engine tensor name: trtio tensor it binds to}}`` for every engine of ``setup``.

    Engine tensors the setup leaves unbound are absent (an executor's ``prepare`` would refuse them).
    """
    owners = _owners(setup)
    out: dict[str, dict[str, str]] = {}
    for role, executor, tm, _state in setup_engines(setup):
        out[role] = {info.name: _label(tm[info.name], owners) for info in executor.io.tensors if info.name in tm}
    return out


def _shape(shape: Sequence[int]) -> list[int]:
    return [int(d) for d in shape]


def engine_rows(engine_io: EngineIO, labels: dict[str, str] | None = None,
                capacities: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """One dict per engine tensor: ``TensorInfo.to_dict()`` plus ``binding`` (the trtio tensor it binds
    to, None when unknown or unbound), ``max_shape`` and ``max_bytes``.

    For inputs the max is over every profile. An output's dynamic dims follow from its inputs: one
    that aliases an input has that input's max; another is given ``capacities[name]`` (the bytes of
    the trtio tensor it is bound to, sized for the worst case) where known. ``max_bytes`` is -1 and
    ``max_shape`` keeps its -1 dims where neither says.
    """
    by_name = {info.name: info for info in engine_io.tensors}
    rows = []
    for info in engine_io.tensors:
        row = info.to_dict()
        source = info
        if not info.is_input and info.aliased_input in by_name:
            source = by_name[info.aliased_input]
        row["max_shape"] = _shape(_max_shape(source))
        row["max_bytes"] = _max_bytes(source)
        if row["max_bytes"] < 0 and capacities and info.name in capacities:
            row["max_bytes"] = int(capacities[info.name])
        row["binding"] = (labels or {}).get(info.name)
        rows.append(row)
    return rows


def _max_shape(info: TensorInfo) -> tuple[int, ...]:
    # An engine that reports no dims for a static input's profile (nbDims -1) still has its static shape.
    profiles = [p for p in info.profiles if all(len(dims) == len(info.shape) for dims in p)]
    if not profiles:
        return info.shape
    return tuple(max(p[2][i] for p in profiles) for i in range(len(info.shape)))


def _max_bytes(info: TensorInfo) -> int:
    shape = _max_shape(info)
    if any(d < 0 for d in shape):
        return -1
    n = 1
    for d in shape:
        n *= d
    return info.dtype.nbytes(n)


def binding_rows(setup: SetupBase) -> dict[str, list[dict[str, Any]]]:
    """What each engine of ``setup`` has bound now: ``{role: [row, ...]}`` in the engine's I/O order.

    Row keys: ``engine_tensor``, ``mode``, ``binding`` (the trtio tensor), ``shape`` (the shape the
    engine's execution context holds for the name: its last step's), ``view_shape`` (the trtio
    tensor's current view, which a later step of another engine may have changed), ``dtype``,
    ``location``, ``address`` (its ``data_ptr``, 0 for an empty tensor), ``capacity`` (bytes) and
    ``engine_address`` (what the execution context holds for the name: 0 before the first step,
    None where the context cannot say; an empty tensor is bound to a small dummy buffer instead of
    its own address).
    """
    owners = _owners(setup)
    out: dict[str, list[dict[str, Any]]] = {}
    # A spec-decode draft binds some names to other tensors in its catch-up (its own tree inputs): where the
    # execution context holds one of those now, that is the row's tensor.
    catch_up = getattr(setup, "_catch_up_map", None)
    for role, executor, tm, _state in setup_engines(setup):
        rows = []
        context = executor.context
        other = catch_up if role == "draft" and catch_up is not tm else None
        for info in executor.io.tensors:
            t = tm.get(info.name)
            engine_address = engine_shape = None
            if context is not None and hasattr(context, "get_tensor_address"):
                engine_address = int(context.get_tensor_address(info.name))
                alt = other.get(info.name) if other is not None else None
                if alt is not None and alt is not t and alt.data_ptr == engine_address:
                    t = alt
            if context is not None and hasattr(context, "get_tensor_shape"):
                engine_shape = _shape(context.get_tensor_shape(info.name))
            if t is None:
                rows.append({"engine_tensor": info.name, "mode": info.mode, "binding": None, "shape": engine_shape,
                             "view_shape": None, "dtype": str(info.dtype), "location": str(info.location),
                             "address": None, "capacity": 0, "engine_address": engine_address})
                continue
            rows.append({
                "engine_tensor": info.name, "mode": info.mode, "binding": _label(t, owners),
                "shape": engine_shape if engine_shape is not None else _shape(t.shape), "view_shape": _shape(t.shape),
                "dtype": str(t.dtype), "location": str(t.location), "address": t.data_ptr, "capacity": t.capacity,
                "engine_address": engine_address,
            })
        out[role] = rows
    return out


# -- text -------------------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "  ") -> list[str]:
    rows = [list(header)] + [list(r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for i, r in enumerate(rows):
        lines.append(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return lines


def format_shape(shape: Sequence[int] | None) -> str:
    """``[4,64]``; ``-`` for None."""
    return "-" if shape is None else "[" + ",".join(str(d) for d in shape) + "]"


def format_bytes(n: int) -> str:
    """``1.50 MiB``; ``unbounded`` for a negative count (a dynamic dim without a bound)."""
    if n < 0:
        return "unbounded"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def format_binding_table(rows: list[dict[str, Any]]) -> list[str]:
    """Lines: engine tensor -> trtio tensor, bound shape, dtype, address (and a mark where the
    execution context holds another address)."""
    body = []
    for r in rows:
        addr = "-" if r["address"] is None else (f"0x{r['address']:x}" if r["capacity"] else "(empty: dummy)")
        eng = r["engine_address"]
        if eng and r["capacity"] and eng != r["address"]:
            addr += f"  !! context holds 0x{eng:x}"
        arrow = "->" if r["mode"] == "input" else "<-"
        body.append((r["engine_tensor"], arrow, r["binding"] or "UNBOUND", format_shape(r["shape"]), r["dtype"], addr))
    return _table(("engine tensor", "", "trtio tensor", "shape", "dtype", "address"), body)


def format_engine_table(rows: list[dict[str, Any]], num_profiles: int) -> list[str]:
    """Lines: the declared I/O (name, mode, dtype, shape, location, per-profile min/opt/max, alias,
    bytes at the max shape) and the trtio binding of each tensor."""
    body = []
    for r in rows:
        cols = [r["name"], r["mode"], r["dtype"], format_shape(r["shape"]), r["location"]]
        for p in range(num_profiles):
            prof = r["profiles"][p] if p < len(r["profiles"]) else None
            cols.append("-" if prof is None else
                        f"{format_shape(prof['min'])} {format_shape(prof['opt'])} {format_shape(prof['max'])}")
        cols.append(r["aliased_input"] or "-")
        cols.append(format_bytes(r["max_bytes"]))
        cols.append(r["binding"] or "-")
        body.append(cols)
    header = ["name", "mode", "dtype", "shape", "location"]
    header += [f"profile {p} min / opt / max" for p in range(num_profiles)]
    header += ["aliases", "bytes at max", "trtio binding"]
    return _table(header, body)


def check_fits(eio: EngineIO, cfg: LLMEngineConfig, what: str, config_path: str | os.PathLike[str]) -> None:
    """Refuse a config the engine cannot serve, listing every disagreement ``check_engine`` finds
    (what the factories would refuse)."""
    try:
        check_engine(eio, build_registry(cfg), cfg)
        problems = []
    except BindingError as exc:
        problems = list(exc.problems)
    if problems:
        raise ConfigError(str(config_path), f"does not fit {what} ({len(problems)} problem(s)): "
                                            + "; ".join(problems))
