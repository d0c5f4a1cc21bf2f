"""TensorMap: engine tensor name -> Tensor, frozen once built.

A frozen map refuses to replace or remove an entry, and the tensors it holds refuse to close:
the addresses an executor bound (and CUDA graphs captured) stay valid. New names may still be
added (the KV state adds its bindings after the PipelineIO-owned ones). The one sanctioned
rebinding is the deepstack swap between the real feature buffers and a shared zero buffer
(Edge-LLM's ``DeepstackBinding``): :meth:`TensorMap.use_deepstack_features` /
:meth:`TensorMap.use_deepstack_zero`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from trtio.errors import FrozenError, InvalidTypeError, TrtioError, UnknownNameError
from trtio.tensor import Tensor, mark_bound_memory

__all__ = ["TensorMap"]


class TensorMap:
    """Engine tensor name -> Tensor (non-owning)."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._map: dict[str, Tensor] = {}
        self._frozen = False
        self._deepstack_real: dict[str, Tensor] = {}
        self._deepstack_zero: Tensor | None = None
        self.generation = 0  # bumped on every sanctioned rebinding
        self._users: weakref.WeakSet[Any] = weakref.WeakSet()  # executors that bound this map

    # -- users ----------------------------------------------------------------------------------------
    def add_user(self, executor: Any) -> None:
        """Record that ``executor`` has bound this map (its context holds these addresses): until it is
        closed, neither this map's PipelineIO or state nor the memory of any tensor in it can be freed."""
        self._users.add(executor)
        for t in [*self._map.values(), *self._deepstack_real.values()]:
            mark_bound_memory(t, executor)

    def open_users(self) -> list[str]:
        """Names of the executors bound to this map that are still open: while there is one, the
        tensors behind the map must not be freed (the engine, or a captured graph, would write to
        freed memory)."""
        return sorted(str(getattr(u, "name", u)) for u in list(self._users) if not getattr(u, "is_closed", True))

    # -- mapping protocol ---------------------------------------------------------------------
    def __getitem__(self, name: str) -> Tensor:
        try:
            return self._map[name]
        except KeyError:
            raise UnknownNameError(f"tensor map {self.name!r} has no binding {name!r}") from None

    def get(self, name: str) -> Tensor | None:
        return self._map.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._map

    def __len__(self) -> int:
        return len(self._map)

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def names(self) -> list[str]:
        return list(self._map)

    def items(self) -> list[tuple[str, Tensor]]:
        return list(self._map.items())

    @property
    def is_frozen(self) -> bool:
        return self._frozen

    # -- building -------------------------------------------------------------------------------
    def set(self, name: str, tensor: Tensor) -> None:
        """Bind ``name`` to ``tensor``. After freezing, only new names may be bound."""
        if not isinstance(tensor, Tensor):
            raise InvalidTypeError(f"tensor map {self.name!r}: {name!r} must be bound to a trtio.Tensor, "
                                   f"got {type(tensor).__name__}")
        if tensor.is_closed:
            raise TrtioError(f"tensor map {self.name!r}: cannot bind {name!r} to a closed tensor")
        if self._frozen:
            if name in self._map:
                raise FrozenError(
                    f"tensor map {self.name!r} is frozen: rebinding {name!r} would break pointer "
                    f"stability (bound addresses and captured graphs would go stale)")
            tensor._freeze()
        elif name in self._map and self._map[name] is not tensor:
            self.generation += 1  # executors re-bind on their next prepare
        self._map[name] = tensor

    def __setitem__(self, name: str, tensor: Tensor) -> None:
        self.set(name, tensor)

    def __delitem__(self, name: str) -> None:
        if self._frozen:
            raise FrozenError(f"tensor map {self.name!r} is frozen: {name!r} cannot be removed")
        del self._map[name]

    def add(self, name: str, tensor: Tensor) -> None:
        """Bind a name that is not bound yet (refuses to replace, frozen or not)."""
        if name in self._map:
            raise TrtioError(f"tensor map {self.name!r}: {name!r} is already bound to {self._map[name]!r}")
        self.set(name, tensor)

    def set_deepstack(self, real: dict[str, Tensor], zero: Tensor) -> None:
        """Register the deepstack feature buffers and their shared zero buffer (bound first)."""
        if self._frozen:
            raise FrozenError(f"tensor map {self.name!r} is frozen: deepstack bindings are fixed")
        self._deepstack_real = dict(real)
        self._deepstack_zero = zero
        for name in real:
            self._map[name] = zero

    def freeze(self) -> None:
        self._frozen = True
        for t in self._map.values():
            t._freeze()
        for t in self._deepstack_real.values():
            t._freeze()

    def _unfreeze(self) -> None:
        self._frozen = False
        for t in list(self._map.values()) + list(self._deepstack_real.values()):
            t._unfreeze()

    # -- the sanctioned rebinding -----------------------------------------------------------------
    @property
    def uses_deepstack_features(self) -> bool:
        return bool(self._deepstack_real) and all(
            self._map[n] is t for n, t in self._deepstack_real.items())

    def use_deepstack_features(self) -> None:
        """Bind the real deepstack buffers (before a prefill that carries vision features)."""
        if self._deepstack_real and not self.uses_deepstack_features:
            self._map.update(self._deepstack_real)
            self.generation += 1

    def use_deepstack_zero(self) -> None:
        """Bind the shared zero buffer (decode, verify and graph capture)."""
        zero = self._deepstack_zero
        if zero is not None and any(self._map[n] is not zero for n in self._deepstack_real):
            for n in self._deepstack_real:
                self._map[n] = zero
            self.generation += 1

    def views_changed(self) -> None:
        """Views of bound tensors changed between steps (a setup's LoRA buffers taking another adapter's ranks,
        :mod:`trtio.lora`): every executor bound to this map plans its next step again."""
        self.generation += 1

    def __repr__(self) -> str:
        state = ", frozen" if self._frozen else ""
        return f"TensorMap({self.name!r}, {len(self._map)} bindings{state})"
