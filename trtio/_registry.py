"""TensorSpec and TensorRegistry: each binding's name, direction, dtype and symbolic shape.

A shape is a tuple of dims; a dim is a fixed ``int``, the name of an :class:`InferenceDims`
member (``"batch"``), or a tuple of member names whose product it is (``("batch", "select_len")``
for logits rows). Resolving a spec against the step's dims gives the binding's shape, so every
shape comes from one place: the recipe that made the dims.

A spec may also carry what an engine of its contract declares for the binding: the engine shape
(symbolic dims are dynamic, ``-1``) and, for inputs, each optimization profile's (min, opt, max).
The per-contract registries live in :mod:`trtio._contracts`; the engine state adds the specs of the
bindings it owns (KV caches, page table, start index) itself (:mod:`trtio._state`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from trtio._dims import InferenceDims
from trtio._dtypes import DType
from trtio.errors import InvalidValueError, ShapeError

__all__ = ["Dim", "ProfileShapes", "TensorRegistry", "TensorSpec"]

Dim = int | str | tuple[str, ...]
ProfileShapes = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class TensorSpec:
    """One binding of an engine: ``io`` is "input" or "output".

    ``profiles`` (inputs only, may be empty) is what an engine of this contract declares for each
    optimization profile; ``optional`` bindings are bound when the engine declares them and not
    required otherwise (inputs a graph does not consume can be dropped by TensorRT's parser).
    """

    name: str
    io: str
    dtype: DType
    shape: tuple[Dim, ...]
    profiles: tuple[ProfileShapes, ...] = ()
    optional: bool = False
    declared: tuple[int, ...] | None = None  # the engine's shape where it differs from the symbolic one

    @property
    def is_input(self) -> bool:
        return self.io == "input"

    @property
    def engine_shape(self) -> tuple[int, ...]:
        """The shape an engine declares: fixed dims as they are, symbolic ones dynamic (-1), unless
        ``declared`` says otherwise (a dim an engine keeps dynamic that one deployment fixes)."""
        if self.declared is not None:
            return self.declared
        return tuple(d if isinstance(d, int) else -1 for d in self.shape)

    def members(self) -> set[str]:
        """The InferenceDims members this shape refers to."""
        out: set[str] = set()
        for d in self.shape:
            if isinstance(d, str):
                out.add(d)
            elif isinstance(d, tuple):
                out.update(d)
        return out

    def resolve(self, dims: InferenceDims) -> tuple[int, ...]:
        out = []
        for d in self.shape:
            if isinstance(d, int):
                out.append(d)
            elif isinstance(d, str):
                out.append(getattr(dims, d))
            else:
                out.append(math.prod(getattr(dims, m) for m in d))
        return tuple(out)

    def __str__(self) -> str:
        def fmt(d: Dim) -> str:
            return "*".join(d) if isinstance(d, tuple) else str(d)

        return f"{self.name} ({self.io}, {self.dtype}, [{', '.join(fmt(d) for d in self.shape)}])"


class TensorRegistry:
    """An ordered, name-unique set of TensorSpecs for one engine role of one contract."""

    def __init__(self, role: str, specs: Iterable[TensorSpec] = (), *, contract: str = "batch") -> None:
        self.role = role
        self.contract = contract
        self._specs: dict[str, TensorSpec] = {}
        for s in specs:
            self.add(s)

    def add(self, spec: TensorSpec) -> None:
        if spec.name in self._specs:
            raise InvalidValueError(f"registry {self.role!r}: {spec.name!r} is declared twice")
        if len(spec.shape) > 8:
            raise ShapeError(f"registry {self.role!r}: {spec.name!r} has rank {len(spec.shape)} > 8")
        self._specs[spec.name] = spec

    def replace(self, spec: TensorSpec) -> None:
        """Declare ``spec`` in place of the spec of its name (declared already)."""
        if spec.name not in self._specs:
            raise InvalidValueError(f"registry {self.role!r}: {spec.name!r} is not declared, so it cannot be replaced")
        self._specs[spec.name] = spec

    def replace_with(self, name: str, specs: Iterable[TensorSpec]) -> None:
        """Declare ``specs`` where ``name`` is declared, in its place (the order a reader lists the bindings in)."""
        if name not in self._specs:
            raise InvalidValueError(f"registry {self.role!r}: {name!r} is not declared, so it cannot be replaced")
        before = list(self._specs.values())
        at = [s.name for s in before].index(name)
        self._specs = {}
        for s in [*before[:at], *specs, *before[at + 1:]]:
            self.add(s)

    def merged(self, specs: Iterable[TensorSpec]) -> TensorRegistry:
        """A new registry with these specs added (e.g. the engine state's own bindings)."""
        out = TensorRegistry(self.role, self._specs.values(), contract=self.contract)
        for s in specs:
            out.add(s)
        return out

    def get(self, name: str) -> TensorSpec | None:
        return self._specs.get(name)

    def __getitem__(self, name: str) -> TensorSpec:
        return self._specs[name]

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[TensorSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def names(self) -> list[str]:
        return list(self._specs)

    def referenced_members(self) -> set[str]:
        out: set[str] = set()
        for s in self._specs.values():
            out |= s.members()
        return out

    def resolve_all(self, dims: InferenceDims) -> dict[str, tuple[int, ...]]:
        dims.check(self.referenced_members())
        return {n: s.resolve(dims) for n, s in self._specs.items()}

    def __repr__(self) -> str:
        return f"TensorRegistry({self.role!r}, {self.contract}, {len(self)} specs)"
