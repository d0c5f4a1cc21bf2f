"""InferenceDims: the per-step dimensions every binding shape is resolved from.

Recipes on the config (``cfg.prefill_dims(...)``, ``cfg.decode_dims(...)`` ...) build them, as in
Edge-LLM; a registry's symbolic shapes are resolved against them, so a binding's shape comes
from one place.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from trtio._checks import is_int
from trtio._hashing import hash_once
from trtio.errors import ShapeError

__all__ = ["InferenceDims", "SHAPE_CARRIER_DIMS"]

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
    # A vision encoder's step (trtio.vit): its patches, merged tokens, cu_seqlens entries (frames + 1),
    # cu_window_seqlens entries (windows + 1) and the shape-only max_seqlen_carrier's extent.
    vit_patches: int = 0
    vit_tokens: int = 0
    vit_frames_p1: int = 0
    vit_windows_p1: int = 0
    vit_max_seqlen: int = 0

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
