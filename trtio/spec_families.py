"""Speculative-decoding families: which one a base or draft config belongs to, and what that means for its I/O.

Edge-LLM 0.11 writes ``spec_decode_type`` into both configs of a pair (``docs/edgellm-assumptions.md`` §11):

* ``eagle3`` — the base concatenates the hidden states of ``eagle_hidden_state_layers`` (3 of them) into its
  ``hidden_states`` output; the draft reads them as ``hidden_states_input`` and its own last hidden state as
  ``hidden_states_from_draft``.
* ``mtp`` — the same protocol with one base layer: the base's ``hidden_states`` is its last layer's stream
  ``[T, H]``; the draft is one attention layer with its own KV (Qwen3.5, Nemotron-H, Qwen3-Omni MTP heads).
  trtio runs MTP pairs through the EAGLE3 phases.
* ``dflash`` — block drafts: the base concatenates the draft's ``dflash_config.target_layer_ids`` layers; the
  draft reads the newly committed tokens' features (``dflash_target_hidden_concat`` and the ``dflash_delta_*``
  inputs) and returns logits for every block position. trtio declares these bindings (``trtio.contracts.dflash``)
  and runs the pair through the same phases, the block as the draft's input (``trtio.setups.dflash``).

Other families (jetspec, dspark, gemma4_mtp) are refused when the config is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtio.config import LLMEngineConfig
from trtio.edgellm_config import SPEC_DECODE_TYPES
from trtio.errors import ConfigError
from trtio.families.hybrid.hybrid_config import HybridConfig

__all__ = ["RUNNABLE_FAMILIES", "SPEC_FAMILIES", "check_pair_runs", "check_runnable", "dflash_target_layers",
           "family_of", "fed_layers"]

#: The ``spec_decode_type`` values trtio reads (declares every binding of).
SPEC_FAMILIES = SPEC_DECODE_TYPES
#: The families trtio has a step protocol for.
RUNNABLE_FAMILIES = ("eagle3", "mtp", "dflash")


def family_of(extras: Mapping[str, Any], role: str) -> str | None:
    """The speculative family of an engine of ``role`` whose config left ``extras``: None for a plain LLM; a
    base or draft whose config names none (trtio's own batch-contract configs) is EAGLE3's."""
    if role not in ("base", "draft"):
        return None
    found = extras.get("spec_decode_type")
    return str(found) if isinstance(found, str) and found != "none" else "eagle3"


def dflash_target_layers(extras: Mapping[str, Any], where: str = "dflash_config") -> tuple[int, ...]:
    """A DFlash draft config's ``dflash_config.target_layer_ids``: the base layers whose hidden states, side by
    side, the draft reads (``ConfigError`` naming the key when missing or not a list of ints)."""
    block = extras.get("dflash_config")
    ids = block.get("target_layer_ids") if isinstance(block, Mapping) else None
    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ConfigError(f"{where}.target_layer_ids", f"expected a non-empty list of base layer indices (the "
                                                       f"layers a DFlash draft reads), got {ids!r}")
    return tuple(int(i) for i in ids)


def fed_layers(family: str, eagle_layers: tuple[int, ...]) -> int:
    """How many base layers' hidden states (each ``hidden_size`` wide) the draft of ``family`` reads: EAGLE3's
    listed layers (3 when none are listed), MTP's one, DFlash's target layers (set as the base's
    ``eagle_hidden_state_layers`` when its pair is read)."""
    if family == "mtp":
        return 1
    return len(eagle_layers) or 3


def check_pair_runs(base: LLMEngineConfig, draft: LLMEngineConfig, what: str) -> None:
    """Refuse a pair trtio cannot run, before anything is allocated: a family without a step protocol, or a hybrid
    base whose accept trtio cannot commit (``trtio.families.hybrid.snapshots``): Mamba2's ``replay`` verify mode, a
    Mamba2 base built as a DDTree base, a Gated DeltaNet DDTree base whose replay stash trtio cannot lay out."""
    check_runnable(family_of(base.extras, "base") or "eagle3", what)
    hybrid = base.feature(HybridConfig)
    if hybrid is not None and hybrid.layers:
        if hybrid.recurrent_spec_verify_mode == "replay":
            raise ConfigError("recurrent_spec_verify_mode", f"{what}: 'replay' (Mamba2: the accepted token's state "
                                                            "is recomputed from a dA/u/B/dt stash) is not supported; "
                                                            "the pair is refused rather than committed wrong")
        key = next((k for k in ("mtp_tree_base", "dflash_tree_base") if getattr(base, k)), None)
        if key is not None and hybrid.recurrent_kind != "gated_deltanet":
            raise ConfigError(key, f"{what}: a {hybrid.recurrent_kind} base built as a DDTree base (its recurrent "
                                   "plugins verify trees statelessly and leave a replay stash, Mamba2's dA/u/B/dt) is "
                                   "not supported: trtio replays Gated DeltaNet's stash only; the pair is refused "
                                   "rather than committed wrong")
        if key is not None and (hybrid.gdn_key_heads is None or hybrid.recurrent_state_dtype != "float32"):
            field = "recurrent_state_dtype" if hybrid.gdn_key_heads is not None else "conv_dim"
            raise ConfigError(field, f"{what}: a Gated DeltaNet base built as a DDTree base ({key}) is committed by "
                                     "replaying its stash, which needs FP32 states and key heads from conv_dim = 2 x "
                                     "key heads x recurrent_state_head_dim + recurrent_state_num_heads x "
                                     f"recurrent_state_size (Edge-LLM's replayCommitAcceptedTreeStates); got "
                                     f"{field} {getattr(hybrid, field)!r}")
    del draft  # its family is the base's (checked when the directory is read)


def check_runnable(family: str, what: str) -> None:
    """Refuse a pair of ``family`` trtio has no step protocol for, before anything is allocated."""
    if family not in RUNNABLE_FAMILIES:
        raise ConfigError("spec_decode_type", f"{what}: {family!r} pairs are read and their bindings declared, but "
                                              f"trtio runs only {list(RUNNABLE_FAMILIES)} pairs; the pair is "
                                              "refused rather than run wrong")
