"""create_for_llm: one LLM engine bound to a PipelineIO, and its step protocol (prefill, decode, reset).

Returned logits are views of PipelineIO buffers, written on the step's stream and valid until the
next step overwrites them. Steps never allocate; decode steps never synchronise the host (their
pinned staging buffers are fenced with events that are normally complete already).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trtio._cache import BoundedCache
from trtio._checks import check_int
from trtio._config import LLMEngineConfig
from trtio._cuda.backend import Backend
from trtio._dims import InferenceDims
from trtio._engine import DECODE_PROFILE, ContextMemory, EngineExecutor
from trtio._foreign import TorchDeviceInput, torch_device_input
from trtio._memory import Arena, MemoryReport
from trtio._ops import warm_up
from trtio._pages import DEFAULT_MAX_PREFIXES, Prefix, StepPages
from trtio._pipeline_io import PipelineIO
from trtio._setups.base import EngineGraphStats, SetupBase
from trtio._setups.binding import (
    BindContext,
    BoundEngine,
    RopeTables,
    bind_engine,
    engine_backend,
    engine_io,
    with_contract,
)
from trtio._setups.calls import Calls, one_thread
from trtio._setups.decode_plan import DecodePlan
from trtio._setups.sequences import Sequences
from trtio._staging import INPUT_RING_SLOTS, UploadRing
from trtio._state import EngineState
from trtio._stream import Stream, StreamLike
from trtio._tensor import Tensor, overlap_error
from trtio._tensor_map import TensorMap
from trtio.errors import ConfigError, InvalidTypeError, InvalidValueError, ShapeError, TrtioError
from trtio.features import FeatureSet, Ready, component_named

__all__ = ["LLMSetup", "create_for_llm"]


class LLMSetup(SetupBase):
    """One LLM engine bound to a PipelineIO: prefill / decode / reset (the step protocol: ``docs/architecture.md``).

    ``visual``: a vision-language model's encoder (a :class:`~trtio.components.visual.visual_setup.VisualSetup` that
    ``create_from_engine_dir`` attaches, closed with this setup), else None; ``audio``: a speech model's audio
    encoder (a :class:`~trtio.components.audio.audio_setup.AudioSetup`), likewise: engines beside the LLM
    (:meth:`attach`)."""

    def __init__(self, engine: Any, cfg: LLMEngineConfig, stream: StreamLike = None, *, graphs: bool = False,
                 backend: Backend | str | None = None, constants: Mapping[str, Tensor] | None = None,
                 max_prefixes: int = DEFAULT_MAX_PREFIXES) -> None:
        if not isinstance(cfg, LLMEngineConfig):
            raise InvalidTypeError(f"create_for_llm: cfg must be an LLMEngineConfig, got {type(cfg).__name__} (read "
                                   f"one with LLMEngineConfig.from_json / from_edgellm)")
        cfg.validate()
        if cfg.is_draft or cfg.is_spec_decode_base:
            raise ConfigError("engine_role", f"create_for_llm: the config describes a spec-decode {cfg.role}; "
                                             f"use create_for_spec_decode with a DeploymentConfig")
        check_int(max_prefixes, "create_for_llm: max_prefixes", minimum=0, error=InvalidValueError)
        eio = engine_io(engine, "create_for_llm")
        cfg = with_contract(cfg, eio, "engine")
        be = engine_backend(engine, backend)
        self._backend = be
        self.cfg = cfg
        self._features = FeatureSet()
        with self._building(stream) as (stack, s):
            self.io = stack.enter_context(PipelineIO.create_for_llm(cfg, s, backend=be))
            self._rope = stack.enter_context(RopeTables(be))
            self._make_steps()
            self._context_memory = stack.enter_context(ContextMemory.for_engines([engine], backend=be))
            ctx = BindContext(self.io, be, s, stack, self._rope, self._calls, int(max_prefixes))
            # the families' parts (a LoRA engine's inputs: bound first to empty tensors, no adapter)
            constants = {**(constants or {}), **self._features.make(cfg, "llm", ctx, eio)}
            tm = self.io.build_tensor_map(cfg)
            self._engine = bind_engine(engine, cfg, tm, max_batch=cfg.max_supported_batch_size, backend=be,
                                       context_memory=self._context_memory, graphs=graphs, rope=self._rope,
                                       stream=s, resources=stack, name="llm", io=self.io, constants=constants)
            self._extra_arena = stack.enter_context(Arena([
                UploadRing.request("host_inputs_embeds", (cfg.max_supported_batch_size, 1, cfg.hidden_size),
                                    cfg.activation, slots=INPUT_RING_SLOTS)], backend=be, title="llm staging"))
            self._embeds_staging = stack.enter_context(
                UploadRing(self._extra_arena["host_inputs_embeds"], be, slots=INPUT_RING_SLOTS,
                           title="inputs_embeds staging"))
            self._features.bound(self._engine, ctx)
            warm_up(be)
        self._seqs = Sequences([self._engine], cfg.max_supported_batch_size, features=self._features)
        self._decode_dims: BoundedCache[int, InferenceDims] = BoundedCache()
        self._step_input = self._features.step_input()  # a family's per-token input (ple_embeds), or none
        self._streaming_pending = False
        self._attached: dict[str, Any] = {}  # engines beside the LLM (components), by name
        self._plan: DecodePlan | None = None  # what the last checked decode laid out, for the next (DecodePlan)
        self._ran: DecodePlan | None = None  # the last plan run (its record of the step block: DecodePlan.block_holds)
        self._torch_readers: TorchDeviceInput | None = None  # the reader of torch tensors of the last plan's shape

    def engines(self) -> list[BoundEngine]:
        return [self._engine]

    def attach(self, name: str, part: Any) -> None:
        """Keep ``part``, the setup of the engine beside the LLM that component ``name`` binds (its vision encoder:
        ``"visual"``), as an attribute of this setup; it is closed with this setup from now on. Refused where one is
        attached already, or where the component says it does not fit this LLM."""
        self._check_open()
        component = component_named(name)
        if component is None:
            raise InvalidValueError(f"attach: {name!r} is not a component trtio binds")
        if name in self._attached:
            raise TrtioError(f"{self!r} has a {component.WHAT} attached already")
        component.check_attach(self.cfg, part)
        assert self._resources is not None
        self._resources.callback(part.close)
        self._attached[name] = part

    def attach_visual(self, visual: Any) -> None:
        """Keep ``visual`` (the ViT of this LLM's vision-language model: a
        :class:`~trtio.components.visual.visual_setup.VisualSetup`) as :attr:`visual` (:meth:`attach`)."""
        self.attach("visual", visual)

    @property
    def visual(self) -> Any:
        """The vision encoder attached (:meth:`attach_visual`), None without one."""
        return self._attached.get("visual")

    @property
    def audio(self) -> Any:
        """The audio encoder attached (a :class:`~trtio.components.audio.audio_setup.AudioSetup`:
        :func:`~trtio._setups.create_from_engine_dir` of a speech model's directory, or :meth:`attach`), None without
        one."""
        return self._attached.get("audio")

    # -- public views ---------------------------------------------------------------------------
    @property
    def state(self) -> EngineState:
        return self._engine.state

    @property
    def recurrent(self) -> Any:
        """A hybrid model's recurrent states (:class:`~trtio.families.hybrid.recurrent.RecurrentStates`: the snapshot
        pool and which of its rows prefixes hold); None for a model without recurrent layers."""
        return self._features.attribute("recurrent")

    @property
    def executor(self) -> EngineExecutor:
        return self._engine.executor

    @property
    def tensor_map(self) -> TensorMap:
        return self._engine.tensor_map

    @property
    def graph_stats(self) -> EngineGraphStats:
        """CUDA-graph telemetry: ``graph_stats["llm"]``, and its counts as attributes."""
        return EngineGraphStats(self.engines())

    @property
    def lengths(self) -> np.ndarray:
        """Tokens cached per active sequence, in the order of :attr:`active` (host mirror; a copy)."""
        return np.asarray(self._engine.state.lengths[self._seqs.order])

    @property
    def decode_planned(self) -> bool:
        """Whether the next :meth:`decode` of every active sequence, fed embeddings of its shape, runs the last
        checked decode's plan as it is (:class:`~trtio._setups.decode_plan.DecodePlan`: no check, no staging, its
        graph replayed where graphs are on)."""
        plan = self._plan
        return plan is not None and plan.holds(self._epoch)

    # -- steps ----------------------------------------------------------------------------------
    @property
    def rope_deltas(self) -> np.ndarray:
        """MRoPE: each active sequence's position delta, in the order of :attr:`active` (int64; a copy): a token
        at cache position ``k`` past its prompt has position ``k + delta`` on all three axes (0 for text, and for
        every sequence of an engine without MRoPE)."""
        deltas = self._features.attribute("rope_deltas")  # every slot's (None: no MRoPE)
        if deltas is None:
            return np.zeros(self._seqs.count, np.int64)
        found: np.ndarray = deltas[self._seqs.order]
        return found

    @one_thread
    def prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None, *,
                slots: Sequence[int] | None = None, prefix: Prefix | Sequence[Prefix | None] | None = None,
                past_lengths: Any = None, deepstack_embeds: Sequence[Any] | None = None,
                mrope_positions: Any = None, ple_embeds: Any = None) -> Tensor:
        """Run prompts (profile 0) and return the logits view [batch, vocab] of each one's last token.

        ``inputs_embeds`` is [batch, seq, hidden] (numpy or a device Tensor, e.g. ``io.inputs_embeds``
        already filled); ``context_lengths`` gives each sequence's prompt length (<= seq; shorter
        prompts are right-padded; on the ragged contract each sequence is one entry-padded block of
        ``seq`` rows). Without ``deepstack_embeds`` the deepstack inputs are zero.

        ``slots=None``: the batch restarts; slots ``0 .. batch - 1`` hold the prompts and every other slot
        is released. ``slots=[s0, ...]`` (ragged contract) admits the sequences into those free slots; the
        other active sequences keep their KV. Row i of the logits belongs to ``slots[i]``. ``past_lengths``
        continues active sequences whose caches hold that many tokens (a later chunk of a prompt: at most
        what :attr:`lengths` says). ``prefix`` (a :class:`~trtio._pages.Prefix` from :meth:`pin_prefix`, or
        one per sequence, None for none) starts each sequence after the prefix's tokens: ``inputs_embeds``
        hold only the tokens after it. Pages the prompts write are taken before anything is enqueued: a
        pool too short raises CapacityError and changes nothing.

        ``mrope_positions`` (MRoPE engines: vision-language models): int ``[3, batch, seq]``, each token's
        temporal, height and width position (:func:`trtio.vision.splice` makes them), absolute (a continued
        sequence's new tokens after its cached ones). The sequence's later tokens take text positions from its
        delta on (:attr:`rope_deltas`). Without them a new sequence's positions are its token indices, and a
        continued one goes on from its delta.

        ``ple_embeds`` (Gemma 4 engines with per-layer embeddings, and only those): a host array or a device
        ``Tensor`` (:class:`~trtio._embeddings.TokenEmbeddings`') ``[batch, seq, L x ple_hidden]``, each token's
        PLE row (columns ``i * ple_hidden ..`` feed ``ple_token_embeds_i``); required there (:class:`ShapeError`
        naming it otherwise).
        """
        self._step_input.prepare(ple_embeds, inputs_embeds, self._ready(stream), now=True)
        try:
            self._prefill(self._engine, inputs_embeds, context_lengths, stream, slots, prefix, past_lengths,
                          "prefill", deepstack_embeds=deepstack_embeds, mrope_positions=mrope_positions)
        except BaseException:
            self._settle_prompt(False)
            raise
        self._settle_prompt(True)
        return self.io.output_logits

    @one_thread
    def decode(self, inputs_embeds: Any, stream: StreamLike = None, *, slots: Sequence[int] | None = None,
               ple_embeds: Any = None) -> Tensor:
        """One token for each sequence of ``slots`` (default: every active slot, ascending) after its cached
        ones (profile 1); returns the logits view [rows, vocab], row i for the i-th of those slots.

        Batch contract: ``kvcache_start_index`` = the cached lengths, ``context_lengths`` = lengths + 1,
        ``last_token_ids`` = 0. Ragged contract: phase 3, one row per sequence at position = its length; a
        sequence that reaches a new page takes it first (CapacityError, nothing changed, when the pool has
        none free). The lengths then grow by one. No allocation; no host synchronisation.

        A decode of every active sequence whose plan (:class:`~trtio._setups.decode_plan.DecodePlan`, what the
        last checked decode laid out) still holds runs it as it is; any other is checked in full and leaves a
        new plan. Both run the same way (:meth:`_run_plan`). ``ple_embeds``: as :meth:`prefill`'s, ``[rows, 1,
        L x ple_hidden]``; a device tensor's split into the layers' inputs is part of the plan's work (in its graph),
        so the plan holds for a decode fed the same tensor (address, shape, dtype) and any other is checked in full.
        """
        plan = self._plan
        staged = False  # the step input (host rows) copied already
        if plan is not None and slots is None and plan.holds(self._epoch):
            s = self._stream(stream)
            if s._closed:
                s._check_open()
            taken, staged = self._step_input.steady(plan, ple_embeds, inputs_embeds, s, self._calls)
            x = plan.read(inputs_embeds, s, self._torch_reader) if taken else None
            if x is None and taken and type(inputs_embeds) is not np.ndarray and type(inputs_embeds) is not Tensor:
                # Any other foreign array (CuPy, JAX, ...) or a nested list: checked and read in place or converted
                # once (its producer ordered before the step's stream), then taken as the plan takes it.
                x = plan.read(self._embeds(inputs_embeds, self.cfg.hidden_size, s)[0], s, self._torch_reader)
            if x is not None:
                self._run_plan(plan, x, s, keep=inputs_embeds)
                return self.io.output_logits
        split = None if staged else self._step_input.prepare(ple_embeds, inputs_embeds, self._ready(stream))
        return self._decode_checked(inputs_embeds, stream, slots, split, ple_embeds if split is not None else None)

    def _ready(self, stream: StreamLike) -> Ready:
        """What a step input asks once the step is known to take it (:data:`~trtio.features.Ready`): a closed or
        broken setup refused, then the step's stream and the call rules."""
        def ready() -> tuple[Stream, Calls]:
            self._refuse_unusable()
            return self._stream(stream), self._calls
        return ready

    def _torch_reader(self, shape: tuple[int, int, int]) -> TorchDeviceInput | None:
        """The reader of torch CUDA tensors of embeddings of ``shape`` (one per step shape, kept across plans),
        where torch is imported and the setup runs on the cuda backend; else None."""
        found = self._torch_readers
        if found is None or found.shape != shape:
            found = self._torch_readers = torch_device_input(self._backend, self.io.inputs_embeds.dtype, shape)
        return found

    def _run_plan(self, plan: DecodePlan, x: Any, s: Stream, pages: StepPages | None = None, *,
                  keep: Any = None) -> None:
        """Run a decode of ``plan`` fed ``x`` (a device Tensor, the device address of a torch tensor, or a host
        array: checked, its producer ordered before ``s``) on ``s``: its embeddings into ``io.inputs_embeds``,
        the plan's device work and its engine (its graph replayed where the last step ran the same); then the
        lengths grow. Embeddings at the step's own input's address (that input, another view of its bytes, a
        foreign array over them: written there in place) are read where they are; embeddings that overlap it
        elsewhere are refused (:func:`~trtio._tensor.partly_over`) before any work. A copied input is kept until its
        copy has run (``keep``: the caller's object behind ``x``, where ``x`` is read from it). A failure gives
        back the pages the checked decode took (``pages``) and leaves no plan."""
        e = self._engine
        try:
            if type(x) is Tensor or type(x) is int:
                src: int = x._ptr if isinstance(x, Tensor) else x
                nbytes = x._nbytes if isinstance(x, Tensor) else plan.embeds_nbytes
                dst = plan.dst
                if src != dst._ptr:
                    if plan.near < src < plan.far:
                        raise overlap_error("inputs_embeds", src, dst._ptr, nbytes, "inputs_embeds")
                    self._calls.read(x if keep is None else keep)
                    self._backend.memcpy(dst._ptr, src, nbytes, s._handle)
                    dst._last_stream = s
            else:
                self._embeds_staging.upload(x, self.io.inputs_embeds, s, reshape=False)
            ex = e.executor
            if not ex.replay(DECODE_PROFILE, e.tensor_map, plan.dims, s, plan.work):
                ex.prepare(DECODE_PROFILE, e.tensor_map, plan.dims, s)
                ex.execute(s, before=plan.work)
        except BaseException:
            if pages is not None:
                pages.undo()
            self._plan = self._ran = None  # the device's copy of the lengths may have moved: staged again
            raise
        plan.advance()
        self._ran = plan

    def _decode_checked(self, inputs_embeds: Any, stream: StreamLike, slots: Sequence[int] | None,
                        split: Any = None, held: Tensor | None = None) -> Tensor:
        """:meth:`decode`, every check made (the first step of a batch, a page to take, ``slots=``); lays the
        step out as a plan and runs it (a decode of every active sequence keeps the plan for the next), ``split`` (the
        step input's device work for the tensor ``held``: :meth:`StepInput.prepare
        <trtio.features.StepInput.prepare>`) last in its work."""
        self._check_usable()
        self._plan = None
        seqs, e = self._seqs, self._engine
        if seqs.count == 0:
            raise TrtioError("decode() before prefill(): there is no sequence to continue")
        x, nb, ns = self._embeds(inputs_embeds, self.cfg.hidden_size, stream)
        if slots is None and (nb, ns) != (seqs.count, 1) or ns != 1:
            raise ShapeError(f"inputs_embeds: decode takes [batch={seqs.count if slots is None else nb}, 1, "
                             f"{self.cfg.hidden_size}], got [{nb}, {ns}, ...]")
        sl, key = seqs.step_slots(slots, nb, "decode")
        n = sl.shape[0]
        lengths = e.state.lengths[sl]
        cap = self.cfg.max_kv_cache_capacity
        if int(lengths.max()) >= cap:
            full = int(np.argmax(lengths))
            raise ShapeError(f"KV cache full: sequence {int(sl[full])} holds {int(lengths[full])} tokens, the capacity "
                             f"(max_kv_cache_capacity) is {cap}")
        pages = seqs.tables[e.role].ensure(sl, lengths, 1) if seqs.slotted else None
        dims = self._decode_dims.get(n)
        if dims is None:
            dims = self._decode_dims.put(n, self.cfg.decode_dims(n))
        room = cap - int(lengths.max())  # runs of the plan before the capacity (this one included)
        s = self._stream(stream)
        if pages is not None:
            pages.commit()
        if seqs.slotted:  # and before a page to take (this step's taken)
            room = min(room, int((seqs.tables[e.role].limit[sl] - lengths).min()))
        room = self._features.decode_room(lengths, room)  # and before a family's step rows change
        ran = self._ran  # what the block holds after the last plan ran: its inputs, if the same sequences go on
        staged = ran is not None and ran.block_holds(self._steps.step.uploads, n, key)
        try:
            if pages is not None:
                seqs.copy(e.role, pages.moves, s)
            self._features.stage_decode(e, sl if seqs.slotted else None, lengths)
            work = self._steps.decode(e, lengths, s, sl if seqs.slotted else None, key, seqs.step_rows(e.role, key),
                                      staged=staged)
            if split is not None:
                work = self._step_input.plan_work(work, split)
            e.tensor_map.use_deepstack_zero()
            if self._streaming_pending:
                self.io.streaming_prefill.order_before(s)
        except BaseException:
            if pages is not None:
                pages.undo()
            self._ran = None
            raise
        if type(x) is Tensor and x is not self.io.inputs_embeds and x._last_stream is not None:
            x._order_consumer(s._handle)
        plan = DecodePlan(self._epoch, (n, 1, self.cfg.hidden_size), self.io.inputs_embeds, e.state.lengths,
                          sl.tolist(), room, work, dims, self._steps.step.uploads, held, key)
        self._run_plan(plan, x, s, pages)
        self._streaming_pending = False
        if slots is None:  # the next decode of these sequences may run the plan as it is
            self._plan = plan
        return self.io.output_logits

    def _repaired(self) -> None:
        self._plan = self._ran = None

    @property
    def lora(self) -> Any:
        """The LoRA adapter the steps use (:meth:`set_lora`); None: none (or an engine without LoRA inputs)."""
        return self._features.attribute("lora")

    @one_thread
    def set_lora(self, adapter: Any, stream: StreamLike = None) -> None:
        """Use ``adapter`` (a :class:`~trtio.LoraAdapter`; None: no adapter, every LoRA input at rank 0) for every
        step after this call, for the whole batch (one adapter per batch, as in Edge-LLM). Sequences in flight go
        on: their cached tokens keep what the adapter before computed.

        The first call with an adapter uploads its weights, on ``stream`` (ordered after the last step), into device
        memory the setup owns, one tensor per LoRA input at the adapter's ranks (kept until the setup is closed, for
        the last :data:`~trtio._cache.CACHE_LIMIT` adapters: past that, the oldest but the set one is let go, after
        ``stream`` is synchronised, with the plans and CUDA graphs that bind it, and uploaded again if it is set
        again). Every call then binds the engine's LoRA inputs to that adapter's own copy (modules the adapter leaves
        out, and every one for None: empty tensors, rank 0): no copy, no allocation, no host synchronisation. The
        steps after it run the plans and CUDA graphs made for that adapter (captured at its first steps; kept per
        adapter, as Edge-LLM does).

        Raises before any work: a TypeError for what is not an adapter, a ConfigError on an engine without LoRA
        inputs (``max_lora_rank`` 0) or whose LoRA inputs are all named after ONNX graph nodes (Edge-LLM 0.11's
        ``insert-lora`` on an export of anonymous weights: no adapter can be matched to them; the engine runs with
        every LoRA input at rank 0), an InvalidValueError naming every module the engine lacks, whose rank is
        above ``max_lora_rank`` or whose dtype or shape differs
        (:meth:`trtio.families.lora.adapters.LoraInputs.problems`); the setup is left as it was.
        """
        self._refuse_unusable()
        part = self._features.part("set_lora")
        if part is None:
            self._features.absent_call("set_lora", adapter, self._engine.io.name)
            return
        part.set_lora(adapter, self._stream(stream))

    @one_thread
    def populate_streaming(self, stream: StreamLike = None) -> None:
        """Snapshot the prefill-time ``inputs_embeds`` and ``hidden_states`` for a streaming consumer
        (call after prefill, before the first decode)."""
        self._check_usable()
        if self._seqs.count == 0:
            raise TrtioError("populate_streaming() before prefill()")
        if self.io.output_hidden_states.is_empty:
            raise TrtioError("populate_streaming: this engine has no hidden_states output to snapshot (Edge-LLM "
                             "0.11's ragged LLM engines declare none)")
        emb = self.io.inputs_embeds
        b, seq, h = emb.shape
        hidden = self.io.output_hidden_states
        if hidden.shape != (b, seq, h):
            hidden.reshape((b, seq, h))
        self.io.streaming_prefill.populate_from_prefill(emb, hidden, b, seq, h, self.io.max_batch, self.io.max_seq,
                                                        self._stream(stream))
        self._streaming_pending = True

    @one_thread
    def reset(self, stream: StreamLike = None) -> None:
        """End every sequence (their pages go back; pinned prefixes stay); the next step must be a prefill.
        Also makes a broken setup (:attr:`is_broken`) usable again."""
        self._check_open()
        self._epoch += 1
        s = self._stream(stream)
        self._seqs.release_all()
        self._engine.state.reset(s)
        self._repair()

    def memory_report(self, *, include_context_memory: bool = True) -> MemoryReport:
        """Every buffer the setup owns: PipelineIO, KV state (a hybrid model's recurrent state pools included),
        staging, RoPE table, a hybrid model's snapshot pool, a LoRA engine's adapter copies,
        and context memory."""
        report = self._report("create_for_llm", include_context_memory)
        parts = self._features.reports()
        return MemoryReport.combine("create_for_llm", [report, *parts]) if parts else report

    def __repr__(self) -> str:
        return f"LLMSetup({self.contract}, active={self._seqs.order_key}, graphs={self.executor.graphs_enabled})"


def create_for_llm(engine: Any, cfg: LLMEngineConfig, stream: StreamLike = None, *, graphs: bool = False,
                   backend: Backend | str | None = None, constants: Mapping[str, Tensor] | None = None,
                   max_prefixes: int = DEFAULT_MAX_PREFIXES) -> LLMSetup:
    """Bind one LLM engine to a new PipelineIO (see :class:`LLMSetup`). ``constants``: engine inputs bound to
    tensors the caller owns and keeps open until the setup is closed (weights the engine reads at run time,
    e.g. Edge-LLM's ``checkpoint_weight_bindings``). ``max_prefixes``: on a hybrid model, the rows of the snapshot
    pool that pinned prefixes keep their slot's recurrent states in (at most that many prefixes pinned at once;
    unused by a model without recurrent layers)."""
    return LLMSetup(engine, cfg, stream, graphs=graphs, backend=backend, constants=constants,
                    max_prefixes=max_prefixes)
