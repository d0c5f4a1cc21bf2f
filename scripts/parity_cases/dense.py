"""Dense text models: Qwen3 (with its QK norm in the attention plugin)."""

from __future__ import annotations

from pathlib import Path

from make_parity_fixtures import TEXT_BUILDER, Case, Role, save_checkpoint, seeded_model


def qwen3(folder: Path, seed: int) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         rope_theta=10000.0, initializer_range=0.2, tie_word_embeddings=False)
    save_checkpoint(seeded_model(Qwen3ForCausalLM, config, seed), folder)


CASES = [
    Case("qwen3", "Dense Qwen3: 4 layers of 64, 4 query heads and 2 KV heads of 16, QK norm, vocab 512.",
         qwen3, {"llm": Role("llm", TEXT_BUILDER)}),
]
