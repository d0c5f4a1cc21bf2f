"""The I/O of a DFlash block draft (Edge-LLM 0.11's ``dflash_draft`` graph), on the ragged contract.

A DFlash draft differs from an EAGLE3/MTP draft (``docs/edgellm-assumptions.md`` §11.3): it reads the newly
committed tokens' target features instead of ``hidden_states_input`` / ``hidden_states_from_draft``:

* ``dflash_target_hidden_concat [delta, base_model_hidden_size]`` — the base's ``hidden_states`` rows (its
  ``dflash_config.target_layer_ids`` side by side) of the tokens committed since the draft last ran;
* ``dflash_delta_rope_cos_sin [delta, rotary_dim]``, ``dflash_delta_positions [delta]`` and
  ``dflash_delta_token_to_sequence [delta]`` — their RoPE rows, positions and step sequences (the plugin
  ``DFlashTargetKVCacheUpdate`` writes them into the draft's KV);
* ``context_sequence_count_carrier`` fixed at ``[0]``; no ``logits_indices``: ``logits`` has a row for every
  block position ``[T, V]``; no ``hidden_states`` output and no tree-id inputs.

trtio declares these bindings (an engine that lacks one, or declares another, is refused at bind); the delta rows
are ``batch x select_len`` (entry padding: each sequence's committed tokens padded to the step's longest delta, as
Edge-LLM's ``selectLen``; a prompt's in profile 0, up to ``max_draft_tree_size + 1`` a sequence in profile 1), the
block rows ``batch x seq_len`` (a block in both profiles: Edge-LLM's builder gives a block draft's token inputs
the generation range in profile 0 too). :mod:`trtio.setups.dflash` runs the pair.
"""

from __future__ import annotations

from trtio import names
from trtio.config import LLMEngineConfig
from trtio.dtypes import DType
from trtio.registry import ProfileShapes, TensorRegistry, TensorSpec

__all__ = ["DFLASH_DELTA_INPUTS", "dflash_draft_registry"]

#: The delta inputs of a DFlash draft beside ``dflash_target_hidden_concat``, in the exporter's order.
DFLASH_DELTA_INPUTS = ("dflash_delta_rope_cos_sin", "dflash_delta_positions", "dflash_delta_token_to_sequence")

# What an EAGLE3/MTP draft declares and a DFlash draft does not.
_NOT_DFLASH = {names.kLogitsIndices, names.kBaseModelHiddenStates, names.kDraftModelHiddenStates,
               names.kTreeParentIds, names.kTreeDepths, names.kValidTreeCounts}


def dflash_draft_registry(cfg: LLMEngineConfig, draft: TensorRegistry) -> TensorRegistry:
    """A DFlash draft's bindings, from ``draft`` (the ragged registry of an EAGLE-style draft of ``cfg``)."""
    b, L = cfg.max_supported_batch_size, cfg.max_supported_input_length
    q = cfg.max_step_tokens
    delta = ("batch", "select_len")  # newly committed tokens, entry-padded to the step's longest delta

    def rows(*rest: int) -> tuple[ProfileShapes, ...]:
        return (((1, *rest), (b * max(1, L // 2), *rest), (b * L, *rest)),
                ((1, *rest), (b * (q + 1), *rest), (b * (q + 1), *rest)))

    reg = TensorRegistry("draft", contract="ragged")
    for spec in draft:
        if spec.name in _NOT_DFLASH or (spec.name == names.kOutputHiddenStates and not spec.is_input):
            continue
        if spec.name == names.kContextSequenceCountCarrier:
            spec = TensorSpec(spec.name, "input", DType.INT32, (0,), (((0,), (0,), (0,)),) * 2)
        elif spec.name == names.kLogits:
            spec = TensorSpec(spec.name, "output", spec.dtype, (("batch", "seq_len"), cfg.output_vocab_size))
        elif spec.is_input and spec.shape[:1] == (("batch", "seq_len"),) and len(spec.profiles) == 2:
            # Every step of a block draft runs a block (its prefill too): the builder gives its token rows the
            # generation range in both profiles (``_setup_llm_profiles``: ``proposal_context_range``).
            spec = TensorSpec(spec.name, "input", spec.dtype, spec.shape, (spec.profiles[1],) * 2, spec.optional,
                              spec.declared)
        reg.add(spec)
        if spec.name == names.kInputsEmbeds:
            width = cfg.base_model_hidden_size
            reg.add(TensorSpec(names.kDFlashTargetHiddenConcat, "input", cfg.activation, (delta, width), rows(width)))
    i32 = DType.INT32
    reg.add(TensorSpec(DFLASH_DELTA_INPUTS[0], "input", DType.FLOAT32, (delta, cfg.rotary_dim), rows(cfg.rotary_dim)))
    reg.add(TensorSpec(DFLASH_DELTA_INPUTS[1], "input", i32, (delta,), rows()))
    reg.add(TensorSpec(DFLASH_DELTA_INPUTS[2], "input", i32, (delta,), rows()))
    return reg
