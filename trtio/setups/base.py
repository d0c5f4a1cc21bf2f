"""What both setups share: checking an engine against its config, binding it, staging inputs, lifetime.

A setup binds each of its engines (:class:`BoundEngine`: config, declared I/O, registry, KV state,
tensor map, executor) to one PipelineIO. :func:`check_engine` compares an engine's declared I/O
with what its config implies before anything is bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from trtio import names
from trtio.config import LLMEngineConfig
from trtio.contracts import build_registry, contract_of, resolve_contract
from trtio.contracts.ragged import StepLayout
from trtio.cuda.backend import Backend, Location, get_backend
from trtio.dims import InferenceDims
from trtio.dtypes import DType
from trtio.engine import PREFILL_PROFILE, ContextMemory, DeviceWork, EngineExecutor, EngineIO
from trtio.errors import BindingError, ClosedError, InvalidValueError, ShapeError
from trtio.memory import Arena, HostStaging, MemoryEntry, MemoryReport
from trtio.ops import RowCopy
from trtio.pipeline_io import PipelineIO
from trtio.registry import TensorRegistry
from trtio.rope import rope_cos_sin_table
from trtio.state import EngineState, state_names, state_problems
from trtio.stream import Stream, StreamLike, as_stream
from trtio.tensor import Tensor
from trtio.tensor_map import TensorMap

__all__ = ["BoundEngine", "SetupBase", "bind_engine", "check_engine", "engine_backend", "remember", "with_contract"]

log = logging.getLogger("trtio")

_S = TypeVar("_S", bound="SetupBase")
_K = TypeVar("_K")
_V = TypeVar("_V")

_CACHE_LIMIT = 256  # entries a setup's cache of derived step values holds before it starts over


def remember(cache: dict[_K, _V], key: _K, value: _V) -> _V:
    """``cache[key] = value``, in a setup's cache of values derived per step shape (a runtime's steps repeat a
    few shapes; one that keeps changing must not grow it without bound: it is emptied at _CACHE_LIMIT)."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value

# Registry outputs an engine may leave out (Edge-LLM serves optional outputs from one map).
_OPTIONAL_OUTPUTS = {names.kOutputHiddenStates}


def check_engine(engine_io: EngineIO, registry: TensorRegistry, cfg: LLMEngineConfig, *,
                 max_batch: int | None = None) -> None:
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
    problems += state_problems(engine_io, cfg, max_batch or cfg.max_supported_batch_size)
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


class _RopeTables:
    """Non-MRoPE cos/sin tables ([1, C, R] float32, with the config's RoPE scaling), one per distinct
    table, shared by the engines of a setup. Created when an engine is bound, never in a step."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._tables: dict[tuple[Any, ...], Tensor] = {}

    def get(self, cfg: LLMEngineConfig, stream: Stream) -> Tensor:
        key = (cfg.max_kv_cache_capacity, cfg.rotary_dim, float(cfg.rope_theta), cfg.rope_scaling,
               cfg.max_position_embeddings)
        t = self._tables.get(key)
        if t is None:
            table = _rope_table(cfg)
            t = Tensor.empty(table.shape, DType.FLOAT32, Location.DEVICE, name=names.kRopeCosSin,
                             backend=self._backend)
            t.copy_from(table, stream)
            self._tables[key] = t
        return t

    def report(self) -> MemoryReport:
        rep = MemoryReport("rope")
        for t in self._tables.values():
            rep.entries.append(MemoryEntry(names.kRopeCosSin, t.shape, str(t.dtype), str(t.location), t.capacity))
            loc = str(t.location)
            rep.allocated[loc] = rep.allocated.get(loc, 0) + t.capacity
            rep.allocations[loc] = rep.allocations.get(loc, 0) + 1
        return rep

    def close(self) -> None:
        for t in self._tables.values():
            t._unfreeze()
            t.close()

    def __enter__(self) -> _RopeTables:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    """One engine of a setup: its role ("llm", "base" or "draft"), config, declared I/O, registry, state,
    tensor map and executor."""

    role: str
    cfg: LLMEngineConfig
    io: EngineIO
    registry: TensorRegistry
    state: EngineState
    tensor_map: TensorMap
    executor: EngineExecutor
    empty_start_ok: bool


def bind_engine(engine: Any, cfg: LLMEngineConfig, tm: TensorMap, *, max_batch: int, backend: Backend,
                context_memory: ContextMemory, graphs: bool, rope: _RopeTables, stream: Stream,
                resources: contextlib.ExitStack, name: str) -> BoundEngine:
    """Check ``engine`` against ``cfg``, create its state and executor (closed by ``resources``) and bind
    the state and the RoPE table into ``tm``. The executor's registry is the contract's plus the
    state's own specs."""
    eio = EngineIO.from_engine(engine)
    contract = resolve_contract(cfg, contract_of(eio), f"engine {eio.name!r}")
    registry = build_registry(cfg, contract)
    check_engine(eio, registry, cfg, max_batch=max_batch)
    state = resources.enter_context(EngineState(eio, cfg, max_batch=max_batch, backend=backend, name=name,
                                                stream=stream))
    state.bind(tm)
    stable = state.stable_names()
    if not cfg.is_mrope and names.kRopeCosSin in eio:
        table = rope.get(cfg, stream)  # the ragged contract gathers each step's rows from it
        if contract == "batch":
            tm.add(names.kRopeCosSin, table)
            stable.add(names.kRopeCosSin)
    executor = resources.enter_context(EngineExecutor(engine, context_memory=context_memory, name=name,
                                                      registry=registry.merged(state.specs()), stable=stable,
                                                      graphs=graphs, backend=backend))
    tm.add_user(executor)  # from now on its PipelineIO and state refuse to close under it, stepped or not
    return BoundEngine(name, cfg, eio, registry, state, tm, executor, _start_index_may_be_empty(eio))


def _engine_io(engine: Any, factory: str) -> EngineIO:
    """The engine's declared I/O; an object that is not an engine is a TypeError naming the factory."""
    if engine is None or not hasattr(engine, "num_io_tensors"):
        raise TypeError(f"{factory}: expected a TensorRT engine (ICudaEngine, e.g. from trtio.load_engine) or a "
                        f"trtio.testing.ReferenceEngine, got {type(engine).__name__}")
    return EngineIO.from_engine(engine)


def with_contract(cfg: LLMEngineConfig, engine: Any, what: str) -> LLMEngineConfig:
    """``cfg`` with the contract the engine declares (a config naming the other one is a ConfigError)."""
    detected = resolve_contract(cfg, contract_of(engine), what)
    return cfg if cfg.contract == detected else dataclasses.replace(cfg, contract=detected)


def engine_backend(engine: Any, backend: Backend | str | None) -> Backend:
    # An engine may say which memory it computes on (the ReferenceEngine does); TensorRT engines don't.
    return get_backend(backend if backend is not None else getattr(engine, "trtio_backend", None))


class SetupBase:
    """What LLMSetup and SpecDecodeSetup share: staging, lengths checks, reporting, lifetime.

    A subclass builds its parts inside :meth:`_building` (everything entered there is closed again if
    construction fails half way, and by :meth:`close` later) and lists its engines in :meth:`engines`.
    """

    io: PipelineIO
    _backend: Backend
    _default_stream: Stream | None  # the stream given at creation; None: each calling thread's default stream
    _rope: _RopeTables
    _context_memory: ContextMemory
    _extra_arena: Arena
    _embeds_staging: HostStaging
    _resources: contextlib.ExitStack | None = None
    _closed: bool = True

    @contextlib.contextmanager
    def _building(self, stream: StreamLike) -> Iterator[tuple[contextlib.ExitStack, Stream]]:
        """An ExitStack for the parts under construction (kept, for close, only if construction succeeds)
        and the stream construction works on. Construction ends synchronised, so steps may run on any
        stream: the one given at creation, or (``stream=None``) the calling thread's default stream."""
        self._default_stream = None if stream is None else as_stream(stream, self._backend)
        self._row_copies: dict[tuple[int, ...], RowCopy] = {}
        self._rope_sources: dict[str, tuple[Tensor, bool]] = {}
        s = self._default_stream or as_stream(None, self._backend)
        with contextlib.ExitStack() as stack:
            yield stack, s
            s.synchronize()
            self._resources = stack.pop_all()
        self._closed = False

    def engines(self) -> list[BoundEngine]:
        """Every engine of the setup, each with its role, config, state, tensor map and executor."""
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"this {type(self).__name__} is closed")

    def _stream(self, stream: StreamLike) -> Stream:
        """A step's stream: ``stream``, else the one given at creation, else this thread's default stream.

        A setup is stepped by one thread at a time; several threads may each step their own setup."""
        if stream is None:
            return self._default_stream or as_stream(None, self._backend)
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

    @staticmethod
    def _prefill_dims(e: BoundEngine, b: int, seq: int, past: np.ndarray | None) -> InferenceDims:
        """A prefill's dims (checking seq against max_supported_input_length). With ``past`` (tokens each
        sequence already has cached) the step continues those caches: a restored prefix (the ragged
        contract's phase 2, the batch contract's non-empty start index)."""
        empty = past is None and (e.empty_start_ok or e.cfg.contract == "ragged")
        return e.cfg.prefill_dims(b, seq, kv_cache_empty=empty)

    def _run_prefill(self, e: BoundEngine, dims: InferenceDims, ctx: np.ndarray, s: Stream,
                     past: np.ndarray | None = None, before: tuple[DeviceWork, ...] = ()) -> None:
        """Prepare and enqueue a prefill (profile 0, never graph-captured) after the device work ``before``;
        the lengths become ``past + ctx``."""
        b = dims.batch
        e.executor.prepare(PREFILL_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s, use_graph=False, before=before)
        e.state.lengths[:b] = ctx if past is None else past + ctx
        e.state.lengths[b:] = 0

    def _stage_layout(self, e: BoundEngine, layout: StepLayout, s: Stream) -> RowCopy:
        """Write a ragged step's inputs into the step block and upload them with one copy; returns the
        gather of the step's RoPE rows (one per token, at its position) from the engine's table, device
        work to enqueue before the engine (in its graph)."""
        io, step = self.io, self.io.step
        assert step is not None
        step.write("query_start_offsets", layout.query_start_offsets)
        step.write("query_lengths", layout.query_lengths)
        step.write("past_lengths", layout.past_lengths)
        step.write("attention_sequence_lengths", layout.attention_sequence_lengths)
        step.write("state_indices", layout.state_indices)
        step.write("logits_indices", layout.logits_indices)
        rows = step.write("positions", layout.positions)  # a shared RoPE table's rows are the positions
        table, per_slot = self._rope_rows_source(e, s)
        if per_slot:  # MRoPE: one table per sequence slot, [B, C, R] read as B*C rows
            slots = np.repeat(layout.state_indices.astype(np.int64), layout.width)
            at = layout.positions
            rows = step.write("rope_rows", np.where(at >= 0, slots * e.cfg.max_kv_cache_capacity + at, -1)
                              .astype(np.int32))
        if layout.packed_mask is not None and io.is_spec_decode:
            assert layout.attention_position_ids is not None
            assert layout.tree_parent_ids is not None and layout.tree_depths is not None
            step.write("packed_attention_mask", layout.packed_mask)
            step.write("spec_decode_position_ids", layout.attention_position_ids)
            step.write("spec_tree_parent_ids", layout.tree_parent_ids)
            step.write("spec_tree_depths", layout.tree_depths)
        step.upload(s)
        row_bytes = e.cfg.rotary_dim * DType.FLOAT32.itemsize
        return self._row_copy(io.ragged_rope_cos_sin, table, rows, layout.rows, row_bytes)

    def _row_copy(self, dst: Tensor, src: Tensor, src_rows: Tensor, count: int, row_bytes: int,
                  dst_rows: Tensor | None = None) -> RowCopy:
        """The RowCopy of these arguments, one object per distinct copy (an executor compares the work
        before its engine with the work its graph holds: the same object compares at once)."""
        key = (id(dst), id(src), id(src_rows), count, row_bytes, id(dst_rows))
        found = self._row_copies.get(key)
        if found is None:
            found = remember(self._row_copies, key, RowCopy(dst, src, src_rows, count, row_bytes, dst_rows))
        return found

    def _rope_rows_source(self, e: BoundEngine, s: Stream) -> tuple[Tensor, bool]:
        """The table a ragged step's RoPE rows are gathered from, and whether it has one per slot (looked
        up once per engine: the tables live as long as the setup)."""
        found = self._rope_sources.get(e.role)
        if found is None:
            found = self._rope_sources[e.role] = \
                (self.io.mrope_cos_sin, True) if e.cfg.is_mrope else (self._rope.get(e.cfg, s), False)
        return found

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

    def close(self) -> None:
        """Free every buffer, context and graph of the setup. Idempotent; a failure to free raises."""
        if self._closed:
            return
        self._closed = True
        resources, self._resources = self._resources, None
        if resources is not None:
            resources.close()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
