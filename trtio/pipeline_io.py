"""PipelineIO: every tensor that flows through an inference pipeline, allocated once at worst case.

This is Edge-LLM's ``PipelineIO`` in Python. ``create_for_llm`` sets up one engine,
``create_for_spec_decode`` a base + draft pair that share these buffers. All members are slices
of one :class:`~trtio.memory.Arena` (one allocation per location).

POINTER STABILITY INVARIANT, enforced: once a tensor map has been built, assigning a member,
growing or shrinking ``deepstack_embeds``, reallocating a member or closing a member tensor
raises :class:`FrozenError`. Reshaping within capacity stays allowed: that is how each step
views the worst-case buffers at its own shape.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from trtio import names
from trtio._lifetime import open_binders
from trtio.config import DeploymentConfig, LLMEngineConfig
from trtio.cuda.backend import Backend, Location, get_backend
from trtio.dtypes import DType
from trtio.errors import CapacityError, ClosedError, FrozenError, ShapeError, TrtioError
from trtio.memory import Arena, HostStaging, MemoryEntry, MemoryReport, TensorRequest
from trtio.staging import StepStaging
from trtio.stream import Event, StreamLike, as_stream
from trtio.tensor import ShapeLike, Tensor, normalize_shape
from trtio.tensor_map import TensorMap

__all__ = ["PipelineIO", "StreamingPrefillBuffers"]

log = logging.getLogger("trtio")

# PipelineIO's members, in Edge-LLM's order (snake_case); deepstack_embeds is a list.
MEMBERS = (
    "inputs_embeds", "output_logits", "select_token_indices", "context_lengths",
    "host_context_lengths", "host_select_token_indices", "deepstack_embeds", "mrope_cos_sin",
    "base_hidden_states", "draft_hidden_states_in", "draft_hidden_states_out",
    "output_hidden_states", "streaming_prefill", "packed_attention_mask", "spec_decode_position_ids",
)
# trtio's additions: the deepstack zero buffer and the pinned twins of the spec-decode inputs.
EXTRA_MEMBERS = (
    "deepstack_zero", "host_packed_attention_mask", "host_spec_decode_position_ids",
    "host_spec_select_token_indices",
)
# The token-major ("ragged") contract's members (Edge-LLM 0.11). Per-step inputs live in one StepStaging
# (a device block the engine binds and its pinned twin: one host write and one copy per step);
# packed_attention_mask and spec_decode_position_ids join them there on this contract.
RAGGED_STEP_MEMBERS = (
    "query_start_offsets", "query_lengths", "past_lengths", "attention_sequence_lengths", "state_indices",
    "logits_indices", "row_src", "row_dst", "rope_rows", "positions", "spec_tree_parent_ids", "spec_tree_depths",
)
RAGGED_MEMBERS = (
    "ragged_rope_cos_sin", "execution_phase_marker", "context_sequence_count_carrier", "skip_softmax_scale",
    "row_scratch",
)


def _frozen_guard(name: str) -> Callable[..., Any]:
    """``list.<name>``, refused (:class:`FrozenError`) while the :class:`_FrozenList` is frozen."""
    base = getattr(list, name)

    def method(self: _FrozenList, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return base(self, *args, **kwargs)

    method.__name__ = name
    return method


class _FrozenList(list[Tensor]):
    """A list that refuses to change size or items once its owner is frozen."""

    _frozen = False

    def _check(self) -> None:
        if self._frozen:
            raise FrozenError(
                "deepstack_embeds cannot change after a tensor map was built: the map holds "
                "its tensors by address (POINTER STABILITY INVARIANT)")

    append = _frozen_guard("append")
    extend = _frozen_guard("extend")
    insert = _frozen_guard("insert")
    pop = _frozen_guard("pop")
    remove = _frozen_guard("remove")
    clear = _frozen_guard("clear")
    sort = _frozen_guard("sort")
    reverse = _frozen_guard("reverse")
    __setitem__ = _frozen_guard("__setitem__")
    __delitem__ = _frozen_guard("__delitem__")
    __iadd__ = _frozen_guard("__iadd__")
    __imul__ = _frozen_guard("__imul__")


class StreamingPrefillBuffers:
    """Persistent copies of the prefill-time ``inputs_embeds`` and engine ``hidden_states``.

    Streaming consumers (Edge-LLM's Qwen3-Omni Talker) read these while the decode loop
    overwrites the live buffers. Allocated on the first :meth:`populate_from_prefill` (at the
    worst case, in the live tensors' dtypes), reused afterwards.
    """

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._arena: Arena | None = None
        self.input_embeds: Tensor = Tensor(0, (0,), DType.FLOAT16, Location.DEVICE, 0, backend,
                                           name="streaming.input_embeds")
        self.engine_hidden_states: Tensor = Tensor(0, (0,), DType.FLOAT16, Location.DEVICE, 0, backend,
                                                   name="streaming.engine_hidden_states")
        self._ready: Event | None = None
        self._released: Event | None = None
        self._released_pending = False
        self._closed = False
        self._worst = (0, 0, 0)

    @property
    def is_allocated(self) -> bool:
        return self._arena is not None

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("streaming_prefill is closed")

    @property
    def ready_event(self) -> Event:
        """Recorded after the copies; a consumer on another stream waits on it before reading."""
        self._check_open()
        if self._ready is None:
            raise TrtioError("streaming_prefill: populate_from_prefill has not been called yet")
        return self._ready

    def release(self, stream: StreamLike) -> None:
        """Record that the consumer on ``stream`` is done; the next populate waits for it (on the device)."""
        self._check_open()
        if self._released is None:
            self._released = Event.create(self._backend)
        self._released.record(as_stream(stream, self._backend))
        self._released_pending = True

    def populate_from_prefill(self, live_inputs_embeds: Tensor, live_engine_hidden_states: Tensor,
                              batch: int, prefill_len: int, hidden_size: int, max_batch: int,
                              max_seq: int, stream: StreamLike = None) -> None:
        """Copy the live prefill buffers on ``stream``; allocate on the first call.

        Call after prefill and before the first decode step. Each live tensor's current shape
        must be ``(batch, prefill_len, hidden_size)``.
        """
        self._check_open()
        want = (batch, prefill_len, hidden_size)
        for label, t in (("live_inputs_embeds", live_inputs_embeds),
                         ("live_engine_hidden_states", live_engine_hidden_states)):
            if t.shape != want:
                raise ShapeError(f"streaming_prefill: {label} ({t.name!r}) has shape {t.shape}, "
                                 f"expected (batch, prefill_len, hidden_size) = {want}")
        s = as_stream(stream, self._backend)
        if self._arena is None:
            normalize_shape((max_batch, max_seq, hidden_size), "streaming_prefill worst case")
            if batch > max_batch or prefill_len > max_seq:
                raise CapacityError(f"streaming_prefill: request {want} exceeds the worst case "
                                    f"({max_batch}, {max_seq}, {hidden_size})")
            self._arena = Arena([
                TensorRequest.of("streaming.input_embeds", (max_batch, max_seq, hidden_size), live_inputs_embeds.dtype),
                TensorRequest.of("streaming.engine_hidden_states", (max_batch, max_seq, hidden_size),
                                 live_engine_hidden_states.dtype),
            ], backend=self._backend, title="streaming_prefill")
            self.input_embeds = self._arena["streaming.input_embeds"]
            self.engine_hidden_states = self._arena["streaming.engine_hidden_states"]
            self._ready = Event.create(self._backend)
            self._worst = (max_batch, max_seq, hidden_size)
        wb, ws, wh = self._worst
        if batch > wb or prefill_len > ws or hidden_size != wh:
            raise CapacityError(f"streaming_prefill: request {want} exceeds the allocation made on the first call "
                                f"({self._worst})")
        for label, live, mine in (("inputs_embeds", live_inputs_embeds, self.input_embeds),
                                  ("engine_hidden_states", live_engine_hidden_states, self.engine_hidden_states)):
            if live.dtype is not mine.dtype:
                raise ShapeError(f"streaming_prefill: live {label} is {live.dtype} but the buffers were "
                                 f"allocated as {mine.dtype}")
            mine.reshape(want)
        if self._released_pending:
            assert self._released is not None
            self._released.wait(s)  # the previous consumer must be done before we overwrite
            self._released_pending = False
        self.input_embeds.copy_from(live_inputs_embeds, s)
        self.engine_hidden_states.copy_from(live_engine_hidden_states, s)
        assert self._ready is not None
        self._ready.record(s)

    def order_before(self, stream: StreamLike) -> None:
        """Make ``stream`` (a decode stream) wait for the snapshot copies (no host sync)."""
        self._check_open()
        if self._ready is not None:
            self._ready.wait(as_stream(stream, self._backend))

    def memory_report(self) -> MemoryReport:
        self._check_open()
        if self._arena is None:
            rep = MemoryReport("streaming_prefill")
            rep.notes.append("streaming_prefill: not allocated (no streaming consumer yet)")
            return rep
        return self._arena.report()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ev in (self._ready, self._released):
            if ev is not None:
                ev.close()
        if self._arena is not None:
            self._arena.close()


def _absent(name: str, dtype: DType, location: Location = Location.DEVICE) -> TensorRequest:
    return TensorRequest(name, (0,), dtype, location)


class PipelineIO:
    """All tensors flowing through an inference pipeline (see module docstring)."""

    inputs_embeds: Tensor
    output_logits: Tensor
    select_token_indices: Tensor
    context_lengths: Tensor
    host_context_lengths: Tensor
    host_select_token_indices: Tensor
    deepstack_embeds: _FrozenList
    mrope_cos_sin: Tensor
    base_hidden_states: Tensor
    draft_hidden_states_in: Tensor
    draft_hidden_states_out: Tensor
    output_hidden_states: Tensor
    streaming_prefill: StreamingPrefillBuffers
    packed_attention_mask: Tensor
    spec_decode_position_ids: Tensor
    deepstack_zero: Tensor
    host_packed_attention_mask: Tensor
    host_spec_decode_position_ids: Tensor
    host_spec_select_token_indices: Tensor
    # ragged contract
    query_start_offsets: Tensor
    query_lengths: Tensor
    past_lengths: Tensor
    attention_sequence_lengths: Tensor
    state_indices: Tensor
    logits_indices: Tensor
    row_src: Tensor
    row_dst: Tensor
    rope_rows: Tensor
    positions: Tensor
    spec_tree_parent_ids: Tensor
    spec_tree_depths: Tensor
    ragged_rope_cos_sin: Tensor
    execution_phase_marker: Tensor
    context_sequence_count_carrier: Tensor
    skip_softmax_scale: Tensor
    row_scratch: Tensor
    step: StepStaging | None
    contract: str
    max_batch: int
    max_seq: int
    hidden_size: int
    is_spec_decode: bool
    context_lengths_staging: HostStaging
    select_token_indices_staging: HostStaging
    # Plain assignment works from the start: __setattr__ reads these before __init__ sets them.
    _frozen: bool = False
    _closed: bool = False
    _arena: Arena
    _backend: Backend
    _standalone: dict[str, Tensor]  # members replaced by reallocate()
    _maps: list[TensorMap]  # tensor maps built from this PipelineIO (their executors pin it)
    _spec_staging: dict[str, HostStaging]

    def __init__(self, requests: list[TensorRequest], *, num_deepstack: int, max_batch: int, max_seq: int,
                 hidden_size: int, is_spec_decode: bool, backend: Backend, title: str,
                 step_requests: list[TensorRequest] | None = None, contract: str = "batch") -> None:
        """Internal: use :meth:`create_for_llm` or :meth:`create_for_spec_decode`."""
        step_requests = step_requests or []
        arena = Arena(requests + StepStaging.requests(step_requests), backend=backend, title=title)
        step = None
        if step_requests:
            try:
                step = StepStaging(arena, [r.name for r in step_requests], title=f"{title} per-step inputs")
            except BaseException:
                arena.close()
                raise
        self.step = step
        self.contract = contract
        self._arena = arena
        self._backend = backend
        self._standalone = {}
        self._maps = []
        self.max_batch = max_batch
        self.max_seq = max_seq
        self.hidden_size = hidden_size
        self.is_spec_decode = is_spec_decode
        t = arena.tensors
        if step is not None:
            t.update(step.tensors)
        for m in MEMBERS + EXTRA_MEMBERS + RAGGED_STEP_MEMBERS + RAGGED_MEMBERS:
            if m in t:
                setattr(self, m, t[m])
        self.deepstack_embeds = _FrozenList(t[names.deepstack_embeds(i)] for i in range(num_deepstack))
        self.streaming_prefill = StreamingPrefillBuffers(backend)
        self.context_lengths_staging = HostStaging(self.host_context_lengths, self.context_lengths, backend)
        self.select_token_indices_staging = HostStaging(self.host_select_token_indices, self.select_token_indices,
                                                        backend)
        staging: dict[str, HostStaging] = {}
        if is_spec_decode and contract == "batch":
            staging = {
                "mask": HostStaging(self.host_packed_attention_mask, self.packed_attention_mask, backend),
                "position_ids": HostStaging(self.host_spec_decode_position_ids, self.spec_decode_position_ids, backend),
                "select": HostStaging(self.host_spec_select_token_indices, self.select_token_indices, backend),
            }
        self._spec_staging = staging

    # -- factories ------------------------------------------------------------------------------
    @classmethod
    def create_for_llm(cls, cfg: LLMEngineConfig, stream: StreamLike = None, *,
                       backend: Backend | str | None = None) -> PipelineIO:
        """Worst-case buffers for one LLM engine (Edge-LLM's ``createForLLM``); token-major with the
        ragged contract's per-step members when ``cfg.contract == "ragged"``."""
        cfg.validate()
        be = get_backend(backend)
        if cfg.contract == "ragged":
            return cls._create_ragged(cfg, None, cfg.max_supported_batch_size, stream, be)
        b, s, h = cfg.max_supported_batch_size, cfg.max_supported_input_length, cfg.hidden_size
        act = cfg.activation
        reqs = _basic_requests(b, s, h, act, logits_rows=b, vocab=cfg.output_vocab_size, select_cols=1)
        reqs += _deepstack_requests(cfg.num_deepstack_features, b, s, h, act, zero_seq=1)
        reqs.append(_mrope_request(cfg, b))
        reqs += [_absent("base_hidden_states", act), _absent("draft_hidden_states_in", act),
                 _absent("draft_hidden_states_out", act),
                 TensorRequest.of("output_hidden_states", (b, s, h), act),
                 _absent("packed_attention_mask", DType.INT32), _absent("spec_decode_position_ids", DType.INT32)]
        # decode_lengths: the device's copy of the lengths, which a decode step advances itself (ops.DecodeAdvance).
        io = cls(reqs, num_deepstack=cfg.num_deepstack_features, max_batch=b, max_seq=s, hidden_size=h,
                 is_spec_decode=False, backend=be, title="PipelineIO(llm)",
                 step_requests=[TensorRequest.of("decode_lengths", (b,), DType.INT32)])
        try:
            io.deepstack_zero.zero_(as_stream(stream, be))
        except BaseException:
            io.close()
            raise
        log.debug("PipelineIO.create_for_llm: %s", io._arena)
        return io

    @classmethod
    def create_for_spec_decode(cls, bundle: DeploymentConfig, max_runtime_batch_size: int | None = None,
                               stream: StreamLike = None, *, backend: Backend | str | None = None) -> PipelineIO:
        """Buffers shared by a spec-decode base and draft (Edge-LLM's ``createForSpecDecode``).

        Sizes: ``P = max(max_draft_proposal_size, verify_size)``, sequence buffers hold
        ``max(max input length of base and draft, P)`` tokens, logits hold ``batch * P`` rows of
        ``max(base.output_vocab_size, draft.output_vocab_size)``. Spec-decode buffers are zeroed on ``stream``.
        """
        bundle.validate()
        if bundle.draft is None or bundle.spec is None:
            raise TrtioError("create_for_spec_decode needs a DeploymentConfig with a draft and a spec section")
        base, draft, spec = bundle.base, bundle.draft, bundle.spec
        limit = bundle.max_runtime_batch_size()
        b = limit if max_runtime_batch_size is None else max_runtime_batch_size
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= limit:
            raise ShapeError(f"max_runtime_batch_size must be an int in 1..{limit} (min of base and draft "
                             f"max_supported_batch_size), got {max_runtime_batch_size!r}")
        be = get_backend(backend)
        if base.contract == "ragged":
            return cls._create_ragged(base, bundle, b, stream, be)
        max_input = max(base.max_supported_input_length, draft.max_supported_input_length)
        p = bundle.effective_max_draft_proposal_size()
        seq = max(max_input, p)
        act = base.activation
        vocab = max(base.output_vocab_size, draft.output_vocab_size)
        reqs = _basic_requests(b, seq, base.hidden_size, act, logits_rows=b * p, vocab=vocab, select_cols=p)
        reqs += _deepstack_requests(base.num_deepstack_features, b, max_input, base.hidden_size, act,
                                    zero_seq=max(spec.verify_size, 1))
        reqs.append(_mrope_request(base, b))
        reqs += [
            TensorRequest.of("base_hidden_states", (b, seq, spec.base_output_hidden_dim), act),
            TensorRequest.of("draft_hidden_states_in", (b, seq, spec.draft_hidden_size), act),
            TensorRequest.of("draft_hidden_states_out", (b, seq, spec.draft_hidden_size), act),
            _absent("output_hidden_states", act),
            TensorRequest.of("packed_attention_mask", (b, p, math.ceil(p / 32)), DType.INT32),
            TensorRequest.of("spec_decode_position_ids", (b, p), DType.INT32),
            TensorRequest.of("host_packed_attention_mask", (b, p, math.ceil(p / 32)), DType.INT32, Location.PINNED),
            TensorRequest.of("host_spec_decode_position_ids", (b, p), DType.INT32, Location.PINNED),
            TensorRequest.of("host_spec_select_token_indices", (b, p), DType.INT64, Location.PINNED),
            TensorRequest.of("row_scratch", (b * p, max(spec.base_output_hidden_dim, spec.draft_hidden_size)), act),
        ]
        # Row indices of the hidden-state moves (draft inputs assembled from outputs, accepted rows compacted).
        step = [TensorRequest.of("row_src", (b * seq,), DType.INT32),
                TensorRequest.of("row_dst", (b * seq,), DType.INT32),
                TensorRequest.of("draft_parents", (b * p,), DType.INT32),  # a draft level's (ops.DraftLevel)
                TensorRequest.of("draft_roots", (b,), DType.INT32),  # each sequence's root hidden row
                # A tree step's (ops.TreeStep): the cached lengths, then a tree's constants, which the device
                # copies or expands into the engine's inputs.
                TensorRequest.of("tree_past", (b,), DType.INT32),
                TensorRequest.of("tree_lengths", (b,), DType.INT32),
                TensorRequest.of("tree_depths", (b * p,), DType.INT32),
                TensorRequest.of("tree_mask", (b * p, math.ceil(p / 32)), DType.INT32),
                TensorRequest.of("tree_select", (b * p,), DType.INT64)]
        io = cls(reqs, num_deepstack=base.num_deepstack_features, max_batch=b, max_seq=seq,
                 hidden_size=base.hidden_size, is_spec_decode=True, backend=be, title="PipelineIO(spec_decode)",
                 step_requests=step)
        try:
            s = as_stream(stream, be)
            for t in (io.select_token_indices, io.base_hidden_states, io.draft_hidden_states_in,
                      io.draft_hidden_states_out, io.packed_attention_mask, io.spec_decode_position_ids,
                      io.deepstack_zero):
                t.zero_(s)
        except BaseException:
            io.close()
            raise
        return io

    @classmethod
    def _create_ragged(cls, base: LLMEngineConfig, bundle: DeploymentConfig | None, b: int, stream: StreamLike,
                       be: Backend) -> PipelineIO:
        """Token-major worst case (the ragged contract): ``T`` rows = batch x the longest step of any
        engine (prompt, verify tree or draft tree), logits rows = batch x the most rows a step selects."""
        act, h = base.activation, base.hidden_size
        spec = bundle.spec if bundle is not None else None
        draft = bundle.draft if bundle is not None else None
        p = bundle.effective_max_draft_proposal_size() if bundle is not None else 1
        max_input = max(base.max_supported_input_length,
                        draft.max_supported_input_length if draft is not None else 0)
        t = b * max(max_input, p)
        rows = b * p  # logits rows: one per sequence (LLM), every tree node (verify), top-k per sequence (draft)
        vocab = max(base.output_vocab_size, draft.output_vocab_size if draft is not None else 0)
        words = math.ceil(p / 32)
        i32 = DType.INT32
        reqs = [
            TensorRequest.of("inputs_embeds", (t, h), act),
            TensorRequest.of("output_logits", (rows, vocab), DType.FLOAT32),
            _absent("select_token_indices", DType.INT64), _absent("context_lengths", i32),
            _absent("host_context_lengths", i32, Location.PINNED),
            _absent("host_select_token_indices", DType.INT64, Location.PINNED),
        ]
        nd = base.num_deepstack_features
        reqs += [TensorRequest.of(names.deepstack_embeds(i), (t, h), act) for i in range(nd)]
        zero_rows = b * (max(spec.verify_size, 1) if spec is not None else 1)
        reqs.append(TensorRequest.of("deepstack_zero", (zero_rows, h), act) if nd else _absent("deepstack_zero", act))
        reqs.append(_mrope_request(base, b))
        if bundle is not None and spec is not None:
            width = max(spec.base_output_hidden_dim, spec.draft_hidden_size)
            reqs += [
                TensorRequest.of("base_hidden_states", (t, spec.base_output_hidden_dim), act),
                TensorRequest.of("draft_hidden_states_in", (t, spec.draft_hidden_size), act),
                TensorRequest.of("draft_hidden_states_out", (t, spec.draft_hidden_size), act),
                TensorRequest.of("row_scratch", (rows, width), act),
            ]
        else:
            reqs += [_absent(m, act) for m in ("base_hidden_states", "draft_hidden_states_in",
                                               "draft_hidden_states_out", "row_scratch")]
        reqs += [
            _absent("output_hidden_states", act),
            _absent("host_spec_select_token_indices", DType.INT64, Location.PINNED),
            TensorRequest.of("ragged_rope_cos_sin", (t, base.rotary_dim), DType.FLOAT32),
            # Shape-only carriers: the engine reads their extents, never their bytes.
            TensorRequest.of("execution_phase_marker", (8,), i32),
            TensorRequest.of("context_sequence_count_carrier", (b,), i32),
            TensorRequest.of("skip_softmax_scale", (1,), DType.INT8),
        ]
        # Per-step inputs, smallest first: a decode step's upload then copies a short prefix of the block.
        # decode_lengths (an LLM's): the device's copy of the lengths, which a decode step advances itself.
        step = [TensorRequest.of("decode_lengths", (b,), i32)] if bundle is None else []
        step += [
            TensorRequest.of("query_start_offsets", (b + 1,), i32),
            TensorRequest.of("query_lengths", (b,), i32),
            TensorRequest.of("past_lengths", (b,), i32),
            TensorRequest.of("attention_sequence_lengths", (b,), i32),
            TensorRequest.of("state_indices", (b,), i32),
            TensorRequest.of("logits_indices", (rows,), DType.INT64),
            TensorRequest.of("row_src", (t,), i32),
            TensorRequest.of("row_dst", (t,), i32),
            TensorRequest.of("rope_rows", (t,), i32),
            TensorRequest.of("positions", (t,), i32),
        ]
        if bundle is not None:
            step += [
                TensorRequest.of("spec_decode_position_ids", (t,), i32),
                TensorRequest.of("spec_tree_parent_ids", (t,), i32),
                TensorRequest.of("spec_tree_depths", (t,), i32),
                TensorRequest.of("packed_attention_mask", (t, words), i32),
                TensorRequest.of("draft_parents", (rows,), i32),  # a draft level's parents (ops.DraftLevel)
            ]
        else:
            reqs += [_absent("packed_attention_mask", i32), _absent("spec_decode_position_ids", i32),
                     _absent("spec_tree_parent_ids", i32), _absent("spec_tree_depths", i32),
                     _absent("host_packed_attention_mask", i32, Location.PINNED),
                     _absent("host_spec_decode_position_ids", i32, Location.PINNED)]
        title = "PipelineIO(spec_decode, ragged)" if bundle is not None else "PipelineIO(llm, ragged)"
        io = cls(reqs, num_deepstack=nd, max_batch=b, max_seq=t // b, hidden_size=h, is_spec_decode=bundle is not None,
                 backend=be, title=title, step_requests=step, contract="ragged")
        try:
            s = as_stream(stream, be)
            for z in (io.execution_phase_marker, io.context_sequence_count_carrier, io.skip_softmax_scale,
                      io.deepstack_zero, io.base_hidden_states, io.draft_hidden_states_in, io.draft_hidden_states_out):
                z.zero_(s)
        except BaseException:
            io.close()
            raise
        return io

    # -- freezing -------------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if self._closed:
            raise ClosedError("PipelineIO is closed")
        if name in MEMBERS or name in EXTRA_MEMBERS or name in RAGGED_STEP_MEMBERS or name in RAGGED_MEMBERS:
            if self._frozen:
                raise FrozenError(
                    f"PipelineIO.{name} cannot be reassigned after a tensor map was built "
                    f"(POINTER STABILITY INVARIANT: bound addresses would go stale)")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name in MEMBERS or name in EXTRA_MEMBERS:
            raise FrozenError(f"PipelineIO.{name} cannot be deleted: the pipeline owns it until close()")
        object.__delattr__(self, name)

    @property
    def is_frozen(self) -> bool:
        return self._frozen

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def backend(self) -> Backend:
        return self._backend

    def _member_tensors(self) -> Iterable[Tensor]:
        for m in MEMBERS + EXTRA_MEMBERS + RAGGED_STEP_MEMBERS + RAGGED_MEMBERS:
            v = getattr(self, m, None)
            if isinstance(v, Tensor):
                yield v
        yield from self.deepstack_embeds

    def _freeze(self) -> None:
        if not self._frozen:
            self._frozen = True
            self.deepstack_embeds._frozen = True
            for t in self._member_tensors():
                t._freeze()

    def reallocate(self, member: str, shape: ShapeLike) -> Tensor:
        """Replace a member with a new, standalone allocation of ``shape`` (same dtype and location).

        Allowed only before a tensor map is built; afterwards it raises :class:`FrozenError`.
        """
        self._check_open()
        if member not in MEMBERS + EXTRA_MEMBERS or not isinstance(getattr(self, member, None), Tensor):
            raise TrtioError(f"PipelineIO has no tensor member {member!r}")
        if self._frozen:
            raise FrozenError(f"PipelineIO.{member} cannot be reallocated after a tensor map was built "
                              f"(POINTER STABILITY INVARIANT)")
        old: Tensor = getattr(self, member)
        new = Tensor.empty(shape, old.dtype, old.location, name=member, backend=self._backend)
        prev = self._standalone.pop(member, None)
        if prev is not None:
            prev.close()
        self._standalone[member] = new
        object.__setattr__(self, member, new)
        return new

    # -- tensor maps ----------------------------------------------------------------------------
    def _common_map(self, cfg: LLMEngineConfig, title: str) -> TensorMap:
        self._check_open()
        tm = TensorMap(title)
        self._maps.append(tm)
        tm.set(names.kInputsEmbeds, self.inputs_embeds)
        tm.set(names.kLogits, self.output_logits)
        if self.contract == "ragged":
            self._ragged_bindings(tm)
        else:
            tm.set(names.kContextLengths, self.context_lengths)
            tm.set(names.kLastTokenIds, self.select_token_indices)
            if cfg.is_mrope:
                tm.set(names.kRopeCosSin, self.mrope_cos_sin)
            if self.is_spec_decode:
                tm.set(names.kAttentionMask, self.packed_attention_mask)
                tm.set(names.kAttentionPosId, self.spec_decode_position_ids)
        if cfg.num_deepstack_features:
            if cfg.num_deepstack_features != len(self.deepstack_embeds):
                raise TrtioError(f"{title}: config has {cfg.num_deepstack_features} deepstack features, "
                                 f"PipelineIO has {len(self.deepstack_embeds)}")
            tm.set_deepstack({names.deepstack_embeds(i): t for i, t in enumerate(self.deepstack_embeds)},
                             self.deepstack_zero)
        return tm

    def _ragged_bindings(self, tm: TensorMap) -> None:
        """The token-major contract's inputs (Edge-LLM 0.11). ``valid_tree_counts`` is an alias of
        ``query_lengths``; RoPE rows are gathered per token into ``ragged_rope_cos_sin``."""
        tm.set(names.kRopeCosSin, self.ragged_rope_cos_sin)
        tm.set(names.kPositions, self.positions)
        tm.set(names.kQueryStartOffsets, self.query_start_offsets)
        tm.set(names.kQueryLengths, self.query_lengths)
        tm.set(names.kPastLengths, self.past_lengths)
        tm.set(names.kAttentionSequenceLengths, self.attention_sequence_lengths)
        tm.set(names.kStateIndices, self.state_indices)
        tm.set(names.kExecutionPhaseMarker, self.execution_phase_marker)
        tm.set(names.kContextSequenceCountCarrier, self.context_sequence_count_carrier)
        tm.set(names.kLogitsIndices, self.logits_indices)
        tm.set(names.kSkipSoftmaxScale, self.skip_softmax_scale)
        if self.is_spec_decode:
            tm.set(names.kPackedAttentionMask, self.packed_attention_mask)
            tm.set(names.kAttentionPositionIds, self.spec_decode_position_ids)
            tm.set(names.kTreeParentIds, self.spec_tree_parent_ids)
            tm.set(names.kTreeDepths, self.spec_tree_depths)
            tm.set(names.kValidTreeCounts, self.query_lengths)

    def build_tensor_map(self, cfg: LLMEngineConfig) -> TensorMap:
        """The map for a plain LLM or a spec-decode base; freezes this PipelineIO.

        ``hidden_states`` is ``base_hidden_states`` for a spec-decode base, else
        ``output_hidden_states``. RoPE (unless MRoPE) and the KV state are added by their owners.
        """
        if cfg.is_draft:
            raise TrtioError("build_tensor_map: this config is a draft; use build_tensor_map_for_spec_decode_draft")
        if cfg.is_spec_decode_base != self.is_spec_decode:
            raise TrtioError(
                f"build_tensor_map: config is_spec_decode_base={cfg.is_spec_decode_base} but this PipelineIO "
                f"was created for {'spec decode' if self.is_spec_decode else 'a plain LLM'}")
        tm = self._common_map(cfg, "base" if cfg.is_spec_decode_base else "llm")
        hidden = self.base_hidden_states if cfg.is_spec_decode_base else self.output_hidden_states
        if not hidden.is_empty or self.contract == "batch":
            tm.set(names.kOutputHiddenStates, hidden)
        self._freeze()
        tm.freeze()
        return tm

    def build_tensor_map_for_spec_decode_draft(self, cfg: LLMEngineConfig) -> TensorMap:
        """The draft's map: ``hidden_states_input`` is the base's ``base_hidden_states`` (no copy)."""
        if not self.is_spec_decode:
            raise TrtioError("build_tensor_map_for_spec_decode_draft: PipelineIO was created for a plain LLM")
        if not cfg.is_draft:
            raise TrtioError("build_tensor_map_for_spec_decode_draft: config is not a draft "
                             "(base_model_hidden_size is 0)")
        tm = self._common_map(cfg, "draft")
        tm.set(names.kBaseModelHiddenStates, self.base_hidden_states)
        tm.set(names.kDraftModelHiddenStates, self.draft_hidden_states_in)
        tm.set(names.kOutputHiddenStates, self.draft_hidden_states_out)
        self._freeze()
        tm.freeze()
        return tm

    # -- host staging -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("PipelineIO is closed")

    def upload_context_lengths(self, values: np.ndarray, stream: StreamLike = None) -> Tensor:
        """Stage int32 ``values`` [batch] through ``host_context_lengths`` into ``context_lengths``."""
        if self._closed:  # inline: this runs every step
            raise ClosedError("PipelineIO is closed")
        return self.context_lengths_staging.upload(np.asarray(values, dtype=np.int32), stream)

    def upload_select_token_indices(self, values: np.ndarray, stream: StreamLike = None) -> Tensor:
        """Stage int64 ``values`` into ``select_token_indices`` (through the [B, 1] pinned twin, or the
        [B, P] one for spec decode when more than one column is given)."""
        if self._closed:
            raise ClosedError("PipelineIO is closed")
        values = np.asarray(values, dtype=np.int64)
        if values.ndim == 2 and values.shape[1] > 1 and self.is_spec_decode:
            return self._spec_staging["select"].upload(values, stream)
        return self.select_token_indices_staging.upload(values, stream)

    def upload_tree(self, packed_mask: np.ndarray, position_ids: np.ndarray, stream: StreamLike = None) -> None:
        """Stage a packed tree mask [B, N, W] and position ids [B, N] (spec decode only)."""
        if self._closed:
            raise ClosedError("PipelineIO is closed")
        if not self.is_spec_decode:
            raise TrtioError("upload_tree: PipelineIO was created for a plain LLM (no tree buffers)")
        self._spec_staging["mask"].upload(np.asarray(packed_mask, dtype=np.int32), stream)
        self._spec_staging["position_ids"].upload(np.asarray(position_ids, dtype=np.int32), stream)

    @property
    def staging_fence_waits(self) -> int:
        pairs = [self.context_lengths_staging, self.select_token_indices_staging, *self._spec_staging.values()]
        return sum(p.fence_waits for p in pairs)

    # -- reporting and lifetime -------------------------------------------------------------------
    def memory_report(self) -> MemoryReport:
        self._check_open()
        parts = [self._arena.report(), self.streaming_prefill.memory_report()]
        for name, t in self._standalone.items():
            rep = MemoryReport(f"standalone {name}")
            rep.entries.append(MemoryEntry(name, t.shape, str(t.dtype), str(t.location), t.capacity))
            rep.allocated[str(t.location)] = t.capacity
            rep.allocations[str(t.location)] = 1
            parts.append(rep)
        return MemoryReport.combine(self._arena.report().title, parts)

    def close(self) -> None:
        """Free everything (the arena, the streaming buffers, the fences). Idempotent.

        Refused (:class:`FrozenError`) while an open executor has a tensor map of this PipelineIO
        bound: its engine (and any captured graph) would write to freed memory. Close the setup, or
        the executors, first.
        """
        if self._closed:
            return
        users = sorted({u for tm in self._maps for u in tm.open_users()} | set(open_binders(self._arena))
                       | {u for t in self._standalone.values() for u in open_binders(t)})
        if users:
            raise FrozenError(f"PipelineIO is bound by open executor(s) {users}: freeing it would leave their "
                              f"engines (and captured graphs) writing to freed memory; close the setup first")
        self._frozen = False
        self.deepstack_embeds._frozen = False
        for t in self._member_tensors():
            t._unfreeze()
        self._closed = True
        for pair in [self.context_lengths_staging, self.select_token_indices_staging, *self._spec_staging.values()]:
            pair.close()
        self.streaming_prefill.close()
        for t in self._standalone.values():
            t.close()
        if self.step is not None:
            self.step.close()
        self._arena.close()

    def __enter__(self) -> PipelineIO:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "spec_decode" if self.is_spec_decode else "llm"
        state = "closed" if self._closed else ("frozen" if self._frozen else "open")
        return f"PipelineIO({kind}, max_batch={self.max_batch}, max_seq={self.max_seq}, {state})"


def _basic_requests(b: int, seq: int, h: int, act: DType, *, logits_rows: int, vocab: int,
                    select_cols: int) -> list[TensorRequest]:
    return [
        TensorRequest.of("inputs_embeds", (b, seq, h), act),
        TensorRequest.of("output_logits", (logits_rows, vocab), DType.FLOAT32),
        TensorRequest.of("select_token_indices", (b, select_cols), DType.INT64),
        TensorRequest.of("context_lengths", (b,), DType.INT32),
        TensorRequest.of("host_context_lengths", (b,), DType.INT32, Location.PINNED),
        TensorRequest.of("host_select_token_indices", (b, 1), DType.INT64, Location.PINNED),
    ]


def _deepstack_requests(n: int, b: int, seq: int, h: int, act: DType, *, zero_seq: int) -> list[TensorRequest]:
    if n == 0:
        return [_absent("deepstack_zero", act)]
    reqs = [TensorRequest.of(names.deepstack_embeds(i), (b, seq, h), act) for i in range(n)]
    # Edge-LLM's zero buffer: max(maxBatch * seq * H * elem, 256) bytes, seq = 1 (vanilla) or verify size.
    reqs.append(TensorRequest.of("deepstack_zero", (b, zero_seq, h), act))
    return reqs


def _mrope_request(cfg: LLMEngineConfig, b: int) -> TensorRequest:
    if not cfg.is_mrope:
        return _absent("mrope_cos_sin", DType.FLOAT32)
    return TensorRequest.of("mrope_cos_sin", (b, cfg.max_kv_cache_capacity, cfg.rotary_dim), DType.FLOAT32)
