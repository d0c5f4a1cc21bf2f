"""The glue between images and a vision-language model's LLM: preprocessing, the image-token splice and 3-axis
MRoPE positions (Qwen2.5-VL and Qwen3-VL). The implementation lives in the visual component,
:mod:`trtio.components.visual.images`; the encoder's setup is :func:`trtio.create_for_visual`.

* :func:`preprocess` ``(images, cfg)`` -> ``(patches, grid_thw)``: the numbers Hugging Face's Qwen2-VL image
  processor gives for the same image and config;
* :func:`splice` ``(ids, grid_thw, cfg, table, output)`` -> :class:`VisionPrompt`: each image pad expanded into
  its image tokens, the ViT's rows written over them, the deepstack rows scattered and the MRoPE positions;
* :func:`mrope_positions`, :func:`expand_image_pads`, :func:`smart_resize`, :func:`resize_bicubic`: their parts.

For an encoder of another kind (its config's ``kind``), :func:`preprocess` and :func:`splice` are that kind's:
InternVL's (:mod:`trtio.components.visual.internvl_images`) cut each image into 448-pixel tiles with a thumbnail
(:func:`tile_grid`, equal to Hugging Face's ``GotOcr2ImageProcessorPil``) and return ``(pixels, tiles)``; its splice
wraps each image in ``<img>`` / ``</img>`` and gives an :class:`ImagePrompt` (1-D positions). Phi-4-MM's
(:mod:`trtio.components.visual.phi4mm`) gives ``(blocks, layout)`` (Hugging Face's HD transform) and its splice lays
each image's rows out with the ``sub_GN`` / ``glb_GN`` separator rows (an :class:`ImagePrompt`).

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
from trtio.components.visual.internvl_images import ImagePrompt, tile_grid

__all__ = ["ImagePrompt", "VisionPrompt", "expand_image_pads", "mrope_positions", "preprocess", "resize_bicubic",
           "smart_resize", "splice", "tile_grid"]
