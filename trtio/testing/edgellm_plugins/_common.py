"""What every plugin model shares: the ragged metadata check, the paged-pool lookup and the error type.

Read from Edge-LLM 0.11's C++: ``cpp/plugins/utils/raggedPluginMetadata.h`` (``decodeRaggedPluginMetadata``,
``validateIndexedResidentStateDescriptors``) and ``cpp/common/pagedKvTypes.h`` (128 tokens a page, V page id =
K page id + pool pages). Nothing here is shared with ``trtio.testing.reference_math`` or the toy models: these
models are a second, independent reading of Edge-LLM's contract.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from trtio.errors import InvalidValueError

__all__ = ["TOKENS_PER_PAGE", "Phase", "PluginInputError", "Ragged", "mapped_slots", "ragged_metadata",
           "pool_slots", "resident_rows"]

TOKENS_PER_PAGE = 128


class PluginInputError(InvalidValueError):
    """An input a plugin's C++ refuses (``check::check`` fails, the enqueue returns non-zero), or one its kernels
    would silently mishandle (a page id outside the pool, a slot past the page table): the model raises where the
    real plugin would fail or compute garbage."""


class Phase(enum.IntEnum):
    """``rt::ExecutionPhase``: the extent of ``execution_phase_marker`` (``cpp/common/executionPhase.h``)."""

    CONTEXT_PREFILL = 1
    CONTEXT_CHUNK = 2
    AUTOREGRESSIVE_DECODE = 3
    SPEC_DRAFT_PROPOSAL = 4
    SPEC_TARGET_VERIFY = 5
    DIFFUSION_DENOISE = 6
    DIFFUSION_COMMIT = 7
    MIXED_PREFILL_DECODE = 8


@dataclass(frozen=True)
class Ragged:
    """One step's geometry: ``sequences`` rows of ``width`` physical tokens each (entry padding)."""

    phase: Phase
    sequences: int
    width: int
    context_sequences: int


def ragged_metadata(plugin: str, tokens: int, query_lengths: np.ndarray, query_start_offsets: np.ndarray,
                    phase_marker: np.ndarray, context_count: np.ndarray) -> Ragged:
    """``decodeRaggedPluginMetadata``: the checks every ragged plugin makes on its carriers' extents, plus the
    entry-padded offsets the runtime must write (``query_start_offsets[i] == i * W``)."""
    n, nctx, phase_extent = int(query_lengths.shape[0]), int(context_count.shape[0]), int(phase_marker.shape[0])
    where = f"(phase={phase_extent}, N={n}, Nctx={nctx}, T_exec={tokens})"

    def fail(reason: str) -> PluginInputError:
        return PluginInputError(f"{plugin} ragged metadata: {reason} {where}")

    if n <= 0 or tokens < n or query_start_offsets.shape[0] != n + 1:
        raise fail("invalid N/offset/T_exec relationship")
    if not 1 <= phase_extent <= 8:
        raise fail("phase extent must be in [1, 8]")
    if not 0 <= nctx <= n:
        raise fail("Nctx must be in [0, N]")
    phase = Phase(phase_extent)
    if phase is Phase.MIXED_PREFILL_DECODE:
        raise fail("phase 8 mixed prefill/decode is reserved but unsupported")
    if tokens % n:
        raise fail("entry-padded homogeneous execution requires T_exec divisible by N")
    context = phase in (Phase.CONTEXT_PREFILL, Phase.CONTEXT_CHUNK)
    if nctx != (n if context else 0):
        raise fail("homogeneous phase disagrees with Nctx")
    if phase is Phase.AUTOREGRESSIVE_DECODE and tokens != n:
        raise fail("ordinary decode requires one execution row per sequence")
    width = tokens // n
    want = np.arange(n + 1, dtype=np.int64) * width
    got = np.asarray(query_start_offsets, dtype=np.int64)
    if not np.array_equal(got, want):
        raise fail(f"query_start_offsets {got.tolist()} are not the entry-padded starts {want.tolist()} "
                   f"(sequence i starts at row i * {width})")
    lengths = np.asarray(query_lengths)
    bad = np.flatnonzero((lengths < 0) | (lengths > width))
    if bad.size:
        i = int(bad[0])
        raise fail(f"query_lengths[{i}] = {int(lengths[i])} is outside [0, {width}] (the padded width)")
    return Ragged(phase=phase, sequences=n, width=width, context_sequences=nctx)


def pool_slots(plugin: str, page_table: np.ndarray, sequence: int, slots: np.ndarray, pool_pages: int,
               what: str) -> tuple[np.ndarray, np.ndarray]:
    """The K and V rows (``[2 * pool_pages * 128]`` flattened pool) of ``slots`` of ``sequence``.

    The kernels resolve slot ``s`` through ``page_table[sequence, 0 | 1, s // 128]`` and skip a K id outside
    ``[0, P)`` or a V id outside ``[P, 2P)`` without a word (``applyRopeWriteKV.h``: "Unmapped and invalid ids
    skip the write"); a read of such a page is garbage. Either means the runtime presented a bad table, so this
    raises, naming the sequence, the slot and the id.
    """
    pages_per_seq = page_table.shape[2]
    column = slots // TOKENS_PER_PAGE
    beyond = np.flatnonzero(column >= pages_per_seq)
    if beyond.size:
        s = int(slots[beyond[0]])
        raise PluginInputError(f"{plugin}: {what} slot {s} of sequence {sequence} lies on page column "
                               f"{s // TOKENS_PER_PAGE}, past the page table's {pages_per_seq} columns")
    k_pages = page_table[sequence, 0, column].astype(np.int64)
    v_pages = page_table[sequence, 1, column].astype(np.int64)
    for plane, pages, lo, hi in (("K", k_pages, 0, pool_pages), ("V", v_pages, pool_pages, 2 * pool_pages)):
        bad = np.flatnonzero((pages < lo) | (pages >= hi))
        if bad.size:
            i = int(bad[0])
            raise PluginInputError(f"{plugin}: {what} slot {int(slots[i])} of sequence {sequence} maps to {plane} "
                                   f"page id {int(pages[i])}, outside [{lo}, {hi}) (the kernel skips it silently)")
    in_page = slots % TOKENS_PER_PAGE
    return k_pages * TOKENS_PER_PAGE + in_page, v_pages * TOKENS_PER_PAGE + in_page


def mapped_slots(plugin: str, page_table: np.ndarray, sequence: int, slots: np.ndarray, pool_pages: int,
                 what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A sparse table's view of ``slots`` of ``sequence`` (the bounded SWA pool's ``swa_kv_page_table``, where
    pages behind a window are unmapped): ``(K mapped [n] bool, K rows, V mapped, V rows)``.

    ``applyRopeFromPackedToSplitKernel`` and ``assemblePagedSWAChunkedPrefillFMHAKV`` treat a negative id as an
    unmapped page (the write is skipped, the gather yields zeros) and skip an id outside its plane just as silently;
    only the first is a state the runtime presents on purpose (``kUNUSED_PAGE_ENTRY``), so an id outside the pool,
    or a slot past the row's columns (the kernels index the table unchecked), raises. Rows of unmapped slots are 0.
    """
    pages_per_seq = page_table.shape[2]
    column = slots // TOKENS_PER_PAGE
    beyond = np.flatnonzero(column >= pages_per_seq)
    if beyond.size:
        s = int(slots[beyond[0]])
        raise PluginInputError(f"{plugin}: {what} slot {s} of sequence {sequence} lies on page column "
                               f"{s // TOKENS_PER_PAGE}, past the page table's {pages_per_seq} columns")
    out = []
    in_page = slots % TOKENS_PER_PAGE
    for plane, lo in (("K", 0), ("V", pool_pages)):
        pages = page_table[sequence, 0 if plane == "K" else 1, column].astype(np.int64)
        mapped = pages >= 0
        bad = np.flatnonzero(mapped & ((pages < lo) | (pages >= lo + pool_pages)))
        if bad.size:
            i = int(bad[0])
            raise PluginInputError(f"{plugin}: {what} slot {int(slots[i])} of sequence {sequence} maps to {plane} "
                                   f"page id {int(pages[i])}, outside [{lo}, {lo + pool_pages}) (the kernel skips it "
                                   "silently)")
        out += [mapped, np.where(mapped, pages * TOKENS_PER_PAGE + in_page, 0)]
    return out[0], out[1], out[2], out[3]


def resident_rows(plugin: str, state_indices: np.ndarray, sequences: int, rows: int) -> np.ndarray:
    """``validateIndexedResidentStateDescriptors``: ``state_indices`` is INT32 ``[N]``; each entry must name a row
    of the resident pool (the kernels index it unchecked) and no two sequences may share a row in one step."""
    if state_indices.shape != (sequences,):
        raise PluginInputError(f"{plugin} indexed resident state: state_indices must be INT32 [N={sequences}], "
                               f"got shape {list(state_indices.shape)}")
    idx = np.asarray(state_indices, dtype=np.int64)
    bad = np.flatnonzero((idx < 0) | (idx >= rows))
    if bad.size:
        i = int(bad[0])
        raise PluginInputError(f"{plugin}: state_indices[{i}] = {int(idx[i])} is outside the resident pool's "
                               f"{rows} rows")
    if np.unique(idx).size != idx.size:
        raise PluginInputError(f"{plugin}: state_indices {idx.tolist()} name one resident row twice in a step")
    return idx
