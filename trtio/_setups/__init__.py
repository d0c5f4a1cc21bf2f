"""Setups: engines bound to a PipelineIO, with the step protocol a runtime calls.

``create_for_llm`` gives an :class:`LLMSetup` (prefill, decode, reset); ``create_for_spec_decode``
a :class:`SpecDecodeSetup` (base and draft prefill, draft proposal, verify, accept, draft catch-up);
``create_from_engine_dir`` either one for an Edge-LLM engine directory (with the engines beside the LLM that the
component table binds attached: a vision-language model's encoder, a speech model's audio encoder). The engines
beside the LLM have their setups in their components (``trtio.create_for_visual``: :mod:`trtio.components.visual`;
``trtio.create_for_audio``: :mod:`trtio.components.audio`).
"""

from trtio._setups.base import SetupBase
from trtio._setups.binding import BoundEngine, check_engine
from trtio._setups.engine_dir import create_from_engine_dir
from trtio._setups.llm import LLMSetup, create_for_llm
from trtio._setups.spec_decode import SpecDecodeSetup, create_for_spec_decode

__all__ = ["BoundEngine", "LLMSetup", "SetupBase", "SpecDecodeSetup", "check_engine", "create_for_llm",
           "create_for_spec_decode", "create_from_engine_dir"]
