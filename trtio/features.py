"""The feature seam: how a model family plugs into the dense core (``docs/architecture.md``, "Families and
components").

The core binds a dense LLM. A **family** (``trtio/families/<name>/``) adds what its models need beside that, in two
parts, each a subclass of a base class here:

* its typed config, a :class:`FamilyConfig`: the :class:`~trtio.config.LLMEngineConfig` keywords it owns, how it
  reads its Edge-LLM keys, its checks against the dense core and its declarations (pure functions of the config the
  core asks for: per-layer KV geometry, bindings, members). ``cfg.feature(HybridConfig)`` returns it, or None;
* its :class:`Feature`: its part of a bound engine, with a hook at each step point.

The family table (``trtio/families/__init__.py``, imported by the facade before anything else) imports every family
package, and each registers its parts here (:func:`register_family`), so the generic modules reach the families
through this module alone and never import one: they call :func:`family_configs` and the features of a config, in
the table's order.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from trtio.errors import InvalidValueError

__all__ = ["FamilyConfig", "Found", "family_configs", "keyword_owner", "register_family"]

#: An Edge-LLM key a family cannot bind where it is found: (dotted key, what it marks, detail).
Found = tuple[str, str, str]


class FamilyConfig(abc.ABC):
    """A family's typed config (subclasses are frozen dataclasses; see the module docstring).

    The family owns the :class:`~trtio.config.LLMEngineConfig` keywords in :attr:`KEYWORDS` (they are its JSON
    keys too, and read-only attributes of the config, for the public API): the config hands them to
    :meth:`from_keywords` with its dense core's values, and keeps what it returns in ``cfg.features``.
    """

    #: The LLMEngineConfig keywords this family owns, each with its default (the value that means "not used").
    KEYWORDS: ClassVar[Mapping[str, Any]] = {}
    #: Keyword -> the Edge-LLM key it is read from (a failed check names that key in a file's error).
    SOURCE_KEYS: ClassVar[Mapping[str, str]] = {}
    #: Other read-only attributes this family offers on the config (the public API's spellings, e.g.
    #: ``cfg.is_hybrid``): name -> f(cfg, this family's config or None).
    ALIASES: ClassVar[Mapping[str, Callable[[Any, Any], Any]]] = {}

    @classmethod
    @abc.abstractmethod
    def from_keywords(cls, given: Mapping[str, Any], core: Mapping[str, Any]) -> FamilyConfig | None:
        """This family's config from its keywords (``given``: every one of :attr:`KEYWORDS`, at its default where
        the caller gave none) and the dense core's values (``core``); None where the model does not use it."""

    @abc.abstractmethod
    def keywords(self) -> dict[str, Any]:
        """The values of :attr:`KEYWORDS` this config stands for (as given: JSON-able after ``to_json``)."""

    def to_json(self) -> dict[str, Any]:
        """:meth:`keywords` as plain JSON values."""
        return self.keywords()

    def validate(self, cfg: Any) -> None:
        """Check this config against the dense core of ``cfg`` (an LLMEngineConfig); raise ConfigError naming the
        keyword."""
        return None

    @property
    def rope_per_slot(self) -> bool:
        """Whether the model takes a RoPE table per sequence slot (positions a family computes per sequence) rather
        than one table the engines of a setup share."""
        return False

    def kv_geometry(self, layer: int) -> tuple[int, int] | None:
        """``(num_kv_heads, head_dim)`` of attention layer ``layer``'s KV cache where this family gives the layer a
        geometry of its own; None: the model's."""
        return None

    def check_pair(self, base: Any, draft: Any, files: tuple[Any, Any]) -> Any:
        """A speculative pair read from a directory (``base`` and ``draft`` LLMEngineConfigs, this config one of
        theirs; ``files``: their config files): raise ConfigError naming the file and the key where they do not fit
        together, or return the base config the pair runs with (``base`` itself where nothing changes)."""
        return base

    # -- Edge-LLM's config.json ----------------------------------------------------------------------------------
    @classmethod
    def read_edgellm(cls, r: Any, role: str, layers: int) -> dict[str, Any]:
        """The keywords this family reads from an Edge-LLM config (``r``: the mapping's reader, which marks each
        key it reads as used), for an engine of ``role`` with ``layers`` attention layers; {} where the config is
        not one of this family's. A key it cannot honour is refused naming it. Core keywords it returns (a RoPE it
        reads its own way) are not read again."""
        return {}

    @classmethod
    def unsupported(cls, r: Any) -> list[Found]:
        """The keys of an Edge-LLM config that mark what this family binds but the config does not let it bind
        (refused when the config is read, naming the key)."""
        return []


F = TypeVar("F", bound=FamilyConfig)

_FAMILIES: list[type[FamilyConfig]] = []
_OWNERS: dict[str, type[FamilyConfig]] = {}


def register_family(config: type[F]) -> type[F]:
    """Register a family's typed config (the family table does, in its order); its keywords become
    LLMEngineConfig keywords. Returns ``config``, so that it reads as a class decorator."""
    if config in _FAMILIES:
        return config
    taken = sorted(set(config.KEYWORDS) & set(_OWNERS))
    if taken:
        raise InvalidValueError(f"{config.__name__}: keyword {taken[0]!r} is {_OWNERS[taken[0]].__name__}'s")
    _FAMILIES.append(config)
    _OWNERS.update(dict.fromkeys(config.KEYWORDS, config))
    return config


def family_configs() -> tuple[type[FamilyConfig], ...]:
    """Every registered family's typed config class, in the family table's order."""
    return tuple(_FAMILIES)


def keyword_owner(name: str) -> type[FamilyConfig] | None:
    """The family whose typed config owns the LLMEngineConfig keyword ``name`` (None: no family's)."""
    return _OWNERS.get(name)
