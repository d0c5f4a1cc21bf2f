"""Gemma 4's sliding windows at run time: the SWA cache mode and the bounded SWA pool's pages.

A Gemma 4 engine's sliding layers read their KV through ``swa_kv_page_table``; the shape-only
``swa_kv_cache_mode`` says how (``docs/edgellm-assumptions.md`` §10):

* **full** (mode length 0): the sliding layers' pools have every page of the full layers' pool and the SWA table
  is ``kv_page_table`` itself. Always possible.
* **bounded** (mode length 1): the sliding layers' pools have ``num_swa_pages`` pages; each sequence reserves
  ``2 * (ceil(W / 128) + 1) + 1`` of them at admission and its window rotates through them: logical page ``j`` of
  the sequence (tokens ``128 j ..``) is mapped in column ``j`` of its SWA table row while it is inside the
  retained range ``[(end - W) // 128, ceil(end / 128))``; pages that fall behind it are retired (unmapped, back
  to the sequence's reserve) once the step that moved past them is complete, and every page goes back to the
  pool when the sequence is released. :class:`BoundedSwaPages` keeps that book.

:func:`~trtio.families.gemma4.gemma4_config.choose_swa_mode` picks the mode and says why full mode is forced where
it is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from trtio.errors import CapacityError, InvalidValueError

__all__ = ["BoundedSwaPages", "SwaMode", "swa_room"]


@dataclass(frozen=True)
class SwaMode:
    """The SWA cache mode a setup binds: ``bounded`` with ``pool_pages`` pages per sliding pool, or full (the
    sliding pools as large as the full ones); ``reason`` says why (for ``trtio plan``)."""

    bounded: bool
    pool_pages: int
    private_pages: int  # pages each bounded sequence reserves (0 in full mode)
    reason: str

    @property
    def mode_length(self) -> int:
        """The extent bound to ``swa_kv_cache_mode``: 1 bounded, 0 full."""
        return 1 if self.bounded else 0

    def describe(self) -> str:
        what = (f"bounded SWA pool ({self.pool_pages} pages, {self.private_pages} per sequence)" if self.bounded
                else f"full SWA storage (sliding layers use kv_page_table over {self.pool_pages} pages)")
        return f"{what}: {self.reason}"


def swa_room(pages: BoundedSwaPages, lengths: np.ndarray) -> int:
    """Decode steps (one token each) from ``lengths`` (the cached lengths) whose SWA table rows stay as the first
    one maps them: until a sequence's retained range gains a page or loses one."""
    e = lengths.astype(np.int64) + 1
    end_change = pages.page * -(-e // pages.page) + 1
    begin_change = pages.page * (np.maximum(e - pages.window, 0) // pages.page + 1) + pages.window
    return int((np.minimum(end_change, begin_change) - e).min(initial=1 << 30))


@dataclass
class _Window:
    """One sequence's bounded SWA state (Edge-LLM's ``SwaKVCacheState``)."""

    reserve: list[int]
    bindings: deque[tuple[int, int]] = field(default_factory=deque)  # (logical page, physical page), in order
    begin: int = 0  # retained logical pages [begin, end)
    end: int = 0
    length: int = 0  # tokens the sequence has committed
    retiring: list[tuple[int, int]] = field(default_factory=list)  # unmapped once the step is complete


class BoundedSwaPages:
    """The bounded SWA pool's page ids and each slot's row of ``swa_kv_page_table`` (see module docstring).

    Host bookkeeping only: a setup calls :meth:`admit`, then per step :meth:`advance` before it stages the rows
    (:meth:`rows`) and :meth:`complete` once the step is in stream order behind the next one, and :meth:`release`.
    """

    def __init__(self, pool_pages: int, max_batch: int, *, window: int, page_size: int, pages_per_sequence: int,
                 private_pages: int) -> None:
        if pool_pages < max_batch * private_pages:
            raise CapacityError(f"bounded SWA pool: {pool_pages} pages cannot reserve {max_batch} sequences x "
                                f"{private_pages} pages")
        self.pool_pages, self.window, self.page = pool_pages, window, page_size
        self.private_pages = private_pages
        self._free = list(range(pool_pages - 1, -1, -1))
        self._slots: dict[int, _Window] = {}
        self.table = np.full((max_batch, pages_per_sequence), -1, np.int32)  # K page ids; V = K + pool_pages

    @property
    def free(self) -> int:
        """Pages no sequence reserves."""
        return len(self._free)

    def held(self, slot: int) -> int:
        """Pages ``slot`` holds: mapped, reserved and retiring (always :attr:`private_pages` while admitted)."""
        w = self._slots[slot]
        return len(w.bindings) + len(w.reserve) + len(w.retiring)

    def mapped(self, slot: int) -> dict[int, int]:
        """Logical page -> physical page of ``slot``'s retained window."""
        return dict(self._slots[slot].bindings)

    def __contains__(self, slot: object) -> bool:
        return slot in self._slots

    def admit(self, slot: int) -> None:
        """Reserve ``slot``'s private pages; :class:`CapacityError` (nothing changed) where the pool is short."""
        if not 0 <= slot < self.table.shape[0]:
            raise InvalidValueError(f"bounded SWA pool: slot {slot} is outside 0 .. {self.table.shape[0] - 1}")
        if slot in self._slots:
            raise InvalidValueError(f"bounded SWA pool: slot {slot} is already admitted")
        if len(self._free) < self.private_pages:
            raise CapacityError(f"bounded SWA pool: slot {slot} needs {self.private_pages} pages, {len(self._free)} of "
                                f"{self.pool_pages} are free")
        self._slots[slot] = _Window([self._free.pop() for _ in range(self.private_pages)])
        self.table[slot] = -1

    def advance(self, slot: int, new_length: int) -> None:
        """Map the logical pages of ``slot``'s retained range for ``new_length`` committed tokens (the step about to
        run writes up to there); pages falling behind the range wait in ``retiring`` until :meth:`complete`."""
        w = self._slots[slot]
        self.complete(slot)
        if new_length < w.length:
            raise InvalidValueError(f"bounded SWA pool: slot {slot} cannot move back from {w.length} to "
                                    f"{new_length} tokens")
        if new_length == w.length:
            return
        end = -(-new_length // self.page)
        begin = max(0, new_length - self.window) // self.page
        if end > self.table.shape[1]:
            raise CapacityError(f"bounded SWA pool: slot {slot} at {new_length} tokens needs logical page {end - 1}, "
                                f"past the {self.table.shape[1]} pages of a page-table row")
        while w.bindings and w.bindings[0][0] < begin:
            w.retiring.append(w.bindings.popleft())
        have = {logical for logical, _ in w.bindings}
        for logical in range(begin, end):
            if logical in have:
                continue
            if not w.reserve:
                raise CapacityError(f"bounded SWA pool: slot {slot} has no reserved page left for logical page "
                                    f"{logical} ({self.private_pages} per sequence)")
            page = w.reserve.pop()
            w.bindings.append((logical, page))
            self.table[slot, logical] = page
        w.begin, w.end, w.length = begin, end, new_length

    def complete(self, slot: int) -> None:
        """The step that moved past ``slot``'s retiring pages is complete (in stream order before any later step):
        unmap them and give them back to the slot's reserve."""
        w = self._slots[slot]
        for logical, page in w.retiring:
            self.table[slot, logical] = -1
            w.reserve.append(page)
        w.retiring.clear()

    def release(self, slot: int) -> None:
        """Every page of ``slot`` back to the pool; its row unmapped."""
        w = self._slots.pop(slot)
        self._free.extend([p for _, p in w.bindings] + w.reserve + [p for _, p in w.retiring])
        self.table[slot] = -1

    def rows(self, slots: Sequence[int] | np.ndarray) -> np.ndarray:
        """int32 ``[len(slots), 2, M]``: each slot's K page ids and V page ids (K + pool pages), -1 unmapped."""
        k = self.table[np.asarray(slots, np.int64)]
        return np.stack([k, np.where(k >= 0, k + self.pool_pages, -1)], axis=1).astype(np.int32)
