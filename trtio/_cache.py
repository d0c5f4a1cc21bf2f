"""The one bounded cache: values a setup derives per step shape, kept for the next step of that shape.

A runtime's steps repeat a few shapes (the batch, a verify tree, a catch-up's accept lengths), so the
step helpers remember what they worked out for a shape (dims, layouts, device work) and look it up
next time. One whose shapes keep changing must not grow memory without bound: a cache holds at most
:data:`CACHE_LIMIT` entries and forgets its oldest one to make room (first in, first out).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["CACHE_LIMIT", "BoundedCache"]

#: Entries one cache holds before it forgets its oldest.
CACHE_LIMIT = 256

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


class BoundedCache(Generic[_K, _V]):
    """A dict of at most :data:`CACHE_LIMIT` entries that forgets the oldest first (see module docstring)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[_K, _V] = {}

    def get(self, key: _K) -> _V | None:
        """The value kept for ``key``, or None."""
        return self._entries.get(key)

    def put(self, key: _K, value: _V) -> _V:
        """Keep ``value`` for ``key`` (forgetting the oldest entry when full); returns ``value``."""
        entries = self._entries
        if key not in entries and len(entries) >= CACHE_LIMIT:
            del entries[next(iter(entries))]
        entries[key] = value
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def clear(self) -> None:
        self._entries.clear()
