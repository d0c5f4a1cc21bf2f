"""A real TensorRT Edge-LLM 0.11 LoRA engine directory (``-m trt``) with real adapters, and the same checks on the
toy LoRA directory (CI): ``docs/edgellm-assumptions.md`` section 12's **lora-bind**, **lora-graphs** and the
switch checks.

On a GPU runner with a directory built with ``--max-lora-rank`` and adapters processed by
``tensorrt-edgellm-process-lora``::

    TRTIO_EDGELLM_LORA_DIR=/engines/qwen3-0.6b-lora \\
    TRTIO_EDGELLM_LORA_ADAPTERS=/adapters/a:/adapters/b \\
    EDGELLM_PLUGIN_PATH=/opt/edgellm/libNvInfer_edgellm_plugin.so \\
    python3 -m pytest -m trt -q -rs tests/test_edgellm_lora_engines.py

``TRTIO_EDGELLM_LORA_ADAPTERS`` names one adapter or two (``os.pathsep``-separated; a ``.safetensors`` file or its
folder). What is checked, with greedy tokens compared as ``tests/test_edgellm_engines.py`` compares them (a
difference only where the reference barely preferred its token):

* the directory binds and an adapter changes the logits (its inputs reach the engine);
* with an adapter, the same tokens with CUDA graphs on and off;
* ``set_lora(None)`` after an adapter gives the tokens of never having set one (rank 0 everywhere);
* adapter A after adapter B gives A's tokens again (a switch leaves nothing behind).

CI runs the same functions on a copy of ``tests/fixtures/toy-lora`` with host ReferenceEngines standing in for the
plan (``load_engine`` patched) and its two toy adapters.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from test_edgellm_engines import Target, assert_same_tokens, embedding_of, greedy, prompts_for

from trtio import LLMEngineConfig, LLMSetup, LoraAdapter
from trtio.testing import ReferenceEngine

ENV_DIR = "TRTIO_EDGELLM_LORA_DIR"
ENV_ADAPTERS = "TRTIO_EDGELLM_LORA_ADAPTERS"
TOY_LORA = Path(__file__).parent / "fixtures" / "toy-lora"
STEPS = 6


@dataclass
class LoraTarget:
    target: Target
    adapters: list[Path]


def _real() -> list[object]:
    raw = os.environ.get(ENV_DIR, "").strip()
    return [pytest.param(Path(raw) if raw else None, marks=pytest.mark.trt, id=Path(raw).name if raw else
                         f"{ENV_DIR}-unset")]


@pytest.fixture(params=[*_real(), "toy-lora"])
def lora_target(request: pytest.FixtureRequest, tmp_path: Path) -> LoraTarget:
    param = request.param
    if param is None:
        pytest.skip(f"{ENV_DIR} is not set: name a real Edge-LLM 0.11 LoRA engine directory (built with "
                    f"--max-lora-rank) and {ENV_ADAPTERS} one or two adapters (process-lora's output)")
    if isinstance(param, Path):
        adapters = [Path(p) for p in os.environ.get(ENV_ADAPTERS, "").split(os.pathsep) if p.strip()]
        if not adapters:
            pytest.skip(f"{ENV_ADAPTERS} is not set: name one or two adapters for {param}")
        return LoraTarget(Target(param), adapters)
    path = tmp_path / "toy-lora"
    shutil.copytree(TOY_LORA, path)  # the links to the toy assets copied as files

    def stand_in(role: str, cfg: LLMEngineConfig) -> ReferenceEngine:
        return ReferenceEngine.from_config(cfg, device="host")

    return LoraTarget(Target(path, tie_tol=0.0, stand_in=stand_in),
                      [path / "adapters" / "chat", path / "adapters" / "terse"])


def _tokens(setup: LLMSetup, embedding: np.ndarray, prompts: list[list[int]]) -> list[list[int]]:
    return greedy(setup, embedding, prompts, STEPS).tokens


def test_a_lora_directory_binds_and_an_adapter_reaches_the_engine(lora_target: LoraTarget) -> None:
    t = lora_target.target
    d = t.directory
    embedding = embedding_of(d)
    prompts = prompts_for(d, embedding)
    adapter = LoraAdapter.load(lora_target.adapters[0])
    setup = t.bind(graphs=False)
    assert isinstance(setup, LLMSetup)
    with setup:
        base = greedy(setup, embedding, prompts, 1).logits[0]
        setup.set_lora(adapter)
        adapted = greedy(setup, embedding, prompts, 1).logits[0]
    assert np.isfinite(adapted).all()
    assert np.abs(adapted - base).max() > 1e-3, "the adapter does not change the logits: its inputs are not read"


def test_with_an_adapter_graphs_change_no_token(lora_target: LoraTarget) -> None:
    t = lora_target.target
    d = t.directory
    embedding = embedding_of(d)
    prompts = prompts_for(d, embedding)
    adapter = LoraAdapter.load(lora_target.adapters[0])
    runs = []
    for graphs in (False, True):
        setup = t.bind(graphs=graphs)
        assert isinstance(setup, LLMSetup)
        with setup:
            setup.set_lora(adapter)
            runs.append(greedy(setup, embedding, prompts, STEPS))
    assert_same_tokens(runs[1].tokens, runs[0], t.tie_tol, "graphs=True with an adapter")


def test_switching_adapters_leaves_nothing_behind(lora_target: LoraTarget) -> None:
    t = lora_target.target
    d = t.directory
    embedding = embedding_of(d)
    prompts = prompts_for(d, embedding)
    first = LoraAdapter.load(lora_target.adapters[0])
    second = LoraAdapter.load(lora_target.adapters[-1]) if len(lora_target.adapters) > 1 else None
    setup = t.bind(graphs=True)
    assert isinstance(setup, LLMSetup)
    with setup:
        none = greedy(setup, embedding, prompts, STEPS)
        setup.set_lora(first)
        with_first = greedy(setup, embedding, prompts, STEPS)
        setup.set_lora(second)
        greedy(setup, embedding, prompts, STEPS)
        setup.set_lora(first)
        again = _tokens(setup, embedding, prompts)
        setup.set_lora(None)
        none_again = _tokens(setup, embedding, prompts)
    tol = t.tie_tol if t.stand_in is None else 0.0
    assert_same_tokens(again, with_first, tol, "the first adapter set again after another")
    assert_same_tokens(none_again, none, tol, "set_lora(None) after adapters")
