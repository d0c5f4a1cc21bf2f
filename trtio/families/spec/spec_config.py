"""A speculative pair's typed config: what a base or draft of each family (EAGLE3, MTP, DFlash) adds to the dense
core's roles (``is_spec_decode_base``, ``base_model_hidden_size``, the tree sizes).

======================================== ============================== ====================================
Edge-LLM key                             keyword                        note
======================================== ============================== ====================================
``eagle_hidden_state_layers``            ``eagle_hidden_state_layers``  base: default ()
``mtp_tree_base``                        ``mtp_tree_base``              default false; a hybrid base that
                                                                        verifies trees (its recurrent layers
                                                                        read ``tree_parent_ids``)
``dflash_tree_base``                     ``dflash_tree_base``           default false; the same for a DFlash
                                                                        base (Edge-LLM 0.11's builder sets it
                                                                        on every one)
``spec_decode_type``                     (``kind``, kept in extras)     eagle3, mtp, dflash
======================================== ============================== ====================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtio._checks import is_int
from trtio.config import LLMEngineConfig
from trtio.edgellm_config import EdgeReader, got
from trtio.errors import ConfigError
from trtio.features import FamilyConfig
from trtio.spec_families import dflash_target_layers, family_of, fed_layers

__all__ = ["SpecConfig"]


@dataclass(frozen=True)
class SpecConfig(FamilyConfig):
    """A spec-decode base's or draft's family facts: ``kind`` (``spec_decode_type``: ``"eagle3"``, ``"mtp"``,
    ``"dflash"``; None for a plain LLM), the base layers whose hidden states an EAGLE3 base feeds its draft, and
    whether the base was built as a DDTree base (``mtp_tree_base``, ``dflash_tree_base``: its recurrent layers read
    ``tree_parent_ids`` and run each node from its parent's states; :attr:`tree_base`) rather than for chains only."""

    eagle_hidden_state_layers: tuple[int, ...] = ()
    mtp_tree_base: bool = False
    kind: str | None = None
    dflash_tree_base: bool = False

    KEYWORDS = {"eagle_hidden_state_layers": (), "mtp_tree_base": False, "dflash_tree_base": False}
    SOURCE_KEYS = {"eagle_hidden_state_layers": "eagle_hidden_state_layers", "mtp_tree_base": "mtp_tree_base",
                   "dflash_tree_base": "dflash_tree_base"}

    def __post_init__(self) -> None:
        layers: Any = self.eagle_hidden_state_layers
        if isinstance(layers, (list, tuple)):
            object.__setattr__(self, "eagle_hidden_state_layers", tuple(int(i) if is_int(i) else i for i in layers))

    @classmethod
    def from_keywords(cls, given: Mapping[str, Any], core: Mapping[str, Any]) -> SpecConfig | None:
        role = "base" if core["is_spec_decode_base"] is True else "draft" if core["base_model_hidden_size"] else "llm"
        kind = family_of(core["extras"], role)
        if kind is None and all(given[k] == v for k, v in cls.KEYWORDS.items()):
            return None
        return cls(given["eagle_hidden_state_layers"], given["mtp_tree_base"], kind, given["dflash_tree_base"])

    @property
    def tree_base(self) -> bool:
        """Whether the base was built as a DDTree base (``mtp_tree_base`` or ``dflash_tree_base``): Edge-LLM's builder
        then gives its recurrent plugins ``use_ddtree`` (``docs/edgellm-assumptions.md`` §11.2)."""
        return self.mtp_tree_base or self.dflash_tree_base

    def keywords(self) -> dict[str, Any]:
        return {"eagle_hidden_state_layers": self.eagle_hidden_state_layers, "mtp_tree_base": self.mtp_tree_base,
                "dflash_tree_base": self.dflash_tree_base}

    def to_json(self) -> dict[str, Any]:
        return {"eagle_hidden_state_layers": list(self.eagle_hidden_state_layers), "mtp_tree_base": self.mtp_tree_base,
                "dflash_tree_base": self.dflash_tree_base}

    def validate(self, cfg: LLMEngineConfig) -> None:
        layers = self.eagle_hidden_state_layers
        if not isinstance(layers, tuple):
            raise ConfigError("eagle_hidden_state_layers", f"must be a list of layer indices, got {layers!r}")
        for key in ("mtp_tree_base", "dflash_tree_base"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(key, f"must be true or false, got {getattr(self, key)!r}")
        if not layers:
            return
        if not cfg.is_spec_decode_base:
            raise ConfigError("eagle_hidden_state_layers", f"only a spec-decode base feeds hidden states to a draft; "
                                                           f"this {cfg.role} config lists {list(layers)}")
        for i in layers:
            if not is_int(i) or not 0 <= i < cfg.num_layers:  # a hybrid's: decoder layers, recurrent ones counted
                raise ConfigError("eagle_hidden_state_layers",
                                  f"{list(layers)}: every entry must be a layer index in "
                                  f"[0, {cfg.num_layers}) (the decoder layers), got {i!r}")
        if len(set(layers)) != len(layers):
            raise ConfigError("eagle_hidden_state_layers", f"{list(layers)} names a layer twice")

    def check_pair(self, base: LLMEngineConfig, draft: LLMEngineConfig, files: tuple[Path, Path]) -> LLMEngineConfig:
        """One speculative family for both; the base's hidden states as wide as the draft reads them. Returns the
        base with a DFlash draft's ``dflash_config.target_layer_ids`` as its ``eagle_hidden_state_layers`` (the layers
        its ``hidden_states`` output concatenates: the base config does not name them)."""
        bfile, dfile = files
        btype, dtype = base.extras.get("spec_decode_type"), draft.extras.get("spec_decode_type")
        if btype != dtype:
            raise ConfigError(f"{dfile}: spec_decode_type", f"is {dtype!r}, but {bfile.name} says {btype!r}; base and "
                                                            "draft must be one speculative family")
        family = family_of(base.extras, "base") or "eagle3"
        if family == "dflash":
            targets = dflash_target_layers(draft.extras, f"{dfile}: dflash_config")
            bad = [i for i in targets if i >= base.num_layers]
            if bad:
                raise ConfigError(f"{dfile}: dflash_config.target_layer_ids",
                                  f"{list(targets)}: {bad} outside the base's {base.num_layers} layers ({bfile.name})")
            base = dataclasses.replace(base, features=(*base.features, dataclasses.replace(
                base.feature(SpecConfig) or SpecConfig(), eagle_hidden_state_layers=targets))).validate()
        eagle = (base.feature(SpecConfig) or SpecConfig()).eagle_hidden_state_layers
        n = fed_layers(family, eagle)
        layers = (f"the {n} layers of eagle_hidden_state_layers {list(eagle)}" if eagle else
                  "its last layer (MTP)" if family == "mtp" else
                  f"{n} layers (EAGLE3's count; {bfile.name} names none)")
        if draft.base_model_hidden_size != n * base.hidden_size:
            raise ConfigError(f"{dfile}: base_model_hidden_size",
                              f"{draft.base_model_hidden_size} does not match the base: {bfile.name} feeds the draft "
                              f"{layers} of hidden_size {base.hidden_size}, {n} x {base.hidden_size} = "
                              f"{n * base.hidden_size}")
        return base

    @classmethod
    def read_edgellm(cls, r: EdgeReader, role: str, layers: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in ("mtp_tree_base", "dflash_tree_base"):
            tree_base = r.bool_(key)
            if tree_base is not None:
                r.used.add(key)
                out[key] = tree_base
        if role == "base":
            out["eagle_hidden_state_layers"] = _eagle_layers(r, layers)
        return out


def _eagle_layers(r: EdgeReader, layers: int) -> tuple[int, ...]:
    value = r.take("eagle_hidden_state_layers", "a list of layer indices", required=False)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(is_int(i) for i in value):
        raise r.error("eagle_hidden_state_layers", f"expected a list of layer indices, got {got(value)}")
    bad = [i for i in value if not 0 <= i < layers]
    if bad:
        raise r.error("eagle_hidden_state_layers", f"{value}: {bad} outside [0, num_hidden_layers={layers})")
    return tuple(value)
