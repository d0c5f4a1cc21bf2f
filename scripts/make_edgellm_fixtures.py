#!/usr/bin/env python3
"""Regenerate ``tests/fixtures/edgellm/``: engine-directory configs written by Edge-LLM 0.11 itself.

Every ``config.json`` / ``base_config.json`` / ``draft_config.json`` under ``tests/fixtures/edgellm/``
is written by NVIDIA's ``tensorrt-edgellm`` 0.11.0 wheel, from a tiny Hugging Face config written
by ``transformers`` (the version the wheel pins). Beside each lies ``hf_config.json`` (and, for a
speculative pair, ``draft_hf_config.json``): the checkpoint ``config.json`` the package read, so
tests can check the engine config against its source. Extra checkpoint side files the package read
are kept too (``hf_quant_config.json``, ``generation_config.json``).

This script is a maintainer tool. The tests and the library never import it, and nothing here is
needed to run trtio's tests: the generated files are committed.

Set-up (a scratch venv outside the repository, at any ``$VENV`` path; no TensorRT and no GPU
needed; the wheel is 200 MB)::

    python3.11 -m venv "$VENV"
    "$VENV/bin/pip" download tensorrt-edgellm==0.11.0 --no-deps -d "$WHEELS"
    "$VENV/bin/pip" install --no-deps "$WHEELS"/tensorrt_edgellm-0.11.0-*.whl
    "$VENV/bin/pip" install torch==2.13.0 transformers==5.14.1 safetensors==0.8.0 numpy==2.2.6

(``torch`` only because ``transformers`` wants it; the CPU build is enough.) Run, from the
repository root::

    "$VENV/bin/python" scripts/make_edgellm_fixtures.py           # (re)write the fixtures
    "$VENV/bin/python" scripts/make_edgellm_fixtures.py --check   # byte-compare, write nothing

How each engine config is written -- the package's own code path
------------------------------------------------------------------
The wheel's checkpoint-direct builder (``python -m experimental.builder``, ``experimental/builder/
cli.py``) writes an engine directory in ``_build_one``: ``load_device_config(build_args)``, then
``build_engine(...)`` (the TensorRT build), then the model family's
``artifact_writer.write_artifacts(bundle, cfg, build_args, engine_dir)``, which calls
``core/artifacts/runtime_artifacts.py::write_runtime_artifacts`` -> ``build_runtime_config`` and
``json.dump(..., indent=2)`` into ``config.json`` (``base_config.json`` / ``draft_config.json`` for
a speculative role). This script runs that same sequence with the package's own functions --
``cli._parser().parse_args`` (the real CLI arguments), ``cli._resolve_build_selection``,
``cli._build_plan`` (which expands ``--spec-type`` into the base and draft builds),
``cli._build_args``, ``core.builder.load_device_config``, ``models.registry.artifact_writer_for``
and the writer's ``write_artifacts`` -- and skips only ``build_engine``, which needs TensorRT and a
GPU. Where that skipped step changes the config, this script reproduces what the package's code
does, and says so:

* ``core/builder.py::_build_engine`` sets ``cfg.reduced_vocab_size = vocab_map.size`` when
  ``--reduced-vocab-dir`` is given (after validating the map); done here in ``_reduced_vocab``.
* ``cli._build_one`` for ``--tp-size > 1`` writes the artifacts from
  ``load_device_config(replace(build_args, tp_size=1, tp_rank=0))``; done here the same way.
* ``cli._build_one`` finally calls ``patch_external_weight_config`` with the checkpoint weight
  bindings that the TensorRT network lowering recorded; that adds ``checkpoint_weight_bindings``,
  ``checkpoint_identity`` and ``checkpoint_dir`` (an absolute path) to the config. Those exist only
  after a real network build and are NOT reproduced: the fixtures are the config as written before
  that patch. A real engine directory built with the default ``--externalize-weights`` policy
  carries the three extra keys as well.

``experimental/builder/core/builder.py`` does ``import tensorrt`` at module level (for the network
build) although ``BuildArgs`` and ``load_device_config`` use none of it. To import it without
TensorRT, ``_tensorrt_import_stub`` puts a placeholder ``tensorrt`` module in ``sys.modules`` for
the duration of that one import and removes it afterwards; calling anything in it raises. No
TensorRT code runs on any path used here.

The tiny checkpoints are written to a temporary directory: ``config.json`` via the transformers
config class's ``save_pretrained`` (or, for ``*-hublayout-*``, the Hub's legacy layout, validated by
loading it with the same class), a ``model.safetensors`` holding only the tensors the artifact
writer opens (the embedding, FP8 KV scales, an EAGLE3 ``d2t``), and a one-line chat template. No
model hub is contacted.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shutil
import sys
import tempfile
import types
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "edgellm"
PINNED = {"tensorrt-edgellm": "0.11.0", "transformers": "5.14.1"}
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}\n"


# ----------------------------------------------------------------------------------------------
# Tiny Hugging Face configs (built with transformers' own config classes)
# ----------------------------------------------------------------------------------------------


def _saved(config) -> dict[str, Any]:
    """What ``config.save_pretrained`` writes as config.json (transformers' diff layout)."""
    return json.loads(config.to_json_string(use_diff=True))


def _llama31(**overrides) -> Any:
    from transformers import LlamaConfig

    kwargs = dict(
        vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        max_position_embeddings=131072, rms_norm_eps=1e-5, bos_token_id=380,
        eos_token_id=[381, 383], tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        architectures=["LlamaForCausalLM"],
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def hf_llama31() -> dict[str, Any]:
    return _saved(_llama31())


def hf_llama31_hublayout() -> dict[str, Any]:
    """The layout of meta-llama/Llama-3.1-*'s config.json on the Hub (transformers 4.x):
    top-level ``rope_theta`` and ``rope_scaling``. Validated by loading it with LlamaConfig."""
    from transformers import LlamaConfig

    raw = {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 380, "eos_token_id": [381, 382, 383], "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 256,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 1,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 384,
    }
    loaded = LlamaConfig.from_dict(copy.deepcopy(raw))  # from_dict edits nested dicts
    assert loaded.rope_parameters["rope_type"] == "llama3", loaded.rope_parameters
    return raw


def hf_llama_linear() -> dict[str, Any]:
    return _saved(_llama31(
        num_hidden_layers=2, eos_token_id=383, max_position_embeddings=8192,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}))


def hf_mistral_dynamic_swa() -> dict[str, Any]:
    from transformers import MistralConfig

    return _saved(MistralConfig(
        vocab_size=320, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=4096,
        sliding_window=96, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 1000000.0, "factor": 2.0},
        architectures=["MistralForCausalLM"]))


def _qwen3(**overrides) -> Any:
    from transformers import Qwen3Config

    kwargs = dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        bos_token_id=509, eos_token_id=510, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        architectures=["Qwen3ForCausalLM"],
    )
    kwargs.update(overrides)
    return Qwen3Config(**kwargs)


def hf_qwen3_fp8kv() -> dict[str, Any]:
    # head_dim 32 != hidden_size / num_attention_heads (16), as Qwen3 allows.
    return _saved(_qwen3(num_hidden_layers=2, head_dim=32))


QWEN3_FP8KV_QUANT = {
    "producer": {"name": "modelopt", "version": "0.45.0"},
    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]},
}


def hf_qwen3_yarn() -> dict[str, Any]:
    return _saved(_qwen3(
        num_hidden_layers=2, max_position_embeddings=2048,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                         "original_max_position_embeddings": 512}))


def hf_qwen3_tp2() -> dict[str, Any]:
    return _saved(_qwen3(num_hidden_layers=2, intermediate_size=192))


def hf_qwen3_reduced_vocab() -> dict[str, Any]:
    return _saved(_qwen3(num_hidden_layers=2))


def hf_qwen3_eagle3_base() -> dict[str, Any]:
    return _saved(_qwen3())


def hf_qwen3_eagle3_draft() -> dict[str, Any]:
    """An EAGLE3 draft checkpoint config (Llama-architecture head, as EAGLE3 drafts ship):
    ``draft_vocab_size``, ``target_hidden_size`` and ``target_layer_ids`` (the key Edge-LLM's
    eagle3 configuration reads). Its hidden size (96) differs from the target's (64), so
    ``base_model_hidden_size`` (3 x target) and ``hidden_size`` (draft) cannot be confused."""
    config = _llama31(
        vocab_size=512, hidden_size=96, intermediate_size=192, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=4096,
        bos_token_id=509, eos_token_id=510,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        architectures=["LlamaForCausalLMEagle3"])
    saved = _saved(config)
    saved.update({"draft_vocab_size": 128, "target_hidden_size": 64, "target_layer_ids": [0, 2, 3]})
    return saved


def hf_qwen3_dflash_draft() -> dict[str, Any]:
    """A DFlash (V1) block-diffusion draft for the Qwen3 base, as z-lab's Qwen3 DFlash drafts
    ship: a Qwen3-architecture config with ``block_size`` and ``dflash_config``
    (``target_layer_ids``, ``mask_token_id``). Same hidden and vocab sizes as the target."""
    saved = _saved(_qwen3(num_hidden_layers=1, architectures=["DFlashDraftModel"]))
    saved.update({"block_size": 8,
                  "dflash_config": {"mask_token_id": 511, "target_layer_ids": [1, 3]}})
    return saved


def hf_qwen2_5_vl() -> dict[str, Any]:
    from transformers import Qwen2_5_VLConfig

    return _saved(Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=640, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32768,
            rms_norm_eps=1e-6, bos_token_id=630, eos_token_id=631,
            rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24],
                             "rope_theta": 1000000.0}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=256, fullatt_block_indexes=[1], window_size=112),
        image_token_id=601, video_token_id=602, vision_start_token_id=603,
        vision_end_token_id=604, bos_token_id=630, eos_token_id=631,
        architectures=["Qwen2_5_VLForConditionalGeneration"]))


def hf_qwen2_5_vl_hublayout() -> dict[str, Any]:
    """Qwen2.5-VL in the Hub's layout (Qwen/Qwen2.5-VL-*-Instruct config.json, transformers 4.x):
    text fields at the top level, ``rope_scaling: {"type": "mrope", "mrope_section": [...]}``.
    Validated by loading it with Qwen2_5_VLConfig."""
    from transformers import Qwen2_5_VLConfig

    raw = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0,
        "bos_token_id": 630, "eos_token_id": 631, "hidden_act": "silu", "hidden_size": 256,
        "image_token_id": 601, "initializer_range": 0.02, "intermediate_size": 512,
        "max_position_embeddings": 128000, "max_window_layers": 2, "model_type": "qwen2_5_vl",
        "num_attention_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-06, "rope_scaling": {"mrope_section": [16, 24, 24], "type": "mrope"},
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.49.0.dev0", "use_cache": True,
        "use_sliding_window": False, "video_token_id": 602, "vision_end_token_id": 604,
        "vision_start_token_id": 603, "vision_token_id": 605,
        "vision_config": {"depth": 2, "hidden_act": "silu", "hidden_size": 32,
                          "intermediate_size": 64, "num_heads": 2, "in_chans": 3,
                          "out_hidden_size": 256, "patch_size": 14, "spatial_merge_size": 2,
                          "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [1],
                          "tokens_per_second": 2, "temporal_patch_size": 2},
        "vocab_size": 640,
    }
    loaded = Qwen2_5_VLConfig.from_dict(copy.deepcopy(raw))  # from_dict edits nested dicts
    assert loaded.text_config.rope_parameters["mrope_section"] == [16, 24, 24]
    return raw


def hf_qwen3_vl() -> dict[str, Any]:
    from transformers import Qwen3VLConfig

    return _saved(Qwen3VLConfig(
        text_config=dict(
            vocab_size=640, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
            num_attention_heads=2, num_key_value_heads=1, head_dim=128,
            max_position_embeddings=262144, bos_token_id=630, eos_token_id=631,
            rope_parameters={"rope_type": "default", "mrope_section": [24, 20, 20],
                             "mrope_interleaved": True, "rope_theta": 5000000.0}),
        vision_config=dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=256, deepstack_visual_indexes=[1, 3],
                           num_position_embeddings=64),
        image_token_id=601, video_token_id=602, vision_start_token_id=603,
        vision_end_token_id=604, architectures=["Qwen3VLForConditionalGeneration"]))


def hf_phi4mm() -> dict[str, Any]:
    """Phi-4-multimodal's LLM: partial rotary (0.75) with LongRoPE (factor lists of
    rotary_dim / 2 = 24 entries). Phi-4-mini itself (model_type phi3) has no Edge-LLM 0.11
    direct-builder family; phi4_multimodal is the package's Phi family."""
    from transformers import Phi4MultimodalConfig

    short = [1.0 + 0.05 * i for i in range(24)]
    long = [1.0 + 0.5 * i for i in range(24)]
    return _saved(Phi4MultimodalConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=131072,
        original_max_position_embeddings=4096, bos_token_id=499, eos_token_id=[499, 501],
        pad_token_id=499,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.75, "short_factor": short,
                         "long_factor": long, "original_max_position_embeddings": 4096},
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, image_token_id=500),
        audio_config=dict(hidden_size=32, intermediate_size=64, num_blocks=1,
                          num_attention_heads=2, audio_token_id=502),
        architectures=["Phi4MultimodalForCausalLM"]))


PHI4MM_ADDED_TOKENS = {"<|endoftext10|>": 500}


def _qwen3_5(**overrides) -> Any:
    from transformers import Qwen3_5TextConfig

    kwargs = dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=8192,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, bos_token_id=509, eos_token_id=510,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                         "partial_rotary_factor": 0.25},
        architectures=["Qwen3_5ForCausalLM"],
    )
    kwargs.update(overrides)
    return Qwen3_5TextConfig(**kwargs)


def hf_qwen3_5() -> dict[str, Any]:
    return _saved(_qwen3_5())


def hf_qwen3_5_mtp() -> dict[str, Any]:
    return _saved(_qwen3_5(mtp_num_hidden_layers=1))


def hf_nemotron_h_hublayout() -> dict[str, Any]:
    """Nemotron-H in the Hub's layout (nvidia/NVIDIA-Nemotron-Nano-*-v2 config.json):
    ``hybrid_override_pattern`` ("M" Mamba2, "-" MLP, "*" attention). Validated by loading it
    with transformers' NemotronHConfig. transformers 5's own save layout
    (``layers_block_type: ["linear_attention", ...]``) is not usable: Edge-LLM 0.11's
    ``config.py::_parse_layer_types`` reads ``layers_block_type`` first and maps
    "linear_attention" to Gated DeltaNet, so the build stops with "Gated DeltaNet dimensions
    are incomplete in config.json"."""
    from transformers import NemotronHConfig

    raw = {
        "architectures": ["NemotronHForCausalLM"], "attention_bias": False,
        "bos_token_id": 1, "chunk_size": 128, "conv_kernel": 4, "eos_token_id": 2,
        "head_dim": 16, "hidden_size": 64, "hybrid_override_pattern": "M-*M",
        "intermediate_size": 128, "layer_norm_epsilon": 1e-05, "mamba_head_dim": 16,
        "mamba_hidden_act": "silu", "mamba_num_heads": 4, "max_position_embeddings": 4096,
        "mlp_hidden_act": "relu2", "model_type": "nemotron_h", "n_groups": 2,
        "num_attention_heads": 4, "num_hidden_layers": 4, "num_key_value_heads": 2,
        "ssm_state_size": 16, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.48.0.dev0", "use_conv_bias": True, "vocab_size": 512,
    }
    loaded = NemotronHConfig.from_dict(copy.deepcopy(raw))  # from_dict edits nested dicts
    assert loaded.layers_block_type == ["linear_attention", "mlp", "full_attention",
                                        "linear_attention"], loaded.layers_block_type
    return raw


def _gemma4(**overrides) -> Any:
    from transformers import Gemma4TextConfig

    kwargs = dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64,
        max_position_embeddings=8192, sliding_window=64,
        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0}},
        bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0,
        architectures=["Gemma4ForCausalLM"],
    )
    kwargs.update(overrides)
    return Gemma4TextConfig(**kwargs)


def hf_gemma4_ple() -> dict[str, Any]:
    """Gemma-4 E2B-like: per-layer embeddings (PLE), KV sharing across the last 2 layers,
    sliding/full layers with different head dims (32 / 64) and dual RoPE."""
    return _saved(_gemma4(hidden_size_per_layer_input=16, vocab_size_per_layer_input=512,
                          num_kv_shared_layers=2))


def hf_gemma4_keqv() -> dict[str, Any]:
    """Gemma-4 31B-like: full-attention layers with K == V projections and their own KV head
    count (num_global_key_value_heads 1 vs 2), no PLE, no KV sharing."""
    return _saved(_gemma4(hidden_size_per_layer_input=0,
                          attention_k_eq_v=True, num_global_key_value_heads=1))


# ----------------------------------------------------------------------------------------------
# Fixture table
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fixture:
    name: str
    hf: Callable[[], dict[str, Any]]
    builder_args: list[str]
    draft_hf: Callable[[], dict[str, Any]] | None = None
    spec_type: str = "none"
    quant: dict[str, Any] | None = None
    generation_config: dict[str, Any] | None = None
    added_tokens: dict[str, int] | None = None
    reduced_vocab: list[int] | None = None
    tp_size: int = 1
    outputs: list[str] = field(default_factory=lambda: ["config.json"])
    note: str = ""


PAIR = ["base_config.json", "draft_config.json"]

FIXTURES: list[Fixture] = [
    Fixture("llama3.1-tiny", hf_llama31,
            ["--max-batch-size", "8", "--max-input-len", "128", "--max-kv-cache-capacity", "1024"],
            generation_config={"bos_token_id": 380, "eos_token_id": [383, 382]},
            note="Llama-3.1, rope llama3 (transformers 5 layout: rope_parameters); EOS union of "
                 "config.json and generation_config.json"),
    Fixture("llama3.1-hublayout-tiny", hf_llama31_hublayout,
            ["--max-batch-size", "1", "--max-input-len", "32", "--max-kv-cache-capacity", "200"],
            note="Llama-3.1 in the Hub's transformers-4 layout (rope_scaling + rope_theta)"),
    Fixture("llama-linear-tiny", hf_llama_linear,
            ["--max-batch-size", "4", "--max-input-len", "64", "--max-kv-cache-capacity", "256"],
            note="Llama with linear RoPE scaling (factor 2)"),
    Fixture("mistral-dynamic-swa-tiny", hf_mistral_dynamic_swa,
            ["--max-batch-size", "2", "--max-input-len", "96", "--max-kv-cache-capacity", "384"],
            note="Mistral with dynamic-NTK RoPE and sliding_window 96 (not visible in the engine config)"),
    Fixture("qwen3-fp8kv-tiny", hf_qwen3_fp8kv,
            ["--max-batch-size", "4", "--max-input-len", "256", "--max-kv-cache-capacity", "4096"],
            quant=QWEN3_FP8KV_QUANT,
            note="Qwen3 FP8 (ModelOpt hf_quant_config.json) with FP8 KV cache; head_dim 32 != 64/4"),
    Fixture("qwen3-yarn-tiny", hf_qwen3_yarn,
            ["--max-batch-size", "1", "--max-input-len", "1000", "--max-kv-cache-capacity", "2048"],
            note="Qwen3 with YaRN (factor 4, original 512)"),
    Fixture("qwen3-reduced-vocab-tiny", hf_qwen3_reduced_vocab,
            ["--max-batch-size", "2", "--max-input-len", "64", "--max-kv-cache-capacity", "128"],
            reduced_vocab=list(range(0, 512, 4)),
            note="Qwen3 built with --reduced-vocab-dir (128 of 512 tokens kept)"),
    Fixture("qwen3-tp2-tiny", hf_qwen3_tp2,
            ["--max-batch-size", "2", "--max-input-len", "64", "--max-kv-cache-capacity", "512"],
            tp_size=2, outputs=["config_world2.json"],
            note="Qwen3 tensor-parallel build (--tp-size 2): config_world2.json with rank_configs"),
    Fixture("qwen2.5-vl-tiny", hf_qwen2_5_vl,
            ["--components", "llm", "--max-batch-size", "2", "--max-input-len", "512",
             "--max-kv-cache-capacity", "2000"],
            generation_config={"bos_token_id": 630, "eos_token_id": [631, 632]},
            note="Qwen2.5-VL LLM engine (MRoPE sections [16, 24, 24]; transformers 5 layout, "
                 "EOS only in text_config and generation_config.json)"),
    Fixture("qwen2.5-vl-hublayout-tiny", hf_qwen2_5_vl_hublayout,
            ["--components", "llm", "--max-batch-size", "8", "--max-input-len", "300",
             "--max-kv-cache-capacity", "1000"],
            note="Qwen2.5-VL LLM engine from the Hub's transformers-4 layout (rope type mrope)"),
    Fixture("qwen3-vl-tiny", hf_qwen3_vl,
            ["--components", "llm", "--max-batch-size", "4", "--max-input-len", "100",
             "--max-kv-cache-capacity", "777"],
            note="Qwen3-VL LLM engine (interleaved MRoPE; deepstack from 2 visual layers); "
                 "EOS only in text_config, so the engine config has no eos_token_id"),
    Fixture("phi4mm-longrope-tiny", hf_phi4mm,
            ["--components", "llm", "--max-batch-size", "2", "--max-input-len", "77",
             "--max-kv-cache-capacity", "129"],
            added_tokens=PHI4MM_ADDED_TOKENS,
            note="Phi-4-multimodal LLM engine: LongRoPE + partial_rotary_factor 0.75"),
    Fixture("qwen3-eagle3-tiny", hf_qwen3_eagle3_base,
            ["--max-batch-size", "2", "--max-input-len", "64", "--max-kv-cache-capacity", "640",
             "--max-verify-tree-size", "48", "--max-draft-tree-size", "24"],
            draft_hf=hf_qwen3_eagle3_draft, spec_type="eagle3", outputs=PAIR,
            note="Qwen3 base + EAGLE3 draft (draft hidden 96, target layers [0, 2, 3], draft vocab 128)"),
    Fixture("qwen3-dflash-tiny", hf_qwen3_eagle3_base,
            ["--max-batch-size", "4", "--max-input-len", "128", "--max-kv-cache-capacity", "1500",
             "--max-verify-tree-size", "16", "--max-draft-tree-size", "8"],
            draft_hf=hf_qwen3_dflash_draft, spec_type="dflash", outputs=PAIR,
            note="Qwen3 base + DFlash V1 draft (block 8, target layers [1, 3])"),
    Fixture("qwen3.5-tiny", hf_qwen3_5,
            ["--max-batch-size", "4", "--max-input-len", "64", "--max-kv-cache-capacity", "256"],
            note="Qwen3.5 text: hybrid Gated-DeltaNet + attention layers, partial rotary 0.25"),
    Fixture("qwen3.5-mtp-tiny", hf_qwen3_5_mtp,
            ["--max-batch-size", "2", "--max-input-len", "64", "--max-kv-cache-capacity", "300",
             "--max-verify-tree-size", "8", "--max-draft-tree-size", "8"],
            spec_type="mtp", outputs=PAIR,
            note="Qwen3.5 with its native MTP layer (--spec-type mtp): base + draft"),
    Fixture("nemotron-h-hublayout-tiny", hf_nemotron_h_hublayout,
            ["--max-batch-size", "2", "--max-input-len", "64", "--max-kv-cache-capacity", "256"],
            note="Nemotron-H (Hub layout): hybrid Mamba2 + attention (NoPE) + MLP layers"),
    Fixture("gemma4-ple-tiny", hf_gemma4_ple,
            ["--max-batch-size", "2", "--max-input-len", "64", "--max-kv-cache-capacity", "192"],
            note="Gemma-4 (E2B-like): PLE, KV sharing, per-layer head dims, dual RoPE, sliding window"),
    Fixture("gemma4-keqv-tiny", hf_gemma4_keqv,
            ["--max-batch-size", "4", "--max-input-len", "32", "--max-kv-cache-capacity", "128"],
            note="Gemma-4 (31B-like): K==V full layers with their own KV heads and head dim, dual RoPE"),
]


# ----------------------------------------------------------------------------------------------
# Running the package
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _tensorrt_import_stub():
    """A placeholder ``tensorrt`` module for importing ``experimental.builder.core.builder``.

    Only attribute look-ups at import time succeed (``class _TrtLogger(trt.ILogger)``,
    ``trt.float16`` in tables); calling anything raises. Removed right after the import.
    """
    if "tensorrt" in sys.modules:
        yield
        return

    class _Placeholder(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Placeholder(name, (), {})

        def __call__(cls, *args, **kwargs):
            raise RuntimeError(f"tensorrt placeholder {cls.__name__!r} was called")

    module = types.ModuleType("tensorrt")

    def module_getattr(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {})

    module.__getattr__ = module_getattr  # type: ignore[attr-defined]
    sys.modules["tensorrt"] = module
    try:
        yield
    finally:
        del sys.modules["tensorrt"]


def _check_versions() -> None:
    for name, want in PINNED.items():
        have = metadata.version(name)
        if have != want:
            raise SystemExit(f"{name} {have} is installed; the fixtures need {want} (see the docstring)")


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _write_checkpoint(model_dir: Path, hf: dict[str, Any], fixture: Fixture, *,
                      draft: bool) -> None:
    """A tiny checkpoint: config.json, the tensors the artifact writer opens, a chat template."""
    import numpy as np
    from safetensors.numpy import save_file
    from transformers import GenerationConfig

    model_dir.mkdir(parents=True)
    _write_json(model_dir / "config.json", hf)
    (model_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    text = hf.get("text_config") or hf
    vocab, hidden = int(text["vocab_size"]), int(text["hidden_size"])
    tensors = {"model.embed_tokens.weight": np.zeros((vocab, hidden), np.float16)}
    if fixture.quant is not None and not draft:
        _write_json(model_dir / "hf_quant_config.json", fixture.quant)
        for layer in range(int(text["num_hidden_layers"])):
            for proj, scale in (("k_proj", "k_scale"), ("v_proj", "v_scale")):
                tensors[f"model.layers.{layer}.self_attn.{proj}.{scale}"] = np.ones((), np.float32)
    if int(text.get("hidden_size_per_layer_input") or 0):
        width = int(text["num_hidden_layers"]) * int(text["hidden_size_per_layer_input"])
        tensors["model.embed_tokens_per_layer.weight"] = np.zeros(
            (int(text["vocab_size_per_layer_input"]), width), np.float16)
    if draft and fixture.spec_type == "eagle3":
        tensors["d2t"] = np.zeros((int(hf["draft_vocab_size"]), ), np.int64)
    save_file(tensors, str(model_dir / "model.safetensors"))
    if fixture.generation_config is not None and not draft:
        GenerationConfig(**fixture.generation_config).save_pretrained(str(model_dir))
    if fixture.added_tokens is not None and not draft:
        _write_json(model_dir / "added_tokens.json", fixture.added_tokens)


def _reduced_vocab(cfg, build_args) -> None:
    """Reproduce ``core/builder.py::_build_engine``'s reduced-vocabulary step (part of the
    TensorRT build that this script skips): the same checks, then
    ``cfg.reduced_vocab_size = int(vocab_map.size)``."""
    import numpy as np
    from experimental.builder.core import contracts
    from experimental.builder.core.safetensors_np import load_safetensors_tensor

    vocab_dir = (build_args.draft_reduced_vocab_dir
                 if build_args.resolved_spec_role == contracts.SpecRole.DRAFT
                 else build_args.reduced_vocab_dir)
    if not vocab_dir:
        return
    vocab_map = load_safetensors_tensor(os.path.join(vocab_dir, "vocab_map.safetensors"),
                                        "vocab_map").astype(np.int64)
    if vocab_map.ndim != 1 or vocab_map.size == 0:
        raise ValueError("vocab_map must be a non-empty 1D tensor")
    if np.any(vocab_map < 0) or np.any(vocab_map >= cfg.vocab_size):
        raise ValueError("vocab_map contains token IDs outside vocab_size")
    if np.unique(vocab_map).size != vocab_map.size:
        raise ValueError("vocab_map contains duplicate token IDs")
    cfg.reduced_vocab_size = int(vocab_map.size)


def _build_engine_dir(fixture: Fixture, work: Path) -> Path:
    """Write the fixture's engine directory with the package's builder CLI path (no TensorRT)."""
    import numpy as np
    from safetensors.numpy import save_file

    with _tensorrt_import_stub():
        from experimental.builder import cli
        from experimental.builder.core.builder import load_device_config
    from experimental.builder.models import registry

    model_dir, engine_dir = work / "model", work / "engine"
    _write_checkpoint(model_dir, fixture.hf(), fixture, draft=False)
    argv = ["--model-dir", str(model_dir), "--engine-dir", str(engine_dir)]
    if fixture.draft_hf is not None:
        _write_checkpoint(work / "draft", fixture.draft_hf(), fixture, draft=True)
        argv += ["--draft-model-dir", str(work / "draft")]
    if fixture.spec_type != "none":
        argv += ["--spec-type", fixture.spec_type]
    if fixture.reduced_vocab is not None:
        vocab_dir = work / "reduced_vocab"
        vocab_dir.mkdir()
        save_file({"vocab_map": np.asarray(fixture.reduced_vocab, np.int32)},
                  str(vocab_dir / "vocab_map.safetensors"))
        argv += ["--reduced-vocab-dir", str(vocab_dir)]
    if fixture.tp_size > 1:
        argv += ["--tp-size", str(fixture.tp_size), "--tp-rank", "0"]
    argv += fixture.builder_args

    # cli._build without load_plugin_library; cli._build_one without build_engine (see docstring).
    args = cli._parser().parse_args(argv)
    bundle, components = cli._resolve_build_selection(args)
    for _label, plan_args, plan_bundle, component in cli._build_plan(args, bundle, components):
        build_args = cli._build_args(plan_args, component.value)
        cfg = load_device_config(build_args)
        build_args.validate()  # the first step of build_engine
        _reduced_vocab(cfg, build_args)
        artifact_cfg = cfg
        if build_args.tp_size > 1:
            artifact_cfg = load_device_config(replace(build_args, tp_size=1, tp_rank=0))
            artifact_cfg.reduced_vocab_size = cfg.reduced_vocab_size
        writer = registry.artifact_writer_for(plan_bundle.root_model_type, build_args.spec_type,
                                              build_args.resolved_spec_role,
                                              build_args.dflash_version)
        writer.write_artifacts(plan_bundle, artifact_cfg, build_args, plan_args.engine_dir)
    return engine_dir


def generate(out: Path) -> list[Path]:
    """Write every fixture under ``out``; return the files written."""
    written: list[Path] = []
    for fixture in FIXTURES:
        with tempfile.TemporaryDirectory(prefix="edgellm-fixture-") as tmp:
            work = Path(tmp)
            engine_dir = _build_engine_dir(fixture, work)
            target = out / fixture.name
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            configs = sorted(p.name for p in engine_dir.iterdir()
                             if p.name in ("config.json", "base_config.json", "draft_config.json")
                             or p.name.startswith("config_world"))
            if configs != sorted(fixture.outputs):
                raise RuntimeError(f"{fixture.name}: the package wrote {configs}, "
                                   f"expected {fixture.outputs}")
            sources = [("model", "hf_config.json")]
            if fixture.draft_hf is not None:
                sources.append(("draft", "draft_hf_config.json"))
            copies = [(engine_dir / name, target / name) for name in fixture.outputs]
            copies += [(work / d / "config.json", target / name) for d, name in sources]
            for side in ("hf_quant_config.json", "generation_config.json"):
                if (work / "model" / side).exists():
                    copies.append((work / "model" / side, target / side))
            for src, dst in copies:
                data = src.read_bytes()
                json.loads(data)  # every fixture is valid JSON
                if tmp.encode() in data:
                    raise RuntimeError(f"{src} contains the temporary path {tmp}")
                dst.write_bytes(data)
                written.append(dst)
        print(f"{fixture.name}: {', '.join(fixture.outputs)}", file=sys.stderr)
    readme = out / "README.md"
    readme.write_text(_readme())
    written.append(readme)
    return written


def _command(fixture: Fixture) -> str:
    """The equivalent ``python -m experimental.builder`` command line for a fixture."""
    words = ["python -m experimental.builder", "--model-dir MODEL", "--engine-dir ENGINE"]
    if fixture.draft_hf is not None:
        words.append("--draft-model-dir DRAFT")
    if fixture.spec_type != "none":
        words.append(f"--spec-type {fixture.spec_type}")
    if fixture.reduced_vocab is not None:
        words.append("--reduced-vocab-dir VOCAB")
    if fixture.tp_size > 1:
        words.append(f"--tp-size {fixture.tp_size} --tp-rank 0")
    args = fixture.builder_args
    words += [f"{args[i]} {args[i + 1]}" for i in range(0, len(args), 2)]
    return " ".join(words)


def _readme() -> str:
    lines = [
        "# Edge-LLM 0.11 engine-directory configs (generated)",
        "",
        "Written by NVIDIA's `tensorrt-edgellm` 0.11.0 package (its checkpoint-direct builder's",
        "artifact writer, `experimental/builder/core/artifacts/runtime_artifacts.py::write_runtime_artifacts`",
        "-> `runtime_config.py::build_runtime_config`) from tiny Hugging Face configs written by",
        "transformers 5.14.1. Do not edit: regenerate with `scripts/make_edgellm_fixtures.py` (its",
        "docstring says how). No engine was built, so the configs lack the `checkpoint_weight_bindings`,",
        "`checkpoint_identity` and `checkpoint_dir` keys that the builder adds after a TensorRT build.",
        "",
        "Each folder is flat, as Edge-LLM writes an engine directory: `config.json` (plain LLM),",
        "`base_config.json` + `draft_config.json` (speculative pair) or `config_world2.json` (tensor",
        "parallel), beside `hf_config.json` (the checkpoint config the package read; a pair's draft:",
        "`draft_hf_config.json`) and any other checkpoint file it read (`hf_quant_config.json`,",
        "`generation_config.json`).",
        "",
        "| fixture | files | what | equivalent builder command |",
        "| --- | --- | --- | --- |",
    ]
    for fixture in FIXTURES:
        lines.append(f"| `{fixture.name}` | {', '.join(f'`{o}`' for o in fixture.outputs)} | "
                     f"{fixture.note} | `{_command(fixture)}` |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=OUT, help="fixture root (default: %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temporary folder and byte-compare with --out")
    args = parser.parse_args(argv)
    _check_versions()
    import logging
    logging.basicConfig(level=logging.WARNING)
    if not args.check:
        generate(args.out)
        return 0
    with tempfile.TemporaryDirectory(prefix="edgellm-fixtures-check-") as tmp:
        fresh = generate(Path(tmp))
        differ = []
        for path in fresh:
            rel = path.relative_to(tmp)
            old = args.out / rel
            if not old.exists() or old.read_bytes() != path.read_bytes():
                differ.append(str(rel))
        extra = sorted(str(p.relative_to(args.out)) for p in args.out.rglob("*")
                       if p.is_file() and not (Path(tmp) / p.relative_to(args.out)).exists())
    if differ or extra:
        print("differ: " + ", ".join(differ), file=sys.stderr)
        print("not generated: " + ", ".join(extra), file=sys.stderr)
        return 1
    print(f"{len(fresh)} files reproduced byte for byte", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
