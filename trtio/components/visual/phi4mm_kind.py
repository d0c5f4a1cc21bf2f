"""Phi-4-multimodal's encoder as a kind of the visual component (:class:`~trtio.components.visual.visual_kinds.
VisualKind`): its config read and checked against the LLM's, its setup, HF's HD transform and its splice."""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio._stream import StreamLike
from trtio.components.visual.internvl_images import ImagePrompt
from trtio.components.visual.phi4mm import PHI4MM_KIND, Phi4mmVisualConfig, preprocess, read_phi4mm, splice
from trtio.components.visual.phi4mm_setup import create_for_phi4mm_visual
from trtio.components.visual.visual_kinds import VisualKind

__all__ = ["PHI4MM", "splice_prompt"]


def splice_prompt(token_ids: Any, layout: Any, cfg: Phi4mmVisualConfig, embedding: Any, image_embeds: Any = None,
                  stream: StreamLike = None) -> ImagePrompt:
    """:func:`trtio.vision.splice` for Phi-4-MM: :func:`~trtio.components.visual.phi4mm.splice` as an
    :class:`~trtio.components.visual.internvl_images.ImagePrompt` of batch 1 (1-D positions). ``image_embeds``: the
    encoder's rows (a host array, or an encode's ``VisualOutput`` / its ``embeds``, read with a synchronising copy on
    ``stream``)."""
    rows = image_embeds.embeds if hasattr(image_embeds, "embeds") else image_embeds
    if hasattr(rows, "to_numpy"):
        rows = rows.to_numpy(stream)
    ids, embeds = splice(token_ids, layout, cfg, embedding, rows)
    return ImagePrompt(ids[None], embeds[None], np.array([ids.shape[0]], np.int64))


PHI4MM = VisualKind(PHI4MM_KIND, Phi4mmVisualConfig, read_phi4mm, create_for_phi4mm_visual, preprocess, splice_prompt)
