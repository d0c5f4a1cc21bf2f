"""Dense text models with scaled RoPE: Llama 3.x (``llama3``), Qwen3 with YaRN (``yarn``), HunYuan V1 dense with
DynamicNTKAlpha (``hunyuan``, its QK norm after RoPE).

Each keeps a rotary dimension of 64 (2 query heads and 1 KV head of 64): Edge-LLM 0.11's runtime builds
Llama-3 and YaRN tables for rotary dimension 64 or 128 only (``cpp/runtime/llmRuntimeUtils.cpp``,
``initializeLlama3RopeCosSinCache`` / ``initializeYarnRopeCosSinCache``), so a smaller head would not be a model a
real engine runs. Each scaling is chosen so that it changes the table at the positions the scenarios use (0-160;
``tests/test_parity_rope.py`` checks it): for ``llama3`` and ``yarn`` an ``original_max_position_embeddings`` of 64
puts the scaled bands' wavelengths inside that range; HunYuan's alpha 1000 (its checkpoints' value) lowers every
frequency but the first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from make_parity_fixtures import TEXT_BUILDER, Case, Role, save_checkpoint, seeded_model

# The sizes shared by the cases: 4 layers of 64, 2 query heads and 1 KV head of 64 (the attention 128 wide, wider
# than the hidden size, as Qwen3's head_dim allows), vocab 512. A hidden size of 64 keeps the graphs as cheap to run as
# the Qwen3 case's (numpy's float16 MatMul is most of a parity test's time) and the same initializer_range gives the
# same spread of logits (std 1.6).
SIZES: dict[str, Any] = {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "max_position_embeddings": 512,
    "initializer_range": 0.2, "tie_word_embeddings": False,
}

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}
# factor 4: HF's attention factor 0.1 ln 4 + 1 = 1.139 multiplies cos and sin.
YARN_SCALING = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
# HunYuan's own checkpoints carry YaRN's keys beside alpha; transformers reads only alpha (base * alpha^(d/(d-2))).
HUNYUAN_SCALING = {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32, "beta_slow": 1,
                   "mscale": 1.0, "mscale_all_dim": 1.0}


def llama3(folder: Path, seed: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    # initializer_range 0.16: without a QK norm the attention scores of 0.2 spread wider, and fp16 rounding moved a
    # prefix row by 0.067 from HF's fp32 forward (logits std 1.7); with 0.16 the worst row is 0.018 (std 1.3).
    config = LlamaConfig(**{**SIZES, "initializer_range": 0.16}, rope_theta=10000.0,
                         rope_scaling=dict(LLAMA3_SCALING))
    save_checkpoint(seeded_model(LlamaForCausalLM, config, seed), folder)


def yarn(folder: Path, seed: int) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    # max_position_embeddings = factor * original, as a YaRN checkpoint has it (transformers warns otherwise)
    config = Qwen3Config(**{**SIZES, "max_position_embeddings": 256}, rope_theta=10000.0,
                         rope_scaling=dict(YARN_SCALING))
    save_checkpoint(seeded_model(Qwen3ForCausalLM, config, seed), folder)


def hunyuan(folder: Path, seed: int) -> None:
    from transformers import HunYuanDenseV1Config, HunYuanDenseV1ForCausalLM

    config = HunYuanDenseV1Config(**SIZES, rope_theta=10000.0, rope_scaling=dict(HUNYUAN_SCALING))
    save_checkpoint(seeded_model(HunYuanDenseV1ForCausalLM, config, seed), folder)


CASES = [
    Case("llama3", "Llama 3.x RoPE (rope_type llama3: factor 8, low/high frequency factors 1/4, original 64): "
                   "4 layers of 64, 2 query heads and 1 KV head of 64, vocab 512.",
         llama3, {"llm": Role("llm", TEXT_BUILDER)}),
    Case("yarn", "Qwen3 with YaRN RoPE (factor 4, original 64: attention factor 1.139): 4 layers of 64, 2 query "
                 "heads and 1 KV head of 64, QK norm, vocab 512.",
         yarn, {"llm": Role("llm", TEXT_BUILDER)}),
    Case("hunyuan", "HunYuan V1 dense (rope_scaling dynamic, alpha 1000: base 10000 * 1000^(64/62); QK norm after "
                    "RoPE): 4 layers of 64, 2 query heads and 1 KV head of 64, vocab 512.",
         hunyuan, {"llm": Role("llm", TEXT_BUILDER)}),
]
