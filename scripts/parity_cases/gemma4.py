"""Gemma 4 text: sliding and full layers (a small window), KV sharing, per-layer embeddings (PLE), dual RoPE; each
export built two ways (full and bounded SWA storage).

Two cases: ``gemma4`` with KV sharing (layers 4-5 read layers 3 and 2) runs the steps that start from an empty
cache; ``gemma4-unshared`` (no KV sharing) the steps over a cached prefix (chunked prefill, a pinned prefix
continued). Edge-LLM 0.11's AttentionPlugin rotates a Q-only KV-sharing layer's queries with the wrong RoPE rows in
such a step (``docs/edgellm-assumptions.md`` §10.9): trtio refuses them on a KV-sharing engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from make_parity_fixtures import Case, Role, Sequence, causal_reference, load_hf, save_checkpoint, seeded_model

WINDOW = 24  # tokens a sliding layer sees: every prompt crosses it
PAGE = 128

# Full SWA storage: 2 pages a sequence, a pool of 8; the bounded budget (4 x 5 pages) is not below it.
FULL = {"max_batch_size": 4, "max_input_len": 128, "max_kv_cache_capacity": 256}
# Bounded SWA storage: 8 pages a sequence, a full pool of 32; the sliding pools take the 4 x 5 = 20 private pages.
BOUNDED = {"max_batch_size": 4, "max_input_len": 128, "max_kv_cache_capacity": 1024}

SHARED_SEQUENCES = (
    # a batch of two lengths, both past the window; the long one (five windows) is decoded across the 128-token page
    Sequence("batch", 45), Sequence("batch", 126),
    Sequence("admit", 33),  # admitted into a released slot
)
UNSHARED_SEQUENCES = (
    # chunks of 48 over the last one's window (the last one's on two pages); its decodes retire page 0 of a bounded
    # window (end - W passes 128)
    Sequence("chunked", 150, marks=(47, 95, 143)),
    # a prefix of a full page and 64 tokens pinned and continued (full storage only: a bounded window cannot keep it)
    Sequence("prefix", 200, marks=(191,)),
)
_S, _F = "sliding_attention", "full_attention"


def _gemma4(folder: Path, seed: int, layers: list[str], shared: int) -> None:
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=len(layers),
                              num_attention_heads=4, num_key_value_heads=1, head_dim=32, global_head_dim=64,
                              layer_types=layers, sliding_window=WINDOW, num_kv_shared_layers=shared,
                              vocab_size_per_layer_input=512, hidden_size_per_layer_input=8,
                              final_logit_softcapping=30.0, max_position_embeddings=2048, initializer_range=0.2)
    save_checkpoint(seeded_model(Gemma4ForCausalLM, config, seed), folder)


def gemma4_text(folder: Path, seed: int) -> None:
    _gemma4(folder, seed, [_S, _S, _F, _S, _S, _F], shared=2)


def gemma4_unshared(folder: Path, seed: int) -> None:
    _gemma4(folder, seed, [_S, _S, _F], shared=0)


def reference(case: Case, checkpoint: Path, out: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The default reference, plus how far Hugging Face's own float16 forward is from its float32 one on every
    compared row (``hf_fp16_worst`` per sequence): Gemma 4 attends with scale 1 over RMS-normed q and k, so its
    scores are sqrt(head_dim) times a Qwen3's and fp16 rounding moves its logits more; the tests' tolerance is
    justified by this number."""
    import torch

    arrays, meta = causal_reference(case, checkpoint, out, model=load_hf(checkpoint))
    half = load_hf(checkpoint).to(torch.float16)
    for i, info in enumerate(meta["sequences"]):
        tokens, rows = arrays[f"tokens_{i}"], arrays[f"positions_{i}"]
        with torch.no_grad():
            logits = half(torch.tensor(tokens[:-1], dtype=torch.long)[None]).logits[0].float().numpy()
        info["hf_fp16_worst"] = round(float(np.abs(logits[rows] - arrays[f"logits_{i}"]).max()), 4)
    return arrays, meta


def cpp_builder_profiles(profiles: dict[str, Any], inputs: dict[str, tuple[int, ...]], config: dict[str, Any],
                         build: dict[str, Any]) -> dict[str, Any]:
    """What Edge-LLM 0.11's C++ builder sets where the Python ``_setup_llm_profiles`` sets nothing for the exported
    Gemma 4 graph (transcribed from ``cpp/builder/llmBuilder.cpp``):

    - ``setupCommonProfiles``: with reduced ``kv_cache_capacity`` markers, ``swa_kv_page_table`` takes the ranges of
      ``kv_page_table`` and the shape-only ``swa_kv_cache_mode`` ``[0]`` / ``[1]`` / ``[1]``, in both profiles;
    - ``setupKVCacheProfiles``: a layer whose capacity is reduced (``0 < cap < max_kv_cache_capacity``) takes
      ``resolveKVPoolPageProfile(cap)`` = ``{min(bounded, full), min(bounded, full), max(bounded, full)}`` pages,
      bounded = ``resolveNumSwaPages(cap)`` = ``computeMinimumSwaPoolPages(batch, cap)`` =
      ``batch * (2 * (ceil(cap / 128) + kSWA_BOUNDARY_HEADROOM_PAGES 1) + kSWA_REPLACEMENT_PAGES 1)``.
    """
    batch, capacity = int(build["max_batch_size"]), int(build["max_kv_cache_capacity"])
    pages_per_seq = -(-capacity // PAGE)
    full_pages = batch * pages_per_seq
    caps = [int((entry or {}).get("kv_cache_capacity", 0)) for entry in config["kv_layer_configs"]]
    reduced = [0 < cap < capacity for cap in caps]
    out = dict(profiles)
    if not any(reduced):
        return out
    table = [[1, 2, pages_per_seq], [batch, 2, pages_per_seq], [batch, 2, pages_per_seq]]
    out["swa_kv_page_table"] = {"profile0": table, "profile1": table}
    out["swa_kv_cache_mode"] = {"profile0": [[0], [1], [1]], "profile1": [[0], [1], [1]]}
    for layer, cap in enumerate(caps):
        if not reduced[layer]:
            continue
        bounded = batch * (2 * (-(-cap // PAGE) + 1) + 1)
        name = f"past_key_values_{layer}"
        heads, dim = int(inputs[name][3]), int(inputs[name][4])
        low, high = min(bounded, full_pages), max(bounded, full_pages)
        shapes = [[2, n, PAGE, heads, dim] for n in (low, low, high)]
        out[name] = {"profile0": shapes, "profile1": shapes}
    return out


_NOTES = ("`llm-bounded` is the same exported graph (`graphs.json`) with a builder config whose KV capacity (1024) "
          "makes the bounded SWA pool (4 x 5 pages) smaller than the full one (32 pages), so the runtime binds "
          "`swa_kv_cache_mode` of extent 1. The Python builder function the profiles are recorded from sets no "
          "profile for `swa_kv_page_table` / `swa_kv_cache_mode` and fixes every pool at the full page count (its own "
          "Gemma 4 graph has no SWA inputs); those entries are Edge-LLM's C++ builder's (`cpp/builder/llmBuilder.cpp`, "
          "`setupCommonProfiles` / `setupKVCacheProfiles`), transcribed in "
          "`scripts/parity_cases/gemma4.py::cpp_builder_profiles`. `reference.json` also records, per sequence, how "
          "far Hugging Face's own float16 forward is from its float32 logits on the compared rows (`hf_fp16_worst`): "
          "the tests' tolerance rests on it.")


def _roles() -> dict[str, Role]:
    return {"llm": Role("llm", FULL, amend_profiles=cpp_builder_profiles),
            "llm-bounded": Role("llm", BOUNDED, graph="llm", amend_profiles=cpp_builder_profiles)}


CASES = [
    Case("gemma4", "Gemma 4 text: 6 layers of 64 (sliding S S F S S F, window 24, head dims 32 / 64), layers 4-5 "
                   "reading the KV of layers 3 and 2, PLE of 8 a layer, dual RoPE (proportional on full layers), "
                   "logit softcapping 30, vocab 512; built for full SWA storage (`llm`) and bounded (`llm-bounded`).",
         gemma4_text, _roles(), sequences=SHARED_SEQUENCES, reference=reference, notes=_NOTES),
    Case("gemma4-unshared", "Gemma 4 text without KV sharing, for steps over a cached prefix: 3 layers of 64 "
                            "(S S F, window 24, head dims 32 / 64), PLE of 8 a layer, dual RoPE, logit softcapping 30, "
                            "vocab 512; built for full SWA storage (`llm`) and bounded (`llm-bounded`).",
         gemma4_unshared, _roles(), sequences=UNSHARED_SEQUENCES, reference=reference,
         notes=_NOTES + " Edge-LLM 0.11 rotates a KV-sharing layer's queries (Q only) with the wrong RoPE rows in a "
                        "step over a cached prefix (docs/edgellm-assumptions.md §10.9), so chunked prefill and a "
                        "pinned prefix continued are checked on this model, which shares no KV."),
]
