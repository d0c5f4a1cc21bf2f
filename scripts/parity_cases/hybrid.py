"""Hybrid text models: Qwen3.5 (Gated DeltaNet + gated attention) and Nemotron-H (Mamba2 + NoPE attention + MLP).

The real plugins build only for some head sizes: Edge-LLM 0.11's Gated DeltaNet plugin
for key and value heads of 128 (``cuteDslGDNRunner.cpp::canImplement``), its Mamba2 kernels for a head size and an
SSM state size of 64, 80, 128 or 256 (``selectiveStateUpdate.cu``: ``AllowedDims`` / ``AllowedDstates``). The tiny
checkpoints keep those sizes and shrink layers, heads and vocabulary instead.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
from make_parity_fixtures import TEXT_BUILDER, Case, Role, causal_reference, load_hf, save_checkpoint, seeded_model

# Nemotron-H in the Hub's layout (``hybrid_override_pattern``: "M" Mamba2, "*" attention, "-" MLP). transformers 5
# saves ``layers_block_type: ["linear_attention", ...]``, which Edge-LLM 0.11's ``config.py::_parse_layer_types``
# reads first and maps to Gated DeltaNet; the Hub layout is what NVIDIA's checkpoints carry. ``chunk_size`` 256 (the
# Hub's is 128) is longer than every reference sequence (at most 158 tokens): transformers 5.14's slow Mamba2 path
# (``NemotronHMamba2Mixer.torch_forward``, inherited from Zamba2, the one HF runs on a CPU) sums the inter-chunk
# recurrence over the wrong axis (huggingface/transformers#47246), so a sequence longer than one chunk gets wrong
# logits (up to 1.16 off from the sequential scan at row 155 with chunk 128); in one chunk there is no inter-chunk
# term. The chunk size is a kernel choice, not the model's math: Edge-LLM's exporter and plugin ignore it. (The slow
# path also clamps dt at ``time_step_min``, which the kernel path and Edge-LLM do not; it moves no logit here: 0.0.)
NEMOTRON_H = {
    "architectures": ["NemotronHForCausalLM"], "attention_bias": False, "bos_token_id": 1, "chunk_size": 256,
    "conv_kernel": 4, "eos_token_id": 2, "head_dim": 16, "hidden_size": 64, "hybrid_override_pattern": "M*-M-M",
    "intermediate_size": 128, "layer_norm_epsilon": 1e-05, "mamba_head_dim": 64, "mamba_hidden_act": "silu",
    "mamba_num_heads": 2, "max_position_embeddings": 4096, "mlp_hidden_act": "relu2", "model_type": "nemotron_h",
    "n_groups": 2, "num_attention_heads": 4, "num_hidden_layers": 6, "num_key_value_heads": 2, "ssm_state_size": 64,
    "tie_word_embeddings": False, "torch_dtype": "float16", "use_conv_bias": True, "use_bias": False,
    "initializer_range": 0.2, "vocab_size": 512,
}


def retuned(model: Any, seed: int, decay: tuple[float, float]) -> Any:
    """``model`` with each recurrent layer's own time constants, fp16-rounded: ``A_log = log U(decay)`` (slow decays,
    so a state carried over, leaked or lost shows in the logits), ``dt_bias ~ N(-1, 0.5)``, and where present
    ``D ~ N(1, 0.5)`` and the conv bias ``~ N(0, 0.2)``. HF's init gives every layer the same ``A_log`` (Mamba2) or
    ``dt_bias`` (GDN), which the exporter folds into one constant: distinct values keep each layer's own input."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    draws = {
        "A_log": lambda p: torch.log(torch.empty(p.shape).uniform_(*decay, generator=gen)),
        "dt_bias": lambda p: -1.0 + 0.5 * torch.randn(p.shape, generator=gen),
        "D": lambda p: 1.0 + 0.5 * torch.randn(p.shape, generator=gen),
        "conv1d.bias": lambda p: 0.2 * torch.randn(p.shape, generator=gen),
    }
    with torch.no_grad():
        for name, param in model.named_parameters():
            for suffix, draw in draws.items():
                if name.endswith("." + suffix):
                    param.copy_(draw(param).to(torch.float16).to(torch.float32))
    return model


def qwen3_5(folder: Path, seed: int) -> None:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=4096,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, initializer_range=0.2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        architectures=["Qwen3_5ForCausalLM"])
    save_checkpoint(retuned(seeded_model(Qwen3_5ForCausalLM, config, seed), seed, (0.02, 0.3)), folder)


def nemotron_h(folder: Path, seed: int) -> None:
    """The checkpoint in the Hub's layout: config.json as NEMOTRON_H, the embedding under the Hub's name
    ``backbone.embeddings.weight`` (transformers 5 saves ``backbone.embedding.weight``, which the 0.11 exporter skips
    with only a log line, leaving an uninitialised embedding in the graph)."""
    from safetensors.torch import load_file, save_file
    from transformers import NemotronHConfig, NemotronHForCausalLM

    config = NemotronHConfig.from_dict(copy.deepcopy(NEMOTRON_H))
    save_checkpoint(retuned(seeded_model(NemotronHForCausalLM, config, seed), seed, (0.05, 0.5)), folder)
    (file,) = folder.glob("*.safetensors")
    tensors = load_file(file)
    if "backbone.embedding.weight" in tensors:
        tensors["backbone.embeddings.weight"] = tensors.pop("backbone.embedding.weight")
    save_file(tensors, file, metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(NEMOTRON_H, indent=2) + "\n")


def nemotron_h_reference(case: Case, checkpoint: Path, out: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The default reference with HF's cache off: transformers 5.14's ``DynamicCache(config=...)`` has no layer type
    for Nemotron-H's ``"mlp"`` blocks (KeyError), and a whole-sequence forward needs no cache."""
    model = load_hf(checkpoint)
    model.config.use_cache = False
    return causal_reference(case, checkpoint, out, model=model)


CASES = [
    Case("qwen3_5", "Qwen3.5 (hybrid): 3 Gated DeltaNet layers (1 key head, 2 value heads, both of 128: the only size "
         "the 0.11 plugin builds) and 1 gated attention layer (2 query heads, 1 KV head of 32, partial rotary 0.25), "
         "hidden 64, vocab 512.",
         qwen3_5, {"llm": Role("llm", TEXT_BUILDER)}),
    Case("nemotron_h", "Nemotron-H (hybrid, use_rope false): pattern M*-M-M (3 Mamba2 layers of 2 heads of 64, 2 "
         "groups, SSM state 64; 1 NoPE attention layer; 2 relu2 MLP layers), hidden 64, vocab 512.",
         nemotron_h, {"llm": Role("llm", TEXT_BUILDER)}, reference=nemotron_h_reference,
         notes="Steps outside NVIDIA's chain: the checkpoint's `config.json` is written in the Hub's layout "
               "(`hybrid_override_pattern`), and its embedding tensor is renamed `backbone.embeddings.weight` "
               "(transformers 5 saves `backbone.embedding.weight`, which the 0.11 exporter skips, leaving an "
               "uninitialised embedding in the graph). `chunk_size` is 256 (the Hub's 128), longer than every "
               "reference sequence, so that Hugging Face's CPU (slow) Mamba2 path runs one chunk: transformers "
               "5.14 sums its inter-chunk recurrence over the wrong axis (huggingface/transformers#47246). Edge-LLM "
               "ignores the key."),
]
