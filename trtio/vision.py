"""The glue between images and a vision-language model's LLM: preprocessing, the image-token splice and 3-axis
MRoPE positions (Qwen2.5-VL and Qwen3-VL). The implementation lives in the visual component,
:mod:`trtio.components.visual.images`; the encoder's setup is :func:`trtio.create_for_visual`.

* :func:`preprocess` ``(images, cfg)`` -> ``(patches, grid_thw)``: the numbers Hugging Face's Qwen2-VL image
  processor gives for the same image and config;
* :func:`splice` ``(ids, grid_thw, cfg, table, output)`` -> :class:`VisionPrompt`: each image pad expanded into
  its image tokens, the ViT's rows written over them, the deepstack rows scattered and the MRoPE positions;
* :func:`mrope_positions`, :func:`expand_image_pads`, :func:`smart_resize`, :func:`resize_bicubic`: their parts.

Everything here is host-side numpy.
"""

from trtio.components.visual.images import (
    VisionPrompt,
    expand_image_pads,
    mrope_positions,
    preprocess,
    resize_bicubic,
    smart_resize,
    splice,
)

__all__ = ["VisionPrompt", "expand_image_pads", "mrope_positions", "preprocess", "resize_bicubic", "smart_resize",
           "splice"]
