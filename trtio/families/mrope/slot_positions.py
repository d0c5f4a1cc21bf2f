"""Each sequence slot's MRoPE positions: the rows of its cos/sin table and its position delta.

An MRoPE engine's RoPE rows come from ``io.mrope_cos_sin`` ``[slots, C, R]``: row ``k`` of a slot's table holds
the rotation of the token at cache position ``k`` (every step gathers its tokens' rows from there, or binds the
tables: the contract decides). A text-only sequence's rows are the plain table's (position ``k`` on all three
axes; :func:`~trtio._setups.binding.fill_mrope` writes them at setup). A prompt with images has 3-axis
positions (:func:`trtio.vision.mrope_positions`): a prefill given ``mrope_positions`` writes its tokens' rows
from them, and every later row ``k`` of the slot from the text position ``k + delta`` (``delta`` = the prompt's
highest position + 1 - its length, Edge-LLM's and Hugging Face's ``rope_deltas``), so decode steps continue
from the delta without any per-step work. A sequence admitted without positions into a slot another sequence
left rows in gets the plain rows back.

A slot also keeps a record of its sequence's positions (a :class:`~trtio._pages.PrefixPositions`: its delta, and the
delta after each row up to its last image's end), and a pinned prefix keeps the record of its tokens (the delta at
its end: text after row ``i`` starts at the highest position up to it, plus one, as Hugging Face's
``get_rope_index`` counts). A sequence started from the prefix gets text rows from the prefix's delta on, in
whatever slot, so it goes on as the same tokens prefilled whole would (cache position + ``rope_deltas``). Rows below
the prefix's tokens are never read again (their keys are cached, rotated): they are not copied.

The prompt's rows are computed on the host (:func:`trtio._rope.mrope_cos_sin_rows`) and uploaded through a
fenced pinned ring; the text rows are device copies from the plain table. Both run as device work just
before the prefill's engine (none if its binding fails).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from trtio._config import LLMEngineConfig
from trtio._cuda.backend import Backend
from trtio._lifetime import Closeable
from trtio._memory import Arena, MemoryReport
from trtio._ops import Copy2D
from trtio._pages import Prefix, PrefixPositions
from trtio._pipeline_io import PipelineIO
from trtio._rope import mrope_cos_sin_rows, no_rope_cos_sin_rows
from trtio._staging import UploadRing
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio.errors import ConfigError, ShapeError
from trtio.families.mrope.mrope_config import MropeConfig

__all__ = ["SlotPositions"]

# Uploads a prefill's rows may run ahead of the device before one waits for its slot of the ring.
_RING_SLOTS = 4


class _Upload:
    """Device work: host rows staged and copied to a byte offset of a tensor (a prefill's, never captured)."""

    __slots__ = ("staging", "table", "rows", "offset", "pitch")

    def __init__(self, staging: UploadRing, table: Tensor, rows: np.ndarray, offset: int, pitch: int) -> None:
        self.staging, self.table, self.rows, self.offset, self.pitch = staging, table, rows, offset, pitch

    def enqueue(self, stream: Stream) -> None:
        self.staging.upload_rows(self.rows, self.table, self.offset, self.pitch, stream)


class _Commit:
    """Device work that changes nothing on the device: once the rows' own work is enqueued (just before the
    engine's), the host's record of the slots' rows follows it."""

    __slots__ = ("apply",)

    def __init__(self, apply: Callable[[], None]) -> None:
        self.apply = apply

    def enqueue(self, stream: Stream) -> None:
        self.apply()


class SlotPositions(Closeable):
    """The MRoPE tables of a setup's slots (see module docstring): :meth:`check` a prefill's positions, then
    :meth:`prefill_work` the device work that writes its slots' rows. ``deltas`` holds each slot's position
    delta (0 for text). ``unsettled`` is True from the moment a prefill's work rewrote the rows of a sequence
    it continues until the setup calls :meth:`settle` (the prefill succeeded): a failure in between leaves
    rows the sequence's cache does not match. Owns a small pinned ring; follows the close protocol."""

    def __init__(self, io: PipelineIO, cfg: LLMEngineConfig, text_table: Tensor, backend: Backend) -> None:
        m = cfg.feature(MropeConfig)
        if m is None or not m.positions_per_axis:
            raise ConfigError("rope_scaling.mrope_section", "per-slot MRoPE tables need an MRoPE config")
        self._cfg = cfg
        self._table = io.mrope_cos_sin
        self._text = text_table
        self._cap = cfg.max_kv_cache_capacity
        self._row_bytes = cfg.rotary_dim * 4
        slots = self._table.shape[0]
        self.deltas = np.zeros(slots, np.int64)
        # Whether any of a slot's rows may differ from the plain table's (then an admission without positions
        # writes them back).
        self._custom = np.zeros(slots, bool)
        # Each slot's positions record (its delta, and the deltas at cuts before its last image): what a prefix of
        # its sequence keeps.
        self._records: list[PrefixPositions] = [_TEXT] * slots
        self.unsettled = False
        rows = max(cfg.max_supported_input_length, 1)
        self._init_lifetime("MRoPE slot tables")
        with contextlib.ExitStack() as stack:
            self._arena = stack.enter_context(Arena([UploadRing.request("host_mrope_rows", (rows, cfg.rotary_dim),
                                                                        "float32", slots=_RING_SLOTS)],
                                                    backend=backend, title="mrope rows"))
            self._staging = stack.enter_context(UploadRing(self._arena["host_mrope_rows"], backend,
                                                           slots=_RING_SLOTS, title="mrope rows staging"))
            self._resources = stack.pop_all()

    def _close_owned(self) -> None:
        self._resources.close()

    def report(self) -> MemoryReport:
        """The pinned ring the prompts' rows are uploaded through (the tables are the PipelineIO's)."""
        self._check_open()
        return self._arena.report()

    def settle(self) -> None:
        """The prefill whose work :meth:`prefill_work` made has run: its rows are its sequences'."""
        self.unsettled = False

    def check(self, positions: Any, batch: int, seq: int, ctx: np.ndarray,
              past: np.ndarray | None) -> np.ndarray | None:
        """A prefill's ``mrope_positions`` (int ``[3, batch, seq]``: each token's temporal, height and width
        positions; entries past a sequence's length ignored) as int64, or None; ShapeError naming the input."""
        if positions is None:
            return None
        arr = np.asarray(positions)
        if arr.shape != (3, batch, seq) or arr.dtype.kind not in "iu":
            raise ShapeError(f"mrope_positions: expected integer positions [3, batch={batch}, seq={seq}] (temporal, "
                             f"height, width per token), got {arr.dtype} {list(arr.shape)}")
        arr = arr.astype(np.int64)
        for i in range(batch):
            used = arr[:, i, :int(ctx[i])]
            if used.size and used.min() < 0:
                raise ShapeError(f"mrope_positions[:, {i}]: a negative position {int(used.min())}")
        return arr

    def record(self, slot: int, tokens: int) -> PrefixPositions:
        """Where the first ``tokens`` rows of ``slot``'s sequence leave the positions of a sequence continued after
        them (what a prefix of those tokens keeps: :attr:`~trtio._pages.Prefix.rope_delta` is its ``delta``)."""
        self._check_open()
        return _cut(self._records[slot], tokens)

    def prefill_work(self, slots: np.ndarray, past: np.ndarray | None, ctx: np.ndarray, positions: np.ndarray | None,
                     continuing: bool, prefixes: list[Prefix | None] | None = None) -> tuple[Any, ...]:
        """The device work that writes the rows of a prefill's sequences (``slots``, each ``ctx[i]`` new tokens
        after ``past[i]`` cached ones: a prefix's, or, ``continuing``, the sequence's own) before its engine runs:
        from ``positions`` where given; else a sequence started from a prefix (``prefixes[i]``, with its record of
        positions) gets text rows from the prefix's delta on (Hugging Face's cache position + ``rope_deltas``), a new
        sequence in a slot whose rows differ from the plain table gets the plain rows back, and a continued one keeps
        its rows (text continues from its delta)."""
        self._check_open()
        works: list[Any] = []
        updates: list[tuple[int, PrefixPositions, bool]] = []
        continued = False
        for i, slot in enumerate(slots.tolist()):
            start = 0 if past is None else int(past[i])
            n = int(ctx[i])
            prefix = None if prefixes is None else prefixes[i]
            origin = None if prefix is None else prefix.positions
            before = self._records[slot] if continuing else origin if origin is not None else _TEXT
            if positions is not None:
                delta = int(positions[:, i, :n].max()) + 1 - (start + n)
                works += self._prompt_rows(slot, start, positions[:, i, :n])
                works += self._text_rows(slot, start + n, delta)
                updates.append((slot, _extended(before, start, positions[:, i, :n], delta), True))
                continued = continued or continuing
            elif continuing:
                continue
            elif before.delta or self._custom[slot]:
                works += self._text_rows(slot, start, before.delta)
                # rows below start (the prefix's, never read again) keep what an earlier sequence left there
                updates.append((slot, before, bool(before.delta) or (start > 0 and bool(self._custom[slot]))))
            elif before is not self._records[slot]:  # the plain rows already: only the record changes
                updates.append((slot, before, False))
        if not updates:
            return ()

        def commit() -> None:
            for slot, record, custom in updates:
                self.deltas[slot] = record.delta
                self._records[slot] = record
                self._custom[slot] = custom
            self.unsettled = continued

        # The rows are taken as changed once their work may run (the engine may still fail after it).
        for slot, _record, _custom in updates:
            self._custom[slot] = True
        return (*works, _Commit(commit))

    def _prompt_rows(self, slot: int, start: int, positions: np.ndarray) -> list[Any]:
        cfg = self._cfg
        scaling = cfg.rope_scaling
        assert scaling is not None and scaling.mrope_section is not None
        if cfg.use_rope:
            rows = mrope_cos_sin_rows(positions, cfg.rotary_dim, cfg.rope_theta, scaling.mrope_section,
                                      interleaved=scaling.mrope_interleaved, scaling=scaling,
                                      max_position_embeddings=cfg.max_position_embeddings or None)
        else:  # no RoPE: every position's row is the identity (as the plain table's)
            rows = no_rope_cos_sin_rows(positions.shape[1], cfg.rotary_dim)
        offset = (slot * self._cap + start) * self._row_bytes
        return [_Upload(self._staging, self._table, rows, offset, self._row_bytes)]

    def _text_rows(self, slot: int, first: int, delta: int) -> list[Any]:
        """Rows ``first .. C - 1`` of ``slot``: text positions ``k + delta``, copied from the plain table where it
        has them (positions below C), computed on the host past it."""
        cap, rb = self._cap, self._row_bytes
        if first >= cap:
            return []
        base = self._table.data_ptr + slot * cap * rb
        copied_end = min(cap, cap - delta)  # cache rows whose position k + delta is a row of the plain table
        works: list[Any] = []
        if copied_end > first:
            src = first + delta
            width = (copied_end - first) * rb
            works.append(Copy2D(self._table.backend, base + first * rb, width, self._text.data_ptr + src * rb, width,
                                width, 1))  # one row of the whole block (CUDA's pitches must cover the width)
        if copied_end < cap:  # delta > 0: positions past the plain table
            lo = max(first, copied_end)
            pos = np.broadcast_to(np.arange(lo, cap, dtype=np.int64) + delta, (3, cap - lo))
            works += self._prompt_rows(slot, lo, np.ascontiguousarray(pos))
        return works


# A text-only sequence's record: every position is its cache position.
_TEXT = PrefixPositions()
_TEXT.cuts.flags.writeable = False


def _cut(record: PrefixPositions, tokens: int) -> PrefixPositions:
    """The record of the first ``tokens`` rows of a sequence whose rows ``record`` describes."""
    if tokens > record.cuts.shape[0]:
        return record  # past the cuts every row is text at k + delta
    if tokens <= 0:
        return _TEXT
    return _trimmed(int(record.cuts[tokens - 1]), record.cuts[:tokens])


def _extended(before: PrefixPositions, start: int, chunk: np.ndarray, delta: int) -> PrefixPositions:
    """The record of ``start`` rows that ``before`` describes followed by rows of the 3-axis positions ``chunk``
    ``[3, n]``, the last of which leaves ``delta``. Text after row ``i`` starts at the highest position up to it
    plus one (Hugging Face's ``get_rope_index``), so the delta after ``i + 1`` rows is that highest position
    minus ``i``."""
    head = before.cuts[:start]
    if head.shape[0] < start:  # rows past before's cuts: text at k + before.delta
        head = np.concatenate([head, np.full(start - head.shape[0], before.delta, np.int64)])
    highest = np.maximum.accumulate(chunk.max(axis=0))
    if start:
        highest = np.maximum(highest, int(head[-1]) + start - 1)
    rows = np.arange(start, start + chunk.shape[1], dtype=np.int64)
    return _trimmed(delta, np.concatenate([head, highest - rows]))


def _trimmed(delta: int, cuts: np.ndarray) -> PrefixPositions:
    """A record of ``delta`` and ``cuts`` less their trailing entries equal to ``delta`` (read-only, owned)."""
    differ = np.flatnonzero(cuts != delta)
    kept = cuts[:int(differ[-1]) + 1].astype(np.int64) if differ.size else np.zeros(0, np.int64)
    kept.flags.writeable = False
    return PrefixPositions(int(delta), kept)
