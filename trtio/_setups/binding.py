"""An engine bound to a setup: its config checked against its declared I/O, its KV state, tensor map and
executor (:class:`BoundEngine`, :func:`bind_engine`), and the RoPE tables the engines of a setup share.

:func:`check_engine` compares an engine's declared I/O with what its config implies, on the engine's
contract, before anything is bound, and lists every disagreement in one BindingError.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtio import names
from trtio._config import DeploymentConfig, LLMEngineConfig
from trtio._contracts import contract_named, contract_of, resolve_contract
from trtio._contracts.contract import Contract
from trtio._cuda.backend import Backend, Location, get_backend
from trtio._dtypes import DType
from trtio._engine import PREFILL_PROFILE, ContextMemory, EngineExecutor, EngineIO, TensorInfo
from trtio._lifetime import Closeable
from trtio._memory import MemoryEntry, MemoryReport
from trtio._pipeline_io import PipelineIO
from trtio._registry import TensorRegistry, TensorSpec
from trtio._rope import no_rope_cos_sin_rows, rope_cos_sin_table
from trtio._setups.calls import Calls
from trtio._state import EngineState, state_names, state_problems
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio._tensor_map import TensorMap
from trtio.errors import BindingError, InvalidTypeError
from trtio.features import family_configs

__all__ = ["BindContext", "BoundEngine", "RopeTables", "rope_table_rows", "bind_engine", "check_engine",
           "declared_problems", "engine_backend",
           "engine_io", "fill_mrope", "profile_problems", "with_contract"]

# Registry outputs an engine may leave out (Edge-LLM serves optional outputs from one map).
_OPTIONAL_OUTPUTS = {names.kOutputHiddenStates}


def check_engine(engine_io: EngineIO, registry: TensorRegistry, cfg: LLMEngineConfig, *,
                 max_batch: int | None = None, pages_on_demand: bool = False,
                 constants: Mapping[str, Tensor] | None = None) -> None:
    """Compare an engine's declared I/O with what the config implies on the registry's contract; raise
    one BindingError with every disagreement: unknown inputs, missing bindings, dtypes, ranks, fixed
    dims, profile ranges too small for the config, and (through the engine state's own check) the KV
    state's dtype, dims and page pool. ``constants`` (engine input name -> tensor) are inputs the caller
    binds itself (weights the engine reads at run time): each must be a declared input of its dtype."""
    problems = []
    given = dict(constants or {})
    for name, t in given.items():
        info = engine_io[name] if name in engine_io else None
        if info is None or not info.is_input:
            problems.append(f"{name}: a constant input is given for it, but the engine declares no such input")
        elif t.dtype is not info.dtype:
            problems.append(f"{name}: the engine wants {info.dtype}, the constant input is {t.dtype}")
    claimed: set[str] = set()
    for family in family_configs():  # inputs a family binds where its feature is made: named once, not one by one
        names_, found = family.input_problems(engine_io, cfg, set(given))
        claimed |= names_
        problems += found
    problems += declared_problems(engine_io, registry, skip=state_names(engine_io) | set(given) | claimed)
    problems += _range_problems(engine_io, registry, cfg)
    problems += state_problems(engine_io, cfg, max_batch or cfg.max_supported_batch_size,
                               pages_on_demand=pages_on_demand)
    if problems:
        raise BindingError(engine_io.name, problems)


def declared_problems(engine_io: EngineIO, registry: TensorRegistry, *, skip: Set[str] = frozenset()) -> list[str]:
    """Where an engine's declared I/O and a registry disagree: a binding the registry does not know (except
    those in ``skip``, bound by someone else), a direction, dtype, rank or fixed dim of another value, and a
    required binding the engine does not declare."""
    problems = []
    for info in engine_io.tensors:
        spec = registry.get(info.name)
        if spec is None:
            if info.name not in skip:
                problems.append(f"{info.name}: the engine declares this {info.mode} but a {registry.role} engine of "
                                f"the {registry.contract} contract has no such binding")
            continue
        if spec.io != info.mode:
            problems.append(f"{info.name}: the engine declares an {info.mode}, the config expects an {spec.io}")
        if spec.dtype is not info.dtype:
            problems.append(f"{info.name}: the engine wants {info.dtype}, the config implies {spec.dtype}")
        if len(spec.shape) != len(info.shape):
            problems.append(f"{info.name}: the engine's rank is {len(info.shape)} {list(info.shape)}, the config "
                            f"implies rank {len(spec.shape)}")
            continue
        for i, (d, e) in enumerate(zip(spec.shape, info.shape)):
            if isinstance(d, int) and e >= 0 and d != e:
                problems.append(f"{info.name}: dim {i} is {e} in the engine but {d} in the config")
    for spec in registry:
        if spec.name not in engine_io and not spec.optional:
            what = "input" if spec.is_input else "output"
            problems.append(f"{spec.name}: the config implies this {what} but the engine does not declare it")
    return problems


def profile_problems(info: TensorInfo, spec: TensorSpec, *, lower: bool = False) -> list[str]:
    """Profile maxima of ``info`` (an engine input) below what ``spec``'s profiles say the config needs, and with
    ``lower`` minima above them (shapes the config allows that the engine would refuse)."""
    problems = []
    for p, (want, got) in enumerate(zip(spec.profiles, info.profiles)):
        if any(g < w for g, w in zip(got[2], want[2])):
            problems.append(f"{info.name}: profile {p} goes up to {list(got[2])} in the engine, the config "
                            f"needs {list(want[2])}")
        if lower and any(g > w for g, w in zip(got[0], want[0])):
            problems.append(f"{info.name}: profile {p} starts at {list(got[0])} in the engine, the config "
                            f"needs {list(want[0])}")
    return problems


def _range_problems(engine_io: EngineIO, registry: TensorRegistry, cfg: LLMEngineConfig) -> list[str]:
    """Profile maxima too small for the config: the registry's own profiles where it has them (ragged),
    else the dims the config fixes by name (the KV capacity, the RoPE table's batch) and the batch and
    prompt lengths it promises."""
    problems = []
    fixed = {"kv_len": ("max_kv_cache_capacity", cfg.max_kv_cache_capacity)}
    if not cfg.rope_per_slot:
        fixed["rope_batch"] = ("a shared RoPE table", 1)
    for info in engine_io.tensors:
        spec = registry.get(info.name)
        if spec is None or len(spec.shape) != len(info.shape):
            continue
        if spec.profiles and info.profiles:
            problems += profile_problems(info, spec)
            continue
        profile_max = info.max_shape() if info.profiles else tuple(-1 for _ in info.shape)
        for i, dim in enumerate(spec.shape):
            engine_dim = info.shape[i]
            if isinstance(dim, str) and dim in fixed:
                field_name, want_dim = fixed[dim]
                if engine_dim >= 0 and engine_dim != want_dim:
                    problems.append(f"{info.name}: dim {i} is {engine_dim} in the engine but {want_dim} in the config "
                                    f"({field_name})")
                elif engine_dim < 0 and 0 <= profile_max[i] < want_dim:
                    problems.append(f"{info.name}: dim {i} goes up to {profile_max[i]} in the engine's profiles but "
                                    f"the config needs {want_dim} ({field_name})")
            elif dim == "batch" and info.is_input and engine_dim < 0 \
                    and 0 <= profile_max[i] < cfg.max_supported_batch_size:
                problems.append(f"{info.name}: the engine takes batches up to {profile_max[i]}, the config's "
                                f"max_supported_batch_size is {cfg.max_supported_batch_size}")
            elif dim == "seq_len" and info.is_input and engine_dim < 0 and info.profiles \
                    and info.profiles[PREFILL_PROFILE][2][i] < cfg.max_supported_input_length:
                problems.append(f"{info.name}: the prefill profile takes up to {info.profiles[PREFILL_PROFILE][2][i]} "
                                f"tokens, the config's max_supported_input_length is {cfg.max_supported_input_length}")
    return problems


class RopeTables(Closeable):
    """Non-MRoPE cos/sin tables ([1, C, R] float32, with the config's RoPE scaling; the identity where the config
    says ``use_rope: false``), one per distinct table, shared by the engines of a setup. Created when an engine is
    bound, never in a step."""

    def __init__(self, backend: Backend) -> None:
        self._init_lifetime("RoPE tables")
        self._backend = backend
        self._tables: dict[tuple[Any, ...], Tensor] = {}

    def get(self, cfg: LLMEngineConfig, stream: Stream) -> Tensor:
        self._check_open()
        key = (cfg.max_kv_cache_capacity, cfg.rotary_dim, float(cfg.rope_theta), cfg.rope_scaling,
               cfg.max_position_embeddings, cfg.use_rope)
        t = self._tables.get(key)
        if t is None:
            table = rope_table_rows(cfg)
            t = Tensor.empty(table.shape, DType.FLOAT32, Location.DEVICE, name=names.kRopeCosSin,
                             backend=self._backend)
            self._tables[key] = t
            t.copy_from(table, stream)
        return t

    def report(self) -> MemoryReport:
        rep = MemoryReport("rope")
        for t in self._tables.values():
            rep.entries.append(MemoryEntry(names.kRopeCosSin, t.shape, str(t.dtype), str(t.location), t.capacity))
            loc = str(t.location)
            rep.allocated[loc] = rep.allocated.get(loc, 0) + t.capacity
            rep.allocations[loc] = rep.allocations.get(loc, 0) + 1
        return rep

    def _close_owned(self) -> None:
        with contextlib.ExitStack() as release:  # every table is freed; the first failure raises
            for t in self._tables.values():
                t._unfreeze()
                release.callback(t.close)


def rope_table_rows(cfg: LLMEngineConfig, batch: int = 1) -> np.ndarray:
    """The config's RoPE table, [batch, max_kv_cache_capacity, rotary_dim] float32 (RoPE scaling applied), or the
    table a family computes its own way (:meth:`~trtio.features.FamilyConfig.rope_rows`: Gemma 4's sliding layers').
    A model without RoPE (``use_rope: false``) gets the identity table, as Edge-LLM's runtime gives it (the graph
    rotates by whatever table it is fed)."""
    positions = np.arange(cfg.max_kv_cache_capacity)
    for family in cfg.features:
        own = family.rope_rows(cfg, positions)
        if own is not None:
            return np.ascontiguousarray(np.broadcast_to(own, (batch, *own.shape)))
    if not cfg.use_rope:
        rows = no_rope_cos_sin_rows(cfg.max_kv_cache_capacity, cfg.rotary_dim)
        return np.ascontiguousarray(np.broadcast_to(rows, (batch, *rows.shape)))
    return rope_cos_sin_table(cfg.max_kv_cache_capacity, cfg.rotary_dim, cfg.rope_theta, batch,
                              scaling=cfg.rope_scaling, max_position_embeddings=cfg.max_position_embeddings or None)


def fill_mrope(io: PipelineIO, cfg: LLMEngineConfig, stream: Stream) -> None:
    """MRoPE's per-sequence tables, filled for text (every slot: sequential positions)."""
    if cfg.rope_per_slot:
        io.mrope_cos_sin.copy_from(rope_table_rows(cfg, io.max_batch), stream)


def _start_index_may_be_empty(engine_io: EngineIO) -> bool:
    if names.kKVCacheStartIndex not in engine_io:
        return False
    info = engine_io[names.kKVCacheStartIndex]
    return bool(info.profiles) and info.profiles[PREFILL_PROFILE][0][0] == 0


@dataclass
class BindContext:
    """What a setup hands its features (:class:`~trtio.features.Feature`) when it binds its engines: its PipelineIO,
    backend, the stream construction runs on, the stack its parts are closed with, its RoPE tables, the snapshot
    rows its prefixes may hold (``max_prefixes``), its deployment (None: an LLM setup) and the engines bound so far."""

    io: PipelineIO
    backend: Backend
    stream: Stream
    stack: contextlib.ExitStack[Any]
    rope: RopeTables
    calls: Calls
    max_prefixes: int
    bundle: DeploymentConfig | None = None
    #: The setup's engines bound so far, by role (a spec pair's base before its draft is made).
    engines: dict[str, BoundEngine] = field(default_factory=dict)


@dataclass
class BoundEngine:
    """One engine of a setup: its role ("llm", "base" or "draft"), config, declared I/O, contract,
    registry, state, tensor map and executor."""

    role: str
    cfg: LLMEngineConfig
    io: EngineIO
    contract: Contract
    registry: TensorRegistry
    state: EngineState
    tensor_map: TensorMap
    executor: EngineExecutor
    empty_start_ok: bool


def bind_engine(engine: Any, cfg: LLMEngineConfig, tm: TensorMap, *, max_batch: int, backend: Backend,
                context_memory: ContextMemory, graphs: bool, rope: RopeTables, stream: Stream,
                resources: contextlib.ExitStack, name: str, io: PipelineIO,
                constants: Mapping[str, Tensor] | None = None) -> BoundEngine:
    """Check ``engine`` against ``cfg``, create its state and executor (closed by ``resources``) and bind
    the state (and the RoPE table, where the contract binds it) into ``tm``. The executor's registry is the
    contract's plus the state's own specs. ``constants`` (input name -> a tensor the caller owns and keeps
    open while the engine is bound) are bound as they are (see :func:`check_engine`)."""
    eio = EngineIO.from_engine(engine)
    contract = contract_named(resolve_contract(cfg, contract_of(eio), f"engine {eio.name!r}"))
    registry = contract.registry(cfg)
    page_table = contract.page_table(io, name)  # staged per step with its sequences' pages (pages on demand)
    check_engine(eio, registry, cfg, max_batch=max_batch, pages_on_demand=page_table is not None,
                 constants=constants)
    # The step block's tensors, where the setup stages pages per step: a family may bind its state to them.
    staged = io.step.tensors if io.step is not None and page_table is not None else {}
    state = resources.enter_context(EngineState(eio, cfg, max_batch=max_batch, backend=backend, name=name,
                                                stream=stream, page_table=page_table, staged=staged))
    state.bind(tm)
    stable = state.stable_names()
    for input_name, t in (constants or {}).items():
        tm.add(input_name, t)
        stable.add(input_name)
    if not cfg.rope_per_slot and (names.kRopeCosSin in eio or names.kRopeCosSinSliding in eio):
        table = rope.get(cfg, stream)  # made now, never in a step (the ragged contract's steps gather rows of it)
        if contract.binds_rope_table(cfg):
            tm.add(names.kRopeCosSin, table)
            stable.add(names.kRopeCosSin)
    executor = resources.enter_context(EngineExecutor(engine, context_memory=context_memory, name=name,
                                                      registry=registry.merged(state.specs()), stable=stable,
                                                      graphs=graphs, backend=backend))
    tm.add_user(executor)  # from now on its PipelineIO and state refuse to close under it, stepped or not
    return BoundEngine(name, cfg, eio, contract, registry, state, tm, executor, _start_index_may_be_empty(eio))


def engine_io(engine: Any, factory: str) -> EngineIO:
    """The engine's declared I/O; an object that is not an engine is an InvalidTypeError naming the factory."""
    if engine is None or not hasattr(engine, "num_io_tensors"):
        raise InvalidTypeError(f"{factory}: expected a TensorRT engine (ICudaEngine, e.g. from trtio.load_engine) "
                               f"or a trtio.testing.ReferenceEngine, got {type(engine).__name__}")
    return EngineIO.from_engine(engine)


def with_contract(cfg: LLMEngineConfig, engine: Any, what: str) -> LLMEngineConfig:
    """``cfg`` with the contract the engine declares (a config naming the other one is a ConfigError)."""
    detected = resolve_contract(cfg, contract_of(engine), what)
    return cfg if cfg.contract == detected else dataclasses.replace(cfg, contract=detected)


def engine_backend(engine: Any, backend: Backend | str | None) -> Backend:
    # An engine may say which memory it computes on (the ReferenceEngine does); TensorRT engines don't.
    return get_backend(backend if backend is not None else getattr(engine, "trtio_backend", None))


