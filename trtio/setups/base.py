"""What both setups share: checking an engine against its config, binding it, staging inputs, lifetime.

A setup binds each of its engines (:class:`BoundEngine`: config, declared I/O, registry, KV state,
tensor map, executor) to one PipelineIO. :func:`check_engine` compares an engine's declared I/O
with what its config implies before anything is bound.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from trtio import names
from trtio._lifetime import Closeable
from trtio.config import LLMEngineConfig
from trtio.contracts import contract_named, contract_of, resolve_contract
from trtio.contracts.contract import Contract, StepInputs
from trtio.cuda.backend import Backend, Location, get_backend
from trtio.dims import InferenceDims
from trtio.dtypes import DType
from trtio.engine import PREFILL_PROFILE, ContextMemory, DeviceWork, EngineExecutor, EngineIO, GraphStats
from trtio.errors import BindingError, InvalidTypeError, InvalidValueError, ShapeError
from trtio.memory import Arena, HostStaging, MemoryEntry, MemoryReport
from trtio.pages import Prefix, StepPages
from trtio.pipeline_io import PipelineIO
from trtio.registry import TensorRegistry
from trtio.rope import rope_cos_sin_table
from trtio.state import EngineState, state_names, state_problems
from trtio.stream import Stream, StreamLike, as_stream
from trtio.tensor import Tensor
from trtio.tensor_map import TensorMap

if TYPE_CHECKING:
    from trtio.setups.sequences import KVPages, Sequences

__all__ = ["BoundEngine", "EngineGraphStats", "SetupBase", "bind_engine", "check_engine", "engine_backend",
           "with_contract"]

log = logging.getLogger("trtio")

# Registry outputs an engine may leave out (Edge-LLM serves optional outputs from one map).
_OPTIONAL_OUTPUTS = {names.kOutputHiddenStates}


def check_engine(engine_io: EngineIO, registry: TensorRegistry, cfg: LLMEngineConfig, *,
                 max_batch: int | None = None, pages_on_demand: bool = False) -> None:
    """Compare an engine's declared I/O with what the config implies on the registry's contract; raise
    one BindingError with every disagreement: unknown inputs, missing bindings, dtypes, ranks, fixed
    dims, profile ranges too small for the config, and (through the engine state's own check) the KV
    state's dtype, dims and page pool."""
    problems = []
    owned = state_names(engine_io)
    for info in engine_io.tensors:
        spec = registry.get(info.name)
        if spec is None:
            if info.name not in owned:
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
    problems += _range_problems(engine_io, registry, cfg)
    problems += state_problems(engine_io, cfg, max_batch or cfg.max_supported_batch_size,
                               pages_on_demand=pages_on_demand)
    if problems:
        raise BindingError(engine_io.name, problems)


def _range_problems(engine_io: EngineIO, registry: TensorRegistry, cfg: LLMEngineConfig) -> list[str]:
    """Profile maxima too small for the config: the registry's own profiles where it has them (ragged),
    else the dims the config fixes by name (the KV capacity, the RoPE table's batch) and the batch and
    prompt lengths it promises."""
    problems = []
    fixed = {"kv_len": ("max_kv_cache_capacity", cfg.max_kv_cache_capacity)}
    if not cfg.is_mrope:
        fixed["rope_batch"] = ("a shared RoPE table", 1)
    for info in engine_io.tensors:
        spec = registry.get(info.name)
        if spec is None or len(spec.shape) != len(info.shape):
            continue
        if spec.profiles and info.profiles:
            for p, (want, got) in enumerate(zip(spec.profiles, info.profiles)):
                if any(g < w for g, w in zip(got[2], want[2])):
                    problems.append(f"{info.name}: profile {p} goes up to {list(got[2])} in the engine, the config "
                                    f"needs {list(want[2])}")
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


def _as_embeds(x: Any, what: str, dtype: DType, hidden: int) -> Any:
    if isinstance(x, Tensor):
        shape = x.shape  # checks it is open
        if x.dtype is not dtype or len(shape) != 3 or shape[2] != hidden:
            raise ShapeError(f"{what}: expected a [batch, seq, {hidden}] {dtype} tensor, got {shape} {x.dtype}")
        return x
    arr = np.asarray(x)
    if arr.ndim != 3 or arr.shape[2] != hidden:
        raise ShapeError(f"{what}: expected shape [batch, seq, {hidden}], got {arr.shape}")
    want = dtype.numpy
    if want is not None and arr.dtype != want:
        if arr.dtype.kind != "f":
            raise ShapeError(f"{what}: expected {dtype} values, got {arr.dtype}")
        # A conversion must not turn values into inf or NaN silently (1e6 overflows float16).
        top = float(np.finfo(want).max) if want.kind == "f" else float(ml_max(want))
        bad = ~np.isfinite(arr) | (np.abs(arr) > top)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InvalidValueError(f"{what}{list(where)} = {arr[where]!r} is not a finite {dtype} value (|x| <= "
                                    f"{top:g}); converting {arr.dtype} to {dtype} would make it inf or NaN")
        arr = arr.astype(want)
    return np.ascontiguousarray(arr)


def ml_max(dtype: np.dtype) -> float:
    """The largest finite value of an ml_dtypes float type (bfloat16, float8)."""
    import ml_dtypes

    return float(cast(Any, ml_dtypes).finfo(dtype).max)  # ml_dtypes' finfo is untyped


class _RopeTables(Closeable):
    """Non-MRoPE cos/sin tables ([1, C, R] float32, with the config's RoPE scaling), one per distinct
    table, shared by the engines of a setup. Created when an engine is bound, never in a step."""

    def __init__(self, backend: Backend) -> None:
        self._init_lifetime("RoPE tables")
        self._backend = backend
        self._tables: dict[tuple[Any, ...], Tensor] = {}

    def get(self, cfg: LLMEngineConfig, stream: Stream) -> Tensor:
        self._check_open()
        key = (cfg.max_kv_cache_capacity, cfg.rotary_dim, float(cfg.rope_theta), cfg.rope_scaling,
               cfg.max_position_embeddings)
        t = self._tables.get(key)
        if t is None:
            table = _rope_table(cfg)
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


def _rope_table(cfg: LLMEngineConfig, batch: int = 1) -> np.ndarray:
    """The config's RoPE table, [batch, max_kv_cache_capacity, rotary_dim] float32 (RoPE scaling applied)."""
    return rope_cos_sin_table(cfg.max_kv_cache_capacity, cfg.rotary_dim, cfg.rope_theta, batch,
                              scaling=cfg.rope_scaling, max_position_embeddings=cfg.max_position_embeddings or None)


def _fill_mrope(io: PipelineIO, cfg: LLMEngineConfig, stream: Stream) -> None:
    """MRoPE's per-sequence tables, filled for text (every slot: sequential positions)."""
    if cfg.is_mrope:
        io.mrope_cos_sin.copy_from(_rope_table(cfg, io.max_batch), stream)


def _start_index_may_be_empty(engine_io: EngineIO) -> bool:
    if names.kKVCacheStartIndex not in engine_io:
        return False
    info = engine_io[names.kKVCacheStartIndex]
    return bool(info.profiles) and info.profiles[PREFILL_PROFILE][0][0] == 0


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
                context_memory: ContextMemory, graphs: bool, rope: _RopeTables, stream: Stream,
                resources: contextlib.ExitStack, name: str, io: PipelineIO) -> BoundEngine:
    """Check ``engine`` against ``cfg``, create its state and executor (closed by ``resources``) and bind
    the state (and the RoPE table, where the contract binds it) into ``tm``. The executor's registry is the
    contract's plus the state's own specs."""
    eio = EngineIO.from_engine(engine)
    contract = contract_named(resolve_contract(cfg, contract_of(eio), f"engine {eio.name!r}"))
    registry = contract.registry(cfg)
    page_table = contract.page_table(io, name)  # staged per step with its sequences' pages (pages on demand)
    check_engine(eio, registry, cfg, max_batch=max_batch, pages_on_demand=page_table is not None)
    state = resources.enter_context(EngineState(eio, cfg, max_batch=max_batch, backend=backend, name=name,
                                                stream=stream, page_table=page_table))
    state.bind(tm)
    stable = state.stable_names()
    if not cfg.is_mrope and names.kRopeCosSin in eio:
        table = rope.get(cfg, stream)  # made now, never in a step (the ragged contract's steps gather rows of it)
        if contract.binds_rope_table(cfg):
            tm.add(names.kRopeCosSin, table)
            stable.add(names.kRopeCosSin)
    executor = resources.enter_context(EngineExecutor(engine, context_memory=context_memory, name=name,
                                                      registry=registry.merged(state.specs()), stable=stable,
                                                      graphs=graphs, backend=backend))
    tm.add_user(executor)  # from now on its PipelineIO and state refuse to close under it, stepped or not
    return BoundEngine(name, cfg, eio, contract, registry, state, tm, executor, _start_index_may_be_empty(eio))


def _engine_io(engine: Any, factory: str) -> EngineIO:
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


class EngineGraphStats(Mapping[str, GraphStats]):
    """A setup's CUDA-graph telemetry: each engine's :class:`~trtio.engine.GraphStats` by role
    (``stats["llm"]``; ``stats["base"]``, ``stats["draft"]``) and, as attributes, their sums (``hits``,
    ``captures``, ``misses``, ``graphs``) and the newest miss reason of any engine. A live view."""

    def __init__(self, engines: Sequence[BoundEngine]) -> None:
        self._by_role = {e.role: e.executor.graph_stats for e in engines}

    def __getitem__(self, role: str) -> GraphStats:
        return self._by_role[role]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_role)

    def __len__(self) -> int:
        return len(self._by_role)

    @property
    def hits(self) -> int:
        return sum(g.hits for g in self._by_role.values())

    @property
    def captures(self) -> int:
        return sum(g.captures for g in self._by_role.values())

    @property
    def misses(self) -> int:
        return sum(g.misses for g in self._by_role.values())

    @property
    def graphs(self) -> int:
        return sum(g.graphs for g in self._by_role.values())

    @property
    def last_miss_reason(self) -> str:
        """Why the newest capture was made (one engine), else each engine's, by role."""
        if len(self._by_role) == 1:
            return next(iter(self._by_role.values())).last_miss_reason
        return "; ".join(f"{role}: {g.last_miss_reason}" for role, g in self._by_role.items() if g.last_miss_reason)

    def __repr__(self) -> str:
        return f"EngineGraphStats({self._by_role})"


class SetupBase(Closeable, abc.ABC):
    """What LLMSetup and SpecDecodeSetup share: construction, staging, input checks, reporting, lifetime.

    A subclass builds its parts inside :meth:`_building` (everything entered there is closed again if
    construction fails half way, and by :meth:`close` later) and lists its engines in :meth:`engines`.

    Streams: every step takes ``stream`` (a :class:`~trtio.Stream`, an int handle or any object with
    ``__cuda_stream__``); ``None`` is the calling thread's trtio default stream (:func:`trtio.stream.as_stream`),
    as everywhere in trtio. Construction runs on the stream given at creation and ends synchronised, so
    steps may run on any stream. A setup is stepped by one thread at a time; several threads may each step
    their own setup.
    """

    io: PipelineIO
    _backend: Backend
    _seqs: Sequences
    _steps: StepInputs
    _rope: _RopeTables
    _context_memory: ContextMemory
    _extra_arena: Arena
    _embeds_staging: HostStaging
    _resources: contextlib.ExitStack | None = None

    @contextlib.contextmanager
    def _building(self, stream: StreamLike) -> Iterator[tuple[contextlib.ExitStack, Stream]]:
        """An ExitStack for the parts under construction (kept, for close, only if construction succeeds)
        and the stream construction works on. Construction ends synchronised."""
        self._init_lifetime(f"this {type(self).__name__}")
        s = as_stream(stream, self._backend)
        with contextlib.ExitStack() as stack:
            yield stack, s
            s.synchronize()
            self._resources = stack.pop_all()

    def _make_steps(self) -> None:
        """The contract's step-input writer for this setup (after ``io`` and ``_rope`` exist)."""
        self._steps = self.io.contract.steps(self.io, self._rope.get)

    @abc.abstractmethod
    def engines(self) -> list[BoundEngine]:
        """Every engine of the setup, each with its role, config, state, tensor map and executor."""

    @property
    def contract(self) -> str:
        """The engine contract the setup's engines speak: ``"batch"`` or ``"ragged"``."""
        return self.io.contract.name

    def _stream(self, stream: StreamLike) -> Stream:
        """A step's stream (see the class docstring: ``None`` is this thread's default stream)."""
        return as_stream(stream, self._backend)

    def _embeds(self, x: Any, hidden: int, what: str = "inputs_embeds") -> tuple[Any, int, int]:
        """``x`` checked as [batch, seq, hidden] embeddings and converted to the activation dtype (numpy),
        with its batch and seq; nothing is enqueued."""
        x = _as_embeds(x, what, self.io.inputs_embeds.dtype, hidden)
        shape = x.shape
        return x, int(shape[0]), int(shape[1])

    def _upload_embeds(self, x: Any, stream: Stream) -> None:
        """Put checked embeddings ``x`` ([B, S, hidden], from :meth:`_embeds`) into ``inputs_embeds``: pinned
        staging for numpy, a device copy for Tensors."""
        dst, staging = self.io.inputs_embeds, self._embeds_staging
        if x is dst:
            return  # written in place by the caller
        b, s, hidden = (int(d) for d in x.shape)
        if isinstance(x, Tensor):
            if x is not dst:
                dst.reshape((b, s, hidden)).copy_from(x, stream)
        elif s * b * hidden * dst.dtype.itemsize <= staging.host.capacity:
            staging.upload(x, stream)
        else:
            dst.reshape((b, s, hidden)).copy_from(x, stream)  # a long prompt: pageable copy, no staging

    # -- sequences --------------------------------------------------------------------------------
    @property
    def active(self) -> np.ndarray:
        """The active sequence slots, ascending (int64; a copy)."""
        return self._seqs.order.copy()

    @property
    def batch(self) -> int | None:
        """How many sequences are active (None: none)."""
        return self._seqs.count or None

    @property
    def kv_pages(self) -> KVPages:
        """The KV page pool's ``total`` and ``free`` pages (the LLM's, or the base's; ragged contract)."""
        self._check_open()
        return self._seqs.kv_pages()

    def release(self, slots: Sequence[int], stream: StreamLike = None) -> None:
        """End the sequences of ``slots`` (ragged contract): their slots become free and their pages go back
        to the pool (pages a pinned prefix holds stay). Host bookkeeping only: nothing is enqueued."""
        self._check_open()
        arr = self._seqs.checked_release(slots, "release")
        self._between_rounds("release")
        self._seqs.release(arr)

    def pin_prefix(self, slot: int, tokens: int) -> Prefix:
        """Keep the first ``tokens`` KV entries of the active sequence in ``slot`` alive, also after the slot is
        released, for later prefills to start from (``prefill(..., prefix=P)``; ragged contract). Full pages
        are shared by every sequence started from it; the partly filled last page is copied for each before
        it writes there. Host bookkeeping only: nothing is enqueued."""
        self._check_open()
        self._between_rounds("pin_prefix")
        return self._seqs.pin(slot, tokens)

    def _between_rounds(self, what: str) -> None:
        """Refuse ``what`` where a step protocol is half way through (a speculative round)."""

    def _step_lengths(self, e: BoundEngine) -> tuple[np.ndarray, tuple[int, ...], np.ndarray, bool]:
        """A step over every active sequence: the slots (ascending), their key, the engine's lengths of them
        (a view where the slots are ``0 .. n - 1``, else a copy) and whether it is a view."""
        seqs = self._seqs
        order, whole = seqs.order, seqs.contiguous
        lengths = e.state.lengths[:order.shape[0]] if whole else e.state.lengths[order]
        return order, seqs.order_key, lengths, whole

    @contextlib.contextmanager
    def _step_pages(self, e: BoundEngine, order: np.ndarray, key: tuple[int, ...], starts: np.ndarray, width: int,
                    s: Stream) -> Iterator[np.ndarray | None]:
        """Take the pages a step writes (``width`` tokens from ``starts`` on for each slot of ``order``; a
        CapacityError before anything changes when the pool is short), enqueue the copies of shared pages it
        writes, and give the step's page-table rows (None where pages are not staged per step). A step that
        raises inside gives the pages back."""
        seqs = self._seqs
        if not seqs.slotted:
            yield None
            return
        plan = seqs.tables[e.role].ensure(order, starts, width)
        if plan is None:
            yield seqs.step_rows(e.role, key)
            return
        plan.commit()
        try:
            seqs.copy(e.role, plan.moves, s)
            yield seqs.step_rows(e.role, key)
        except BaseException:
            plan.undo()
            raise

    def _prompt_slots(self, e: BoundEngine, slots: Any, prefix: Any, past_lengths: Any, b: int, ctx: np.ndarray,
                      what: str) -> tuple[np.ndarray, list[Prefix | None] | None, np.ndarray | None]:
        """A prefill's slots, prefixes and cached lengths before it (None: every cache starts empty)."""
        seqs = self._seqs
        if prefix is not None and past_lengths is not None:
            raise ShapeError(f"{what}: prefix= starts new sequences after a pinned prefix, past_lengths= continues "
                             f"active ones; give one of them")
        rows = seqs.prefill_slots(slots, b, continuing=past_lengths is not None, what=what)
        prefixes = seqs.prefixes(prefix, b, what)
        past = None
        if past_lengths is not None:
            arr = np.asarray(past_lengths)
            if arr.shape != (b,) or arr.dtype.kind not in "iu":
                raise ShapeError(f"past_lengths: expected {b} integer lengths, got {arr.dtype} {arr.shape}")
            have = e.state.lengths[rows]
            over = np.flatnonzero((arr < 0) | (arr > have))
            if over.size:
                i = int(over[0])
                raise ShapeError(f"past_lengths[{i}] = {int(arr[i])}, but sequence {i}'s cache holds {int(have[i])} "
                                 f"tokens")
            past = arr.astype(np.int64)
        elif prefixes is not None:
            past = np.array([0 if p is None else p.tokens for p in prefixes], np.int64)
        if past is not None:
            cap = e.cfg.max_kv_cache_capacity
            full = np.flatnonzero(past + ctx > cap)
            if full.size:
                i = int(full[0])
                raise ShapeError(f"{what}: sequence {i} would hold {int(past[i] + ctx[i])} tokens, more than "
                                 f"max_kv_cache_capacity ({cap})")
        return rows, prefixes, past

    def _prompt_pages(self, engines: Sequence[BoundEngine], rows: np.ndarray, past: np.ndarray | None,
                      ctx: np.ndarray, prefixes: list[Prefix | None] | None, *, restart: bool) -> list[StepPages]:
        """The host side of an admission (inside the sequences' transaction): a restarting batch releases
        every other sequence, new sequences become active (holding their prefixes' pages), and the pages the
        prompts write are taken in each of ``engines``' pools (CapacityError when one is short)."""
        seqs = self._seqs
        if restart:
            keep = set(rows.tolist()) if past is not None and prefixes is None else set()
            gone = np.array([s for s in seqs.order.tolist() if s not in keep], np.int64)
            if gone.size:
                seqs.release(gone)
        new = np.array([s for s in rows.tolist() if not seqs.is_active(s)], np.int64)
        if new.size:
            seqs.admit(new, None if prefixes is None else [p for s, p in zip(rows.tolist(), prefixes)
                                                           if not seqs.is_active(s)])
        plans = []
        if seqs.slotted:
            start = np.zeros(rows.shape[0], np.int64) if past is None else past
            for e in engines:
                plan = seqs.plan(e.role, rows.tolist(), start.tolist(), (start + ctx).tolist())
                plan.commit()
                plans.append(plan)
        return plans

    def _stage_prompt(self, e: BoundEngine, rows: np.ndarray, past: np.ndarray | None, ctx: np.ndarray, seq: int,
                      plans: list[StepPages], s: Stream) -> tuple[DeviceWork, ...]:
        """A prefill's inputs staged (its page copies enqueued first); returns its device work."""
        seqs = self._seqs
        if not seqs.slotted:
            return self._steps.prompt(e, past, ctx, seq, s)
        for plan in plans:
            seqs.copy(plan.table_role, plan.moves, s)
        key = tuple(rows.tolist())
        return self._steps.prompt(e, past, ctx, seq, s, slots=rows, pages=seqs.step_rows(e.role, key))

    def _check_deepstack(self, e: BoundEngine, features: Sequence[Any] | None, b: int,
                         seq: int) -> list[Any] | None:
        """A prefill's deepstack features, checked ([b, seq, hidden] each, one per feature) and converted."""
        n = e.cfg.num_deepstack_features
        if not n:
            if features:
                raise ShapeError("deepstack_embeds given but the config has num_deepstack_features = 0")
            return None
        if features is None:
            return None
        if len(features) != n:
            raise ShapeError(f"deepstack_embeds: expected {n} arrays, got {len(features)}")
        out = []
        for i, f in enumerate(features):
            x = _as_embeds(f, f"deepstack_embeds[{i}]", self.io.inputs_embeds.dtype, e.cfg.hidden_size)
            if tuple(x.shape[:2]) != (b, seq):
                raise ShapeError(f"deepstack_embeds[{i}]: expected [batch={b}, seq={seq}, hidden], got {list(x.shape)}")
            out.append(x)
        return out

    def _bind_deepstack(self, e: BoundEngine, features: list[Any] | None, b: int, seq: int, s: Stream) -> None:
        """Fill the deepstack feature buffers for a prefill (zeros without ``features``) and bind them."""
        if not e.cfg.num_deepstack_features:
            return
        views = [t.reshape((b, seq, e.cfg.hidden_size)) for t in self.io.deepstack_embeds]
        if features is None:
            for v in views:
                v.zero_(s)  # text-only request: Edge-LLM memsets the feature buffers
        else:
            for v, f in zip(views, features):
                v.copy_from(f, s)
        e.tensor_map.use_deepstack_features()

    def _prefill_dims(self, e: BoundEngine, b: int, seq: int, past: np.ndarray | None) -> InferenceDims:
        """A prefill's dims (checking seq against max_supported_input_length). With ``past`` (tokens each
        sequence already has cached) the step continues those caches: a restored prefix (the ragged
        contract's phase 2, the batch contract's non-empty start index)."""
        return e.cfg.prefill_dims(b, seq, kv_cache_empty=self._steps.empty_prefill(e, past))

    def _run_prefill(self, e: BoundEngine, dims: InferenceDims, ctx: np.ndarray, s: Stream,
                     past: np.ndarray | None, before: tuple[DeviceWork, ...], rows: np.ndarray) -> None:
        """Prepare and enqueue a prefill (profile 0, never graph-captured) after the device work ``before``;
        the lengths of the sequences in ``rows`` become ``past + ctx``."""
        e.executor.prepare(PREFILL_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s, use_graph=False, before=before)
        e.state.lengths[rows] = ctx if past is None else past + ctx

    def _check_lengths(self, ctx: Any, batch: int, limit: int, what: str) -> np.ndarray:
        arr = np.asarray(ctx)
        if arr.shape != (batch,) or arr.dtype.kind not in "iu":
            raise ShapeError(f"{what}: expected {batch} integer lengths (one per sequence), "
                             f"got {arr.dtype} {arr.shape}")
        if arr.size and (arr.min() < 1 or arr.max() > limit):
            bad = int(np.flatnonzero((arr < 1) | (arr > limit))[0])
            raise ShapeError(f"{what}[{bad}] = {int(arr[bad])} is outside 1..{limit}")
        return arr.astype(np.int64)

    def _report(self, title: str, include_context_memory: bool) -> MemoryReport:
        parts = [self.io.memory_report()]
        for e in self.engines():
            parts.append(e.state.memory_report())
        parts.append(self._extra_arena.report())
        parts.append(self._rope.report())
        if include_context_memory:
            parts.append(self._context_memory.report())
        return MemoryReport.combine(title, parts)

    def _close_owned(self) -> None:
        """Free every buffer, context and graph of the setup (in the reverse order of construction)."""
        resources, self._resources = self._resources, None
        if resources is not None:
            resources.close()
