"""The visual component as the component table sees it: a vision-language model's ViT in ``visual/`` (Qwen2.5-VL,
Qwen3-VL; the kinds of :data:`KINDS`: InternVL, Phi-4-multimodal's ``phi4mm``), read by
:class:`~trtio.edgellm.EngineDir` and attached by :func:`~trtio._setups.create_from_engine_dir` as the LLM setup's
``visual`` (``docs/architecture.md``, "Vision-language models")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtio._config import LLMEngineConfig
from trtio._json import read_json
from trtio._stream import StreamLike
from trtio.components.visual.internvl_kind import INTERNVL
from trtio.components.visual.phi4mm_kind import PHI4MM
from trtio.components.visual.visual_config import VISUAL_CONFIG_FILE, VisualConfig
from trtio.components.visual.visual_kinds import VisualKind, kind_named, register_kind
from trtio.components.visual.visual_setup import create_for_visual
from trtio.errors import ConfigError
from trtio.features import Component

__all__ = ["VISUAL_DIR", "VISUAL_ENGINE_FILE", "VISUAL_ROLE", "VisualComponent"]

VISUAL_DIR = "visual"
VISUAL_ENGINE_FILE = "visual.engine"
VISUAL_ROLE = "visual"
#: The encoder kinds bound besides the Qwen ViTs (:mod:`~trtio.components.visual.visual_kinds`), by ``model_type``.
KINDS: tuple[VisualKind, ...] = (INTERNVL, PHI4MM)
for _kind in KINDS:
    register_kind(_kind)


class VisualComponent(Component):
    """``visual/``: ``config.json`` and the checkpoint's ``preprocessor_config.json`` (a
    :class:`~trtio.components.visual.visual_config.VisualConfig`, checked against the LLM's), ``visual.engine``."""

    NAME = VISUAL_ROLE
    FOLDER = VISUAL_DIR
    CONFIG_FILE = VISUAL_CONFIG_FILE
    ENGINE_FILE = VISUAL_ENGINE_FILE
    WHAT = "vision encoder"

    @classmethod
    def read(cls, folder: Path, llm: LLMEngineConfig) -> Any:
        """``folder``'s config (a :class:`VisualConfig`, or the config of the kind its ``model_type`` names),
        checked against the LLM's (ConfigError naming the file and the key), or None."""
        if not (folder / VISUAL_CONFIG_FILE).is_file():
            return None
        data = read_json(folder / VISUAL_CONFIG_FILE)
        kind = kind_named(data.get("model_type") if isinstance(data, dict) else None)
        if kind is not None:
            return kind.read(folder, llm)
        cfg = VisualConfig.from_dir(folder)
        file = folder / VISUAL_CONFIG_FILE
        if cfg.out_hidden_size != llm.hidden_size:
            raise ConfigError(f"{file}: vision_config.out_hidden_size", f"is {cfg.out_hidden_size}, but the LLM's "
                                                                        f"hidden_size is {llm.hidden_size}: the image "
                                                                        "tokens take the place of text embeddings")
        if cfg.num_deepstack != llm.num_deepstack_features:
            raise ConfigError(f"{file}: vision_config.deepstack_visual_indexes",
                              f"gives {cfg.num_deepstack} deepstack feature(s), but the LLM takes "
                              f"num_deepstack_features = {llm.num_deepstack_features}")
        section = llm.rope_scaling.mrope_section if llm.rope_scaling is not None else None
        if not llm.rope_per_slot or section is None:
            raise ConfigError(f"{file}", "belongs to a vision-language model, but the LLM's RoPE is not MRoPE (its "
                                         "rope_scaling has no mrope_section)")
        for key in ("image_token_id", "vision_start_token_id", "vision_end_token_id", "video_token_id"):
            theirs = llm.extras.get(key)
            if theirs is not None and getattr(cfg, key) is not None and theirs != getattr(cfg, key):
                raise ConfigError(f"{file}: {key}", f"is {getattr(cfg, key)}, the LLM's config says {theirs}")
        if cfg.mrope_section is not None and cfg.mrope_section != section:
            raise ConfigError(f"{file}: rope_scaling.mrope_section", f"is {list(cfg.mrope_section)}, the LLM's is "
                                                                     f"{list(section)}")
        return cfg

    @classmethod
    def check_attach(cls, llm: LLMEngineConfig, part: Any) -> None:
        """The ViT's rows take the place of text embeddings: its output width is the LLM's hidden size."""
        if part.cfg.out_hidden_size != llm.hidden_size:
            raise ConfigError("vision_config.out_hidden_size", f"is {part.cfg.out_hidden_size}, but the LLM's "
                                                               f"hidden_size is {llm.hidden_size}")

    @classmethod
    def attach(cls, setup: Any, engine: Any, config: VisualConfig, stream: StreamLike = None, *,
               graphs: bool = False) -> None:
        setup.attach(cls.NAME, create_for_visual(engine, config, stream, graphs=graphs, backend=setup.io.backend))
