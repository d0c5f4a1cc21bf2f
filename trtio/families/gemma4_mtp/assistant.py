"""A Gemma 4 MTP pair's draft steps: the KV-less assistant (``docs/edgellm-assumptions.md`` §18).

Edge-LLM 0.11's ``gemma4MTPDecoder.cpp`` drafts a chain each round: ``draftingStep`` steps of the assistant, one row
a sequence, every one at position ``committed_len - 1`` with ``past_lengths`` = ``attention_sequence_lengths`` =
``committed_len`` (``committed_len``: the tokens in the target's KV); the assistant's ``past_key_values_i`` are the
target's pools (its feature binds them), read through the target's page-table rows, and never written. Step 0 takes
the pending token's target embedding and the *seed*: the target's ``hidden_states`` row of the last committed token
(the prompt's last after a prefill, the last accepted node's after a verify); step ``k`` takes the embedding of the
token step ``k - 1`` chose and that step's output ``hidden_states`` (the *feedback*). trtio runs them through the
existing phases:

* ``draft_prefill(pending_embedding, context_lengths)`` — step 0 after the base prefill (seed: the prompt's last row);
* ``draft_propose(chosen_embedding)`` — step ``k`` (feedback: the last step's output), a chain (``parents`` None);
* ``draft_accept(pending_embedding, accept_lengths)`` — step 0 after an accept (seed: the last accepted node's row).

Each returns the step's logits ``[batch, vocab]``. ``verify`` / ``accept`` are the base's (root + chain, or a tree
built from the steps' top-K where K > 1). ``inputs_embeds`` here are ``[batch, 1, target hidden]``: the target's
embedding rows (its ``embedding.safetensors``), as Edge-LLM looks them up.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio._cache import BoundedCache
from trtio._contracts.ragged import PHASE_DECODE, StepLayout, ramp
from trtio._dims import InferenceDims
from trtio._engine import DECODE_PROFILE, DeviceWork
from trtio._setups.base import Prompt
from trtio._setups.draft_prompt import DraftRound, check_accept_lengths, check_draft_prompt
from trtio._staging import constant
from trtio._stream import Stream, StreamLike
from trtio._tensor import Tensor
from trtio.errors import ShapeError, TrtioError

__all__ = ["AssistantDraft", "seed_rows"]


def seed_rows(rows: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """The base ``hidden_states`` row of each accepted path's last node (``rows`` [batch, longest]: the paths'
    rows, root first; ``acc`` their lengths): the next round's seed (Edge-LLM: ``previousAcceptLengths - 1`` of
    the assembled accepted rows)."""
    seed: np.ndarray = rows[np.arange(rows.shape[0]), acc - 1]
    return seed


class AssistantDraft:
    """The assistant's steps (module docstring): ``width`` is the target's hidden size (its embedding and
    hidden-state rows)."""

    def __init__(self, width: int, itemsize: int, max_batch: int) -> None:
        self.width = width
        self._row_bytes = width * itemsize
        self._dims: BoundedCache[int, InferenceDims] = BoundedCache()
        self._steps = 0  # steps since the last step 0 (a chain's depth)
        # Per slot, the draft_hidden_states_out row holding its last step's output (its next step's feedback): a
        # step's row, or, where a prefill admitting other sequences writes over it, the slot's row past the steps'.
        self._fed = np.zeros(max_batch, np.int64)
        self._parked = max_batch

    def _park(self, r: DraftRound, admitted: np.ndarray, s: Stream) -> None:
        """Before a prefill of the ``admitted`` slots writes output rows ``0 .. n - 1``, the feedback rows of the
        other active sequences there move to their slots' rows past the steps' (a copy enqueued now, its rows
        uploaded first)."""
        n, new = admitted.shape[0], set(admitted.tolist())
        keep = [slot for slot in r.seqs.order.tolist() if slot not in new and self._fed[slot] < n]
        if not keep:
            return
        step, io = r.steps.step, r.io
        dst = np.array(keep, np.int64) + self._parked
        step.write("row_src", self._fed[keep].astype(np.int32))
        step.write("row_dst", dst.astype(np.int32))
        step.upload(s)
        out = io.draft_hidden_states_out
        r.steps.row_copy(out, out, io.row_src, len(keep), self._row_bytes, io.row_dst).enqueue(s)
        self._fed[keep] = dst

    def _step_dims(self, r: DraftRound, b: int) -> InferenceDims:
        found = self._dims.get(b)
        if found is None:
            found = self._dims.put(b, r.draft.cfg.decode_dims(b))
        return found

    def _one(self, r: DraftRound, inputs_embeds: Any, b: int, stream: StreamLike) -> Any:
        x, nb, w = r.embeds(inputs_embeds, self.width, stream)
        if (nb, w) != (b, 1):
            raise ShapeError(f"inputs_embeds: a Gemma 4 assistant step takes one token a sequence, [batch={b}, 1, "
                             f"{self.width}] (the target's embedding of the pending or chosen token), got "
                             f"{list(x.shape)}")
        return x

    def _run(self, r: DraftRound, x: Any, committed: np.ndarray, slots: np.ndarray, key: tuple[int, ...],
             source: np.ndarray, src: Any, s: Stream) -> Tensor:
        """One assistant step of the sequences in ``slots`` (``committed`` tokens each in the target's KV): its
        hidden-state input gathered from ``src`` rows ``source`` (the seed, or the last step's output), the
        embeddings ``x``; the step's logits."""
        e, io = r.draft, r.io
        b = committed.shape[0]
        if int(committed.min()) < 1:
            raise TrtioError("a Gemma 4 assistant step needs each sequence's target KV non-empty (committed_len >= 1)")
        at = committed.astype(np.int32)
        layout = StepLayout(width=1, phase=PHASE_DECODE, query_start_offsets=ramp(b + 1), query_lengths=ramp(b, 0, 1),
                            past_lengths=at, attention_sequence_lengths=at,
                            state_indices=constant(slots.astype(np.int32)), logits_indices=ramp(b, dtype="i8"),
                            positions=at - 1)
        pages = r.seqs.step_rows("base", key)  # the target's rows: its pools are the assistant's
        dims = self._step_dims(r, b)
        r.steps.step.write("row_src", source.astype(np.int32))
        r.upload_embeds(x, s)
        work = r.steps.laid_out(e, layout, s, pages)
        gather: DeviceWork = r.steps.row_copy(io.draft_hidden_states_in, src, io.row_src, b, self._row_bytes)
        e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
        r.run(e, s, (gather, *work))
        self._fed[slots] = np.arange(b)
        logits: Tensor = io.output_logits
        return logits

    def prefill(self, r: DraftRound, pending: Prompt, inputs_embeds: Any, context_lengths: Any, slots: Any,
                prefix: Any, stream: StreamLike = None) -> Tensor:
        """Step 0 after the base prefill ``pending``: seeded from each prompt's last base row."""
        e, rows, past = r.draft, pending.rows, pending.past
        b = rows.shape[0]
        x = self._one(r, inputs_embeds, b, stream)
        ctx = r.check_lengths(context_lengths, b, pending.width, "context_lengths")
        check_draft_prompt(pending, ctx, slots, prefix, r.seqs, e)
        committed = ctx.astype(np.int64) if past is None else past + ctx
        seed = np.arange(b, dtype=np.int64) * pending.width + ctx - 1  # entry padding: row i * width + last
        s = r.step_stream(stream)
        self._park(r, rows, s)
        logits = self._run(r, x, committed, rows, tuple(rows.tolist()), seed, r.io.base_hidden_states, s)
        e.state.lengths[rows] = committed
        self._steps = 1
        return logits

    def propose(self, r: DraftRound, b: int, inputs_embeds: Any, parents: Any, limit: int,
                stream: StreamLike = None) -> Tensor:
        """Step ``k``: the chosen token's embedding, the last step's output hidden state."""
        if parents is not None:
            raise ShapeError("parents: a Gemma 4 assistant drafts a chain, one token a step (parents=None); a tree "
                             "(top-K > 1) is built from the steps' logits and verified by verify()")
        if self._steps >= limit:
            raise TrtioError(f"draft_propose: a round drafts {limit} steps (drafting_step); verify() comes next")
        x = self._one(r, inputs_embeds, b, stream)
        order, key, committed, _whole = r.step_lengths(r.draft)
        s = r.step_stream(stream)
        logits = self._run(r, x, committed, order, key, self._fed[order], r.io.draft_hidden_states_out, s)
        self._steps += 1
        return logits

    def accept(self, r: DraftRound, b: int, acc: np.ndarray, lens: list[int], rows: np.ndarray, inputs_embeds: Any,
               accept_lengths: Any, stream: StreamLike = None) -> Tensor:
        """Step 0 after ``accept`` committed paths of ``lens`` tokens (their base rows at ``rows``): seeded from
        each path's last node's base row."""
        e = r.draft
        x = self._one(r, inputs_embeds, b, stream)
        check_accept_lengths(accept_lengths, lens, b, max(lens), r.host_input, r.check_lengths)
        order, key, past, whole = r.step_lengths(e)
        committed = past + acc
        seed = seed_rows(rows, acc)
        s = r.step_stream(stream)
        logits = self._run(r, x, committed, order, key, seed, r.io.base_hidden_states, s)
        if whole:
            past += acc
        else:
            e.state.lengths[order] = committed
        self._steps = 1
        return logits
