"""The glue between images and a vision-language model's LLM: preprocessing, the image-token splice and 3-axis
MRoPE positions (Qwen2.5-VL and Qwen3-VL). The implementation lives in the visual component,
:mod:`trtio.components.visual.images`; the encoder's setup is :func:`trtio.create_for_visual`. Phi-4-multimodal's
encoder (``cfg.kind == "phi4mm"``) has its own module, :mod:`trtio.components.visual.phi4mm`.

* :func:`preprocess` ``(images, cfg)`` -> ``(patches, grid_thw)``: the numbers Hugging Face's Qwen2-VL image
  processor gives for the same image and config; for a Phi-4-MM config ``(blocks, layout)``, the numbers of its
  ``Phi4MultimodalImageProcessor`` (:func:`trtio.components.visual.phi4mm.preprocess`);
* :func:`splice` ``(ids, grid_thw, cfg, table, output)`` -> :class:`VisionPrompt`: each image pad expanded into
  its image tokens, the ViT's rows written over them, the deepstack rows scattered and the MRoPE positions;
* :func:`mrope_positions`, :func:`expand_image_pads`, :func:`smart_resize`, :func:`resize_bicubic`: their parts.

Everything here is host-side numpy.
"""

from typing import Any

import numpy as np

from trtio.components.visual import images as _images
from trtio.components.visual import phi4mm as _phi4mm
from trtio.components.visual.images import (
    VisionPrompt,
    expand_image_pads,
    mrope_positions,
    resize_bicubic,
    smart_resize,
    splice,
)

__all__ = ["VisionPrompt", "expand_image_pads", "mrope_positions", "preprocess", "resize_bicubic", "smart_resize",
           "splice"]


def preprocess(images: Any, cfg: Any) -> tuple[np.ndarray, np.ndarray]:
    """The encoder's input for ``images`` under ``cfg``'s kind: a Qwen ViT's ``(patches, grid_thw)``
    (:func:`trtio.components.visual.images.preprocess`), Phi-4-MM's ``(blocks, layout)``
    (:func:`trtio.components.visual.phi4mm.preprocess`)."""
    if isinstance(cfg, _phi4mm.Phi4mmVisualConfig):
        return _phi4mm.preprocess(images, cfg)
    return _images.preprocess(images, cfg)
