"""Engine contracts: which bindings an engine declares, and how a step lays them out.

trtio binds two contracts and tells them apart by the engine's I/O: ``"batch"``
(:mod:`trtio._contracts.batch`: ``[B, S, H]`` activations, contiguous KV caches) and ``"ragged"``
(:mod:`trtio._contracts.ragged`: Edge-LLM 0.11's token-major rows, paged KV pools). Each is one
:class:`~trtio._contracts.contract.Contract` object, chosen once when an engine is bound
(:func:`contract_named`); ``docs/architecture.md`` describes the protocol.
"""

from __future__ import annotations

from typing import Any

from trtio import names
from trtio._config import CONTRACTS, LLMEngineConfig
from trtio._contracts.batch import BatchContract
from trtio._contracts.contract import Contract
from trtio._contracts.ragged_steps import RaggedContract
from trtio._engine import EngineIO
from trtio._registry import TensorRegistry
from trtio.errors import ConfigError, InvalidTypeError

__all__ = ["CONTRACTS", "Contract", "build_registry", "contract_named", "contract_of", "resolve_contract"]

_BY_NAME: dict[str, Contract] = {c.name: c for c in (BatchContract(), RaggedContract())}
assert tuple(_BY_NAME) == CONTRACTS, "every contract a config may name has its object here"


def contract_named(name: str | None) -> Contract:
    """The contract called ``name`` (None: the batch contract, trtio's default for configs that name none)."""
    found = _BY_NAME.get(name or "batch")
    if found is None:
        raise ConfigError("contract", f"must be one of {CONTRACTS}, got {name!r}")
    return found


def contract_of(engine: Any) -> str:
    """``"ragged"`` when the engine (a TensorRT engine, a ReferenceEngine or an :class:`~trtio._engine.EngineIO`)
    declares ``query_start_offsets``, else ``"batch"``."""
    if isinstance(engine, EngineIO):
        declared = set(engine.names())
    elif hasattr(engine, "num_io_tensors") and hasattr(engine, "get_tensor_name"):
        declared = {engine.get_tensor_name(i) for i in range(int(engine.num_io_tensors))}
    else:
        raise InvalidTypeError(f"contract_of: expected a TensorRT engine (ICudaEngine), a ReferenceEngine or an "
                               f"EngineIO, got {type(engine).__name__}")
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
    return contract_named(contract or cfg.contract).registry(cfg)
