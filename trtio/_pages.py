"""KV pages on demand: one pool's pages, the page-table row of each sequence slot, and pinned prefixes.

Pure Python and numpy, no device: the setups plan each step's pages here before anything is enqueued,
and stage the rows it reports into the step's one copy.

A pool holds ``total`` pages of ``page_size`` tokens. A sequence slot's row lists the pages that hold its
tokens ``0, page_size, 2 * page_size, ...`` (-1: unmapped, as in Edge-LLM's ``kv_page_table``). Pages are
counted by reference: a slot's row holds one reference to each of its pages, a pinned prefix
(:class:`Prefix`) one to each page it keeps. A page goes back to the pool when its last reference goes.

Writes never touch a page another reference reads: before a step writes into a page that is shared (a
pinned prefix's partly filled last page), the writer gets a fresh page holding a copy (copy on write);
full pages of a prefix are never written again (every write lands at or after a sequence's length).

A step is planned in two parts: :meth:`PageTable.plan` works out what its sequences need and raises
:class:`~trtio.errors.CapacityError` (naming the slot, the pages needed and the pool's free and total
pages) when the pool is short, changing nothing; :meth:`StepPages.commit` then takes the pages, and
:meth:`StepPages.undo` gives them back if the step fails before its work reaches the device.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtio._cache import BoundedCache
from trtio._lifetime import Closeable
from trtio.errors import CapacityError, TrtioError

#: Rows a setup keeps for what pinned prefixes hold beside their KV pages (a hybrid model's recurrent-state snapshots)
#: unless ``max_prefixes=`` says otherwise.
DEFAULT_MAX_PREFIXES = 4

__all__ = ["DEFAULT_MAX_PREFIXES", "PagePool", "PageTable", "Prefix", "PrefixPositions", "PrefixReturns", "StepPages"]


class PagePool:
    """The pages of one KV pool, counted by reference (see module docstring)."""

    __slots__ = ("total", "_refs", "_free")

    def __init__(self, total: int) -> None:
        self.total = total
        self._refs = np.zeros(total, np.int32)
        self._free = list(range(total - 1, -1, -1))  # a stack: the lowest ids go first

    @property
    def free(self) -> int:
        """Pages no slot and no prefix holds."""
        return len(self._free)

    @property
    def used(self) -> int:
        return self.total - len(self._free)

    def refs(self, page: int) -> int:
        """References to ``page`` (0: free)."""
        return int(self._refs[page])

    def take(self, n: int) -> list[int]:
        """``n`` free pages, each with one reference (the caller checked :attr:`free`)."""
        if n > len(self._free):
            raise CapacityError(f"KV page pool: {n} pages asked for, {len(self._free)} of {self.total} free")
        out = [self._free.pop() for _ in range(n)]
        self._refs[out] = 1
        return out

    def hold(self, pages: Sequence[int]) -> None:
        """One more reference to each of ``pages`` (all in use)."""
        for p in pages:
            self._refs[p] += 1

    def drop(self, pages: Sequence[int]) -> None:
        """One reference fewer to each of ``pages``; a page whose last reference goes is free again."""
        for p in pages:
            self._refs[p] -= 1
            if self._refs[p] == 0:
                self._free.append(p)

    def snapshot(self) -> tuple[np.ndarray, list[int]]:
        return self._refs.copy(), list(self._free)

    def restore(self, saved: tuple[np.ndarray, list[int]]) -> None:
        self._refs[:] = saved[0]
        self._free[:] = saved[1]


@dataclass
class StepPages:
    """A step's planned pages (:meth:`PageTable.plan`): per slot the pages to take for unmapped entries
    (``new``: slot -> [(entry, ...)]) and the shared pages to copy before writing (``copies``: slot ->
    [(entry, shared page)]). :meth:`commit` takes them and maps them; afterwards ``moves`` lists the
    page copies the step must enqueue before its engine runs ((source page, destination page))."""

    table: PageTable
    starts: dict[int, int] = field(default_factory=dict)  # each planned slot's first written token
    new: dict[int, list[int]] = field(default_factory=dict)
    copies: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    moves: list[tuple[int, int]] = field(default_factory=list)
    _taken: list[tuple[int, int, int]] = field(default_factory=list)  # (slot, entry, page it replaced or -1)
    _limits: dict[int, int] = field(default_factory=dict)  # each planned slot's limit before the commit
    committed: bool = False

    @property
    def table_role(self) -> str:
        return self.table.role

    @property
    def needed(self) -> int:
        return sum(len(v) for v in self.new.values()) + sum(len(v) for v in self.copies.values())

    @property
    def changes(self) -> bool:
        return bool(self.new or self.copies)

    def commit(self) -> None:
        """Take and map the planned pages (the plan was checked against the free pages)."""
        t, pool = self.table, self.table.pool
        fresh = pool.take(self.needed)
        for slot, entries in self.new.items():
            for e in entries:
                page = fresh.pop()
                t.map(slot, e, page)
                self._taken.append((slot, e, -1))
        for slot, shared in self.copies.items():
            for e, old in shared:
                page = fresh.pop()
                t.map(slot, e, page)
                pool.drop([old])
                self._taken.append((slot, e, old))
                self.moves.append((old, page))
        for slot, start in self.starts.items():
            self._limits[slot] = int(t.limit[slot])
            t.refresh(slot, start)
        t.version += 1
        self.committed = True

    def undo(self) -> None:
        """Give back what :meth:`commit` took (the step failed before its work reached the device)."""
        if not self.committed:
            return
        t, pool = self.table, self.table.pool
        for slot, e, old in reversed(self._taken):
            page = t.entry(slot, e)
            if old >= 0:
                pool.hold([old])
            t.map(slot, e, old)
            pool.drop([page])
        self._taken.clear()
        self.moves.clear()
        for slot, limit in self._limits.items():
            t.limit[slot] = limit
        self._limits.clear()
        t.version += 1
        self.committed = False


class PageTable:
    """The page-table rows of one engine's sequence slots over one pool (see module docstring).

    ``rows`` is int32 ``[slots, pages per sequence]``: K page ids, -1 where unmapped (a read-only view of
    the K half of the engine's table, which adds the V ids: K id + ``pool.total``). ``version`` changes with
    every row change (a step's rows are staged again only then) and every change of a slot's ``limit`` (a step
    reads its slots' limits with its rows). Every change goes through :meth:`map`, :meth:`assign`,
    :meth:`release` or :meth:`restore`, which keep the K and V ids and a plain-list copy of
    each row together: one slot's pages are read without numpy (``release`` and ``pin_prefix`` of one
    sequence are a few list operations), and a step's table is one gather of its slots' rows."""

    def __init__(self, pool: PagePool, slots: int, pages_per_sequence: int, page_size: int, role: str = "") -> None:
        self.role = role  # the engine whose pool this is ("llm", "base", "draft")
        self.pool = pool
        self.page_size = page_size
        self._table = np.full((slots, 2, pages_per_sequence), -1, np.int32)  # per slot: K ids, V ids
        self._slot_tables = list(self._table)  # a view of each slot's [2, M] (one fill() unmaps a row)
        self.rows = self._table[:, 0]
        self.rows.flags.writeable = False
        # rows[slot] as a list of ints, up to its last mapped entry (trailing -1 entries may stay)
        self._held: list[list[int]] = [[] for _ in range(slots)]
        # Per slot: the token a step may write up to without planning (its pages from the current one on are
        # mapped and its own); 0 until a plan says otherwise.
        self.limit = np.zeros(slots, np.int64)
        self.version = 0
        # Per (step slots, version): the step's table and its slots' limits (see step()).
        self._bound: BoundedCache[tuple[tuple[int, ...], int], tuple[np.ndarray, list[int], int]] = BoundedCache()
        self._last_step: tuple[tuple[int, ...] | None, int, tuple[np.ndarray, list[int], int]] = \
            (None, -1, (np.zeros((0, 2, 0), np.int32), [], 0))  # step()'s last answer, by its slots

    def ensure(self, slots: np.ndarray, starts: np.ndarray, width: int) -> StepPages | None:
        """:meth:`plan` of a step writing ``width`` tokens from ``starts[i]`` on for ``slots[i]``, or None when
        every slot writes within pages it holds alone already (the common step: one numpy comparison)."""
        if not (starts + width > self.limit[slots]).any():
            return None
        first = starts.tolist()
        return self.plan(slots.tolist(), first, [v + width for v in first])

    def refresh(self, slot: int, start: int) -> None:
        """Recompute ``limit[slot]`` for writes from token ``start`` on."""
        row, page = self._held[slot], self.page_size
        e = start // page
        while e < len(row) and row[e] >= 0 and self.pool.refs(row[e]) == 1:
            e += 1
        self.limit[slot] = e * page

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, list[int]]]:
        return self._table.copy(), self.limit.copy(), self.pool.snapshot()

    def restore(self, saved: tuple[np.ndarray, np.ndarray, tuple[np.ndarray, list[int]]]) -> None:
        self._table[:], self.limit[:] = saved[0], saved[1]
        self._held = self.rows.tolist()
        self.pool.restore(saved[2])
        self.version += 1

    @property
    def pages_per_sequence(self) -> int:
        return int(self.rows.shape[1])

    def pages_of(self, slot: int) -> list[int]:
        """The pages slot ``slot`` holds, in token order (a new list)."""
        return [p for p in self._held[slot] if p >= 0]

    def entry(self, slot: int, e: int) -> int:
        """The page of entry ``e`` of slot ``slot``'s row (-1: unmapped)."""
        row = self._held[slot]
        return row[e] if e < len(row) else -1

    def map(self, slot: int, e: int, page: int) -> None:
        """Set entry ``e`` of slot ``slot``'s row to ``page`` (-1: unmap it); the caller counts the references
        and bumps :attr:`version`."""
        row = self._held[slot]
        if e >= len(row):
            row.extend([-1] * (e + 1 - len(row)))
        row[e] = page
        self._table[slot, 0, e] = page
        self._table[slot, 1, e] = page + self.pool.total if page >= 0 else -1

    def plan(self, slots: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> StepPages:
        """The pages a step writing tokens ``starts[i] .. ends[i] - 1`` of slot ``slots[i]`` needs: an
        unmapped entry takes a page; a shared page it writes into is copied first. Raises CapacityError
        (naming the slot, the pages it needs and the pool's free / total) when the pool is short; nothing
        changes until :meth:`StepPages.commit`."""
        plan = StepPages(self)
        page, pool, entries = self.page_size, self.pool, self.pages_per_sequence
        limits = self.limit.tolist()
        need = 0
        for slot, start, end in zip(slots, starts, ends):
            if end <= start or end <= limits[slot]:  # (within pages it holds alone: nothing to take, its limit stays)
                continue
            first, last = start // page, (end - 1) // page
            if last >= entries:
                raise CapacityError(f"slot {slot}: tokens up to {end} need page entry {last}, past the "
                                    f"{entries} pages of a page-table row")
            plan.starts[slot] = start
            row = self._held[slot]
            mapped = [(e, row[e] if e < len(row) else -1) for e in range(first, last + 1)]
            new = [e for e, p in mapped if p < 0]
            shared = [(e, p) for e, p in mapped if p >= 0 and pool.refs(p) > 1]
            if new:
                plan.new[slot] = new
            if shared:
                plan.copies[slot] = shared
            need += len(new) + len(shared)
            if need > pool.free:
                mine = len(new) + len(shared)
                raise CapacityError(f"slot {slot} needs {mine} more KV page(s) for tokens {start}..{end - 1}"
                                    f"{'' if mine == need else f' ({need} with the slots before it in this step)'}, "
                                    f"but the pool has {pool.free} free of {pool.total}: release a sequence (or a "
                                    f"prefix) and retry")
        return plan

    def assign(self, slot: int, pages: Sequence[int]) -> None:
        """Map ``pages`` (held already) as the first entries of a free slot's row."""
        held = [int(p) for p in pages]
        table = self._slot_tables[slot]
        table.fill(-1)
        table[0, :len(held)] = held
        table[1, :len(held)] = [p + self.pool.total for p in held]
        self._held[slot] = held
        self.limit[slot] = 0
        self.version += 1

    def release(self, slot: int) -> list[int]:
        """Unmap every entry of ``slot``; returns the pages it held (the caller drops them)."""
        row = self._held[slot]
        held = [p for p in row if p >= 0]
        if row:
            self._slot_tables[slot].fill(-1)
            self._held[slot] = []
        self.limit[slot] = 0
        self.version += 1
        return held

    def step_rows(self, slots: tuple[int, ...]) -> np.ndarray:
        """The engine's table for a step of ``slots`` (in step order): int32 [S, 2, M], K ids then V ids
        (K id + pool size; -1 stays -1). One read-only array per (slots, version): a step block holds it
        until the rows change."""
        return self.step(slots)[0]

    def step(self, slots: tuple[int, ...]) -> tuple[np.ndarray, list[int], int]:
        """:meth:`step_rows` of ``slots``, their limits (in step order, as ints) and the lowest of them (0 for
        no slot): a step that writes below every limit takes no page (:meth:`ensure`'s test, on a few ints). Kept
        per (slots, version): every change of a limit moves :attr:`version` on too. The last one asked for is
        found again by the identity of ``slots`` (a setup keeps one tuple while its slots stay), unhashed."""
        version = self.version
        last = self._last_step
        if last[0] is slots and last[1] == version:
            return last[2]
        key = (slots, version)
        found = self._bound.get(key)
        if found is None:
            rows = self._table[list(slots)]  # a copy: later row changes leave it as it is
            rows.flags.writeable = False
            limit = self.limit
            limits = [int(limit[slot]) for slot in slots]
            found = self._bound.put(key, (rows, limits, min(limits, default=0)))
        self._last_step = (slots, version, found)  # holds `slots`: its id stays its own
        return found

    def share(self, slot: int) -> None:
        """The pages of ``slot`` are shared now (a prefix pinned them): its next write into one copies it first."""
        self.limit[slot] = 0
        self.version += 1


class PrefixReturns:
    """Where a setup's prefixes give their pages back: the lock the setup's calls hold while they read or change
    its pools (a prefix released from another thread waits for it), and the pages of prefixes the garbage
    collector released, which the setup drops into its pools at its next call (:meth:`collect`): a finalizer
    may run anywhere, also inside a step of the same thread, so it never touches a pool itself."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._dropped: deque[tuple[dict[str, PagePool], dict[str, list[int]]]] = deque()
        #: Orders a prefix's release after the setup's last call (the setup's stream rule); set by the setup.
        self.follow: Callable[[Any], object] | None = None

    def defer(self, pools: dict[str, PagePool], pages: dict[str, list[int]]) -> None:
        """Pages of a collected prefix, to go back at the setup's next call (no lock: a deque append)."""
        if pages:
            self._dropped.append((pools, dict(pages)))
            pages.clear()

    def collect(self) -> None:
        """Drop the pages collected prefixes left (the caller holds :attr:`lock`, outside any transaction)."""
        dropped = self._dropped
        while dropped:
            pools, pages = dropped.popleft()
            for role, held in pages.items():
                pools[role].drop(held)


@dataclass(frozen=True)
class PrefixPositions:
    """Where an MRoPE sequence's first tokens leave the positions of what follows them (a pinned prefix's record):
    a token at cache position ``k`` after them is text at position ``k + delta``. ``cuts`` (int64, read-only) says
    the same for shorter prefixes of those tokens: ``cuts[i]`` is the delta after the first ``i + 1`` of them; past
    its end every cut's delta is ``delta`` (a text-only sequence: ``delta`` 0, no cuts). Made and read by
    :class:`~trtio.families.mrope.slot_positions.SlotPositions`."""

    delta: int = 0
    cuts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


class Prefix(Closeable):
    """A pinned prefix: the KV entries of a sequence's first :attr:`tokens` tokens, kept alive (also after
    the sequence ends) for later prefills to start from (``prefill(..., prefix=P)``).

    Made by a setup's ``pin_prefix``; :meth:`release` (the close protocol's ``close``, or leaving a
    ``with`` block) gives its pages back once no sequence uses them, under the setup's lock (from any thread:
    it waits for a call of the setup in progress). A prefix dropped without ``release()`` gives its pages back
    when it is collected (with a ResourceWarning, as every trtio owner does): they return to the pool at the
    setup's next call. Full pages are shared by every sequence that starts from it; the partly filled last page
    is copied for each before it writes there."""

    def __init__(self, owner: object, tokens: int, pages: dict[str, list[int]], pools: dict[str, PagePool],
                 returns: PrefixReturns | None = None, positions: PrefixPositions | None = None) -> None:
        self._owner = owner
        self._tokens = tokens
        self._positions = positions
        self._pages = pages
        self._pools = pools
        self._returns = returns if returns is not None else PrefixReturns()
        self._init_lifetime(f"prefix of {tokens} tokens", self._returns.defer, pools, pages)

    @property
    def tokens(self) -> int:
        """KV entries the prefix holds: a prefill from it starts after them."""
        return self._tokens

    @property
    def rope_delta(self) -> int:
        """MRoPE: the position delta a sequence started from the prefix goes on from (a token at cache position
        ``k`` after the prefix is text at ``k + rope_delta``; Hugging Face's ``rope_deltas``), as the prefix's
        tokens left it; 0 for text, and for a setup without MRoPE."""
        return 0 if self._positions is None else self._positions.delta

    @property
    def positions(self) -> PrefixPositions | None:
        """MRoPE: the positions record of the prefix's tokens (None for a setup without MRoPE)."""
        return self._positions

    @property
    def is_released(self) -> bool:
        return self._closed

    def pages(self, role: str) -> list[int]:
        """The pages of the engine ``role`` the prefix holds (its last one partly filled, unless whole)."""
        self._check_open()
        return list(self._pages[role])

    def check(self, owner: object, what: str) -> None:
        """Refuse a prefix of another setup, or one already released."""
        if owner is not self._owner:
            raise TrtioError(f"{what}: this prefix was pinned by another setup; a prefix starts sequences of the "
                             f"setup that pinned it")
        if self._closed:
            raise TrtioError(f"{what}: this prefix was released; pin it again with pin_prefix()")

    def release(self, stream: Any = None) -> None:
        """Give the prefix's pages back (those no sequence holds go back to the pool), under the setup's lock and
        ordered after its last call (``stream``: as the setup's calls take it). Idempotent."""
        if self._closed:
            return
        with self._returns.lock:
            follow = self._returns.follow
            if follow is not None:
                follow(stream)
            self.close()

    def _close_owned(self) -> None:
        with self._returns.lock:
            for role, pages in self._pages.items():
                self._pools[role].drop(pages)
            self._pages.clear()  # the finalizer's release (run by close()) then has nothing left to give back

    def __repr__(self) -> str:
        state = "released" if self._closed else "pinned"
        return f"Prefix(tokens={self._tokens}, {state})"
