"""InferenceDims: the per-step dimensions every binding shape is resolved from.

Recipes on the config (``cfg.prefill_dims(...)``, ``cfg.decode_dims(...)`` ...: its :class:`StepShapes`, which
:class:`~trtio._config.LLMEngineConfig` asks) build them, as in Edge-LLM; a registry's symbolic shapes are resolved
against them, so a binding's shape comes from one place.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields

from trtio._checks import is_int
from trtio._hashing import hash_once
from trtio.errors import ShapeError

__all__ = ["InferenceDims", "SHAPE_CARRIER_DIMS", "StepShapes"]

# Dimensions where 0 is meaningful: a [0]-shaped binding carries information by its shape
# (kvcache_start_index [0] = empty-cache prefill, the phase marker, ...).
SHAPE_CARRIER_DIMS = frozenset({
    "context_mask_selector_len", "start_index_len", "spec_verify_phase_len", "skip_softmax_scale_len",
    "context_seq_len",
})


@hash_once
@dataclass(frozen=True)
class InferenceDims:
    """Immutable per-step dimensions (Edge-LLM's ``InferenceDims``, snake_case)."""

    batch: int
    seq_len: int
    kv_len: int
    select_len: int
    attn_mask_seq_len: int
    rope_batch: int
    packed_mask_len: int
    context_mask_selector_len: int
    start_index_len: int
    spec_verify_phase_len: int
    skip_softmax_scale_len: int
    # Token-major ("ragged") contract: rows = batch * seq_len (entry padding), logits rows = batch * select_len.
    query_offsets_len: int = 0  # batch + 1 (query_start_offsets)
    execution_phase_len: int = 0  # the phase, carried by execution_phase_marker's extent (1..5)
    context_seq_len: int = 0  # prefill sequences in the step (context_sequence_count_carrier), 0 in generation
    # A vision encoder's step (trtio.components.visual.vit): its patches, merged tokens, cu_seqlens entries (frames +
    # 1),
    # cu_window_seqlens entries (windows + 1) and the shape-only max_seqlen_carrier's extent.
    vit_patches: int = 0
    vit_tokens: int = 0
    vit_frames_p1: int = 0
    vit_windows_p1: int = 0
    vit_max_seqlen: int = 0
    # An audio encoder's step (trtio.components.audio): its mel chunks and its rows (tokens after the convolutions).
    audio_chunks: int = 0
    audio_tokens: int = 0

    def __post_init__(self) -> None:
        for name in _FIELD_ORDER:
            v = getattr(self, name)
            if type(v) is not int:  # a NumPy integer is stored as the int it is
                if not is_int(v):
                    raise ShapeError(f"InferenceDims.{name} must be an int, got {v!r}")
                v = int(v)
                object.__setattr__(self, name, v)
            if v < 0:
                raise ShapeError(f"InferenceDims.{name} must not be negative, got {v}")

    def check(self, members: Iterable[str]) -> None:
        """Refuse 0 in any referenced member that is not a shape carrier."""
        for name in members:
            if name not in _FIELD_NAMES:
                raise ShapeError(f"InferenceDims has no member {name!r}")
            if getattr(self, name) == 0 and name not in SHAPE_CARRIER_DIMS:
                raise ShapeError(
                    f"InferenceDims.{name} is 0 but a binding uses it; only "
                    f"{sorted(SHAPE_CARRIER_DIMS)} may be 0 (was a recipe bypassed?)")

    def replace(self, **changes: int) -> InferenceDims:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        unknown = set(changes) - set(values)
        if unknown:
            raise ShapeError(f"InferenceDims has no member(s) {sorted(unknown)}")
        values.update(changes)
        return InferenceDims(**values)

    def __str__(self) -> str:
        return "InferenceDims(" + ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self)) + ")"


_FIELD_ORDER = tuple(f.name for f in fields(InferenceDims))
_FIELD_NAMES = frozenset(_FIELD_ORDER)


@dataclass(frozen=True)
class StepShapes:
    """The InferenceDims of each kind of step an LLM engine config allows (Edge-LLM's llmEngineConfig.cpp
    recipes), from the config's limits: what :class:`~trtio._config.LLMEngineConfig` offers as methods (its
    ``step_shapes``). ``rope_per_slot``: each sequence has its own RoPE table (MRoPE), so a step's rope batch is its
    batch."""

    max_supported_batch_size: int
    max_supported_input_length: int
    max_kv_cache_capacity: int
    max_verify_tree_size: int
    max_draft_tree_size: int
    rope_per_slot: bool = False

    def _rope_batch(self, batch: int) -> int:
        return batch if self.rope_per_slot else 1

    def _check_batch(self, batch: int) -> None:
        if not is_int(batch) or not 1 <= batch <= self.max_supported_batch_size:
            raise ShapeError(f"batch must be an int in 1..{self.max_supported_batch_size} "
                             f"(max_supported_batch_size), got {batch!r}")

    @staticmethod
    def _check_len(what: str, value: int, limit: int, limit_name: str) -> None:
        if not is_int(value) or not 1 <= value <= limit:
            raise ShapeError(f"{what} must be an int in 1..{limit} ({limit_name}), got {value!r}")

    def _dims(self, batch: int, seq: int, select: int, attn: int, start: int, *, execution_phase: int,
              phase: int = 0, rope_batch: int | None = None) -> InferenceDims:
        context = batch if execution_phase in (1, 2) else 0  # the ragged contract's prefill sequences
        return InferenceDims(
            batch=batch, seq_len=seq, kv_len=self.max_kv_cache_capacity, select_len=select,
            attn_mask_seq_len=attn, rope_batch=self._rope_batch(batch) if rope_batch is None else rope_batch,
            packed_mask_len=math.ceil(attn / 32), context_mask_selector_len=0, start_index_len=start,
            spec_verify_phase_len=phase, skip_softmax_scale_len=0, query_offsets_len=batch + 1,
            execution_phase_len=execution_phase, context_seq_len=context)

    def prefill_dims(self, batch: int, seq_len: int, kv_cache_empty: bool = True) -> InferenceDims:
        """Prompt step: ``seq_len`` tokens per sequence, one logits row each, causal mask (phase 1, or 2
        after a restored prefix)."""
        self._check_batch(batch)
        self._check_len("seq_len", seq_len, self.max_supported_input_length, "max_supported_input_length")
        return self._dims(batch, seq_len, 1, 1, 0 if kv_cache_empty else batch,
                          execution_phase=1 if kv_cache_empty else 2)

    def decode_dims(self, batch: int) -> InferenceDims:
        """One token per sequence after the cached ones (phase 3)."""
        self._check_batch(batch)
        return self._dims(batch, 1, 1, 1, batch, execution_phase=3)

    def spec_verify_dims(self, batch: int, verify_size: int) -> InferenceDims:
        """Base verify over a tree of ``verify_size`` nodes: logits for every node (phase 5)."""
        self._check_batch(batch)
        self._check_len("verify_size", verify_size, self.max_verify_tree_size, "max_verify_tree_size")
        return self._dims(batch, verify_size, verify_size, verify_size, batch, phase=1, execution_phase=5)

    def proposal_dims(self, batch: int, proposal_size: int, top_k: int) -> InferenceDims:
        """Draft proposal over a tree of ``proposal_size`` rows, ``top_k`` logits rows per sequence (phase 4;
        3 when one row wide)."""
        self._check_batch(batch)
        self._check_len("proposal_size", proposal_size, self.max_draft_tree_size, "max_draft_tree_size")
        self._check_len("top_k", top_k, proposal_size, "proposal_size")
        return self._dims(batch, proposal_size, top_k, proposal_size, batch,
                          execution_phase=4 if proposal_size > 1 else 3)

    def accept_dims(self, batch: int, accept_len: int) -> InferenceDims:
        """Draft catch-up over ``accept_len`` accepted tokens; one logits row per sequence (phase 4; 3 when
        one row wide)."""
        self._check_batch(batch)
        self._check_len("accept_len", accept_len, max(self.max_draft_tree_size, 1), "max_draft_tree_size")
        return self._dims(batch, accept_len, 1, accept_len, batch, execution_phase=4 if accept_len > 1 else 3)

    def reset_dims(self) -> InferenceDims:
        """Graph teardown: the smallest valid shapes (rope batch 1 even for MRoPE)."""
        return self._dims(1, 1, 1, 1, 1, rope_batch=1, execution_phase=1)
