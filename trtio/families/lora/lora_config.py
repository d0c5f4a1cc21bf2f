"""A LoRA engine's typed config: the largest adapter rank it takes (``builder_config.max_lora_rank``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trtio._config import LLMEngineConfig, check_non_negative, python_ints
from trtio._edgellm_config import EdgeReader
from trtio._engine import EngineIO
from trtio.families.lora.adapters import lora_input_names
from trtio.features import FamilyConfig

__all__ = ["LoraConfig"]


@dataclass(frozen=True)
class LoraConfig(FamilyConfig):
    """An engine built with ``--max-lora-rank R``: ``max_lora_rank`` = R (its LoRA inputs take ranks 0 .. R)."""

    max_lora_rank: int = 0

    KEYWORDS = {"max_lora_rank": 0}
    SOURCE_KEYS = {"max_lora_rank": "builder_config.max_lora_rank"}

    def __post_init__(self) -> None:
        python_ints(self)

    @classmethod
    def from_keywords(cls, given: Mapping[str, Any], core: Mapping[str, Any]) -> LoraConfig | None:
        rank = given["max_lora_rank"]
        return cls(rank) if rank != 0 else None

    def keywords(self) -> dict[str, Any]:
        return {"max_lora_rank": self.max_lora_rank}

    def validate(self, cfg: LLMEngineConfig) -> None:
        check_non_negative(self, "max_lora_rank")

    @classmethod
    def input_problems(cls, eio: EngineIO, cfg: LLMEngineConfig, bound: set[str]) -> tuple[set[str], list[str]]:
        """The engine's LoRA inputs, and the problem of those this setup does not bind (one line: an engine whose
        config has no LoRA rank, or a setup that binds no adapters)."""
        found = lora_input_names(eio.names())
        unbound = [n for n in found if n not in bound]
        if not unbound:
            return set(found), []
        if cfg.feature(LoraConfig) is None:
            return set(found), [f"{unbound[0]}: the engine declares {len(found)} LoRA inputs but the config's "
                                "max_lora_rank is 0 (builder_config.max_lora_rank)"]
        return set(found), [f"{unbound[0]}: the engine takes LoRA adapters ({len(unbound)} LoRA inputs, {{module}}"
                            ".lora_A/B.weight); create_for_llm binds them (LLMSetup.set_lora), this setup does not"]

    @classmethod
    def read_edgellm(cls, r: EdgeReader, role: str, layers: int) -> dict[str, Any]:
        rank = r.int_("builder_config.max_lora_rank", default=0, low=0,
                      meaning="the largest LoRA adapter rank the engine takes (0: no LoRA inputs)")
        return {"max_lora_rank": rank} if rank else {}
