import pytest

from trtio import names


def test_core_values_match_edge_llm():
    assert names.kInputsEmbeds == "inputs_embeds"
    assert names.kContextLengths == "context_lengths"
    assert names.kLastTokenIds == "last_token_ids"
    assert names.kLogits == "logits"
    assert names.kOutputHiddenStates == "hidden_states"
    assert names.kKVCacheStartIndex == "kvcache_start_index"
    assert names.kRopeCosSin == "rope_rotary_cos_sin"
    assert names.kAttentionMask == "attention_mask"
    assert names.kAttentionPosId == "attention_pos_id"
    assert names.kBaseModelHiddenStates == "hidden_states_input"
    assert names.kDraftModelHiddenStates == "hidden_states_from_draft"
    assert names.kKVPageTable == "kv_page_table"
    assert names.kSpecVerifyPhaseMarker == "spec_verify_phase_marker"
    assert names.kSkipSoftmaxScale == "skip_softmax_scale"
    assert names.kTreeParentIds == "tree_parent_ids"
    assert names.kVisionBlockIds == "vision_block_ids"


@pytest.mark.parametrize("fn,expected", [
    (names.past_key_values, "past_key_values_3"),
    (names.present_key_values, "present_key_values_3"),
    (names.k_cache, "k_cache_3"),
    (names.v_cache, "v_cache_3"),
    (names.present_k_cache, "present_k_cache_3"),
    (names.present_v_cache, "present_v_cache_3"),
    (names.deepstack_embeds, "deepstack_embeds_3"),
    (names.recurrent_state, "recurrent_state_3"),
    (names.conv_state, "conv_state_3"),
])
def test_formatters(fn, expected):
    assert fn(3) == expected


@pytest.mark.parametrize("bad", [-1, 1.0, "1", True])
def test_formatters_reject_bad_indices(bad):
    with pytest.raises(ValueError, match="layer index"):
        names.k_cache(bad)


def test_kv_cache_name_and_present_mapping():
    assert names.kv_cache_name(2, True) == "past_key_values_2"
    assert names.kv_cache_name(2, False) == "present_key_values_2"
    assert names.past_name_for_present("present_k_cache_5") == "k_cache_5"
    assert names.past_name_for_present("present_key_values_0") == "past_key_values_0"
    assert names.past_name_for_present("logits") is None
    assert names.is_kv_cache_binding("present_v_cache_1")
    assert not names.is_kv_cache_binding("hidden_states")
