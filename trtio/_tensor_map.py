"""TensorMap: engine tensor name -> Tensor, frozen once built.

A frozen map refuses to replace or remove an entry, and the tensors it holds refuse to close:
the addresses an executor bound (and CUDA graphs captured) stay valid. New names may still be
added (the KV state adds its bindings after the PipelineIO-owned ones). Two rebindings are sanctioned:
the deepstack swap between the real feature buffers and a shared zero buffer (Edge-LLM's
``DeepstackBinding``): :meth:`TensorMap.use_deepstack_features` / :meth:`TensorMap.use_deepstack_zero`; and
variants, sets of tensors for the same names taking turns (a setup's LoRA inputs bound to the set adapter's
own device copy, :mod:`trtio.families.lora.adapters`): :meth:`TensorMap.use_variant`. The owner of a variant's
tensors keeps them alive while an executor holds them bound (:func:`~trtio._tensor.mark_bound_memory`).

Every rebinding moves :attr:`TensorMap.generation` on, which executors key their plans by; a variant bound again
with nothing else rebound since takes back the generation it had, so executors find the plans (and CUDA graphs)
they made for it.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Iterator, Mapping
from typing import Any

from trtio._tensor import Tensor, mark_bound_memory
from trtio.errors import FrozenError, InvalidTypeError, TrtioError, UnknownNameError

__all__ = ["TensorMap"]


class TensorMap:
    """Engine tensor name -> Tensor (non-owning)."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._map: dict[str, Tensor] = {}
        self._frozen = False
        self._deepstack_real: dict[str, Tensor] = {}
        self._deepstack_zero: Tensor | None = None
        self.generation = 0  # moved on by every sanctioned rebinding (a variant bound again: its own, see module doc)
        self._generations = 0  # the last generation handed out
        self._variants: dict[Hashable, int] = {}  # variant -> its generation, while nothing else was rebound since
        self._variant: Hashable | None = None  # the variant bound now
        self._variant_names: frozenset[str] | None = None  # the names every variant binds
        self._pending: Mapping[str, Tensor] | None = None  # the bound variant's tensors, not yet in _map (_settle)
        self._users: weakref.WeakSet[Any] = weakref.WeakSet()  # executors that bound this map

    # -- users ----------------------------------------------------------------------------------------
    def add_user(self, executor: Any) -> None:
        """Record that ``executor`` has bound this map (its context holds these addresses): until it is
        closed, neither this map's PipelineIO or state nor the memory of any tensor in it can be freed."""
        self._settle()
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
        if self._pending is not None:
            self._settle()
        try:
            return self._map[name]
        except KeyError:
            raise UnknownNameError(f"tensor map {self.name!r} has no binding {name!r}") from None

    def get(self, name: str) -> Tensor | None:
        if self._pending is not None:
            self._settle()
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
        self._settle()
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
        self._settle()
        if self._frozen:
            if name in self._map:
                raise FrozenError(
                    f"tensor map {self.name!r} is frozen: rebinding {name!r} would break pointer "
                    f"stability (bound addresses and captured graphs would go stale)")
            tensor._freeze()
        elif name in self._map and self._map[name] is not tensor:
            self._rebound()  # executors re-bind on their next prepare
        self._map[name] = tensor

    def __setitem__(self, name: str, tensor: Tensor) -> None:
        self.set(name, tensor)

    def __delitem__(self, name: str) -> None:
        if self._frozen:
            raise FrozenError(f"tensor map {self.name!r} is frozen: {name!r} cannot be removed")
        self._settle()
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
        self._settle()
        self._frozen = True
        for t in self._map.values():
            t._freeze()
        for t in self._deepstack_real.values():
            t._freeze()

    def _unfreeze(self) -> None:
        self._settle()
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
            self._rebound()

    def use_deepstack_zero(self) -> None:
        """Bind the shared zero buffer (decode, verify and graph capture)."""
        zero = self._deepstack_zero
        if zero is not None and any(self._map[n] is not zero for n in self._deepstack_real):
            for n in self._deepstack_real:
                self._map[n] = zero
            self._rebound()

    def use_variant(self, tensors: Mapping[str, Tensor], variant: Hashable) -> None:
        """Bind ``tensors`` (names bound already; every variant binds the same names) as the binding set
        ``variant`` (see module docstring): executors bound to this map plan their next step again, or take back
        the plans they made for ``variant`` where nothing else was rebound since it was last bound. The names are
        checked the first time a variant is bound; its tensors are its owner's to keep open (not frozen here)."""
        gen = self._variants.get(variant)
        if gen is None:
            self._check_variant(tensors, variant)
            gen = self._variants[variant] = self._fresh()
        self._pending = tensors  # into the map at its next read: a switch the executor's cached plans serve reads none
        self.generation = gen
        self._variant = variant

    def _check_variant(self, tensors: Mapping[str, Tensor], variant: Hashable) -> None:
        names = frozenset(tensors)
        if self._variant_names is None:
            unknown = sorted(n for n in names if n not in self._map)
            if unknown:
                raise UnknownNameError(f"tensor map {self.name!r}: variant {variant!r} binds {unknown[0]!r}, which "
                                       f"the map does not hold ({len(unknown)} such names); a variant rebinds names "
                                       "bound already")
            self._variant_names = names
        elif names != self._variant_names:
            odd = sorted(names ^ self._variant_names)
            raise TrtioError(f"tensor map {self.name!r}: variant {variant!r} binds other names than the variants "
                             f"before it (e.g. {odd[0]!r}); every variant binds the same names")
        bad = [n for n, t in tensors.items() if not isinstance(t, Tensor) or t.is_closed]
        if bad:
            raise InvalidTypeError(f"tensor map {self.name!r}: variant {variant!r}: {bad[0]!r} must be bound to an "
                                   "open trtio.Tensor")

    def forget_variant(self, variant: Hashable) -> None:
        """Forget ``variant``'s generation (its tensors are about to be freed: bound again later, the same
        object would be a new binding set). The bound variant is refused."""
        if variant is self._variant and variant is not None:
            raise TrtioError(f"tensor map {self.name!r}: variant {variant!r} is bound; bind another first")
        self._variants.pop(variant, None)

    def _settle(self) -> None:
        """The bound variant's tensors into the map (where :meth:`use_variant` left them pending)."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._map.update(pending)

    def _rebound(self) -> None:
        """A rebinding other than a variant's: a generation never used before; the variants' generations are
        void (each was of the map as it was then) but the bound variant's, which is this one."""
        self.generation = self._fresh()
        self._variants = {} if self._variant is None else {self._variant: self.generation}

    def _fresh(self) -> int:
        """A generation never used before (past any the map held, set from outside too)."""
        self._generations = max(self._generations, self.generation) + 1
        return self._generations

    def __repr__(self) -> str:
        state = ", frozen" if self._frozen else ""
        return f"TensorMap({self.name!r}, {len(self._map)} bindings{state})"
