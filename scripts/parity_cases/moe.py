"""Mixture of experts: Qwen3-MoE (Edge-LLM's Fp16MoePlugin: softmax top-k routing, SwiGLU experts)."""

from __future__ import annotations

from pathlib import Path

from make_parity_fixtures import TEXT_BUILDER, Case, Role, save_checkpoint, seeded_model


def qwen3_moe(folder: Path, seed: int) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    # norm_topk_prob true: the 0.11 exporter passes norm_topk_prob = 1 to the plugin whatever the checkpoint says
    # (docs/edgellm-assumptions.md), so only such a checkpoint is what the engine computes.
    config = Qwen3MoeConfig(vocab_size=512, hidden_size=128, intermediate_size=128, moe_intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                            num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True,
                            max_position_embeddings=512, rope_theta=10000.0, initializer_range=0.2,
                            tie_word_embeddings=False)
    save_checkpoint(seeded_model(Qwen3MoeForCausalLM, config, seed), folder)


CASES = [
    Case("qwen3-moe", "Qwen3-MoE: 2 layers of 128, 8 experts (2 routed per token) of 64, QK norm, vocab 512.",
         qwen3_moe, {"llm": Role("llm", TEXT_BUILDER)},
         notes="A real Fp16MoePlugin builds only for 128 or 256 experts (`fp16MoePlugin.cpp::validateAttributes`); "
               "this fixture's 8 experts keep it small enough to commit, so it checks the graph and trtio's inputs "
               "with the plugin's math, not a buildable engine."),
]
