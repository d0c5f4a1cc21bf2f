"""The vision encoder kinds the visual component binds besides the Qwen ViTs: one module set per kind (InternVL:
``internvl_config``, ``internvl_images``, ``internvl_setup``), each registered here by the component
(:mod:`~trtio.components.visual.visual_component`) as a :class:`VisualKind`.

``visual/config.json``'s ``model_type`` names the kind; its config class says which kind a config is. The visual
component's entry points ask this table first (:class:`~trtio.components.visual.visual_component.VisualComponent`
reads, :func:`~trtio.components.visual.visual_setup.create_for_visual` binds, :func:`trtio.vision.preprocess` and
:func:`trtio.vision.splice` prepare) and keep the Qwen ViTs' own path where no kind answers. This module imports no
kind: the kinds import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["VisualKind", "kind_named", "kind_of", "register_kind"]


@dataclass(frozen=True)
class VisualKind:
    """One vision encoder kind: its ``model_type``, its config class, and its parts.

    * ``read(folder, llm)``: the config of a ``visual/`` folder (a Path), checked against the LLM's config
      (ConfigError naming the file and key);
    * ``create(engine, cfg, stream, graphs=, backend=)``: the encoder bound (a setup with ``encode``);
    * ``preprocess(images, cfg)``: the encoder's input and the images' layout;
    * ``splice(token_ids, layout, cfg, embedding, image_embeds, stream)``: a prompt with its images spliced in.
    """

    model_type: str
    config_type: type
    read: Callable[[Path, Any], Any]
    create: Callable[..., Any]
    preprocess: Callable[[Any, Any], tuple[Any, Any]]
    splice: Callable[..., Any]


_KINDS: dict[str, VisualKind] = {}


def register_kind(kind: VisualKind) -> VisualKind:
    """Register ``kind`` (the visual component does, for each kind it binds)."""
    _KINDS[kind.model_type] = kind
    return kind


def kind_named(model_type: Any) -> VisualKind | None:
    """The kind of a ``visual/config.json`` ``model_type``, None where none is registered (a Qwen ViT, or refused)."""
    return _KINDS.get(model_type) if isinstance(model_type, str) else None


def kind_of(cfg: Any) -> VisualKind | None:
    """The kind whose config class ``cfg`` is, None for any other (a Qwen ViT's ``VisualConfig``)."""
    for kind in _KINDS.values():
        if isinstance(cfg, kind.config_type):
            return kind
    return None
