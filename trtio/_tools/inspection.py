"""``trtio inspect`` and ``trtio plan``: an engine's I/O and bindings, a config's memory.

Both take trtio's own targets (below) and TensorRT Edge-LLM 0.11 engine directories, which
:mod:`trtio._tools.engine_dirs` handles (:func:`~trtio._tools.engine_dirs.edgellm_directory` tells them
apart).

:func:`inspect_target` reads a plan (deserialized with :func:`trtio.load_engine`, so only where
TensorRT can load it: a GPU it supports), a folder holding plans or configs, or a config JSON (on
any machine: the engine is then a null-compute :class:`~trtio.testing.ReferenceEngine` declaring
the toy I/O contract of ``docs/toy-model.md`` for that config). For every engine tensor it gives
what the engine declares and the trtio tensor ``create_for_llm`` / ``create_for_spec_decode``
would bind to it (laid out on a :class:`~trtio._tools.dry_run.DryRunBackend`). A config that does not fit
the engine is refused with every disagreement listed, exactly as the factories would refuse it.

:func:`plan_config` is ``trtio plan``: the memory report of the factories for a config.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtio import names
from trtio._config import DeploymentConfig, LLMEngineConfig, read_config
from trtio._engine import EngineIO
from trtio._tools.binding_table import (
    binding_capacities,
    binding_labels,
    check_fits,
    engine_rows,
    format_engine_table,
)
from trtio._tools.dry_run import dry_run_setup, planned
from trtio._tools.engine_dirs import (
    edgellm_directory,
    format_kv_state,
    format_runtime,
    inspect_engine_dir,
    plan_engine_dir,
)
from trtio._tools.sequence_fit import format_sequence_fit, sequence_fit
from trtio.errors import ConfigError, EngineError
from trtio.testing.toy_engines import CONFIG_FILE, PLAN_FILE

__all__ = ["check_fits", "inspect_target", "format_inspection", "plan_config", "format_plan"]


@dataclass(frozen=True)
class _Source:
    """One engine to inspect: a plan, or the config it is made from."""

    plan: Path | None
    config: Path | None


def _sources(target: Path, config: Path | None) -> tuple[str, list[_Source]]:
    """("plan" | "config", the engines) for a path the user gave."""
    if not target.exists():
        raise EngineError(f"{str(target)!r} does not exist (expected a plan file, a folder with model.plan or "
                          f"config.json, a config JSON, or an Edge-LLM engine directory)")
    if target.is_file():
        if target.suffix == ".json":
            return "config", [_Source(None, target)]
        beside = target.parent / CONFIG_FILE
        return "plan", [_Source(target, config or (beside if beside.is_file() else None))]
    if (target / PLAN_FILE).is_file():
        beside = target / CONFIG_FILE
        return "plan", [_Source(target / PLAN_FILE, config or (beside if beside.is_file() else None))]
    parts = [target / role for role in ("base", "draft") if (target / role / PLAN_FILE).is_file()]
    if parts:
        deployment = target / CONFIG_FILE
        out = []
        for part in parts:
            own = part / CONFIG_FILE
            cfg = config or (deployment if deployment.is_file() else own if own.is_file() else None)
            out.append(_Source(part / PLAN_FILE, cfg))
        return "plan", out
    if (target / CONFIG_FILE).is_file():
        return "config", [_Source(None, target / CONFIG_FILE)]
    raise EngineError(f"{str(target)!r} holds no {PLAN_FILE} (nor base/{PLAN_FILE}, draft/{PLAN_FILE}) and no "
                      f"{CONFIG_FILE}, nor Edge-LLM's base_config.json + draft_config.json")


def _load(plan: Path, config: Path | None, module: str, plugins: Sequence[str | os.PathLike[str]] = ()) -> Any:
    from trtio._cuda.backend import cuda_available  # noqa: PLC0415
    from trtio._trt import load_engine  # noqa: PLC0415 - TensorRT only where a plan is given

    try:
        return load_engine(plan, module, plugins=plugins)
    except EngineError as exc:
        if not plan.is_file() or cuda_available() or "could not be deserialized" not in str(exc):
            raise
        hint = f"trtio inspect {config}" if config is not None else "trtio inspect CONFIG.json"
        raise EngineError(f"plan file {str(plan)!r} cannot be deserialized here: no CUDA device answers, and "
                          f"TensorRT loads plans only on a GPU; `{hint}` shows the same I/O from the config") from exc


def _engine_config(config: LLMEngineConfig | DeploymentConfig, eio: EngineIO) -> LLMEngineConfig:
    """The engine's own config: a deployment's draft for an engine that takes the base's hidden states."""
    if isinstance(config, LLMEngineConfig):
        return config
    if names.kBaseModelHiddenStates in eio and config.draft is not None:
        return config.draft
    return config.base


def _labels(config: LLMEngineConfig | DeploymentConfig, cfg: LLMEngineConfig) -> tuple[dict[str, str],
                                                                                    dict[str, int]]:
    """The trtio tensor each engine tensor binds to (and its bytes), from a dry-run setup of ``config``."""
    with dry_run_setup(config) as setup:
        labels, capacities = binding_labels(setup), binding_capacities(setup)
    role = "llm" if "llm" in labels else ("draft" if cfg.role == "draft" else "base")
    return labels[role], capacities[role]


def _reference_io(cfg: LLMEngineConfig, name: str) -> EngineIO:
    from trtio.testing.reference_engine import ReferenceEngine  # noqa: PLC0415 - testing helper, loaded on use

    return EngineIO.from_engine(ReferenceEngine.from_config(cfg, null_compute=True, device="host", name=name))


def inspect_target(target: str | os.PathLike[str], *, config: str | os.PathLike[str] | None = None,
                   module: str = "auto", plugins: Sequence[str | os.PathLike[str]] = ()) -> dict[str, Any]:
    """The I/O tables of the engine(s) at ``target`` (see module docstring) as a JSON-able dict:
    ``{"target", "kind", "engines": [{"name", "role", "plan", "config", "num_profiles", "tensors"}]}``,
    each tensor row as :func:`trtio._tools.binding_table.engine_rows` makes it.

    ``config`` overrides the config found beside a plan; for a config target it is the config to bind
    with (checked against the engine the target describes). An Edge-LLM engine directory (or a config or
    engine file in one) goes to :func:`~trtio._tools.engine_dirs.inspect_engine_dir` (``kind``
    ``"edgellm"``; ``config`` does not apply: the directory's configs are the engines' own). ``plugins``
    are loaded before a plan is deserialized.
    """
    target = Path(target)
    edgellm = edgellm_directory(target)
    if edgellm is not None:
        if config is not None:
            raise ConfigError("--config", f"does not apply to the Edge-LLM engine directory {edgellm}: its engines "
                                          "are bound with the configs beside them")
        return inspect_engine_dir(edgellm, module=module, plugins=plugins)
    override = Path(config) if config is not None else None
    kind, sources = _sources(target, override)
    engines = []
    for src in sources:
        if src.plan is not None:
            eio = EngineIO.from_engine(_load(src.plan, src.config, module, plugins))
            if src.config is None:
                engines.append(_entry(eio, src.plan, None, None, None, None))
                continue
            cfg_all = read_config(src.config)
            cfg = _engine_config(cfg_all, eio)
            check_fits(eio, cfg, f"plan {src.plan}", src.config)
            engines.append(_entry(eio, src.plan, src.config, cfg, *_labels(cfg_all, cfg)))
            continue
        assert src.config is not None
        described = read_config(src.config)
        bind_path = override or src.config
        bind_all = read_config(override) if override is not None else described
        parts = [described] if isinstance(described, LLMEngineConfig) else \
            [described.base] + ([described.draft] if described.draft is not None else [])
        for part in parts:
            name = {"llm": "toy-llm", "base": "toy-base", "draft": "toy-draft"}[part.role]
            eio = _reference_io(part, name)
            cfg = _engine_config(bind_all, eio)
            if override is not None:
                check_fits(eio, cfg, f"the {part.role} engine that {src.config} describes", override)
            engines.append(_entry(eio, None, bind_path, cfg, *_labels(bind_all, cfg)))
    return {"target": str(target), "kind": kind, "engines": engines}


def _entry(eio: EngineIO, plan: Path | None, config: Path | None, cfg: LLMEngineConfig | None,
           labels: dict[str, str] | None, capacities: dict[str, int] | None) -> dict[str, Any]:
    return {
        "name": eio.name,
        "role": cfg.role if cfg is not None else None,
        "plan": str(plan) if plan is not None else None,
        "config": str(config) if config is not None else None,
        "num_profiles": eio.num_profiles,
        "tensors": engine_rows(eio, labels, capacities),
    }


def format_inspection(result: dict[str, Any]) -> str:
    lines = []
    if result["kind"] == "edgellm":
        family = {"mtp": "an MTP", "dflash": "a DFlash"}.get(result.get("spec_family") or "", "an EAGLE3")
        what = "a plain LLM" if result["directory_kind"] == "llm" else f"{family} speculative pair"
        lines += [f"Edge-LLM engine directory {result['target']}: {what}, ragged contract (token-major, paged KV "
                  "cache)", ""]
    for e in result["engines"]:
        if result["kind"] == "edgellm":
            if e["source"] == "plan":
                source = f"plan {e['plan']}, bindings for {e['config']}"
            else:
                source = (f"the engine {e['config']} describes (a null-compute ReferenceEngine of the "
                          f"{e['contract']} contract)")
        else:
            source = f"plan {e['plan']}" if e["plan"] else "a null-compute ReferenceEngine (toy I/O contract)"
            if e["config"]:
                source += f", bindings for config {e['config']}"
        head = f"{e['name']}" + (f" ({e['role']})" if e["role"] else "") + f": {source}"
        lines.append(head)
        if e.get("plan_not_read"):
            lines.append(f"  plan not read: {e['plan_not_read']}")
        lines.extend(format_engine_table(e["tensors"], e["num_profiles"]))
        if not e["config"]:
            lines.append("  (no config.json beside the plan: pass --config CONFIG to see the trtio bindings)")
        ins = sum(1 for t in e["tensors"] if t["mode"] == "input")
        lines.append(f"  {ins} inputs, {len(e['tensors']) - ins} outputs, {e['num_profiles']} profiles")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def _deployment_for_plan(path: Path) -> tuple[Path, DeploymentConfig]:
    config_path = path / CONFIG_FILE if path.is_dir() else path
    config = read_config(config_path)
    if isinstance(config, LLMEngineConfig):
        if config.role != "llm":
            raise ConfigError(str(config_path), f"describes a spec-decode {config.role} alone; plan the deployment "
                                                f"config that holds its base, draft and spec sections")
        config = DeploymentConfig(config).validate()
    return config_path, config


def plan_config(path: str | os.PathLike[str], *, draft_top_k: int | None = None, draft_step: int | None = None,
                verify_size: int | None = None, sequence_length: int | None = None) -> dict[str, Any]:
    """``trtio plan``: what the factories allocate for the config at ``path`` (a JSON, or a folder
    holding config.json), as ``{"config", "kind": "trtio", "factory", "contract", "kv_state", "memory":
    MemoryReport.to_dict(), "text", "sequences"}``.

    An Edge-LLM engine directory (or a config in one) is planned by
    :func:`~trtio._tools.engine_dirs.plan_engine_dir` with Edge-LLM's run-time values ``draft_top_k``,
    ``draft_step``, ``verify_size`` (a speculative pair's; defaults: the largest its caps allow). trtio's
    own deployment configs carry them in their ``spec`` section instead. ``sequences`` is how many
    sequences of ``sequence_length`` tokens fit each engine's KV state
    (:func:`~trtio._tools.sequence_fit.sequence_fit`; default: the longest the engines run their steps on).
    """
    result = _plan(Path(path), draft_top_k, draft_step, verify_size)
    result["sequences"] = sequence_fit(result["kv_state"], sequence_length)
    return result


def _plan(path: Path, draft_top_k: int | None, draft_step: int | None, verify_size: int | None) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(str(path), "no such config file or folder")
    edgellm = edgellm_directory(path)
    if edgellm is not None:
        return plan_engine_dir(edgellm, draft_top_k=draft_top_k, draft_step=draft_step, verify_size=verify_size)
    for flag, value in (("--draft-top-k", draft_top_k), ("--draft-step", draft_step), ("--verify-size", verify_size)):
        if value is not None:
            raise ConfigError(flag, f"is for an Edge-LLM speculative engine directory; {path} is a trtio config, "
                                    "whose deployment sets drafting_top_k, drafting_step and verify_size in its "
                                    "spec section")
    config_path, config = _deployment_for_plan(path)
    report, kv = planned(config)
    factory = "create_for_spec_decode" if config.draft is not None else "create_for_llm"
    return {"config": str(config_path), "kind": "trtio", "factory": factory,
            "contract": config.base.contract or "batch", "kv_state": kv, "memory": report.to_dict(),
            "text": str(report)}


def format_plan(result: dict[str, Any]) -> str:
    if result.get("kind") == "edgellm":
        files = " + ".join(Path(c).name for c in result["configs"])
        present = [Path(p).name for p in result["engine_files"].values() if p]
        engines = "engine files: " + (", ".join(present) if present else "none (configs only)")
        lines = [f"{result['factory']} for the Edge-LLM engine directory {result['config']} ({files}; {engines})",
                 f"contract: {result['contract']} (token-major, paged KV cache)"]
        runtime = format_runtime(result["runtime"])
        if runtime:
            lines.append(runtime)
    else:
        lines = [f"{result['factory']} for {result['config']}:"]
    lines.append("KV state:")
    lines.extend(format_kv_state(result["kv_state"]))
    if "sequences" in result:
        lines.extend(format_sequence_fit(result["sequences"]))
    lines.append(result["text"])
    return "\n".join(lines)

