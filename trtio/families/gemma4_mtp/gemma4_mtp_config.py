"""A Gemma 4 assistant draft's typed config (``spec_decode_type`` ``gemma4_mtp``, ``model`` ``gemma4_assistant``) and
its bindings (``docs/edgellm-assumptions.md`` §18).

============================================ ==================================================================
Edge-LLM key (draft config)                  read as
============================================ ==================================================================
``kv_sharing_map``                           per assistant layer, the target layer whose KV pool it reads
                                             (``target_attention_layer``: the target's ``past_key_values_j``)
                                             and its kind (``target_layer_type``)
``shares_target_kv`` / ``has_own_kv_cache``  must be true / false: the draft reads the target's pools, owns none
``constant_draft_positions``                 must be true: every draft step at ``committed_len - 1``
``returns_feedback_hidden``                  must be true: a step's ``hidden_states`` feed the next step
``sparse_logits_enabled``                    must be false: the logits are the full (centroid-masked) vocabulary
``use_ordered_embeddings``, ``num_centroids``,  the in-graph centroid mask (recorded)
``centroid_intermediate_top_k``
``assistant_hidden_size``                    must equal ``hidden_size``
============================================ ==================================================================

A value trtio cannot run is refused naming the key. The draft's graph (Edge-LLM 0.11's exporter): ``inputs_embeds``
and ``hidden_states_input`` ``[T, base_model_hidden_size]`` (the target's embedding and hidden width), one
``past_key_values_i`` per layer **without** a ``present_key_values_i`` output, both RoPE tables, the ragged
metadata, ``kv_page_table``, ``context_sequence_count_carrier [0]``; outputs ``logits [T, V]`` (a row per token:
no ``logits_indices``) and ``hidden_states [T, base_model_hidden_size]`` (the feedback).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtio import names
from trtio._checks import is_int
from trtio._config import LLMEngineConfig
from trtio._dtypes import DType
from trtio._edgellm_config import EdgeReader, got
from trtio._registry import ProfileShapes, TensorRegistry, TensorSpec
from trtio._tensor_map import TensorMap
from trtio.errors import ConfigError
from trtio.families.gemma4.gemma4_config import GEMMA4_MTP, Gemma4Config
from trtio.features import FamilyConfig

__all__ = ["GEMMA4_MTP", "Gemma4MtpConfig", "assistant_registry"]

# What an EAGLE-style draft declares and a Gemma 4 assistant does not.
_NOT_ASSISTANT = {names.kLogitsIndices, names.kDraftModelHiddenStates, names.kTreeParentIds, names.kTreeDepths,
                  names.kValidTreeCounts, names.kPackedAttentionMask, names.kAttentionPositionIds}
# The keys the assistant's protocol fixes (key -> the value Edge-LLM 0.11's Gemma4MTPDecoder runs, and why).
_FIXED = {
    "shares_target_kv": (True, "the assistant reads the target's KV pools"),
    "has_own_kv_cache": (False, "the assistant owns no KV cache (Gemma4MTPDecoder refuses one that does)"),
    "constant_draft_positions": (True, "every draft step is at the last committed position"),
    "returns_feedback_hidden": (True, "a draft step's hidden_states feed the next one"),
    "sparse_logits_enabled": (False, "trtio reads the full vocabulary's logits"),
}


@dataclass(frozen=True)
class Gemma4MtpConfig(FamilyConfig):
    """A Gemma 4 assistant draft's facts: ``targets[i]`` is the target layer whose KV pool assistant layer ``i``
    reads, ``kinds[i]`` its kind (``"sliding"`` / ``"full"``); the centroid mask the graph applies."""

    targets: tuple[int, ...]
    kinds: tuple[str, ...]
    ordered_embeddings: bool = False
    num_centroids: int = 0
    centroid_top_k: int = 0

    KEYWORDS = {"gemma4_mtp": None}
    SOURCE_KEYS = {"gemma4_mtp": "kv_sharing_map"}

    def to_dict(self) -> dict[str, Any]:
        return {"targets": list(self.targets), "kinds": list(self.kinds), "ordered_embeddings": self.ordered_embeddings,
                "num_centroids": self.num_centroids, "centroid_top_k": self.centroid_top_k}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Gemma4MtpConfig:
        return cls(tuple(int(t) for t in data["targets"]), tuple(str(k) for k in data["kinds"]),
                   bool(data.get("ordered_embeddings", False)), int(data.get("num_centroids", 0)),
                   int(data.get("centroid_top_k", 0)))

    @classmethod
    def from_keywords(cls, given: Mapping[str, Any], core: Mapping[str, Any]) -> Gemma4MtpConfig | None:
        value = given["gemma4_mtp"]
        if isinstance(value, Mapping):
            return cls.from_dict(value)
        if value is not None and not isinstance(value, Gemma4MtpConfig):
            raise ConfigError("gemma4_mtp", f"must be a Gemma 4 assistant config (an object) or null, got "
                                            f"{type(value).__name__}")
        return value

    def keywords(self) -> dict[str, Any]:
        return {"gemma4_mtp": self}

    def draft_rows(self, top_k: int, step: int) -> int | None:
        """One row a sequence, every step: the assistant drafts a chain of ``step`` one-token steps whatever
        ``top_k`` (a top-K > 1 tree is built from the steps' logits and verified whole: its size is the verify's,
        ``verify_size``, bounded by the target's ``max_verify_tree_size``)."""
        return 1

    def to_json(self) -> dict[str, Any]:
        return {"gemma4_mtp": self.to_dict()}

    def validate(self, cfg: LLMEngineConfig) -> None:
        if not cfg.is_draft:
            raise ConfigError("gemma4_mtp", f"describes a Gemma 4 assistant draft, but this is a {cfg.role} config")
        if len(self.targets) != cfg.num_attention_layers or len(self.kinds) != len(self.targets):
            raise ConfigError("gemma4_mtp", f"maps {len(self.targets)} assistant layers, the config has "
                                            f"{cfg.num_attention_layers}")
        g = cfg.feature(Gemma4Config)
        if g is not None and tuple(g.kinds) != self.kinds:
            raise ConfigError("gemma4_mtp", f"kv_sharing_map's layer kinds {list(self.kinds)} differ from the "
                                            f"assistant's layers {list(g.kinds)}")

    # -- the draft's bindings ----------------------------------------------------------------------------------------
    def borrowed_state(self, cfg: LLMEngineConfig) -> set[str]:
        """Every KV pool of the assistant: the target's, bound by the feature."""
        return {names.past_key_values(i) for i in range(len(self.targets))}

    def registry(self, reg: TensorRegistry, cfg: LLMEngineConfig) -> TensorRegistry:
        """The assistant's bindings (module docstring), from the ragged registry of an EAGLE-style draft."""
        if reg.contract != "ragged":
            return reg
        return assistant_registry(cfg, reg)

    def bind_pipeline(self, io: Any, tm: TensorMap, cfg: LLMEngineConfig) -> None:
        """``hidden_states_input`` reads ``draft_hidden_states_in`` (the seed or the feedback gathered into its rows
        before each step), not the base's rows in place (as Edge-LLM's ``draftHiddenStatesIn``)."""
        if names.kBaseModelHiddenStates in tm:
            tm.set(names.kBaseModelHiddenStates, io.draft_hidden_states_in)

    def check_pair(self, base: LLMEngineConfig, draft: LLMEngineConfig, files: tuple[Path, Path]) -> LLMEngineConfig:
        """Each assistant layer's target layer: a layer of the base that owns its pool, of the same kind, KV heads
        and head dim; the base's hidden states as wide as the draft reads them."""
        bfile, dfile = files
        g, mine = base.feature(Gemma4Config), draft.feature(Gemma4Config)
        if g is None or mine is None:
            raise ConfigError(f"{bfile}: model", f"a {GEMMA4_MTP!r} pair is a Gemma 4 target and a Gemma 4 assistant")
        for i, t in enumerate(self.targets):
            key = f"{dfile}: kv_sharing_map[{i}]"
            if not 0 <= t < g.num_layers:
                raise ConfigError(key, f"target layer {t} is outside the base's {g.num_layers} layers ({bfile.name})")
            if g.donors[t] >= 0:
                raise ConfigError(key, f"target layer {t} reads layer {g.donors[t]}'s pool: name a layer that owns one")
            want = (mine.kinds[i], mine.kv_heads[i], mine.head_dims[i])
            have = (g.kinds[t], g.kv_heads[t], g.head_dims[t])
            if want != have:
                raise ConfigError(key, f"assistant layer {i} ({want[0]}, {want[1]} x {want[2]}) cannot read the pool "
                                       f"of target layer {t} ({have[0]}, {have[1]} x {have[2]})")
        if mine.full_rope != g.full_rope:  # one full-layer table serves both engines (the PipelineIO's member)
            raise ConfigError(f"{dfile}: full_rope_config", f"{mine.full_rope.to_dict()} differs from the base's "
                                                            f"{g.full_rope.to_dict()} ({bfile.name}): trtio keeps one "
                                                            "full-layer RoPE table for the pair")
        if draft.base_model_hidden_size != base.hidden_size:
            raise ConfigError(f"{dfile}: base_model_hidden_size", f"{draft.base_model_hidden_size} differs from the "
                                                                  f"base's hidden_size {base.hidden_size}")
        return base

    # -- Edge-LLM's config.json ------------------------------------------------------------------------------------
    @classmethod
    def read_edgellm(cls, r: EdgeReader, role: str, layers: int) -> dict[str, Any]:
        """A Gemma 4 assistant draft's keys (module docstring); nothing for another config."""
        if role != "draft" or r.raw("spec_decode_type") != GEMMA4_MTP:
            return {}
        for key, (want, why) in _FIXED.items():
            value = r.bool_(key)
            if value is not None:
                r.used.add(key)
            if value is not None and value != want or value is None and key in ("shares_target_kv",
                                                                                  "has_own_kv_cache"):
                raise r.error(key, f"is {got(value)}: trtio runs Edge-LLM 0.11's Gemma 4 assistant protocol, in "
                                   f"which it is {str(want).lower()} ({why}); refused rather than run wrong")
        hidden = r.int_("hidden_size")
        assistant = r.int_("assistant_hidden_size", default=hidden)
        if assistant != hidden:
            raise r.error("assistant_hidden_size", f"is {assistant} but hidden_size is {hidden}")
        ordered = r.bool_("use_ordered_embeddings")
        r.used.add("use_ordered_embeddings")
        centroids = r.int_("num_centroids", default=0, low=0)
        top_k = r.int_("centroid_intermediate_top_k", default=0, low=0)
        targets, kinds = _sharing_map(r, layers)
        return {"gemma4_mtp": cls(targets, kinds, bool(ordered), centroids, top_k)}


def _sharing_map(r: EdgeReader, layers: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``kv_sharing_map``: one entry per assistant layer (each once), its target attention layer and kind."""
    entries = r.take("kv_sharing_map", "one object per assistant layer", required=True)
    if not isinstance(entries, (list, tuple)) or len(entries) != layers or \
            not all(isinstance(e, Mapping) for e in entries):
        raise r.error("kv_sharing_map", f"expected {layers} objects (one per assistant layer), got {got(entries)}")
    targets: dict[int, tuple[int, str]] = {}
    for i, entry in enumerate(entries):
        layer, target = entry.get("assistant_layer"), entry.get("target_attention_layer", entry.get("target_layer"))
        kind = entry.get("target_layer_type")
        if not is_int(layer) or not 0 <= layer < layers or layer in targets:
            raise r.error(f"kv_sharing_map[{i}].assistant_layer", f"expected each layer 0 .. {layers - 1} once, got "
                                                                  f"{got(layer)}")
        if not is_int(target) or target < 0:
            raise r.error(f"kv_sharing_map[{i}].target_attention_layer", f"expected a target layer, got {got(target)}")
        if kind not in ("sliding_attention", "full_attention"):
            raise r.error(f"kv_sharing_map[{i}].target_layer_type", f"expected 'sliding_attention' or "
                                                                    f"'full_attention', got {got(kind)}")
        targets[int(layer)] = (int(target), "sliding" if kind == "sliding_attention" else "full")
    return tuple(targets[i][0] for i in range(layers)), tuple(targets[i][1] for i in range(layers))


def assistant_registry(cfg: LLMEngineConfig, draft: TensorRegistry) -> TensorRegistry:
    """A Gemma 4 assistant's bindings (module docstring), from ``draft`` (the ragged registry of an EAGLE-style draft
    of ``cfg``, its RoPE inputs Gemma 4's): its token rows at the target's width, no tree or selection inputs, the
    shape-only carrier fixed at ``[0]``, logits and feedback hidden states for every row."""
    width = cfg.base_model_hidden_size
    reg = TensorRegistry("draft", contract="ragged")
    for spec in draft:
        if spec.name in _NOT_ASSISTANT:
            continue
        if spec.name in (names.kInputsEmbeds, names.kBaseModelHiddenStates):
            profiles: tuple[ProfileShapes, ...] = tuple(
                ((lo[0], width), (opt[0], width), (hi[0], width)) for lo, opt, hi in spec.profiles)
            spec = TensorSpec(spec.name, "input", spec.dtype, (spec.shape[0], width), profiles)
        elif spec.name == names.kContextSequenceCountCarrier:
            spec = TensorSpec(spec.name, "input", DType.INT32, (0,), (((0,), (0,), (0,)),) * 2)
        elif spec.name in (names.kLogits, names.kOutputHiddenStates) and not spec.is_input:
            last = cfg.output_vocab_size if spec.name == names.kLogits else width
            spec = TensorSpec(spec.name, "output", spec.dtype, (("batch", "seq_len"), last))
        reg.add(spec)
    return reg
