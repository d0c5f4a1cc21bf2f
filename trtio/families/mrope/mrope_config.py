"""A vision-language model's typed config: MRoPE (a RoPE table per sequence slot, from 3-axis positions) and deepstack
features (Qwen3-VL's ViT rows added to early layers' inputs).

Both are told from the dense core's own fields, which DESIGN fixes on ``LLMEngineConfig``: ``rope_type == "mrope"``
(``rope_scaling.mrope_section``: the three axes' shares of the rotary dims) and ``num_deepstack_features``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtio import names
from trtio._config import LLMEngineConfig
from trtio._edgellm_config import EdgeReader
from trtio._rope import RopeScaling
from trtio._tensor_map import TensorMap
from trtio.errors import ConfigError
from trtio.features import FamilyConfig

__all__ = ["MropeConfig"]


def _mrope_scaling(scaling: Any) -> bool:
    """Whether ``scaling`` (a RopeScaling, or HF's dict) is MRoPE's."""
    if isinstance(scaling, RopeScaling):
        return scaling.mrope_section is not None or scaling.rope_type == "mrope"
    if isinstance(scaling, Mapping):
        return scaling.get("mrope_section") is not None or scaling.get("rope_type", scaling.get("type")) == "mrope"
    return False


@dataclass(frozen=True)
class MropeConfig(FamilyConfig):
    """MRoPE and deepstack: ``mrope`` (the core's ``rope_type`` is ``"mrope"``), its ``sections`` (None: the config
    gives none, so positions cannot be given per axis) and ``num_deepstack`` (deepstack feature inputs)."""

    mrope: bool
    sections: tuple[int, ...] | None
    num_deepstack: int

    ALIASES = {"is_mrope": lambda cfg, m: m is not None and m.mrope}

    @classmethod
    def from_keywords(cls, given: Mapping[str, Any], core: Mapping[str, Any]) -> MropeConfig | None:
        scaling = core["rope_scaling"]
        mrope = core["rope_type"] == "mrope"
        if not (mrope or core["num_deepstack_features"] or _mrope_scaling(scaling)):
            return None
        sections = getattr(scaling, "mrope_section", None)
        return cls(mrope, tuple(sections) if sections is not None else None, core["num_deepstack_features"])

    def keywords(self) -> dict[str, Any]:
        return {}

    @property
    def rope_per_slot(self) -> bool:
        return self.mrope

    @property
    def positions_per_axis(self) -> bool:
        """Whether a prefill may give each token's 3-axis positions (MRoPE with sections)."""
        return self.mrope and self.sections is not None

    def validate(self, cfg: LLMEngineConfig) -> None:
        if cfg.num_deepstack_features > cfg.num_attention_layers:
            raise ConfigError("num_deepstack_features", f"{cfg.num_deepstack_features} exceeds num_attention_layers "
                                                        f"({cfg.num_attention_layers})")
        if _mrope_scaling(cfg.rope_scaling) and not self.mrope:
            section = getattr(cfg.rope_scaling, "mrope_section", None)
            raise ConfigError("rope_type", f"is {cfg.rope_type!r}, but rope_scaling is MRoPE's (mrope_section "
                                           f"{list(section or ())}); give rope_type 'mrope'")

    def bind_pipeline(self, io: Any, tm: TensorMap, cfg: LLMEngineConfig) -> None:
        """The deepstack feature buffers, bound to Edge-LLM's zero buffer until a prefill gives features."""
        n = self.num_deepstack
        if not n:
            return
        if n != len(io.deepstack_embeds):
            raise ConfigError("num_deepstack_features", f"{tm.name}: the config has {n} deepstack features, "
                                                        f"PipelineIO has {len(io.deepstack_embeds)}")
        tm.set_deepstack({names.deepstack_embeds(i): t for i, t in enumerate(io.deepstack_embeds)}, io.deepstack_zero)

    @classmethod
    def read_edgellm(cls, r: EdgeReader, role: str, layers: int) -> dict[str, Any]:
        """``rope_type`` "mrope" where ``rope_scaling`` is MRoPE's (the core reads and checks ``rope_scaling``)."""
        return {"rope_type": "mrope"} if _mrope_scaling(r.raw("rope_scaling")) else {}

    def check_pair(self, base: LLMEngineConfig, draft: LLMEngineConfig, files: tuple[Path, Path]) -> LLMEngineConfig:
        """A draft with MRoPE needs a base with it (they share the per-slot tables)."""
        if draft.rope_per_slot and not base.rope_per_slot:
            raise ConfigError(f"{files[1]}: rope_scaling", f"uses MRoPE but the base ({files[0].name}) does not")
        return base
