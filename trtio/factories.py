"""create_for_llm / create_for_spec_decode: engines bound to a PipelineIO, ready to step.

:class:`LLMSetup` runs one engine: ``prefill`` (profile 0) then ``decode`` steps (profile 1).
:class:`SpecDecodeSetup` runs an EAGLE-style base + draft pair that share one PipelineIO and one
context memory, each with its own tensor map and KV state: base prefill, draft prefill, draft
proposal, base verify over a token tree, accept (KV compaction along the accepted path) and the
draft's catch-up over the accepted tokens (Edge-LLM's ``eagleDecoder`` phases, notes §9).

Returned logits are views of PipelineIO buffers, written on the step's stream and valid until
the next step overwrites them. Steps never allocate; decode-type steps never synchronise the
host (their pinned staging buffers are fenced with events that are normally complete already).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from trtio import names
from trtio.config import DeploymentConfig, LLMEngineConfig
from trtio.cuda.backend import Backend, Location, get_backend
from trtio.dims import InferenceDims
from trtio.dtypes import DType
from trtio.engine import DECODE_PROFILE, PREFILL_PROFILE, ContextMemory, EngineExecutor, EngineIO
from trtio.errors import BindingError, ShapeError, TrtioError
from trtio.memory import Arena, MemoryEntry, MemoryReport, TensorRequest
from trtio.pipeline_io import HostStaging, PipelineIO
from trtio.registry import TensorRegistry, build_registry
from trtio.rope import rope_cos_sin_table
from trtio.spec_decode import ancestor_mask, pack_tree_mask, tree_position_ids
from trtio.state import EngineState
from trtio.stream import Stream, StreamLike, as_stream
from trtio.tensor import Tensor
from trtio.tensor_map import TensorMap

__all__ = ["LLMSetup", "SpecDecodeSetup", "create_for_llm", "create_for_spec_decode", "check_engine"]

log = logging.getLogger("trtio")

# Registry outputs an engine may leave out (Edge-LLM serves optional outputs from one map).
_OPTIONAL_OUTPUTS = {names.kOutputHiddenStates}


def check_engine(engine_io: EngineIO, registry: TensorRegistry, cfg: LLMEngineConfig, *, extra: Sequence[str] = ()) -> None:
    """Compare an engine's declared I/O with what the config implies; raise one BindingError with every
    disagreement (unknown inputs, missing bindings, dtypes, ranks, fixed dims)."""
    problems = []
    state_names = {n for pair in engine_io.state_pairs() for n in pair}
    for info in engine_io.tensors:
        spec = registry.get(info.name)
        if spec is None:
            if info.name not in state_names and info.name not in extra:
                problems.append(f"{info.name}: the engine declares this {info.mode} but a {registry.role} engine "
                                f"of this config has no such binding")
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
        if spec.name not in engine_io and spec.name not in _OPTIONAL_OUTPUTS and spec.io == "input":
            problems.append(f"{spec.name}: the config implies this input but the engine does not declare it")
    if names.kLogits not in engine_io:
        problems.append(f"{names.kLogits}: the engine has no logits output")
    problems += _range_problems(engine_io, registry, cfg)
    if problems:
        raise BindingError(engine_io.name, problems)


def _range_problems(engine_io: EngineIO, registry: TensorRegistry, cfg: LLMEngineConfig) -> list[str]:
    """Dims the config fixes by name (the KV capacity, the RoPE table's batch) and the batch and prompt
    lengths it promises, against the engine's shapes and profile maxima."""
    problems = []
    fixed = {"kv_len": ("max_kv_cache_capacity", cfg.max_kv_cache_capacity)}
    if not cfg.is_mrope:
        fixed["rope_batch"] = ("a shared RoPE table", 1)
    for info in engine_io.tensors:
        spec = registry.get(info.name)
        if spec is None or len(spec.shape) != len(info.shape):
            continue
        profile_max = info.max_shape() if info.profiles else tuple(-1 for _ in info.shape)
        for i, dim in enumerate(spec.shape):
            engine_dim = info.shape[i]
            if isinstance(dim, str) and dim in fixed:
                field_name, want = fixed[dim]
                if engine_dim >= 0 and engine_dim != want:
                    problems.append(f"{info.name}: dim {i} is {engine_dim} in the engine but {want} in the config "
                                    f"({field_name})")
                elif engine_dim < 0 and 0 <= profile_max[i] < want:
                    problems.append(f"{info.name}: dim {i} goes up to {profile_max[i]} in the engine's profiles but "
                                    f"the config needs {want} ({field_name})")
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
        if x.dtype is not dtype or len(x.shape) != 3 or x.shape[2] != hidden:
            raise ShapeError(f"{what}: expected a [batch, seq, {hidden}] {dtype} tensor, got {x.shape} {x.dtype}")
        return x
    arr = np.asarray(x)
    if arr.ndim != 3 or arr.shape[2] != hidden:
        raise ShapeError(f"{what}: expected shape [batch, seq, {hidden}], got {arr.shape}")
    want = dtype.numpy
    if want is not None and arr.dtype != want:
        if arr.dtype.kind != "f":
            raise ShapeError(f"{what}: expected {dtype} values, got {arr.dtype}")
        arr = arr.astype(want)
    return np.ascontiguousarray(arr)


class _RopeTables:
    """Non-MRoPE cos/sin tables ([1, C, R] float32), one per (capacity, rotary dim, theta), shared."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._tables: dict[tuple[int, int, float], Tensor] = {}

    def get(self, cfg: LLMEngineConfig, stream: Stream) -> Tensor:
        key = (cfg.max_kv_cache_capacity, cfg.rotary_dim, float(cfg.rope_theta))
        t = self._tables.get(key)
        if t is None:
            table = rope_cos_sin_table(key[0], key[1], key[2])
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


class _Closer:
    """Closes what a factory made so far if it fails half way."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def add(self, x: Any) -> Any:
        self.items.append(x)
        return x

    def close_all(self) -> None:
        for x in reversed(self.items):
            try:
                x.close()
            except Exception:  # keep closing the rest
                log.exception("cleanup after a failed setup")


def _fill_mrope(io: PipelineIO, cfg: LLMEngineConfig, stream: Stream) -> None:
    if cfg.is_mrope:
        table = rope_cos_sin_table(cfg.max_kv_cache_capacity, cfg.rotary_dim, cfg.rope_theta, batch=io.max_batch)
        io.mrope_cos_sin.copy_from(table, stream)


def _start_index_may_be_empty(engine_io: EngineIO) -> bool:
    if names.kKVCacheStartIndex not in engine_io:
        return False
    info = engine_io[names.kKVCacheStartIndex]
    return bool(info.profiles) and info.profiles[PREFILL_PROFILE][0][0] == 0


@dataclass
class _Engine:
    """One engine of a setup: its config, registry, state, map and executor."""

    cfg: LLMEngineConfig
    io: EngineIO
    registry: TensorRegistry
    state: EngineState
    tensor_map: TensorMap
    executor: EngineExecutor
    empty_start_ok: bool


def _make_engine(engine: Any, cfg: LLMEngineConfig, tm: TensorMap, *, max_batch: int, backend: Backend,
                 context_memory: ContextMemory, graphs: bool, rope: _RopeTables, stream: Stream,
                 closer: _Closer, name: str) -> _Engine:
    eio = EngineIO.from_engine(engine)
    registry = build_registry(cfg)
    check_engine(eio, registry, cfg)
    state = closer.add(EngineState(eio, max_batch=max_batch, backend=backend, name=name))
    state.bind(tm)
    stable = state.stable_names()
    if not cfg.is_mrope and names.kRopeCosSin in eio:
        tm.add(names.kRopeCosSin, rope.get(cfg, stream))
        stable.add(names.kRopeCosSin)
    executor = closer.add(EngineExecutor(engine, context_memory=context_memory, name=name, registry=registry,
                                         stable=stable, graphs=graphs, backend=backend))
    return _Engine(cfg, eio, registry, state, tm, executor, _start_index_may_be_empty(eio))


def _engine_backend(engine: Any, backend: Backend | str | None) -> Backend:
    # An engine may say which memory it computes on (the ReferenceEngine does); TensorRT engines don't.
    return get_backend(backend if backend is not None else getattr(engine, "trtio_backend", None))


class _SetupBase:
    """What LLMSetup and SpecDecodeSetup share: staging, lengths checks, reporting, lifetime."""

    io: PipelineIO
    _backend: Backend
    _closer: _Closer
    _rope: _RopeTables
    _context_memory: ContextMemory
    _extra_arena: Arena

    def _stream(self, stream: StreamLike) -> Stream:
        return self._default_stream if stream is None else as_stream(stream, self._backend)

    def _stage_embeds(self, x: Any, staging: HostStaging, what: str, hidden: int, stream: Stream) -> tuple[int, int]:
        """Put ``x`` ([B, S, hidden]) into ``inputs_embeds``: pinned staging for numpy, D2D for Tensors."""
        dst = self.io.inputs_embeds
        x = _as_embeds(x, what, dst.dtype, hidden)
        b, s = int(x.shape[0]), int(x.shape[1])
        if isinstance(x, Tensor):
            if x is not dst:
                dst.reshape((b, s, hidden)).copy_from(x, stream)
        elif s * b * hidden * dst.dtype.itemsize <= staging.host.capacity:
            staging.upload(x, stream)
        else:
            dst.reshape((b, s, hidden)).copy_from(x, stream)  # a long prompt: pageable copy, no staging
        return b, s

    def _stage_prompt(self, e: _Engine, inputs_embeds: Any, context_lengths: Any, s: Stream) -> tuple[int, int, np.ndarray]:
        """A prefill's inputs: embeds, context lengths, last-token ids (each prompt's last token) and
        the start index ([0] for an empty cache where the engine allows it, else zeros)."""
        b, seq = self._stage_embeds(inputs_embeds, self._embeds_staging, "inputs_embeds", e.cfg.hidden_size, s)
        if not 1 <= b <= self.io.max_batch:
            raise ShapeError(f"inputs_embeds: batch {b} is outside 1..{self.io.max_batch}")
        ctx = self._check_lengths(context_lengths, b, seq, "context_lengths")
        self.io.upload_context_lengths(ctx, s)
        self.io.upload_select_token_indices((ctx - 1)[:, None], s)
        e.state.upload_start_index(None if e.empty_start_ok else np.zeros(b, np.int32), s)
        return b, seq, ctx

    def _bind_deepstack(self, e: _Engine, features: Sequence[Any] | None, b: int, seq: int, s: Stream) -> None:
        """Fill the deepstack feature buffers for a prefill (zeros without ``features``) and bind them."""
        n = e.cfg.num_deepstack_features
        if not n:
            if features:
                raise ShapeError("deepstack_embeds given but the config has num_deepstack_features = 0")
            return
        views = [t.reshape((b, seq, e.cfg.hidden_size)) for t in self.io.deepstack_embeds]
        if features is None:
            for v in views:
                v.zero_(s)  # text-only request: Edge-LLM memsets the feature buffers
        else:
            if len(features) != n:
                raise ShapeError(f"deepstack_embeds: expected {n} arrays, got {len(features)}")
            for i, (v, f) in enumerate(zip(views, features)):
                v.copy_from(_as_embeds(f, f"deepstack_embeds[{i}]", v.dtype, e.cfg.hidden_size), s)
        e.tensor_map.use_deepstack_features()

    def _run_prefill(self, e: _Engine, b: int, seq: int, ctx: np.ndarray, s: Stream) -> None:
        """Prepare and enqueue a prefill (profile 0, never graph-captured); the lengths become ``ctx``."""
        dims = e.cfg.prefill_dims(b, seq, kv_cache_empty=e.empty_start_ok)
        e.executor.prepare(PREFILL_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s, use_graph=False)
        e.state.lengths[:b] = ctx
        e.state.lengths[b:] = 0

    def _check_lengths(self, ctx: Any, batch: int, limit: int, what: str) -> np.ndarray:
        arr = np.asarray(ctx)
        if arr.shape != (batch,) or arr.dtype.kind not in "iu":
            raise ShapeError(f"{what}: expected {batch} integer lengths (one per sequence), got {arr.dtype} {arr.shape}")
        if arr.size and (arr.min() < 1 or arr.max() > limit):
            bad = int(np.flatnonzero((arr < 1) | (arr > limit))[0])
            raise ShapeError(f"{what}[{bad}] = {int(arr[bad])} is outside 1..{limit}")
        return arr.astype(np.int64)

    def _report(self, title: str, engines: list[_Engine], include_context_memory: bool) -> MemoryReport:
        parts = [self.io.memory_report()]
        for e in engines:
            parts.append(e.state.memory_report())
        parts.append(self._extra_arena.report())
        parts.append(self._rope.report())
        if include_context_memory:
            parts.append(self._context_memory.report())
        return MemoryReport.combine(title, parts)

    def close(self) -> None:
        """Free every buffer, context and graph of the setup. Idempotent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._closer.close_all()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LLMSetup(_SetupBase):
    """One LLM engine bound to a PipelineIO: prefill / decode / reset (DESIGN §8)."""

    def __init__(self, engine: Any, cfg: LLMEngineConfig, stream: StreamLike = None, *, graphs: bool = False,
                 backend: Backend | str | None = None) -> None:
        self._closed = True
        cfg.validate()
        if cfg.is_draft or cfg.is_spec_decode_base:
            raise TrtioError(f"create_for_llm: the config describes a spec-decode {cfg.role}; "
                             f"use create_for_spec_decode with a DeploymentConfig")
        be = _engine_backend(engine, backend)
        self._backend = be
        self.cfg = cfg
        closer = self._closer = _Closer()
        try:
            self._default_stream = s = as_stream(stream, be)  # None: trtio's default stream of the backend
            self.io = closer.add(PipelineIO.create_for_llm(cfg, s, backend=be))
            self._rope = closer.add(_RopeTables(be))
            self._context_memory = closer.add(ContextMemory.for_engines([engine], backend=be))
            tm = self.io.build_tensor_map(cfg)
            self._engine = _make_engine(engine, cfg, tm, max_batch=cfg.max_supported_batch_size, backend=be,
                                        context_memory=self._context_memory, graphs=graphs, rope=self._rope,
                                        stream=s, closer=closer, name="llm")
            self._extra_arena = closer.add(Arena([
                TensorRequest.of("host_inputs_embeds", (cfg.max_supported_batch_size, 1, cfg.hidden_size),
                                 cfg.activation, Location.PINNED)], backend=be, title="llm staging"))
            self._embeds_staging = HostStaging(self._extra_arena["host_inputs_embeds"], self.io.inputs_embeds, be)
            closer.add(self._embeds_staging)
            _fill_mrope(self.io, cfg, s)
        except BaseException:
            closer.close_all()
            raise
        self._closed = False
        self._batch: int | None = None
        self._decode_dims: dict[int, InferenceDims] = {}
        self._select_zero_batch: int | None = None
        self._streaming_pending = False

    # -- public views ---------------------------------------------------------------------------
    @property
    def state(self) -> EngineState:
        return self._engine.state

    @property
    def executor(self) -> EngineExecutor:
        return self._engine.executor

    @property
    def tensor_map(self) -> TensorMap:
        return self._engine.tensor_map

    @property
    def graph_stats(self) -> Any:
        return self._engine.executor.graph_stats

    @property
    def batch(self) -> int | None:
        return self._batch

    @property
    def lengths(self) -> np.ndarray:
        """Tokens cached per sequence (host mirror; a copy)."""
        b = self._batch or 0
        return self._engine.state.lengths[:b].copy()

    # -- steps ----------------------------------------------------------------------------------
    def prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None, *,
                deepstack_embeds: Sequence[Any] | None = None) -> Tensor:
        """Run the prompt (profile 0) and return the logits view [batch, vocab] of each last prompt token.

        ``inputs_embeds`` is [batch, seq, hidden] (numpy or a device Tensor, e.g. ``io.inputs_embeds``
        already filled); ``context_lengths`` gives each sequence's prompt length (<= seq; shorter
        prompts are right-padded). Without ``deepstack_embeds`` the deepstack inputs are zero.
        """
        self._check_open()
        e = self._engine
        s = self._stream(stream)
        b, seq, ctx = self._stage_prompt(e, inputs_embeds, context_lengths, s)
        self._select_zero_batch = None
        self._bind_deepstack(e, deepstack_embeds, b, seq, s)
        self._run_prefill(e, b, seq, ctx, s)
        self._batch = b
        return self.io.output_logits

    def decode(self, inputs_embeds: Any, stream: StreamLike = None) -> Tensor:
        """One token per sequence after the cached ones (profile 1); returns the logits view [batch, vocab].

        ``kvcache_start_index`` = the cached lengths, ``context_lengths`` = lengths + 1,
        ``last_token_ids`` = 0; the lengths then grow by one. No allocation; no host synchronisation.
        """
        self._check_open()
        b = self._batch
        if b is None:
            raise TrtioError("decode() before prefill(): there is no sequence to continue")
        e = self._engine
        s = self._stream(stream)
        lengths = e.state.lengths[:b]
        if int(lengths.max()) >= self.cfg.max_kv_cache_capacity:
            full = int(np.argmax(lengths))
            raise ShapeError(f"KV cache full: sequence {full} holds {int(lengths[full])} tokens, the capacity "
                             f"(max_kv_cache_capacity) is {self.cfg.max_kv_cache_capacity}")
        nb, ns = self._stage_embeds(inputs_embeds, self._embeds_staging, "inputs_embeds", self.cfg.hidden_size, s)
        if (nb, ns) != (b, 1):
            raise ShapeError(f"inputs_embeds: decode takes [batch={b}, 1, {self.cfg.hidden_size}], got [{nb}, {ns}, ...]")
        e.state.upload_start_index(lengths, s)
        self.io.upload_context_lengths(lengths + 1, s)
        if self._select_zero_batch != b:
            self.io.upload_select_token_indices(np.zeros((b, 1), np.int64), s)
            self._select_zero_batch = b
        e.tensor_map.use_deepstack_zero()
        if self._streaming_pending:
            self.io.streaming_prefill.order_before(s)
            self._streaming_pending = False
        dims = self._decode_dims.get(b)
        if dims is None:
            dims = self._decode_dims[b] = self.cfg.decode_dims(b)
        e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s)
        lengths += 1
        return self.io.output_logits

    def populate_streaming(self, stream: StreamLike = None) -> None:
        """Snapshot the prefill-time ``inputs_embeds`` and ``hidden_states`` for a streaming consumer
        (call after prefill, before the first decode)."""
        self._check_open()
        if self._batch is None:
            raise TrtioError("populate_streaming() before prefill()")
        emb = self.io.inputs_embeds
        b, seq, h = emb.shape
        hidden = self.io.output_hidden_states
        if hidden.shape != (b, seq, h):
            hidden.reshape((b, seq, h))
        self.io.streaming_prefill.populate_from_prefill(emb, hidden, b, seq, h, self.io.max_batch, self.io.max_seq,
                                                        self._stream(stream))
        self._streaming_pending = True

    def reset(self, stream: StreamLike = None) -> None:
        """Empty the KV state (lengths to 0); the next step must be a prefill."""
        self._check_open()
        self._engine.state.reset(stream)
        self._batch = None

    def memory_report(self, *, include_context_memory: bool = True) -> MemoryReport:
        """Every buffer the setup owns: PipelineIO, KV state, staging, RoPE table and context memory."""
        return self._report("create_for_llm", [self._engine], include_context_memory)

    def _check_open(self) -> None:
        if self._closed:
            raise TrtioError("this LLMSetup is closed")

    def __repr__(self) -> str:
        return f"LLMSetup(batch={self._batch}, graphs={self.executor.graphs_enabled})"


def create_for_llm(engine: Any, cfg: LLMEngineConfig, stream: StreamLike = None, *, graphs: bool = False,
                   backend: Backend | str | None = None) -> LLMSetup:
    """Bind one LLM engine to a new PipelineIO (see :class:`LLMSetup`)."""
    return LLMSetup(engine, cfg, stream, graphs=graphs, backend=backend)


class SpecDecodeSetup(_SetupBase):
    """A spec-decode base + draft sharing one PipelineIO (see module docstring).

    Lengths: ``base_lengths`` counts tokens the base has cached and committed; the draft's cache is
    committed up to the same length (its proposal entries past it are scratch, rewritten by
    :meth:`draft_accept`).
    """

    def __init__(self, base_engine: Any, draft_engine: Any, bundle: DeploymentConfig,
                 max_runtime_batch_size: int | None = None, stream: StreamLike = None, *, graphs: bool = False,
                 backend: Backend | str | None = None) -> None:
        self._closed = True
        bundle.validate()
        if bundle.draft is None or bundle.spec is None:
            raise TrtioError("create_for_spec_decode needs a DeploymentConfig with a draft and a spec section")
        be = _engine_backend(base_engine, backend)
        self._backend = be
        self.bundle = bundle
        base_cfg, draft_cfg = bundle.base, bundle.draft
        closer = self._closer = _Closer()
        try:
            self._default_stream = s = as_stream(stream, be)  # None: trtio's default stream of the backend
            self.io = io = closer.add(PipelineIO.create_for_spec_decode(bundle, max_runtime_batch_size, s, backend=be))
            mb = io.max_batch
            self._rope = closer.add(_RopeTables(be))
            self._context_memory = closer.add(ContextMemory.for_engines([base_engine, draft_engine], backend=be))
            self.base = _make_engine(base_engine, base_cfg, io.build_tensor_map(base_cfg), max_batch=mb, backend=be,
                                     context_memory=self._context_memory, graphs=graphs, rope=self._rope, stream=s,
                                     closer=closer, name="base")
            self.draft = _make_engine(draft_engine, draft_cfg, io.build_tensor_map_for_spec_decode_draft(draft_cfg),
                                      max_batch=mb, backend=be, context_memory=self._context_memory, graphs=graphs,
                                      rope=self._rope, stream=s, closer=closer, name="draft")
            step = max(bundle.effective_max_draft_proposal_size(), 1)
            self._extra_arena = closer.add(Arena([
                TensorRequest.of("host_inputs_embeds", (mb, step, base_cfg.hidden_size), base_cfg.activation,
                                 Location.PINNED)], backend=be, title="spec_decode staging"))
            self._embeds_staging = closer.add(HostStaging(self._extra_arena["host_inputs_embeds"], io.inputs_embeds, be))
            _fill_mrope(io, base_cfg, s)
        except BaseException:
            closer.close_all()
            raise
        self._closed = False
        self._batch: int | None = None
        self._draft_last_row = np.zeros(mb, np.int64)  # row of draft_hidden_states_out holding each sequence's latest draft hidden
        self._draft_lengths = np.zeros(mb, np.int64)  # draft cache entries incl. proposal scratch

    # -- public views ---------------------------------------------------------------------------
    @property
    def base_lengths(self) -> np.ndarray:
        b = self._batch or 0
        return self.base.state.lengths[:b].copy()

    @property
    def graph_stats(self) -> dict[str, Any]:
        return {"base": self.base.executor.graph_stats, "draft": self.draft.executor.graph_stats}

    @property
    def batch(self) -> int | None:
        return self._batch

    def _check_open(self) -> None:
        if self._closed:
            raise TrtioError("this SpecDecodeSetup is closed")

    def _need_batch(self) -> int:
        if self._batch is None:
            raise TrtioError("run base_prefill() first: there is no sequence to continue")
        return self._batch

    # -- phases ---------------------------------------------------------------------------------
    def base_prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None, *,
                     deepstack_embeds: Sequence[Any] | None = None) -> Tensor:
        """Base over the prompts (profile 0, causal mask [B,1,1]); returns logits [batch, vocab].

        The base's ``hidden_states`` land in ``io.base_hidden_states`` [batch, seq, ...], which the draft
        prefill reads as ``hidden_states_input`` at the same address. Without ``deepstack_embeds`` the
        deepstack inputs are zero.
        """
        self._check_open()
        e = self.base
        s = self._stream(stream)
        b, seq, ctx = self._stage_prompt(e, inputs_embeds, context_lengths, s)
        self._bind_deepstack(e, deepstack_embeds, b, seq, s)
        self._run_prefill(e, b, seq, ctx, s)
        self._batch = b
        return self.io.output_logits

    def draft_prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None) -> Tensor:
        """Draft over the prompts shifted by one token (EAGLE): row p holds the embedding of token p+1,
        ``hidden_states_input`` is the base prefill's hidden states (no copy), ``hidden_states_from_draft``
        is zero. Returns the draft logits [batch, draft vocab] at each sequence's last row."""
        self._check_open()
        b0 = self._need_batch()
        e = self.draft
        s = self._stream(stream)
        b, seq, ctx = self._stage_prompt(e, inputs_embeds, context_lengths, s)
        if b != b0:
            raise ShapeError(f"inputs_embeds: batch {b} differs from the base prefill's batch {b0}")
        self.io.base_hidden_states.reshape((b, seq, e.cfg.base_model_hidden_size))
        self.io.draft_hidden_states_in.reshape((b, seq, e.cfg.hidden_size)).zero_(s)
        self._run_prefill(e, b, seq, ctx, s)
        self._draft_lengths[:b] = ctx
        self._draft_last_row[:b] = ctx - 1
        return self.io.output_logits

    def _carry_draft_hidden(self, b: int, s: Stream) -> None:
        """Copy each sequence's latest draft hidden row into row 0 of ``draft_hidden_states_in``."""
        out, dst = self.io.draft_hidden_states_out, self.io.draft_hidden_states_in
        h = self.draft.cfg.hidden_size
        row = h * out.dtype.itemsize
        out_seq = out.shape[1] if len(out.shape) == 3 else 1
        rows = self._draft_last_row[:b]
        be = self._backend
        if (rows == 0).all() and out_seq == 1:
            be.memcpy(dst.data_ptr, out.data_ptr, b * row, s.handle)
        else:
            for i in range(b):
                be.memcpy(dst.data_ptr + i * row, out.data_ptr + (i * out_seq + int(rows[i])) * row, row, s.handle)

    def draft_propose(self, inputs_embeds: Any, stream: StreamLike = None) -> Tensor:
        """One chain proposal step of the draft: one token per sequence (its last proposal) after the
        draft's cache, conditioned on the draft's previous hidden state; returns logits [batch, draft vocab].

        Following Edge-LLM, ``hidden_states_input`` (the base's hidden states) is zero here.
        """
        self._check_open()
        b = self._need_batch()
        e = self.draft
        s = self._stream(stream)
        nb, ns = self._stage_embeds(inputs_embeds, self._embeds_staging, "inputs_embeds", e.cfg.hidden_size, s)
        if (nb, ns) != (b, 1):
            raise ShapeError(f"inputs_embeds: a proposal step takes [batch={b}, 1, hidden], got [{nb}, {ns}, ...]")
        lengths = self._draft_lengths[:b]
        if int(lengths.max()) >= e.cfg.max_kv_cache_capacity:
            raise ShapeError("draft KV cache full")
        self._carry_draft_hidden(b, s)
        self.io.draft_hidden_states_in.reshape((b, 1, e.cfg.hidden_size))
        self.io.base_hidden_states.reshape((b, 1, e.cfg.base_model_hidden_size)).zero_(s)
        e.state.upload_start_index(lengths, s)  # a one-token step: the mask is the [B,1,1] causal sentinel
        self.io.upload_context_lengths(lengths + 1, s)
        self.io.upload_select_token_indices(np.zeros((b, 1), np.int64), s)
        dims = e.cfg.proposal_dims(b, 1, 1)
        e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s)
        lengths += 1
        self._draft_last_row[:b] = 0
        return self.io.output_logits

    def verify(self, inputs_embeds: Any, tree: Any, stream: StreamLike = None) -> Tensor:
        """Base over a token tree per sequence; returns logits [batch * N, vocab] for every node.

        ``tree`` is a parent list (shared by the batch; -1 for the root) or an unpacked mask [B, N, N]
        (node t sees node i). Nodes go to cache slots ``length + t``; positions are length + depth.
        The base cache is not committed until :meth:`accept`.
        """
        self._check_open()
        b = self._need_batch()
        e = self.base
        s = self._stream(stream)
        mask = np.asarray(tree)
        if mask.ndim == 1:
            mask = np.broadcast_to(ancestor_mask(mask), (b,) + (mask.shape[0],) * 2)
        if mask.ndim != 3 or mask.shape[0] != b:
            raise ShapeError(f"tree: expected a parent list or a [batch={b}, N, N] mask, got shape {mask.shape}")
        n = mask.shape[1]
        nb, ns = self._stage_embeds(inputs_embeds, self._embeds_staging, "inputs_embeds", e.cfg.hidden_size, s)
        if (nb, ns) != (b, n):
            raise ShapeError(f"inputs_embeds: verify of {n} nodes takes [batch={b}, {n}, hidden], got [{nb}, {ns}, ...]")
        lengths = e.state.lengths[:b]
        if int(lengths.max()) + n > e.cfg.max_kv_cache_capacity:
            raise ShapeError(f"verify: {n} nodes do not fit after {int(lengths.max())} cached tokens "
                             f"(max_kv_cache_capacity {e.cfg.max_kv_cache_capacity})")
        self.io.upload_tree(pack_tree_mask(mask), tree_position_ids(mask, lengths), s)
        e.state.upload_start_index(lengths, s)
        self.io.upload_context_lengths(lengths + n, s)
        self.io.upload_select_token_indices(np.broadcast_to(np.arange(n, dtype=np.int64), (b, n)), s)
        e.tensor_map.use_deepstack_zero()
        dims = e.cfg.spec_verify_dims(b, n)
        e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s)
        self._verify_nodes = n
        return self.io.output_logits

    def accept(self, paths: Sequence[Sequence[int]], stream: StreamLike = None) -> None:
        """Commit each sequence's accepted root-to-node path of the last verify tree.

        The path's nodes are compacted in the base KV cache to consecutive slots after the committed
        length, their base hidden-state rows to rows 0.. of ``base_hidden_states`` (what
        :meth:`draft_accept` reads), and the base lengths grow by the path length.
        """
        self._check_open()
        b = self._need_batch()
        n = getattr(self, "_verify_nodes", None)
        if n is None:
            raise TrtioError("accept() before verify()")
        if len(paths) != b:
            raise ShapeError(f"paths: expected one path per sequence ({b}), got {len(paths)}")
        s = self._stream(stream)
        be = self._backend
        lengths = self.base.state.lengths
        hidden = self.io.base_hidden_states
        hrow = hidden.shape[2] * hidden.dtype.itemsize
        for i, path in enumerate(paths):
            path = [int(p) for p in path]
            if not path or path[0] != 0 or any(p < 0 or p >= n for p in path) or sorted(set(path)) != path:
                raise ShapeError(f"paths[{i}] = {path}: expected increasing node indices in 0..{n - 1} "
                                 f"starting at the root 0")
            start = int(lengths[i])
            for j, node in enumerate(path):
                if node != j:
                    self._move_kv_slot(i, start + node, start + j, s)
                    be.memcpy(hidden.data_ptr + (i * n + j) * hrow, hidden.data_ptr + (i * n + node) * hrow, hrow,
                              s.handle)
            lengths[i] = start + len(path)
        self._verify_nodes = None

    def _move_kv_slot(self, batch_index: int, src_slot: int, dst_slot: int, s: Stream) -> None:
        """Copy one token's K/V (every head) from ``src_slot`` to ``dst_slot`` in each base cache."""
        for t in self.base.state.tensors.values():
            shape = self.base.state.shape_for(t.name, self.io.max_batch)
            if len(shape) != 4:
                raise TrtioError(f"accept: state {t.name!r} is not a [batch, heads, capacity, head_dim] cache")
            _, heads, cap, hd = shape
            es = t.dtype.itemsize
            pitch = cap * hd * es
            base = t.data_ptr + batch_index * heads * pitch
            self._backend.memcpy_2d(base + dst_slot * hd * es, pitch, base + src_slot * hd * es, pitch, hd * es,
                                    heads, s.handle)

    def draft_accept(self, inputs_embeds: Any, accept_lengths: Any, stream: StreamLike = None) -> Tensor:
        """The draft's catch-up over the accepted tokens (shifted by one, as in the prefill): row t of
        sequence b holds the embedding of the token after accepted node t; ``hidden_states_input`` rows are
        the accepted nodes' base hidden states (compacted by :meth:`accept`). Starts at the draft's
        committed length; returns draft logits [batch, draft vocab] at each sequence's last accepted row."""
        self._check_open()
        b = self._need_batch()
        e = self.draft
        s = self._stream(stream)
        nb, a = self._stage_embeds(inputs_embeds, self._embeds_staging, "inputs_embeds", e.cfg.hidden_size, s)
        if nb != b:
            raise ShapeError(f"inputs_embeds: batch {nb} differs from {b}")
        acc = self._check_lengths(accept_lengths, b, a, "accept_lengths")
        start = self.base.state.lengths[:b] - acc  # the draft is committed up to the base's previous length
        if (start < 0).any():
            raise ShapeError("accept_lengths exceed the committed base lengths; call accept() first")
        hb = e.cfg.base_model_hidden_size
        n = self.io.base_hidden_states.shape[1] if len(self.io.base_hidden_states.shape) == 3 else a
        if n != a:
            self._compact_rows(self.io.base_hidden_states, b, n, a, hb, s)
        self.io.base_hidden_states.reshape((b, a, hb))
        self.io.draft_hidden_states_in.reshape((b, a, e.cfg.hidden_size)).zero_(s)
        causal = np.stack([np.tril(np.ones((a, a), bool)) & (np.arange(a)[None, :] < k) & (np.arange(a)[:, None] < k)
                           for k in acc])
        pos = np.where(np.arange(a)[None, :] < acc[:, None], start[:, None] + np.arange(a)[None, :], 0)
        self.io.upload_tree(pack_tree_mask(causal), pos.astype(np.int32), s)
        e.state.upload_start_index(start, s)
        self.io.upload_context_lengths(start + a, s)
        self.io.upload_select_token_indices((acc - 1)[:, None], s)
        dims = e.cfg.accept_dims(b, a)
        e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s)
        e.state.lengths[:b] = start + acc
        self._draft_lengths[:b] = start + acc
        self._draft_last_row[:b] = acc - 1
        return self.io.output_logits

    def _compact_rows(self, t: Tensor, b: int, n: int, a: int, width: int, s: Stream) -> None:
        """Re-lay rows [b, :a] of a [b, n, width] view as a [b, a, width] view, in place.

        Row by row in increasing order: each destination row precedes its source row, so no copy
        overwrites a row a later copy still reads, and no single copy overlaps itself.
        """
        row = width * t.dtype.itemsize
        for i in range(1, b):
            for r in range(a):
                self._backend.memcpy(t.data_ptr + (i * a + r) * row, t.data_ptr + (i * n + r) * row, row, s.handle)

    def reset(self, stream: StreamLike = None) -> None:
        self._check_open()
        self.base.state.reset(stream)
        self.draft.state.reset(stream)
        self._draft_lengths[:] = 0
        self._batch = None

    def memory_report(self, *, include_context_memory: bool = True) -> MemoryReport:
        """Every buffer the setup owns: the shared PipelineIO, both KV states, staging, RoPE tables and
        the shared context memory."""
        return self._report("create_for_spec_decode", [self.base, self.draft], include_context_memory)

    def __repr__(self) -> str:
        return f"SpecDecodeSetup(batch={self._batch})"


def create_for_spec_decode(base_engine: Any, draft_engine: Any, bundle: DeploymentConfig,
                           max_runtime_batch_size: int | None = None, stream: StreamLike = None, *,
                           graphs: bool = False, backend: Backend | str | None = None) -> SpecDecodeSetup:
    """Bind a base + draft pair to one shared PipelineIO (see :class:`SpecDecodeSetup`)."""
    return SpecDecodeSetup(base_engine, draft_engine, bundle, max_runtime_batch_size, stream, graphs=graphs,
                           backend=backend)
