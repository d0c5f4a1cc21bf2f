"""The draft tree of a speculative round: its levels, as ``draft_propose`` grows it.

A round's tree starts at each sequence's root (its last committed token) and grows one level per
:meth:`DraftTree.propose`: ``k`` new nodes per sequence hanging off the root (the first level) or off
nodes of the previous level. The draft runs over every node of the tree so far, one fixed width per
round (Edge-LLM re-runs it: ``drafting_step * drafting_top_k`` rows per sequence). The device keeps its
own copy of the tree and lays each level's step out from it (:class:`~trtio._ops.DraftLevel`); the host
keeps the parents given, for the verify tree a runtime selects from the draft tree.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio._cache import BoundedCache
from trtio._contracts.contract import DraftLevelPlan, StepInputs
from trtio._cuda.backend import Backend
from trtio._engine import DeviceWork
from trtio._ops import Copy2D, Zero, fuse
from trtio._pipeline_io import PipelineIO
from trtio._setups.binding import BoundEngine
from trtio._staging import UploadRing, constant
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio.errors import ShapeError

__all__ = ["DraftTree"]

_MAX_LEVEL_COPIES = 32  # embedding copies a setup captures in level graphs (each address pair: one more graph)
_STABLE_ROUNDS = 1  # rounds in a row a level's embeddings came from one address before its graph copies them


class DraftTree:
    """The round's draft tree (see module docstring): what levels were proposed, and the device work and
    staging of the next one. ``width`` nodes per sequence at most (``drafting_step * drafting_top_k``)."""

    def __init__(self, io: PipelineIO, steps: StepInputs, draft: BoundEngine, words: Tensor, nodes: Tensor,
                 staging: UploadRing, backend: Backend, *, width: int, base_width: int) -> None:
        self._io = io
        self._steps = steps
        self._draft = draft
        self._staging = staging
        self._backend = backend
        self.width = width
        self._base_width = base_width
        n_words = max(1, -(-width // 32))
        self.buffers = steps.draft_buffers(draft, words, nodes, width, n_words)
        self.nodes = 0  # nodes run this round (per sequence)
        self._parents: list[np.ndarray] = []  # each level's parents this round ([k] or [b, k], int32 constants)
        # Per first node: the last parents a level starting there had (values, shape, their int32 constant, and the
        # bounds they were checked against: the previous level's first and last node).
        self._level_parents: BoundedCache[int, tuple[list[int], tuple[int, ...], np.ndarray, int, int]] = \
            BoundedCache()
        self._level = (0, 0)  # (first node, count) of the newest level: the rows the last proposal output
        self._round_lengths = np.zeros(0, np.int32)  # the round's cached lengths (its levels'), an int32 constant
        self._round_list: list[int] = []  # the round's cached lengths (its levels'), as ints
        # The draft's lengths the last catch-up leaves on the device (contract.ROUND_NEXT), in its sequences' order,
        # until a round starts otherwise (start()); None: none known.
        self._caught_up: list[int] | None = None
        # The roots a round's first level last staged: their values, and the constant holding them (_root_rows).
        self._last_roots: tuple[list[int], np.ndarray] | None = None
        # Each level's last embeddings copy (its addresses) and the rounds in a row it was the same.
        self._level_sources: dict[int, tuple[tuple[int, ...], int]] = {}
        self._level_copies: BoundedCache[tuple[int, ...], Copy2D] = BoundedCache()  # copies in a level's graph
        self._moves: BoundedCache[tuple[int, int], DeviceWork] = BoundedCache()
        self._zeros: BoundedCache[tuple[int, int], Zero] = BoundedCache()
        # The fused work of a level, by the ids of its parts (kept beside it): (parts..., fused)
        self._fused: BoundedCache[tuple[int, ...], tuple[Any, ...]] = BoundedCache()
        self._zero_pairs: BoundedCache[int, tuple[DeviceWork, ...]] = BoundedCache()  # a round's zeros, by batch
        self._row_bytes = io.inputs_embeds.dtype.itemsize * draft.cfg.hidden_size  # one embedding row
        # The level propose() staged, until grow() adds it to the tree: its parents, first node, node count, the
        # round's lengths, its embeddings' source (see _stage_embeds) and whether it reads the lengths on the device.
        self._staged: tuple[np.ndarray, int, int, np.ndarray, Any, bool] | None = None
        # Per first node of a level: its last (parents constant, embedding copy, batch, count, previous level,
        # fused work, lengths read on the device); the objects are kept, so identity tests find no stale one.
        self._steady: BoundedCache[int, tuple[np.ndarray, DeviceWork | None, int, int, tuple[int, int],
                                              tuple[DeviceWork, ...], bool]] = BoundedCache()

    def start(self, caught_up: list[int] | None = None) -> None:
        """A new round: no node yet. ``caught_up``: the draft's lengths (each sequence's, in its order) that the
        catch-up just enqueued leaves on the device, where the round's first level reads them if they are still
        the draft's; None: none known. Every round starts here, so no other catch-up (a draft tree step) runs
        between the one that said them and the round's first level."""
        self.nodes = 0
        self._parents.clear()
        self._level = (0, 0)
        self._staged = None
        self._caught_up = caught_up

    def parents(self, batch: int) -> np.ndarray:
        """The parents (-1: the root) of the nodes proposed this round, [batch, nodes] int64."""
        if not self.nodes:
            return np.zeros((batch, 0), np.int64)
        levels = [np.broadcast_to(p, (batch, p.shape[-1])) for p in self._parents]
        return np.concatenate(levels, axis=1).astype(np.int64)

    def check(self, parents: Any, b: int, k: int) -> np.ndarray:
        """The new level's parents, [k] or [b, k]: all -1 (the root) on a round's first level, else nodes of
        the previous level; and that ``k`` more nodes fit the round's width. Returned as an int32
        :func:`~trtio._staging.constant`, the same object as the same level's last round where the values and
        shape repeat (the step block then holds them already)."""
        n = self.nodes
        level0, level_k = self._level
        lo, hi = (-1, -1) if n == 0 else (level0, level0 + level_k - 1)
        if parents is None:
            if k != 1:
                raise ShapeError(f"draft_propose: {k} nodes per sequence need their parents (-1 for the root)")
            vals, shape = [n - 1 if n else -1], (1,)
        else:
            par = np.asarray(parents)
            shape = par.shape
            if par.dtype.kind not in "iu" or shape not in ((k,), (b, k)):
                raise ShapeError(f"parents: expected integers of shape [{k}] or [{b}, {k}], got {par.dtype} "
                                 f"{shape}")
            vals = par.ravel().tolist()
        # The same values as this level's last round, checked then against the same bounds: not checked again.
        found = self._level_parents.get(n)
        if found is None or found[0] != vals or found[1] != shape or found[3] != lo or found[4] != hi:
            found = None
            # (a level is a few dozen values: Python's min and max beat numpy's here)
            if parents is not None and vals and (min(vals) < lo or max(vals) > hi):
                full = np.broadcast_to(par, (b, k))
                bi, i = (int(v) for v in np.argwhere((full < lo) | (full > hi))[0])
                what = "-1 (the root) on a round's first level" if n == 0 else \
                    f"a node of the previous level ({level0}..{hi})"
                raise ShapeError(f"parents[{bi}, {i}] = {int(full[bi, i])}: a new node's parent must be {what}")
        if n + k > self.width:
            raise ShapeError(f"draft_propose: {k} more nodes make {n + k}, more than the {self.width} a "
                             f"round's draft tree holds (drafting_step x drafting_top_k = {self.width})")
        if found is not None:
            return found[2]
        par32 = constant(np.array(vals, np.int32).reshape(shape))  # checked to lie in -1 .. width - 1
        self._level_parents.put(n, (vals, shape, par32, lo, hi))
        return par32

    def propose(self, x: Any, par: np.ndarray, past: np.ndarray, roots: np.ndarray, s: Stream,
                slots: np.ndarray | None = None, pages: np.ndarray | None = None, *, batch: int | None = None,
                nodes: int | None = None, have: list[int] | None = None) -> tuple[DeviceWork, ...]:
        """Stage the level of ``x`` ([b, k, hidden] embeddings, checked; ``batch`` and ``nodes``: its b and k,
        where the caller has them) hanging off ``par`` (:meth:`check`) after ``past`` cached tokens, and return
        its device work in the fewest kernels. The tree holds the level once :meth:`grow` says its step
        succeeded: a step that fails leaves the tree as it was. ``roots``: each sequence's root hidden row, and
        ``have``: ``past`` as ints (read on a round's first level only: where the last catch-up left these
        lengths on the device, the level reads them there and stages none)."""
        if batch is None or nodes is None:
            shape = x.shape
            batch, nodes = int(shape[0]), int(shape[1])
        b, k = batch, nodes
        n0 = self.nodes
        embeds, source = self._stage_embeds(x, b, n0, k, s)
        caught = False
        if n0 == 0:  # a new round: the lengths are fixed for all its levels
            lengths = past.astype(np.int32)  # a new array of its own: made a constant in place
            lengths.flags.writeable = False
            roots = self._root_rows(roots)
            caught = have is not None and have == self._caught_up
        else:
            lengths = self._round_lengths
        # A level like the same level last round (a round's first: its inputs staged; a later one: its parents
        # staged), its device work as it was.
        last = self._steady.get(n0)
        if last is not None and last[0] is par and last[1] is embeds and last[2] == b and last[3] == k and \
                last[4] == self._level and last[6] is caught:
            if n0:
                self._steps.stage_parents(n0, b, par, s)
            else:
                self._steps.stage_round(self._draft, DraftLevelPlan(lengths, par, b, 0, k, roots, (0, 0), slots,
                                                                    pages, caught), self.width, s)
            self._staged = (par, n0, k, lengths, source, caught)
            return last[5]
        # A round's first level also zeroes the base features and stale draft rows.
        zeros = self._round_zeros(b) if n0 == 0 else ()
        move = self._move(b, k)
        plan = DraftLevelPlan(lengths, par, b, n0, k, roots, self._level, slots, pages, caught)
        level = self._steps.draft_level(self._draft, self.buffers, plan, s)
        self._staged = (par, n0, k, lengths, source, caught)  # a constant of check()'s: no copy
        fused = self._fuse(embeds, zeros, level, move)
        self._steady.put(n0, (par, embeds, b, k, self._level, fused, caught))
        return fused

    def _root_rows(self, roots: np.ndarray) -> np.ndarray:
        """``roots`` (each sequence's root hidden row) as a read-only constant: the last round's where the values
        are the same (a steady batch's roots stay in place between rounds), so the step block, which holds it
        from that round's upload, is not written again."""
        rows = roots.tolist()
        last = self._last_roots
        if last is not None and last[0] == rows:
            return last[1]
        found = constant(roots)
        self._last_roots = (rows, found)
        return found

    def roots_held(self, roots: np.ndarray) -> None:
        """The step block holds ``roots`` (a constant: each sequence's root hidden row, written there by device
        work already enqueued): the next round's first level whose roots have these values stages them at no
        cost."""
        last = self._last_roots
        if last is None or last[1] is not roots:
            self._last_roots = (roots.tolist(), roots)

    def round_past(self, lengths: list[int]) -> np.ndarray | None:
        """The int32 constant of the cached lengths this round's levels staged, where they are ``lengths`` (a
        verify's, whose base caches as far as the draft between rounds): the step block may hold it already.
        None before a level ran or where the lengths differ."""
        if self.nodes and lengths == self._round_list:
            return self._round_lengths
        return None

    def grow(self) -> None:
        """The level :meth:`propose` staged joins the tree (its step succeeded)."""
        staged = self._staged
        assert staged is not None, "grow() follows propose()"
        parents, n0, k, self._round_lengths, source, caught = staged
        if n0 == 0:
            self._round_list = self._round_lengths.tolist()
            if caught:  # the level wrote the round's lengths into the step block on the device
                self._steps.round_placed(self._round_lengths)
        self._parents.append(parents)
        self.nodes = n0 + k
        self._level = (n0, k)
        if source is not None:
            self._level_sources[n0] = source
        self._staged = None

    def _move(self, b: int, k: int) -> DeviceWork:
        """Each new node's draft input: its parent's draft hidden state (the root's: the catch-up's)."""
        found = self._moves.get((b, k))
        if found is None:
            io = self._io
            found = self._moves.put((b, k), self._steps.row_copy(
                io.draft_hidden_states_in, io.draft_hidden_states_out, io.row_src, b * k,
                self._draft.cfg.hidden_size * io.draft_hidden_states_out.dtype.itemsize, io.row_dst))
        return found

    def _fuse(self, embeds: DeviceWork | None, zeros: tuple[DeviceWork, ...], level: tuple[DeviceWork, ...],
              move: DeviceWork) -> tuple[DeviceWork, ...]:
        """A proposal level's device work in the fewest kernels (:func:`~trtio._ops.fuse`): a round's zeros and
        the level's embedding copy before the tree's level, the copies that read what it writes (the RoPE
        rows, the parents' hidden rows; the embedding copy on later levels) in one kernel after it. Every part
        is an object kept by its own cache: the fused work is found by their identities."""
        key = (id(embeds), id(zeros), id(level), id(move))
        found = self._fused.get(key)
        if found is None or found[0] is not embeds or found[1] is not zeros or found[2] is not level or \
                found[3] is not move:
            copies = () if embeds is None else (embeds,)
            first, then = (zeros + copies, ()) if zeros else ((), copies)
            found = self._fused.put(key, (embeds, zeros, level, move,
                                          fuse(first) + level[:1] + fuse(then + level[1:] + (move,))))
        fused: tuple[DeviceWork, ...] = found[4]
        return fused

    def _stage_embeds(self, x: Any, b: int, n0: int, k: int,
                      s: Stream) -> tuple[DeviceWork | None, tuple[tuple[int, ...], int] | None]:
        """The new nodes' embeddings into rows ``n0 .. n0 + k - 1`` of each sequence's block of the round's
        width (only those: host data through a pinned slot with one 2D copy); earlier nodes' rows stay as the
        previous calls left them. A device tensor at the address the
        same level read in each of the last ``_STABLE_ROUNDS`` rounds (a runtime's embedding buffer) is
        copied in the step's graph (returned as device work for it); any other is copied now, so buffers
        that move between rounds never cost a graph capture per address. Also returns what the level's
        source becomes once the step succeeds (its addresses and rounds seen; None for host data)."""
        dst, w = self._io.inputs_embeds, self.width
        row = self._row_bytes
        if isinstance(x, Tensor):
            args = (dst._ptr + n0 * row, w * row, x._ptr, k * row, k * row, b)  # x was checked open (_embeds)
            last, seen = self._level_sources.get(n0, ((), 0))
            seen = seen + 1 if last == args else 1
            if seen > _STABLE_ROUNDS:
                found = self._level_copies.get(args)
                if found is None and len(self._level_copies) < _MAX_LEVEL_COPIES:  # a bounded number of graphs
                    found = self._level_copies.put(args, Copy2D(self._backend, *args))
                if found is not None:
                    return found, (args, seen)
            self._backend.memcpy_2d(*args, s.handle)
            return None, (args, seen)
        self._staging.upload_rows(x, dst, n0 * row, w * row, s)  # host data: the new rows only, one 2D copy
        return None, None

    def _round_zeros(self, b: int) -> tuple[DeviceWork, ...]:
        """A proposal round's first level: the base features and the draft's own hidden rows set to 0 (one tuple
        per batch size)."""
        found = self._zero_pairs.get(b)
        if found is None:
            w = self.width
            found = self._zero_pairs.put(b, (
                self._zero(self._io.base_hidden_states, b * w * self._base_width),
                self._zero(self._io.draft_hidden_states_in, b * w * self._draft.cfg.hidden_size)))
        return found

    def _zero(self, t: Tensor, count: int) -> Zero:
        """The Zero of ``t``'s first ``count`` elements, one object per distinct zeroing."""
        key = (id(t), count)
        found = self._zeros.get(key)
        if found is None:
            found = self._zeros.put(key, Zero(t, count * t.dtype.itemsize))
        return found
