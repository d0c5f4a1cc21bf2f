"""create_for_spec_decode: an EAGLE-style base + draft pair sharing one PipelineIO, and its step protocol.

The two engines share one PipelineIO and one context memory, each with its own tensor map and KV
state. A round (Edge-LLM's ``eagleDecoder`` phases, notes §9):

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

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio.config import DeploymentConfig, LLMEngineConfig
from trtio.contracts.ragged import (
    PHASE_DECODE,
    PHASE_DRAFT,
    PHASE_PREFILL,
    PHASE_VERIFY,
    TreeLayout,
    causal_step,
    pack_rows,
    ramp,
)
from trtio.cuda.backend import Backend, Location
from trtio.dims import InferenceDims
from trtio.dtypes import DType
from trtio.engine import DECODE_PROFILE, ContextMemory, DeviceWork, GraphStats
from trtio.errors import ShapeError, TrtioError
from trtio.memory import Arena, HostStaging, MemoryReport, TensorRequest
from trtio.ops import Copy2D, DraftLevel, DraftTree, TreeStep, TreeTargets, Zero, fuse, warm_up
from trtio.pipeline_io import PipelineIO
from trtio.setups.base import (
    BoundEngine,
    SetupBase,
    _engine_io,
    _fill_mrope,
    _RopeTables,
    bind_engine,
    engine_backend,
    remember,
    with_contract,
)
from trtio.staging import constant
from trtio.state import MAX_PATH_MOVES, path_grid
from trtio.stream import Stream, StreamLike
from trtio.tensor import Tensor
from trtio.trees import ancestor_mask, validate_tree_mask

__all__ = ["SpecDecodeSetup", "create_for_spec_decode"]

_MAX_LEVEL_COPIES = 32  # embedding copies a setup captures in level graphs (each address pair: one more graph)
_PYTHON_PATH_NODES = 512  # accepted paths of at most this many nodes in all are checked in Python (faster there)
_STABLE_ROUNDS = 1  # rounds in a row a level's embeddings came from one address before its graph copies them


class SpecDecodeSetup(SetupBase):
    """A spec-decode base + draft sharing one PipelineIO (see module docstring).

    Lengths: ``base_lengths`` counts tokens the base has cached and committed; the draft's cache is
    committed up to the same length (its proposal entries past it are scratch, rewritten by
    :meth:`draft_accept`).
    """

    def __init__(self, base_engine: Any, draft_engine: Any, bundle: DeploymentConfig,
                 max_runtime_batch_size: int | None = None, stream: StreamLike = None, *, graphs: bool = False,
                 backend: Backend | str | None = None) -> None:
        if not isinstance(bundle, DeploymentConfig):
            raise TypeError(f"create_for_spec_decode: bundle must be a DeploymentConfig, got {type(bundle).__name__}")
        bundle.validate()
        if bundle.draft is None or bundle.spec is None:
            raise TrtioError("create_for_spec_decode needs a DeploymentConfig with a draft and a spec section")
        base_cfg = with_contract(bundle.base, _engine_io(base_engine, "create_for_spec_decode (base)"),
                                 "base engine")
        draft_cfg = with_contract(bundle.draft, _engine_io(draft_engine, "create_for_spec_decode (draft)"),
                                  "draft engine")
        if base_cfg.contract != draft_cfg.contract:
            raise TrtioError(f"create_for_spec_decode: the base engine declares the {base_cfg.contract!r} contract, "
                             f"the draft engine the {draft_cfg.contract!r} one; both must speak the same")
        bundle = DeploymentConfig(base_cfg, draft_cfg, bundle.spec, dict(bundle.extra))
        spec = bundle.spec
        assert spec is not None
        be = engine_backend(base_engine, backend)
        self._backend = be
        self.bundle = bundle
        self.contract = base_cfg.contract or "batch"
        with self._building(stream) as (stack, s):
            self.io = io = stack.enter_context(
                PipelineIO.create_for_spec_decode(bundle, max_runtime_batch_size, s, backend=be))
            mb = io.max_batch
            self._rope = stack.enter_context(_RopeTables(be))
            self._context_memory = stack.enter_context(ContextMemory.for_engines([base_engine, draft_engine],
                                                                                 backend=be))
            self.base = bind_engine(base_engine, base_cfg, io.build_tensor_map(base_cfg), max_batch=mb, backend=be,
                                    context_memory=self._context_memory, graphs=graphs, rope=self._rope, stream=s,
                                    resources=stack, name="base")
            self.draft = bind_engine(draft_engine, draft_cfg, io.build_tensor_map_for_spec_decode_draft(draft_cfg),
                                     max_batch=mb, backend=be, context_memory=self._context_memory, graphs=graphs,
                                     rope=self._rope, stream=s, resources=stack, name="draft")
            self.proposal_width = spec.drafting_step * spec.drafting_top_k  # the draft tree's width per round
            self._base_width = spec.base_output_hidden_dim
            self._scratch_rows = bundle.effective_max_draft_proposal_size()  # accepted rows set aside per sequence
            step = max(bundle.effective_max_draft_proposal_size(), 1)
            w = self.proposal_width
            n_words = max(1, -(-w // 32))
            self._extra_arena = stack.enter_context(Arena([
                TensorRequest.of("host_inputs_embeds", (mb, step, base_cfg.hidden_size), base_cfg.activation,
                                 Location.PINNED),
                TensorRequest.of("draft_tree_words", (mb * w, n_words), DType.INT32),
                TensorRequest.of("draft_tree_nodes", (mb * w, 2), DType.INT32)],
                backend=be, title="spec_decode staging"))
            self._device_tree = self._make_device_tree(draft_cfg, n_words)
            self._embeds_staging = stack.enter_context(
                HostStaging(self._extra_arena["host_inputs_embeds"], io.inputs_embeds, be))
            _fill_mrope(io, base_cfg, s)
            warm_up(be)
        w = self.proposal_width
        self._batch: int | None = None
        self._prompt: tuple[int, np.ndarray] | None = None  # the base prefill's (width, lengths)
        self._draft_ready = False  # the draft has caught up with the base: a round may start
        self._root_rows = np.zeros(mb, np.int64)  # draft_hidden_states_out row of each sequence's root hidden
        self._tree_n = 0  # draft-tree nodes run this round (per sequence)
        self._tree_parents: list[np.ndarray] = []  # each level's parents this round, as given ([k] or [b, k])
        self._path_ids = np.arange(MAX_PATH_MOVES + 1)
        self._batch_rows = np.arange(mb)[:, None]
        self._draft_levels: dict[tuple[int, ...], tuple[DeviceWork, ...]] = {}
        # Each level's last embeddings copy (its addresses) and the rounds in a row it was the same.
        self._level_sources: dict[int, tuple[tuple[int, ...], int]] = {}
        self._level_copies: dict[tuple[int, ...], Copy2D] = {}  # the copies made part of a level's graph
        self._fused_works: dict[tuple[Any, ...], tuple[DeviceWork, ...]] = {}  # step works in the fewest kernels
        self._round_lengths = (np.zeros(0, np.int32), np.zeros(0, np.int32))
        self._dims_cache: dict[tuple[Any, ...], InferenceDims] = {}
        self._trees: dict[Any, _Tree] = {}  # verify trees seen (a runtime's tree shape repeats)
        self._catch_up: dict[Any, _CatchUp] = {}
        self._catch_up_moves: dict[tuple[int, int], tuple[DeviceWork, ...]] = {}
        self._level_moves: dict[tuple[int, int], DeviceWork] = {}
        self._tree_steps: dict[tuple[Any, ...], tuple[DeviceWork, ...]] = {}
        self._targets: dict[str, TreeTargets] = {}
        self._zeros: dict[tuple[int, int], Zero] = {}
        self._level = (0, 0)  # (first node, count) of the newest level: the rows the last proposal output
        self._round_embeds = np.zeros((mb, w, base_cfg.hidden_size), base_cfg.activation.storage_numpy)
        self._verified: _Tree | None = None  # the last verify tree
        self._accepted: np.ndarray | None = None  # path lengths accept() committed, awaiting draft_accept
        self._accepted_rows = np.zeros((0, 0), np.int64)  # their base hidden-state rows [batch, longest]

    def _make_device_tree(self, cfg: LLMEngineConfig, n_words: int) -> DraftTree:
        """The draft tree's device state and the step inputs its levels read and write: the ragged step
        block's, or the batch contract's tree buffers, start index and token selection."""
        assert self.io.step is not None
        t, a, w = self.io.step.tensors, self._extra_arena, self.proposal_width
        if self.contract != "ragged":
            return DraftTree(a["draft_tree_words"], a["draft_tree_nodes"], t["draft_parents"], t["tree_past"],
                             t["row_src"], t["row_dst"], self.io.select_token_indices, self.io.packed_attention_mask,
                             self.io.spec_decode_position_ids, w, n_words, logits_stride=0, roots=t["draft_roots"],
                             start=self.draft.state.kv_lengths, ctx=self.io.context_lengths)
        per_slot = cfg.is_mrope
        return DraftTree(a["draft_tree_words"], a["draft_tree_nodes"], t["draft_parents"], t["past_lengths"],
                         t["row_src"], t["row_dst"], t["logits_indices"], t["packed_attention_mask"],
                         t["spec_decode_position_ids"], w, n_words, logits_stride=w, query_lengths=t["query_lengths"],
                         positions=t["positions"], parent_ids=t["spec_tree_parent_ids"],
                         depths=t["spec_tree_depths"], rope_rows=t["rope_rows"] if per_slot else None,
                         rope_cap=cfg.max_kv_cache_capacity if per_slot else 0)

    def engines(self) -> list[BoundEngine]:
        return [self.base, self.draft]

    # -- public views ---------------------------------------------------------------------------
    @property
    def base_lengths(self) -> np.ndarray:
        b = self._batch or 0
        return self.base.state.lengths[:b].copy()

    @property
    def draft_lengths(self) -> np.ndarray:
        """Tokens the draft has committed per sequence (equal to ``base_lengths`` between rounds)."""
        b = self._batch or 0
        return self.draft.state.lengths[:b].copy()

    @property
    def draft_tree(self) -> np.ndarray:
        """The parents (-1: the root) of the draft-tree nodes proposed this round, [batch, nodes]."""
        b = self._batch or 0
        levels = [np.broadcast_to(p, (b, p.shape[-1])) for p in self._tree_parents] if self._tree_n else []
        return np.concatenate(levels, axis=1).astype(np.int64) if levels else np.zeros((b, 0), np.int64)

    @property
    def graph_stats(self) -> dict[str, GraphStats]:
        return {"base": self.base.executor.graph_stats, "draft": self.draft.executor.graph_stats}

    @property
    def batch(self) -> int | None:
        return self._batch

    def _need_batch(self) -> int:
        if self._batch is None:
            raise TrtioError("run base_prefill() first: there is no sequence to continue")
        return self._batch

    # -- prefill ----------------------------------------------------------------------------------
    def base_prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None, *,
                     deepstack_embeds: Sequence[Any] | None = None) -> Tensor:
        """Base over the prompts (profile 0, causal); returns logits [batch, vocab] of each last prompt token.

        The base's ``hidden_states`` land in ``io.base_hidden_states`` (a row per token), which the draft
        prefill reads as ``hidden_states_input`` at the same address. Without ``deepstack_embeds`` the
        deepstack inputs are zero.
        """
        self._check_open()
        e = self.base
        x, b, seq, ctx, dims = self._check_prompt(e, inputs_embeds, context_lengths)
        features = self._check_deepstack(e, deepstack_embeds, b, seq)
        s = self._stream(stream)
        before = self._stage_prompt(e, x, ctx, s)
        self._bind_deepstack(e, features, b, seq, s)
        self._run_prefill(e, dims, ctx, s, before=before)
        self._batch = b
        self._prompt = (seq, ctx)
        self._draft_ready = False
        self._verified = self._accepted = None
        self._tree_n = 0
        return self.io.output_logits

    def draft_prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None) -> Tensor:
        """Draft over the prompts shifted by one token (EAGLE): row p holds the embedding of token p+1,
        ``hidden_states_input`` is the base prefill's hidden states (no copy), ``hidden_states_from_draft``
        is zero. Takes the base prefill's batch, width and lengths. Returns the draft logits
        [batch, draft vocab] at each sequence's last row."""
        self._check_open()
        b0 = self._need_batch()
        if self._prompt is None:
            raise TrtioError("draft_prefill() follows base_prefill(); after a verify round use draft_accept()")
        width, lengths = self._prompt
        e = self.draft
        x, b, seq, ctx, dims = self._check_prompt(e, inputs_embeds, context_lengths)
        if (b, seq) != (b0, width):
            raise ShapeError(f"inputs_embeds: the draft prefill takes the base prefill's shape [batch={b0}, "
                             f"seq={width}, hidden], got {list(x.shape)}")
        if not np.array_equal(ctx, lengths):
            raise ShapeError(f"context_lengths {ctx.tolist()} differ from the base prefill's {lengths.tolist()}: "
                             f"the draft reads the base's hidden states row for row")
        s = self._stream(stream)
        before = self._stage_prompt(e, x, ctx, s)
        self.io.draft_hidden_states_in.reshape((b * seq, e.cfg.hidden_size)).zero_(s)
        self._run_prefill(e, dims, ctx, s, before=before)
        self._prompt = None
        # The root's hidden state: the draft output row of each sequence's last token.
        self._root_rows[:b] = np.arange(b) if self.contract == "ragged" else np.arange(b) * seq + ctx - 1
        self._start_round()
        return self.io.output_logits

    def _check_prompt(self, e: BoundEngine, inputs_embeds: Any,
                      context_lengths: Any) -> tuple[Any, int, int, np.ndarray, InferenceDims]:
        x, b, seq = self._embeds(inputs_embeds, e.cfg.hidden_size)
        if not 1 <= b <= self.io.max_batch:
            raise ShapeError(f"inputs_embeds: batch {b} is outside 1..{self.io.max_batch}")
        ctx = self._check_lengths(context_lengths, b, seq, "context_lengths")
        return x, b, seq, ctx, self._prefill_dims(e, b, seq, None)

    def _stage_prompt(self, e: BoundEngine, x: Any, ctx: np.ndarray, s: Stream) -> tuple[DeviceWork, ...]:
        """Stage a prompt's inputs; returns the device work to run before the engine."""
        b, seq = int(x.shape[0]), int(x.shape[1])
        self._upload_embeds(x, s)
        if self.contract == "ragged":
            return (self._stage_layout(e, causal_step(np.zeros(b, np.int64), ctx, seq, phase=PHASE_PREFILL), s),)
        else:
            self.io.upload_context_lengths(ctx, s)
            self.io.upload_select_token_indices((ctx - 1)[:, None], s)
            e.state.upload_start_index(None if e.empty_start_ok else np.zeros(b, np.int32), s)
            return ()

    def _start_round(self) -> None:
        self._tree_n = 0
        self._tree_parents.clear()
        self._level = (0, 0)
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
        self._check_open()
        b = self._need_batch()
        if not self._draft_ready:
            raise TrtioError("draft_propose() needs the draft caught up with the base: call draft_prefill() after "
                             "base_prefill(), or draft_accept() after accept()")
        e = self.draft
        x, nb, k = self._embeds(inputs_embeds, e.cfg.hidden_size)
        if nb != b:
            raise ShapeError(f"inputs_embeds: batch {nb} differs from the prefill's batch {b}")
        n0, w = self._tree_n, self.proposal_width
        par = self._check_parents(parents, b, k)
        if n0 + k > w:
            raise ShapeError(f"draft_propose: {k} more nodes make {n0 + k}, more than the {w} a round's draft tree "
                             f"holds (drafting_step x drafting_top_k = {w})")
        past = e.state.lengths[:b]
        cap = e.cfg.max_kv_cache_capacity
        if n0 == 0 and int(past.max()) + w > cap:  # a round's levels all write after the lengths it started at
            i = int(np.argmax(past))
            raise ShapeError(f"draft KV cache full: sequence {i} holds {int(past[i])} tokens and a proposal round "
                             f"writes {w} more, past max_kv_cache_capacity ({cap})")
        dims = self._dims(e, "proposal", b, w, k)
        # Everything is checked: from here on work is enqueued.
        s = self._stream(stream)
        self._tree_parents.append(par.copy())  # the caller's array may change after the call
        embeds = self._stage_tree_embeds(x, b, n0, k, s)
        # A new round: no base features in proposals, and no stale draft rows.
        zeros = self._round_zeros(b, w) if n0 == 0 else ()
        move = self._level_moves.get((b, k))
        if move is None:  # each new node's draft input: its parent's draft hidden state (the root's: the catch-up's)
            io = self.io
            move = self._level_moves[(b, k)] = self._row_copy(
                io.draft_hidden_states_in, io.draft_hidden_states_out, io.row_src, b * k,
                e.cfg.hidden_size * io.draft_hidden_states_out.dtype.itemsize, io.row_dst)
        level = self._draft_level(e, past, par, b, n0, k, s)
        e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s, before=self._fused(embeds, zeros, level, move))
        self._tree_n = n0 + k
        self._level = (n0, k)
        return self.io.output_logits

    def _draft_level(self, e: BoundEngine, past: np.ndarray, par: np.ndarray, b: int, n0: int, k: int,
                     s: Stream) -> tuple[DeviceWork, ...]:
        """A proposal level (ragged phase 4; 3 for a one-node tree): the parents are uploaded with the round's
        lengths (sent once a round; the batch contract's root rows too) and the device grows its
        copy of the tree and lays out the step (:class:`~trtio.ops.DraftLevel`); on the ragged contract the
        RoPE rows are then gathered at the nodes' positions."""
        step = self.io.step
        assert step is not None
        w, ragged = self.proposal_width, self.contract == "ragged"
        if n0 == 0:  # a new round: the lengths are fixed for all its levels
            past32 = constant(past.astype(np.int32))
            self._round_lengths = (past32, constant(past32 + np.int32(w)))
            if not ragged:
                step.write("draft_roots", self._root_rows[:b])
        past32, asl = self._round_lengths
        if ragged:
            step.write("query_start_offsets", ramp(b + 1, w))
            step.write("past_lengths", past32)
            step.write("attention_sequence_lengths", asl)
            step.write("state_indices", ramp(b))
        else:  # the device writes the start index and context lengths from these
            step.write("tree_past", past32)
        step.write("draft_parents", par)  # checked to lie in -1 .. w - 1: stored as int32
        step.upload(s)
        if n0 == 0:  # the levels rewrite these on the device; only verify and catch-ups write them between rounds
            step.overwritten(DraftTree.WRITES)
        # A parent's draft hidden row: the previous level's rows (ragged), or its node's row (batch).
        level0, level_k = ((0, 0) if n0 == 0 else self._level) if ragged else (0, w)
        shared = par.ndim == 1
        key = (b, n0, k, level0, level_k, shared)
        found = self._draft_levels.get(key)
        if found is None:
            work: tuple[DeviceWork, ...] = (DraftLevel(self._device_tree, b, n0, k, level0, level_k, shared),)
            if ragged:
                tree = self._device_tree
                table, _per_slot = self._rope_rows_source(e, s)
                rows = tree.rope_rows if tree.rope_rows is not None else tree.positions
                assert rows is not None
                work += (self._row_copy(self.io.ragged_rope_cos_sin, table, rows, b * w,
                                        e.cfg.rotary_dim * DType.FLOAT32.itemsize),)
            found = remember(self._draft_levels, key, work)
        return found

    def _catch_up_layout(self, acc: np.ndarray, a: int) -> _CatchUp:
        """A catch-up's rows: causal over each sequence's accepted tokens, logits (the batch contract's token
        selection) at the last one, the accepted rows' scratch rows; remembered per (accept lengths, width)."""
        key = (a, acc.tobytes())
        found = self._catch_up.get(key)
        if found is None:
            j = np.arange(a)
            take = j[None, :] < acc[:, None]
            causal = take[:, :, None] & take[:, None, :] & (j[None, :, None] >= j[None, None, :])
            if len(self._catch_up) >= 64:
                self._catch_up.pop(next(iter(self._catch_up)))
            layout = TreeLayout.of(pack_rows(causal, a), np.broadcast_to(j, take.shape), take,
                                   phase=PHASE_DRAFT if a > 1 else PHASE_DECODE,
                                   logits_rows=np.arange(acc.shape[0]) * a + acc - 1)
            scratch = np.where(take, self._batch_rows[:acc.shape[0]] * self._scratch_rows + j, -1)
            found = self._catch_up[key] = _CatchUp(layout, constant(take), constant(scratch.reshape(-1)),
                                                   constant((acc - 1)[:, None].astype(np.int64)))
        return found

    def _fused(self, embeds: tuple[DeviceWork, ...], zeros: tuple[DeviceWork, ...], level: tuple[DeviceWork, ...],
               move: DeviceWork) -> tuple[DeviceWork, ...]:
        """A proposal level's device work in the fewest kernels (:func:`~trtio.ops.fuse`): a round's zeros and
        the level's embedding copy before the tree's level, the copies that read what it writes (the RoPE
        rows, the parents' hidden rows; the embedding copy on later levels) in one kernel after it."""
        key = (embeds, zeros, level, move)
        found = self._fused_works.get(key)
        if found is None:
            first, then = (zeros + embeds, ()) if zeros else ((), embeds)
            found = remember(self._fused_works, key, fuse(first) + level[:1] + fuse(then + level[1:] + (move,)))
        return found

    def _stage_tree(self, e: BoundEngine, layout: TreeLayout, past: np.ndarray, select: np.ndarray,
                    s: Stream) -> tuple[DeviceWork, ...]:
        """Stage a tree step (verify, catch-up) of ``e``: the cached lengths ``past`` and the tree's constants
        (which the step block receives once while they repeat), uploaded with whatever the step wrote before,
        in one copy; the device then lays out the rest (:class:`~trtio.ops.TreeStep`). Ragged: the step's
        inputs and its RoPE gather; batch: the start index, context lengths, position ids, mask and token
        selection (``select``)."""
        step = self.io.step
        assert step is not None
        b, w = layout.real.shape
        ragged = self.contract == "ragged"
        if ragged:
            step.write("query_start_offsets", ramp(b + 1, w))
            step.write("query_lengths", layout.query_lengths)
            step.write("past_lengths", past)
            step.write("state_indices", ramp(b))
            step.write("logits_indices", layout.logits_indices)
            step.write("packed_attention_mask", layout.packed_mask)
            step.write("spec_tree_parent_ids", layout.tree_parent_ids)
            step.write("spec_tree_depths", layout.tree_depths)
        else:
            step.write("tree_past", past)
            step.write("tree_lengths", layout.query_lengths)
            step.write("tree_depths", layout.tree_depths)
            step.write("tree_mask", layout.packed_mask)
            step.write("tree_select", select)
        step.upload(s)
        if ragged:  # written on the device from here on
            step.overwritten(("attention_sequence_lengths", "positions", "spec_decode_position_ids", "rope_rows"))
        words = layout.packed_mask.shape[1]
        key = (e.role, b, w, layout.phase, layout.padding_position, words, select.shape[1])
        found = self._tree_steps.get(key)
        if found is None:
            targets = self._tree_targets(e)
            work: tuple[DeviceWork, ...]
            if ragged:
                work = (TreeStep(targets, b, w, layout.phase > PHASE_DECODE, layout.padding_position),)
                table, per_slot = self._rope_rows_source(e, s)
                rows = targets.rope_rows if per_slot else targets.positions
                assert rows is not None
                work += (self._row_copy(self.io.ragged_rope_cos_sin, table, rows, b * w,
                                        e.cfg.rotary_dim * DType.FLOAT32.itemsize),)
            else:
                work = (TreeStep(targets, b, w, True, 0, words, select.shape[1]),)
            found = remember(self._tree_steps, key, work)
        return found

    def _tree_targets(self, e: BoundEngine) -> TreeTargets:
        """What a tree step of ``e`` reads and writes on the device (see :class:`~trtio.ops.TreeTargets`)."""
        found = self._targets.get(e.role)
        if found is None:
            assert self.io.step is not None
            t, io = self.io.step.tensors, self.io
            if self.contract == "ragged":
                per_slot = e.cfg.is_mrope
                found = TreeTargets(t["past_lengths"], t["query_lengths"], t["spec_tree_depths"],
                                    asl=t["attention_sequence_lengths"], positions=t["positions"],
                                    ids=t["spec_decode_position_ids"], rope_rows=t["rope_rows"] if per_slot else None,
                                    rope_cap=e.cfg.max_kv_cache_capacity if per_slot else 0)
            else:
                found = TreeTargets(t["tree_past"], t["tree_lengths"], t["tree_depths"], start=e.state.kv_lengths,
                                    ctx=io.context_lengths, ids=io.spec_decode_position_ids, mask_src=t["tree_mask"],
                                    mask_dst=io.packed_attention_mask, select_src=t["tree_select"],
                                    select_dst=io.select_token_indices)
            self._targets[e.role] = found
        return found

    def _dims(self, e: BoundEngine, kind: str, *args: int) -> InferenceDims:
        """A step's dims from the config's recipe, remembered per shape (a recipe checks and builds them)."""
        key = (e.role, kind, *args)
        dims = self._dims_cache.get(key)
        if dims is None:
            recipes: dict[str, Callable[..., InferenceDims]] = {
                "proposal": e.cfg.proposal_dims, "verify": e.cfg.spec_verify_dims, "accept": e.cfg.accept_dims}
            recipe = recipes[kind]
            dims = self._dims_cache[key] = recipe(*args)
        return dims

    def _check_parents(self, parents: Any, b: int, k: int) -> np.ndarray:
        """The new level's parents, [k] or [b, k]: all -1 (the root) on a round's first level, else nodes of
        the previous level."""
        level0, level_k = self._level
        if parents is None:
            if k != 1:
                raise ShapeError(f"draft_propose: {k} nodes per sequence need their parents (-1 for the root)")
            return np.full(1, self._tree_n - 1 if self._tree_n else -1, np.int64)
        par = np.asarray(parents)
        if par.dtype.kind not in "iu" or par.shape not in ((k,), (b, k)):
            raise ShapeError(f"parents: expected integers of shape [{k}] or [{b}, {k}], got {par.dtype} {par.shape}")
        lo, hi = (-1, -1) if self._tree_n == 0 else (level0, level0 + level_k - 1)
        vals = par.ravel().tolist()  # a level is a few dozen values: Python's min and max beat numpy's here
        if vals and (min(vals) < lo or max(vals) > hi):
            full = np.broadcast_to(par, (b, k))
            bi, i = (int(v) for v in np.argwhere((full < lo) | (full > hi))[0])
            what = "-1 (the root) on a round's first level" if self._tree_n == 0 else \
                f"a node of the previous level ({level0}..{level0 + level_k - 1})"
            raise ShapeError(f"parents[{bi}, {i}] = {int(full[bi, i])}: a new node's parent must be {what}")
        return par

    def _stage_tree_embeds(self, x: Any, b: int, n0: int, k: int, s: Stream) -> tuple[DeviceWork, ...]:
        """The new nodes' embeddings into rows ``n0 .. n0 + k - 1`` of each sequence's block of the round's
        width; earlier nodes' rows stay as the previous calls left them. A device tensor at the address the
        same level read in each of the last ``_STABLE_ROUNDS`` rounds (a runtime's embedding buffer) is
        copied in the step's graph (returned as device work for it); any other is copied now, so buffers
        that move between rounds never cost a graph capture per address."""
        dst, w = self.io.inputs_embeds, self.proposal_width
        row = dst.dtype.itemsize * x.shape[2]
        if isinstance(x, Tensor):
            args = (dst.data_ptr + n0 * row, w * row, x.data_ptr, k * row, k * row, b)
            last, seen = self._level_sources.get(n0, ((), 0))
            seen = seen + 1 if last == args else 1
            self._level_sources[n0] = (args, seen)
            if seen > _STABLE_ROUNDS:
                found = self._level_copies.get(args)
                if found is None and len(self._level_copies) < _MAX_LEVEL_COPIES:  # a bounded number of graphs
                    found = self._level_copies[args] = Copy2D(self._backend, *args)
                if found is not None:
                    return (found,)
            self._backend.memcpy_2d(*args, s.handle)
            return ()
        self._round_embeds[:b, n0:n0 + k] = x
        self._embeds_staging.upload(self._round_embeds[:b], s)
        return ()

    def _round_zeros(self, b: int, w: int) -> tuple[DeviceWork, ...]:
        """A proposal round's first level: the base features and the draft's own hidden rows set to 0."""
        return (self._zero(self.io.base_hidden_states, b * w * self._base_width),
                self._zero(self.io.draft_hidden_states_in, b * w * self.draft.cfg.hidden_size))

    def _zero(self, t: Tensor, count: int) -> Zero:
        """The Zero of ``t``'s first ``count`` elements, one object per distinct zeroing (see _row_copy)."""
        key = (id(t), count)
        found = self._zeros.get(key)
        if found is None:
            found = self._zeros[key] = Zero(t, count * t.dtype.itemsize)
        return found

    # -- verify and accept --------------------------------------------------------------------------
    def verify(self, inputs_embeds: Any, tree: Any, stream: StreamLike = None) -> Tensor:
        """Base over a token tree per sequence; returns logits [batch * N, vocab] for every node.

        ``tree`` is a parent list ([N] shared by the batch, or [batch, N]; -1 for the root) or an unpacked
        mask [batch, N, N] (node t sees node i; a sequence's padding nodes are all-zero rows after its real
        ones). Node 0 is the root (the pending token). Nodes go to cache slots ``length + t``; positions are
        length + depth. The base cache is not committed until :meth:`accept`.
        """
        self._check_open()
        b = self._need_batch()
        e = self.base
        t = self._tree(tree, b)
        n = t.nodes
        x, nb, ns = self._embeds(inputs_embeds, e.cfg.hidden_size)
        if (nb, ns) != (b, n):
            raise ShapeError(f"inputs_embeds: verify of {n} nodes takes [batch={b}, {n}, hidden], "
                             f"got {list(x.shape)}")
        dims = self._dims(e, "verify", b, n)  # the tree size against max_verify_tree_size
        lengths = e.state.lengths[:b]
        if int(lengths.max()) + n > e.cfg.max_kv_cache_capacity:
            i = int(np.argmax(lengths))
            raise ShapeError(f"verify: {n} nodes do not fit after the {int(lengths[i])} tokens sequence {i} has "
                             f"cached (max_kv_cache_capacity {e.cfg.max_kv_cache_capacity})")
        s = self._stream(stream)
        self._upload_embeds(x, s)
        before = self._stage_tree(e, t.layout, lengths, t.select, s)
        e.tensor_map.use_deepstack_zero()
        e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s, before=before)
        self._verified = t
        self._accepted = None
        self._draft_ready = False
        return self.io.output_logits

    def _tree(self, tree: Any, b: int) -> _Tree:
        """The verify tree, checked and laid out once per distinct tree (a runtime's tree shape repeats)."""
        arr = np.asarray(tree)
        if arr.dtype.kind not in "iub":
            raise ShapeError(f"tree: expected a parent list or a [batch, N, N] mask, got dtype {arr.dtype}")
        key = (b, arr.shape, arr.dtype.str, arr.tobytes())
        found = self._trees.get(key)
        if found is None:
            vis = self._tree_mask(arr, b)
            if len(self._trees) >= 16:
                self._trees.pop(next(iter(self._trees)))
            found = self._trees[key] = _Tree.of(vis)
        return found

    def _tree_mask(self, tree: Any, b: int) -> np.ndarray:
        arr = np.asarray(tree)
        if arr.dtype.kind not in "iub":
            raise ShapeError(f"tree: expected a parent list or a [batch, N, N] mask, got dtype {arr.dtype}")
        if arr.ndim == 1:
            vis = np.broadcast_to(ancestor_mask(arr), (b, arr.shape[0], arr.shape[0]))
        elif arr.ndim == 2 and arr.shape[0] == b and arr.dtype.kind in "iu":
            vis = np.stack([ancestor_mask(p) for p in arr])
        elif arr.ndim == 3 and arr.shape[0] == b:
            vis = arr != 0
        else:
            raise ShapeError(f"tree: expected a parent list [N] or [batch={b}, N], or a [batch={b}, N, N] mask, "
                             f"got shape {arr.shape}")
        validate_tree_mask(vis)
        real: np.ndarray = np.asarray(vis.any(axis=2))
        if not real[:, 0].all() or vis[:, 0, 1:].any():
            bi = int(np.flatnonzero(~real[:, 0] | vis[:, 0, 1:].any(axis=1))[0])
            raise ShapeError(f"tree: node 0 of sequence {bi} must be the root (it sees itself only)")
        gaps = real[:, 1:] & ~real[:, :-1]
        if gaps.any():
            bi, t = (int(v) for v in np.argwhere(gaps)[0])
            raise ShapeError(f"tree: sequence {bi} has a padding row before node {t + 1}; padding rows come last")
        orphans = real[:, 1:] & (vis[:, 1:, :].sum(axis=2) < 2)
        if orphans.any():
            bi, t = (int(v) for v in np.argwhere(orphans)[0])
            raise ShapeError(f"tree: node {t + 1} of sequence {bi} has no parent; only node 0 is a root")
        return np.ascontiguousarray(vis)

    def accept(self, paths: Sequence[Sequence[int]] | np.ndarray, stream: StreamLike = None) -> None:
        """Commit each sequence's accepted root-to-node path of the last verify tree.

        ``paths[b]`` starts at the root 0 and follows the verified tree (each node a child of the one
        before); ``paths`` may also be an int array [batch, L] padded with trailing -1. The path's KV
        entries are compacted to consecutive slots after the committed length (every layer, K and V), its
        base hidden-state rows are set aside for :meth:`draft_accept`, and the base lengths grow by the
        path length.
        """
        self._check_open()
        b = self._need_batch()
        tree = self._verified
        if tree is None:
            raise TrtioError("accept() needs a verify() whose tree it accepts from (none since the last accept)")
        found = self._list_paths(paths, b, tree)
        if found is None:  # anything but lists of ints on the tree: the general checks name what is wrong
            grid, acc = path_grid(paths, b)
            if grid.shape[1] > MAX_PATH_MOVES + 1:
                i = int(np.argmax(acc))
                raise ShapeError(f"paths[{i}]: {int(acc[i])} nodes, more than the {MAX_PATH_MOVES + 1} an accepted "
                                 f"path may have (depth {MAX_PATH_MOVES})")
            bad = self._bad_path(grid, acc, tree)
            if bad is not None:
                i, t = bad
                path = grid[i, :acc[i]].tolist()
                if t == 0:
                    raise ShapeError(f"paths[{i}] = {path}: a path starts at the root, node 0")
                raise ShapeError(f"paths[{i}] = {path}: node {path[t]} is not a child of node {path[t - 1]} in "
                                 f"the verified tree")
        else:
            grid, acc = found
        n, width = tree.nodes, grid.shape[1]
        rows_b = self._batch_rows[:b]
        s = self._stream(stream)
        lengths = self.base.state.lengths
        self.base.state.commit_grid(lengths[:b], grid, acc, s)
        lengths[:b] += acc
        # The paths' base hidden-state rows, for draft_accept (-1 past each path's end).
        rows = rows_b * n + grid
        self._accepted_rows = rows if int(acc.min()) == width else np.where(grid >= 0, rows, -1)
        self._accepted = acc
        self._verified = None

    @staticmethod
    def _list_paths(paths: Any, b: int, tree: _Tree) -> tuple[np.ndarray, np.ndarray] | None:
        """What a runtime passes, ``b`` lists of plain ints each a root-to-node path of the verified ``tree``
        (at most MAX_PATH_MOVES + 1 nodes), as (grid padded with -1, lengths), walked once in Python; None for
        anything else, which the general checks (:func:`path_grid`, :meth:`_bad_path`) then refuse or read."""
        if type(paths) is not list or len(paths) != b:
            return None
        n, lens, walked = tree.nodes, [], 0
        for p, parents in zip(paths, tree.parent_lists):
            if type(p) is not list or not p or type(p[0]) is not int or p[0] != 0 or len(p) > MAX_PATH_MOVES + 1:
                return None
            walked += len(p)
            if walked > _PYTHON_PATH_NODES:  # numpy checks many paths faster
                return None
            prev = 0
            for node in itertools.islice(p, 1, None):
                if type(node) is not int or not 0 < node < n or parents[node] != prev:
                    return None
                prev = node
            lens.append(len(p))
        longest = max(lens)
        rows = paths if min(lens) == longest else [p + [-1] * (longest - len(p)) for p in paths]
        return np.array(rows, np.int64), np.array(lens, np.int64)

    def _bad_path(self, grid: np.ndarray, acc: np.ndarray, tree: _Tree) -> tuple[int, int] | None:
        """The first wrong node of the accepted paths (``grid`` [B, L], lengths ``acc``) in the verified
        ``tree``: (sequence, 0) for a path that does not start at the root (checked for every sequence
        first), else (sequence, t) for node t that is not a child of node t - 1; None when all follow it.
        A few dozen nodes (a runtime's paths) are walked in Python, more with numpy."""
        n = tree.nodes
        if grid.size <= _PYTHON_PATH_NODES:
            rows, lens = grid.tolist(), acc.tolist()
            for i, row in enumerate(rows):
                if row[0] != 0:
                    return i, 0
            for i, row in enumerate(rows):
                parents, prev = tree.parent_lists[i], 0
                for t in range(1, lens[i]):
                    node = row[t]
                    if not 0 < node < n or parents[node] != prev:
                        return i, t
                    prev = node
            return None
        roots = np.flatnonzero(grid[:, 0] != 0)
        if roots.size:
            return int(roots[0]), 0
        child, parent = grid[:, 1:], grid[:, :-1]
        ok = (child > 0) & (child < n)
        ok &= tree.parents[self._batch_rows[:grid.shape[0]], np.where(ok, child, 0)] == parent
        ok |= self._path_ids[1:grid.shape[1]] >= acc[:, None]  # past a path's end
        if ok.all():
            return None
        i, t = (int(v) for v in np.argwhere(~ok)[0])
        return i, t + 1

    def draft_accept(self, inputs_embeds: Any, accept_lengths: Any, stream: StreamLike = None) -> Tensor:
        """The draft's catch-up over the accepted tokens (shifted by one, as in the prefill): row t of
        sequence b holds the embedding of the token after accepted node t; ``accept_lengths`` are the path
        lengths :meth:`accept` committed. ``hidden_states_input`` rows are the accepted nodes' base hidden
        states. Starts at the draft's committed length; returns draft logits [batch, draft vocab] at each
        sequence's last accepted row."""
        self._check_open()
        b = self._need_batch()
        if self._accepted is None:
            raise TrtioError("draft_accept() follows accept(): there are no accepted tokens to catch up on")
        e = self.draft
        x, nb, a = self._embeds(inputs_embeds, e.cfg.hidden_size)
        if nb != b:
            raise ShapeError(f"inputs_embeds: batch {nb} differs from {b}")
        acc = self._accepted
        given = np.asarray(accept_lengths)
        if given.shape != (b,) or given.dtype.kind not in "iu" or not np.array_equal(given, acc):
            checked = self._check_lengths(accept_lengths, b, a, "accept_lengths")
            raise ShapeError(f"accept_lengths {checked.tolist()} differ from the path lengths accept() committed "
                             f"{acc.tolist()}")
        if int(acc.max()) > a:  # as _check_lengths words it: the catch-up is narrower than a path
            i = int(np.argmax(acc))
            raise ShapeError(f"accept_lengths[{i}] = {int(acc[i])} is outside 1..{a}")
        dims = self._dims(e, "accept", b, a)
        past = e.state.lengths[:b].copy()
        if int((past + a).max()) > e.cfg.max_kv_cache_capacity:
            i = int(np.argmax(past))
            raise ShapeError(f"draft KV cache full: sequence {i} holds {int(past[i])} tokens, {a} more pass "
                             f"max_kv_cache_capacity ({e.cfg.max_kv_cache_capacity})")
        s = self._stream(stream)
        self._upload_embeds(x, s)
        io = self.io
        catch_up = self._catch_up_layout(acc, a)
        # The draft's features: row i*a + j = the base's row of accepted node j of sequence i (zeros past the
        # path), gathered through scratch rows i*P + j (the rows overlap: no in-place gather).
        src = self._accepted_rows
        if src.shape[1] != a:
            src = np.full((b, a), -1, np.int64)
            src[:, :self._accepted_rows.shape[1]] = self._accepted_rows
        moves = self._catch_up_moves.get((b, a))
        if moves is None:
            row_bytes = self._base_width * io.base_hidden_states.dtype.itemsize
            moves = self._catch_up_moves[(b, a)] = (
                self._row_copy(io.row_scratch, io.base_hidden_states, io.row_src, b * a, row_bytes, io.row_dst),
                self._row_copy(io.base_hidden_states, io.row_scratch, io.row_dst, b * a, row_bytes),
                self._zero(io.draft_hidden_states_in, b * a * e.cfg.hidden_size))
        step = io.step
        assert step is not None
        step.write("row_src", src)
        step.write("row_dst", catch_up.scratch_rows)
        tree = self._stage_tree(e, catch_up.layout, past, catch_up.select, s)
        key = (tree, moves)
        before = self._fused_works.get(key)
        if before is None:  # the layout, then the RoPE rows, the gather and the zeros in one kernel, then the scatter
            gather, scatter, zero = moves
            before = remember(self._fused_works, key, tree[:1] + fuse(tree[1:] + (gather, zero)) + (scatter,))
        e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s, before=before)
        e.state.lengths[:b] = past + acc
        if self.contract != "ragged":  # a ragged round's roots are rows 0 .. b - 1 of the catch-up's output
            self._root_rows[:b] = np.arange(b) * a + acc - 1
        self._accepted = None
        self._start_round()
        return self.io.output_logits

    def reset(self, stream: StreamLike = None) -> None:
        """Empty both KV states; the next step must be a base prefill."""
        self._check_open()
        s = self._stream(stream)
        self.base.state.reset(s)
        self.draft.state.reset(s)
        self._batch = None
        self._prompt = None
        self._draft_ready = False
        self._verified = self._accepted = None
        self._tree_n = 0

    def memory_report(self, *, include_context_memory: bool = True) -> MemoryReport:
        """Every buffer the setup owns: the shared PipelineIO, both KV states, staging, RoPE tables and
        the shared context memory."""
        return self._report("create_for_spec_decode", include_context_memory)

    def __repr__(self) -> str:
        return f"SpecDecodeSetup({self.contract}, batch={self._batch})"


@dataclass(frozen=True)
class _CatchUp:
    """A catch-up's layout for a pattern of accept lengths: the tree step, which rows hold an accepted token
    ([B, A]), their scratch rows (-1 past each path) and the batch contract's token selection ([B, 1])."""

    layout: TreeLayout
    take: np.ndarray
    scratch_rows: np.ndarray
    select: np.ndarray


@dataclass(frozen=True)
class _Tree:
    """A checked verify tree, laid out for both contracts: packed rows, depths, parents, real rows."""

    nodes: int
    packed: np.ndarray  # uint32 [B, N, ceil(N/32)]
    depth: np.ndarray  # int64 [B, N]
    parents: np.ndarray  # int64 [B, N], -1 for the root and padding rows
    real: np.ndarray  # bool [B, N]
    select: np.ndarray  # int64 [B, N]: the batch contract's last_token_ids (every node)
    layout: TreeLayout  # the ragged contract's verify step, less what depends on the cached lengths
    parent_lists: list[list[int]]  # ``parents`` as Python lists (accept walks a few paths through them)

    @classmethod
    def of(cls, vis: np.ndarray) -> _Tree:
        b, n = vis.shape[0], vis.shape[1]
        real: np.ndarray = np.asarray(vis.any(axis=2))
        packed, depth, parents = pack_rows(vis, n), vis.sum(axis=2) - 1, _parents_of(vis)
        layout = TreeLayout.of(packed, depth, real, phase=PHASE_VERIFY, logits_rows=np.arange(b * n), parents=parents)
        return cls(n, packed, depth, parents, real, constant(np.broadcast_to(np.arange(n), (b, n))), layout,
                   parents.tolist())


def _parents_of(vis: np.ndarray) -> np.ndarray:
    """Each node's parent (its deepest other ancestor; -1 for roots and padding) from a tree mask [B, N, N]."""
    n = vis.shape[1]
    strict = vis & ~np.eye(n, dtype=bool)[None]
    idx = np.where(strict, np.arange(n)[None, None, :], -1)
    return np.asarray(idx.max(axis=2))


def create_for_spec_decode(base_engine: Any, draft_engine: Any, bundle: DeploymentConfig,
                           max_runtime_batch_size: int | None = None, stream: StreamLike = None, *,
                           graphs: bool = False, backend: Backend | str | None = None) -> SpecDecodeSetup:
    """Bind a base + draft pair to one shared PipelineIO (see :class:`SpecDecodeSetup`)."""
    return SpecDecodeSetup(base_engine, draft_engine, bundle, max_runtime_batch_size, stream, graphs=graphs,
                           backend=backend)
