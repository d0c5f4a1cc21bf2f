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
the generation range in profile 0 too). :mod:`trtio.families.spec.dflash` runs the pair.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtio import names
from trtio._config import LLMEngineConfig
from trtio._dtypes import DType
from trtio._registry import ProfileShapes, TensorRegistry, TensorSpec
from trtio.errors import ConfigError
from trtio.families.spec.block_family import BlockFamily, block_family_of, declare

__all__ = ["DFLASH", "DFLASH_DELTA_INPUTS", "DFLASH_POSITIONS", "DFLASH_ROPE", "DFLASH_SEQUENCES", "block_size",
           "check_block_draft", "dflash_draft_registry", "mask_token"]

#: DFlash's block draft: ``dflash_config``, ``dflash_tree_base``, a bidirectional block.
DFLASH = declare(BlockFamily("dflash", "dflash_config", "dflash_tree_base", causal=False))

#: The delta inputs of a DFlash draft beside ``dflash_target_hidden_concat``, in the exporter's order.
DFLASH_DELTA_INPUTS = ("dflash_delta_rope_cos_sin", "dflash_delta_positions", "dflash_delta_token_to_sequence")
# A DFlash draft's delta rows: positions and sequences (step block), RoPE rows [T, R] (trtio.families.spec.dflash).
DFLASH_POSITIONS, DFLASH_SEQUENCES, DFLASH_ROPE = ("dflash_delta_positions", "dflash_delta_token_to_sequence",
                                                   "dflash_delta_rope_cos_sin")

# What an EAGLE3/MTP draft declares and a DFlash draft does not.
_NOT_DFLASH = {names.kLogitsIndices, names.kBaseModelHiddenStates, names.kDraftModelHiddenStates,
               names.kTreeParentIds, names.kTreeDepths, names.kValidTreeCounts}


def dflash_draft_registry(cfg: LLMEngineConfig, draft: TensorRegistry, outputs: tuple[str, ...] = ()) -> TensorRegistry:
    """A block draft's bindings, from ``draft`` (the ragged registry of an EAGLE-style draft of ``cfg``);
    ``outputs``: the family's ``[T, hidden_size]`` float16 outputs beside ``logits`` (DSpark's)."""
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
            reg.add(spec)
            for name in outputs:
                reg.add(TensorSpec(name, "output", cfg.activation, (("batch", "seq_len"), cfg.hidden_size)))
            continue
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


def _family(draft_extras: Mapping[str, Any]) -> BlockFamily:
    """The draft's block family (DFlash's where its config names none of the declared ones)."""
    return block_family_of(draft_extras) or DFLASH


def block_size(draft_extras: Mapping[str, Any], cap: int) -> int:
    """The block a block draft was trained for: ``<family config>.block_size`` (``dflash_config``,
    ``jetspec_config``; or the top-level ``block_size``; ``cap`` where neither is given), refused where it passes
    ``cap`` (the rows per sequence the engines take: the draft's ``max_draft_tree_size``, and for a whole round the
    base's verify size): a shorter block than the one the draft was trained for would change what it computes."""
    family = _family(draft_extras)
    found = family.section(draft_extras).get("block_size")
    key = f"{family.section_key(draft_extras)}.block_size" if isinstance(found, int) else "block_size"
    found = found if isinstance(found, int) else draft_extras.get("block_size")
    if not isinstance(found, int) or found <= 0:
        return cap
    if found > cap:
        raise ConfigError(key, f"is {found}, more than the {cap} rows per sequence the engines take (the draft's "
                               f"max_draft_tree_size, the base's verify size): the block is refused rather than cut "
                               f"short, which would change what the draft computes")
    return found


def mask_token(draft_extras: Mapping[str, Any]) -> int:
    """The token a block draft's block holds after its root: ``<family config>.mask_token_id`` (a ConfigError
    naming it when missing)."""
    family = _family(draft_extras)
    found = family.section(draft_extras).get("mask_token_id")
    if not isinstance(found, int) or found < 0:
        raise ConfigError(f"{family.section_key(draft_extras)}.mask_token_id",
                          f"a {family.kind} draft's block needs its mask token, got {found!r}")
    return found


def check_block_draft(draft: LLMEngineConfig) -> int:
    """A block draft trtio runs (version 1, one RoPE table, a mask token, a block that fits its tree size): its
    block's rows (ConfigError naming the key otherwise)."""
    family = _family(draft.extras)
    version = family.section(draft.extras).get("version", 1)
    if version != 1:  # DFlash2: a candidate selector (dflash2_selector.safetensors) picks the block's tokens
        raise ConfigError(f"{family.section_key(draft.extras)}.version",
                          f"is {version!r}: trtio runs DFlash (version 1) block drafts; DFlash2's candidate selector "
                          "is not implemented, so the pair is refused rather than run wrong")
    if draft.rope_per_slot:
        raise ConfigError("rope_type", f"a {family.kind} draft with MRoPE (per-slot RoPE tables) is not supported: "
                                       "its delta's RoPE rows are gathered from one table")
    mask_token(draft.extras)  # a block needs its mask token
    return block_size(draft.extras, draft.max_draft_tree_size)
