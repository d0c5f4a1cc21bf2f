"""What both setups share: checking an engine against its config, binding it, staging inputs, lifetime.

A setup binds each of its engines (:class:`BoundEngine`: config, declared I/O, registry, KV state,
tensor map, executor) to one PipelineIO. :func:`check_engine` compares an engine's declared I/O
with what its config implies before anything is bound.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import operator
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._contracts.contract import StepInputs
from trtio._cuda.backend import Backend
from trtio._dims import InferenceDims
from trtio._dtypes import DType
from trtio._engine import PREFILL_PROFILE, ContextMemory, DeviceWork, GraphStats
from trtio._foreign import TorchEmbeds, torch_embeds
from trtio._inputs import as_embeds, check_lengths, host_input, not_partly_over
from trtio._lifetime import Closeable
from trtio._memory import Arena, MemoryReport
from trtio._pages import Prefix, StepPages
from trtio._pipeline_io import PipelineIO
from trtio._setups.binding import BoundEngine, RopeTables
from trtio._setups.calls import Calls, one_thread
from trtio._setups.sequences import KVPages, Sequences
from trtio._staging import UploadRing
from trtio._stream import Stream, StreamLike, as_stream
from trtio._tensor import Tensor
from trtio.errors import ShapeError, TrtioError
from trtio.features import FeatureSet

__all__ = ["EngineGraphStats", "Prompt", "SetupBase"]

log = logging.getLogger("trtio")

class EngineGraphStats(Mapping[str, GraphStats]):
    """A setup's CUDA-graph telemetry: each engine's :class:`~trtio._engine.GraphStats` by role
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


@dataclass(frozen=True)
class Prompt:
    """What a prefill ran: its width (rows per sequence), prompt lengths, the lengths cached before it (None:
    the caches started empty), its slots and its prefixes (None: none)."""

    width: int
    lengths: np.ndarray
    past: np.ndarray | None
    rows: np.ndarray
    prefixes: list[Prefix | None] | None


def _check_past(e: BoundEngine, past: np.ndarray, ctx: np.ndarray, rows: np.ndarray, what: str) -> None:
    """A prefill over ``past`` cached tokens: within the KV capacity."""
    cap = e.cfg.max_kv_cache_capacity
    full = np.flatnonzero(past + ctx > cap)
    if full.size:
        i = int(full[0])
        raise ShapeError(f"{what}: the sequence in slot {int(rows[i])} would hold {int(past[i] + ctx[i])} "
                         f"tokens, more than max_kv_cache_capacity ({cap})")


def _continued(past: np.ndarray, lengths: np.ndarray, rows: np.ndarray, b: int) -> np.ndarray:
    """``past_lengths`` of a prefill continuing the ``b`` sequences of slots ``rows``: integers, each at most what its
    slot's cache holds (``lengths``), as int64."""
    if past.shape != (b,) or past.dtype.kind not in "iu":
        raise ShapeError(f"past_lengths: expected {b} integer lengths, got {past.dtype} {past.shape}")
    have = lengths[rows]
    over = np.flatnonzero((past < 0) | (past > have))
    if over.size:
        i = int(over[0])
        raise ShapeError(f"past_lengths[{i}] = {int(past[i])}, but the cache of slot {int(rows[i])} holds "
                         f"{int(have[i])} tokens")
    return past.astype(np.int64)


class SetupBase(Closeable, abc.ABC):
    """What LLMSetup and SpecDecodeSetup share: construction, staging, input checks, reporting, lifetime.

    A subclass builds its parts inside :meth:`_building` (everything entered there is closed again if
    construction fails half way, and by :meth:`close` later) and lists its engines in :meth:`engines`.

    Streams: every step takes ``stream`` (a :class:`~trtio.Stream`, an int handle or any object with
    ``__cuda_stream__``); ``None`` is the calling thread's trtio default stream (:func:`trtio._stream.as_stream`),
    as everywhere in trtio. Construction runs on the stream given at creation and ends synchronised. Calls
    run in call order whatever streams they are given (the stream rule): a call on a stream other than the last
    call's makes its stream wait for an event recorded after the last call's work (no host synchronisation);
    ``release``, ``pin_prefix``, ``reset`` and a prefix's ``release`` follow it too. A setup is stepped by one
    thread at a time: a call that changes it while another thread is inside one is refused (:func:`one_thread`);
    several threads may each step their own setup, and a setup may be handed from thread to thread (each
    thread's default stream is ordered after the last call's, by the rule).

    Inputs: a step input trtio does not own (a numpy or foreign array, a Tensor view) is kept referenced until
    the copies the step enqueued to read it have completed on the device (the fence of its ring of inputs in flight,
    :class:`~trtio._staging.UploadRing`), so the caller may drop or reuse it as soon as the call returns.

    Failures (``docs/faults.md``): a step that raises leaves the setup as it was before the call (lengths,
    slots, pages, the round's state), so the same call may be retried. Where a step's own device work has
    already overwritten what a retry would read, it cannot be undone: the setup then says it is broken
    (:attr:`is_broken`), and every later call except :meth:`reset` and ``close()`` raises a TrtioError saying
    so; ``reset()`` ends every sequence and makes it usable again.
    """

    io: PipelineIO
    _backend: Backend
    _seqs: Sequences
    _steps: StepInputs
    _rope: RopeTables
    _context_memory: ContextMemory
    _extra_arena: Arena
    _embeds_staging: UploadRing
    _embeds_type: DType  # the activations' dtype
    _embeds_dtype: Any  # the activations' numpy dtype (None where numpy cannot hold it)
    _torch_embeds: TorchEmbeds | None = None  # the reader of torch embeddings, once fed one (trtio._foreign)
    _resources: contextlib.ExitStack | None = None
    _features: FeatureSet  # the families' parts of the setup's engines (trtio.features)
    _broken: str | None = None  # why the setup refuses every step (see the class docstring)
    _calls: Calls  # one thread at a time, call order, inputs in flight (trtio._setups.calls)
    # Moves on with every checked call (every call but a steady decode, which checks it did not move since the
    # decode before it) and with reset().
    _epoch = 0

    @contextlib.contextmanager
    def _building(self, stream: StreamLike) -> Iterator[tuple[contextlib.ExitStack, Stream]]:
        """An ExitStack for the parts under construction (kept, for close, only if construction succeeds)
        and the stream construction works on. Construction ends synchronised."""
        self._init_lifetime(f"this {type(self).__name__}")
        s = as_stream(stream, self._backend)
        with contextlib.ExitStack() as stack:
            self._calls = stack.enter_context(Calls(self._backend, type(self).__name__))
            self._calls.returns.follow = _follow_of(self._calls)
            yield stack, s
            s.synchronize()
            self._resources = stack.pop_all()

    @property
    def is_broken(self) -> bool:
        """Whether a failed step left device state it could not undo: every call but :meth:`reset` and
        ``close()`` is refused until ``reset()`` (see the class docstring)."""
        return self._broken is not None

    def _check_usable(self) -> None:
        """Refuse a call on a closed or a broken setup, naming what to do. Every call that may change the setup
        checks this first, which moves :attr:`_epoch` on."""
        self._epoch += 1
        self._refuse_unusable()

    def _refuse_unusable(self) -> None:
        """:meth:`_check_usable` without moving :attr:`_epoch` (a step's own staging before its plan is asked)."""
        if self._closed:
            self._check_open()
        if self._broken is not None:
            raise TrtioError(f"this {type(self).__name__} is broken: {self._broken}; reset() it (every sequence "
                             f"ends; prefill again) or close() it")

    def _run(self, e: BoundEngine, s: Stream, before: tuple[DeviceWork, ...], *, rerun: str | None = None) -> None:
        """Enqueue ``e``'s step (prepared) after the device work ``before``. ``rerun``: None for a step that may
        simply run again after a failure at any point (its work overwrites nothing it reads); else what its
        engine overwrites that a retry would read: a failure after the engine's work reached the device (a
        synchronisation that failed after a graph's warm-up) then leaves the setup broken."""
        try:
            e.executor.execute(s, before=before)
        except BaseException as exc:
            if rerun is not None and e.executor.enqueued > len(before):
                self._break(f"{rerun}, and the step failed after that ({type(exc).__name__}: {exc})")
                exc.add_note(f"this {type(self).__name__} is now broken: reset() or close() it")
            raise

    def _break(self, why: str) -> None:
        self._epoch += 1  # a decode plan rests on a usable setup
        self._broken = why
        log.warning("%r is broken: %s", self, why)

    def _repair(self) -> None:
        """After :meth:`reset` ended every sequence: nothing the setup remembers of the device's state is
        trusted any more (the step block's constants, the device's copy of the lengths)."""
        self._repaired()
        if self._broken is not None:
            self._steps.step.forget()
            self._broken = None

    def _repaired(self) -> None:
        """Every sequence ended (:meth:`reset`): what a setup remembers of the device beyond the step block (a
        decode plan's record of it) is let go."""

    def _make_steps(self) -> None:
        """The contract's step-input writer for this setup (after ``io`` and ``_rope`` exist)."""
        self._steps = self.io.contract.steps(self.io, self._rope.get)
        self._embeds_type = self.io.inputs_embeds.dtype  # device embeddings taken as they are
        self._embeds_dtype = self._embeds_type.numpy  # host embeddings taken as they are

    @abc.abstractmethod
    def engines(self) -> list[BoundEngine]:
        """Every engine of the setup, each with its role, config, state, tensor map and executor."""

    @property
    def contract(self) -> str:
        """The engine contract the setup's engines speak: ``"batch"`` or ``"ragged"``."""
        return self.io.contract.name

    def _stream(self, stream: StreamLike) -> Stream:
        """A call's stream (see the class docstring: ``None`` is this thread's default stream), ordered after the
        last call's work (:meth:`Calls.stream <trtio._setups.calls.Calls.stream>`). Called once the call's inputs
        are checked, before its work."""
        return self._calls.stream(stream)

    def _embeds(self, x: Any, hidden: int, stream: StreamLike, what: str = "inputs_embeds") -> tuple[Any, int, int]:
        """``x`` checked as [batch, seq, hidden] embeddings and converted to the activation dtype (numpy; a
        device array as it is), with its batch and seq. Nothing is enqueued; a foreign device array's
        producer is ordered before ``stream`` (the step's)."""
        kind = type(x)
        if kind is Tensor:  # the steps' own checks, inlined: a device tensor of the activation dtype
            shape = x.shape  # checks that it is open
            if x._dtype is self._embeds_type and len(shape) == 3 and shape[2] == hidden and x._backend is self._backend:
                not_partly_over(x, what, self.io.inputs_embeds, "inputs_embeds")
                return x, shape[0], shape[1]
        elif kind is np.ndarray:  # host data of the activation dtype, C-contiguous
            shape = x.shape
            if len(shape) == 3 and shape[2] == hidden and x.dtype == self._embeds_dtype and x.flags.c_contiguous:
                return x, shape[0], shape[1]
        else:  # a torch tensor the step takes as it is: read through torch's public calls, no DLPack capsule
            reader = self._torch_embeds or self._read_torch()
            if reader is not None and kind is reader.tensor_type:
                found = reader.read(x, hidden, stream)
                if found is not None:
                    if type(found) is Tensor:
                        not_partly_over(found, what, self.io.inputs_embeds, "inputs_embeds")
                    shape = found.shape
                    return found, shape[0], shape[1]
        x = as_embeds(x, what, self.io.inputs_embeds.dtype, hidden, self._backend, stream)
        if isinstance(x, Tensor):
            not_partly_over(x, what, self.io.inputs_embeds, "inputs_embeds")
        shape = x.shape
        return x, int(shape[0]), int(shape[1])

    def _read_torch(self) -> TorchEmbeds | None:
        """The reader of torch embeddings (:class:`~trtio._foreign.TorchEmbeds`), made once torch is imported."""
        self._torch_embeds = torch_embeds(self._backend, self._embeds_type, Tensor.wrap)
        return self._torch_embeds

    def _upload_embeds(self, x: Any, stream: Stream) -> None:
        """Put checked embeddings ``x`` ([B, S, hidden], from :meth:`_embeds`) into ``inputs_embeds``: pinned
        staging for numpy, a device copy for Tensors (none for a Tensor over inputs_embeds' own bytes: copy_from
        only orders its writer first). What a copy reads is kept until it has run (:meth:`Calls.read
        <trtio._setups.calls.Calls.read>`)."""
        dst, staging = self.io.inputs_embeds, self._embeds_staging
        if x is dst:
            return  # written in place by the caller
        if isinstance(x, Tensor):
            self._calls.read(x)
            dst.reshape(x.shape).copy_from(x, stream)
        elif x.nbytes <= staging.slot_capacity:
            staging.upload(x, dst, stream, reshape=False)  # the step's executor views the embeddings as it binds them
        else:
            self._calls.read(x)
            dst.reshape(x.shape).copy_from(x, stream)  # a long prompt: pageable copy, no staging

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
        """The KV page pool's ``total`` and ``free`` pages (the LLM's, or the base's; ragged contract), with the
        pages of prefixes the garbage collector released given back first."""
        self._check_open()
        returns = self._calls.returns
        with returns.lock:
            returns.collect()
            return self._seqs.kv_pages()

    @one_thread
    def release(self, slots: Sequence[int], stream: StreamLike = None) -> None:
        """End the sequences of ``slots`` (ragged contract): their slots become free and their pages go back
        to the pool (pages a pinned prefix holds stay). Host bookkeeping only: nothing is enqueued; ordered
        after the last call by the stream rule (``stream``: where the next work on those pages may come)."""
        self._check_usable()
        arr = self._seqs.checked_release(slots, "release")
        self._between_rounds("release()", release=True)
        self._stream(stream)
        self._seqs.release(arr)
        self._features.release(arr)

    @one_thread
    def pin_prefix(self, slot: int, tokens: int, stream: StreamLike = None) -> Prefix:
        """Keep the first ``tokens`` KV entries of the active sequence in ``slot`` alive, also after the slot is
        released, for later prefills to start from (``prefill(..., prefix=P)``; ragged contract). Full pages
        are shared by every sequence started from it; the partly filled last page is copied for each before
        it writes there. Host bookkeeping only, except on a hybrid model: there ``tokens`` must be all the slot
        holds, and a copy of the slot's recurrent states is enqueued on ``stream`` into a row of the setup's
        snapshot pool (``max_prefixes`` rows; a CapacityError naming it when every row is held). On an MRoPE model
        the prefix keeps its tokens' position delta (:attr:`~trtio._pages.Prefix.rope_delta`), which a sequence
        started from it goes on from. Ordered after the last call by the stream rule."""
        self._check_usable()
        self._features.check_pin("pin_prefix()")
        self._between_rounds("pin_prefix()")
        return self._seqs.pin(slot, tokens, stream=self._stream(stream), returns=self._calls.returns)

    def _between_rounds(self, what: str, *, release: bool = False) -> None:
        """Refuse ``what`` where a step protocol is half way through (a speculative round); ``release``: the
        call ends sequences (allowed in more places than an admission)."""

    def _step_lengths(self, e: BoundEngine) -> tuple[np.ndarray, tuple[int, ...], np.ndarray, bool]:
        """A step over every active sequence: the slots (ascending), their key, the engine's lengths of them
        (a view where the slots are ``0 .. n - 1``, else a copy) and whether it is a view."""
        seqs = self._seqs
        order, whole = seqs._order, seqs._contiguous  # the properties' fields: read at every step
        lengths = e.state.lengths[:order.shape[0]] if whole else e.state.lengths[order]
        return order, seqs._order_key, lengths, whole

    def _pages(self, e: BoundEngine, order: np.ndarray, key: tuple[int, ...], starts: np.ndarray, width: int,
               s: Stream, start_list: list[int] | None = None,
               top: int | None = None) -> tuple[StepPages | None, np.ndarray | None]:
        """Take the pages a step writes (``width`` tokens from ``starts`` on for each slot of ``order``; a
        CapacityError before anything changes when the pool is short) and enqueue the copies of shared pages it
        writes. Returns the plan that took pages (None: none taken), which the caller undoes if the step raises
        later, and the step's page-table rows (None where pages are not staged per step). ``start_list``:
        ``starts`` as ints, and ``top`` the largest of them, where the caller has them."""
        seqs = self._seqs
        if not seqs.slotted:
            return None, None
        table = seqs.tables[e.role]
        rows, limits, lowest = table.step(key)
        # PageTable.ensure's test, on Python ints (a step's few slots): does any slot write past its limit? None
        # does where the furthest start ends below the lowest limit (a steady step, most of the time).
        if not width or not key or (top is not None and top + width <= lowest) or \
                max(map(operator.sub, start_list or starts.tolist(), limits)) + width <= 0:
            return None, rows
        plan = table.ensure(order, starts, width)
        if plan is None:
            return None, rows
        plan.commit()
        try:
            seqs.copy(e.role, plan.moves, s)
            return plan, seqs.step_rows(e.role, key)
        except BaseException:
            plan.undo()
            raise

    def _prefill(self, e: BoundEngine, inputs_embeds: Any, context_lengths: Any, stream: StreamLike, slots: Any,
                 prefix: Any, past_lengths: Any, what: str, **inputs: Any) -> Prompt:
        """A prefill of ``e`` (``LLMSetup.prefill``, ``SpecDecodeSetup.base_prefill``): every input checked, then
        the sequences admitted, their pages taken, the prompts staged and the engine enqueued; a failure on
        the way leaves the sequences as they were. ``inputs``: the prefill's keywords the features take
        (``deepstack_embeds``, ``mrope_positions``, ...: :meth:`~trtio.features.Feature.check_prompt`). Returns what
        the prompts were."""
        self._check_usable()
        x, b, seq = self._embeds(inputs_embeds, e.cfg.hidden_size, stream)
        if not 1 <= b <= self.io.max_batch:
            raise ShapeError(f"inputs_embeds: batch {b} is outside 1..{self.io.max_batch}")
        ctx = self._check_lengths(context_lengths, b, seq, "context_lengths")
        if slots is not None:
            self._between_rounds(f"{what}(slots=...)")
        rows, prefixes, past = self._prompt_slots(e, slots, prefix, past_lengths, b, ctx, what)
        dims = self._prefill_dims(e, b, seq, past)
        checked = self._features.check_prompt(inputs, b, seq, ctx, past, stream)
        # Everything is checked: from here on pages are taken and work is enqueued (undone if it fails).
        s = self._stream(stream)
        with self._seqs.transaction():
            plans = self._prompt_pages([e], rows, past, ctx, prefixes, restart=slots is None)
            self._upload_embeds(x, s)
            before = self._stage_prompt(e, rows, past, ctx, seq, plans, s)
            # the features' work first (an MRoPE slot's rows, written before the step gathers them)
            before = self._features.prompt_work(checked, rows, past, ctx, past_lengths is None, prefixes, s) + before
            self._run_prefill(e, dims, ctx, s, past, before, rows)
        return Prompt(seq, ctx, past, rows, prefixes)

    def _settle_prompt(self, ok: bool) -> None:
        """A prefill succeeded (``ok``) or raised: the features settle what it wrote; a failure one cannot undo
        breaks the setup."""
        why = self._features.prompt_done(ok)
        if why is not None:
            self._break(why)

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
            past = _continued(np.asarray(self._host_input(past_lengths, "past_lengths")), e.state.lengths, rows, b)
        elif prefixes is not None:
            past = np.array([0 if p is None else p.tokens for p in prefixes], np.int64)
        if past is not None:
            self._features.check_past(e.role, past, what)
            _check_past(e, past, ctx, rows, what)
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
        self._features.stage(e, rows, np.zeros(rows.shape[0], np.int64) if past is None else past, ctx, past is None)
        return self._steps.prompt(e, past, ctx, seq, s, slots=rows, pages=seqs.step_rows(e.role, key))

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

    def _host_input(self, obj: Any, what: str) -> Any:
        """An input the host reads when it lays a step out (:func:`~trtio._inputs.host_input`)."""
        return host_input(obj, what, self._backend)

    def _check_lengths(self, ctx: Any, batch: int, limit: int, what: str) -> np.ndarray:
        """Lengths of ``batch`` sequences, each in 1..``limit`` (:func:`~trtio._inputs.check_lengths`)."""
        return check_lengths(host_input(ctx, what, self._backend), batch, limit, what)

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
        self._epoch += 1  # a decode plan rests on an open setup
        self._torch_embeds = None  # the torch tensors its views keep go with it
        resources, self._resources = self._resources, None
        if resources is not None:
            resources.close()


def _follow_of(calls: Calls) -> Callable[[StreamLike], object]:
    """The stream rule of a setup's ``calls`` for its prefixes' releases, without keeping them alive."""
    ref = weakref.ref(calls)

    def follow(stream: StreamLike) -> None:
        found = ref()
        if found is not None and not found.is_closed:
            found.stream(stream)

    return follow
