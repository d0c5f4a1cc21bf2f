"""What a *block draft* family declares: a speculative family whose draft runs once a round over a block (the round's
root and mask tokens after it) and reads the newly committed tokens' base features (Edge-LLM 0.11's cached block
drafts: ``dflash``, ``jetspec``; ``cpp/runtime/decoding/dflashDecodeUtils.h``).

A family is one :class:`BlockFamily` value in its own module (:mod:`trtio.families.spec.dflash_bindings`'s
``DFLASH``, :mod:`trtio.families.spec.jetspec`'s ``JETSPEC``), registered with :func:`declare`; the spec config, the
bindings and the block steps read the declaration, never the family's name:

* ``config_key`` — the config block holding ``target_layer_ids``, ``block_size`` and ``mask_token_id`` (and
  ``also_reads``: the blocks read when it is absent, as Edge-LLM's runtime and exporter accept a JetSpec checkpoint's
  ``dflash_config``);
* ``tree_base_key`` — the base's DDTree flag (:attr:`trtio.families.spec.spec_config.SpecConfig.tree_base`);
* ``causal`` — the proposal mask the runtime writes for the block: bidirectional (every row sees the whole block) or
  causal (row ``j`` sees rows ``0 .. j``: ``dflashRuntimeKernels.cu::dflashPrepareProposalInputsKernel``'s
  ``causalProposalMask``, which ``makeCachedBlockDraftRuntimeConfig`` sets for JetSpec);
* ``required`` — keys of the config block both configs of a pair must hold with these values (JetSpec's
  ``causal_head: true``: ``makeCachedBlockDraftRuntimeConfig`` refuses the pair otherwise);
* ``outputs`` — ``[T, hidden_size]`` float16 outputs the draft graph has beside ``logits`` (DSpark's
  ``dspark_hidden_states``);
* ``refused`` — what trtio lacks to run the family's rounds (its bindings are declared, the pair is refused at
  ``create_for_spec_decode`` naming it), or None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trtio.errors import ConfigError

__all__ = ["BlockFamily", "block_family_of", "declare", "declared"]

_DECLARED: dict[str, BlockFamily] = {}


@dataclass(frozen=True)
class BlockFamily:
    """One block draft family's declaration (module docstring)."""

    kind: str  # spec_decode_type
    config_key: str
    tree_base_key: str
    causal: bool
    also_reads: tuple[str, ...] = ()
    required: Mapping[str, Any] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    refused: str | None = None

    def section_key(self, extras: Mapping[str, Any]) -> str:
        """The config block a config of this family holds its block's facts in (``config_key`` unless only one of
        ``also_reads`` is there)."""
        if isinstance(extras.get(self.config_key), Mapping):
            return self.config_key
        return next((k for k in self.also_reads if isinstance(extras.get(k), Mapping)), self.config_key)

    def section(self, extras: Mapping[str, Any]) -> Mapping[str, Any]:
        found = extras.get(self.section_key(extras))
        return found if isinstance(found, Mapping) else {}

    def target_layers(self, extras: Mapping[str, Any], where: str) -> tuple[int, ...]:
        """The base layers whose hidden states, side by side, the draft reads (``ConfigError`` naming
        ``<where>.target_layer_ids`` when missing or not a list of ints)."""
        ids = self.section(extras).get("target_layer_ids")
        if not isinstance(ids, (list, tuple)) or not ids or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ConfigError(f"{where}.target_layer_ids", f"expected a non-empty list of base layer indices (the "
                                                           f"layers a {self.kind} draft reads), got {ids!r}")
        return tuple(int(i) for i in ids)

    def check_required(self, extras: Mapping[str, Any], where: str) -> None:
        """Refuse a config whose block lacks a value the family's runtime requires (``required``)."""
        section = self.section(extras)
        for key, want in self.required.items():
            if section.get(key) != want:
                raise ConfigError(f"{where}: {self.section_key(extras)}.{key}",
                                  f"is {section.get(key)!r}; a {self.kind} pair needs {want!r} in both configs "
                                  "(Edge-LLM's runtime refuses it otherwise)")


def declare(family: BlockFamily) -> BlockFamily:
    """Register ``family`` (its module's declaration): :func:`block_family_of` finds it by ``spec_decode_type``."""
    _DECLARED[family.kind] = family
    return family


def declared() -> dict[str, BlockFamily]:
    """Every declared block draft family by ``spec_decode_type``."""
    return dict(_DECLARED)


def block_family_of(extras: Mapping[str, Any], default: str | None = None) -> BlockFamily | None:
    """The block draft family of a config that left ``extras`` (its ``spec_decode_type``; ``default`` where it
    names none), or None."""
    kind = extras.get("spec_decode_type", default)
    return _DECLARED.get(kind) if isinstance(kind, str) else None
