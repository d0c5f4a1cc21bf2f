"""TensorRT Edge-LLM 0.11 engine directories and their ``config.json``.

An Edge-LLM engine directory is flat: ``llm.engine`` + ``config.json`` for a plain LLM, or
``spec_base.engine`` + ``base_config.json`` and ``spec_draft.engine`` + ``draft_config.json`` for a
speculative (EAGLE3) pair. :class:`EngineDir` opens one (the configs alone open, for planning) and
reads what a runtime needs beside the engines (the token embedding table, an EAGLE3 pair's
draft-to-target map); :func:`config_from_edgellm` (also ``LLMEngineConfig.from_edgellm``) maps one
config onto trtio's :class:`~trtio.config.LLMEngineConfig`:

======================================== ============================== ====================================
Edge-LLM key                             trtio field                    note
======================================== ============================== ====================================
``hidden_size``                          ``hidden_size``                required
``vocab_size``                           ``vocab_size``                 required
``num_hidden_layers``                    ``num_attention_layers``       required; ``num_attention_layers`` wins
                                                                        where the file has it
``num_attention_heads``                  ``num_attention_heads``        required
``num_key_value_heads``                  ``num_kv_heads``               required
``head_dim``                             ``head_dim``                   default hidden_size / heads
``partial_rotary_factor``                ``rotary_dim``                 head_dim x factor, an even int;
                                                                        default factor 1
``rope_theta``                           ``rope_theta``                 default 10000, finite, > 0
``rope_scaling``                         ``rope_scaling``, ``rope_type`` null or HF's dict, validated into a
                                                                        ``RopeScaling``; ``mrope_section`` (or
                                                                        type ``mrope``) -> ``"mrope"``
``max_position_embeddings``              ``max_position_embeddings``    default 0 (unknown)
``num_deepstack_features``               ``num_deepstack_features``     default 0
``kv_cache_dtype``                       ``kv_cache_dtype``             fp16 / bf16 / fp32 / fp8 / int8;
                                                                        default fp16
``engine_role``                          ``is_spec_decode_base``,       required: llm, base or draft
                                         role of the config
``draft_vocab_size``                     ``output_vocab_size``          draft: required (its logits width)
``reduced_vocab_size``                   ``output_vocab_size``          where present: the logits width
``base_model_hidden_size``               ``base_model_hidden_size``     draft: required
``eagle_hidden_state_layers``            ``eagle_hidden_state_layers``  base: default ()
``builder_config.max_batch_size``        ``max_supported_batch_size``   required
``builder_config.max_input_len``         ``max_supported_input_length`` required
``builder_config.max_kv_cache_capacity`` ``max_kv_cache_capacity``      required
``builder_config.max_kv_pool_pages``     ``kv_pool_pages``              default: batch x ceil(capacity / 128)
``builder_config.max_verify_tree_size``  ``max_verify_tree_size``       base: required
``builder_config.max_draft_tree_size``   ``max_draft_tree_size``        draft: required
``builder_config.ragged_backend``        ``contract = "ragged"``        required:
                                                                        ``entry_padded_compatibility``
(fixed by Edge-LLM)                      ``kv_page_size = 128``,
                                         ``activation_dtype = float16``
======================================== ============================== ====================================

Every other key lands in ``extras`` (``builder_config`` keys as ``"builder_config.<key>"``). What this
mapping and the artifact readers assume where Edge-LLM leaves meaning open is listed, with how to check
it, in ``docs/edgellm-assumptions.md``.
Engines trtio cannot bind yet are refused when their config is read, naming the key that marks them
(:data:`UNSUPPORTED_MARKERS`). Errors are :class:`~trtio.ConfigError` with the field
``"<file>: <dotted key>"``.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trtio._safetensors import SafeTensor, bf16_to_float32, e4m3_to_float32, read_safetensors
from trtio.config import (
    DeploymentConfig,
    LLMEngineConfig,
    SpecDecodeConfig,
    _json_kind,
    _message,
    _read_json,
)
from trtio.dtypes import DType
from trtio.errors import ConfigError
from trtio.rope import RopeScaling

__all__ = [
    "EngineDir",
    "config_from_edgellm",
    "unsupported_features",
    "UNSUPPORTED_MARKERS",
    "KV_PAGE_SIZE",
    "RAGGED_BACKEND",
    "PLUGIN_LIBRARY",
    "CONFIG_FILES",
    "ENGINE_FILES",
    "EMBEDDING_FILE",
    "D2T_FILE",
]

log = logging.getLogger("trtio")

#: Tokens per KV page: fixed by Edge-LLM 0.11 (``_KV_PAGE_SIZE`` in its builder; the attention plugin
#: takes ``[2, pages, 128, Hkv, D]`` pools only).
KV_PAGE_SIZE = 128
#: The only ``builder_config.ragged_backend`` Edge-LLM 0.11's runtime accepts.
RAGGED_BACKEND = "entry_padded_compatibility"
#: The file name of Edge-LLM's TensorRT plugin library (``EDGELLM_PLUGIN_PATH`` names it).
PLUGIN_LIBRARY = "libNvInfer_edgellm_plugin.so"
#: The config and engine file of each role in an engine directory.
CONFIG_FILES = {"llm": "config.json", "base": "base_config.json", "draft": "draft_config.json"}
ENGINE_FILES = {"llm": "llm.engine", "base": "spec_base.engine", "draft": "spec_draft.engine"}
#: The token embedding table Edge-LLM's builder writes beside a plain LLM or a speculative base (the
#: EAGLE3 draft reads the base's).
EMBEDDING_FILE = "embedding.safetensors"
#: An EAGLE3 pair's draft-to-target vocabulary map (absent: the identity).
D2T_FILE = "d2t.safetensors"
_EMBEDDING_GROUP = 128  # columns per scale of an FP8 embedding table (Edge-LLM's writer)

_ROLES = ("llm", "base", "draft")
_SPEC_DECODE_TYPES = ("eagle3",)  # the speculative families trtio has a step protocol for
_KV_DTYPES = ("fp16", "bf16", "fp32", "fp8", "int8")
_EDGELLM_VERSION = "0.11"

#: The keys that mark each engine family trtio cannot bind yet (read from Edge-LLM 0.11's config
#: writers and confirmed on configs its builder wrote): family -> keys.
UNSUPPORTED_MARKERS: Mapping[str, tuple[str, ...]] = {
    "hybrid linear attention": ("num_linear_attn_layers", "layer_types", "kv_layer_configs",
                                "recurrent_state_num_heads"),
    "per-layer KV head dims": ("global_head_dim", "kv_layer_configs", "num_global_key_value_heads",
                               "attention_k_eq_v"),
    "KV sharing": ("kv_sharing_donors", "num_kv_shared_layers", "kv_sharing_map", "shares_target_kv"),
    "sliding-window dual RoPE": ("sliding_rope_config", "full_rope_config", "sliding_rotary_dim",
                                 "full_rotary_dim", "global_rope_theta", "builder_config.num_swa_pages"),
    "per-layer embeddings (PLE)": ("ple_enabled", "num_ple_inputs", "ple_hidden_size"),
    "diffusion LLM": ("engine_role", "decoding_strategy"),
    "tensor parallelism": ("builder_config.tp_size", "rank_configs"),
    "LoRA": ("builder_config.max_lora_rank",),
    "speculative family": ("spec_decode_type",),
}

# trtio field -> the Edge-LLM key it comes from (to name the key when a field check fails).
_SOURCE_KEY = {
    "hidden_size": "hidden_size",
    "vocab_size": "vocab_size",
    "num_attention_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "rotary_dim": "partial_rotary_factor",
    "rope_theta": "rope_theta",
    "rope_scaling": "rope_scaling",
    "rope_type": "rope_scaling",
    "max_position_embeddings": "max_position_embeddings",
    "num_deepstack_features": "num_deepstack_features",
    "kv_cache_dtype": "kv_cache_dtype",
    "base_model_hidden_size": "base_model_hidden_size",
    "eagle_hidden_state_layers": "eagle_hidden_state_layers",
    "max_supported_batch_size": "builder_config.max_batch_size",
    "max_supported_input_length": "builder_config.max_input_len",
    "max_kv_cache_capacity": "builder_config.max_kv_cache_capacity",
    "kv_pool_pages": "builder_config.max_kv_pool_pages",
    "max_verify_tree_size": "builder_config.max_verify_tree_size",
    "max_draft_tree_size": "builder_config.max_draft_tree_size",
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _got(v: Any) -> str:
    return f"{v!r} (a {_json_kind(v)})"


class _Reader:
    """One Edge-LLM config dict read key by key; remembers which keys became trtio fields."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data = data
        self.where = where
        self.used: set[str] = set()

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where}: {key}", message)

    def has(self, key: str) -> bool:
        return self._lookup(key)[0]

    def raw(self, key: str) -> Any:
        return self._lookup(key)[1]

    def _lookup(self, key: str) -> tuple[bool, Any]:
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return False, None
            node = node[part]
        return True, node

    def take(self, key: str, expected: str, *, required: bool) -> Any:
        """The value at ``key`` (marked used), or None where it is absent (or null) and not required."""
        found, value = self._lookup(key)
        if required and (not found or value is None):
            raise self.error(key, f"is required ({expected})")
        if found:
            self.used.add(key)
        return value

    def int_(self, key: str, *, required: bool = True, default: int | None = None, low: int = 1,
             meaning: str = "") -> int:
        expected = f"an int >= {low}" + (f": {meaning}" if meaning else "")
        value = self.take(key, expected, required=required and default is None)
        if value is None:
            assert default is not None
            return default
        if not _is_int(value) or value < low:
            raise self.error(key, f"expected {expected}, got {_got(value)}")
        return int(value)

    def number(self, key: str, *, default: float, low: float, high: float | None = None) -> float:
        bounds = f"> {low:g}" + (f" and <= {high:g}" if high is not None else "")
        value = self.take(key, f"a finite number {bounds}", required=False)
        if value is None:
            return default
        if not _is_number(value) or not math.isfinite(value):
            raise self.error(key, f"expected a finite number {bounds}, got {_got(value)}")
        if value <= low or (high is not None and value > high):
            raise self.error(key, f"expected a number {bounds}, got {value!r}")
        return float(value)

    def str_(self, key: str, choices: tuple[str, ...], *, required: bool = True, default: str | None = None,
             meaning: str = "") -> str:
        expected = "one of " + ", ".join(repr(c) for c in choices) + (f" ({meaning})" if meaning else "")
        value = self.take(key, expected, required=required and default is None)
        if value is None:
            assert default is not None
            return default
        if not isinstance(value, str) or value not in choices:
            raise self.error(key, f"expected {expected}, got {_got(value)}")
        return value

    def bool_(self, key: str) -> bool | None:
        found, value = self._lookup(key)
        if not found or value is None:
            return None
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {_got(value)}")
        return value

    def extras(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.data.items():
            if key == "builder_config" and isinstance(value, Mapping):
                for sub, sub_value in value.items():
                    dotted = f"builder_config.{sub}"
                    if dotted not in self.used:
                        out[dotted] = copy.deepcopy(sub_value)
            elif key not in self.used:
                out[key] = copy.deepcopy(value)
        return out


# -- unsupported families ---------------------------------------------------------------------

def _nonzero_int(r: _Reader, key: str) -> int:
    value = r.raw(key)
    if value is None:
        return 0
    if not _is_int(value) or value < 0:
        raise r.error(key, f"expected an int >= 0, got {_got(value)}")
    return int(value)


def _kv_layer_problem(r: _Reader) -> str | None:
    """Why ``kv_layer_configs`` describes per-layer KV shapes, or None where every entry is the
    top-level shape."""
    configs = r.raw("kv_layer_configs")
    if configs is None:
        return None
    if not isinstance(configs, list):
        raise r.error("kv_layer_configs", f"expected a list (one entry per layer), got {_got(configs)}")
    heads, dim = r.raw("num_key_value_heads"), r.raw("head_dim")
    shapes = set()
    for i, entry in enumerate(configs):
        if entry is None:
            continue  # a recurrent layer: reported as hybrid
        if not isinstance(entry, Mapping):
            raise r.error(f"kv_layer_configs[{i}]", f"expected an object or null, got {_got(entry)}")
        if "kv_cache_capacity" in entry:
            return f"layer {i} has its own KV cache capacity ({entry['kv_cache_capacity']!r})"
        shapes.add((entry.get("num_kv_heads"), entry.get("head_dim")))
    odd = sorted((s for s in shapes if s != (heads, dim)), key=repr)
    if odd:
        return (f"layers use KV heads x head_dim {', '.join(f'{h} x {d}' for h, d in odd)}, "
                f"not only the top-level {heads} x {dim}")
    return None


def unsupported_features(data: Mapping[str, Any], *, where: str = "config") -> list[tuple[str, str, str]]:
    """Every feature of an Edge-LLM config that trtio cannot bind yet, as (dotted key, family, detail).

    Empty for a config trtio can bind. ``where`` names the config in the errors raised for a marker
    key of the wrong type.
    """
    r = _Reader(data, where)
    found: list[tuple[str, str, str]] = []
    layers = r.raw("num_hidden_layers")

    # Hybrid linear attention (Qwen3.5 Gated-DeltaNet, Nemotron-H Mamba2): recurrent layers with state
    # bindings instead of a KV cache.
    n_linear = _nonzero_int(r, "num_linear_attn_layers")
    layer_types = r.raw("layer_types")
    if n_linear:
        found.append(("num_linear_attn_layers", "hybrid linear attention", f"{n_linear} of {layers} layers are "
                      "recurrent (Mamba / Gated-DeltaNet), with state bindings instead of a KV cache"))
    elif layer_types is not None:
        if not isinstance(layer_types, list):
            raise r.error("layer_types", f"expected a list, got {_got(layer_types)}")
        other = sorted({str(t) for t in layer_types if t != "attention"})
        if other:
            found.append(("layer_types", "hybrid linear attention", f"layer types {other} besides 'attention'"))
    elif r.has("recurrent_state_num_heads"):
        found.append(("recurrent_state_num_heads", "hybrid linear attention", "recurrent state bindings"))

    # Per-layer KV head dims (Gemma-4: global layers with their own head_dim / KV heads).
    global_dim = r.raw("global_head_dim")
    if global_dim not in (None, 0) and global_dim != r.raw("head_dim"):
        found.append(("global_head_dim", "per-layer KV head dims", f"global layers use head_dim {global_dim!r}, "
                      f"the others {r.raw('head_dim')!r}"))
    else:
        problem = _kv_layer_problem(r)
        if problem is not None:
            found.append(("kv_layer_configs", "per-layer KV head dims", problem))
        else:
            global_heads = r.raw("num_global_key_value_heads")
            if global_heads not in (None, 0) and global_heads != r.raw("num_key_value_heads"):
                found.append(("num_global_key_value_heads", "per-layer KV head dims",
                              f"global layers use {global_heads!r} KV heads, the others "
                              f"{r.raw('num_key_value_heads')!r}"))
            elif r.bool_("attention_k_eq_v"):
                found.append(("attention_k_eq_v", "per-layer KV head dims", "K == V attention layers"))

    # KV sharing (Gemma-4: later layers read an earlier layer's KV cache).
    donors = r.raw("kv_sharing_donors")
    if donors is not None:
        if not isinstance(donors, list):
            raise r.error("kv_sharing_donors", f"expected a list (one donor index or -1 per layer), got {_got(donors)}")
        shared = [i for i, d in enumerate(donors) if d != -1]
        if shared:
            found.append(("kv_sharing_donors", "KV sharing", f"layers {shared} read the KV cache of layers "
                          f"{[donors[i] for i in shared]}"))
    elif _nonzero_int(r, "num_kv_shared_layers"):
        found.append(("num_kv_shared_layers", "KV sharing", f"{r.raw('num_kv_shared_layers')} layers read another "
                      "layer's KV cache"))
    elif r.raw("kv_sharing_map"):
        found.append(("kv_sharing_map", "KV sharing", "the draft reads the target's KV cache"))
    elif r.bool_("shares_target_kv"):
        found.append(("shares_target_kv", "KV sharing", "the draft reads the target's KV cache"))

    # Sliding-window layers with their own RoPE (two cos/sin tables) and KV pool.
    for key in ("sliding_rope_config", "full_rope_config", "sliding_rotary_dim", "global_rope_theta"):
        if r.raw(key) is not None:
            found.append((key, "sliding-window dual RoPE", "sliding and full attention layers use different RoPE "
                          "tables (rope_rotary_cos_sin and rope_rotary_cos_sin_sliding)"))
            break
    if _nonzero_int(r, "builder_config.num_swa_pages"):
        found.append(("builder_config.num_swa_pages", "sliding-window dual RoPE",
                      f"sliding layers use a KV pool of {r.raw('builder_config.num_swa_pages')} pages of their own"))

    # Per-layer embeddings (Gemma-4 "PLE": an extra per-layer input table).
    ple = r.bool_("ple_enabled")
    n_ple, ple_hidden = _nonzero_int(r, "num_ple_inputs"), _nonzero_int(r, "ple_hidden_size")
    if ple or n_ple or ple_hidden:
        key = "ple_enabled" if ple else ("num_ple_inputs" if n_ple else "ple_hidden_size")
        found.append((key, "per-layer embeddings (Gemma PLE)", f"num_ple_inputs {n_ple}, ple_hidden_size "
                      f"{ple_hidden}: a per-layer input table trtio does not allocate"))

    # Roles and modes trtio has no step protocol for.
    if r.raw("engine_role") == "dllm" or r.raw("decoding_strategy") == "block_diffusion":
        key = "engine_role" if r.raw("engine_role") == "dllm" else "decoding_strategy"
        found.append((key, "diffusion LLM (dllm) engines", "trtio has no block-diffusion step protocol"))
    tp = r.raw("builder_config.tp_size")
    if (tp is not None and tp != 1) or r.has("rank_configs"):
        key = "builder_config.tp_size" if tp not in (None, 1) else "rank_configs"
        found.append((key, "tensor parallelism", f"tp_size {tp!r}: one engine per rank, bound across GPUs"))
    if _nonzero_int(r, "builder_config.max_lora_rank"):
        found.append(("builder_config.max_lora_rank", "LoRA adapters",
                      f"max_lora_rank {r.raw('builder_config.max_lora_rank')}: adapter weight inputs trtio does not "
                      "bind"))
    spec_type = r.raw("spec_decode_type")
    if r.raw("engine_role") in ("base", "draft") and isinstance(spec_type, str) and spec_type != "none" \
            and spec_type not in _SPEC_DECODE_TYPES:
        found.append(("spec_decode_type", f"speculative decoding of type {spec_type!r}",
                      "trtio binds EAGLE3 pairs only"))
    return found


def _refuse_unsupported(data: Mapping[str, Any], where: str) -> None:
    found = unsupported_features(data, where=where)
    if not found:
        return
    key, family, detail = found[0]
    also = "".join(f"; also {k} ({f}: {d})" for k, f, d in found[1:])
    raise ConfigError(f"{where}: {key}", f"marks {family}, which trtio does not support yet ({detail}); the "
                                         f"config is refused rather than bound wrong{also}")


# -- the mapping ------------------------------------------------------------------------------

def _source(source: str | os.PathLike[str] | Mapping[str, Any], what: str | None) -> tuple[Any, str]:
    if isinstance(source, (str, bytes, os.PathLike)):
        path = os.fsdecode(source)
        return _read_json(path), what or path
    # Parsed JSON: a dict, or anything else a file may hold ([1, 2], null), which the caller refuses by name.
    return source, what or "Edge-LLM config"


def config_from_edgellm(source: str | os.PathLike[str] | Mapping[str, Any], *,
                        what: str | None = None) -> LLMEngineConfig:
    """A validated :class:`LLMEngineConfig` from one Edge-LLM 0.11 engine config (a path or its dict).

    See the module docstring for the key -> field table. Raises :class:`ConfigError` naming the
    file (or ``what``) and the dotted key: a missing or mistyped key, a non-finite number, an unknown
    role, a value Edge-LLM's runtime would refuse, or a family trtio cannot bind yet.
    """
    data, where = _source(source, what)
    if not isinstance(data, Mapping):
        raise ConfigError(where, f"must hold a JSON object (Edge-LLM's engine config), got a {_json_kind(data)}")
    _refuse_unsupported(data, where)
    r = _Reader(data, where)
    builder = r.take("builder_config", "an object: Edge-LLM's builder writes max_batch_size, max_input_len, "
                                       "max_kv_cache_capacity, ... beside the engine", required=True)
    if not isinstance(builder, Mapping):
        raise r.error("builder_config", f"expected an object, got {_got(builder)}")
    r.used.discard("builder_config")  # its keys are accounted for one by one

    version = data.get("edgellm_version")
    if isinstance(version, str) and not (version == _EDGELLM_VERSION or version.startswith(_EDGELLM_VERSION + ".")):
        log.warning("%s was written by Edge-LLM %s; trtio reads Edge-LLM %s configs", where, version,
                    _EDGELLM_VERSION)

    role = r.str_("engine_role", _ROLES, meaning="Edge-LLM also writes 'dllm', which trtio does not support")
    _check_spec_mode(r, role)
    r.str_("builder_config.ragged_backend", (RAGGED_BACKEND,),
           meaning="the only ragged backend Edge-LLM 0.11's runtime accepts; a config without it predates the "
                   "token-major engines")
    r.used.discard("builder_config.ragged_backend")  # it becomes contract="ragged", keep the raw value too

    hidden = r.int_("hidden_size")
    vocab = r.int_("vocab_size")
    heads = r.int_("num_attention_heads")
    layers = r.int_("num_hidden_layers")
    if r.has("num_attention_layers"):
        layers = r.int_("num_attention_layers", meaning="the attention layers, each with a KV cache")
    kv_heads = r.int_("num_key_value_heads")
    if heads % kv_heads:
        raise r.error("num_key_value_heads", f"{kv_heads} must divide num_attention_heads ({heads})")
    if r.raw("head_dim") is None and hidden % heads:
        raise r.error("head_dim", f"is absent and hidden_size / num_attention_heads = {hidden} / {heads} is not "
                                  "an int; give head_dim")
    head_dim = r.int_("head_dim", default=hidden // heads)
    rotary_dim = _rotary_dim(r, head_dim)
    theta = r.number("rope_theta", default=10000.0, low=0.0)
    rope_scaling, rope_type = _rope_scaling(r)
    max_positions = r.int_("max_position_embeddings", default=0, low=0, meaning="the model's context length")
    deepstack = r.int_("num_deepstack_features", default=0, low=0)
    kv_dtype = r.str_("kv_cache_dtype", _KV_DTYPES, default="fp16", meaning="Edge-LLM's KV cache dtype names")

    batch = r.int_("builder_config.max_batch_size", meaning="sequences per step")
    input_len = r.int_("builder_config.max_input_len", meaning="prompt tokens per sequence")
    capacity = r.int_("builder_config.max_kv_cache_capacity", meaning="KV cache tokens per sequence")
    if input_len > capacity:
        raise r.error("builder_config.max_input_len", f"{input_len} exceeds builder_config.max_kv_cache_capacity "
                                                      f"({capacity}): a prompt must fit the KV cache")
    pool = r.int_("builder_config.max_kv_pool_pages", default=0, low=0, meaning="pages per KV pool")

    output_vocab = vocab
    base_hidden = 0
    verify = draft_tree = 0
    eagle_layers: tuple[int, ...] = ()
    if role == "draft":
        output_vocab = r.int_("draft_vocab_size", meaning="the width of the draft's logits")
        base_hidden = r.int_("base_model_hidden_size",
                             meaning="the width of the base hidden states the draft reads (EAGLE3: 3 x the base's "
                                     "hidden_size)")
        draft_tree = r.int_("builder_config.max_draft_tree_size", meaning="most tokens one draft step takes")
    if r.raw("reduced_vocab_size") is not None:
        output_vocab = r.int_("reduced_vocab_size", meaning="the logits width of a reduced-vocabulary engine")
        if output_vocab > vocab:
            raise r.error("reduced_vocab_size", f"{output_vocab} exceeds vocab_size ({vocab})")
    if role == "base":
        verify = r.int_("builder_config.max_verify_tree_size", meaning="most tokens one verify step takes")
        eagle_layers = _eagle_layers(r, layers)
    step = {"base": verify, "draft": draft_tree}.get(role, 0)
    if step > capacity:
        key = "builder_config.max_verify_tree_size" if role == "base" else "builder_config.max_draft_tree_size"
        raise r.error(key, f"{step} exceeds builder_config.max_kv_cache_capacity ({capacity})")

    values: dict[str, Any] = dict(
        hidden_size=hidden, vocab_size=vocab, max_supported_batch_size=batch, max_supported_input_length=input_len,
        max_kv_cache_capacity=capacity, num_attention_layers=layers, num_attention_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, rotary_dim=rotary_dim, output_vocab_size=output_vocab,
        activation_dtype="float16", kv_cache_dtype=str(DType.coerce(kv_dtype)), num_deepstack_features=deepstack,
        rope_type=rope_type, rope_theta=theta, is_spec_decode_base=role == "base",
        base_model_hidden_size=base_hidden, max_verify_tree_size=verify, max_draft_tree_size=draft_tree,
        contract="ragged", kv_page_size=KV_PAGE_SIZE, kv_pool_pages=pool, rope_scaling=rope_scaling,
        max_position_embeddings=max_positions,
        eagle_hidden_state_layers=eagle_layers, extras=r.extras(),
    )
    try:
        return LLMEngineConfig(**values).validate()
    except ConfigError as exc:  # a relation the checks above do not cover: name the Edge-LLM key
        key = _SOURCE_KEY.get(exc.field, exc.field)
        field_note = f" (trtio's {exc.field})" if key != exc.field else ""
        raise r.error(key, f"{_message(exc)}{field_note}") from None


def _check_spec_mode(r: _Reader, role: str) -> None:
    spec_type = r.raw("spec_decode_type")
    if role == "llm":
        if spec_type is not None and spec_type != "none":
            raise r.error("spec_decode_type", f"is {spec_type!r} but engine_role is 'llm'; a non-speculative engine "
                                              "has spec_decode_type 'none'")
    else:
        r.str_("spec_decode_type", _SPEC_DECODE_TYPES, meaning=f"the speculative family of a {role} engine")
        r.used.discard("spec_decode_type")  # no trtio field holds it: it stays in extras
    for key, want in (("builder_config.spec_base", role == "base"), ("builder_config.spec_draft", role == "draft")):
        value = r.bool_(key)
        if value is not None and value != want:
            raise r.error(key, f"is {str(value).lower()} but engine_role is {role!r}: the engine was built for "
                               "another role")


def _rotary_dim(r: _Reader, head_dim: int) -> int:
    factor = r.number("partial_rotary_factor", default=1.0, low=0.0, high=1.0)
    exact = head_dim * factor
    rotary = round(exact)
    if abs(exact - rotary) > 1e-6 or rotary % 2 or rotary <= 0:
        raise r.error("partial_rotary_factor", f"head_dim {head_dim} x partial_rotary_factor {factor:g} = {exact:g} "
                                               "is not a positive even int (the rotary dimension)")
    return int(rotary)


def _rope_scaling(r: _Reader) -> tuple[RopeScaling | None, str]:
    value = r.take("rope_scaling", "null or an object (HF's rope_scaling)", required=False)
    if value is None:
        return None, "rope"
    if not isinstance(value, Mapping):
        raise r.error("rope_scaling", f"expected null or an object (HF's rope_scaling), got {_got(value)}")
    try:
        scaling = RopeScaling.from_hf(value, what="rope_scaling")
    except ConfigError as exc:
        raise r.error(exc.field, _message(exc)) from None
    if scaling is None:
        return None, "rope"
    is_mrope = scaling.mrope_section is not None or scaling.rope_type == "mrope"
    return scaling, "mrope" if is_mrope else "rope"


def _eagle_layers(r: _Reader, layers: int) -> tuple[int, ...]:
    value = r.take("eagle_hidden_state_layers", "a list of layer indices", required=False)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(_is_int(i) for i in value):
        raise r.error("eagle_hidden_state_layers", f"expected a list of layer indices, got {_got(value)}")
    bad = [i for i in value if not 0 <= i < layers]
    if bad:
        raise r.error("eagle_hidden_state_layers", f"{value}: {bad} outside [0, num_hidden_layers={layers})")
    return tuple(value)


# -- engine directories -----------------------------------------------------------------------

class EngineDir:
    """An Edge-LLM 0.11 engine directory, opened and checked: its kind, configs and engine paths.

    ``kind`` is ``"llm"`` (``config.json`` + ``llm.engine``) or ``"spec_decode"`` (``base_config.json``
    + ``spec_base.engine`` and ``draft_config.json`` + ``spec_draft.engine``). The configs are read and
    validated at :meth:`open`; the engines need not exist yet (planning from configs alone). Nothing is
    held open: an EngineDir is a value.
    """

    __slots__ = ("_path", "_kind", "_configs", "_raw")

    def __init__(self, path: Path, kind: str, configs: dict[str, LLMEngineConfig], raw: dict[str, Any]) -> None:
        self._path = path
        self._kind = kind
        self._configs = configs
        self._raw = raw

    # -- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> EngineDir:
        """Read and check the directory at ``path``; :class:`ConfigError` naming the file and key if it
        is not a usable Edge-LLM engine directory."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"EngineDir.open: expected the path of an engine directory, got {type(path).__name__} "
                            f"{path!r}")
        root = Path(path)
        if not root.exists():
            raise ConfigError(str(root), "no such engine directory")
        if not root.is_dir():
            hint = ""
            if root.name in CONFIG_FILES.values():
                hint = (f"; pass its folder (EngineDir.open({str(root.parent)!r})) or read the file alone with "
                        "LLMEngineConfig.from_edgellm(path)")
            raise ConfigError(str(root), f"is a file, not an engine directory{hint}")
        kind = _kind_of(root)
        roles = ("llm",) if kind == "llm" else ("base", "draft")
        configs: dict[str, LLMEngineConfig] = {}
        raw: dict[str, Any] = {}
        for role in roles:
            file = root / CONFIG_FILES[role]
            data = _read_json(file)
            _check_role(file, data, role)
            configs[role] = config_from_edgellm(data, what=str(file))
            raw[role] = data
        if kind == "spec_decode":
            _check_pair(root, configs["base"], configs["draft"])
        return cls(root, kind, configs, raw)

    # -- what it holds ------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._path

    @property
    def kind(self) -> str:
        """``"llm"`` or ``"spec_decode"``."""
        return self._kind

    @property
    def roles(self) -> tuple[str, ...]:
        """``("llm",)`` or ``("base", "draft")``."""
        return tuple(self._configs)

    @property
    def config(self) -> LLMEngineConfig:
        """The plain LLM's config (``kind == "llm"``)."""
        return self._config("llm")

    @property
    def base_config(self) -> LLMEngineConfig:
        """The speculative base's config (``kind == "spec_decode"``)."""
        return self._config("base")

    @property
    def draft_config(self) -> LLMEngineConfig:
        """The speculative draft's config (``kind == "spec_decode"``)."""
        return self._config("draft")

    def config_path(self, role: str) -> Path:
        """The config file of ``role``."""
        return self._path / CONFIG_FILES[self._role(role)]

    def engine_path(self, role: str) -> Path:
        """The engine (plan) file of ``role``: ``llm.engine``, ``spec_base.engine`` or ``spec_draft.engine``.
        It may not exist yet (a directory of configs opens for planning); see :attr:`has_engines`."""
        return self._path / ENGINE_FILES[self._role(role)]

    @property
    def has_engines(self) -> bool:
        """Whether every engine file of the directory is there."""
        return all(self.engine_path(role).is_file() for role in self.roles)

    def raw(self, role: str | None = None) -> dict[str, Any]:
        """The JSON of ``role``'s config as read (a copy); ``role`` may be left out for a plain LLM."""
        if role is None:
            if self._kind != "llm":
                raise ConfigError("role", f"{self._path} holds a speculative pair: ask for 'base' or 'draft'")
            role = "llm"
        return copy.deepcopy(dict(self._raw[self._role(role)]))

    def deployment(self, draft_top_k: int | None = None, draft_step: int | None = None,
                   verify_size: int | None = None) -> DeploymentConfig:
        """The :class:`DeploymentConfig` of this directory.

        A plain LLM takes no arguments. A speculative pair needs the three values Edge-LLM's runtime
        takes at run time: ``draft_top_k`` (candidates per drafted node), ``draft_step`` (draft levels
        per round) and ``verify_size`` (tree nodes the base verifies). They are checked against the
        configs' caps: ``verify_size <= builder_config.max_verify_tree_size`` of the base and
        ``draft_top_k x draft_step <= builder_config.max_draft_tree_size`` of the draft.
        """
        given = {"draft_top_k": draft_top_k, "draft_step": draft_step, "verify_size": verify_size}
        if self._kind == "llm":
            for name, value in given.items():
                if value is not None:
                    raise ConfigError(name, f"is for a speculative pair; {self._path} holds a plain LLM")
            return DeploymentConfig(self.config).validate()
        for name, value in given.items():
            if value is None:
                raise ConfigError(name, f"is required for the speculative pair in {self._path} (Edge-LLM takes "
                                        "draft_top_k, draft_step and verify_size at run time)")
            if not _is_int(value) or value < 1:
                raise ConfigError(name, f"must be a positive int, got {value!r}")
        assert draft_top_k is not None and draft_step is not None and verify_size is not None
        base, draft = self.base_config, self.draft_config
        if verify_size > base.max_verify_tree_size:
            raise ConfigError("verify_size", f"{verify_size} exceeds builder_config.max_verify_tree_size "
                                             f"({base.max_verify_tree_size}) of {self.config_path('base')}")
        if draft_top_k * draft_step > draft.max_draft_tree_size:
            raise ConfigError("draft_top_k", f"draft_top_k x draft_step = {draft_top_k} x {draft_step} = "
                                             f"{draft_top_k * draft_step} exceeds builder_config.max_draft_tree_size "
                                             f"({draft.max_draft_tree_size}) of {self.config_path('draft')}: one "
                                             "proposal step drafts that many tokens")
        spec = SpecDecodeConfig(
            base_output_hidden_dim=draft.base_model_hidden_size, draft_hidden_size=draft.hidden_size,
            max_verify_size=base.max_verify_tree_size, max_draft_proposal_size=draft.max_draft_tree_size,
            drafting_top_k=draft_top_k, drafting_step=draft_step, verify_size=verify_size)
        return DeploymentConfig(base, draft, spec).validate()

    # -- runtime artifacts --------------------------------------------------------------------
    def embedding_table(self) -> np.ndarray:
        """The token embedding table Edge-LLM's runtime looks ``inputs_embeds`` up in: float16
        ``[rows, hidden_size]`` from ``embedding.safetensors`` (tensor ``"embedding"``).

        Edge-LLM's builder writes the table beside a plain LLM or a speculative base, already multiplied
        by the model's embedding scale; an EAGLE3 draft reads the base's table. An FP16 table comes back
        read-only (a memory map of a large file, valid while the file exists); an FP8 (e4m3) table and its
        ``"embedding_scale"`` (float32, one per 128 columns of a row) are dequantized, and BF16 / FP32
        tables converted, into a new array owned by the caller. Raises :class:`~trtio.ConfigError` naming
        the file where it is absent (a build that leaves the embedding in the checkpoint writes none),
        malformed, or not ``hidden_size`` wide.
        """
        role = "llm" if self._kind == "llm" else "base"
        file = self._path / EMBEDDING_FILE
        if not file.is_file():
            hint = ""
            if "checkpoint_weight_bindings" in self._raw[role]:
                hint = (f"; {CONFIG_FILES[role]} has checkpoint_weight_bindings: the builder may have left the "
                        "embedding in the checkpoint, where Edge-LLM's runtime reads it and trtio does not")
            raise ConfigError(str(file), f"no such file (Edge-LLM's builder writes the token embedding table "
                                         f"here){hint}")
        tensors = read_safetensors(file)
        if "embedding" not in tensors:
            raise ConfigError(str(file), f"holds no tensor 'embedding' (it holds {sorted(tensors)})")
        table = tensors["embedding"]
        hidden = self._configs[role].hidden_size
        if table.array.ndim != 2 or table.array.shape[1] != hidden:
            raise ConfigError(f"{file}: embedding", f"expected [vocab, {hidden}] (hidden_size of "
                                                    f"{CONFIG_FILES[role]}), got {table.dtype} "
                                                    f"{list(table.array.shape)}")
        return _embedding_float16(file, table, tensors.get("embedding_scale"))

    def draft_to_target(self) -> np.ndarray:
        """int64 ``[draft vocab]``: the base token id of each column of the draft's logits (EAGLE3).

        Read from ``d2t.safetensors`` (one 1-D integer tensor of ``draft_vocab_size`` entries) and read as
        Edge-LLM 0.11's runtime reads it: older exports store offsets (target = draft id + value), newer
        ones the target ids themselves; a table valid only one way is read that way, and one valid both
        ways as offsets only where that reaches more distinct target ids. Without the file the map is the
        identity (Edge-LLM's zero offsets). Raises :class:`~trtio.ConfigError` for a plain LLM directory or
        a table that is malformed or maps outside the base's ``vocab_size``.
        """
        if self._kind != "spec_decode":
            raise ConfigError(str(self._path), f"holds a {self._kind} engine; only a speculative pair has a "
                                               "draft-to-target map")
        draft_vocab = self.draft_config.output_vocab_size
        vocab = self.base_config.vocab_size
        file = self._path / D2T_FILE
        if not file.is_file():
            return np.arange(draft_vocab, dtype=np.int64)
        tensors = read_safetensors(file)
        if len(tensors) != 1:
            raise ConfigError(str(file), f"expected exactly one tensor (the map), it holds {sorted(tensors)}")
        (name, table), = tensors.items()
        if table.dtype not in ("I32", "I64") or table.array.shape != (draft_vocab,):
            raise ConfigError(f"{file}: {name}", f"expected an I32 or I64 tensor of draft_vocab_size = {draft_vocab} "
                                                 f"entries ({CONFIG_FILES['draft']}), got {table.dtype} "
                                                 f"{list(table.array.shape)}")
        raw = np.asarray(table.array, dtype=np.int64)
        ids = np.arange(draft_vocab, dtype=np.int64)
        direct_ok = bool(((raw >= 0) & (raw < vocab)).all())
        shifted = ids + raw
        offset_ok = bool(((shifted >= 0) & (shifted < vocab)).all())
        if not (direct_ok or offset_ok):
            bad = int(np.flatnonzero((raw < 0) | (raw >= vocab))[0])
            raise ConfigError(f"{file}: {name}", f"maps outside the base's vocab_size ({vocab}) read either way: "
                                                 f"entry {bad} is {int(raw[bad])}, as an offset "
                                                 f"{int(shifted[bad])}")
        if offset_ok and (not direct_ok or np.unique(shifted).size > np.unique(raw).size):
            return shifted
        return raw

    def __iter__(self) -> Iterator[tuple[str, LLMEngineConfig]]:
        """(role, config) pairs, base before draft."""
        return iter(self._configs.items())

    def __repr__(self) -> str:
        engines = "engines present" if self.has_engines else "configs only"
        return f"EngineDir({str(self._path)!r}, kind={self._kind!r}, {engines})"

    # -- helpers ------------------------------------------------------------------------------
    def _role(self, role: str) -> str:
        if role not in self._configs:
            raise ConfigError("role", f"expected one of {list(self._configs)} for the {self._kind} directory "
                                      f"{self._path}, got {role!r}")
        return role

    def _config(self, role: str) -> LLMEngineConfig:
        if role not in self._configs:
            other = "config" if self._kind == "llm" else "base_config / draft_config"
            raise ConfigError(CONFIG_FILES[role], f"{self._path} is a {self._kind} directory without it; use .{other}")
        return self._configs[role]


def _embedding_float16(file: Path, table: SafeTensor, scale: SafeTensor | None) -> np.ndarray:
    """An embedding table as float16 [rows, hidden]: FP16 as stored, FP8 dequantized with its scales."""
    raw = table.array
    if table.dtype == "F16":
        return raw
    if table.dtype in ("F32", "BF16"):
        return (bf16_to_float32(raw) if table.dtype == "BF16" else raw).astype(np.float16)
    if table.dtype != "F8_E4M3":
        raise ConfigError(f"{file}: embedding", f"expected F16, BF16, F32 or F8_E4M3 elements, got {table.dtype}")
    rows, hidden = raw.shape
    groups = hidden // _EMBEDDING_GROUP
    if scale is None or hidden % _EMBEDDING_GROUP or scale.array.shape != (rows, groups) or scale.dtype != "F32":
        got = "none" if scale is None else f"{scale.dtype} {list(scale.array.shape)}"
        raise ConfigError(f"{file}: embedding_scale", f"an F8_E4M3 table [{rows}, {hidden}] needs F32 scales "
                                                      f"[{rows}, {hidden} / {_EMBEDDING_GROUP}], got {got}")
    out = np.empty((rows, hidden), np.float16)
    for start in range(0, rows, 4096):  # bounded float32 temporaries for a large vocabulary
        stop = min(rows, start + 4096)
        values = e4m3_to_float32(raw[start:stop]).reshape(stop - start, groups, _EMBEDDING_GROUP)
        out[start:stop] = (values * scale.array[start:stop, :, None]).reshape(stop - start, hidden)
    return out


def _kind_of(root: Path) -> str:
    present = {name for name in (*CONFIG_FILES.values(), *ENGINE_FILES.values()) if (root / name).is_file()}
    llm_files = sorted(present & {CONFIG_FILES["llm"], ENGINE_FILES["llm"]})
    spec_files = sorted(present - set(llm_files))
    if llm_files and spec_files:
        raise ConfigError(str(root), f"holds both a plain LLM ({', '.join(llm_files)}) and a speculative pair "
                                     f"({', '.join(spec_files)}); an engine directory holds one deployment")
    if spec_files:
        for a, b in (("base", "draft"), ("draft", "base")):
            if CONFIG_FILES[a] in present and CONFIG_FILES[b] not in present:
                raise ConfigError(str(root / CONFIG_FILES[b]),
                                  f"is missing: {CONFIG_FILES[a]} is here without it; a speculative directory needs "
                                  f"{CONFIG_FILES['base']} and {CONFIG_FILES['draft']}")
            if ENGINE_FILES[a] in present and ENGINE_FILES[b] not in present:
                raise ConfigError(str(root / ENGINE_FILES[b]),
                                  f"is missing: {ENGINE_FILES[a]} is here without it; a speculative directory holds "
                                  "both engines (or, to plan from the configs alone, neither)")
        if CONFIG_FILES["base"] not in present:
            raise ConfigError(str(root / CONFIG_FILES["base"]),
                              f"is missing: the engines need the {CONFIG_FILES['base']} and {CONFIG_FILES['draft']} "
                              "their builder wrote beside them")
        return "spec_decode"
    if llm_files:
        if CONFIG_FILES["llm"] not in present:
            raise ConfigError(str(root / CONFIG_FILES["llm"]),
                              f"is missing: {ENGINE_FILES['llm']} needs the config.json its builder wrote beside it")
        return "llm"
    tp = sorted(p.name for p in root.glob("config_world*.json"))
    if tp:
        raise ConfigError(str(root / tp[0]), "is a tensor-parallel engine config; tensor-parallel directories "
                                             "(one engine per rank) are not supported by trtio yet")
    if (root / "dllm.engine").is_file():
        raise ConfigError(str(root / "dllm.engine"), "is a diffusion LLM engine; trtio has no block-diffusion "
                                                     "step protocol")
    raise ConfigError(str(root), "holds no Edge-LLM engine config: expected config.json (+ llm.engine) for a plain "
                                 "LLM, or base_config.json + draft_config.json (+ spec_base.engine, "
                                 "spec_draft.engine) for a speculative pair")


def _check_role(file: Path, data: Any, role: str) -> None:
    """Refuse a config whose ``engine_role`` is not the one its file name holds."""
    if not isinstance(data, Mapping):
        return  # config_from_edgellm names it
    found = data.get("engine_role")
    if isinstance(found, str) and found in _ROLES and found != role:
        holds = {"llm": "a plain LLM's config", "base": "the speculative base's config",
                 "draft": "the speculative draft's config"}[role]
        raise ConfigError(f"{file}: engine_role", f"is {found!r}, but {file.name} holds {holds} (expected "
                                                  f"{role!r}); Edge-LLM writes {CONFIG_FILES[found]} for a "
                                                  f"{found!r} engine")


def _check_pair(root: Path, base: LLMEngineConfig, draft: LLMEngineConfig) -> None:
    """The base and the draft must be one deployment; name the numbers that disagree."""
    bfile, dfile = root / CONFIG_FILES["base"], root / CONFIG_FILES["draft"]
    btype, dtype = base.extras.get("spec_decode_type"), draft.extras.get("spec_decode_type")
    if btype != dtype:
        raise ConfigError(f"{dfile}: spec_decode_type", f"is {dtype!r}, but {bfile.name} says {btype!r}; base and "
                                                        "draft must be one speculative family")
    n = len(base.eagle_hidden_state_layers) or 3  # EAGLE3 feeds 3 base layers to its draft
    layers = (f"the {n} layers of eagle_hidden_state_layers {list(base.eagle_hidden_state_layers)}"
              if base.eagle_hidden_state_layers else f"{n} layers (EAGLE3's count; {bfile.name} names none)")
    if draft.base_model_hidden_size != n * base.hidden_size:
        raise ConfigError(f"{dfile}: base_model_hidden_size",
                          f"{draft.base_model_hidden_size} does not match the base: {bfile.name} feeds the draft "
                          f"{layers} of hidden_size {base.hidden_size}, {n} x {base.hidden_size} = "
                          f"{n * base.hidden_size}")
    # The KV page size needs no check: Edge-LLM fixes it at 128 for both.
    if draft.max_supported_batch_size != base.max_supported_batch_size:
        raise ConfigError(f"{dfile}: builder_config.max_batch_size",
                          f"{draft.max_supported_batch_size} differs from the base's {base.max_supported_batch_size} "
                          f"({bfile.name}); base and draft run the same sequences, and Edge-LLM's builder writes one "
                          "batch size for both")
    if draft.output_vocab_size > base.vocab_size:
        raise ConfigError(f"{dfile}: draft_vocab_size", f"{draft.output_vocab_size} exceeds the base's vocab_size "
                                                        f"({base.vocab_size}, {bfile.name}); draft tokens map onto "
                                                        "base tokens")
    if draft.is_mrope and not base.is_mrope:
        raise ConfigError(f"{dfile}: rope_scaling", f"uses MRoPE but the base ({bfile.name}) does not")
