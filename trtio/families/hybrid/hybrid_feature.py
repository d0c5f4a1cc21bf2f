"""A hybrid model's part of a setup (``docs/architecture.md``, "Hybrid models"): its slots' recurrent states.

At each step point: a prefill that starts sequences zeroes their state rows, or restores a prefix's snapshot into
them (:class:`~trtio.families.hybrid.recurrent.RecurrentStates`); a pinned prefix keeps a copy of its slot's rows
(all the slot holds: the states are those after its last token); a spec-decode base verifies chains (trees where it
was built as a tree base) and its accept commits the accepted token's states into each slot
(:class:`~trtio.families.hybrid.snapshots.IntermediateStates`, "snapshot" mode).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio.errors import ShapeError, TrtioError
from trtio.families.hybrid.hybrid_config import HybridConfig, recurrent_state_names
from trtio.families.hybrid.recurrent import RecurrentStates
from trtio.families.hybrid.snapshots import IntermediateStates, is_chain
from trtio.families.spec.spec_config import SpecConfig
from trtio.features import Feature, Held
from trtio.memory import MemoryReport
from trtio.setups.binding import BindContext, BoundEngine
from trtio.stream import Stream

__all__ = ["STATE_ROWS", "HybridFeature"]

#: The key under which a hybrid model's :class:`~trtio.pages.Prefix` holds its recurrent-state snapshot row (one
#: row of the setup's snapshot pool, held and given back like a page).
STATE_ROWS = "recurrent state"
_SPEC_PREFIX = ("pin_prefix: a speculative prefix keeps one token fewer than the slot holds, but a hybrid base's "
                "recurrent states are those after the slot's last token; prefixes of a hybrid spec-decode setup "
                "are not supported (start each sequence from its whole prompt)")


class HybridFeature(Feature):
    """The recurrent states of one hybrid engine of a setup (an LLM, or a spec-decode base): ``recurrent`` (the
    setup's attribute) is its :class:`~trtio.families.hybrid.recurrent.RecurrentStates`."""

    ATTRIBUTES = {"recurrent": None}

    def __init__(self, config: HybridConfig, tree_base: bool, states: IntermediateStates | None) -> None:
        self.config = config
        self.recurrent: RecurrentStates | None = None
        self._tree_base = tree_base
        self._states = states  # a spec-decode base's per-token verify states
        self._spec = False  # in a spec-decode setup (whose prefixes keep one token fewer than the slot holds)

    @classmethod
    def make(cls, config: Any, cfg: Any, role: str, ctx: BindContext, eio: Any) -> HybridFeature | None:
        if not config.layers:
            return None
        states = None
        if role == "base":  # entered before the base's executor, which binds them: closed after it
            # Rows for the longest step: the engine's output is [physical tokens, ...] in a prefill too.
            rows = ctx.io.max_batch * max(cfg.max_supported_input_length, cfg.max_verify_tree_size)
            states = ctx.stack.enter_context(IntermediateStates(cfg, rows, backend=ctx.backend))
        spec = cfg.feature(SpecConfig)
        return cls(config, spec is not None and spec.mtp_tree_base, states)

    def bound(self, engine: BoundEngine, ctx: BindContext) -> None:
        if self._states is not None:
            self._states.attach(engine.state.tensors, engine.tensor_map)
        pools = {past: engine.state.tensors[past] for past, _ in recurrent_state_names(engine.cfg)}
        self._spec = ctx.bundle is not None
        self.recurrent = ctx.stack.enter_context(RecurrentStates(
            pools, engine.state.max_batch, ctx.max_prefixes, backend=ctx.backend, stream=ctx.stream, name=engine.role))

    def prompt_work(self, rows: np.ndarray, past: Any, lengths: Any, checked: Any, new: bool,
                    prefixes: Any, stream: Stream) -> tuple[Any, ...]:
        """New sequences' state rows zeroed, or restored from their prefixes' snapshots."""
        if not new or self.recurrent is None:
            return ()
        sources = None if prefixes is None else [-1 if p is None else p.pages(STATE_ROWS)[0] for p in prefixes]
        return self.recurrent.admission(rows.tolist(), sources)

    def check_pin(self, what: str) -> None:
        if self._spec:
            raise TrtioError(_SPEC_PREFIX)

    def pin(self, slot: int, tokens: int, kept: int, have: int, what: str, stream: Stream) -> Held:
        """A copy of the slot's state rows, in a row of the snapshot pool; the prefix must be all the slot holds."""
        assert self.recurrent is not None
        if tokens != have:
            raise ShapeError(f"{what}: tokens = {tokens!r}, but slot {slot}'s sequence holds {have} tokens: on a "
                             f"hybrid model a prefix keeps the slot's recurrent states, which are those after its "
                             f"last token, so it pins all {have} of them (pin before decoding further)")
        row = self.recurrent.snapshot(slot, what, stream)
        return Held({STATE_ROWS: [row]}, {STATE_ROWS: self.recurrent.rows})

    def check_verify(self, parents: np.ndarray, real: np.ndarray) -> None:
        if self._states is not None and not self._tree_base and not is_chain(parents, real):
            raise ShapeError(f"verify: a hybrid base verifies a chain per sequence (node i's parent is node i - 1; one "
                             f"built with mtp_tree_base verifies trees), got parents {parents.tolist()}")

    def accept(self, slots: np.ndarray, rows: np.ndarray, stream: Stream) -> None:
        """The accepted node's states into each sequence's slot ("snapshot" mode)."""
        if self._states is not None:
            self._states.commit(slots, rows, stream)

    def reports(self) -> list[MemoryReport]:
        return [p.report() for p in (self._states, self.recurrent) if p is not None]
