"""The draft's prefill (``draft_prefill``): its inputs checked against the base prefill it follows, and
where each sequence's root hidden state sits.

A round's first proposal level reads each sequence's *root* (the draft's hidden state at its last
committed token) from a row of ``draft_hidden_states_out``: the row of the step that produced it. A draft
prefill writes the output rows of the sequences it admits, so the roots of the other active sequences
that still sit there move first, to rows past the step rows (one per slot).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from trtio._contracts.contract import StepInputs
from trtio._engine import DeviceWork
from trtio._pipeline_io import PipelineIO
from trtio._setups.base import Prompt
from trtio._setups.binding import BoundEngine
from trtio._setups.catch_up import CatchUp
from trtio._setups.sequences import Sequences
from trtio._tensor_map import TensorMap
from trtio.errors import ShapeError, TrtioError

__all__ = ["DraftRoots", "DraftRound", "check_accept_lengths", "check_draft_prompt", "check_draft_shape",
           "check_room"]


class DraftRound(NamedTuple):
    """What a draft family's own steps (a DFlash block draft: :mod:`trtio.families.spec.dflash`) use of their
    spec-decode setup, handed to them by the setup (made once): its draft engine, PipelineIO, step inputs, sequences,
    catch-up and the catch-up's tensor map, and the setup's step tools (each :class:`~trtio._setups.base.SetupBase`'s
    method of that name). The round's own state (the pending prompt, the accepted paths) comes with each call. (A
    named tuple: the setup makes one per call, quickly.)"""

    draft: BoundEngine
    io: PipelineIO
    steps: StepInputs
    seqs: Sequences
    catch_up: CatchUp
    catch_up_map: TensorMap
    embeds: Callable[..., tuple[Any, int, int]]
    check_lengths: Callable[[Any, int, int, str], np.ndarray]
    host_input: Callable[[Any, str], Any]
    step_stream: Callable[[Any], Any]  # the stream a step runs on (SetupBase._stream)
    prompt_pages: Callable[..., Any]
    upload_embeds: Callable[[Any, Any], None]
    step_lengths: Callable[[BoundEngine], tuple[np.ndarray, tuple[int, ...], np.ndarray, bool]]
    pages: Callable[..., Any]
    run: Callable[..., None]
    #: Keep the accepted paths' base rows where a failed catch-up left them (put in order in place).
    keep_accepted_rows: Callable[[np.ndarray], None]


def check_draft_shape(pending: Prompt, shape: tuple[int, ...]) -> None:
    """Refuse draft-prefill embeddings of another batch or width than the base prefill ``pending``'s."""
    b, width = pending.rows.shape[0], pending.width
    if tuple(shape[:2]) != (b, width):
        raise ShapeError(f"inputs_embeds: the draft prefill takes the base prefill's shape [batch={b}, "
                         f"seq={width}, hidden], got {list(shape)}")


def check_draft_prompt(pending: Prompt, ctx: np.ndarray, slots: Any, prefix: Any, seqs: Sequences,
                       draft: BoundEngine) -> None:
    """Refuse a draft prefill that is not the base prefill ``pending`` shifted by one: other lengths (``ctx``,
    checked as lengths), slots or prefixes, or a continued sequence the draft has not cached as far."""
    b, rows = pending.rows.shape[0], pending.rows
    if not np.array_equal(ctx, pending.lengths):
        raise ShapeError(f"context_lengths {ctx.tolist()} differ from the base prefill's "
                         f"{pending.lengths.tolist()}: the draft reads the base's hidden states row for row")
    if slots is not None:
        given = seqs.slot_list(slots, "draft_prefill")
        if given != rows.tolist():
            raise ShapeError(f"draft_prefill: slots {given} differ from the base prefill's {rows.tolist()}")
    if prefix is not None and seqs.prefixes(prefix, b, "draft_prefill") != pending.prefixes:
        raise ShapeError("draft_prefill: prefix differs from the base prefill's")
    past = pending.past
    if past is not None:
        have = draft.state.lengths[rows]
        short = np.flatnonzero(have < past)
        if short.size:
            i = int(short[0])
            raise TrtioError(f"draft_prefill: the base prefill continued slot {int(rows[i])} after {int(past[i])} "
                             f"tokens but the draft has cached only {int(have[i])}; catch the draft up first")


class DraftRoots:
    """Per slot, the ``draft_hidden_states_out`` row that holds its root hidden state: a step's output row, or
    one of the rows past them where a root waits while other sequences are admitted."""

    def __init__(self, io: PipelineIO, steps: StepInputs, max_batch: int, hidden: int) -> None:
        self._io, self._steps, self._hidden = io, steps, hidden
        self.rows = np.zeros(max_batch, np.int64)
        out = io.draft_hidden_states_out
        self._parked = out.capacity // (hidden * out.dtype.itemsize) - max_batch  # the first row past the steps'

    def park(self, admitted: np.ndarray, active: np.ndarray) -> tuple[DeviceWork, ...]:
        """Before a draft prefill writes the output rows, move the roots of the ``active`` slots not
        ``admitted`` that still sit in a step's output rows to their slots' rows past them; the device work."""
        new = set(admitted.tolist())
        keep = [slot for slot in active.tolist() if slot not in new and self.rows[slot] < self._parked]
        if not keep:
            return ()
        io, step = self._io, self._steps.step
        dst = np.array(keep, np.int64) + self._parked
        step.write("row_src", self.rows[keep].astype(np.int32))
        step.write("row_dst", dst.astype(np.int32))
        self.rows[keep] = dst
        out = io.draft_hidden_states_out
        return (self._steps.row_copy(out, out, io.row_src, len(keep), self._hidden * out.dtype.itemsize,
                                     io.row_dst),)

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        """The rows as they were if the block raises (a draft prefill that fails moves no root)."""
        saved = self.rows.copy()
        try:
            yield
        except BaseException:
            self.rows[:] = saved
            raise

def check_room(order: np.ndarray, past: np.ndarray, have: list[int], more: int, cap: int, step: str) -> int:
    """Refuse a draft ``step`` that would write ``more`` tokens past a sequence's ``have`` cached ones beyond
    ``cap`` (max_kv_cache_capacity), naming the fullest sequence; the longest of ``have``."""
    top = max(have)
    if top + more > cap:
        i = int(np.argmax(past))
        raise ShapeError(f"draft KV cache full: sequence {int(order[i])} holds {int(past[i])} tokens and {step} "
                         f"writes {more} more, past max_kv_cache_capacity ({cap})")
    return top


def check_accept_lengths(given: Any, lens: list[int], b: int, a: int, host_input: Callable[[Any, str], Any],
                         check_lengths: Callable[[Any, int, int, str], np.ndarray]) -> None:
    """``accept_lengths`` of ``SpecDecodeSetup.draft_accept``: the path lengths accept() committed (``lens``,
    for ``b`` sequences), each within the catch-up's ``a`` rows (read and checked with the setup's ``host_input``
    and ``check_lengths``)."""
    # What a runtime passes: the lengths accept() committed, as ints (else read as an array and compared).
    same = type(given) is list and given == lens and all(type(v) is int for v in given)
    if not same:
        array = given if type(given) is np.ndarray else np.asarray(host_input(given, "accept_lengths"))
        same = array.shape == (b,) and array.dtype.kind in "iu" and array.tolist() == lens
    if not same:
        checked = check_lengths(given, b, a, "accept_lengths")
        raise ShapeError(f"accept_lengths {checked.tolist()} differ from the path lengths accept() committed {lens}")
    if max(lens) > a:  # as _check_lengths words it: the catch-up is narrower than a path
        i = lens.index(max(lens))
        raise ShapeError(f"accept_lengths[{i}] = {lens[i]} is outside 1..{a}")
