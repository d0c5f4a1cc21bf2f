"""A block draft pair's draft steps (DFlash, JetSpec): the block draft (``docs/edgellm-assumptions.md`` §11.5,
§11.9).

A DFlash draft runs once a round, over a *block*: the round's root (the last committed token, which the base has
not run yet) and mask tokens after it, each block row returning logits for its position (row ``j >= 1`` guesses
the token at root position + ``j``). In the same engine call it first writes the *delta* into its KV (Edge-LLM's
``DFlashTargetKVCacheUpdate``): the base's ``hidden_states`` rows of the tokens committed since the draft last ran,
at their positions. trtio runs it through the existing phases, with the block as their ``inputs_embeds``:

* ``draft_prefill(block, context_lengths)`` — the delta is the prompt: the base prefill's rows, in place;
* ``draft_accept(block, accept_lengths)`` — the delta is the path ``accept`` committed (the root and the accepted
  drafted tokens): their base rows are put in order in place first (the catch-up's moves), then read;
* ``draft_propose`` is refused (the block *is* the proposal); ``verify`` / ``accept`` are the EAGLE3 ones, with the
  root and the drafted tokens as a chain.

Both return the block's logits ``[batch * block, draft vocab]`` (sequence-major). The draft's committed length
grows by the delta; the block's own K/V entries past it are scratch, overwritten by the next delta.

The block's mask is the family's (:class:`~trtio.families.spec.block_family.BlockFamily` ``causal``): DFlash's
bidirectional (every row sees the whole block), JetSpec's causal (row ``j`` sees rows ``0 .. j``), as Edge-LLM's
``dflashPrepareProposalInputsKernel`` writes it; the positions are the same (committed length + ``j``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio._cache import BoundedCache
from trtio._contracts.contract import rope_row_bytes
from trtio._contracts.ragged import PHASE_DECODE, PHASE_DRAFT, TreeLayout, pack_rows
from trtio._dims import InferenceDims
from trtio._engine import DECODE_PROFILE, PREFILL_PROFILE, DeviceWork
from trtio._setups.base import Prompt
from trtio._setups.binding import BoundEngine
from trtio._setups.draft_prompt import DraftRound, check_accept_lengths, check_draft_prompt, check_room
from trtio._staging import constant
from trtio._stream import Stream, StreamLike
from trtio._tensor import Tensor
from trtio.errors import ShapeError, TrtioError
from trtio.families.spec.dflash_bindings import DFLASH_POSITIONS, DFLASH_ROPE, DFLASH_SEQUENCES, check_block_draft
from trtio.features import Feature

__all__ = ["BlockDraft", "DFlashFeature"]


class BlockDraft:
    """The block steps of a block draft pair's draft (see module docstring): ``limit`` is the widest block;
    ``causal``: each block row sees the rows before it only (JetSpec), not the whole block (DFlash)."""

    def __init__(self, limit: int, causal: bool = False) -> None:
        self.limit = limit
        self.causal = causal
        self._layouts: BoundedCache[tuple[int, int], TreeLayout] = BoundedCache()
        self._dims: BoundedCache[tuple[int, int, int], InferenceDims] = BoundedCache()
        # per delta width and lengths: which rows hold a token, their offsets, their sequences (a constant)
        self._deltas: BoundedCache[tuple[int, bytes], tuple[np.ndarray, np.ndarray, np.ndarray]] = BoundedCache()
        self._last_moves: tuple[Any, Any, int, tuple[DeviceWork, ...]] | None = None  # the last accept's
        self._grids: BoundedCache[tuple[int, int, int], list[list[list[int]]]] = BoundedCache()  # _in_place_rows's
        self._delta_rows: BoundedCache[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = BoundedCache()
        self._last_delta: tuple[int, bytes] | None = None  # the last delta's key (_stage keeps a repeated one)

    def _rows(self, b: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A delta's tables for ``b`` sequences of ``width`` rows: the row numbers ``[1, width]``, which rows hold a
        token by the delta's length (``[width + 1, width]``) and each row's sequence (``[b, 1]``), int32."""
        found = self._delta_rows.get((b, width))
        if found is None:
            j = np.arange(width, dtype=np.int32)[None, :]
            found = self._delta_rows.put((b, width), (j, j < np.arange(width + 1)[:, None],
                                                      np.arange(b, dtype=np.int32)[:, None]))
        return found

    def _in_place_rows(self, b: int, a: int, k: int) -> list[list[list[int]]]:
        """Per sequence ``i`` and path length ``n`` (``0 .. k``), the accepted rows ``[k]`` of a path whose nodes lie
        where the catch-up's moves would put them: row ``i * a + j`` for node ``j < n``, -1 past it
        (:meth:`CatchUp.in_order <trtio._setups.catch_up.CatchUp.in_order>` on full paths)."""
        found = self._grids.get((b, a, k))
        if found is None:
            found = self._grids.put((b, a, k), [[[*range(i * a, i * a + n), *[-1] * (k - n)] for n in range(k + 1)]
                                                for i in range(b)])
        return found

    def refuse_propose(self) -> None:
        raise TrtioError("draft_propose: a DFlash draft proposes a whole block per call (draft_prefill / "
                         "draft_accept return the block's logits); verify the root and the block's guesses next")

    def _check_block(self, shape: tuple[int, ...], b: int) -> int:
        w = int(shape[1])
        if int(shape[0]) != b or not 1 <= w <= self.limit:
            raise ShapeError(f"inputs_embeds: a DFlash block is [batch={b}, 1..{self.limit} (the root's token, then "
                             f"mask tokens), hidden], got {list(shape)}")
        return w

    def _layout(self, b: int, w: int) -> TreeLayout:
        """A block of ``w`` rows per sequence: every row sees every row of its block (DFlash's bidirectional
        proposal mask) or the rows up to its own (a causal one: JetSpec's), positions root position + j."""
        found = self._layouts.get((b, w))
        if found is None:
            seen = np.tril(np.ones((w, w), bool)) if self.causal else np.ones((w, w), bool)
            found = self._layouts.put((b, w), TreeLayout.of(
                pack_rows(np.broadcast_to(seen, (b, w, w)), w), np.broadcast_to(np.arange(w), (b, w)),
                np.ones((b, w), bool),
                phase=PHASE_DRAFT if w > 1 else PHASE_DECODE, logits_rows=np.arange(b)))
        return found

    def _step_dims(self, e: BoundEngine, b: int, w: int, delta: int) -> InferenceDims:
        """Block rows ``b x w``, delta rows ``b x delta`` (``select_len``: Edge-LLM's ``selectLen``)."""
        found = self._dims.get((b, w, delta))
        if found is None:
            found = self._dims.put((b, w, delta), e.cfg.accept_dims(b, w).replace(select_len=delta))
        return found

    def _stage(self, r: DraftRound, past: np.ndarray, delta: np.ndarray, width: int, w: int, s: Stream,
               slots: np.ndarray | None, pages: np.ndarray | None) -> tuple[DeviceWork, ...]:
        """Stage a block step of the draft: the delta's positions and sequences (-1 past each sequence's delta,
        ``width`` rows each) with the block's tree step (one upload), then the delta's RoPE rows gathered."""
        steps, e = r.steps, r.draft
        b = delta.shape[0]
        key = (width, delta.tobytes())
        found = self._deltas.get(key)
        if found is None:  # lengths new every round (a serving loop's) are laid out by table lookups alone
            j, takes, seqs = self._rows(b, width)
            take = takes.take(delta, 0)
            found = (take, j, np.where(take, seqs, np.int32(-1)).reshape(-1))
            if key == self._last_delta:  # a round repeats its accept lengths: their rows and sequences are kept
                found = self._deltas.put(key, (take, j, constant(found[2])))
            self._last_delta = key
        take, j, sequences = found
        step = steps.step
        step.write_all((DFLASH_POSITIONS, DFLASH_SEQUENCES),
                       (np.where(take, past.astype(np.int32)[:, None] + j, np.int32(-1)).reshape(-1), sequences))
        tree = steps.tree(e, self._layout(b, w), past + delta, delta, s, slots, pages)
        table, _per_slot = steps.rope_source(e, s)
        rope = steps.row_copy(r.io.member(DFLASH_ROPE), table, step.tensors[DFLASH_POSITIONS], b * width,
                              rope_row_bytes(e.cfg))
        return (*tree, rope)

    def prefill(self, r: DraftRound, pending: Prompt, inputs_embeds: Any, context_lengths: Any, slots: Any,
                prefix: Any, stream: StreamLike = None) -> Tensor:
        """``draft_prefill`` of a DFlash pair (``pending``: the base prefill it follows): the delta is the base
        prefill's prompt rows, in place."""
        e, rows, past = r.draft, pending.rows, pending.past
        x, b, _w = r.embeds(inputs_embeds, e.cfg.hidden_size, stream)
        w = self._check_block(tuple(x.shape), rows.shape[0])
        ctx = r.check_lengths(context_lengths, b, pending.width, "context_lengths")
        check_draft_prompt(pending, ctx, slots, prefix, r.seqs, e)
        start = np.zeros(b, np.int64) if past is None else past
        if int((start + ctx).max()) + w > e.cfg.max_kv_cache_capacity:
            i = int(np.argmax(start + ctx))
            raise ShapeError(f"draft KV cache full: slot {int(rows[i])} holds {int(start[i] + ctx[i])} tokens and a "
                             f"block writes {w} more, past max_kv_cache_capacity ({e.cfg.max_kv_cache_capacity})")
        dims = self._step_dims(e, b, w, pending.width)
        s = r.step_stream(stream)
        seqs = r.seqs
        with seqs.transaction():
            # the prompt's pages, and the block's after them (its scratch entries)
            plans = r.prompt_pages([e], rows, past, ctx + w, None, restart=False)
            pages = None
            if seqs.slotted:
                for plan in plans:
                    seqs.copy(plan.table_role, plan.moves, s)
                pages = seqs.step_rows(e.role, tuple(rows.tolist()))
            r.upload_embeds(x, s)
            before = self._stage(r, start, ctx, pending.width, w, s, rows if seqs.slotted else None, pages)
            e.executor.prepare(PREFILL_PROFILE, r.catch_up_map, dims, s)
            e.executor.execute(s, use_graph=False, before=before)
            e.state.lengths[rows] = start + ctx
        logits: Tensor = r.io.output_logits
        return logits

    def _moves(self, r: DraftRound, acc: np.ndarray, lens: list[int], rows: np.ndarray,
               a: int) -> tuple[DeviceWork, ...]:
        """The accepted paths' base rows put in order (row ``i * a + j``), or nothing where they are there already
        (a chain verified ``a`` nodes wide: Edge-LLM's linear DFlash reads them in place). The paths accept()
        repeats (read-only arrays) are answered again without a look. ``rows``: where their base rows are."""
        last = self._last_moves
        if last is not None and last[0] is acc and last[1] is rows and last[2] == a:
            return last[3]
        b, k = rows.shape
        moves: tuple[DeviceWork, ...] = ()
        # in place: each accepted node's row is row i * a + j already (rows are -1 past each path): compared as
        # Python lists with the in-place rows of the paths' lengths (a few list compares, whatever the lengths)
        if k > a or rows.tolist() != [*map(list.__getitem__, self._in_place_rows(b, a, k), lens)]:
            moves = r.catch_up.features(r.draft, acc, a, rows)
        elif not acc.flags.writeable and not rows.flags.writeable:
            self._last_moves = (acc, rows, a, moves)  # only the in-place answer: the moves write the step block
        return moves

    def accept(self, r: DraftRound, b: int, acc: np.ndarray, lens: list[int], rows: np.ndarray, inputs_embeds: Any,
               accept_lengths: Any, stream: StreamLike = None) -> Tensor:
        """``draft_accept`` of a DFlash pair (``b`` sequences whose accepted paths are ``acc`` long, ``lens`` as
        ints, their base rows at ``rows``): the delta is each sequence's accepted path (its base rows put in order
        in place first), then the next block."""
        e = r.draft
        x, _nb, _w = r.embeds(inputs_embeds, e.cfg.hidden_size, stream)
        w = self._check_block(tuple(x.shape), b)
        longest = max(lens)
        a = max(longest, w)  # the delta's rows per sequence: the block's width while the paths fit (a steady shape)
        check_accept_lengths(accept_lengths, lens, b, a, r.host_input, r.check_lengths)
        dims = self._step_dims(e, b, w, a)
        order, key, past, whole = r.step_lengths(e)
        have = past.tolist()
        top = check_room(order, past, have, longest + w, e.cfg.max_kv_cache_capacity, "a delta and its block")
        s = r.step_stream(stream)
        taken, pages = r.pages(e, order, key, past, longest + w, s, have, top)
        try:
            r.upload_embeds(x, s)
            moves = self._moves(r, acc, lens, rows, a)
            before = moves + self._stage(r, past, acc, a, w, s, order if r.seqs.slotted else None, pages)
            e.executor.prepare(DECODE_PROFILE, r.catch_up_map, dims, s)
            try:
                r.run(e, s, before, rerun="the block's features were put in order in place")
            except BaseException:
                if e.executor.enqueued >= len(moves):  # the features were put in order in place: read them there
                    r.keep_accepted_rows(r.catch_up.in_order(acc, a))
                raise
        except BaseException:
            if taken is not None:
                taken.undo()
            raise
        if whole:
            past += acc
        else:
            e.state.lengths[order] = past + acc
        logits: Tensor = r.io.output_logits
        return logits


class DFlashFeature(Feature):
    """A block draft pair's draft steps (DFlash, JetSpec; see module docstring): the spec-decode setup's
    ``draft_prefill`` and ``draft_accept`` run the block draft's, and ``draft_propose`` is refused."""

    METHODS = ("draft_prefill", "draft_accept", "draft_propose")

    def __init__(self, block: BlockDraft) -> None:
        self.block = block

    @classmethod
    def make(cls, config: Any, cfg: Any, role: str, ctx: Any, eio: Any) -> DFlashFeature | None:
        family = config.block_family
        if family is None or not config.is_block_draft or family.refused is not None:
            return None
        return cls(BlockDraft(check_block_draft(cfg), causal=family.causal))

    def draft_prefill(self, r: DraftRound, pending: Prompt, inputs_embeds: Any, context_lengths: Any, slots: Any,
                      prefix: Any, stream: StreamLike = None) -> Tensor:
        return self.block.prefill(r, pending, inputs_embeds, context_lengths, slots, prefix, stream)

    def draft_accept(self, r: DraftRound, b: int, acc: np.ndarray, lens: list[int], rows: np.ndarray,
                     inputs_embeds: Any, accept_lengths: Any, stream: StreamLike = None) -> Tensor:
        return self.block.accept(r, b, acc, lens, rows, inputs_embeds, accept_lengths, stream)

    def draft_propose(self, r: DraftRound, b: int, inputs_embeds: Any, parents: Any, stream: StreamLike = None) -> None:
        self.block.refuse_propose()
