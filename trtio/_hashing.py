"""Values that steps look up every call (executors' plan and graph caches) hash their fields once."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

_T = TypeVar("_T")


def hash_once(cls: type[_T]) -> type[_T]:
    """Class decorator, above ``@dataclass(frozen=True)``: the instance's hash is its fields' hash,
    computed on first use and kept (the instance is immutable)."""
    names = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    def __hash__(self: Any) -> int:
        found: int | None = self.__dict__.get("_hash_value")
        if found is None:
            found = self.__dict__["_hash_value"] = hash(tuple(getattr(self, n) for n in names))
        return found

    cls.__hash__ = __hash__  # type: ignore[method-assign]
    return cls
