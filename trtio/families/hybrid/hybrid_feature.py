"""A hybrid model's part of a setup (``docs/architecture.md``, "Hybrid models"): its slots' recurrent states.

At each step point: a prefill that starts sequences zeroes their state rows, or restores a prefix's snapshot into
them (:class:`~trtio.families.hybrid.recurrent.RecurrentStates`); a pinned prefix keeps a copy of its slot's rows
(all the slot holds: the states are those after its last token); a spec-decode base verifies chains (trees where it
was built as a DDTree base) and its accept commits the accepted path's states into each slot
(:class:`~trtio.families.hybrid.snapshots.IntermediateStates`: the last node's states copied, "snapshot" mode, or a
Gated DeltaNet DDTree base's replay stash replayed along the path, :mod:`trtio.families.hybrid.replay`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio._memory import MemoryReport
from trtio._setups.binding import BindContext, BoundEngine
from trtio._stream import Stream
from trtio.errors import ShapeError, TrtioError
from trtio.families.hybrid.hybrid_config import HybridConfig, recurrent_state_names
from trtio.families.hybrid.recurrent import RecurrentStates
from trtio.families.hybrid.replay import tree_problem
from trtio.families.hybrid.snapshots import IntermediateStates, is_chain
from trtio.families.spec.spec_config import SpecConfig
from trtio.features import Feature, Held

__all__ = ["STATE_ROWS", "HybridFeature"]

#: The key under which a hybrid model's :class:`~trtio._pages.Prefix` holds its recurrent-state snapshot row (one
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
        self._fits: tuple[Any, str | None] | None = None  # the last tree checked against the replay's limits

    @classmethod
    def make(cls, config: Any, cfg: Any, role: str, ctx: BindContext, eio: Any) -> HybridFeature | None:
        if not config.layers:
            return None
        states = None
        spec = cfg.feature(SpecConfig)
        tree_base = spec is not None and spec.tree_base
        if role == "base":  # entered before the base's executor, which binds them: closed after it
            # Rows for the longest step: the engine's output is [physical tokens, ...] in a prefill too.
            rows = ctx.io.max_batch * max(cfg.max_supported_input_length, cfg.max_verify_tree_size)
            # A Gated DeltaNet DDTree base's recurrent rows hold a replay stash (HybridConfig.check_runs
            # refused a Mamba2 DDTree base)
            states = ctx.stack.enter_context(IntermediateStates(
                cfg, rows, backend=ctx.backend, replay=tree_base and config.recurrent_kind == "gated_deltanet",
                max_batch=ctx.io.max_batch))
        return cls(config, tree_base, states)

    def bound(self, engine: BoundEngine, ctx: BindContext) -> None:
        if self._states is not None:
            self._states.attach(engine.state.tensors, engine.tensor_map, ctx.stream)
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
        if self._states is None:
            return
        if not self._tree_base and not is_chain(parents, real):
            raise ShapeError(f"verify: a hybrid base verifies a chain per sequence (node i's parent is node i - 1; one "
                             f"built with mtp_tree_base or dflash_tree_base verifies trees), got parents "
                             f"{parents.tolist()}")
        if self._states.replay is not None:
            fits = self._fits
            if fits is None or fits[0] is not parents:  # a runtime's trees repeat: each checked once
                fits = self._fits = (parents, tree_problem(parents, real))
            if fits[1] is not None:
                raise ShapeError(f"verify: a Gated DeltaNet base built as a DDTree base cannot verify this tree: "
                                 f"{fits[1]}")

    def accept(self, slots: np.ndarray, rows: np.ndarray, lengths: np.ndarray, nodes: int, stream: Stream) -> None:
        """The accepted paths' states into each sequence's slot: the last node's copied ("snapshot" mode), or a Gated
        DeltaNet DDTree base's replayed along the path."""
        if self._states is not None:
            self._states.commit(slots, rows, lengths, nodes, stream)

    def reports(self) -> list[MemoryReport]:
        parts = (self._states, self._states.replay if self._states is not None else None, self.recurrent)
        return [p.report() for p in parts if p is not None]
