"""``trtio bench`` rows of a LoRA engine (issue 37): the decode step with and without an adapter, and a switch.

The bench's 8B-class LLM on the ragged contract (:func:`trtio._tools.bench.configs`: 36 layers, hidden 4096, 32
query / 8 KV heads of 128, batch 8) built with ``max_lora_rank`` 16: a null-compute engine declaring a dense
Edge-LLM model's LoRA inputs (per layer a fused ``qkv_proj``, ``o_proj``, ``gate_proj``, ``up_proj`` and
``down_proj`` at intermediate size 12288: 180 modules, 360 inputs; ``trtio.testing.reference_lora``), CUDA graphs
on. Two adapters of rank 16 on every module. Rows (beside the plain engine's ``LLMSetup.decode``, whose time the
table's ``x decode`` divides by; target for the decode with an adapter: at most 1.1x):

* ``LLMSetup.decode, LoRA engine, no adapter``: steady decode steps with ``set_lora(None)`` (every rank 0);
* ``LLMSetup.decode, LoRA engine, adapter set``: steady decode steps with an adapter;
* ``LLMSetup.set_lora, switch between two adapters of one rank``: the call (the LoRA inputs rebound to the
  adapter's own device copy: no device work, no allocation, no host synchronisation);
* ``LLMSetup.set_lora + decode, switch between two adapters``: a switch and the decode step after it (which takes
  back the executor's plan for that adapter and replays the adapter's own graph).

The phases with and without an adapter take turns, so a drift of the machine's speed hits both alike.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from trtio._config import LLMEngineConfig
from trtio._cuda.backend import Backend
from trtio._engine import EngineIO
from trtio._setups import create_for_llm
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio.families.lora.adapters import LoraAdapter, LoraInputs
from trtio.families.lora.lora_config import LoraConfig

__all__ = ["LORA_RANK", "ROWS", "lora_config", "lora_rows"]

LORA_RANK = 16
INTERMEDIATE = 12288  # an 8B-class MLP (Qwen3-8B's)
ROWS = ("LLMSetup.decode, LoRA engine, no adapter", "LLMSetup.decode, LoRA engine, adapter set",
        "LLMSetup.set_lora, switch between two adapters of one rank",
        "LLMSetup.set_lora + decode, switch between two adapters")


def lora_config(llm: LLMEngineConfig) -> LLMEngineConfig:
    """``llm`` (the bench's ragged LLM) built for LoRA adapters of rank up to :data:`LORA_RANK`."""
    return dataclasses.replace(llm, features=(*llm.features, LoraConfig(LORA_RANK)),
                               extras={"intermediate_size": INTERMEDIATE}).validate()


def _adapter(inputs: LoraInputs, name: str, value: float) -> LoraAdapter:
    weights = {m.name: (np.full((m.in_features, LORA_RANK), value, np.float16),
                        np.full((LORA_RANK, m.out_features), value, np.float16)) for m in inputs.modules}
    return LoraAdapter.from_arrays(weights, name=name)


def lora_rows(llm: LLMEngineConfig, backend: Backend, stream: Stream, steps: int,
              clock: Callable[[str, Callable[[], object]], None], engine: Callable[[LLMEngineConfig, Backend], Any],
              prompt: Tensor, feed: Callable[[Tensor], Callable[[], object]]) -> None:
    """Time :data:`ROWS` with ``clock`` on a LoRA build of ``llm`` (``engine(cfg, backend)``: the bench's
    null-compute engine), prefilled with ``prompt`` (``[batch, 16, hidden]``), its decode steps fed ``feed(embeds)()``
    (``embeds``: the setup's ``io.inputs_embeds``; the bench's input of one step). The rows time at most as many
    steps as the KV capacity leaves room for."""
    cfg = lora_config(llm)
    eng = engine(cfg, backend)
    inputs = LoraInputs.from_engine(EngineIO.from_engine(eng), LORA_RANK)
    assert inputs is not None
    first, second = _adapter(inputs, "first", 0.01), _adapter(inputs, "second", 0.02)
    rounds, warm = 4, 3
    batch, width = prompt.shape[0], prompt.shape[1]
    room = cfg.max_kv_cache_capacity - width - 3 * warm - 2 * 2 * rounds  # tokens left for the timed steps
    per = max(rounds, min(steps // 2, room // 4))  # timed calls per row
    with create_for_llm(eng, cfg, stream, graphs=True, backend=backend) as setup:
        setup.state.reset(stream, clear=True)  # touch the caches once: page faults are not step cost
        embeds = feed(setup.io.inputs_embeds)
        setup.prefill(prompt, np.full(batch, width))
        for adapter in (first, second, None):  # uploads, and each adapter's graph captured
            setup.set_lora(adapter)
            for _ in range(warm):
                setup.decode(embeds())
        for _ in range(rounds):
            for adapter, row in ((None, ROWS[0]), (first, ROWS[1])):
                setup.set_lora(adapter)
                for _ in range(2):
                    setup.decode(embeds())  # the first after a switch checks in full: not a steady step
                for _ in range(per // rounds):
                    clock(row, lambda: setup.decode(embeds()))
        turn = (first, second)
        for i in range(per):
            clock(ROWS[2], functools.partial(setup.set_lora, turn[i % 2]))
            setup.decode(embeds())
        for i in range(per):
            clock(ROWS[3], functools.partial(_switch_and_decode, setup, turn[i % 2], embeds))


def _switch_and_decode(setup: Any, adapter: LoraAdapter, embeds: Callable[[], object]) -> object:
    setup.set_lora(adapter)
    return setup.decode(embeds())
