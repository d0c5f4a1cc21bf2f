"""The draft's catch-up over the tokens a round accepted (``draft_accept``).

The draft re-runs the accepted tokens (shifted by one, as in its prefill), causal over each sequence's
accepted path, with the accepted nodes' base hidden states as its features. Those rows are gathered
from the verify step's output into scratch rows and scattered back in order, on the device, in the
catch-up's graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._cache import BoundedCache
from trtio._contracts.contract import EngineView, StepInputs
from trtio._contracts.ragged import PHASE_DECODE, PHASE_DRAFT, TreeLayout
from trtio._engine import DeviceWork
from trtio._ops import Zero, fuse
from trtio._pipeline_io import PipelineIO
from trtio._setups.verify import PlacedPaths
from trtio._staging import constant
from trtio._stream import Stream

__all__ = ["CatchUp"]

# The rows a catch-up's gather writes to (its scratch rows) and reads from (the accepted nodes' base rows).
_MOVE_NAMES = ("catch_up_dst", "catch_up_src")


@dataclass(frozen=True)
class _Layout:
    """A catch-up's layout for a pattern of accept lengths: the tree step, which rows hold an accepted token
    ([B, A]), their scratch rows (-1 past each path), the batch contract's token selection ([B, 1]), each
    sequence's root row after it (the contract's ``catch_up_roots``) and the moves of its shape
    (:meth:`CatchUp._gather_scatter`)."""

    layout: TreeLayout
    take: np.ndarray
    scratch_rows: np.ndarray
    select: np.ndarray
    roots: np.ndarray | None
    moves: tuple[DeviceWork, DeviceWork, DeviceWork]


class CatchUp:
    """Stages a catch-up and makes its device work (see module docstring). ``scratch_rows``: rows set
    aside per sequence for its accepted hidden states (the longest path a round may accept)."""

    def __init__(self, io: PipelineIO, steps: StepInputs, *, base_width: int, scratch_rows: int) -> None:
        self._io = io
        self._steps = steps
        self._base_width = base_width
        self._scratch = scratch_rows
        self._batch_rows = np.arange(io.max_batch)[:, None]
        self._layouts: BoundedCache[tuple[int, bytes], _Layout] = BoundedCache()
        self._moves: BoundedCache[tuple[int, int], tuple[DeviceWork, DeviceWork, DeviceWork]] = BoundedCache()
        self._fused: BoundedCache[tuple[Any, ...], tuple[DeviceWork, ...]] = BoundedCache()
        # The last catch-up's (a round repeats it): the accept lengths and width, their layout; the tree step's
        # work, the moves and the fused work of both.
        self._last_layout: tuple[np.ndarray, int, _Layout] | None = None
        self._last_work: tuple[tuple[DeviceWork, ...], tuple[DeviceWork, ...], tuple[DeviceWork, ...]] | None = None
        self._last_roots: tuple[np.ndarray, int, np.ndarray | None] | None = None  # (lengths, width, roots after)

    def stage(self, e: EngineView, accepted: np.ndarray, width: int, rows: np.ndarray, past: np.ndarray,
              s: Stream, slots: np.ndarray | None = None, pages: np.ndarray | None = None, *,
              placed: PlacedPaths | None = None) -> tuple[tuple[DeviceWork, ...], np.ndarray | None]:
        """Stage the catch-up of ``e`` over ``accepted[i]`` tokens per sequence in ``width``-wide rows after
        ``past`` cached ones, its features the base hidden-state ``rows`` [B, L] of the accepted nodes (-1 past
        each path); returns its device work (the layout, then the RoPE rows, the gather and the zeros in one
        kernel, then the scatter) and each sequence's root row once it has run (None: the default rows).

        ``placed``: where accept() left the paths on the device, whose nodes ``rows`` are: the device lays the
        catch-up out from them (:class:`~trtio._ops.CatchUpLayout`, before the tree step), so a new pattern of
        accept lengths costs no host layout and no upload. Without it (rows put in order by a catch-up that failed
        after its scatter ran) the host lays it out, once per pattern."""
        b, a = accepted.shape[0], width
        if placed is not None:
            return self._on_device(e, placed, b, a, past, s, slots, pages), self._roots_after(b, a, accepted)
        last = self._last_layout
        if last is not None and last[0] is accepted and last[1] == a:  # accept()'s read-only lengths, kept per paths
            found = last[2]
        else:
            found = self._layout(e, accepted, a)
            if not accepted.flags.writeable:
                self._last_layout = (accepted, a, found)
        # The draft's features: row i*a + j = the base's row of accepted node j of sequence i (zeros past the
        # path), gathered through scratch rows i*P + j (the rows overlap: no in-place gather).
        src = rows
        if src.shape[1] != a:
            src = np.full((b, a), -1, np.int64)
            src[:, :rows.shape[1]] = rows
        moves = found.moves
        step = self._steps.step
        # the block keeps the scratch rows from the last catch-up of this layout
        step.write_all(_MOVE_NAMES, (found.scratch_rows, src))
        tree = self._steps.tree(e, found.layout, past, found.select, s, slots, pages)
        work = self._last_work
        if work is not None and work[0] is tree and work[1] is moves:
            return work[2], found.roots
        key = (tree, moves)
        before = self._fused.get(key)
        if before is None:
            gather, scatter, zero = moves
            before = self._fused.put(key, tree[:1] + fuse(tree[1:] + (gather, zero)) + (scatter,))
        self._last_work = (tree, moves, before)
        return before, found.roots

    def _roots_after(self, b: int, a: int, accepted: np.ndarray) -> np.ndarray | None:
        """Each sequence's root row after a catch-up laid out on the device (the contract's ``catch_up_roots``), as
        a constant: the same one while accept() repeats its read-only lengths."""
        last = self._last_roots
        if last is not None and last[0] is accepted and last[1] == a:
            return last[2]
        roots = self._steps.catch_up_roots(b, a, accepted)
        if roots is not None and roots.flags.writeable:
            if roots.flags.owndata and roots.base is None:  # an array of its own, held by no one else: kept as it is
                roots.flags.writeable = False
            else:
                roots = constant(roots)
        if not accepted.flags.writeable:
            self._last_roots = (accepted, a, roots)
        return roots

    def _on_device(self, e: EngineView, placed: PlacedPaths, b: int, a: int, past: np.ndarray, s: Stream,
                   slots: np.ndarray | None, pages: np.ndarray | None) -> tuple[DeviceWork, ...]:
        """:meth:`stage`'s device work where the device lays the catch-up out: the layout and the tree step in one
        kernel, the RoPE rows, the gather and the zeros in one, then the scatter (the same object while the
        catch-up keeps its shape, whatever was accepted)."""
        tree = self._steps.catch_up(e, placed.moves, placed.stride, placed.nodes, b, a, self._scratch, past, s, slots,
                                    pages)
        moves = self._gather_scatter(e, b, a)
        work = self._last_work
        if work is not None and work[0] is tree and work[1] is moves:
            return work[2]
        key = (tree, moves)
        before = self._fused.get(key)
        if before is None:
            gather, scatter, zero = moves
            before = self._fused.put(key, tree[:1] + fuse(tree[1:] + (gather, zero)) + (scatter,))
        self._last_work = (tree, moves, before)
        return before

    def features(self, e: EngineView, accepted: np.ndarray, width: int, rows: np.ndarray
                 ) -> tuple[DeviceWork, DeviceWork]:
        """The moves alone (a DFlash draft's delta, :mod:`trtio.families.spec.dflash`): the accepted nodes' base rows
        ``rows`` put in order in place, at row ``i * width + j`` (:meth:`in_order`), their rows written into the
        step block for its next upload; returns the gather and the scatter."""
        found = self._layout(e, accepted, width)
        src = rows
        if src.shape[1] != width:
            src = np.full((accepted.shape[0], width), -1, np.int64)
            src[:, :rows.shape[1]] = rows
        self._steps.step.write_all(_MOVE_NAMES, (found.scratch_rows, src))
        gather, scatter, _zero = found.moves
        return gather, scatter

    def in_order(self, accepted: np.ndarray, width: int) -> np.ndarray:
        """Where a catch-up of ``width``-wide rows leaves the accepted nodes' features once its scatter has
        run: row ``i * width + j`` for accepted node ``j`` of sequence ``i`` (-1 past each path). A catch-up
        that failed after that reads them there when it runs again (its scatter overwrote the rows it
        gathered from)."""
        j = np.arange(width)[None, :]
        rows = self._batch_rows[:accepted.shape[0]] * width + j
        return np.where(j < accepted[:, None], rows, -1)

    def _layout(self, e: EngineView, acc: np.ndarray, a: int) -> _Layout:
        """A catch-up's rows: causal over each sequence's accepted tokens, logits (the batch contract's token
        selection) at the last one, the accepted rows' scratch rows; remembered per (width, accept lengths)."""
        key = (a, acc.tobytes())
        found = self._layouts.get(key)
        if found is None:
            layout = TreeLayout.chains(acc, a, phase=PHASE_DRAFT if a > 1 else PHASE_DECODE,
                                       logits_rows=np.arange(acc.shape[0]) * a + acc - 1)
            take = layout.real
            scratch = np.where(take, self._batch_rows[:acc.shape[0]] * self._scratch + np.arange(a), -1)
            roots = self._steps.catch_up_roots(acc.shape[0], a, acc)
            found = self._layouts.put(key, _Layout(layout, take, constant(scratch.reshape(-1)),
                                                   constant((acc - 1)[:, None].astype(np.int64)),
                                                   None if roots is None else constant(roots),
                                                   self._gather_scatter(e, acc.shape[0], a)))
        return found

    def _gather_scatter(self, e: EngineView, b: int, a: int) -> tuple[DeviceWork, DeviceWork, DeviceWork]:
        """The accepted rows gathered into scratch rows, scattered back in order, and the draft's own hidden
        inputs zeroed."""
        found = self._moves.get((b, a))
        if found is None:
            io, steps = self._io, self._steps
            row_bytes = self._base_width * io.base_hidden_states.dtype.itemsize
            src, dst = steps.step.tensors["catch_up_src"], steps.step.tensors["catch_up_dst"]
            found = self._moves.put((b, a), (
                steps.row_copy(io.row_scratch, io.base_hidden_states, src, b * a, row_bytes, dst),
                steps.row_copy(io.base_hidden_states, io.row_scratch, dst, b * a, row_bytes),
                Zero(io.draft_hidden_states_in, b * a * e.cfg.hidden_size * io.draft_hidden_states_in.dtype.itemsize)))
        return found
