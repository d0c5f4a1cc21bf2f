"""The component table: every engine trtio binds beside the LLM in an Edge-LLM directory, by folder.

A component is a package of ``trtio/components/`` (``docs/architecture.md``, "Families and components"), registered
here with :mod:`trtio.features`: :class:`~trtio.edgellm.EngineDir` reads the folders this table binds and refuses
every other engine folder, naming it; :func:`~trtio._setups.create_from_engine_dir` attaches what it read: the
vision encoder (``visual/``, :mod:`trtio.components.visual`) as ``setup.visual``, the audio encoder (``audio/``,
:mod:`trtio.components.audio`) as ``setup.audio``.

Speech output (Qwen3-Omni's ``talker/``, ``code_predictor/``, ``code2wav/``) is bound by no component: a directory
holding it is refused, each folder named (``docs/edgellm-assumptions.md`` says what binding each would need).
"""

from __future__ import annotations

from trtio.components.audio.audio_component import AudioComponent
from trtio.components.visual.visual_component import VisualComponent
from trtio.features import Component, register_component

__all__ = ["COMPONENTS"]

#: The components, in the order they are attached.
COMPONENTS: tuple[type[Component], ...] = (VisualComponent, AudioComponent)
for _component in COMPONENTS:
    register_component(_component)
