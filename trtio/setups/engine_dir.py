"""create_from_engine_dir: a setup bound to the engines of an Edge-LLM 0.11 engine directory."""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import ModuleType

from trtio.cuda.backend import Backend
from trtio.edgellm import EngineDir
from trtio.setups.llm import LLMSetup, create_for_llm
from trtio.setups.spec_decode import SpecDecodeSetup, create_for_spec_decode
from trtio.stream import StreamLike
from trtio.trt import load_engine

__all__ = ["create_from_engine_dir"]


def create_from_engine_dir(path: str | os.PathLike[str], stream: StreamLike = None, *, graphs: bool = False,
                           draft_top_k: int | None = None, draft_step: int | None = None,
                           verify_size: int | None = None, plugins: Sequence[str | os.PathLike[str]] = (),
                           module: str | ModuleType = "auto",
                           backend: Backend | str | None = None) -> LLMSetup | SpecDecodeSetup:
    """An :class:`LLMSetup` (``llm.engine`` + ``config.json``) or a :class:`SpecDecodeSetup`
    (``spec_base.engine`` + ``base_config.json``, ``spec_draft.engine`` + ``draft_config.json``) for the
    Edge-LLM directory at ``path``.

    A speculative pair needs ``draft_top_k``, ``draft_step`` and ``verify_size`` (Edge-LLM takes them at
    run time), checked against the configs' tree caps before any engine is loaded. Engines are
    deserialized with ``module`` after loading ``plugins`` and those ``EDGELLM_PLUGIN_PATH`` names
    (Edge-LLM's attention plugin).
    """
    directory = EngineDir.open(path)
    bundle = directory.deployment(draft_top_k, draft_step, verify_size)
    if directory.kind == "llm":
        engine = load_engine(directory.engine_path("llm"), module, plugins=plugins)
        return create_for_llm(engine, directory.config, stream, graphs=graphs, backend=backend)
    base = load_engine(directory.engine_path("base"), module, plugins=plugins)
    draft = load_engine(directory.engine_path("draft"), module, plugins=plugins)
    return create_for_spec_decode(base, draft, bundle, stream=stream, graphs=graphs, backend=backend)
