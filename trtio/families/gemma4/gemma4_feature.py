"""Gemma 4's part of a bound LLM engine (:class:`~trtio.features.Feature`): the full layers' RoPE table, the
bounded SWA window's page rows staged with each step, the per-layer embeddings a step takes (``ple_embeds=``) and
the refusals Edge-LLM 0.11's engine calls for (a cached-prefix step over Q-only KV-sharing layers, a prefix of a
bounded window).

The engine state keeps the SWA mode and the bounded pool's page book it bound
(:meth:`~trtio.families.gemma4.gemma4_config.Gemma4Config.kv_pools`: ``kv_parts["swa_mode"]`` and
``kv_parts["swa_pages"]``); this part advances the book before each step's inputs are staged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio._engine import DeviceWork
from trtio._setups.binding import BindContext, BoundEngine
from trtio._setups.calls import Calls
from trtio._setups.decode_plan import DecodePlan
from trtio._stream import Stream
from trtio.errors import InvalidValueError
from trtio.families.gemma4.gemma4_config import (
    GEMMA4_FULL_TABLE,
    SWA_TABLE,
    Gemma4Config,
    check_cached_prefix_step,
)
from trtio.families.gemma4.ple import PleInputs, PleSplit
from trtio.families.gemma4.swa import BoundedSwaPages, SwaMode, swa_room
from trtio.features import Feature, Ready

__all__ = ["Gemma4Feature"]


class Gemma4Feature(Feature):
    """Gemma 4's part of an LLM engine (see the module docstring)."""

    STEP_INPUT = "ple_embeds"

    def __init__(self, g: Gemma4Config, ctx: BindContext) -> None:
        self._g = g
        self._io = ctx.io
        self._ple = PleInputs(ctx.io, g, ctx.backend)  # ple_embeds -> the layers' inputs
        self._role = "llm"
        self._mode: SwaMode | None = None  # bound where the engine has the SWA inputs
        self._pages: BoundedSwaPages | None = None  # the bounded mode's page book

    @classmethod
    def make(cls, config: Any, cfg: Any, role: str, ctx: Any, eio: Any) -> Gemma4Feature:
        return cls(config, ctx)

    @classmethod
    def absent(cls, name: str) -> str:
        return f"{name}: given, but the engine has no per-layer embedding inputs (ple_token_embeds_i)"

    def bound(self, engine: BoundEngine, ctx: BindContext) -> None:
        """The full layers' RoPE table (``full_rope_config``: proportional or not), which the steps gather from; the
        SWA mode and page book the engine state bound."""
        ctx.io.member(GEMMA4_FULL_TABLE).copy_from(self._g.full_rope_rows(engine.cfg), ctx.stream)
        self._role = engine.role
        self._mode = engine.state.kv_parts.get("swa_mode")
        self._pages = engine.state.kv_parts.get("swa_pages")

    # -- prefills ----------------------------------------------------------------------------------------------------
    def check_past(self, past: np.ndarray, what: str) -> None:
        check_cached_prefix_step(self._g, self._mode is not None, past, what)

    def stage(self, engine: Any, slots: np.ndarray | None, past: np.ndarray, lengths: np.ndarray, new: bool) -> None:
        """The bounded SWA pool: each step sequence's window advanced to the step's end (a new sequence reserving
        its pages first) and the step's rows staged (:class:`~trtio.families.gemma4.swa.BoundedSwaPages`)."""
        pages = self._pages
        if pages is None:
            return
        sl = np.arange(past.shape[0]) if slots is None else slots
        for slot, start, n in zip(sl.tolist(), past.tolist(), lengths.tolist()):
            if new or slot not in pages:
                if slot in pages:
                    pages.release(slot)
                pages.admit(slot)
            pages.advance(slot, int(start) + int(n))
        step = self._io.step
        assert step is not None
        step.write(SWA_TABLE, pages.rows(sl))

    # -- the per-layer embeddings a step takes (trtio.features.StepInput) --------------------------------------------
    def prepare(self, value: Any, inputs_embeds: Any, ready: Ready, *, now: bool = False) -> PleSplit | None:
        return self._ple.prepare(value, inputs_embeds, ready, now=now)

    def steady(self, plan: DecodePlan, value: Any, inputs_embeds: Any, stream: Stream,
               calls: Calls) -> tuple[bool, bool]:
        return self._ple.steady(plan, value, inputs_embeds, stream, calls)

    def plan_work(self, work: tuple[DeviceWork, ...], split: PleSplit) -> tuple[DeviceWork, ...]:
        return self._ple.plan_work(work, split)

    # -- decodes, prefixes, releases ---------------------------------------------------------------------------------
    def decode_room(self, lengths: np.ndarray) -> int | None:
        """Planned decodes until a bounded window gains or retires a page (its rows change)."""
        return None if self._pages is None else swa_room(self._pages, lengths)

    def check_pin(self, what: str) -> None:
        if self._pages is not None:  # a prefix of a bounded window has lost the pages behind it (Edge-LLM: full mode)
            raise InvalidValueError(f"pin_prefix: engine {self._role!r} keeps only a sliding window of KV in the "
                                    "bounded SWA pool, so a prefix cannot be reused; prefix reuse needs the full SWA "
                                    "mode (an engine built without the bounded pool)")

    def release(self, slots: Any) -> None:
        """The released sequences' window pages go back to the bounded pool."""
        pages = self._pages
        if pages is None:
            return
        for slot in slots:
            if slot in pages:
                pages.release(slot)
