"""The batch-major contract: trtio's TensorRT-native toy engines and engines built with TensorRT's
KVCacheUpdate / Attention layers (DESIGN §11).

Activations are ``[B, S, H]``; lengths and selection go through ``context_lengths`` and
``last_token_ids``; the KV caches (``k_cache_i`` / ``v_cache_i``) and ``kvcache_start_index`` belong to
the engine state, which owns their specs (:mod:`trtio.state`).
"""

from __future__ import annotations

from trtio import names
from trtio.config import LLMEngineConfig
from trtio.dtypes import DType
from trtio.registry import TensorRegistry, TensorSpec

__all__ = ["registry_for"]


def _common(reg: TensorRegistry, cfg: LLMEngineConfig) -> None:
    act = cfg.activation
    i32, i64, f32 = DType.INT32, DType.INT64, DType.FLOAT32
    reg.add(TensorSpec(names.kContextLengths, "input", i32, ("batch",)))
    reg.add(TensorSpec(names.kLastTokenIds, "input", i64, ("batch", "select_len")))
    reg.add(TensorSpec(names.kRopeCosSin, "input", f32, ("rope_batch", "kv_len", cfg.rotary_dim)))
    for i in range(cfg.num_deepstack_features):
        reg.add(TensorSpec(names.deepstack_embeds(i), "input", act, ("batch", "seq_len", cfg.hidden_size)))
    reg.add(TensorSpec(names.kLogits, "output", f32, (("batch", "select_len"), cfg.output_vocab_size)))
    # Optional: Edge-LLM serves an engine without this output from the same map.
    reg.add(TensorSpec(names.kOutputHiddenStates, "output", act, ("batch", "seq_len", cfg.hidden_size),
                       optional=True))


def _tree_inputs(reg: TensorRegistry) -> None:
    reg.add(TensorSpec(names.kAttentionMask, "input", DType.INT32,
                       ("batch", "attn_mask_seq_len", "packed_mask_len")))
    reg.add(TensorSpec(names.kAttentionPosId, "input", DType.INT32, ("batch", "attn_mask_seq_len")))


def registry_for(cfg: LLMEngineConfig) -> TensorRegistry:
    """The PipelineIO-owned bindings of a batch-major engine of ``cfg.role`` (llm, base or draft)."""
    reg = TensorRegistry(cfg.role, contract="batch")
    act = cfg.activation
    reg.add(TensorSpec(names.kInputsEmbeds, "input", act, ("batch", "seq_len", cfg.hidden_size)))
    if cfg.role == "draft":
        reg.add(TensorSpec(names.kBaseModelHiddenStates, "input", act,
                           ("batch", "seq_len", cfg.base_model_hidden_size)))
        reg.add(TensorSpec(names.kDraftModelHiddenStates, "input", act, ("batch", "seq_len", cfg.hidden_size)))
    _common(reg, cfg)
    if cfg.role != "llm":
        _tree_inputs(reg)
    return reg
