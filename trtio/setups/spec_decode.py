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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._cache import BoundedCache
from trtio.config import DeploymentConfig
from trtio.cuda.backend import Backend
from trtio.dims import InferenceDims
from trtio.dtypes import DType
from trtio.engine import DECODE_PROFILE, ContextMemory, DeviceWork
from trtio.errors import ConfigError, InvalidTypeError, ShapeError, TrtioError
from trtio.memory import HOST_RING_SLOTS, Arena, HostStaging, MemoryReport, TensorRequest
from trtio.ops import warm_up
from trtio.pages import Prefix
from trtio.pipeline_io import PipelineIO
from trtio.setups.base import EngineGraphStats, SetupBase
from trtio.setups.binding import (
    BoundEngine,
    RopeTables,
    bind_engine,
    engine_backend,
    engine_io,
    fill_mrope,
    with_contract,
)
from trtio.setups.catch_up import CatchUp
from trtio.setups.drafting import DraftTree
from trtio.setups.sequences import Sequences
from trtio.setups.verify import AcceptedPaths, VerifyTree, VerifyTrees
from trtio.stream import Stream, StreamLike
from trtio.tensor import Tensor

__all__ = ["SpecDecodeSetup", "create_for_spec_decode"]


class SpecDecodeSetup(SetupBase):
    """A spec-decode base + draft sharing one PipelineIO (see module docstring).

    Lengths: ``base_lengths`` counts tokens the base has cached and committed; the draft's cache is
    committed up to the same length (its proposal entries past it are scratch, rewritten by
    :meth:`draft_accept`). The round's parts: :class:`~trtio.setups.drafting.DraftTree` (the draft tree and
    its levels), :class:`~trtio.setups.verify.VerifyTrees` and :class:`~trtio.setups.verify.AcceptedPaths`
    (verify and accept), :class:`~trtio.setups.catch_up.CatchUp` (the draft's catch-up).
    """

    def __init__(self, base_engine: Any, draft_engine: Any, bundle: DeploymentConfig,
                 max_runtime_batch_size: int | None = None, stream: StreamLike = None, *, graphs: bool = False,
                 backend: Backend | str | None = None) -> None:
        if not isinstance(bundle, DeploymentConfig):
            raise InvalidTypeError(f"create_for_spec_decode: bundle must be a DeploymentConfig, got "
                                   f"{type(bundle).__name__}")
        bundle.validate()
        if bundle.draft is None or bundle.spec is None:
            raise ConfigError("draft", "create_for_spec_decode needs a DeploymentConfig with a draft and a spec "
                                       "section")
        base_cfg = with_contract(bundle.base, engine_io(base_engine, "create_for_spec_decode (base)"),
                                 "base engine")
        draft_cfg = with_contract(bundle.draft, engine_io(draft_engine, "create_for_spec_decode (draft)"),
                                  "draft engine")
        if base_cfg.contract != draft_cfg.contract:
            raise ConfigError("contract", f"create_for_spec_decode: the base engine declares the "
                                          f"{base_cfg.contract!r} contract, the draft engine the "
                                          f"{draft_cfg.contract!r} one; both must speak the same")
        bundle = DeploymentConfig(base_cfg, draft_cfg, bundle.spec, dict(bundle.extra))
        spec = bundle.spec
        assert spec is not None
        be = engine_backend(base_engine, backend)
        self._backend = be
        self.bundle = bundle
        self.proposal_width = w = spec.drafting_step * spec.drafting_top_k  # the draft tree's width per round
        with self._building(stream) as (stack, s):
            self.io = io = stack.enter_context(
                PipelineIO.create_for_spec_decode(bundle, max_runtime_batch_size, s, backend=be))
            mb = io.max_batch
            self._rope = stack.enter_context(RopeTables(be))
            self._make_steps()
            self._context_memory = stack.enter_context(ContextMemory.for_engines([base_engine, draft_engine],
                                                                                 backend=be))
            self.base = bind_engine(base_engine, base_cfg, io.build_tensor_map(base_cfg), max_batch=mb, backend=be,
                                    context_memory=self._context_memory, graphs=graphs, rope=self._rope, stream=s,
                                    resources=stack, name="base", io=io)
            self.draft = bind_engine(draft_engine, draft_cfg, io.build_tensor_map_for_spec_decode_draft(draft_cfg),
                                     max_batch=mb, backend=be, context_memory=self._context_memory, graphs=graphs,
                                     rope=self._rope, stream=s, resources=stack, name="draft", io=io)
            rows = max(bundle.effective_max_draft_proposal_size(), 1)
            self._extra_arena = stack.enter_context(Arena([
                HostStaging.request("host_inputs_embeds", (mb, rows, base_cfg.hidden_size), base_cfg.activation),
                TensorRequest.of("draft_tree_words", (mb * w, max(1, -(-w // 32))), DType.INT32),
                TensorRequest.of("draft_tree_nodes", (mb * w, 2), DType.INT32)],
                backend=be, title="spec_decode staging"))
            self._embeds_staging = stack.enter_context(
                HostStaging(self._extra_arena["host_inputs_embeds"], io.inputs_embeds, be, slots=HOST_RING_SLOTS))
            self._tree = DraftTree(io, self._steps, self.draft, self._extra_arena["draft_tree_words"],
                                   self._extra_arena["draft_tree_nodes"], self._embeds_staging, be, width=w,
                                   base_width=spec.base_output_hidden_dim)
            fill_mrope(io, base_cfg, s)
            warm_up(be)
        self._trees = VerifyTrees()
        self._paths = AcceptedPaths(mb)
        # Accepted rows set aside per sequence: the longest path a round may accept.
        self._catch_up = CatchUp(io, self._steps, base_width=spec.base_output_hidden_dim,
                                 scratch_rows=bundle.effective_max_draft_proposal_size())
        # A speculative prefix keeps one entry fewer than asked: the draft's last one depends on the next token.
        self._seqs = Sequences([self.base, self.draft], mb, prefix_lag=1)
        self._batch_rows = np.arange(mb)[:, None]
        self._dims_cache: BoundedCache[tuple[Any, ...], InferenceDims] = BoundedCache()
        self._prompt: _Prompt | None = None  # a base prefill awaiting its draft prefill
        self._draft_ready = False  # the draft has caught up with the base: a round may start
        # Per slot: the draft_hidden_states_out row of its root hidden state (a step's output row, or one of the
        # rows past them where a root waits while other sequences are admitted).
        self._root_rows = np.zeros(mb, np.int64)
        self._root_base = io.draft_hidden_states_out.capacity // (
            spec.draft_hidden_size * io.draft_hidden_states_out.dtype.itemsize) - mb
        self._verified: VerifyTree | None = None  # the last verify tree
        self._accepted: np.ndarray | None = None  # path lengths accept() committed, awaiting draft_accept
        self._accepted_rows = np.zeros((0, 0), np.int64)  # their base hidden-state rows [batch, longest]
        self._accepted_list: list[int] = []  # the path lengths as ints

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
        if self._seqs.count == 0:
            raise TrtioError("run base_prefill() first: there is no sequence to continue")
        return self._seqs.count

    def _in_round(self) -> bool:
        return self._tree.nodes > 0 or self._verified is not None or self._accepted is not None

    def _between_rounds(self, what: str) -> None:
        if self._prompt is not None:
            raise TrtioError(f"{what}: slots {list(self._prompt.rows.tolist())} await their draft_prefill(); call it "
                             f"first")
        if self._in_round():
            raise TrtioError(f"{what}: a speculative round is under way (draft_propose .. draft_accept); call it "
                             f"between rounds, after draft_accept()")

    # -- prefill ----------------------------------------------------------------------------------
    def base_prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None, *,
                     slots: Sequence[int] | None = None, prefix: Prefix | Sequence[Prefix | None] | None = None,
                     past_lengths: Any = None, deepstack_embeds: Sequence[Any] | None = None) -> Tensor:
        """Base over the prompts (profile 0, causal); returns logits [batch, vocab] of each last prompt token.

        The base's ``hidden_states`` land in ``io.base_hidden_states`` (a row per token), which the draft
        prefill reads as ``hidden_states_input`` at the same address. Without ``deepstack_embeds`` the
        deepstack inputs are zero. ``slots``, ``prefix`` and ``past_lengths`` as for
        :meth:`LLMSetup.prefill <trtio.setups.llm.LLMSetup.prefill>` (a prefix pins both engines' pools);
        admitting sequences (``slots=``) is allowed between rounds, and they join the next round after their
        :meth:`draft_prefill`. ``slots=None`` restarts the batch.
        """
        self._check_usable()
        e = self.base
        x, b, seq = self._embeds(inputs_embeds, e.cfg.hidden_size, stream)
        if not 1 <= b <= self.io.max_batch:
            raise ShapeError(f"inputs_embeds: batch {b} is outside 1..{self.io.max_batch}")
        ctx = self._check_lengths(context_lengths, b, seq, "context_lengths")
        if slots is not None:
            self._between_rounds("base_prefill(slots=...)")
        rows, prefixes, past = self._prompt_slots(e, slots, prefix, past_lengths, b, ctx, "base_prefill")
        dims = self._prefill_dims(e, b, seq, past)
        features = self._check_deepstack(e, deepstack_embeds, b, seq, stream)
        s = self._stream(stream)
        with self._seqs.transaction():
            plans = self._prompt_pages([e], rows, past, ctx, prefixes, restart=slots is None)
            self._upload_embeds(x, s)
            before = self._stage_prompt(e, rows, past, ctx, seq, plans, s)
            self._bind_deepstack(e, features, b, seq, s)
            self._run_prefill(e, dims, ctx, s, past, before, rows)
        self._prompt = _Prompt(seq, ctx, past, rows, prefixes)
        self._draft_ready = False
        self._verified = self._accepted = None
        self._tree.start()
        return self.io.output_logits

    def draft_prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None, *,
                      slots: Sequence[int] | None = None,
                      prefix: Prefix | Sequence[Prefix | None] | None = None) -> Tensor:
        """Draft over the prompts shifted by one token (EAGLE): row p holds the embedding of token p+1,
        ``hidden_states_input`` is the base prefill's hidden states (no copy), ``hidden_states_from_draft``
        is zero. Takes the base prefill's batch, width, lengths, slots and prefixes (``slots`` and ``prefix``,
        where given, must be the base prefill's). Returns the draft logits [batch, draft vocab] at each
        sequence's last row."""
        self._check_usable()
        self._need_batch()
        pending = self._prompt
        if pending is None:
            raise TrtioError("draft_prefill() follows base_prefill(); after a verify round use draft_accept()")
        e = self.draft
        b0, width, rows = pending.rows.shape[0], pending.width, pending.rows
        x, b, seq = self._embeds(inputs_embeds, e.cfg.hidden_size, stream)
        if (b, seq) != (b0, width):
            raise ShapeError(f"inputs_embeds: the draft prefill takes the base prefill's shape [batch={b0}, "
                             f"seq={width}, hidden], got {list(x.shape)}")
        ctx = self._check_lengths(context_lengths, b, seq, "context_lengths")
        if not np.array_equal(ctx, pending.lengths):
            raise ShapeError(f"context_lengths {ctx.tolist()} differ from the base prefill's "
                             f"{pending.lengths.tolist()}: the draft reads the base's hidden states row for row")
        if slots is not None and list(slots) != rows.tolist():
            raise ShapeError(f"draft_prefill: slots {list(slots)} differ from the base prefill's {rows.tolist()}")
        if prefix is not None and (pending.prefixes is None or
                                   (list(prefix) if not isinstance(prefix, Prefix) else [prefix] * b)
                                   != pending.prefixes):
            raise ShapeError("draft_prefill: prefix differs from the base prefill's")
        past = pending.past
        if past is not None and (e.state.lengths[rows] < past).any():
            i = int(np.flatnonzero(e.state.lengths[rows] < past)[0])
            raise TrtioError(f"draft_prefill: the base prefill continued slot {int(rows[i])} after {int(past[i])} "
                             f"tokens but the draft has cached only {int(e.state.lengths[rows[i]])}; catch the "
                             f"draft up first")
        dims = self._prefill_dims(e, b, seq, past)
        seqs = self._seqs
        s = self._stream(stream)
        roots = self._root_rows.copy()  # _save_roots moves some; a prefill that fails moves them back
        with seqs.transaction(), _restored(self._root_rows, roots):
            plans = []
            if seqs.slotted:
                start = np.zeros(b, np.int64) if past is None else past
                plan = seqs.plan(e.role, rows.tolist(), start.tolist(), (start + ctx).tolist())
                plan.commit()
                plans.append(plan)
            self._upload_embeds(x, s)
            saved = self._save_roots(rows, s)
            before = saved + self._stage_prompt(e, rows, past, ctx, seq, plans, s)
            self.io.draft_hidden_states_in.reshape((b * seq, e.cfg.hidden_size)).zero_(s)
            self._run_prefill(e, dims, ctx, s, past, before, rows)
        self._prompt = None
        # The root's hidden state: the draft output row of each sequence's last token.
        self._root_rows[rows] = self._steps.prompt_roots(b, seq, ctx)
        self._start_round()
        return self.io.output_logits

    def _save_roots(self, rows: np.ndarray, s: Stream) -> tuple[DeviceWork, ...]:
        """Before a draft prefill admits ``rows``, the roots of the other active sequences that still sit in
        the draft's output rows move to their slots' rows past them (the prefill writes those output rows)."""
        keep = [slot for slot in self._seqs.order.tolist()
                if slot not in set(rows.tolist()) and self._root_rows[slot] < self._root_base]
        if not keep:
            return ()
        io, step = self.io, self._steps.step
        dst = np.array(keep, np.int64) + self._root_base
        step.write("row_src", self._root_rows[keep].astype(np.int32))
        step.write("row_dst", dst.astype(np.int32))
        self._root_rows[keep] = dst
        row_bytes = self.draft.cfg.hidden_size * io.draft_hidden_states_out.dtype.itemsize
        return (self._steps.row_copy(io.draft_hidden_states_out, io.draft_hidden_states_out, io.row_src, len(keep),
                                     row_bytes, io.row_dst),)

    def _start_round(self) -> None:
        self._tree.start()
        self._draft_ready = True

    # -- drafting ---------------------------------------------------------------------------------
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
        b = self._need_batch()
        if not self._draft_ready:
            raise TrtioError("draft_propose() needs the draft caught up with the base: call draft_prefill() after "
                             "base_prefill(), or draft_accept() after accept()")
        e = self.draft
        x, nb, k = self._embeds(inputs_embeds, e.cfg.hidden_size, stream)
        if nb != b:
            raise ShapeError(f"inputs_embeds: batch {nb} differs from the prefill's batch {b}")
        tree = self._tree
        par = tree.check(self._host_input(parents, "parents"), b, k)
        order, key, past, _whole = self._step_lengths(e)
        cap, w = e.cfg.max_kv_cache_capacity, tree.width
        if tree.nodes == 0 and int(past.max()) + w > cap:  # a round's levels all write after the lengths it started at
            i = int(np.argmax(past))
            raise ShapeError(f"draft KV cache full: sequence {int(order[i])} holds {int(past[i])} tokens and a "
                             f"proposal round writes {w} more, past max_kv_cache_capacity ({cap})")
        dims = self._dims(e, "proposal", b, w, k)
        # Everything is checked: from here on pages are taken (a round's first level) and work is enqueued.
        s = self._stream(stream)
        taken, pages = self._pages(e, order, key, past, w if tree.nodes == 0 else 0, s)
        try:
            before = tree.propose(x, par, past, self._root_rows[order], s, order if self._seqs.slotted else None,
                                  pages)
            e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
            self._run(e, s, before, rerun="the proposal's engine ran and overwrote the draft hidden states a retry "
                                          "reads (the root's, or the previous level's)")
        except BaseException:
            if taken is not None:
                taken.undo()
            raise
        tree.grow()
        return self.io.output_logits

    # -- verify and accept --------------------------------------------------------------------------
    def verify(self, inputs_embeds: Any, tree: Any, stream: StreamLike = None) -> Tensor:
        """Base over a token tree per sequence; returns logits [batch * N, vocab] for every node.

        ``tree`` is a parent list ([N] shared by the batch, or [batch, N]; -1 for the root) or an unpacked
        mask [batch, N, N] (node t sees node i; a sequence's padding nodes are all-zero rows after its real
        ones). Node 0 is the root (the pending token). Nodes go to cache slots ``length + t``; positions are
        length + depth. The base cache is not committed until :meth:`accept`.
        """
        self._check_usable()
        b = self._need_batch()
        e = self.base
        t = self._trees.get(tree if type(tree) is list else self._host_input(tree, "tree"), b)
        n = t.nodes
        x, nb, ns = self._embeds(inputs_embeds, e.cfg.hidden_size, stream)
        if (nb, ns) != (b, n):
            raise ShapeError(f"inputs_embeds: verify of {n} nodes takes [batch={b}, {n}, hidden], "
                             f"got {list(x.shape)}")
        dims = self._dims(e, "verify", b, n)  # the tree size against max_verify_tree_size
        order, key, lengths, _whole = self._step_lengths(e)
        if max(lengths.tolist()) + n > e.cfg.max_kv_cache_capacity:
            i = int(np.argmax(lengths))
            raise ShapeError(f"verify: {n} nodes do not fit after the {int(lengths[i])} tokens sequence "
                             f"{int(order[i])} has cached (max_kv_cache_capacity {e.cfg.max_kv_cache_capacity})")
        s = self._stream(stream)
        taken, pages = self._pages(e, order, key, lengths, n, s)
        try:
            self._upload_embeds(x, s)
            before = self._steps.tree(e, t.layout, lengths, t.select, s, order if self._seqs.slotted else None, pages)
            e.tensor_map.use_deepstack_zero()
            e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
            e.executor.execute(s, before=before)
        except BaseException:
            if taken is not None:
                taken.undo()
            raise
        self._verified = t
        self._accepted = None
        self._draft_ready = False
        return self.io.output_logits

    def accept(self, paths: Sequence[Sequence[int]] | np.ndarray, stream: StreamLike = None) -> None:
        """Commit each sequence's accepted root-to-node path of the last verify tree.

        ``paths[b]`` starts at the root 0 and follows the verified tree (each node a child of the one
        before); ``paths`` may also be an int array [batch, L] padded with trailing -1. The path's KV
        entries are compacted to consecutive slots after the committed length (every layer, K and V), its
        base hidden-state rows are set aside for :meth:`draft_accept`, and the base lengths grow by the
        path length.
        """
        self._check_usable()
        b = self._need_batch()
        tree = self._verified
        if tree is None:
            raise TrtioError("accept() needs a verify() whose tree it accepts from (none since the last accept)")
        given = paths if type(paths) is list else self._host_input(paths, "paths")
        order, _key, lengths, whole = self._step_lengths(self.base)
        state = self.base.state
        walked = self._paths.walk(given, b, tree, lengths.tolist())  # a runtime's lists: laid out in one walk
        if walked is None:
            grid, acc = self._paths.read(given, b, tree)  # anything else: checked (or refused), then laid out
        s = self._stream(stream)
        if walked is not None:
            moves, acc, rows = walked
            state.commit_rows(moves, s)
        else:
            state.commit_grid(lengths, grid, acc, s)
            # The paths' base hidden-state rows, for draft_accept (-1 past each path's end).
            rows = self._batch_rows[:b] * tree.nodes + grid
            if int(acc.min()) != grid.shape[1]:
                rows = np.where(grid >= 0, rows, -1)
        if whole:
            lengths += acc
        else:
            state.lengths[order] += acc
        self._accepted_rows = rows
        self._accepted = acc
        self._accepted_list = acc.tolist()
        self._verified = None

    def draft_accept(self, inputs_embeds: Any, accept_lengths: Any, stream: StreamLike = None) -> Tensor:
        """The draft's catch-up over the accepted tokens (shifted by one, as in the prefill): row t of
        sequence b holds the embedding of the token after accepted node t; ``accept_lengths`` are the path
        lengths :meth:`accept` committed. ``hidden_states_input`` rows are the accepted nodes' base hidden
        states. Starts at the draft's committed length; returns draft logits [batch, draft vocab] at each
        sequence's last accepted row."""
        self._check_usable()
        b = self._need_batch()
        if self._accepted is None:
            raise TrtioError("draft_accept() follows accept(): there are no accepted tokens to catch up on")
        e = self.draft
        x, nb, a = self._embeds(inputs_embeds, e.cfg.hidden_size, stream)
        if nb != b:
            raise ShapeError(f"inputs_embeds: batch {nb} differs from {b}")
        acc, lens = self._accepted, self._accepted_list
        given = accept_lengths
        # What a runtime passes: the lengths accept() committed, as ints (else read as an array and compared).
        same = type(given) is list and given == lens and all(type(v) is int for v in given)
        if not same:
            given = np.asarray(self._host_input(given, "accept_lengths"))
            same = given.shape == (b,) and given.dtype.kind in "iu" and given.tolist() == lens
        if not same:
            checked = self._check_lengths(accept_lengths, b, a, "accept_lengths")
            raise ShapeError(f"accept_lengths {checked.tolist()} differ from the path lengths accept() committed "
                             f"{lens}")
        if max(lens) > a:  # as _check_lengths words it: the catch-up is narrower than a path
            i = lens.index(max(lens))
            raise ShapeError(f"accept_lengths[{i}] = {lens[i]} is outside 1..{a}")
        dims = self._dims(e, "accept", b, a)
        order, key, lengths, whole = self._step_lengths(e)
        past = lengths.copy()
        if max(past.tolist()) + a > e.cfg.max_kv_cache_capacity:
            i = int(np.argmax(past))
            raise ShapeError(f"draft KV cache full: sequence {int(order[i])} holds {int(past[i])} tokens, {a} more "
                             f"pass max_kv_cache_capacity ({e.cfg.max_kv_cache_capacity})")
        s = self._stream(stream)
        taken, pages = self._pages(e, order, key, past, a, s)
        try:
            self._upload_embeds(x, s)
            before = self._catch_up.stage(e, acc, a, self._accepted_rows, past, s,
                                          order if self._seqs.slotted else None, pages)
            e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
            try:
                self._run(e, s, before, rerun="the catch-up's engine ran after its features were put in order in "
                                              "place")
            except BaseException:
                if e.executor.enqueued >= len(before):  # the features were put in order in place: read them there
                    self._accepted_rows = self._catch_up.in_order(acc, a)
                raise
        except BaseException:
            if taken is not None:
                taken.undo()
            raise
        if whole:
            np.add(past, acc, out=lengths)
        else:
            e.state.lengths[order] = past + acc
        roots = self._steps.catch_up_roots(b, a, acc)
        if roots is not None:
            self._root_rows[order] = roots
        self._accepted = None
        self._start_round()
        return self.io.output_logits

    def _dims(self, e: BoundEngine, kind: str, *args: int) -> InferenceDims:
        """A step's dims from the config's recipe, remembered per shape (a recipe checks and builds them)."""
        key = (e.role, kind, *args)
        dims = self._dims_cache.get(key)
        if dims is None:
            recipes: dict[str, Callable[..., InferenceDims]] = {
                "proposal": e.cfg.proposal_dims, "verify": e.cfg.spec_verify_dims, "accept": e.cfg.accept_dims}
            dims = self._dims_cache.put(key, recipes[kind](*args))
        return dims

    def reset(self, stream: StreamLike = None) -> None:
        """Empty both KV states; the next step must be a base prefill. Also makes a broken setup
        (:attr:`is_broken`) usable again."""
        self._check_open()
        s = self._stream(stream)
        self._seqs.release_all()
        self.base.state.reset(s)
        self.draft.state.reset(s)
        self._prompt = None
        self._draft_ready = False
        self._verified = self._accepted = None
        self._tree.start()
        self._repair()

    def memory_report(self, *, include_context_memory: bool = True) -> MemoryReport:
        """Every buffer the setup owns: the shared PipelineIO, both KV states, staging, RoPE tables and
        the shared context memory."""
        return self._report("create_for_spec_decode", include_context_memory)

    def __repr__(self) -> str:
        return f"SpecDecodeSetup({self.contract}, active={self._seqs.order_key})"


@contextlib.contextmanager
def _restored(target: np.ndarray, saved: np.ndarray) -> Iterator[None]:
    """``target`` gets the values ``saved`` back if the block raises."""
    try:
        yield
    except BaseException:
        target[:] = saved
        raise


@dataclass(frozen=True)
class _Prompt:
    """A base prefill awaiting its draft prefill: its width, lengths, cached lengths before it, slots and
    prefixes."""

    width: int
    lengths: np.ndarray
    past: np.ndarray | None
    rows: np.ndarray
    prefixes: list[Prefix | None] | None


def create_for_spec_decode(base_engine: Any, draft_engine: Any, bundle: DeploymentConfig,
                           max_runtime_batch_size: int | None = None, stream: StreamLike = None, *,
                           graphs: bool = False, backend: Backend | str | None = None) -> SpecDecodeSetup:
    """Bind a base + draft pair to one shared PipelineIO (see :class:`SpecDecodeSetup`)."""
    return SpecDecodeSetup(base_engine, draft_engine, bundle, max_runtime_batch_size, stream, graphs=graphs,
                           backend=backend)
