"""PipelineIO: every tensor that flows through an inference pipeline, allocated once at worst case.

This is Edge-LLM's ``PipelineIO`` in Python. ``create_for_llm`` sets up one engine,
``create_for_spec_decode`` a base + draft pair that share these buffers. All members are slices
of one :class:`~trtio._memory.Arena` (one allocation per location).

POINTER STABILITY INVARIANT, enforced: once a tensor map has been built, assigning a member,
growing or shrinking ``deepstack_embeds``, reallocating a member or closing a member tensor
raises :class:`FrozenError`. Reshaping within capacity stays allowed: that is how each step
views the worst-case buffers at its own shape.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from trtio import names
from trtio._checks import is_int
from trtio._config import DeploymentConfig, LLMEngineConfig
from trtio._contracts import contract_named
from trtio._contracts.contract import Contract, PipelineLayout
from trtio._cuda._hostmem import host_view
from trtio._cuda.backend import Backend, Location, get_backend
from trtio._dtypes import DType
from trtio._lifetime import Closeable, open_binders
from trtio._memory import Arena, MemoryEntry, MemoryReport, TensorRequest
from trtio._staging import StepStaging, UploadRing
from trtio._stream import Event, StreamLike, as_stream
from trtio._tensor import ShapeLike, Tensor, normalize_shape
from trtio._tensor_map import TensorMap
from trtio.errors import (
    CapacityError,
    ClosedError,
    ConfigError,
    FrozenError,
    NotAvailableError,
    ShapeError,
    TrtioError,
    UnknownNameError,
)

__all__ = ["PipelineIO", "StreamingPrefillBuffers"]

log = logging.getLogger("trtio")

STAGING_SLOTS = 4  # slots of each staged member's private ring: uploads the host may run ahead of the device

# PipelineIO's members, in Edge-LLM's order (snake_case); deepstack_embeds is a list. A contract's layout
# adds its own (PipelineLayout.members).
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


class StreamingPrefillBuffers(Closeable):
    """Persistent copies of the prefill-time ``inputs_embeds`` and engine ``hidden_states``.

    Streaming consumers (Edge-LLM's Qwen3-Omni Talker) read these while the decode loop
    overwrites the live buffers. Allocated on the first :meth:`populate_from_prefill` (at the
    worst case, in the live tensors' dtypes), reused afterwards. A first call that fails frees them again.
    """

    input_embeds: Tensor
    engine_hidden_states: Tensor
    _worst: tuple[int, int, int]

    def __init__(self, backend: Backend) -> None:
        self._init_lifetime("streaming_prefill")
        self._backend = backend
        self._arena: Arena | None = None
        self._ready: Event | None = None
        self._released: Event | None = None
        self._released_pending = False
        self._empty()

    def _empty(self) -> None:
        """Empty tensors (no allocation) until the first :meth:`populate_from_prefill`."""
        self.input_embeds = Tensor(0, (0,), DType.FLOAT16, Location.DEVICE, 0, self._backend,
                                   name="streaming.input_embeds")
        self.engine_hidden_states = Tensor(0, (0,), DType.FLOAT16, Location.DEVICE, 0, self._backend,
                                           name="streaming.engine_hidden_states")
        self._worst = (0, 0, 0)

    @property
    def is_allocated(self) -> bool:
        return self._arena is not None

    @property
    def ready_event(self) -> Event:
        """Recorded after the copies; a consumer on another stream waits on it before reading."""
        self._check_open()
        if self._ready is None:
            raise TrtioError("streaming_prefill: populate_from_prefill has not been called yet")
        return self._ready

    def release(self, stream: StreamLike = None) -> None:
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
        fresh = self._arena is None
        if fresh:
            normalize_shape((max_batch, max_seq, hidden_size), "streaming_prefill worst case")
            if batch > max_batch or prefill_len > max_seq:
                raise CapacityError(f"streaming_prefill: request {want} exceeds the worst case "
                                    f"({max_batch}, {max_seq}, {hidden_size})")
        with contextlib.ExitStack() as undo:  # a first call that fails frees what it allocated
            if fresh:
                self._allocate(live_inputs_embeds.dtype, live_engine_hidden_states.dtype, max_batch, max_seq,
                               hidden_size)
                undo.callback(self._free)
            wb, ws, wh = self._worst
            if batch > wb or prefill_len > ws or hidden_size != wh:
                raise CapacityError(f"streaming_prefill: request {want} exceeds the allocation made on the first "
                                    f"call ({self._worst})")
            for label, live, mine in (("inputs_embeds", live_inputs_embeds, self.input_embeds),
                                      ("engine_hidden_states", live_engine_hidden_states, self.engine_hidden_states)):
                if live.dtype is not mine.dtype:
                    raise ShapeError(f"streaming_prefill: live {label} is {live.dtype} but the buffers were "
                                     f"allocated as {mine.dtype}")
                mine.reshape(want)
            if self._released_pending:
                assert self._released is not None
                self._released.wait(s)  # the previous consumer must be done before we overwrite
            self.input_embeds.copy_from(live_inputs_embeds, s)
            self.engine_hidden_states.copy_from(live_engine_hidden_states, s)
            assert self._ready is not None
            self._ready.record(s)
            undo.pop_all()
        self._released_pending = False

    def _allocate(self, embeds: DType, hidden: DType, max_batch: int, max_seq: int, hidden_size: int) -> None:
        """The buffers at the worst case, and the ready event."""
        worst = (max_batch, max_seq, hidden_size)
        arena = Arena([TensorRequest.of("streaming.input_embeds", worst, embeds),
                       TensorRequest.of("streaming.engine_hidden_states", worst, hidden)],
                      backend=self._backend, title="streaming_prefill")
        try:
            self._ready = Event.create(self._backend)
        except BaseException:
            arena.close()
            raise
        self._arena = arena
        self.input_embeds = arena["streaming.input_embeds"]
        self.engine_hidden_states = arena["streaming.engine_hidden_states"]
        self._worst = worst

    def _free(self) -> None:
        """Back to unallocated (a first call failed after :meth:`_allocate`)."""
        arena, ready = self._arena, self._ready
        self._arena = self._ready = None
        self._empty()
        with contextlib.ExitStack() as release:
            if arena is not None:
                release.callback(arena.close)
            if ready is not None:
                release.callback(ready.close)

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

    def _close_owned(self) -> None:
        with contextlib.ExitStack() as release:  # everything is released; the first failure raises
            if self._arena is not None:
                release.callback(self._arena.close)
            for ev in (self._ready, self._released):
                if ev is not None:
                    release.callback(ev.close)


_LIFETIME_FIELDS = frozenset(("_closed", "_what", "_finalizer"))


class PipelineIO(Closeable):
    """All tensors flowing through an inference pipeline (see module docstring).

    Members beyond the seed's (Edge-LLM 0.11's ragged members: ``query_start_offsets``, ``positions``, ...)
    come from the contract's layout (:class:`~trtio._contracts.contract.PipelineLayout`)."""

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
    # the ragged contract's (PipelineLayout.members)
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
    contract: Contract
    max_batch: int
    max_seq: int
    hidden_size: int
    is_spec_decode: bool
    # Plain assignment works from the start: __setattr__ reads this before __init__ sets it.
    _frozen: bool = False
    _arena: Arena
    _backend: Backend
    _members: tuple[str, ...]  # the member names of this layout (assignment refused once frozen)
    _standalone: dict[str, Tensor]  # members replaced by reallocate()
    _maps: list[TensorMap]  # tensor maps built from this PipelineIO (their executors pin it)
    _rings: dict[str, UploadRing]  # the private ring each staged device member is uploaded through
    _twins: dict[str, list[Tensor]]  # the pinned members keeping the host's copy of what was staged there
    _unavailable: tuple[str, ...] = ()  # the seed's members the contract does not use
    _owned: contextlib.ExitStack

    def __init__(self, layout: PipelineLayout, contract: Contract, backend: Backend, stream: StreamLike = None) -> None:
        """Internal: use :meth:`create_for_llm` or :meth:`create_for_spec_decode`. Zeroes the layout's
        ``zeroed`` members on ``stream``; a failure frees everything made so far."""
        self._init_lifetime("PipelineIO")
        with contextlib.ExitStack() as stack:
            shapes = {r.name: r for r in layout.requests}
            staged = list(dict.fromkeys(dev for _twin, dev in layout.staging_pairs))
            rings = [UploadRing.request(f"ring_{dev}", shapes[dev].shape, shapes[dev].dtype, slots=STAGING_SLOTS)
                     for dev in staged]
            arena = stack.enter_context(Arena(layout.requests + rings + StepStaging.requests(layout.step_requests),
                                              backend=backend, title=layout.title))
            step = None
            if layout.step_requests:
                step = stack.enter_context(StepStaging(arena, [r.name for r in layout.step_requests],
                                                       title=f"{layout.title} per-step inputs"))
            self.step = step
            self.contract = contract
            self._arena = arena
            self._backend = backend
            self._standalone = {}
            self._maps = []
            self._unavailable = layout.unavailable
            self.max_batch = layout.max_batch
            self.max_seq = layout.max_seq
            self.hidden_size = layout.hidden_size
            self.is_spec_decode = layout.is_spec_decode
            t = dict(arena.tensors)
            if step is not None:
                t.update(step.tensors)
            self._members = tuple(m for m in MEMBERS + EXTRA_MEMBERS + layout.members if m in t)
            for m in self._members:
                setattr(self, m, t[m])
            self.deepstack_embeds = _FrozenList(t[names.deepstack_embeds(i)] for i in range(layout.num_deepstack))
            self.streaming_prefill = stack.enter_context(StreamingPrefillBuffers(backend))
            self._rings = {dev: stack.enter_context(UploadRing(t[f"ring_{dev}"], backend,  slots=STAGING_SLOTS,
                                                               title=f"{layout.title} staging of {dev}"))
                           for dev in staged}
            self._twins = {dev: [t[twin] for twin, d in layout.staging_pairs if d == dev] for dev in staged}
            s = as_stream(stream, backend)
            for m in layout.zeroed:
                t[m].zero_(s)
            self._owned = stack.pop_all()

    def __getattr__(self, name: str) -> Any:
        # Only names not found otherwise: the seed's members this contract does not use say so.
        if name not in object.__getattribute__(self, "_unavailable"):  # NotAvailableError is an AttributeError
            raise NotAvailableError(f"{type(self).__name__!r} object has no attribute {name!r}")
        contract = object.__getattribute__(self, "contract").name
        raise NotAvailableError(f"PipelineIO.{name} is not used by the {contract} contract (Edge-LLM 0.11's "
                                f"token-major steps carry their lengths and logits rows in query_start_offsets, "
                                f"query_lengths, past_lengths and logits_indices instead)")

    # -- factories ------------------------------------------------------------------------------
    @classmethod
    def create_for_llm(cls, cfg: LLMEngineConfig, stream: StreamLike = None, *,
                       backend: Backend | str | None = None) -> PipelineIO:
        """Worst-case buffers for one LLM engine (Edge-LLM's ``createForLLM``), laid out for the config's
        contract (token-major with the ragged contract's per-step members for ``"ragged"``)."""
        cfg.validate()
        contract = contract_named(cfg.contract)
        layout = contract.pipeline_layout(cfg, None, cfg.max_supported_batch_size)
        io = cls(layout, contract, get_backend(backend), stream)
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
            raise ConfigError("draft", "create_for_spec_decode needs a DeploymentConfig with a draft and a spec "
                                       "section")
        limit = bundle.max_runtime_batch_size()
        b = limit if max_runtime_batch_size is None else max_runtime_batch_size
        if not is_int(b) or not 1 <= b <= limit:
            raise ShapeError(f"max_runtime_batch_size must be an int in 1..{limit} (min of base and draft "
                             f"max_supported_batch_size), got {max_runtime_batch_size!r}")
        b = int(b)
        contract = contract_named(bundle.base.contract)
        return cls(contract.pipeline_layout(bundle.base, bundle, b), contract, get_backend(backend), stream)

    # -- freezing -------------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _LIFETIME_FIELDS:
            self._check_open()
            if self._frozen and (name in self._members or name in MEMBERS or name in EXTRA_MEMBERS):
                raise FrozenError(
                    f"PipelineIO.{name} cannot be reassigned after a tensor map was built "
                    f"(POINTER STABILITY INVARIANT: bound addresses would go stale)")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._members or name in MEMBERS or name in EXTRA_MEMBERS:
            raise FrozenError(f"PipelineIO.{name} cannot be deleted: the pipeline owns it until close()")
        object.__delattr__(self, name)

    @property
    def is_frozen(self) -> bool:
        return self._frozen

    @property
    def backend(self) -> Backend:
        return self._backend

    def member(self, name: str) -> Tensor:
        """The member tensor ``name`` of this layout (the seed's, or its contract's: ``positions``, ...)."""
        if name not in self._members:
            raise UnknownNameError(f"PipelineIO has no member {name!r} (its layout has {sorted(self._members)})")
        found: Tensor = getattr(self, name)
        return found

    @property
    def members(self) -> tuple[str, ...]:
        """The tensor members of this PipelineIO's layout (the seed's and its contract's), by name."""
        return self._members

    def _member_tensors(self) -> Iterable[Tensor]:
        for m in self._members:
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
            raise UnknownNameError(f"PipelineIO has no tensor member {member!r}")
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
    def _common_map(self, cfg: LLMEngineConfig, title: str, own: Mapping[str, Tensor] | None = None) -> TensorMap:
        """The map of an engine of ``cfg``: the common members, ``own`` (the role's), then what its contract and its
        families bind (a family may bind a name of ``own`` to another member)."""
        self._check_open()
        tm = TensorMap(title)
        self._maps.append(tm)
        tm.set(names.kInputsEmbeds, self.inputs_embeds)
        tm.set(names.kLogits, self.output_logits)
        for name, tensor in (own or {}).items():
            tm.set(name, tensor)
        self.contract.bind_pipeline(self, tm, cfg)
        for family in cfg.features:  # what each family binds of the PipelineIO (deepstack features, ...)
            family.bind_pipeline(self, tm, cfg)
        return tm

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
        if not hidden.is_empty:  # Edge-LLM 0.11's plain LLM engines declare no hidden_states
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
        tm = self._common_map(cfg, "draft", {names.kBaseModelHiddenStates: self.base_hidden_states,
                                             names.kDraftModelHiddenStates: self.draft_hidden_states_in,
                                             names.kOutputHiddenStates: self.draft_hidden_states_out})
        self._freeze()
        tm.freeze()
        return tm

    # -- host staging -----------------------------------------------------------------------------
    def _stage(self, device: str, values: np.ndarray, stream: StreamLike) -> Tensor:
        """Stage ``values`` into the device member ``device`` through its private ring; the pinned twin that
        holds them keeps the host's copy (``host_context_lengths``: the lengths last staged)."""
        if self._closed:  # inline: this runs every step
            raise ClosedError("PipelineIO is closed")
        ring = self._rings.get(device)
        if ring is None:
            raise NotAvailableError(f"PipelineIO: {device} is not staged by the {self.contract.name} contract")
        out = ring.upload(values, getattr(self, device), stream)
        for twin in self._twins[device]:
            if values.nbytes <= twin.capacity and values.dtype.itemsize == twin.dtype.itemsize:
                if values.nbytes:
                    host_view(twin.data_ptr, values.nbytes)[:] = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
                break
        return out

    def upload_context_lengths(self, values: np.ndarray, stream: StreamLike = None) -> Tensor:
        """Stage int32 ``values`` [batch] into ``context_lengths`` (``host_context_lengths`` keeps them)."""
        return self._stage("context_lengths", np.asarray(values, dtype=np.int32), stream)

    def upload_select_token_indices(self, values: np.ndarray, stream: StreamLike = None) -> Tensor:
        """Stage int64 ``values`` ([B, 1]; [B, P] for spec decode) into ``select_token_indices``."""
        return self._stage("select_token_indices", np.asarray(values, dtype=np.int64), stream)

    def upload_tree(self, packed_mask: np.ndarray, position_ids: np.ndarray, stream: StreamLike = None) -> None:
        """Stage a packed tree mask [B, N, W] and position ids [B, N] (spec decode only)."""
        if self._closed:
            raise ClosedError("PipelineIO is closed")
        if not self.is_spec_decode:
            raise TrtioError("upload_tree: this PipelineIO was created for a plain LLM (no tree buffers)")
        self._stage("packed_attention_mask", np.asarray(packed_mask, dtype=np.int32), stream)
        self._stage("spec_decode_position_ids", np.asarray(position_ids, dtype=np.int32), stream)

    @property
    def staging_fence_waits(self) -> int:
        return sum(r.fence_waits for r in self._rings.values())

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

    def _closable(self) -> bool:
        """``close()`` (which frees the arena, the streaming buffers and the fences) is refused
        (:class:`FrozenError`) while an open executor has a tensor map of this PipelineIO bound: its engine
        (and any captured graph) would write to freed memory. Close the setup, or the executors, first."""
        users = sorted({u for tm in self._maps for u in tm.open_users()} | set(open_binders(self._arena))
                       | {u for t in self._standalone.values() for u in open_binders(t)})
        if users:
            raise FrozenError(f"PipelineIO is bound by open executor(s) {users}: freeing it would leave their "
                              f"engines (and captured graphs) writing to freed memory; close the setup first")
        return True

    def _close_owned(self) -> None:
        object.__setattr__(self, "_frozen", False)
        self.deepstack_embeds._frozen = False
        for t in self._member_tensors():
            t._unfreeze()
        with contextlib.ExitStack() as release:  # everything is released; the first failure raises
            release.push(self._owned)
            for t in self._standalone.values():
                release.callback(t.close)

    def __repr__(self) -> str:
        kind = "spec_decode" if self.is_spec_decode else "llm"
        state = "closed" if self._closed else ("frozen" if self._frozen else "open")
        return f"PipelineIO({kind}, max_batch={self.max_batch}, max_seq={self.max_seq}, {state})"
