"""The visual component: a vision-language model's ViT (Edge-LLM 0.11's ``visual/``: Qwen2.5-VL, Qwen3-VL), from
images to the rows spliced into the LLM's prompt.

* :mod:`~trtio.components.visual.visual_config`: :class:`~trtio.components.visual.visual_config.VisualConfig`
  (``visual/config.json`` and the checkpoint's ``preprocessor_config.json``);
* :mod:`~trtio.components.visual.images`: preprocessing, the image-token splice and MRoPE positions (the public
  module :mod:`trtio.vision`);
* :mod:`~trtio.components.visual.vit`: the ViT's bindings and every input it takes, from the images' patch grids;
* :mod:`~trtio.components.visual.visual_setup`: :func:`~trtio.components.visual.visual_setup.create_for_visual` /
  ``VisualSetup``, the encoder engine bound;
* :mod:`~trtio.components.visual.visual_component`: what the component table registers;
* :mod:`~trtio.components.visual.phi4mm` / :mod:`~trtio.components.visual.phi4mm_setup`: Phi-4-multimodal's encoder
  (``kind`` ``phi4mm``): its config, HD transform, image-token layout and ``Phi4mmVisualSetup``.
"""
