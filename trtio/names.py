"""Binding-name constants, with the exact string values of Edge-LLM's ``bindingNames.h``.

Per-layer names come from the formatters at the bottom (``past_key_values(3)`` ->
``"past_key_values_3"``). Layer indices are local: attention layers and recurrent (Mamba)
layers are numbered separately, as in Edge-LLM.
"""

from __future__ import annotations

from trtio._checks import check_int
from trtio.errors import InvalidValueError

# -- LLM core ---------------------------------------------------------------------------------
kInputsEmbeds = "inputs_embeds"
kPleTokenEmbedsTemplate = "ple_token_embeds"
kContextLengths = "context_lengths"
kLastTokenIds = "last_token_ids"
kLogits = "logits"
kOutputHiddenStates = "hidden_states"
kKVCacheStartIndex = "kvcache_start_index"
kKVPageTable = "kv_page_table"
kSwaKVPageTable = "swa_kv_page_table"  # Gemma 4: the sliding layers' page table (bounded pool or kv_page_table)
kSwaKVCacheMode = "swa_kv_cache_mode"  # Gemma 4: shape-only; length 0 full storage, 1 the bounded SWA pool
kRopeCosSin = "rope_rotary_cos_sin"
kRopeCosSinSliding = "rope_rotary_cos_sin_sliding"
kRopeCosSinFull = "rope_rotary_cos_sin_full"
kContextMaskSelector = "context_mask_selector"
kVisionBlockIds = "vision_block_ids"

# -- token-major ("ragged") contract, Edge-LLM 0.11 ----------------------------------------------
kPositions = "positions"
kQueryStartOffsets = "query_start_offsets"
kQueryLengths = "query_lengths"
kPastLengths = "past_lengths"
kAttentionSequenceLengths = "attention_sequence_lengths"
kStateIndices = "state_indices"
kExecutionPhaseMarker = "execution_phase_marker"
kContextSequenceCountCarrier = "context_sequence_count_carrier"
kLogitsIndices = "logits_indices"
kPackedAttentionMask = "packed_attention_mask"
kAttentionPositionIds = "attention_position_ids"
kValidTreeCounts = "valid_tree_counts"

# -- KV cache and other past/present state ----------------------------------------------------
kPastKeyValuesTemplate = "past_key_values"
kPresentKeyValuesTemplate = "present_key_values"
kKCacheTemplate = "k_cache"
kVCacheTemplate = "v_cache"
kPresentKCacheTemplate = "present_k_cache"
kPresentVCacheTemplate = "present_v_cache"
kRecurrentStateTemplate = "recurrent_state"
kPresentRecurrentStateTemplate = "present_recurrent_state"
kConvStateTemplate = "conv_state"
kPresentConvStateTemplate = "present_conv_state"
kIntermediateConvStateTemplate = "intermediate_conv_state"
kIntermediateRecurrentStateTemplate = "intermediate_recurrent_state"
kReplayDaStateTemplate = "replay_da_state"
kReplayUStateTemplate = "replay_u_state"
kReplayBStateTemplate = "replay_b_state"
kReplayDtStateTemplate = "replay_dt_state"

# -- speculative decoding ---------------------------------------------------------------------
kBaseModelHiddenStates = "hidden_states_input"
kDraftModelHiddenStates = "hidden_states_from_draft"
kAttentionMask = "attention_mask"
kAttentionPosId = "attention_pos_id"
kSpecVerifyPhaseMarker = "spec_verify_phase_marker"
kSkipSoftmaxScale = "skip_softmax_scale"
kTreeParentIds = "tree_parent_ids"
kTreeDepths = "tree_depths"
kDFlashTargetHiddenConcat = "dflash_target_hidden_concat"
kDFlashDeltaLengths = "dflash_delta_lengths"
kDSparkHiddenStates = "dspark_hidden_states"

# -- multimodal -------------------------------------------------------------------------------
kDeepstackFeaturesTemplate = "deepstack_features"
kDeepstackEmbedsTemplate = "deepstack_embeds"

# -- DiffusionGemma ---------------------------------------------------------------------------
kPhaseIsEncoder = "phase_is_encoder"
kSelectTokenIndices = "select_token_indices"
kCanvasIds = "canvas_ids"
kPrevSelfConditioningEmbeds = "prev_self_conditioning_embeds"
kNextSelfConditioningEmbeds = "next_self_conditioning_embeds"
kSelfConditioningTemperature = "self_conditioning_temperature"

# -- vision encoders --------------------------------------------------------------------------
kVisualInput = "input"
kVisualShuffleIndices = "shuffle_indices"
kVisualOutput = "output"
kVisualRotaryPosEmb = "rotary_pos_emb"
kVisualPixelPositionIds = "pixel_position_ids"
kVisualCuSeqlens = "cu_seqlens"
kVisualKVLengths = "kv_lengths"
kVisualKVLengthsWindow = "kv_lengths_window"
kVisualMaxSeqlenCarrier = "max_seqlen_carrier"
kVisualPoolingWeights = "pooling_weights"
kVisualCuWindowSeqlens = "cu_window_seqlens"
kVisualWindowIndex = "window_index"
kVisualReverseWindowIndex = "reverse_window_index"
kVisualFastPosEmbedIdx = "fast_pos_embed_idx"
kVisualFastPosEmbedWeight = "fast_pos_embed_weight"

# -- audio encoders ---------------------------------------------------------------------------
kAudioInputFeatures = "input_features"
kAudioPaddedFeature = "padded_feature"
kAudioPaddedMaskAfterCnnIndices = "padded_mask_after_cnn_indices"
kAudioAttentionMask = "attention_mask"
kAudioLastHiddenState = "last_hidden_state"

# -- action (Alpamayo) ------------------------------------------------------------------------
kNoiseTrajectory = "noise_trajectory"
kTimeStepsT0 = "time_steps_t0"
kTimeStepsT1 = "time_steps_t1"
kDenoisedTrajectory = "denoised_trajectory"


def _layer(template: str, i: int) -> str:
    return f"{template}_{check_int(i, f'layer index for {template!r}', minimum=0, error=InvalidValueError)}"


def past_key_values(i: int) -> str:
    return _layer(kPastKeyValuesTemplate, i)


def present_key_values(i: int) -> str:
    return _layer(kPresentKeyValuesTemplate, i)


def kv_cache_name(i: int, is_past: bool) -> str:
    """Edge-LLM's ``formatKVCacheName``."""
    return past_key_values(i) if is_past else present_key_values(i)


def k_cache(i: int) -> str:
    return _layer(kKCacheTemplate, i)


def v_cache(i: int) -> str:
    return _layer(kVCacheTemplate, i)


def present_k_cache(i: int) -> str:
    return _layer(kPresentKCacheTemplate, i)


def present_v_cache(i: int) -> str:
    return _layer(kPresentVCacheTemplate, i)


def recurrent_state(i: int) -> str:
    return _layer(kRecurrentStateTemplate, i)


def present_recurrent_state(i: int) -> str:
    return _layer(kPresentRecurrentStateTemplate, i)


def conv_state(i: int) -> str:
    return _layer(kConvStateTemplate, i)


def present_conv_state(i: int) -> str:
    return _layer(kPresentConvStateTemplate, i)


def intermediate_conv_state(i: int) -> str:
    return _layer(kIntermediateConvStateTemplate, i)


def intermediate_recurrent_state(i: int) -> str:
    return _layer(kIntermediateRecurrentStateTemplate, i)


def deepstack_embeds(i: int) -> str:
    return _layer(kDeepstackEmbedsTemplate, i)


def deepstack_features(i: int) -> str:
    return _layer(kDeepstackFeaturesTemplate, i)


def ple_token_embeds(i: int) -> str:
    return _layer(kPleTokenEmbedsTemplate, i)


# Past -> present prefixes of state that an engine updates in place (output aliases input).
STATE_PAIRS: tuple[tuple[str, str], ...] = (
    (kPastKeyValuesTemplate, kPresentKeyValuesTemplate),
    (kKCacheTemplate, kPresentKCacheTemplate),
    (kVCacheTemplate, kPresentVCacheTemplate),
    (kRecurrentStateTemplate, kPresentRecurrentStateTemplate),
    (kConvStateTemplate, kPresentConvStateTemplate),
)


def past_name_for_present(name: str) -> str | None:
    """The input a ``present_*`` output updates by convention, or None if ``name`` is not one."""
    for past, present in STATE_PAIRS:
        if name.startswith(present + "_"):
            return past + name[len(present):]
    return None


def is_kv_cache_binding(name: str) -> bool:
    """True for any past/present KV-cache name (Edge-LLM's ``isKVCacheBinding``)."""
    prefixes = STATE_PAIRS[0] + STATE_PAIRS[1] + STATE_PAIRS[2]
    return any(name.startswith(p + "_") for p in prefixes)
