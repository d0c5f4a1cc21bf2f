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
``jetspec_tree_base``                    ``jetspec_tree_base``          default false; the same for a JetSpec
                                                                        base
``spec_decode_type``                     (``kind``, kept in extras)     eagle3, mtp, dflash, jetspec, gemma4_mtp
======================================== ============================== ====================================

Edge-LLM 0.11 writes ``spec_decode_type`` into both configs of a pair (``docs/edgellm-assumptions.md`` §11):

* ``eagle3`` — the base concatenates the hidden states of ``eagle_hidden_state_layers`` (3 of them) into its
  ``hidden_states`` output; the draft reads them as ``hidden_states_input`` and its own last hidden state as
  ``hidden_states_from_draft``.
* ``mtp`` — the same protocol with one base layer: the base's ``hidden_states`` is its last layer's stream
  ``[T, H]``; the draft is one attention layer with its own KV (Qwen3.5, Nemotron-H, Qwen3-Omni MTP heads).
  trtio runs MTP pairs through the EAGLE3 phases.
* ``dflash`` — block drafts: the base concatenates the draft's ``dflash_config.target_layer_ids`` layers; the
  draft reads the newly committed tokens' features (``dflash_target_hidden_concat`` and the ``dflash_delta_*``
  inputs) and returns logits for every block position. trtio declares these bindings
  (:mod:`trtio.families.spec.dflash_bindings`) and runs the pair through the same phases, the block as the draft's
  input (:mod:`trtio.families.spec.dflash`).
* ``jetspec`` — a causal DFlash (:mod:`trtio.families.spec.jetspec`): the same graphs and rounds, ``jetspec_config``
  for ``dflash_config``, each block row seeing the rows before it only.

* ``gemma4_mtp`` — a Gemma 4 target and its KV-less assistant: the base's ``hidden_states`` is its last layer's
  stream, as MTP's; the assistant's own keys, bindings and steps are its family's (:mod:`trtio.families.gemma4_mtp`).

DFlash and JetSpec are *block draft* families, each one declaration (:mod:`trtio.families.spec.block_family`): this
module reads the declaration, never the family's name. ``dspark`` (:mod:`trtio.families.spec.dspark`) is a declared
block family whose pairs are read and their bindings declared, then refused at ``create_for_spec_decode`` naming what
trtio lacks; other families are refused when the config is read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtio import names
from trtio._checks import is_int
from trtio._config import LLMEngineConfig
from trtio._dtypes import DType
from trtio._edgellm_config import EdgeReader, got
from trtio._memory import TensorRequest
from trtio._registry import TensorRegistry
from trtio._tensor_map import TensorMap
from trtio.errors import ConfigError
from trtio.families.spec.block_family import BlockFamily, block_family_of, declared
from trtio.families.spec.dflash_bindings import (
    DFLASH,
    DFLASH_DELTA_INPUTS,
    DFLASH_POSITIONS,
    DFLASH_ROPE,
    DFLASH_SEQUENCES,
    check_block_draft,
    dflash_draft_registry,
)
from trtio.families.spec.dspark import DSPARK
from trtio.families.spec.jetspec import JETSPEC
from trtio.features import FamilyConfig

__all__ = ["BLOCK_FAMILIES", "RUNNABLE_FAMILIES", "SPEC_FAMILIES", "SpecConfig",
           "check_runnable", "dflash_target_layers", "family_of", "fed_layers"]

#: The block draft families (each declared in its own module), by ``spec_decode_type``.
BLOCK_FAMILIES: dict[str, BlockFamily] = {f.kind: f for f in (DFLASH, JETSPEC, DSPARK)}
assert BLOCK_FAMILIES == declared(), "every declared block draft family is read here"
#: The ``spec_decode_type`` values trtio reads (declares every binding of).
SPEC_FAMILIES = ("eagle3", "mtp", "gemma4_mtp", *BLOCK_FAMILIES)
#: The families trtio has a step protocol for.
RUNNABLE_FAMILIES = ("eagle3", "mtp", "gemma4_mtp",
                     *(kind for kind, f in BLOCK_FAMILIES.items() if f.refused is None))


def family_of(extras: Mapping[str, Any], role: str) -> str | None:
    """The speculative family of an engine of ``role`` whose config left ``extras``: None for a plain LLM; a
    base or draft whose config names none (trtio's own batch-contract configs) is EAGLE3's."""
    if role not in ("base", "draft"):
        return None
    found = extras.get("spec_decode_type")
    return str(found) if isinstance(found, str) and found != "none" else "eagle3"


def dflash_target_layers(extras: Mapping[str, Any], where: str = "dflash_config") -> tuple[int, ...]:
    """A block draft config's ``<family config>.target_layer_ids`` (``dflash_config``, ``jetspec_config``): the base
    layers whose hidden states, side by side, the draft reads (``ConfigError`` naming the key when missing or not a
    list of ints)."""
    return (block_family_of(extras) or DFLASH).target_layers(extras, where)


def fed_layers(family: str, eagle_layers: tuple[int, ...]) -> int:
    """How many base layers' hidden states (each ``hidden_size`` wide) the draft of ``family`` reads: EAGLE3's
    listed layers (3 when none are listed), MTP's one, DFlash's target layers (set as the base's
    ``eagle_hidden_state_layers`` when its pair is read)."""
    if family in ("mtp", "gemma4_mtp"):
        return 1
    return len(eagle_layers) or 3


def check_runnable(family: str, what: str) -> None:
    """Refuse a pair of ``family`` trtio has no step protocol for, before anything is allocated."""
    if family not in RUNNABLE_FAMILIES:
        block = BLOCK_FAMILIES.get(family)
        why = (block.refused if block is not None and block.refused else
               f"trtio runs only {list(RUNNABLE_FAMILIES)} pairs")
        raise ConfigError("spec_decode_type", f"{what}: {family!r} pairs are read and their bindings declared, but "
                                              f"{why}; the pair is refused rather than run wrong")


@dataclass(frozen=True)
class SpecConfig(FamilyConfig):
    """A spec-decode base's or draft's family facts: ``kind`` (``spec_decode_type``: ``"eagle3"``, ``"mtp"``,
    ``"dflash"``, ``"jetspec"``; None for a plain LLM), the base layers whose hidden states an EAGLE3 base feeds its
    draft, and whether the base was built as a DDTree base (``mtp_tree_base``, ``dflash_tree_base``,
    ``jetspec_tree_base``: its recurrent layers read ``tree_parent_ids`` and run each node from its parent's states;
    :attr:`tree_base`) rather than for chains only."""

    eagle_hidden_state_layers: tuple[int, ...] = ()
    mtp_tree_base: bool = False
    kind: str | None = None
    role: str = "llm"
    dflash_tree_base: bool = False
    jetspec_tree_base: bool = False

    KEYWORDS = {"eagle_hidden_state_layers": (), "mtp_tree_base": False, "dflash_tree_base": False,
                "jetspec_tree_base": False}
    SOURCE_KEYS = {"eagle_hidden_state_layers": "eagle_hidden_state_layers", "mtp_tree_base": "mtp_tree_base",
                   "dflash_tree_base": "dflash_tree_base", "jetspec_tree_base": "jetspec_tree_base"}
    _TREE_BASE_KEYS = ("mtp_tree_base", "dflash_tree_base", "jetspec_tree_base")

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
        return cls(given["eagle_hidden_state_layers"], given["mtp_tree_base"], kind, role, given["dflash_tree_base"],
                   given["jetspec_tree_base"])

    @property
    def tree_base(self) -> bool:
        """Whether the base was built as a DDTree base (``mtp_tree_base``, ``dflash_tree_base`` or
        ``jetspec_tree_base``): Edge-LLM's builder then gives its recurrent plugins ``use_ddtree``
        (``docs/edgellm-assumptions.md`` §11.2)."""
        return self.mtp_tree_base or self.dflash_tree_base or self.jetspec_tree_base

    @property
    def tree_base_key(self) -> str | None:
        """The key that made the base a DDTree base (for messages), or None."""
        return next((k for k in self._TREE_BASE_KEYS if getattr(self, k) is True), None)

    def keywords(self) -> dict[str, Any]:
        return {"eagle_hidden_state_layers": self.eagle_hidden_state_layers, "mtp_tree_base": self.mtp_tree_base,
                "dflash_tree_base": self.dflash_tree_base, "jetspec_tree_base": self.jetspec_tree_base}

    def to_json(self) -> dict[str, Any]:
        return {"eagle_hidden_state_layers": list(self.eagle_hidden_state_layers), "mtp_tree_base": self.mtp_tree_base,
                "dflash_tree_base": self.dflash_tree_base, "jetspec_tree_base": self.jetspec_tree_base}

    def validate(self, cfg: LLMEngineConfig) -> None:
        layers = self.eagle_hidden_state_layers
        if not isinstance(layers, tuple):
            raise ConfigError("eagle_hidden_state_layers", f"must be a list of layer indices, got {layers!r}")
        for key in self._TREE_BASE_KEYS:
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

    @property
    def block_family(self) -> BlockFamily | None:
        """The block draft family of this base or draft (:mod:`trtio.families.spec.block_family`), or None."""
        return BLOCK_FAMILIES.get(self.kind) if self.kind is not None else None

    @property
    def is_block_draft(self) -> bool:
        """Whether this is a block draft's config (DFlash, JetSpec: :mod:`trtio.families.spec.dflash`)."""
        return self.block_family is not None and self.role == "draft"

    @property
    def is_dflash_draft(self) -> bool:
        """Whether this is a DFlash block draft's config (:mod:`trtio.families.spec.dflash`)."""
        return self.kind == DFLASH.kind and self.role == "draft"

    def registry(self, reg: TensorRegistry, cfg: LLMEngineConfig) -> TensorRegistry:
        """A block draft reads the newly committed tokens' features instead of an EAGLE-style draft's inputs."""
        if reg.contract == "ragged" and self.is_block_draft and self.block_family is not None:
            return dflash_draft_registry(cfg, reg, self.block_family.outputs)
        hidden = reg.get(names.kOutputHiddenStates)
        if reg.contract == "ragged" and cfg.role == "base" and hidden is not None:
            reg.replace(dataclasses.replace(hidden, shape=(hidden.shape[0], self.output_hidden_width(cfg))))
        return reg

    def members(self, cfg: LLMEngineConfig, rows: int) -> list[TensorRequest]:
        """A DFlash draft's delta RoPE rows, gathered at their positions."""
        if not self.is_block_draft:
            return []
        return [TensorRequest.of(DFLASH_ROPE, (rows, cfg.rotary_dim), DType.FLOAT32)]

    def step_requests(self, cfg: LLMEngineConfig, place: str, batch: int, rows: int) -> list[TensorRequest]:
        """A DFlash draft's delta rows (positions, sequences), written every round with the lengths."""
        if place != "lengths" or not self.is_block_draft:
            return []
        return [TensorRequest.of(DFLASH_POSITIONS, (rows,), DType.INT32),
                TensorRequest.of(DFLASH_SEQUENCES, (rows,), DType.INT32)]

    def bind_pipeline(self, io: Any, tm: TensorMap, cfg: LLMEngineConfig) -> None:
        """A DFlash draft's newly committed tokens: their base features (in place in the base's rows), RoPE rows,
        positions and sequences."""
        if not self.is_block_draft or io.step is None:
            return
        tm.set(names.kDFlashTargetHiddenConcat, io.member("base_hidden_states"))
        tm.set(DFLASH_DELTA_INPUTS[0], io.member(DFLASH_ROPE))
        tm.set(DFLASH_DELTA_INPUTS[1], io.step.tensors[DFLASH_POSITIONS])
        tm.set(DFLASH_DELTA_INPUTS[2], io.step.tensors[DFLASH_SEQUENCES])

    def output_hidden_width(self, cfg: LLMEngineConfig) -> int:
        """Width of a base engine's ``hidden_states`` output: EAGLE3 concatenates the hidden states of
        ``eagle_hidden_state_layers`` (3 of them: 3 * hidden_size); otherwise hidden_size."""
        return cfg.hidden_size * max(len(self.eagle_hidden_state_layers), 1)

    def check_runs(self, base: LLMEngineConfig, draft: LLMEngineConfig, what: str) -> None:
        """A family with a step protocol; a block draft's block (version 1, one RoPE table, a mask token, a block
        that fits)."""
        check_runnable(family_of(base.extras, "base") or "eagle3", what)
        if self.is_block_draft:
            check_block_draft(draft)

    def check_pair(self, base: LLMEngineConfig, draft: LLMEngineConfig, files: tuple[Path, Path]) -> LLMEngineConfig:
        """One speculative family for both; the base's hidden states as wide as the draft reads them. Returns the
        base with a block draft's ``<family config>.target_layer_ids`` as its ``eagle_hidden_state_layers`` (the
        layers its ``hidden_states`` output concatenates: the base config does not name them); a block family's
        required keys (JetSpec's ``causal_head: true``) in both configs."""
        bfile, dfile = files
        btype, dtype = base.extras.get("spec_decode_type"), draft.extras.get("spec_decode_type")
        if btype != dtype:
            raise ConfigError(f"{dfile}: spec_decode_type", f"is {dtype!r}, but {bfile.name} says {btype!r}; base and "
                                                            "draft must be one speculative family")
        family = family_of(base.extras, "base") or "eagle3"
        block = BLOCK_FAMILIES.get(family)
        if block is not None:
            block.check_required(base.extras, bfile.name)
            block.check_required(draft.extras, dfile.name)
            section = f"{dfile}: {block.section_key(draft.extras)}"
            targets = block.target_layers(draft.extras, section)
            bad = [i for i in targets if i >= base.num_layers]
            if bad:
                raise ConfigError(f"{section}.target_layer_ids",
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
    def unsupported(cls, r: EdgeReader) -> list[tuple[str, str, str]]:
        """A base's or draft's ``spec_decode_type`` trtio does not read (DSpark's naming what trtio lacks)."""
        spec_type = r.raw("spec_decode_type")
        if r.raw("engine_role") not in ("base", "draft") or not isinstance(spec_type, str) or spec_type == "none" \
                or spec_type in SPEC_FAMILIES:
            return []
        return [("spec_decode_type", f"speculative decoding of type {spec_type!r}",
                 f"trtio reads {list(SPEC_FAMILIES)} pairs only")]

    @classmethod
    def read_edgellm(cls, r: EdgeReader, role: str, layers: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in cls._TREE_BASE_KEYS:
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
