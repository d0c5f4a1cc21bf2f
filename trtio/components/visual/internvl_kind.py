"""InternVL as a kind of the visual component (:class:`~trtio.components.visual.visual_kinds.VisualKind`): its config
read and checked against the LLM's, its setup, its tiling and its splice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtio.components.visual.internvl_config import INTERNVL_KIND, InternVLConfig
from trtio.components.visual.internvl_images import preprocess_tiles, splice_tiles
from trtio.components.visual.internvl_setup import create_for_internvl
from trtio.components.visual.visual_kinds import VisualKind
from trtio.errors import ConfigError

__all__ = ["INTERNVL", "read_internvl"]


def read_internvl(folder: Path, llm: Any) -> InternVLConfig:
    """``folder``'s InternVL config, checked against the LLM's (an LLMEngineConfig): the projected rows take the
    place of text embeddings (``text_config.hidden_size`` = the LLM's ``hidden_size``), the image token is the LLM's,
    and the LLM's RoPE is 1-D with no deepstack inputs (Edge-LLM's InternVL runner writes no MRoPE)."""
    cfg = InternVLConfig.from_dir(folder)
    file = folder / "config.json"
    if cfg.out_hidden_size != llm.hidden_size:
        raise ConfigError(f"{file}: text_config.hidden_size", f"is {cfg.out_hidden_size}, but the LLM's hidden_size "
                                                              f"is {llm.hidden_size}: the image rows take the place of "
                                                              "text embeddings")
    theirs = llm.extras.get("image_token_id")
    if theirs is not None and theirs != cfg.image_token_id:
        raise ConfigError(f"{file}: image_token_id", f"is {cfg.image_token_id}, the LLM's config says {theirs}")
    if llm.rope_per_slot:
        raise ConfigError(f"{file}", "is an InternVL encoder, whose LLM takes 1-D RoPE positions, but the LLM's "
                                     "config asks for per-token (MRoPE) positions")
    if llm.num_deepstack_features:
        raise ConfigError(f"{file}", f"is an InternVL encoder, which gives no deepstack features, but the LLM takes "
                                     f"num_deepstack_features = {llm.num_deepstack_features}")
    return cfg


INTERNVL = VisualKind(INTERNVL_KIND, InternVLConfig, read_internvl, create_for_internvl, preprocess_tiles,
                      splice_tiles)
