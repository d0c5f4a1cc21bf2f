"""A vision-language model's part of a setup (``docs/architecture.md``, "Vision-language models"): the per-slot MRoPE
tables and the deepstack features.

At bind, the slots' MRoPE tables get the plain (text) rows. A prefill checks and stages its ``deepstack_embeds``
(zeros for a text-only request, as Edge-LLM memsets them) and, in an LLM setup, its ``mrope_positions``: the slots'
rows are written before the step gathers them (:class:`~trtio.families.mrope.slot_positions.SlotPositions`); a pinned
prefix keeps the record of its tokens' positions; ``rope_deltas`` (the setup's attribute) are the slots' deltas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trtio._inputs import as_embeds, not_partly_over
from trtio._memory import MemoryReport
from trtio._setups.binding import BindContext, BoundEngine, rope_table_rows
from trtio._setups.calls import Calls
from trtio._stream import Stream, StreamLike
from trtio._tensor import Tensor
from trtio.errors import ShapeError
from trtio.families.mrope.mrope_config import MropeConfig
from trtio.families.mrope.slot_positions import SlotPositions
from trtio.features import Feature, Held

__all__ = ["MropeFeature"]

_ABSENT = {
    "mrope_positions": "mrope_positions: given, but the engine's RoPE is not MRoPE with sections (its config has no "
                       "rope_scaling.mrope_section)",
    "deepstack_embeds": "deepstack_embeds given but the config has num_deepstack_features = 0",
}


class MropeFeature(Feature):
    """MRoPE and deepstack on a setup's prefilling engine (an LLM, or a spec-decode base)."""

    PROMPT_INPUTS = ("mrope_positions", "deepstack_embeds")
    ATTRIBUTES = {"rope_deltas": None}

    def __init__(self, config: MropeConfig, role: str) -> None:
        self.config = config
        self._role = role
        self._positions: SlotPositions | None = None
        self._engine: BoundEngine | None = None
        self._io: Any = None
        self._calls: Calls | None = None
        self._backend: Any = None

    @classmethod
    def make(cls, config: Any, cfg: Any, role: str, ctx: BindContext, eio: Any) -> MropeFeature | None:
        return cls(config, role) if role != "draft" else None  # a draft shares its base's tables

    @classmethod
    def absent(cls, name: str) -> str:
        return _ABSENT[name]

    def bound(self, engine: BoundEngine, ctx: BindContext) -> None:
        self._engine, self._io, self._calls, self._backend = engine, ctx.io, ctx.calls, ctx.backend
        cfg = engine.cfg
        if self.config.mrope:  # every slot's table starts as text's: sequential positions
            ctx.io.mrope_cos_sin.copy_from(rope_table_rows(cfg, ctx.io.max_batch), ctx.stream)
        if self.config.positions_per_axis and self._role == "llm":
            # each slot's rows follow its prompt's 3-axis positions (prefill's mrope_positions)
            self._positions = ctx.stack.enter_context(SlotPositions(ctx.io, cfg, ctx.rope.get(cfg, ctx.stream),
                                                                    ctx.backend))

    def attribute(self, name: str) -> Any:
        return self._positions.deltas if self._positions is not None else None

    # -- a prefill ---------------------------------------------------------------------------------------------------
    def check_prompt(self, inputs: Mapping[str, Any], batch: int, seq: int, lengths: np.ndarray,
                     past: np.ndarray | None, stream: StreamLike = None) -> tuple[Any, Any, int]:
        """The prefill's 3-axis positions and deepstack features, checked (each None where not given)."""
        positions = inputs.get("mrope_positions")
        if positions is not None and self._positions is None:
            raise ShapeError(_ABSENT["mrope_positions"])
        checked = None if self._positions is None else self._positions.check(positions, batch, seq, lengths, past)
        return checked, self._deepstack(inputs.get("deepstack_embeds"), batch, seq, stream), seq

    def _deepstack(self, features: Sequence[Any] | None, b: int, seq: int, stream: StreamLike) -> list[Any] | None:
        """A prefill's deepstack features (Qwen3-VL), checked ([b, seq, hidden] each, one per feature) and
        converted."""
        n = self.config.num_deepstack
        io, e = self._io, self._engine
        assert e is not None
        if not n:
            if features:
                raise ShapeError(_ABSENT["deepstack_embeds"])
            return None
        if features is None:
            return None
        if len(features) != n:
            raise ShapeError(f"deepstack_embeds: expected {n} arrays, got {len(features)}")
        out = []
        for i, f in enumerate(features):
            x = as_embeds(f, f"deepstack_embeds[{i}]", io.inputs_embeds.dtype, e.cfg.hidden_size, self._backend,
                          stream)
            if tuple(x.shape[:2]) != (b, seq):
                raise ShapeError(f"deepstack_embeds[{i}]: expected [batch={b}, seq={seq}, hidden], got "
                                 f"{list(x.shape)}")
            if isinstance(x, Tensor):
                not_partly_over(x, f"deepstack_embeds[{i}]", io.deepstack_embeds[i], f"io.deepstack_embeds[{i}]")
            out.append(x)
        return out

    def prompt_work(self, rows: np.ndarray, past: np.ndarray | None, lengths: np.ndarray,
                    checked: tuple[Any, Any, int], new: bool, prefixes: Any, stream: Stream) -> tuple[Any, ...]:
        """The deepstack buffers filled and bound (zeros without features); the slots' MRoPE rows written (device
        work, before the step gathers them)."""
        positions, features, seq = checked
        self._bind_deepstack(features, rows.shape[0], seq, stream)
        if self._positions is None:
            return ()
        return self._positions.prefill_work(rows, past, lengths, positions, not new, prefixes)

    def _bind_deepstack(self, features: list[Any] | None, b: int, seq: int, s: Stream) -> None:
        n = self.config.num_deepstack
        e, io, calls = self._engine, self._io, self._calls
        assert e is not None and calls is not None
        if not n:
            return
        views = [t.reshape((b, seq, e.cfg.hidden_size)) for t in io.deepstack_embeds]
        if features is None:
            for v in views:
                v.zero_(s)  # text-only request: Edge-LLM memsets the feature buffers
        else:
            for v, f in zip(views, features):
                calls.read(f)
                v.copy_from(f, s)
        e.tensor_map.use_deepstack_features()

    def prompt_done(self, ok: bool) -> str | None:
        positions = self._positions
        if positions is None:
            return None
        unsettled = positions.unsettled
        positions.settle()
        if not ok and unsettled:
            return ("a prefill that continued sequences with new MRoPE positions failed after writing their position "
                    "rows")
        return None

    # -- prefixes ----------------------------------------------------------------------------------------------------
    def pin(self, slot: int, tokens: int, kept: int, have: int, what: str, stream: Stream) -> Held | None:
        """The record of the prefix's tokens' positions (its delta, which a sequence started from it goes on
        from)."""
        if self._positions is None:
            return None
        return Held(positions=self._positions.record(slot, kept))

    def reports(self) -> list[MemoryReport]:
        return [self._positions.report()] if self._positions is not None else []
