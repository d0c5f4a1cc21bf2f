import pytest
from _configs import bundle, llm_config

from trtio import DType, names
from trtio._contracts import build_registry
from trtio._registry import TensorRegistry, TensorSpec


def test_llm_registry_names_and_counts():
    cfg = llm_config(num_attention_layers=3, num_deepstack_features=2)
    reg = build_registry(cfg)
    assert reg.role == "llm" and reg.contract == "batch"
    # 6 core + 2 deepstack; the KV caches and kvcache_start_index are the engine state's (it owns their specs)
    assert len(reg) == 6 + 2
    assert names.kAttentionMask not in reg
    assert names.k_cache(0) not in reg and names.kKVCacheStartIndex not in reg
    assert reg[names.kLogits].dtype is DType.FLOAT32 and reg[names.kLastTokenIds].dtype is DType.INT64


def test_spec_base_and_draft_registries():
    b = bundle()
    base = build_registry(b.base)
    draft = build_registry(b.draft)
    assert base.role == "base" and draft.role == "draft"
    assert names.kAttentionMask in base and names.kAttentionPosId in base
    assert names.kBaseModelHiddenStates not in base
    assert draft[names.kBaseModelHiddenStates].shape == ("batch", "seq_len", 64)
    assert draft[names.kDraftModelHiddenStates].shape == ("batch", "seq_len", b.draft.hidden_size)
    assert len(draft) == 3 + 5 + 2


def test_resolve_against_recipes():
    cfg = llm_config(is_spec_decode_base=True, max_verify_tree_size=40, kv_cache_dtype="bfloat16")
    reg = build_registry(cfg)
    shapes = reg.resolve_all(cfg.spec_verify_dims(3, 33))
    assert shapes[names.kInputsEmbeds] == (3, 33, 64)
    assert shapes[names.kLogits] == (99, 512)
    assert shapes[names.kLastTokenIds] == (3, 33)
    assert shapes[names.kAttentionMask] == (3, 33, 2)
    assert shapes[names.kRopeCosSin] == (1, 128, 16)
    pre = reg.resolve_all(cfg.prefill_dims(2, 10))
    assert pre[names.kAttentionMask] == (2, 1, 1), "prefill binds the [B,1,1] causal sentinel"


def test_registry_rejects_duplicates_and_rank():
    reg = TensorRegistry("x", [TensorSpec("a", "input", DType.INT32, ("batch",))])
    with pytest.raises(ValueError, match="'a' is declared twice"):
        reg.add(TensorSpec("a", "input", DType.INT32, ("batch",)))
    with pytest.raises(ValueError, match="rank 9"):
        reg.add(TensorSpec("b", "input", DType.INT32, (1,) * 9))
    assert reg.referenced_members() == {"batch"}
    assert "a (input, int32, [batch])" == str(reg["a"])
