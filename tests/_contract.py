"""The engine I/O contract of docs/toy-model.md, written out from the doc (independently of the
code that declares or builds it), for tests to compare engines and networks against."""

from __future__ import annotations

import math
from typing import Any

from trtio._config import LLMEngineConfig


def expected_contract(cfg: LLMEngineConfig) -> list[dict[str, Any]]:
    role = cfg.role
    p1 = {"llm": 1, "base": cfg.max_verify_tree_size, "draft": cfg.max_draft_tree_size}[role]
    h, bm, c = cfg.hidden_size, cfg.max_supported_batch_size, cfg.max_kv_cache_capacity
    sm = cfg.max_supported_input_length
    hkv, d, r = cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim
    act, kv = cfg.activation_dtype, cfg.kv_cache_dtype

    def half(x: int) -> int:
        return max(1, x // 2)

    def seq(w: int) -> list:
        return [((1, 1, w), (bm, half(sm), w), (bm, sm, w)), ((1, 1, w), (bm, half(p1), w), (bm, p1, w))]

    def per_batch(*rest: int) -> list:
        return [((1, *rest), (bm, *rest), (bm, *rest))] * 2

    def inp(name: str, dtype: str, shape: tuple, profiles: list) -> dict[str, Any]:
        return dict(name=name, mode="input", dtype=dtype, shape=shape, profiles=profiles, aliased_input=None)

    def out(name: str, dtype: str, shape: tuple, alias: str | None = None) -> dict[str, Any]:
        return dict(name=name, mode="output", dtype=dtype, shape=shape, profiles=[], aliased_input=alias)

    rows = [inp("inputs_embeds", act, (-1, -1, h), seq(h))]
    if role == "draft":
        hb = cfg.base_model_hidden_size
        rows += [inp("hidden_states_input", act, (-1, -1, hb), seq(hb)),
                 inp("hidden_states_from_draft", act, (-1, -1, h), seq(h))]
    rows.append(inp("context_lengths", "int32", (-1,), per_batch()))
    per_step = [((1, 1), (bm, 1), (bm, 1)), ((1, 1), (bm, half(p1)), (bm, p1))]
    rows.append(inp("last_token_ids", "int64", (-1, -1), per_step))
    rows.append(inp("kvcache_start_index", "int32", (-1,), per_batch()))
    if cfg.rope_type == "mrope":
        rows.append(inp("rope_rotary_cos_sin", "float32", (-1, c, r), per_batch(c, r)))
    else:
        rows.append(inp("rope_rotary_cos_sin", "float32", (1, c, r), [((1, c, r),) * 3] * 2))
    if role != "llm":
        rows.append(inp("attention_mask", "int32", (-1, -1, -1), [
            ((1, 1, 1), (bm, 1, 1), (bm, 1, 1)),
            ((1, 1, 1), (bm, half(p1), math.ceil(half(p1) / 32)), (bm, p1, math.ceil(p1 / 32)))]))
        rows.append(inp("attention_pos_id", "int32", (-1, -1), per_step))
    for i in range(cfg.num_deepstack_features):
        rows.append(inp(f"deepstack_embeds_{i}", act, (-1, -1, h), seq(h)))
    for i in range(cfg.num_attention_layers):
        rows.append(inp(f"k_cache_{i}", kv, (-1, hkv, c, d), per_batch(hkv, c, d)))
        rows.append(inp(f"v_cache_{i}", kv, (-1, hkv, c, d), per_batch(hkv, c, d)))
    rows.append(out("logits", "float32", (-1, cfg.output_vocab_size)))
    rows.append(out("hidden_states", act, (-1, -1, h)))
    for i in range(cfg.num_attention_layers):
        rows.append(out(f"present_k_cache_{i}", kv, (-1, hkv, c, d), f"k_cache_{i}"))
        rows.append(out(f"present_v_cache_{i}", kv, (-1, hkv, c, d), f"v_cache_{i}"))
    return rows
