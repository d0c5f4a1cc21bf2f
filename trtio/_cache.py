"""The one bounded cache: values a setup derives per step shape, kept for the next step of that shape.

A runtime's steps repeat a few shapes (the batch, a verify tree, a catch-up's accept lengths), so the
step helpers remember what they worked out for a shape (dims, layouts, device work) and look it up
next time. One whose shapes keep changing must not grow memory without bound: a cache holds at most
:data:`CACHE_LIMIT` entries and forgets its oldest one to make room (first in, first out).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

__all__ = ["CACHE_LIMIT", "BoundedCache"]

#: Entries one cache holds before it forgets its oldest.
CACHE_LIMIT = 256

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


class BoundedCache(dict[_K, _V]):
    """A dict of at most :data:`CACHE_LIMIT` entries that forgets the oldest first (see module docstring).

    It is a dict, so a look-up (``get``, ``in``) is the dict's own, with no Python call around it; entries are
    added through :meth:`put` alone, which keeps the bound."""

    __slots__ = ()

    def put(self, key: _K, value: _V) -> _V:
        """Keep ``value`` for ``key`` (forgetting the oldest entry when full); returns ``value``."""
        if key not in self and len(self) >= CACHE_LIMIT:
            del self[next(iter(self))]
        self[key] = value
        return value
