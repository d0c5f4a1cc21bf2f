"""Phi-4-multimodal's LLM (``phi4_multimodal``): LongRoPE with partial rotary 0.75 (head 32, rotary 24: 12 short and
12 long factors), the Phi-3 decoder (fused ``qkv_proj`` / ``gate_up_proj``), exported without its visual and audio
encoders (``--skip-visual --skip-audio``: the visual export hard-codes SigLIP-so400m).

Edge-LLM 0.11's runtime rotates every position with one static table (``cpp/runtime/state/ropeCache.cpp``): the
short factors where the KV capacity is within ``original_max_position_embeddings``, else the long ones. Hugging
Face picks per forward (``longrope_frequency_update``: long once ``max(position_ids) + 1`` passes the original
length). The two agree for every sequence only where the capacity is within the original length, which is what
trtio accepts (``docs/edgellm-assumptions.md`` 5.2): so the case's original length is the KV capacity (256), every
scenario runs under HF's switch on the short factors, and its factor ``max_position_embeddings / original`` = 4 gives
the attention factor ``sqrt(1 + ln 4 / ln 256)`` = 1.118 on cos and sin. The short factors (1 .. 3.2) change the
table at every position the scenarios use; the long ones (1 .. 12) are far from them, so a swapped table shows.
"""

from __future__ import annotations

from pathlib import Path

from make_parity_fixtures import TEXT_BUILDER, Case, Role, save_checkpoint, seeded_model

ORIGINAL = TEXT_BUILDER["max_kv_cache_capacity"]
SHORT = [round(1.0 + 0.2 * i, 2) for i in range(12)]
LONG = [round(1.0 + 1.0 * i, 2) for i in range(12)]
IMAGE_TOKEN_ID = 500


# The switch case: the same model with its switch at 64 tokens, inside the KV capacity (trtio refuses to bind it;
# the test lifts the refusal to measure what it avoids): HF rotates the batch's and the admitted prompts (<= 25
# tokens) with the short factors, the chunked and the prefix sequences (> 64) with the long ones at every position.
SWITCH = 64


def phi4mm(folder: Path, seed: int, original: int = ORIGINAL) -> None:
    from transformers import Phi4MultimodalConfig, Phi4MultimodalForCausalLM

    config = Phi4MultimodalConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=4 * original, original_max_position_embeddings=original,
        initializer_range=0.2, bos_token_id=499, eos_token_id=[499, 501], pad_token_id=499,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                         "short_factor": SHORT, "long_factor": LONG, "original_max_position_embeddings": original},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_token_id": IMAGE_TOKEN_ID},
        audio_config={"hidden_size": 32, "intermediate_size": 64, "num_blocks": 1, "num_attention_heads": 2,
                      "audio_token_id": 502},
        architectures=["Phi4MultimodalForCausalLM"])
    save_checkpoint(seeded_model(Phi4MultimodalForCausalLM, config, seed), folder)


def phi4mm_switch(folder: Path, seed: int) -> None:
    phi4mm(folder, seed, SWITCH)


CASES = [
    Case("phi4mm", "Phi-4-multimodal's LLM (LongRoPE: 12 short factors 1..3.2, 12 long 1..12, original 256 = the KV "
                   "capacity, factor 4: attention factor 1.118; partial rotary 0.75 of a 32-wide head): 4 layers of "
                   "64, 2 query heads and 1 KV head, vocab 512; exported with --skip-visual --skip-audio.",
         phi4mm, {"llm": Role("llm", TEXT_BUILDER)}, export_flags=("--skip-visual", "--skip-audio")),
    Case("phi4mm-switch", "The phi4mm case's model with LongRoPE's switch at 64 tokens (max_position_embeddings 256: "
                          "attention factor 1.153), inside the KV capacity of 256: HF's reference rotates prompts "
                          "within 64 tokens with the short factors, longer ones with the long factors everywhere.",
         phi4mm_switch, {"llm": Role("llm", TEXT_BUILDER)}, export_flags=("--skip-visual", "--skip-audio")),
]
