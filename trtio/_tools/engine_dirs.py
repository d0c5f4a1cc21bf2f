"""``trtio plan`` and ``trtio inspect`` on TensorRT Edge-LLM 0.11 engine directories.

An Edge-LLM engine directory (:class:`~trtio.edgellm.EngineDir`) is flat: ``config.json`` (+
``llm.engine``) for a plain LLM, ``base_config.json`` + ``draft_config.json`` (+ ``spec_base.engine``,
``spec_draft.engine``) for an EAGLE3 pair. Its engines speak Edge-LLM's token-major ("ragged")
contract with paged KV pools. :func:`edgellm_directory` tells such a target from one of trtio's own
configs; :func:`plan_engine_dir` lays out what ``create_from_engine_dir`` would allocate, on a
:class:`~trtio._tools.dry_run.DryRunBackend` with null-compute ReferenceEngines of the ragged contract
(no memory is allocated, so an 8B-class directory plans on a laptop); :func:`inspect_engine_dir` gives
each engine's I/O table, from its plan where TensorRT (and Edge-LLM's plugin) can deserialize it here,
else from the engine its config describes, with the reason the plan was not read.

A speculative pair needs Edge-LLM's three run-time values (``draft_top_k``, ``draft_step``,
``verify_size``); :func:`runtime_values` fills the ones not given with the largest the configs' caps
allow: ``verify_size = max_verify_tree_size``, ``draft_top_k = 1`` and ``draft_step =
max_draft_tree_size // draft_top_k``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from trtio._config import DeploymentConfig, LLMEngineConfig
from trtio._contracts import build_registry
from trtio._cuda.backend import Location
from trtio._dtypes import DType
from trtio._engine import EngineIO
from trtio._memory import MemoryReport
from trtio._setups import LLMSetup, check_engine, create_for_llm
from trtio._setups.tensor_parallel import close_constant, ranks_memory_report
from trtio._tensor import Tensor
from trtio._tools.binding_table import (
    binding_capacities,
    binding_labels,
    check_fits,
    engine_rows,
    format_bytes,
    format_shape,
)
from trtio._tools.dry_run import DryRunBackend, dry_run_setup, kv_state_rows, planned
from trtio.edgellm import CONFIG_FILES, ENGINE_FILES, TP_CONFIG_PATTERN, EngineDir
from trtio.errors import BindingError, ConfigError, TrtioError
from trtio.families.spec.spec_config import family_of

__all__ = ["RUNTIME_FLAGS", "edgellm_directory", "engine_name", "format_kv_state", "format_runtime",
           "inspect_engine_dir", "inspect_tensor_parallel_dir", "plan_engine_dir", "plan_tensor_parallel_dir",
           "runtime_values"]

#: The command-line flag of each of Edge-LLM's run-time values.
RUNTIME_FLAGS = {"draft_top_k": "--draft-top-k", "draft_step": "--draft-step", "verify_size": "--verify-size"}
_MARKER_KEYS = ("builder_config", "engine_role", "edgellm_version")
_BINDING_DTYPES = {"F16": DType.FLOAT16, "F32": DType.FLOAT32, "BF16": DType.BFLOAT16}


def _is_edgellm_json(path: Path) -> bool:
    """Whether ``path`` holds a JSON object written by Edge-LLM's builder (not one of trtio's configs).
    A file that cannot be read as JSON is not judged here: its reader names the problem."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and any(key in data for key in _MARKER_KEYS)


def edgellm_directory(target: Path) -> Path | None:
    """The Edge-LLM engine directory ``target`` names, or None where it is one of trtio's own targets.

    A directory is Edge-LLM's when it holds a speculative pair's config or any engine file of Edge-LLM's
    names (or a tensor-parallel / diffusion engine, which :meth:`EngineDir.open` refuses by name), or
    a ``config.json`` that Edge-LLM wrote. A file is taken as its directory when it is one of those
    configs or engine files.
    """
    if target.is_file():
        if target.name in ENGINE_FILES.values() or (
                (target.name in CONFIG_FILES.values() or TP_CONFIG_PATTERN.fullmatch(target.name))
                and _is_edgellm_json(target)):
            return target.parent
        return None
    if not target.is_dir():
        return None
    names = {p.name for p in target.iterdir()}
    own = ({CONFIG_FILES["base"], CONFIG_FILES["draft"], "dllm.engine", *ENGINE_FILES.values()})
    if names & own or any(n.startswith("config_world") and n.endswith(".json") for n in names):
        return target
    if CONFIG_FILES["llm"] in names and _is_edgellm_json(target / CONFIG_FILES["llm"]):
        return target
    return None


def engine_name(role: str) -> str:
    """The engine of ``role`` as Edge-LLM names its file, without the suffix: llm, spec_base, spec_draft."""
    return ENGINE_FILES[role].rsplit(".", 1)[0]


def runtime_values(directory: EngineDir, draft_top_k: int | None = None, draft_step: int | None = None,
                   verify_size: int | None = None) -> tuple[DeploymentConfig, dict[str, Any] | None]:
    """The directory's :class:`DeploymentConfig` and, for a speculative pair, the run-time values used:
    ``{"draft_top_k", "draft_step", "verify_size", "defaulted": [names not given]}`` (None for a plain LLM).

    Values not given are the largest the caps allow (module docstring). Errors name the flag: one given
    for a plain LLM, or values beyond the configs' tree caps.
    """
    given = {"draft_top_k": draft_top_k, "draft_step": draft_step, "verify_size": verify_size}
    if directory.kind == "llm":
        for name, value in given.items():
            if value is not None:
                raise ConfigError(RUNTIME_FLAGS[name], f"is for a speculative pair; {directory.path} holds a plain "
                                                       f"LLM ({directory.config_path('llm').name})")
        return directory.deployment(), None
    base, draft = directory.base_config, directory.draft_config
    top_k = 1 if draft_top_k is None else draft_top_k
    values = {
        "draft_top_k": top_k,
        "draft_step": draft_step if draft_step is not None else max(1, draft.max_draft_tree_size // max(top_k, 1)),
        "verify_size": verify_size if verify_size is not None else base.max_verify_tree_size,
    }
    try:
        bundle = directory.deployment(values["draft_top_k"], values["draft_step"], values["verify_size"])
    except ConfigError as exc:
        if exc.field not in RUNTIME_FLAGS:
            raise
        defaulted = [f"{RUNTIME_FLAGS[n]} {values[n]}" for n, v in given.items() if v is None]
        note = f" (defaulted: {', '.join(defaulted)})" if defaulted else ""
        raise ConfigError(RUNTIME_FLAGS[exc.field], exc.message + note) from None
    return bundle, {**values, "defaulted": [n for n, v in given.items() if v is None]}


def _engine_files(directory: EngineDir) -> dict[str, str | None]:
    return {role: str(directory.engine_path(role)) if directory.engine_path(role).is_file() else None
            for role in directory.roles}


# -- plan -------------------------------------------------------------------------------------------


def plan_engine_dir(path: str | os.PathLike[str], *, draft_top_k: int | None = None, draft_step: int | None = None,
                    verify_size: int | None = None) -> dict[str, Any]:
    """``trtio plan DIR`` for an Edge-LLM engine directory: what ``create_from_engine_dir`` allocates
    (PipelineIO, each engine's paged KV pools and page table, staging, RoPE), laid out on a dry-run
    backend. Returns ``{"config" (the directory), "kind": "edgellm", "directory_kind", "configs",
    "engine_files", "contract", "factory", "runtime", "kv_state", "memory", "text"}``."""
    directory = EngineDir.open(path)
    bundle, runtime = runtime_values(directory, draft_top_k, draft_step, verify_size)
    if directory.is_tensor_parallel:
        return plan_tensor_parallel_dir(directory)
    report, kv = planned(bundle, engine_names={role: engine_name(role) for role in directory.roles})
    factory = "create_for_spec_decode" if bundle.draft is not None else "create_for_llm"
    return {
        "config": str(directory.path),
        "kind": "edgellm",
        "directory_kind": directory.kind,
        "configs": [str(directory.config_path(role)) for role in directory.roles],
        "engine_files": _engine_files(directory),
        "contract": bundle.base.contract,
        "factory": factory,
        "runtime": runtime,
        "kv_state": kv,
        "memory": report.to_dict(),
        "text": str(report),
    }


# -- inspect ----------------------------------------------------------------------------------------


def _load_plan(plan: Path, module: str, plugins: Sequence[str | os.PathLike[str]]) -> tuple[Any, str | None]:
    """(the deserialized engine, None), or (None, why it was not read)."""
    if not plan.is_file():
        return None, f"no engine file {plan.name} here (the directory holds configs only)"
    from trtio._trt import load_engine  # noqa: PLC0415 - TensorRT only where a plan is there

    try:
        return load_engine(plan, module, plugins=plugins), None
    except TrtioError as exc:
        return None, " ".join(str(exc).split())


def inspect_engine_dir(path: str | os.PathLike[str], *, module: str = "auto",
                       plugins: Sequence[str | os.PathLike[str]] = ()) -> dict[str, Any]:
    """``trtio inspect DIR`` for an Edge-LLM engine directory: each engine's I/O table and the trtio
    tensor ``create_from_engine_dir`` binds to each of its tensors.

    The table comes from the engine file where :func:`trtio.load_engine` deserializes it (with
    ``module``, after loading ``plugins``; a plan its config does not fit is an error listing every
    disagreement), else from the engine its config describes (a null-compute ReferenceEngine of the
    ragged contract), with ``plan_not_read`` saying why. Bindings are those of a dry run of the
    directory's deployment (a pair with :func:`runtime_values`' defaults).
    """
    from trtio.testing.reference_engine import ReferenceEngine  # noqa: PLC0415 - testing helper, loaded on use

    for plugin in plugins:
        if not Path(plugin).is_file():
            raise ConfigError("--plugin", f"{os.fspath(plugin)!r} is not a file; --plugin takes the path of a "
                                          "TensorRT plugin library, e.g. .../lib/libNvInfer_edgellm_plugin.so from "
                                          "Edge-LLM's wheel or build")
    directory = EngineDir.open(path)
    bundle, _ = runtime_values(directory)
    if directory.is_tensor_parallel:
        return inspect_tensor_parallel_dir(directory, module=module, plugins=plugins)
    names = {role: engine_name(role) for role in directory.roles}
    with dry_run_setup(bundle, engine_names=names) as setup:
        labels, capacities = binding_labels(setup), binding_capacities(setup)
    engines = []
    for role, cfg in directory:
        plan = directory.engine_path(role)
        config_path = directory.config_path(role)
        engine, why = _load_plan(plan, module, plugins)
        if engine is not None:
            eio = EngineIO.from_engine(engine)
            check_fits(eio, cfg, f"plan {plan}", config_path)
        else:
            eio = EngineIO.from_engine(ReferenceEngine.from_config(cfg, null_compute=True, device="host",
                                                                   name=names[role]))
        engines.append(_engine_entry(ENGINE_FILES[role], role, plan if engine is not None else None, why,
                                     config_path, cfg, eio, labels[role], capacities[role]))
    out: dict[str, Any] = {"target": str(directory.path), "kind": "edgellm", "directory_kind": directory.kind,
                           "engines": engines}
    if directory.kind == "spec_decode":  # which pair: EAGLE3, MTP or DFlash (trtio.families.spec.spec_config)
        out["spec_family"] = family_of(directory.base_config.extras, "base")
    return out


def _engine_entry(name: str, role: str, plan: Path | None, why: str | None, config_path: Path, cfg: LLMEngineConfig,
                  eio: EngineIO, labels: dict[str, str], capacities: dict[str, int]) -> dict[str, Any]:
    """One engine of ``trtio inspect DIR``: its I/O table from the plan (``plan``) or from its config."""
    return {
        "name": name,
        "role": role,
        "plan": str(plan) if plan is not None else None,
        "config": str(config_path),
        "source": "plan" if plan is not None else "config",
        "plan_not_read": why,
        "contract": cfg.contract,
        "num_profiles": eio.num_profiles,
        "tensors": engine_rows(eio, labels, capacities),
    }


def format_runtime(runtime: dict[str, Any] | None) -> str | None:
    """One line for a pair's run-time values, saying which were defaulted."""
    if runtime is None:
        return None
    values = ", ".join(f"{RUNTIME_FLAGS[n]} {runtime[n]}" for n in RUNTIME_FLAGS)
    if not runtime["defaulted"]:
        return f"run-time values: {values}"
    return (f"run-time values: {values} (defaulted: {', '.join(RUNTIME_FLAGS[n] for n in runtime['defaulted'])}; "
            "the largest the configs' tree caps allow)")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def format_kv_state(rows: list[dict[str, Any]]) -> list[str]:
    """Lines: each engine's KV state (paged pools and page table, or contiguous caches)."""
    lines = []
    for r in rows:
        names = r["names"]
        span = f"{names[0]} .. {names[-1]}" if len(names) > 1 else (names[0] if names else "-")
        shape = r["shape"]
        if r["layout"] == "paged":
            lines.append(f"  {r['role']}: {_count(r['tensors'], 'paged KV pool')}, one per attention layer ({span}), "
                         f"each {format_shape(shape)} {r['dtype']} (K and V, {_count(r['pool_pages'], 'page')} of "
                         f"{r['page_size']} tokens, {_count(shape[3], 'KV head')}, head dim {shape[4]}): "
                         f"{format_bytes(r['bytes'])} in all; page table {format_shape(r['page_table_shape'])} int32 "
                         f"({_count(r['pages_per_sequence'], 'page')} per sequence)")
        else:
            lines.append(f"  {r['role']}: {_count(r['tensors'], 'contiguous KV cache')} ({span}), each "
                         f"{format_shape(shape)} {r['dtype']}: {format_bytes(r['bytes'])} in all")
        g4 = r.get("gemma4")
        if g4 is not None:  # each layer its own geometry; KV-sharing consumers on their donor's pool
            lines[-1] = (f"  {r['role']}: Gemma 4 KV pools, one per attention layer (KV-sharing layers bound to their "
                         f"donor's): {format_bytes(g4['bytes'])} in all; page table "
                         f"{format_shape(r['page_table_shape'])} int32 ({_count(r['pages_per_sequence'], 'page')} per "
                         "sequence)")
            for layer in g4["layers"]:
                pool = f"{r['dtype']}" if layer["shares"] is None else f"= {layer['shares']}'s pool (KV sharing)"
                lines.append(f"    {layer['name']}: {layer['kind']}, {format_shape(layer['shape'])} {pool}")
            lines.append(f"  {r['role']}: SWA mode: {g4['mode']}")
        rec = r.get("recurrent")
        if rec is not None:
            conv, state = rec["conv"], rec["state"]
            lines.append(f"  {r['role']}: {_count(rec['layers'], 'recurrent layer')} ({rec['kind']}), each a conv "
                         f"state {format_shape(conv['shape'])} {conv['dtype']} and a recurrent state "
                         f"{format_shape(state['shape'])} {state['dtype']}, one row per sequence slot "
                         f"({conv['names'][0]} .. {state['names'][-1]}): "
                         f"{format_bytes(conv['bytes'] + state['bytes'])} in all; snapshots for pinned prefixes: "
                         f"{_count(rec['snapshot_rows'], 'row')} per pool (max_prefixes), "
                         f"{format_bytes(rec['snapshot_bytes'])}")
    return lines


# -- tensor-parallel directories: every rank --------------------------------------------------------


@contextlib.contextmanager
def _dry_run_rank(directory: EngineDir, rank: int, backend: DryRunBackend) -> Iterator[LLMSetup]:
    """Rank ``rank``'s setup as ``create_from_engine_dir`` makes it, on ``backend`` (no memory): a null-compute
    ReferenceEngine of the rank's config and its checkpoint weights as (unbacked) constant inputs."""
    from trtio.testing.reference_engine import ReferenceEngine  # noqa: PLC0415 - testing helper, loaded on use

    cfg = directory.rank_config(rank)
    engine = ReferenceEngine.from_config(cfg, null_compute=True, device="host", tp_rank=rank,
                                         tp_size=directory.tp_size, name=directory.engine_path(rank).name)
    weights = {b.engine_name: Tensor.empty(b.shape, _BINDING_DTYPES[b.dtype], Location.DEVICE, name=b.engine_name,
                                           backend=backend) for b in directory.checkpoint_bindings()}
    try:
        with create_for_llm(engine, cfg, backend=backend, constants=weights) as setup:
            yield setup
    finally:
        for t in weights.values():
            close_constant(t)


def _rank_label(directory: EngineDir, rank: int) -> str:
    return f"rank {rank} ({directory.engine_path(rank).name})"


def plan_tensor_parallel_dir(directory: EngineDir) -> dict[str, Any]:
    """``trtio plan DIR`` for a tensor-parallel directory: what each rank's setup allocates (its PipelineIO,
    its KV pools of its own KV heads, its page table, staging, RoPE, its checkpoint weights), on a dry-run
    backend. The keys of :func:`plan_engine_dir`, plus ``tp_size`` and ``ranks`` (per rank: ``rank``,
    ``engine``, ``engine_file``, ``heads``, ``kv_heads``, ``kv_state``, ``memory``)."""
    reports, kv, ranks = [], [], []
    for r in range(directory.tp_size):
        with _dry_run_rank(directory, r, DryRunBackend()) as setup:
            report = setup.memory_report(include_context_memory=False)
            rows = kv_state_rows(setup)
            consts = {b.engine_name: setup.tensor_map[b.engine_name] for b in directory.checkpoint_bindings()}
            rank_report = ranks_memory_report(_rank_label(directory, r), [report], [consts], first_rank=r)
        for row in rows:
            row["role"] = _rank_label(directory, r)
        reports.append(rank_report)
        kv.extend(rows)
        cfg = directory.rank_config(r)
        engine = directory.engine_path(r)
        ranks.append({"rank": r, "engine": engine.name, "engine_file": str(engine) if engine.is_file() else None,
                      "heads": cfg.num_attention_heads, "kv_heads": cfg.num_kv_heads, "kv_state": rows,
                      "memory": rank_report.to_dict()})
    combined = MemoryReport.combine(f"create_from_engine_dir ({directory.tp_size} ranks)", reports)
    combined.notes = list(dict.fromkeys(combined.notes))  # every rank's setup notes the same
    combined.notes.append("context memory: not included (device_memory_size_v2 of each rank's engine)")
    return {
        "config": str(directory.path),
        "kind": "edgellm",
        "directory_kind": directory.kind,
        "tp_size": directory.tp_size,
        "configs": [str(directory.config_path("llm"))],
        "engine_files": {f"rank {r}": ranks[r]["engine_file"] for r in range(directory.tp_size)},
        "contract": directory.config.contract,
        "factory": f"create_from_engine_dir ({directory.tp_size} tensor-parallel ranks)",
        "runtime": None,
        "kv_state": kv,
        "ranks": ranks,
        "memory": combined.to_dict(),
        "text": str(combined),
    }


def inspect_tensor_parallel_dir(directory: EngineDir, *, module: str = "auto",
                                plugins: Sequence[str | os.PathLike[str]] = ()) -> dict[str, Any]:
    """``trtio inspect DIR`` for a tensor-parallel directory: each rank engine's I/O table (from its plan where
    it deserializes here, else from the engine its rank config describes) and the trtio tensor each tensor binds
    to (checkpoint weights included), as :func:`inspect_engine_dir` gives them."""
    from trtio.testing.reference_engine import ReferenceEngine  # noqa: PLC0415 - testing helper, loaded on use

    engines = []
    config_path = directory.config_path("llm")
    bindings = {b.engine_name: b for b in directory.checkpoint_bindings()}
    for r in range(directory.tp_size):
        cfg = directory.rank_config(r)
        with _dry_run_rank(directory, r, DryRunBackend()) as setup:
            labels, capacities = binding_labels(setup)["llm"], binding_capacities(setup)["llm"]
            consts = {name: setup.tensor_map[name] for name in bindings}
            plan = directory.engine_path(r)
            engine, why = _load_plan(plan, module, plugins)
            if engine is not None:
                eio = EngineIO.from_engine(engine)
                _check_rank_fits(eio, cfg, consts, f"plan {plan}", config_path)
            else:
                eio = EngineIO.from_engine(ReferenceEngine.from_config(cfg, null_compute=True, device="host",
                                                                       tp_rank=r, tp_size=directory.tp_size,
                                                                       name=plan.name))
        for name, b in bindings.items():
            labels[name] = f"checkpoint weight {b.checkpoint_key}" + (
                f" (part {r} of {b.tp_shard[1]} along axis {b.tp_shard[0]})" if b.tp_shard else "")
        engines.append(_engine_entry(plan.name, f"rank {r}", plan if engine is not None else None, why, config_path,
                                     cfg, eio, labels, capacities))
    return {"target": str(directory.path), "kind": "edgellm", "directory_kind": directory.kind,
            "tp_size": directory.tp_size, "engines": engines}


def _check_rank_fits(eio: EngineIO, cfg: LLMEngineConfig, constants: dict[str, Tensor], what: str,
                     config_path: Path) -> None:
    """Refuse a rank plan its rank config does not fit, listing every disagreement."""
    try:
        check_engine(eio, build_registry(cfg), cfg, constants=constants)
    except BindingError as exc:
        raise ConfigError(str(config_path), f"does not fit {what} ({len(exc.problems)} problem(s)): "
                                            + "; ".join(exc.problems)) from None
