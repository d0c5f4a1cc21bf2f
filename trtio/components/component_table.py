"""The component table: every engine trtio binds beside the LLM in an Edge-LLM directory, by folder.

A component is a package of ``trtio/components/`` (``docs/architecture.md``, "Families and components"), registered
here with :mod:`trtio.features`: :class:`~trtio.edgellm.EngineDir` reads the folders this table binds and refuses
every other engine folder, naming it; :func:`~trtio.setups.create_from_engine_dir` attaches what it read. The audio
encoder (:mod:`trtio.components.audio`) is bound by ``trtio.create_for_audio``; until it is registered here, a
directory holding ``audio/`` opens with ``components=("llm",)`` alone.
"""

from __future__ import annotations

from trtio.components.visual.visual_component import VisualComponent
from trtio.features import Component, register_component

__all__ = ["COMPONENTS"]

#: The components, in the order they are attached.
COMPONENTS: tuple[type[Component], ...] = (VisualComponent,)
for _component in COMPONENTS:
    register_component(_component)
