"""TensorRT Edge-LLM 0.11's engine ``config.json``, read onto trtio's config fields.

:func:`map_edgellm_config` reads one config (``config.json``, ``base_config.json`` or
``draft_config.json``) into the values of trtio's :class:`~trtio._config.LLMEngineConfig`, which
``LLMEngineConfig.from_edgellm`` builds and validates; :class:`~trtio.edgellm.EngineDir` opens a
whole engine directory. The mapping sits beneath :mod:`trtio._config` (it knows field names, not the
config class), so the config module can offer ``from_edgellm`` without importing the directory code.

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
``builder_config.max_lora_rank``         ``max_lora_rank``              default 0 (no LoRA inputs)
``builder_config.ragged_backend``        ``contract = "ragged"``        required:
                                                                        ``entry_padded_compatibility``
``layer_types``, ``kv_layer_configs``    same names                     hybrid models; entries 'attention' /
                                                                        'mamba'; KV geometry per attention layer
``conv_dim``, ``conv_kernel``,           same names                     required where a layer is 'mamba';
``recurrent_state_*``                                                   dtypes fp16 / bf16 / fp32
``recurrent_spec_verify_mode``           same name, ``recurrent_kind``  'snapshot' (GDN) / 'replay' (Mamba2);
                                                                        the kind also from groups and dtype
``use_rope``                             ``use_rope``                   default true
``mtp_tree_base``                        ``mtp_tree_base``              default false; a hybrid base that
                                                                        verifies trees (its recurrent layers
                                                                        read ``tree_parent_ids``)
``dflash_tree_base``                     ``dflash_tree_base``           the same for a DFlash base
``jetspec_tree_base``                    ``jetspec_tree_base``          the same for a JetSpec base
(fixed by Edge-LLM)                      ``kv_page_size = 128``,
                                         ``activation_dtype = float16``
======================================== ============================== ====================================

Every other key lands in ``extras`` (``builder_config`` keys as ``"builder_config.<key>"``). What this
mapping assumes where Edge-LLM leaves meaning open is listed, with how to check it, in
``docs/edgellm-assumptions.md``.
Engines trtio cannot bind yet are refused when their config is read, naming the key that marks them
(:data:`UNSUPPORTED_MARKERS`). A tensor-parallel config (``config_world{N}.json``, :data:`TENSOR_PARALLEL_KEYS`)
describes the whole model and each rank's overrides: it is read through its directory
(:class:`~trtio.edgellm.EngineDir`, ``tensor_parallel=True`` here), never alone. Errors are
:class:`~trtio.ConfigError` with the field ``"<file>: <dotted key>"``.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trtio._checks import is_int
from trtio._dtypes import DType
from trtio._json import json_kind, read_json
from trtio._rope import RopeScaling
from trtio.errors import ConfigError
from trtio.features import family_configs, keyword_owner

__all__ = ["KV_PAGE_SIZE", "RAGGED_BACKEND", "ROLES", "TENSOR_PARALLEL_KEYS",
           "UNSUPPORTED_MARKERS", "EdgeReader", "MappedConfig", "got", "map_edgellm_config", "unsupported_features"]

log = logging.getLogger("trtio")

#: Tokens per KV page: fixed by Edge-LLM 0.11 (``_KV_PAGE_SIZE`` in its builder; the attention plugin
#: takes ``[2, pages, 128, Hkv, D]`` pools only).
KV_PAGE_SIZE = 128
#: The only ``builder_config.ragged_backend`` Edge-LLM 0.11's runtime accepts.
RAGGED_BACKEND = "entry_padded_compatibility"
ROLES = ("llm", "base", "draft")  # engine_role values trtio binds
_KV_DTYPES = ("fp16", "bf16", "fp32", "fp8", "int8")
_EDGELLM_VERSION = "0.11"

#: The keys that mark each engine family trtio cannot bind yet (read from Edge-LLM 0.11's config
#: writers and confirmed on configs its builder wrote): family -> keys.
UNSUPPORTED_MARKERS: Mapping[str, tuple[str, ...]] = {
    "per-layer KV head dims": ("global_head_dim", "kv_layer_configs", "num_global_key_value_heads",
                               "attention_k_eq_v"),
    "KV sharing": ("kv_sharing_donors", "num_kv_shared_layers", "kv_sharing_map", "shares_target_kv"),
    "sliding-window dual RoPE": ("sliding_rope_config", "full_rope_config", "sliding_rotary_dim",
                                 "full_rotary_dim", "global_rope_theta", "builder_config.num_swa_pages"),
    "per-layer embeddings (PLE)": ("ple_enabled", "num_ple_inputs", "ple_hidden_size"),
    "diffusion LLM": ("engine_role", "decoding_strategy"),
    "speculative family": ("spec_decode_type",),
}

#: The keys that mark a tensor-parallel build (Edge-LLM's ``config_world{N}.json``): read with its directory.
TENSOR_PARALLEL_KEYS = ("builder_config.tp_size", "rank_configs")

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
    "max_supported_batch_size": "builder_config.max_batch_size",
    "max_supported_input_length": "builder_config.max_input_len",
    "max_kv_cache_capacity": "builder_config.max_kv_cache_capacity",
    "kv_pool_pages": "builder_config.max_kv_pool_pages",
    "max_verify_tree_size": "builder_config.max_verify_tree_size",
    "max_draft_tree_size": "builder_config.max_draft_tree_size",
    "layer_types": "layer_types",
    "kv_layer_configs": "kv_layer_configs",
    "use_rope": "use_rope",
}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def got(v: Any) -> str:
    """``v`` shown in an error: its repr and its JSON kind."""
    return f"{v!r} (a {json_kind(v)})"


class EdgeReader:
    """One Edge-LLM config dict read key by key; remembers which keys became trtio fields (a family's
    ``read_edgellm`` reads its keys through it)."""

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
        if not is_int(value) or value < low:
            raise self.error(key, f"expected {expected}, got {got(value)}")
        return int(value)

    def number(self, key: str, *, default: float, low: float, high: float | None = None) -> float:
        bounds = f"> {low:g}" + (f" and <= {high:g}" if high is not None else "")
        value = self.take(key, f"a finite number {bounds}", required=False)
        if value is None:
            return default
        if not _is_number(value) or not math.isfinite(value):
            raise self.error(key, f"expected a finite number {bounds}, got {got(value)}")
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
            raise self.error(key, f"expected {expected}, got {got(value)}")
        return value

    def bool_(self, key: str) -> bool | None:
        found, value = self._lookup(key)
        if not found or value is None:
            return None
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {got(value)}")
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

_Found = list[tuple[str, str, str]]  # (dotted key, family, detail)


def unsupported_features(data: Mapping[str, Any], *, where: str = "config") -> list[tuple[str, str, str]]:
    """Every feature of an Edge-LLM config that trtio cannot bind yet, as (dotted key, family, detail).

    Empty for a config trtio can bind. ``where`` names the config in the errors raised for a marker
    key of the wrong type.
    """
    r = EdgeReader(data, where)
    found: _Found = [f for family in family_configs() for f in family.unsupported(r)]
    return found + _unsupported_modes(r)


def _unsupported_modes(r: EdgeReader) -> _Found:
    """Roles and modes trtio has no step protocol for: diffusion (a speculative family trtio does not read is its
    family config's to refuse: ``FamilyConfig.unsupported``)."""
    found: _Found = []
    if r.raw("engine_role") == "dllm" or r.raw("decoding_strategy") == "block_diffusion":
        key = "engine_role" if r.raw("engine_role") == "dllm" else "decoding_strategy"
        found.append((key, "diffusion LLM (dllm) engines", "trtio has no block-diffusion step protocol"))
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

@dataclass(frozen=True)
class MappedConfig:
    """An Edge-LLM config read onto trtio's fields: ``LLMEngineConfig(**values)`` is the config."""

    values: dict[str, Any]
    where: str  # the file (or what the caller named the dict), for errors

    def error_for(self, exc: ConfigError) -> ConfigError:
        """``exc``, raised while validating :attr:`values`, named after the Edge-LLM key its field comes from
        (a relation between fields that the mapping's own checks do not cover)."""
        key = _SOURCE_KEY.get(exc.field) or _family_source_key(exc.field) or exc.field
        field_note = f" (trtio's {exc.field})" if key != exc.field else ""
        return ConfigError(f"{self.where}: {key}", f"{exc.message}{field_note}")


def _family_source_key(name: str) -> str | None:
    """The Edge-LLM key a family's keyword ``name`` is read from (None: no family's keyword)."""
    owner = keyword_owner(name)
    return owner.SOURCE_KEYS.get(name) if owner is not None else None


def _source(source: str | os.PathLike[str] | Mapping[str, Any], what: str | None) -> tuple[Any, str]:
    if isinstance(source, (str, bytes, os.PathLike)):
        path = os.fsdecode(source)
        return read_json(path), what or path
    # Parsed JSON: a dict, or anything else a file may hold ([1, 2], null), which the caller refuses by name.
    return source, what or "Edge-LLM config"


def _refuse_tensor_parallel(data: Mapping[str, Any], where: str) -> None:
    """A tensor-parallel config read alone: name the key and say how to read it."""
    r = EdgeReader(data, where)
    tp = r.raw("builder_config.tp_size")
    if (tp is None or tp == 1) and not r.has("rank_configs"):
        return
    key = "builder_config.tp_size" if tp not in (None, 1) else "rank_configs"
    raise ConfigError(f"{where}: {key}", f"marks a tensor-parallel build (tp_size {tp!r}: one engine per rank, "
                                         "each with its own heads); such a config_world{N}.json describes the whole "
                                         "model, so it is read with its directory: trtio.edgellm.EngineDir.open(dir)"
                                         ".rank_config(r) is rank r's config, and create_from_engine_dir(dir) binds "
                                         "every rank")


def _role_keys(r: EdgeReader, role: str, vocab: int, capacity: int) -> tuple[int, int, int, int]:
    """The keys of a base's or a draft's own: the logits width (a draft's vocabulary, a reduced one), the base
    hidden width a draft reads, the largest verify and draft trees."""
    output_vocab = vocab
    base_hidden = 0
    verify = draft_tree = 0
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
    step = {"base": verify, "draft": draft_tree}.get(role, 0)
    if step > capacity:
        key = "builder_config.max_verify_tree_size" if role == "base" else "builder_config.max_draft_tree_size"
        raise r.error(key, f"{step} exceeds builder_config.max_kv_cache_capacity ({capacity})")
    return output_vocab, base_hidden, verify, draft_tree


def _family_keywords(r: EdgeReader, role: str, layers: int) -> dict[str, Any]:
    """What every registered family reads of the config (:meth:`~trtio.features.FamilyConfig.read_edgellm`), in the
    family table's order. A core field two read (the KV table: a hybrid's layer stack, Gemma 4's per-layer geometry)
    is the later's; two families giving one family keyword is a bug of theirs."""
    out: dict[str, Any] = {}
    for family in family_configs():
        found = family.read_edgellm(r, role, layers)
        twice = sorted(k for k in set(found) & set(out) if keyword_owner(k) is not None)
        if twice:
            raise ConfigError(f"{r.where}: {twice[0]}", f"is read by two families ({family.__name__} the second)")
        out.update(found)
    return out


def map_edgellm_config(source: str | os.PathLike[str] | Mapping[str, Any], *, what: str | None = None,
                       tensor_parallel: bool = False) -> MappedConfig:
    """One Edge-LLM 0.11 engine config (a path or its dict) read onto trtio's field names; see the module
    docstring for the key -> field table. :meth:`LLMEngineConfig.from_edgellm
    <trtio._config.LLMEngineConfig.from_edgellm>` builds and validates the config from it.

    ``tensor_parallel=True`` (:class:`~trtio.edgellm.EngineDir` reading a ``config_world{N}.json``, the whole
    model or one rank's view of it) keeps ``builder_config.tp_size`` and ``rank_configs`` in ``extras``;
    otherwise a config with them is refused, naming the key.

    Raises :class:`ConfigError` naming the file (or ``what``) and the dotted key: a missing or mistyped
    key, a non-finite number, an unknown role, a value Edge-LLM's runtime would refuse, or a family trtio
    cannot bind yet.
    """
    data, where = _source(source, what)
    if not isinstance(data, Mapping):
        raise ConfigError(where, f"must hold a JSON object (Edge-LLM's engine config), got a {json_kind(data)}")
    if not tensor_parallel:
        _refuse_tensor_parallel(data, where)
    _refuse_unsupported(data, where)
    r = EdgeReader(data, where)
    builder = r.take("builder_config", "an object: Edge-LLM's builder writes max_batch_size, max_input_len, "
                                       "max_kv_cache_capacity, ... beside the engine", required=True)
    if not isinstance(builder, Mapping):
        raise r.error("builder_config", f"expected an object, got {got(builder)}")
    r.used.discard("builder_config")  # its keys are accounted for one by one

    version = data.get("edgellm_version")
    if isinstance(version, str) and not (version == _EDGELLM_VERSION or version.startswith(_EDGELLM_VERSION + ".")):
        log.warning("%s was written by Edge-LLM %s; trtio reads Edge-LLM %s configs", where, version,
                    _EDGELLM_VERSION)

    role = r.str_("engine_role", ROLES, meaning="Edge-LLM also writes 'dllm', which trtio does not support")
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
    values: dict[str, Any] = _family_keywords(r, role, layers)
    rope: tuple[Any, ...] = (values.get("rotary_dim"), values.get("rope_theta"), values.get("rope_scaling"))
    if "rotary_dim" not in values:  # the model's one RoPE table, unless a family read its RoPE its own way
        dim = _rotary_dim(r, head_dim)
        base = r.number("rope_theta", default=10000.0, low=0.0)
        rope = dim, base, _rope_scaling(r, base, dim / head_dim)
    rotary_dim, theta, rope_scaling = rope
    use_rope = r.bool_("use_rope")
    if use_rope is not None:
        r.used.add("use_rope")
        values["use_rope"] = use_rope
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

    output_vocab, base_hidden, verify, draft_tree = _role_keys(r, role, vocab, capacity)
    core: dict[str, Any] = dict(
        hidden_size=hidden, vocab_size=vocab, max_supported_batch_size=batch, max_supported_input_length=input_len,
        max_kv_cache_capacity=capacity, num_attention_layers=layers, num_attention_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, rotary_dim=rotary_dim, output_vocab_size=output_vocab,
        activation_dtype="float16", kv_cache_dtype=str(DType.coerce(kv_dtype)), num_deepstack_features=deepstack,
        rope_theta=theta, is_spec_decode_base=role == "base", base_model_hidden_size=base_hidden,
        max_verify_tree_size=verify, max_draft_tree_size=draft_tree, contract="ragged", kv_page_size=KV_PAGE_SIZE,
        kv_pool_pages=pool, rope_scaling=rope_scaling, max_position_embeddings=max_positions,
    )
    values = {**core, **values}  # what a family read its own way (a RoPE type, the layer stack) over the core's
    values["extras"] = r.extras()
    return MappedConfig(values, where)


def _check_spec_mode(r: EdgeReader, role: str) -> None:
    spec_type = r.raw("spec_decode_type")
    if role == "llm":
        if spec_type is not None and spec_type != "none":
            raise r.error("spec_decode_type", f"is {spec_type!r} but engine_role is 'llm'; a non-speculative engine "
                                              "has spec_decode_type 'none'")
    else:
        # the families' configs refuse a name none of them reads (FamilyConfig.unsupported)
        spec_type = r.take("spec_decode_type", f"the speculative family of a {role} engine", required=True)
        if not isinstance(spec_type, str) or spec_type == "none":
            raise r.error("spec_decode_type", f"expected the speculative family of a {role} engine (its name: "
                                              f"eagle3, ...), got {got(spec_type)}")
        r.used.discard("spec_decode_type")  # no trtio field holds it: it stays in extras
    for key, want in (("builder_config.spec_base", role == "base"), ("builder_config.spec_draft", role == "draft")):
        value = r.bool_(key)
        if value is not None and value != want:
            raise r.error(key, f"is {str(value).lower()} but engine_role is {role!r}: the engine was built for "
                               "another role")


def _rotary_dim(r: EdgeReader, head_dim: int) -> int:
    factor = r.number("partial_rotary_factor", default=1.0, low=0.0, high=1.0)
    exact = head_dim * factor
    rotary = round(exact)
    if abs(exact - rotary) > 1e-6 or rotary % 2 or rotary <= 0:
        raise r.error("partial_rotary_factor", f"head_dim {head_dim} x partial_rotary_factor {factor:g} = {exact:g} "
                                               "is not a positive even int (the rotary dimension)")
    return int(rotary)


def _rope_scaling(r: EdgeReader, theta: float, factor: float) -> RopeScaling | None:
    """``rope_scaling`` validated; its copies of ``rope_theta`` and ``partial_rotary_factor`` (Edge-LLM's writer
    puts them there too) must agree with the top-level keys, which the table is computed from."""
    value = r.take("rope_scaling", "null or an object (HF's rope_scaling)", required=False)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise r.error("rope_scaling", f"expected null or an object (HF's rope_scaling), got {got(value)}")
    try:
        scaling = RopeScaling.from_hf(value, what="rope_scaling")
    except ConfigError as exc:
        raise r.error(exc.field, exc.message) from None
    for key, top in (("rope_theta", theta), ("partial_rotary_factor", factor)):
        copy_ = value.get(key)
        if copy_ is not None and (not _is_number(copy_) or not math.isclose(float(copy_), top, rel_tol=1e-9)):
            raise r.error(f"rope_scaling.{key}", f"is {copy_!r} but the config's {key} is {top:g}: the RoPE table "
                                                 "would depend on which one is read")
    return scaling
