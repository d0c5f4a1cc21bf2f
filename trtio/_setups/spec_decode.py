"""create_for_spec_decode: an EAGLE-style base + draft pair sharing one PipelineIO, and its step protocol.

The two engines share one PipelineIO and one context memory, each with its own tensor map and KV
state. A round (Edge-LLM's ``eagleDecoder`` phases: ``docs/edgellm-assumptions.md`` §6):

1. ``base_prefill`` then ``draft_prefill`` (the prompt shifted by one token) — or, after a round,
   ``draft_accept`` — give the draft's logits at each sequence's last committed token (the *root*);
2. ``draft_propose`` expands the draft tree one level per call: ``k`` new nodes per sequence with their
   parents (the root, or nodes of the previous level); the draft runs over the whole tree so far
   (Edge-LLM re-runs it, one fixed width ``drafting_step * drafting_top_k`` per round) and returns the
   logits of the new nodes. ``k = 1`` without parents is the chain step;
3. ``verify`` runs the base over a verify tree (the pending token as node 0 and nodes selected from the
   draft tree), returning logits for every node;
4. ``accept`` commits each sequence's accepted root-to-node path: its KV entries become consecutive
   cache slots, and its base hidden-state rows are set aside for the draft;
5. ``draft_accept`` catches the draft up over the accepted tokens (shifted by one, as in prefill).

Calls out of this order, or with inputs that disagree with the state (a path that does not follow the
verified tree, a draft prefill of other lengths than the base's), raise before any work is enqueued.
Both contracts run the same protocol: batch-major ``[B, S, ...]`` steps, or Edge-LLM 0.11's token-major
rows (entry padding, phases 1-5). Returned logits are views of PipelineIO buffers, valid until the
next step overwrites them. Steps never allocate; decode-type steps never synchronise the host.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trtio._cache import BoundedCache
from trtio._config import DeploymentConfig
from trtio._cuda.backend import Backend
from trtio._dims import InferenceDims
from trtio._dtypes import DType
from trtio._engine import DECODE_PROFILE, ContextMemory
from trtio._memory import Arena, MemoryReport, TensorRequest
from trtio._ops import warm_up
from trtio._pages import DEFAULT_MAX_PREFIXES, Prefix
from trtio._pipeline_io import PipelineIO
from trtio._setups.base import EngineGraphStats, Prompt, SetupBase
from trtio._setups.binding import (
    BindContext,
    BoundEngine,
    RopeTables,
    bind_engine,
    engine_backend,
    engine_io,
    with_contract,
)
from trtio._setups.calls import one_thread
from trtio._setups.catch_up import CatchUp
from trtio._setups.draft_prompt import (
    DraftRoots,
    DraftRound,
    check_accept_lengths,
    check_draft_prompt,
    check_draft_shape,
    check_room,
)
from trtio._setups.drafting import DraftTree
from trtio._setups.sequences import Sequences
from trtio._setups.verify import AcceptedPaths, PlacedPaths, VerifyTree, VerifyTrees
from trtio._staging import INPUT_RING_SLOTS, UploadRing
from trtio._stream import Stream, StreamLike
from trtio._tensor import Tensor
from trtio._tensor_map import TensorMap
from trtio.errors import ConfigError, InvalidTypeError, ShapeError, TrtioError
from trtio.features import FeatureSet, Ready, family_configs

__all__ = ["Phase", "SpecDecodeSetup", "create_for_spec_decode"]


class Phase(enum.Enum):
    """Where a :class:`SpecDecodeSetup` stands in its one order of calls (its value says what comes next).

    ``base_prefill`` (PROMPTED) → ``draft_prefill`` (READY) → ``draft_propose`` × levels (PROPOSING) →
    ``verify`` (VERIFIED) → ``accept`` (ACCEPTED) → ``draft_accept`` (READY) → the next round. Between rounds
    (READY, or EMPTY before any prompt) ``base_prefill(slots=...)`` admits sequences and ``release`` /
    ``pin_prefix`` run; ``base_prefill`` without ``slots`` restarts the batch from any phase; ``reset`` empties
    it. The base may also run alone: a ``verify`` right after ``base_prefill`` leaves the draft behind
    (BASE_VERIFIED → ``accept`` → BASE_ONLY → ``verify`` ...; no draft call until a ``base_prefill`` restarts
    the batch). A call out of order is refused naming what comes next, and changes nothing."""

    EMPTY = "no prompt has run: base_prefill() comes next"
    PROMPTED = "a base prefill awaits its draft_prefill() (or, for the base alone, a verify()), which comes next"
    READY = "between rounds: draft_propose() or verify() comes next"
    PROPOSING = "a round is drafting: draft_propose() or verify() comes next"
    VERIFIED = "a verify awaits its accept() (or another verify() replacing it), which comes next"
    ACCEPTED = "an accept awaits its draft_accept(), which comes next"
    BASE_VERIFIED = "a verify of the base alone awaits its accept() (or another verify()), which comes next"
    BASE_ONLY = ("the base runs alone (it verified without the draft's prefill): verify() comes next; "
                 "base_prefill() restarts the batch with the draft")


_BETWEEN_ROUNDS = (Phase.EMPTY, Phase.READY)
_RELEASE = (*_BETWEEN_ROUNDS, Phase.BASE_ONLY)  # a sequence may end between the base's verifies too

_NO_ROOTS = np.zeros(0, np.int64)  # a later proposal level's roots: only a round's first level reads them
# A round's first proposal level's slots, their key, cached lengths and page-table rows (its later levels' too).
_RoundStep = tuple[np.ndarray, tuple[int, ...], np.ndarray, "np.ndarray | None"]
_NO_ROUND_STEP: _RoundStep = (np.zeros(0, np.int64), (), np.zeros(0, np.int64), None)  # before a round's first level


def _bound_bundle(base_engine: Any, draft_engine: Any, bundle: DeploymentConfig) -> DeploymentConfig:
    """``bundle`` checked for a pair (a draft and a spec section), each config with the contract its engine's I/O
    speaks (the same for both)."""
    if not isinstance(bundle, DeploymentConfig):
        raise InvalidTypeError(f"create_for_spec_decode: bundle must be a DeploymentConfig, got "
                               f"{type(bundle).__name__}")
    bundle.validate()
    if bundle.draft is None or bundle.spec is None:
        raise ConfigError("draft", "create_for_spec_decode needs a DeploymentConfig with a draft and a spec section")
    for family in family_configs():  # each family refuses a pair it cannot run, before anything is allocated
        found = bundle.base.feature(family) or bundle.draft.feature(family)
        if found is not None:
            found.check_runs(bundle.base, bundle.draft, "create_for_spec_decode")
    base_cfg = with_contract(bundle.base, engine_io(base_engine, "create_for_spec_decode (base)"), "base engine")
    draft_cfg = with_contract(bundle.draft, engine_io(draft_engine, "create_for_spec_decode (draft)"),
                              "draft engine")
    if base_cfg.contract != draft_cfg.contract:
        raise ConfigError("contract", f"create_for_spec_decode: the base engine declares the {base_cfg.contract!r} "
                                      f"contract, the draft engine the {draft_cfg.contract!r} one; both must speak "
                                      "the same")
    return DeploymentConfig(base_cfg, draft_cfg, bundle.spec, dict(bundle.extra))


def _bind_pair(setup: SpecDecodeSetup, stack: contextlib.ExitStack[Any], s: Stream, base_engine: Any,
               draft_engine: Any, graphs: bool) -> tuple[BoundEngine, BoundEngine, TensorMap]:
    """Bind a spec setup's base and draft to its PipelineIO (their resources, and their features' parts, entered into
    ``stack``): the base, the draft and the draft catch-up's map."""
    io, be, base_cfg, draft_cfg = setup.io, setup._backend, setup.bundle.base, setup.bundle.draft
    assert draft_cfg is not None
    mb, memory, rope = io.max_batch, setup._context_memory, setup._rope
    ctx = BindContext(io, be, s, stack, rope, setup._calls, DEFAULT_MAX_PREFIXES, setup.bundle)
    features = setup._features
    # The families' parts of the base first (a hybrid base's per-token verify states, entered before the base's
    # executor, which binds them: closed after it).
    constants = features.make(base_cfg, "base", ctx, engine_io(base_engine, "create_for_spec_decode (base)"))
    base = bind_engine(base_engine, base_cfg, io.build_tensor_map(base_cfg), max_batch=mb, backend=be,
                       context_memory=memory, graphs=graphs, rope=rope, stream=s, resources=stack, name="base", io=io,
                       constants=constants)
    features.bound(base, ctx)
    ctx.engines["base"] = base
    constants = features.make(draft_cfg, "draft", ctx, engine_io(draft_engine, "create_for_spec_decode (draft)"))
    draft = bind_engine(draft_engine, draft_cfg, io.build_tensor_map_for_spec_decode_draft(draft_cfg), max_batch=mb,
                        backend=be, context_memory=memory, graphs=graphs, rope=rope, stream=s, resources=stack,
                        name="draft", io=io, constants=constants)
    features.bound(draft, ctx)
    # The draft's catch-up binds its own tree inputs where the contract has them (its levels rewrite the shared ones
    # every round): a plan of its own, from a map of its own.
    catch_up_map = draft.contract.catch_up_map(io, draft.tensor_map)
    if catch_up_map is not draft.tensor_map:
        catch_up_map.add_user(draft.executor)
    return base, draft, catch_up_map


def _draft_staging(stack: contextlib.ExitStack[Any], setup: SpecDecodeSetup, bundle: DeploymentConfig,
                   w: int) -> tuple[Arena, UploadRing, DraftTree]:
    """A spec setup's own memory (entered into ``stack``): its arena (pinned embeddings of a step, the draft tree's
    words and nodes for ``w`` nodes a round), the embeddings' staging ring, and the draft tree over them."""
    io, be, base_cfg, spec = setup.io, setup._backend, bundle.base, bundle.spec
    assert spec is not None
    mb, rows = io.max_batch, max(bundle.effective_max_draft_proposal_size(), 1)
    arena = stack.enter_context(Arena([
        UploadRing.request("host_inputs_embeds", (mb, rows, base_cfg.hidden_size), base_cfg.activation,
                           slots=INPUT_RING_SLOTS),
        TensorRequest.of("draft_tree_words", (mb * w, max(1, -(-w // 32))), DType.INT32),
        TensorRequest.of("draft_tree_nodes", (mb * w, 2), DType.INT32)],
        backend=be, title="spec_decode staging"))
    staging = stack.enter_context(UploadRing(arena["host_inputs_embeds"], be, slots=INPUT_RING_SLOTS,
                                             title="inputs_embeds staging"))
    tree = DraftTree(io, setup._steps, setup.draft, arena["draft_tree_words"], arena["draft_tree_nodes"], staging, be,
                     width=w, base_width=spec.base_output_hidden_dim)
    return arena, staging, tree


def _check_verify_room(order: np.ndarray, lengths: np.ndarray, have: list[int], n: int, cap: int) -> int:
    """Refuse a verify of ``n`` nodes that does not fit after what a sequence has cached; the longest length."""
    top = max(have)
    if top + n > cap:
        i = int(np.argmax(lengths))
        raise ShapeError(f"verify: {n} nodes do not fit after the {int(lengths[i])} tokens sequence "
                         f"{int(order[i])} has cached (max_kv_cache_capacity {cap})")
    return top


class _StepDims:
    """A setup's steps' dims from the configs' recipes, remembered per shape (a recipe checks and builds them);
    the last of each engine and kind is found again by its shape alone (a round repeats its steps' shapes)."""

    def __init__(self) -> None:
        self._cache: BoundedCache[tuple[Any, ...], InferenceDims] = BoundedCache()
        self._last: BoundedCache[tuple[str, str], tuple[tuple[int, ...], InferenceDims]] = BoundedCache()

    def __call__(self, e: BoundEngine, kind: str, *args: int) -> InferenceDims:
        last = self._last.get((e.role, kind))
        if last is not None and last[0] == args:
            return last[1]
        key = (e.role, kind, *args)
        dims = self._cache.get(key)
        if dims is None:
            recipes: dict[str, Callable[..., InferenceDims]] = {
                "proposal": e.cfg.proposal_dims, "verify": e.cfg.spec_verify_dims, "accept": e.cfg.accept_dims}
            dims = self._cache.put(key, recipes[kind](*args))
        self._last.put((e.role, kind), (args, dims))  # one entry per engine and kind
        return dims


class SpecDecodeSetup(SetupBase):
    """A spec-decode base + draft sharing one PipelineIO (see module docstring).

    Lengths: ``base_lengths`` counts tokens the base has cached and committed; the draft's cache is
    committed up to the same length (its proposal entries past it are scratch, rewritten by
    :meth:`draft_accept`). The round's parts: :class:`~trtio._setups.drafting.DraftTree` (the draft tree and
    its levels), :class:`~trtio._setups.verify.VerifyTrees` and :class:`~trtio._setups.verify.AcceptedPaths`
    (verify and accept), :class:`~trtio._setups.catch_up.CatchUp` (the draft's catch-up).
    """

    def __init__(self, base_engine: Any, draft_engine: Any, bundle: DeploymentConfig,
                 max_runtime_batch_size: int | None = None, stream: StreamLike = None, *, graphs: bool = False,
                 backend: Backend | str | None = None) -> None:
        bundle = _bound_bundle(base_engine, draft_engine, bundle)
        draft_cfg, spec = bundle.draft, bundle.spec
        assert draft_cfg is not None and spec is not None
        be = engine_backend(base_engine, backend)
        self._backend = be
        self.bundle = bundle
        self._features = FeatureSet()
        self.proposal_width = w = spec.drafting_step * spec.drafting_top_k  # the draft tree's width per round
        with self._building(stream) as (stack, s):
            self.io = io = stack.enter_context(
                PipelineIO.create_for_spec_decode(bundle, max_runtime_batch_size, s, backend=be))
            mb = io.max_batch
            self._rope = stack.enter_context(RopeTables(be))
            self._make_steps()
            self._context_memory = stack.enter_context(ContextMemory.for_engines([base_engine, draft_engine],
                                                                                 backend=be))
            self.base, self.draft, self._catch_up_map = _bind_pair(self, stack, s, base_engine, draft_engine, graphs)
            self._extra_arena, self._embeds_staging, self._tree = _draft_staging(stack, self, bundle, w)
            warm_up(be)
        self._trees = VerifyTrees()
        self._paths = AcceptedPaths(mb)
        # Accepted rows set aside per sequence: the longest path a round may accept.
        self._catch_up = CatchUp(io, self._steps, base_width=spec.base_output_hidden_dim,
                                 scratch_rows=bundle.effective_max_draft_proposal_size())
        # A speculative prefix keeps one entry fewer than asked: the draft's last one depends on the next token.
        self._seqs = Sequences([self.base, self.draft], mb, prefix_lag=1, features=self._features)
        self._step_input = self._features.step_input()  # the base's per-token input (ple_embeds), or none
        self._dims = _StepDims()
        self._phase = Phase.EMPTY  # the one order of calls (see Phase); the fields below are its phases' data
        self._prompt: Prompt | None = None  # PROMPTED: the base prefill awaiting its draft prefill
        self._roots = DraftRoots(io, self._steps, mb, spec.draft_hidden_size)
        self._verified: VerifyTree | None = None  # VERIFIED: the verify tree accept() accepts from
        self._accepted: np.ndarray | None = None  # ACCEPTED: path lengths accept() committed, for draft_accept
        self._accepted_rows = np.zeros((0, 0), np.int64)  # their base hidden-state rows [batch, longest]
        self._placed: PlacedPaths | None = None  # where the last accept left its paths on the device (its rows')
        self._accepted_list: list[int] = []  # the path lengths as ints
        self._accepted_of: np.ndarray | None = None  # the read-only lengths _accepted_list holds (kept alive by it)
        # Where verify leaves the base's cached lengths on the device for accept's KV commit (as it leaves its page
        # table there); None: the commit's rows carry them.
        self._verify_starts = self._steps.tree_starts()
        self._round_step: _RoundStep = _NO_ROUND_STEP  # the round's first level's step (_RoundStep)

    def engines(self) -> list[BoundEngine]:
        return [self.base, self.draft]

    # -- public views ---------------------------------------------------------------------------
    @property
    def base_lengths(self) -> np.ndarray:
        """Tokens the base has cached and committed per active sequence, in the order of :attr:`active`."""
        return np.asarray(self.base.state.lengths[self._seqs.order])

    @property
    def draft_lengths(self) -> np.ndarray:
        """Tokens the draft has committed per active sequence (equal to ``base_lengths`` between rounds)."""
        return np.asarray(self.draft.state.lengths[self._seqs.order])

    @property
    def lengths(self) -> np.ndarray:
        """Tokens cached and committed per active sequence (``base_lengths``)."""
        return self.base_lengths

    @property
    def draft_tree(self) -> np.ndarray:
        """The parents (-1: the root) of the draft-tree nodes proposed this round, [batch, nodes]."""
        return self._tree.parents(self._seqs.count)

    @property
    def graph_stats(self) -> EngineGraphStats:
        """CUDA-graph telemetry: ``graph_stats["base"]``, ``graph_stats["draft"]``, and their sums as
        attributes."""
        return EngineGraphStats(self.engines())

    def _need_batch(self) -> int:
        count = len(self._seqs._order)  # Sequences.count's field: read at every step
        if count == 0:
            raise TrtioError("run base_prefill() first: there is no sequence to continue")
        return count

    @property
    def phase(self) -> Phase:
        """Where the setup stands in its order of calls (:class:`~trtio._setups.spec_decode.Phase`: its value says
        what comes next)."""
        return self._phase

    def _expect(self, what: str, *phases: Phase) -> None:
        """Refuse ``what`` unless the setup stands in one of ``phases`` (before anything is read or changed)."""
        if self._phase not in phases:
            raise TrtioError(f"{what} is out of order: {self._phase.value}")

    def _between_rounds(self, what: str, *, release: bool = False) -> None:
        self._expect(what, *(_RELEASE if release else _BETWEEN_ROUNDS))

    # -- prefill ----------------------------------------------------------------------------------
    @one_thread
    def base_prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None, *,
                     slots: Sequence[int] | None = None, prefix: Prefix | Sequence[Prefix | None] | None = None,
                     past_lengths: Any = None, deepstack_embeds: Sequence[Any] | None = None,
                     ple_embeds: Any = None) -> Tensor:
        """Base over the prompts (profile 0, causal); returns logits [batch, vocab] of each last prompt token.

        The base's ``hidden_states`` land in ``io.base_hidden_states`` (a row per token), which the draft
        prefill reads as ``hidden_states_input`` at the same address. Without ``deepstack_embeds`` the
        deepstack inputs are zero. ``slots``, ``prefix`` and ``past_lengths`` as for
        :meth:`LLMSetup.prefill <trtio._setups.llm.LLMSetup.prefill>` (a prefix pins both engines' pools);
        admitting sequences (``slots=``) is allowed between rounds, and they join the next round after their
        :meth:`draft_prefill`. ``slots=None`` restarts the batch. ``ple_embeds``: a base with per-layer embeddings
        takes them as :meth:`LLMSetup.prefill <trtio._setups.llm.LLMSetup.prefill>` does.
        """
        self._step_input.prepare(ple_embeds, inputs_embeds, self._ready(stream), now=True)
        try:
            self._prompt = self._prefill(self.base, inputs_embeds, context_lengths, stream, slots, prefix, past_lengths,
                                         "base_prefill", deepstack_embeds=deepstack_embeds)
        except BaseException:
            self._settle_prompt(False)
            raise
        self._settle_prompt(True)
        self._verified = self._accepted = None
        self._tree.start()
        self._phase = Phase.PROMPTED
        return self.io.output_logits

    @one_thread
    def draft_prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None, *,
                      slots: Sequence[int] | None = None,
                      prefix: Prefix | Sequence[Prefix | None] | None = None) -> Tensor:
        """Draft over the prompts shifted by one token (EAGLE): row p holds the embedding of token p+1,
        ``hidden_states_input`` is the base prefill's hidden states (no copy), ``hidden_states_from_draft``
        is zero. Takes the base prefill's batch, width, lengths, slots and prefixes (``slots`` and ``prefix``,
        where given, must be the base prefill's). Returns the draft logits [batch, draft vocab] at each
        sequence's last row. (A DFlash pair's takes and returns a block: :mod:`trtio.families.spec.dflash`.)"""
        self._check_usable()
        self._expect("draft_prefill()", Phase.PROMPTED)
        self._need_batch()
        pending = self._prompt
        assert pending is not None  # PROMPTED's data
        part = self._features.part("draft_prefill")  # a draft of its own steps (DFlash: a block)
        if part is not None:
            block: Tensor = part.draft_prefill(self._draft_round(), pending, inputs_embeds, context_lengths, slots,
                                               prefix, stream)
            self._prompt = None
            self._start_round()
            return block
        e, rows, past = self.draft, pending.rows, pending.past
        x, b, seq = self._embeds(inputs_embeds, e.cfg.hidden_size, stream)
        check_draft_shape(pending, x.shape)
        ctx = self._check_lengths(context_lengths, b, seq, "context_lengths")
        check_draft_prompt(pending, ctx, slots, prefix, self._seqs, e)
        dims = self._prefill_dims(e, b, seq, past)
        s = self._stream(stream)
        with self._seqs.transaction(), self._roots.kept():  # a prefill that fails moves no root
            plans = self._prompt_pages([e], rows, past, ctx, None, restart=False)  # admitted by the base prefill
            self._upload_embeds(x, s)
            before = self._roots.park(rows, self._seqs.order) + self._stage_prompt(e, rows, past, ctx, seq, plans, s)
            self.io.draft_hidden_states_in.reshape((b * seq, e.cfg.hidden_size)).zero_(s)
            self._run_prefill(e, dims, ctx, s, past, before, rows)
        self._prompt = None
        # The root's hidden state: the draft output row of each sequence's last token.
        self._roots.rows[rows] = self._steps.prompt_roots(b, seq, ctx)
        self._start_round()
        return self.io.output_logits

    def _draft_round(self) -> DraftRound:
        """What a draft family's own steps use of this setup (:class:`~trtio._setups.draft_prompt.DraftRound`), made
        for each call (not kept: its bound methods would keep the setup alive in a cycle)."""
        return DraftRound(self.draft, self.io, self._steps, self._seqs, self._catch_up, self._catch_up_map,
                          self._embeds, self._check_lengths, self._host_input, self._stream, self._prompt_pages,
                          self._upload_embeds, self._step_lengths, self._pages, self._run, self._keep_accepted_rows)

    def _ready(self, stream: StreamLike) -> Ready:
        """What a step input asks once the step is known to take it: a closed or broken setup refused, then the
        step's stream and the call rules."""
        def ready() -> tuple[Stream, Any]:
            self._refuse_unusable()
            return self._stream(stream), self._calls
        return ready

    def _keep_accepted_rows(self, rows: np.ndarray) -> None:
        self._accepted_rows = rows
        self._placed = None  # the rows are no longer the accepted nodes' of the verify step

    def _start_round(self, caught_up: list[int] | None = None) -> None:
        self._tree.start(caught_up)
        self._phase = Phase.READY

    # -- drafting ---------------------------------------------------------------------------------
    @one_thread
    def draft_propose(self, inputs_embeds: Any, stream: StreamLike = None, *, parents: Any = None) -> Tensor:
        """Expand the draft tree by one level and return the draft's logits [batch * k, draft vocab] of its
        ``k`` new nodes (sequence-major).

        ``inputs_embeds`` [batch, k, hidden] are the new nodes' token embeddings; ``parents`` ([k], shared, or
        [batch, k]) their parents: -1 for the root (the last committed token), else a node of the previous
        level (the nodes the last call returned logits for). Without ``parents``, ``k`` must be 1 and the node
        continues the chain. The draft runs over every node of the tree so far, at positions draft length
        + depth, each seeing its ancestors, with ``hidden_states_from_draft`` the parent's draft hidden state
        and ``hidden_states_input`` zero (Edge-LLM's proposal step). At most ``drafting_step *
        drafting_top_k`` nodes per round.
        """
        self._check_usable()
        self._expect("draft_propose()", Phase.READY, Phase.PROPOSING)
        b = self._need_batch()
        part = self._features.part("draft_propose")  # a draft of its own steps (DFlash refuses: the block is one)
        if part is not None:
            logits: Tensor = part.draft_propose(self._draft_round(), b, inputs_embeds, parents, stream)
            self._phase = Phase.PROPOSING
            return logits
        e = self.draft
        x, nb, k = self._embeds(inputs_embeds, e.cfg.hidden_size, stream)
        if nb != b:
            raise ShapeError(f"inputs_embeds: batch {nb} differs from the prefill's batch {b}")
        tree = self._tree
        par = tree.check(self._host_input(parents, "parents"), b, k)
        w = tree.width
        first = tree.nodes == 0
        if first:
            order, key, past, whole = self._step_lengths(e)
            cap = e.cfg.max_kv_cache_capacity
            have = past.tolist()
            top = check_room(order, past, have, w, cap, "a proposal round")  # its levels all write after these lengths
        else:  # nothing moves the sequences, lengths or pages between a round's levels: its first level's
            order, key, past, pages = self._round_step
        dims = self._dims(e, "proposal", b, w, k)
        # Everything is checked: from here on pages are taken (a round's first level) and work is enqueued.
        s = self._stream(stream)
        taken = None
        if first:
            taken, pages = self._pages(e, order, key, past, w, s, have, top)
        try:
            # the roots are staged at once (a view of slots 0 .. b - 1 serves as well as a copy)
            roots = _NO_ROOTS if not first else self._roots.rows[:b] if whole else self._roots.rows[order]
            if type(x) is Tensor:  # read by a copy now or in the step's graph: kept until it has run
                self._calls.read(x)
            before = tree.propose(x, par, past, roots, s, order if self._seqs.slotted else None, pages, batch=b,
                                  nodes=k, have=have if first else None)
            e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
            self._run(e, s, before, rerun="the proposal's engine ran and overwrote the draft hidden states a retry "
                                          "reads (the root's, or the previous level's)")
        except BaseException:
            if taken is not None:
                taken.undo()
            raise
        tree.grow()
        if first:
            self._round_step = (order, key, past, pages)
        self._phase = Phase.PROPOSING
        return self.io.output_logits

    # -- verify and accept --------------------------------------------------------------------------
    @one_thread
    def verify(self, inputs_embeds: Any, tree: Any, stream: StreamLike = None, *, ple_embeds: Any = None) -> Tensor:
        """Base over a token tree per sequence; returns logits [batch * N, vocab] for every node.

        ``tree`` is a parent list ([N] shared by the batch, or [batch, N]; -1 for the root) or an unpacked
        mask [batch, N, N] (node t sees node i; a sequence's padding nodes are all-zero rows after its real
        ones). Node 0 is the root (the pending token). Nodes go to cache slots ``length + t``; positions are
        length + depth. The base cache is not committed until :meth:`accept`. ``ple_embeds`` ``[batch, N, L x
        ple_hidden]``: a base with per-layer embeddings takes each node's (as :meth:`base_prefill`).
        """
        self._check_usable()
        # (again after a verify, not yet accepted: the new tree replaces the last; nothing was committed)
        self._expect("verify()", Phase.READY, Phase.PROPOSING, Phase.VERIFIED, Phase.PROMPTED, Phase.BASE_ONLY,
                     Phase.BASE_VERIFIED)
        b = self._need_batch()
        e = self.base
        t = self._trees.get(tree if type(tree) is list else self._host_input(tree, "tree"), b)
        n = t.nodes
        self._features.check_verify(t.parents, t.real)
        x, nb, ns = self._embeds(inputs_embeds, e.cfg.hidden_size, stream)
        if (nb, ns) != (b, n):
            raise ShapeError(f"inputs_embeds: verify of {n} nodes takes [batch={b}, {n}, hidden], "
                             f"got {list(x.shape)}")
        dims = self._dims(e, "verify", b, n)  # the tree size against max_verify_tree_size
        order, key, lengths, _whole = self._step_lengths(e)
        have = lengths.tolist()
        top = _check_verify_room(order, lengths, have, n, e.cfg.max_kv_cache_capacity)
        self._step_input.prepare(ple_embeds, inputs_embeds, self._ready(stream), now=True)
        s = self._stream(stream)
        taken, pages = self._pages(e, order, key, lengths, n, s, have, top)
        try:
            self._upload_embeds(x, s)
            past = self._tree.round_past(have)  # the proposal levels' constant where equal: not staged again
            before = self._steps.tree(e, t.layout, lengths if past is None else past, t.select, s,
                                      order if self._seqs.slotted else None, pages)
            tm, ex = e.tensor_map, e.executor
            tm.use_deepstack_zero()
            if not ex.replay(DECODE_PROFILE, tm, dims, s, before):  # a steady verify: its graph, as it is
                ex.prepare(DECODE_PROFILE, tm, dims, s)
                ex.execute(s, before=before)
        except BaseException:
            if taken is not None:
                taken.undo()
            raise
        self._verified = t
        self._accepted = None
        self._prompt = None  # from PROMPTED: the draft is left behind
        self._phase = Phase.VERIFIED if self._phase in (Phase.READY, Phase.PROPOSING, Phase.VERIFIED) else \
            Phase.BASE_VERIFIED
        return self.io.output_logits

    @one_thread
    def accept(self, paths: Sequence[Sequence[int]] | np.ndarray, stream: StreamLike = None) -> None:
        """Commit each sequence's accepted root-to-node path of the last verify tree.

        ``paths[b]`` starts at the root 0 and follows the verified tree (each node a child of the one
        before); ``paths`` may also be an int array [batch, L] padded with trailing -1. The path's KV
        entries are compacted to consecutive slots after the committed length (every layer, K and V), its
        base hidden-state rows are set aside for :meth:`draft_accept`, and the base lengths grow by the
        path length.
        """
        self._check_usable()
        self._expect("accept()", Phase.VERIFIED, Phase.BASE_VERIFIED)
        b = self._need_batch()
        tree = self._verified
        assert tree is not None  # VERIFIED's data
        given = paths if type(paths) is list else self._host_input(paths, "paths")
        order, _key, lengths, whole = self._step_lengths(self.base)
        state = self.base.state
        s = self._stream(stream)
        acc, self._accepted_rows, self._placed = self._paths.commit(given, b, tree, state, lengths, s,
                                                                    staged=self._verify_starts)
        # the features' state of the accepted paths (a hybrid base's: each sequence's slot)
        self._features.accept(order, self._accepted_rows, acc, tree.nodes, s)
        if whole:
            lengths += acc
        else:
            state.lengths[order] += acc
        self._accepted = acc
        if acc is not self._accepted_of:  # the read-only lengths of repeated paths are read as ints once
            self._accepted_list = acc.tolist()
            self._accepted_of = None if acc.flags.writeable else acc
        self._verified = None
        self._phase = Phase.ACCEPTED if self._phase is Phase.VERIFIED else Phase.BASE_ONLY

    @one_thread
    def draft_accept(self, inputs_embeds: Any, accept_lengths: Any, stream: StreamLike = None) -> Tensor:
        """The draft's catch-up over the accepted tokens (shifted by one, as in the prefill): row t of
        sequence b holds the embedding of the token after accepted node t; ``accept_lengths`` are the path
        lengths :meth:`accept` committed. ``hidden_states_input`` rows are the accepted nodes' base hidden
        states. Starts at the draft's committed length; returns draft logits [batch, draft vocab] at each
        sequence's last accepted row. (A DFlash pair's takes and returns a block: :mod:`trtio.families.spec.dflash`.)"""
        self._check_usable()
        self._expect("draft_accept()", Phase.ACCEPTED)
        b = self._need_batch()
        acc, lens = self._accepted, self._accepted_list
        assert acc is not None  # ACCEPTED's data
        part = self._features.part("draft_accept")  # a draft of its own steps (DFlash: a block)
        if part is not None:
            block: Tensor = part.draft_accept(self._draft_round(), b, acc, lens, self._accepted_rows, inputs_embeds,
                                              accept_lengths, stream)
            self._accepted = None
            self._start_round()
            return block
        e = self.draft
        x, nb, a = self._embeds(inputs_embeds, e.cfg.hidden_size, stream)
        if nb != b:
            raise ShapeError(f"inputs_embeds: batch {nb} differs from {b}")
        check_accept_lengths(accept_lengths, lens, b, a, self._host_input, self._check_lengths)
        dims = self._dims(e, "accept", b, a)
        order, key, past, whole = self._step_lengths(e)  # the step stages them as they are now
        have = past.tolist()
        top = check_room(order, past, have, a, e.cfg.max_kv_cache_capacity, "the catch-up")
        s = self._stream(stream)
        taken, pages = self._pages(e, order, key, past, a, s, have, top)
        try:
            self._upload_embeds(x, s)
            staged = self._tree.round_past(have)  # the draft caches what it did at the round's levels: their constant
            placed = self._placed
            before, roots = self._catch_up.stage(e, acc, a, self._accepted_rows, past if staged is None else staged,
                                                 s, order if self._seqs.slotted else None, pages, placed=placed)
            e.executor.prepare(DECODE_PROFILE, self._catch_up_map, dims, s)
            try:
                self._run(e, s, before, rerun="the catch-up's engine ran after its features were put in order in "
                                              "place")
            except BaseException:
                if e.executor.enqueued >= len(before):  # the features were put in order in place: read them there
                    self._keep_accepted_rows(self._catch_up.in_order(acc, a))
                raise
        except BaseException:
            if taken is not None:
                taken.undo()
            raise
        if placed is not None and roots is not None:  # the layout wrote them on the device: the block holds them
            held = self._steps.catch_up_roots_held(roots)
            if held is not None:
                self._tree.roots_held(held)
        if whole:  # a view of the state's lengths (slots 0 .. b - 1)
            past += acc
            if roots is not None:
                self._roots.rows[:b] = roots
        else:
            e.state.lengths[order] = past + acc
            if roots is not None:
                self._roots.rows[order] = roots
        self._accepted = None
        self._start_round([p + n for p, n in zip(have, lens)])  # what its tree step left on the device
        return self.io.output_logits

    @one_thread
    def reset(self, stream: StreamLike = None) -> None:
        """Empty both KV states; the next step must be a base prefill. Also makes a broken setup
        (:attr:`is_broken`) usable again."""
        self._check_open()
        s = self._stream(stream)
        self._seqs.release_all()
        self.base.state.reset(s)
        self.draft.state.reset(s)
        self._prompt = None
        self._verified = self._accepted = None
        self._tree.start()
        self._phase = Phase.EMPTY
        self._repair()

    def memory_report(self, *, include_context_memory: bool = True) -> MemoryReport:
        """Every buffer the setup owns: the shared PipelineIO, both KV states, staging, RoPE tables and
        the shared context memory (and a hybrid base's intermediate states)."""
        report = self._report("create_for_spec_decode", include_context_memory)
        parts = self._features.reports()
        return MemoryReport.combine("create_for_spec_decode", [report, *parts]) if parts else report

    def __repr__(self) -> str:
        return f"SpecDecodeSetup({self.contract}, active={self._seqs.order_key})"


def create_for_spec_decode(base_engine: Any, draft_engine: Any, bundle: DeploymentConfig,
                           max_runtime_batch_size: int | None = None, stream: StreamLike = None, *,
                           graphs: bool = False, backend: Backend | str | None = None) -> SpecDecodeSetup:
    """Bind a base + draft pair to one shared PipelineIO (see :class:`SpecDecodeSetup`)."""
    return SpecDecodeSetup(base_engine, draft_engine, bundle, max_runtime_batch_size, stream, graphs=graphs,
                           backend=backend)
