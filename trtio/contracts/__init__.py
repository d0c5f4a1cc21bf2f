"""Engine contracts: which bindings an engine declares, and how a step lays them out.

trtio binds two contracts (DESIGN §11) and tells them apart by the engine's I/O:
``"batch"`` (:mod:`trtio.contracts.batch`: ``[B, S, H]`` activations, contiguous KV caches) and
``"ragged"`` (:mod:`trtio.contracts.ragged`: Edge-LLM 0.11's token-major rows, paged KV pools).
"""

from __future__ import annotations

from typing import Any

from trtio import names
from trtio.config import LLMEngineConfig
from trtio.contracts import batch, ragged
from trtio.errors import ConfigError
from trtio.registry import TensorRegistry

__all__ = ["CONTRACTS", "build_registry", "contract_of", "resolve_contract"]

CONTRACTS = ("batch", "ragged")


def contract_of(engine: Any) -> str:
    """``"ragged"`` when the engine (a TensorRT engine, a ReferenceEngine or an :class:`~trtio.EngineIO`)
    declares ``query_start_offsets``, else ``"batch"``."""
    if hasattr(engine, "names") and hasattr(engine, "tensors"):
        declared = set(engine.names())
    else:
        declared = {engine.get_tensor_name(i) for i in range(int(engine.num_io_tensors))}
    return "ragged" if names.kQueryStartOffsets in declared else "batch"


def resolve_contract(cfg: LLMEngineConfig, detected: str, what: str = "engine") -> str:
    """The contract a setup binds: the one the engine declares. A config that names the other one is
    a ConfigError naming both."""
    claimed = cfg.contract
    if claimed is not None and claimed != detected:
        raise ConfigError("contract", f"the config says {claimed!r} but the {what} declares the {detected!r} "
                                      f"contract ({'it has' if detected == 'ragged' else 'it lacks'} "
                                      f"{names.kQueryStartOffsets!r})")
    return detected


def build_registry(cfg: LLMEngineConfig, contract: str | None = None) -> TensorRegistry:
    """The PipelineIO-owned bindings of an engine of ``cfg.role`` on ``contract`` (default: the
    config's, else batch). The engine state adds its own."""
    which = contract or cfg.contract or "batch"
    if which == "ragged":
        return ragged.registry_for(cfg)
    if which == "batch":
        return batch.registry_for(cfg)
    raise ConfigError("contract", f"must be one of {CONTRACTS}, got {which!r}")
