"""A setup's sequences: which slots are active, how long each is, and the KV pages of each engine.

On a slotted contract (Edge-LLM 0.11's ragged one) a step runs any subset of the sequence slots: a
prefill admits new sequences into free slots while the others keep their KV, a decode runs the active
slots (or some), ``release`` ends sequences and gives their pages back. Each engine's pool hands pages
out on demand (:mod:`trtio._pages`), so a step first plans the pages its sequences will write, and raises
:class:`~trtio.errors.CapacityError` before anything is enqueued when the pool is short. On the batch
contract every step is a whole-batch step over slots ``0 .. n - 1``.

Every misuse is refused before any work, naming the slot: a slot out of range or given twice, a prefill
into an active slot (without ``past_lengths``), a decode or release of a free slot, a row count that
differs from the slots, a prefix longer than its sequence, of another setup or already released.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._cache import BoundedCache
from trtio._checks import is_int
from trtio._ops import copy_pages
from trtio._pages import PagePool, PageTable, Prefix, PrefixReturns, StepPages
from trtio._setups.binding import BoundEngine
from trtio._stream import Stream
from trtio.errors import ShapeError, TrtioError
from trtio.features import FeatureSet

__all__ = ["KVPages", "Sequences"]


@dataclass(frozen=True)
class KVPages:
    """A pool's pages: ``total`` and ``free`` (neither a sequence nor a prefix holds them), at the time read."""

    total: int
    free: int

    @property
    def used(self) -> int:
        return self.total - self.free


class Sequences:
    """The sequence slots of a setup and, on a slotted contract, each engine's page table (see module
    docstring). ``engines``: the setup's engines (``llm``, or ``base`` and ``draft``); ``prefix_lag``: KV
    entries a pinned prefix keeps fewer than asked (a speculative draft's last entry depends on the token
    after it, so a speculative prefix keeps one entry fewer); ``features``: the setup's features (a prefix keeps
    what each needs of its slot beside the pages: a hybrid's recurrent-state snapshot)."""

    def __init__(self, engines: Sequence[BoundEngine], max_batch: int, *, prefix_lag: int = 0,
                 features: FeatureSet | None = None) -> None:
        self._owner = object()  # what a Prefix of these sequences names as its maker (not the setup: no cycle)
        self._engines = {e.role: e for e in engines}
        self.max_batch = max_batch
        self.slotted = all(e.contract.slotted and e.state.pages_on_demand for e in engines)
        self._lag = prefix_lag
        # Plain Python per slot, kept up to date in place: releasing or admitting one sequence is a few list
        # and tuple operations; the order's array is made once per set of active slots.
        self._active = [False] * max_batch
        self._order_key: tuple[int, ...] = ()  # the active slots, ascending
        self._order = np.zeros(0, np.int64)  # the same, as a read-only array for the steps
        self._order.flags.writeable = False
        self._orders: BoundedCache[tuple[int, ...], np.ndarray] = BoundedCache()
        self._contiguous = True  # the active slots are 0 .. n - 1
        self.tables: dict[str, PageTable] = {}
        if self.slotted:
            for e in engines:
                st = e.state
                self.tables[e.role] = PageTable(PagePool(st.pool_pages), max_batch, st.pages_per_sequence,
                                                st.page_size, e.role)
        self._role = engines[0].role  # the engine whose pool kv_pages reports (the LLM's, or the base's)
        self._features = features if features is not None else FeatureSet()

    # -- what is active ------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return int(self._order.shape[0])

    @property
    def order(self) -> np.ndarray:
        """The active slots, ascending (int64, read-only)."""
        return self._order

    @property
    def order_key(self) -> tuple[int, ...]:
        return self._order_key

    @property
    def contiguous(self) -> bool:
        """Whether the active slots are ``0 .. n - 1`` (a step over all of them then views the lengths)."""
        return self._contiguous

    def is_active(self, slot: int) -> bool:
        return self._active[slot]

    def _set_order(self, key: tuple[int, ...]) -> None:
        """The active slots are now ``key`` (ascending; ``_active`` says the same)."""
        order = self._orders.get(key)
        if order is None:
            order = np.array(key, np.int64)
            order.flags.writeable = False
            self._orders.put(key, order)
        self._order_key = key
        self._order = order
        self._contiguous = not key or key[-1] == len(key) - 1

    def kv_pages(self) -> KVPages:
        """The LLM's (or the base's) pool."""
        if not self.slotted:
            raise TrtioError("kv_pages: KV pages are handed out on the ragged contract (Edge-LLM 0.11's paged pools); "
                             "this setup's engines keep contiguous caches per sequence")
        pool = self.tables[self._role].pool
        return KVPages(pool.total, pool.free)

    def pool(self, role: str) -> KVPages:
        pool = self.tables[role].pool
        return KVPages(pool.total, pool.free)

    # -- checks ----------------------------------------------------------------------------------------
    def refuse_unslotted(self, what: str, **given: Any) -> None:
        """On the batch contract, ``slots=`` or ``prefix=`` (or a slot call) is a TrtioError naming the ragged
        contract."""
        if self.slotted:
            return
        named = [k for k, v in given.items() if v is not None]
        if named or not given:
            args = ", ".join(f"{k}=" for k in named) or what
            raise TrtioError(f"{what}: {args} needs the ragged contract (Edge-LLM 0.11 engines: any subset of "
                             f"slots per step, KV pages on demand); these engines speak the batch contract, whose "
                             f"steps are whole-batch steps over contiguous caches")

    def slot_list(self, slots: Any, what: str) -> list[int]:
        """``slots`` as distinct slot ids (Python ints) in range, in the order given."""
        if type(slots) is list and len(slots) == 1 and type(slots[0]) is int and 0 <= slots[0] < self.max_batch:
            return [slots[0]]  # the common call (one slot, a plain int): nothing more to check
        if (isinstance(slots, (str, bytes, Set, Mapping)) or not hasattr(slots, "__len__")
                or (isinstance(slots, np.ndarray) and slots.ndim != 1)):
            raise ShapeError(f"{what}: slots must be a list of slot ids, "
                             f"got {type(slots).__name__} {slots!r}")
        out = []
        for i, v in enumerate(slots):
            if type(v) is not int:  # a plain int needs no more than the range check
                if not is_int(v):
                    raise ShapeError(f"{what}: slots[{i}] = {v!r} is not a slot id (an int)")
                v = int(v)
            if not 0 <= v < self.max_batch:
                raise ShapeError(f"{what}: slot {v} is out of range 0..{self.max_batch - 1}")
            out.append(v)
        if len(set(out)) != len(out):
            twice = next(v for v in out if out.count(v) > 1)
            raise ShapeError(f"{what}: slot {twice} is given twice")
        if not out:
            raise ShapeError(f"{what}: no slot given")
        return out

    def step_slots(self, slots: Any, rows: int, what: str) -> tuple[np.ndarray, tuple[int, ...]]:
        """The slots a decode-type step runs: ``None`` is every active slot, ascending; a list must name
        active slots, one per row of the step's inputs (``rows``)."""
        if slots is None:
            if self.count == 0:
                raise TrtioError(f"{what}: no sequence is active (prefill first)")
            if rows != self.count:
                raise ShapeError(f"inputs_embeds: {rows} rows for the {self.count} active slots "
                                 f"{list(self._order_key)}")
            return self._order, self._order_key
        self.refuse_unslotted(what, slots=slots)
        given = self.slot_list(slots, what)
        free = [v for v in given if not self._active[v]]
        if free:
            raise TrtioError(f"{what}: slot {free[0]} is free (no sequence there to continue)")
        if len(given) != rows:
            raise ShapeError(f"inputs_embeds: {rows} rows for the {len(given)} slots {given}")
        return np.array(given, np.int64), tuple(given)

    def prefill_slots(self, slots: Any, rows: int, *, continuing: bool, what: str) -> np.ndarray:
        """The slots a prefill of ``rows`` sequences writes: ``None`` is slots ``0 .. rows - 1`` (the batch
        restarts; with ``continuing`` those must hold the sequences to continue); a list admits new sequences
        into free slots (or continues active ones, with ``continuing``)."""
        if not 1 <= rows <= self.max_batch:
            raise ShapeError(f"inputs_embeds: batch {rows} is outside 1..{self.max_batch}")
        if slots is None:
            return np.arange(rows, dtype=np.int64)
        self.refuse_unslotted(what, slots=slots)
        given = self.slot_list(slots, what)
        if len(given) != rows:
            raise ShapeError(f"inputs_embeds: {rows} rows for the {len(given)} slots {given}")
        if continuing:
            free = [v for v in given if not self._active[v]]
            if free:
                raise TrtioError(f"{what}: slot {free[0]} is free; past_lengths continues active sequences")
        else:
            busy = [v for v in given if self._active[v]]
            if busy:
                raise TrtioError(f"{what}: slot {busy[0]} is active; release it first, or pass past_lengths to "
                                 f"continue its sequence")
        return np.array(given, np.int64)

    def prefixes(self, prefix: Any, rows: int, what: str) -> list[Prefix | None] | None:
        """``prefix=``: one Prefix for every row, one per row (None for none), checked as this setup's and
        pinned; None when no row has one."""
        if prefix is None:
            return None
        self.refuse_unslotted(what, prefix=prefix)
        given: list[Any]
        if isinstance(prefix, Prefix):
            given = [prefix] * rows
        elif isinstance(prefix, (str, bytes, Set, Mapping)) or not hasattr(prefix, "__iter__"):
            raise ShapeError(f"{what}: prefix must be a Prefix (from pin_prefix) or one per sequence (None for none), "
                             f"got {type(prefix).__name__} {prefix!r}")
        else:
            given = list(prefix)
        if len(given) != rows:
            raise ShapeError(f"{what}: {len(given)} prefixes for {rows} sequences")
        for i, p in enumerate(given):
            if p is not None:
                if not isinstance(p, Prefix):
                    raise ShapeError(f"{what}: prefix[{i}] is {type(p).__name__}, not a Prefix (from pin_prefix)")
                p.check(self._owner, f"{what}: prefix[{i}]")
        return given if any(p is not None for p in given) else None

    # -- pages -----------------------------------------------------------------------------------------
    def plan(self, role: str, slots: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> StepPages:
        """Plan the pages of a step writing tokens ``starts[i] .. ends[i] - 1`` of each slot (CapacityError
        when the pool is short; nothing changes)."""
        return self.tables[role].plan(slots, starts, ends)

    def step_rows(self, role: str, key: tuple[int, ...]) -> np.ndarray | None:
        """The page-table rows of a step of the slots ``key`` (step order) for the engine ``role``, None when
        the engine's table is not staged per step."""
        table = self.tables.get(role)
        return None if table is None else table.step_rows(key)

    def copy(self, role: str, moves: list[tuple[int, int]], s: Stream) -> None:
        """Enqueue the page copies a committed plan made (copy on write), before the step's engine."""
        if moves:
            e = self._engines[role]
            pools = [e.state.tensors[p] for p in e.state._kv_caches]
            copy_pages(pools, e.state.pool_pages, moves, s)

    # -- lifecycle -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Host state (active slots, lengths, page tables, pools) as it was if the block raises."""
        saved_active = list(self._active)
        saved_lengths = {r: e.state.lengths.copy() for r, e in self._engines.items()}
        saved_tables = {r: t.snapshot() for r, t in self.tables.items()}
        try:
            yield
        except BaseException:
            self._active[:] = saved_active
            self._set_order(tuple(slot for slot, on in enumerate(saved_active) if on))
            for r, e in self._engines.items():
                e.state.lengths[:] = saved_lengths[r]
            for r, t in self.tables.items():
                t.restore(saved_tables[r])
            raise

    def admit(self, slots: np.ndarray, prefixes: list[Prefix | None] | None) -> None:
        """Free slots become active; a sequence from a prefix holds the prefix's pages and so its KV entries (in
        every engine: each engine's length of it is the prefix's tokens until its own prefill writes after
        them)."""
        new = slots.tolist()
        for slot in new:
            self._active[slot] = True
        self._set_order(tuple(sorted(self._order_key + tuple(new))))
        if prefixes is None:
            return
        for slot, p in zip(new, prefixes):
            if p is None:
                continue
            for role, table in self.tables.items():
                pages = p.pages(role)
                table.pool.hold(pages)
                table.assign(slot, pages)
            for e in self._engines.values():
                e.state.lengths[slot] = p.tokens

    def release(self, slots: Sequence[int] | np.ndarray) -> None:
        """End the sequences of ``slots`` (active, checked): their pages go back, their lengths to 0."""
        gone = slots.tolist() if isinstance(slots, np.ndarray) else list(slots)
        for table in self.tables.values():
            drop = table.pool.drop
            for slot in gone:
                drop(table.release(slot))
        for e in self._engines.values():
            lengths = e.state.lengths
            for slot in gone:
                lengths[slot] = 0
        active = self._active
        for slot in gone:
            active[slot] = False
        self._set_order(tuple([slot for slot in self._order_key if active[slot]]))

    def release_all(self) -> None:
        if self.count:
            self.release(self._order_key)

    def checked_release(self, slots: Any, what: str) -> list[int]:
        """``slots`` checked for :meth:`release`: distinct, in range, each active (else an error naming the
        slot, and nothing changes)."""
        if not self.slotted:
            self.refuse_unslotted(what, slots=slots)
        given = self.slot_list(slots, what)
        for slot in given:
            if not self._active[slot]:
                raise TrtioError(f"{what}: slot {slot} is free (no sequence to release)")
        return given

    def pin(self, slot: Any, tokens: Any, what: str = "pin_prefix", stream: Stream | None = None, *,
            returns: PrefixReturns | None = None) -> Prefix:
        """Pin the first ``tokens`` KV entries (less the prefix lag) of the active sequence in ``slot``, and what
        each feature keeps of the slot (:meth:`~trtio.features.Feature.pin`: a hybrid model's copy of the slot's
        recurrent states, made on ``stream``; an MRoPE model's record of the tokens' positions)."""
        if not self.slotted:
            self.refuse_unslotted(what)
        if not (type(slot) is int or is_int(slot)) or not 0 <= slot < self.max_batch:
            raise ShapeError(f"{what}: slot {slot!r} is not a slot id in 0..{self.max_batch - 1}")
        slot = int(slot)
        if not self._active[slot]:
            raise TrtioError(f"{what}: slot {slot} is free (no sequence to pin a prefix of)")
        have = min([e.state.lengths.item(slot) for e in self._engines.values()])
        keep_min = 1 + self._lag
        if not (type(tokens) is int or is_int(tokens)) or not keep_min <= tokens <= have:
            raise ShapeError(f"{what}: tokens = {tokens!r}, but slot {slot}'s sequence holds {have} tokens: a prefix "
                             f"pins {keep_min}..{have} of them")
        kept = int(tokens) - self._lag
        assert stream is not None  # the setup's call orders it
        parts = self._features.pin(slot, int(tokens), kept, have, what, stream)  # first: may refuse
        pages, pools = parts.pages, parts.pools
        for role, table in self.tables.items():
            held = table.pages_of(slot)[:-(-kept // table.page_size)]
            table.pool.hold(held)
            table.share(slot)
            pages[role], pools[role] = held, table.pool
        return Prefix(self._owner, kept, pages, pools, returns, parts.positions)
