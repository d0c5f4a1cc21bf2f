"""Edge-LLM 0.11 engine directories and config.json -> trtio's configs.

The fixtures are configs written by NVIDIA's tensorrt-edgellm 0.11.0 package itself:
``fixtures/edgellm-0.11/`` (a tiny Qwen3 LLM and a Qwen3 + EAGLE3 pair) and, where present,
``fixtures/edgellm/`` (more families, each beside the Hugging Face config it was made from).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pickle
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _safetensors import write_safetensors

from trtio import ConfigError, DeploymentConfig, LLMEngineConfig
from trtio._edgellm_config import unsupported_features
from trtio._rope import RopeScaling
from trtio._safetensors import bf16_to_float32, e4m3_to_float32, read_safetensors
from trtio.edgellm import CONFIG_FILES, EngineDir
from trtio.families.gemma4.gemma4_config import GEMMA4_KEYS
from trtio.testing.toy_engines import default_engines_dir

FIXTURES = Path(__file__).parent / "fixtures"
SHARED = FIXTURES / "edgellm-0.11"
TINY_LLM = SHARED / "qwen3-tiny-llm"
TINY_PAIR = SHARED / "qwen3-tiny-eagle3"
GENERATED = FIXTURES / "edgellm"

# Every generated fixture opens (gemma4-*: tests/test_gemma4.py; qwen3.5-mtp-tiny, qwen3-dflash-tiny:
# tests/test_spec_families.py); a family trtio does not bind is refused when it binds, naming the key.
# Tensor-parallel builds (config_world{N}.json): read per rank, tested in their own section.
TENSOR_PARALLEL = {"qwen3-tp2-tiny", "qwen3-tiny-tp2"}


def _dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and any(p.glob("*config*.json"))) if root.is_dir() else []


SUPPORTED = [p for p in [TINY_LLM, TINY_PAIR, *_dirs(GENERATED)] if p.name not in TENSOR_PARALLEL]


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _tiny() -> dict[str, Any]:
    return _load(TINY_LLM / "config.json")


def _thaw(v: Any) -> Any:
    if hasattr(v, "items"):
        return {k: _thaw(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    return v


def _flat(raw: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in raw.items() if k != "builder_config"}
    out.update({f"builder_config.{k}": v for k, v in raw["builder_config"].items()})
    return out


_SHORT = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp8": "fp8", "int8": "int8"}


def assert_maps_every_field(cfg: LLMEngineConfig, raw: dict[str, Any]) -> None:
    """Each trtio field equals the raw Edge-LLM value it comes from; extras hold every other key."""
    b = raw["builder_config"]
    role = raw["engine_role"]
    used = {"hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "partial_rotary_factor", "rope_theta", "rope_scaling", "num_deepstack_features",
            "kv_cache_dtype", "engine_role", "reduced_vocab_size", "max_position_embeddings",
            "builder_config.max_batch_size",
            "builder_config.max_input_len", "builder_config.max_kv_cache_capacity", "builder_config.max_kv_pool_pages"}
    assert cfg.hidden_size == raw["hidden_size"]
    assert cfg.vocab_size == raw["vocab_size"]
    assert cfg.num_attention_layers == raw.get("num_attention_layers", raw["num_hidden_layers"])
    used.add("num_attention_layers")
    assert cfg.num_attention_heads == raw["num_attention_heads"]
    assert cfg.num_kv_heads == raw["num_key_value_heads"]
    assert cfg.head_dim == raw.get("head_dim", raw["hidden_size"] // raw["num_attention_heads"])
    if cfg.gemma4 is not None:  # the single-table fields describe the sliding layers (the rest: test_gemma4.py)
        sliding = cfg.gemma4.sliding_rope
        assert (cfg.rotary_dim, cfg.rope_theta, cfg.rope_type) == (sliding.width, sliding.theta, "rope")
        used |= {k for k in GEMMA4_KEYS if k in _flat(raw)} | {"layer_types", "kv_layer_configs"}
    else:
        assert cfg.rotary_dim == round(cfg.head_dim * raw.get("partial_rotary_factor", 1.0))
        assert cfg.rope_theta == raw.get("rope_theta", 10000.0)
        scaling = raw.get("rope_scaling")
        assert cfg.rope_scaling == RopeScaling.from_hf(scaling)
        kind = scaling.get("rope_type", scaling.get("type")) if scaling else None
        is_mrope = bool(scaling) and ("mrope_section" in scaling or kind == "mrope")
        assert cfg.rope_type == ("mrope" if is_mrope else "rope")
    assert cfg.rotary_dim % 2 == 0
    assert cfg.num_deepstack_features == raw.get("num_deepstack_features", 0)
    assert cfg.kv_cache_dtype == _SHORT[raw.get("kv_cache_dtype", "fp16")]
    assert cfg.role == role and cfg.is_spec_decode_base == (role == "base")
    assert cfg.max_supported_batch_size == b["max_batch_size"]
    assert cfg.max_supported_input_length == b["max_input_len"]
    assert cfg.max_kv_cache_capacity == b["max_kv_cache_capacity"]
    assert cfg.kv_pool_pages == b["max_kv_pool_pages"] == cfg.min_kv_pool_pages  # batch x ceil(capacity / 128)
    assert cfg.max_position_embeddings == raw.get("max_position_embeddings", 0)
    wanted_vocab = raw.get("reduced_vocab_size") or (raw["draft_vocab_size"] if role == "draft" else raw["vocab_size"])
    assert cfg.output_vocab_size == wanted_vocab
    if role == "draft":
        used |= {"draft_vocab_size", "base_model_hidden_size", "builder_config.max_draft_tree_size"}
        assert cfg.base_model_hidden_size == raw["base_model_hidden_size"]
        assert cfg.max_draft_tree_size == b["max_draft_tree_size"]
    else:
        assert cfg.base_model_hidden_size == 0 and cfg.max_draft_tree_size == 0
    if role == "base":
        used |= {"builder_config.max_verify_tree_size", "eagle_hidden_state_layers"}
        assert cfg.max_verify_tree_size == b["max_verify_tree_size"]
        assert list(cfg.eagle_hidden_state_layers) == raw.get("eagle_hidden_state_layers", [])
    else:
        assert cfg.max_verify_tree_size == 0 and cfg.eagle_hidden_state_layers == ()
    assert (cfg.contract, cfg.kv_page_size, cfg.activation_dtype) == ("ragged", 128, "float16")
    assert b["ragged_backend"] == "entry_padded_compatibility"
    assert cfg.use_rope == raw.get("use_rope", True)
    assert cfg.mtp_tree_base == raw.get("mtp_tree_base", False)
    assert cfg.dflash_tree_base == raw.get("dflash_tree_base", False)
    used |= {"use_rope", "mtp_tree_base", "dflash_tree_base"}
    assert cfg.max_lora_rank == b.get("max_lora_rank", 0)
    used.add("builder_config.max_lora_rank")
    if "layer_types" in raw:  # a hybrid model (or a uniform table of attention layers)
        used |= {"layer_types", "kv_layer_configs", "num_linear_attn_layers"}
        assert list(cfg.layer_types) == raw["layer_types"]
        assert [None if e is None else e.to_dict() for e in cfg.kv_layer_configs] == [
            None if e is None else {k: e[k] for k in ("num_kv_heads", "head_dim")}
            for e in raw.get("kv_layer_configs", [])]
    if cfg.is_hybrid:
        recurrent = ("conv_dim", "conv_kernel", "recurrent_state_num_heads", "recurrent_state_head_dim",
                     "recurrent_state_size")
        used |= {*recurrent, "recurrent_state_num_groups", "recurrent_spec_verify_mode", "recurrent_state_dtype",
                 "conv_state_dtype"}
        assert [getattr(cfg, k) for k in recurrent] == [raw[k] for k in recurrent]
        assert cfg.recurrent_state_num_groups == raw.get("recurrent_state_num_groups", 0)
        assert (cfg.recurrent_state_dtype, cfg.conv_state_dtype) == (_SHORT[raw["recurrent_state_dtype"]],
                                                                     _SHORT[raw["conv_state_dtype"]])
        assert cfg.recurrent_spec_verify_mode == raw["recurrent_spec_verify_mode"]
        kinds = {"snapshot": "gated_deltanet", "replay": "mamba2"}
        assert cfg.recurrent_kind == kinds[raw["recurrent_spec_verify_mode"]]
    rest = {k: v for k, v in _flat(raw).items() if k not in used}
    assert _thaw(cfg.extras) == rest


# -- every fixture ----------------------------------------------------------------------------

@pytest.mark.parametrize("folder", SUPPORTED, ids=lambda p: p.name)
def test_every_fixture_opens_and_maps_every_field(folder: Path) -> None:
    d = EngineDir.open(folder)
    assert d.path == folder
    for role, cfg in d:
        raw = _load(folder / CONFIG_FILES[role])
        assert d.raw(role) == raw
        if role == "base" and raw.get("spec_decode_type") == "dflash":  # the layers its draft's config names
            assert list(cfg.eagle_hidden_state_layers) == d.raw("draft")["dflash_config"]["target_layer_ids"]
            cfg = dataclasses.replace(cfg, eagle_hidden_state_layers=())
        assert_maps_every_field(cfg, raw)
        assert LLMEngineConfig.from_edgellm(folder / CONFIG_FILES[role]) == cfg
        assert LLMEngineConfig.from_edgellm(raw) == cfg
        assert LLMEngineConfig.from_dict(cfg.to_dict()) == cfg, "trtio's own JSON round-trips an Edge-LLM config"
        assert copy.deepcopy(cfg) == cfg and pickle.loads(pickle.dumps(cfg)) == cfg
        assert hash(copy.deepcopy(cfg)) == hash(cfg)


@pytest.mark.parametrize("folder", [p for p in SUPPORTED if (p / "hf_config.json").is_file()], ids=lambda p: p.name)
def test_mapping_agrees_with_the_hugging_face_source(folder: Path) -> None:
    """The generated fixtures lie beside the HF config the package read: trtio's view matches it."""
    hf = _load(folder / "hf_config.json")
    text = hf.get("text_config") or hf
    d = EngineDir.open(folder)
    cfg = d.config if d.kind == "llm" else d.base_config
    assert cfg.hidden_size == text["hidden_size"]
    assert cfg.num_attention_heads == text["num_attention_heads"]
    assert cfg.num_kv_heads == text["num_key_value_heads"]
    assert cfg.vocab_size == text["vocab_size"]
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    assert cfg.is_mrope == ("mrope_section" in rope or rope.get("type") == "mrope")
    theta = rope.get("rope_theta", text.get("rope_theta"))
    if theta is not None:
        assert cfg.rope_theta == theta
    factor = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))
    assert cfg.rotary_dim == round(cfg.head_dim * factor)
    family = d.raw("base").get("spec_decode_type") if d.kind == "spec_decode" else None
    if family == "mtp":  # the MTP head is part of the base's checkpoint: one layer reading the last hidden state
        assert d.draft_config.num_attention_layers == text.get("mtp_num_hidden_layers", 1) == 1
        assert d.draft_config.base_model_hidden_size == cfg.hidden_size and cfg.eagle_hidden_state_layers == ()
    elif family == "dflash":
        draft_hf = _load(folder / "draft_hf_config.json")
        assert d.draft_config.hidden_size == draft_hf["hidden_size"]
        targets = draft_hf["dflash_config"]["target_layer_ids"]
        assert list(cfg.eagle_hidden_state_layers) == targets
        assert d.draft_config.base_model_hidden_size == len(targets) * cfg.hidden_size
    elif d.kind == "spec_decode":
        draft_hf = _load(folder / "draft_hf_config.json")
        assert d.draft_config.hidden_size == draft_hf["hidden_size"]
        assert d.draft_config.output_vocab_size == draft_hf["draft_vocab_size"]
        assert list(cfg.eagle_hidden_state_layers) == draft_hf["target_layer_ids"]
        n_layers, target_hidden = len(draft_hf["target_layer_ids"]), draft_hf["target_hidden_size"]
        assert d.draft_config.base_model_hidden_size == n_layers * target_hidden


def test_shared_fixtures_open() -> None:
    llm = EngineDir.open(TINY_LLM)
    assert llm.kind == "llm" and llm.roles == ("llm",) and not llm.has_engines
    assert llm.engine_path("llm") == TINY_LLM / "llm.engine"
    assert llm.config_path("llm") == TINY_LLM / "config.json"
    assert llm.config.num_attention_layers == 8 and llm.config.kv_pool_pages == 4
    assert llm.config.extras["model"] == "qwen3" and llm.config.extras["builder_config.tp_size"] == 1
    pair = EngineDir.open(TINY_PAIR)
    assert pair.kind == "spec_decode" and pair.roles == ("base", "draft")
    assert pair.engine_path("base") == TINY_PAIR / "spec_base.engine"
    assert pair.engine_path("draft") == TINY_PAIR / "spec_draft.engine"
    assert pair.base_config.eagle_hidden_state_layers == (2, 4, 5)
    assert pair.draft_config.base_model_hidden_size == 3 * pair.base_config.hidden_size
    assert pair.draft_config.output_vocab_size == 256 and pair.draft_config.vocab_size == 512
    assert "spec_decode" in repr(pair) and "configs only" in repr(pair)


def test_deployment_of_the_shared_pair() -> None:
    pair = EngineDir.open(TINY_PAIR)
    dep = pair.deployment(draft_top_k=2, draft_step=4, verify_size=8)
    assert isinstance(dep, DeploymentConfig) and dep.is_spec_decode
    assert dep.base == pair.base_config and dep.draft == pair.draft_config
    spec = dep.spec
    assert spec is not None
    assert (spec.base_output_hidden_dim, spec.draft_hidden_size) == (192, 64)
    assert (spec.max_verify_size, spec.max_draft_proposal_size) == (8, 8)
    assert (spec.drafting_top_k, spec.drafting_step, spec.verify_size) == (2, 4, 8)
    assert dep.max_runtime_batch_size() == 4
    plain = EngineDir.open(TINY_LLM).deployment()
    assert plain.draft is None and plain.base == EngineDir.open(TINY_LLM).config


def test_engine_paths_and_has_engines(tmp_path: Path) -> None:
    d = tmp_path / "pair"
    shutil.copytree(TINY_PAIR, d)
    (d / "spec_base.engine").write_bytes(b"")
    (d / "spec_draft.engine").write_bytes(b"")
    opened = EngineDir.open(d)
    assert opened.has_engines and "engines present" in repr(opened)
    with pytest.raises(ConfigError, match=r"role: expected one of \['base', 'draft'\].*got 'llm'"):
        opened.engine_path("llm")
    with pytest.raises(ConfigError, match="use .base_config / draft_config"):
        opened.config
    with pytest.raises(ConfigError, match="ask for 'base' or 'draft'"):
        opened.raw()


def test_raw_is_a_copy() -> None:
    d = EngineDir.open(TINY_LLM)
    raw = d.raw()
    raw["hidden_size"] = 1
    raw["builder_config"]["max_batch_size"] = 1
    assert d.raw("llm")["hidden_size"] == 64 and d.raw()["builder_config"]["max_batch_size"] == 4


# -- from_edgellm on dicts: defaults and derived fields --------------------------------------

def test_from_edgellm_on_a_dict_and_on_a_path_agree() -> None:
    path = TINY_LLM / "config.json"
    assert LLMEngineConfig.from_edgellm(path) == LLMEngineConfig.from_edgellm(_tiny())
    assert LLMEngineConfig.from_edgellm(str(path)) == LLMEngineConfig.from_edgellm(_tiny())


def test_defaults_where_keys_are_absent() -> None:
    raw = _tiny()
    for key in ("head_dim", "partial_rotary_factor", "rope_theta", "rope_scaling", "num_deepstack_features",
                "kv_cache_dtype"):
        del raw[key]
    del raw["builder_config"]["max_kv_pool_pages"]
    cfg = LLMEngineConfig.from_edgellm(raw)
    assert cfg.head_dim == 64 // 4 and cfg.rotary_dim == 16
    assert (cfg.rope_theta, cfg.rope_scaling, cfg.num_deepstack_features, cfg.kv_cache_dtype) == (
        10000.0, None, 0, "float16")
    assert cfg.kv_pool_pages == 4 and cfg.pages_per_sequence == 1


@pytest.mark.parametrize("factor,rotary", [(1.0, 16), (0.5, 8), (0.25, 4), (0.75, 12)])
def test_partial_rotary_factor_gives_rotary_dim(factor: float, rotary: int) -> None:
    raw = _tiny()
    raw["partial_rotary_factor"] = factor
    assert LLMEngineConfig.from_edgellm(raw).rotary_dim == rotary


@pytest.mark.parametrize("name,trtio_name", sorted(_SHORT.items()))
def test_every_kv_cache_dtype_name(name: str, trtio_name: str) -> None:
    raw = _tiny()
    raw["kv_cache_dtype"] = name
    assert LLMEngineConfig.from_edgellm(raw).kv_cache_dtype == trtio_name


def test_mrope_and_reduced_vocab() -> None:
    raw = _tiny()
    raw["rope_scaling"] = {"mrope_section": [2, 3, 3], "rope_type": "default", "type": "default"}
    assert LLMEngineConfig.from_edgellm(raw).rope_type == "mrope"
    raw["rope_scaling"] = {"type": "mrope", "mrope_section": [2, 3, 3]}
    assert LLMEngineConfig.from_edgellm(raw).rope_type == "mrope"
    raw = _tiny()
    raw["reduced_vocab_size"] = 128
    cfg = LLMEngineConfig.from_edgellm(raw)
    assert (cfg.vocab_size, cfg.output_vocab_size) == (512, 128)


def test_extras_are_read_only() -> None:
    cfg = LLMEngineConfig.from_edgellm(_tiny())
    with pytest.raises(TypeError, match="'FrozenMap' object does not support item assignment"):
        cfg.extras["model"] = "x"  # type: ignore[index]
    assert cfg.extras["eos_token_id"] == (2,)


def test_unsupported_features_is_empty_for_the_tiny_fixtures() -> None:
    for path in (TINY_LLM / "config.json", TINY_PAIR / "base_config.json", TINY_PAIR / "draft_config.json"):
        assert unsupported_features(_load(path)) == []


# -- bad configs: one clear error naming the file and the key ---------------------------------

def _write_config(tmp_path: Path, raw: Any, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(raw) if not isinstance(raw, str) else raw)
    return path


def _edit(edit: Any) -> dict[str, Any]:
    raw = _tiny()
    edit(raw)
    return raw


BAD_CONFIGS = [
    ("missing capacity", lambda r: r["builder_config"].pop("max_kv_cache_capacity"),
     "builder_config.max_kv_cache_capacity", "is required (an int >= 1: KV cache tokens per sequence)"),
    ("missing builder_config", lambda r: r.pop("builder_config"), "builder_config", "is required"),
    ("builder_config not an object", lambda r: r.update(builder_config=[1]), "builder_config",
     "expected an object, got [1] (a list)"),
    ("missing hidden_size", lambda r: r.pop("hidden_size"), "hidden_size", "is required"),
    ("hidden_size a string", lambda r: r.update(hidden_size="64"), "hidden_size",
     "expected an int >= 1, got '64' (a string)"),
    ("batch a float", lambda r: r["builder_config"].update(max_batch_size=4.0), "builder_config.max_batch_size",
     "got 4.0 (a number)"),
    ("layers a bool", lambda r: r.update(num_hidden_layers=True), "num_hidden_layers", "got True (a boolean)"),
    ("unknown role", lambda r: r.update(engine_role="encoder"), "engine_role",
     "expected one of 'llm', 'base', 'draft'"),
    ("missing role", lambda r: r.pop("engine_role"), "engine_role", "is required"),
    ("NaN theta", lambda r: r.update(rope_theta=math.nan), "rope_theta", "is NaN, which JSON does not allow"),
    ("infinite factor", lambda r: r.update(partial_rotary_factor=math.inf), "partial_rotary_factor",
     "is Infinity, which JSON does not allow"),
    ("factor above 1", lambda r: r.update(partial_rotary_factor=1.5), "partial_rotary_factor",
     "expected a number > 0 and <= 1, got 1.5"),
    ("odd rotary dim", lambda r: r.update(partial_rotary_factor=0.3), "partial_rotary_factor",
     "head_dim 16 x partial_rotary_factor 0.3 = 4.8 is not a positive even int"),
    ("negative theta", lambda r: r.update(rope_theta=-1), "rope_theta", "expected a number > 0, got -1"),
    ("rope_scaling a list", lambda r: r.update(rope_scaling=[1]), "rope_scaling",
     "expected null or an object (HF's rope_scaling), got [1] (a list)"),
    ("kv dtype", lambda r: r.update(kv_cache_dtype="nvfp4"), "kv_cache_dtype",
     "expected one of 'fp16', 'bf16', 'fp32', 'fp8', 'int8'"),
    ("prompt longer than cache", lambda r: r["builder_config"].update(max_input_len=200),
     "builder_config.max_input_len", "200 exceeds builder_config.max_kv_cache_capacity (128)"),
    ("other ragged backend", lambda r: r["builder_config"].update(ragged_backend="flat"),
     "builder_config.ragged_backend", "expected one of 'entry_padded_compatibility'"),
    ("no ragged backend", lambda r: r["builder_config"].pop("ragged_backend"), "builder_config.ragged_backend",
     "is required"),
    ("llm with a spec type", lambda r: r.update(spec_decode_type="eagle3"), "spec_decode_type",
     "a non-speculative engine has spec_decode_type 'none'"),
    ("spec flag disagrees", lambda r: r["builder_config"].update(spec_base=True), "builder_config.spec_base",
     "is true but engine_role is 'llm'"),
    ("heads not divisible", lambda r: r.update(num_key_value_heads=3), "num_key_value_heads",
     "3 must divide num_attention_heads (4)"),
    ("head_dim underivable", lambda r: (r.pop("head_dim"), r.update(hidden_size=66)), "head_dim",
     "is absent and hidden_size / num_attention_heads = 66 / 4 is not an int"),
    ("reduced vocab too big", lambda r: r.update(reduced_vocab_size=600), "reduced_vocab_size",
     "600 exceeds vocab_size (512)"),
    ("deepstack beyond layers", lambda r: r.update(num_deepstack_features=9), "num_deepstack_features",
     "9 exceeds num_attention_layers (8)"),
]


@pytest.mark.parametrize("edit,key,needle", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_one_error_naming_file_and_key(tmp_path: Path, edit: Any, key: str, needle: str) -> None:
    path = _write_config(tmp_path, _edit(edit))
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_edgellm(path)
    assert info.value.field == f"{path}: {key}"
    assert needle in str(info.value)


@pytest.mark.parametrize("key,value,needle", [
    ("rope_theta", math.nan, "rope_theta: expected a finite number > 0, got nan (a number)"),
    ("rope_theta", -math.inf, "rope_theta: expected a finite number > 0, got -inf (a number)"),
    ("partial_rotary_factor", math.nan, "partial_rotary_factor: expected a finite number > 0 and <= 1, got nan"),
])
def test_non_finite_numbers_in_a_dict(key: str, value: float, needle: str) -> None:
    with pytest.raises(ConfigError, match="^Edge-LLM config: " + needle.replace("(", r"\(").replace(")", r"\)")):
        LLMEngineConfig.from_edgellm(_edit(lambda r: r.update({key: value})))


def test_a_dict_is_named_by_what(tmp_path: Path) -> None:
    raw = _edit(lambda r: r.pop("vocab_size"))
    with pytest.raises(ConfigError, match=r"^Edge-LLM config: vocab_size: is required"):
        LLMEngineConfig.from_edgellm(raw)
    with pytest.raises(ConfigError, match=r"^mine: vocab_size: is required"):
        LLMEngineConfig.from_edgellm(raw, what="mine")


def test_json_nan_literal_and_broken_files(tmp_path: Path) -> None:
    text = (TINY_LLM / "config.json").read_text().replace('"rope_theta": 1000000.0', '"rope_theta": NaN')
    path = _write_config(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_edgellm(path)
    assert str(info.value).startswith(f"{path}: rope_theta: is NaN, which JSON does not allow")
    _write_config(tmp_path, "{ not json")
    with pytest.raises(ConfigError, match=r"config\.json: is not valid JSON"):
        LLMEngineConfig.from_edgellm(path)
    _write_config(tmp_path, "[1, 2]")
    with pytest.raises(ConfigError, match=r"config\.json: must hold a JSON object \(Edge-LLM's engine config\), got "
                                          r"a list"):
        LLMEngineConfig.from_edgellm(path)


# -- unsupported families: refused at load, naming the marker key -----------------------------

FAMILIES = [
    ("per-layer KV head dims (global)", lambda r: r.update(global_head_dim=32), "global_head_dim",
     "per-layer KV head dims"),
    ("per-layer KV head dims (table)",
     lambda r: r.update(layer_types=["attention"] * 8,
                        kv_layer_configs=[{"num_kv_heads": 2, "head_dim": 16}] * 7
                        + [{"num_kv_heads": 1, "head_dim": 32}]),
     "kv_layer_configs", "layers use KV heads x head_dim 1 x 32"),
    ("KV sharing", lambda r: r.update(kv_sharing_donors=[-1] * 6 + [4, 5]), "kv_sharing_donors",
     "marks KV sharing, which trtio does not support yet (layers [6, 7] read the KV cache of layers [4, 5])"),
    ("sliding-window dual RoPE", lambda r: r.update(sliding_rope_config={"rope_theta": 10000.0},
                                                    full_rope_config={"rope_theta": 1e6}),
     "sliding_rope_config", "sliding-window dual RoPE"),
    ("sliding-window KV pool", lambda r: r["builder_config"].update(num_swa_pages=8), "builder_config.num_swa_pages",
     "a KV pool of 8 pages of their own"),
    ("PLE (enabled)", lambda r: r.update(ple_enabled=True, num_ple_inputs=8, ple_hidden_size=16), "ple_enabled",
     "per-layer embeddings (Gemma PLE)"),
    ("PLE (inputs only)", lambda r: r.update(num_ple_inputs=8), "num_ple_inputs", "per-layer embeddings"),
    ("dllm role", lambda r: r.update(engine_role="dllm"), "engine_role", "diffusion LLM (dllm) engines"),
]


@pytest.mark.parametrize("edit,key,needle", [c[1:] for c in FAMILIES], ids=[c[0] for c in FAMILIES])
def test_unsupported_family_is_refused_naming_its_key(tmp_path: Path, edit: Any, key: str, needle: str) -> None:
    path = _write_config(tmp_path, _edit(edit))
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_edgellm(path)
    assert info.value.field == f"{path}: {key}"
    msg = str(info.value)
    assert needle in msg and "which trtio does not support yet" in msg and "refused rather than bound wrong" in msg


def test_every_unsupported_feature_is_listed_in_one_error() -> None:
    raw = _edit(lambda r: r.update(ple_enabled=True, num_ple_inputs=8, ple_hidden_size=4,
                                   kv_sharing_donors=[-1] * 7 + [0]))
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_edgellm(raw, what="gemma.json")
    assert info.value.field == "gemma.json: kv_sharing_donors"
    assert "; also ple_enabled (per-layer embeddings (Gemma PLE)" in str(info.value)
    assert [k for k, _, _ in unsupported_features(raw)] == ["kv_sharing_donors", "ple_enabled"]


def test_uniform_layer_tables_are_not_a_family() -> None:
    """A kv_layer_configs table whose every entry is the top-level shape binds like the plain model."""
    raw = _edit(lambda r: r.update(layer_types=["attention"] * 8, kv_layer_configs=[{"num_kv_heads": 2,
                                                                                      "head_dim": 16}] * 8,
                                   kv_sharing_donors=[-1] * 8, global_head_dim=16, ple_enabled=False))
    cfg = LLMEngineConfig.from_edgellm(raw)
    assert cfg.layer_types == ("attention",) * 8 and not cfg.is_hybrid


# -- roles and pairs ----------------------------------------------------------------------------

def _pair(tmp_path: Path, edit_base: Any = None, edit_draft: Any = None) -> Path:
    d = tmp_path / "pair"
    shutil.copytree(TINY_PAIR, d)
    for name, edit in (("base_config.json", edit_base), ("draft_config.json", edit_draft)):
        if edit is not None:
            raw = _load(d / name)
            edit(raw)
            (d / name).write_text(json.dumps(raw))
    return d


BAD_PAIRS = [
    ("draft role in base_config.json", lambda r: r.update(engine_role="draft"), None, "base_config.json: engine_role",
     "is 'draft', but base_config.json holds the speculative base's config (expected 'base')"),
    ("base without a tree cap", lambda r: r["builder_config"].pop("max_verify_tree_size"), None,
     "base_config.json: builder_config.max_verify_tree_size", "is required"),
    ("base spec type none", lambda r: r.update(spec_decode_type="none"), None, "base_config.json: spec_decode_type",
     "expected the speculative family of a base engine"),
    ("unread pair type", lambda r: r.update(spec_decode_type="medusa"), None, "base_config.json: spec_decode_type",
     "marks speculative decoding of type 'medusa'"),
    ("draft without base_model_hidden_size", None, lambda r: r.pop("base_model_hidden_size"),
     "draft_config.json: base_model_hidden_size", "is required"),
    ("draft without draft_vocab_size", None, lambda r: r.pop("draft_vocab_size"),
     "draft_config.json: draft_vocab_size", "is required"),
    ("eagle layer out of range", lambda r: r.update(eagle_hidden_state_layers=[2, 4, 8]), None,
     "base_config.json: eagle_hidden_state_layers", "[8] outside [0, num_hidden_layers=8)"),
    ("base_model_hidden_size disagrees", None, lambda r: r.update(base_model_hidden_size=128),
     "draft_config.json: base_model_hidden_size",
     "128 does not match the base: base_config.json feeds the draft the 3 layers of eagle_hidden_state_layers "
     "[2, 4, 5] of hidden_size 64, 3 x 64 = 192"),
    ("batch disagrees", None, lambda r: r["builder_config"].update(max_batch_size=2, max_kv_pool_pages=2),
     "draft_config.json: builder_config.max_batch_size", "2 differs from the base's 4"),
    ("spec types disagree", None, lambda r: r.update(spec_decode_type="mtp"), "draft_config.json: spec_decode_type",
     "is 'mtp', but base_config.json says 'eagle3'"),
    ("draft vocab beyond base", None, lambda r: r.update(draft_vocab_size=1024), "draft_config.json: draft_vocab_size",
     "1024 exceeds the base's vocab_size (512"),
]


@pytest.mark.parametrize("edit_base,edit_draft,key,needle", [c[1:] for c in BAD_PAIRS], ids=[c[0] for c in BAD_PAIRS])
def test_bad_pair_is_one_error_naming_file_and_key(tmp_path: Path, edit_base: Any, edit_draft: Any, key: str,
                                                   needle: str) -> None:
    d = _pair(tmp_path, edit_base, edit_draft)
    with pytest.raises(ConfigError) as info:
        EngineDir.open(d)
    assert info.value.field == f"{d}/{key}"
    assert needle in str(info.value)


def test_config_json_with_another_role(tmp_path: Path) -> None:
    d = tmp_path / "llm"
    d.mkdir()
    _write_config(d, _edit(lambda r: r.update(engine_role="base", spec_decode_type="eagle3")))
    with pytest.raises(ConfigError, match=r"config\.json: engine_role: is 'base', but config\.json holds a plain "
                                          r"LLM's config \(expected 'llm'\); Edge-LLM writes base_config\.json"):
        EngineDir.open(d)


# -- directories ----------------------------------------------------------------------------------

def test_directory_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope: no such engine directory"):
        EngineDir.open(tmp_path / "nope")
    with pytest.raises(ConfigError, match=r"config\.json: is a file, not an engine directory; pass its folder"):
        EngineDir.open(TINY_LLM / "config.json")
    with pytest.raises(ConfigError, match="holds no Edge-LLM engine config: expected config.json"):
        EngineDir.open(tmp_path)


@pytest.mark.parametrize("files,missing,needle", [
    (["base_config.json", "draft_config.json", "spec_base.engine"], "spec_draft.engine",
     "is missing: spec_base.engine is here without it"),
    (["base_config.json", "draft_config.json", "spec_draft.engine"], "spec_base.engine",
     "is missing: spec_draft.engine is here without it"),
    (["base_config.json"], "draft_config.json", "is missing: base_config.json is here without it"),
    (["draft_config.json", "spec_base.engine", "spec_draft.engine"], "base_config.json",
     "is missing: draft_config.json is here without it"),
    (["spec_base.engine", "spec_draft.engine"], "base_config.json", "is missing: the engines need"),
    (["llm.engine"], "config.json", "is missing: llm.engine needs the config.json"),
])
def test_incomplete_directories_name_the_missing_file(tmp_path: Path, files: list[str], missing: str,
                                                      needle: str) -> None:
    for name in files:
        src = TINY_PAIR / name if "config" in name else None
        (tmp_path / name).write_bytes(src.read_bytes() if src is not None else b"")
    with pytest.raises(ConfigError) as info:
        EngineDir.open(tmp_path)
    assert info.value.field == str(tmp_path / missing)
    assert needle in str(info.value)


def test_mixed_and_tensor_parallel_and_dllm_directories(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(TINY_PAIR, mixed)
    shutil.copy(TINY_LLM / "config.json", mixed / "config.json")
    with pytest.raises(ConfigError, match=r"holds both a plain LLM \(config\.json\) and a speculative pair"):
        EngineDir.open(mixed)
    tp = tmp_path / "tp"
    tp.mkdir()
    (tp / "config_world2.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"config_world2\.json: builder_config\.tp_size: is None, but the file name "
                                          r"says 2 ranks"):
        EngineDir.open(tp)
    dllm = tmp_path / "dllm"
    dllm.mkdir()
    (dllm / "dllm.engine").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"dllm\.engine: is a diffusion LLM engine"):
        EngineDir.open(dllm)
    _write_config(dllm, _edit(lambda r: r.update(engine_role="dllm")))
    with pytest.raises(ConfigError, match=r"dllm/config\.json: engine_role: marks diffusion LLM \(dllm\) engines"):
        EngineDir.open(dllm)


def test_non_json_and_non_utf8_configs_in_a_directory(tmp_path: Path) -> None:
    d = _pair(tmp_path)
    (d / "draft_config.json").write_text('{"engine_role": "draft",')
    with pytest.raises(ConfigError, match=r"draft_config\.json: is not valid JSON"):
        EngineDir.open(d)
    (d / "draft_config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match=r"draft_config\.json: is not UTF-8 text \(byte 0xff at offset 0\)"):
        EngineDir.open(d)


# -- deployment(): Edge-LLM's run-time arguments against the configs' caps ------------------------

@pytest.mark.parametrize("kwargs,field,needle", [
    (dict(draft_top_k=2, draft_step=2, verify_size=9), "verify_size",
     "9 exceeds builder_config.max_verify_tree_size (8) of "),
    (dict(draft_top_k=3, draft_step=3, verify_size=8), "draft_top_k",
     "draft_top_k x draft_step = 3 x 3 = 9 exceeds builder_config.max_draft_tree_size (8) of "),
    (dict(draft_top_k=2, draft_step=2), "verify_size", "is required for the speculative pair in"),
    (dict(draft_top_k=0, draft_step=2, verify_size=4), "draft_top_k", "must be a positive int, got 0"),
    (dict(draft_top_k=2, draft_step=2.0, verify_size=4), "draft_step", "must be a positive int, got 2.0"),
])
def test_deployment_arguments_checked_against_the_caps(kwargs: dict[str, Any], field: str, needle: str) -> None:
    pair = EngineDir.open(TINY_PAIR)
    with pytest.raises(ConfigError) as info:
        pair.deployment(**kwargs)
    assert info.value.field == field
    assert needle in str(info.value)
    if field == "verify_size" and "exceeds" in needle:
        assert str(TINY_PAIR / "base_config.json") in str(info.value)
    if "max_draft_tree_size" in needle:
        assert str(TINY_PAIR / "draft_config.json") in str(info.value)


def test_deployment_of_a_plain_llm_takes_no_tree_arguments() -> None:
    with pytest.raises(ConfigError, match="verify_size: is for a speculative pair; .* holds a plain LLM"):
        EngineDir.open(TINY_LLM).deployment(verify_size=4)


def test_a_deployment_round_trips_through_trtio_json(tmp_path: Path) -> None:
    dep = EngineDir.open(TINY_PAIR).deployment(draft_top_k=2, draft_step=3, verify_size=6)
    path = tmp_path / "dep.json"
    dep.to_json(path)
    back = DeploymentConfig.from_json(path)
    assert back == dep
    assert back.base.extras["edgellm_version"] == "0.11.0"
    assert copy.deepcopy(dep) == dep


@pytest.mark.parametrize("scaling,key,needle", [
    ({"rope_type": "yarn", "factor": 4.0}, "rope_scaling.original_max_position_embeddings",
     "is required for rope_type 'yarn'"),
    ({"rope_type": "proportional"}, "rope_scaling.rope_type", "expected one of"),
    ({"rope_type": "default", "mrope_section": [4, 2, 1]}, "rope_scaling.mrope_section",
     "summing to rotary_dim / 2 = 8, got [4, 2, 1]"),
    ({"rope_type": "linear", "factor": 0.5}, "rope_scaling.factor", "expected a number >= 1"),
])
def test_bad_rope_scaling_names_the_file_and_the_key(tmp_path: Path, scaling: dict[str, Any], key: str,
                                                     needle: str) -> None:
    path = _write_config(tmp_path, _edit(lambda r: r.update(rope_scaling=scaling)))
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_edgellm(path)
    assert info.value.field == f"{path}: {key}"
    assert needle in str(info.value) and "trtio's" not in str(info.value)


# -- runtime artifacts: the embedding table and the draft-to-target map ---------------------------


def test_read_safetensors_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    tensors = {"f16": rng.standard_normal((3, 5)).astype(np.float16), "f32": np.arange(4, dtype=np.float32),
               "i32": np.array([[1, -2]], np.int32), "i64": np.array([7], np.int64), "flag": np.array([True, False]),
               "empty": np.zeros((0, 4), np.float16),
               "big": rng.standard_normal((600, 1000)).astype(np.float16),  # >= 1 MiB: a memory map
               "bf16": np.array([0x3F80, 0xC000], np.uint16), "fp8": np.array([0x38, 0xC0], np.uint8)}
    path = write_safetensors(tmp_path / "t.safetensors", tensors, tags={"bf16": "BF16", "fp8": "F8_E4M3"},
                             metadata={"format": "pt"})
    got = read_safetensors(path)
    assert sorted(got) == sorted(tensors)
    for name, want in tensors.items():
        assert got[name].array.shape == want.shape and got[name].array.dtype == want.dtype, name
        np.testing.assert_array_equal(got[name].array, want)
        assert not got[name].array.flags.writeable, f"{name}: views of the file are read-only"
    assert isinstance(got["big"].array, np.memmap)
    assert (got["f16"].dtype, got["bf16"].dtype, got["fp8"].dtype) == ("F16", "BF16", "F8_E4M3")
    assert bf16_to_float32(got["bf16"].array).tolist() == [1.0, -2.0]
    assert e4m3_to_float32(got["fp8"].array).tolist() == [1.0, -2.0]
    assert list(read_safetensors(path, ["i64"])) == ["i64"]


def test_fp8_and_bf16_decoding_is_exact() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    codes = np.arange(256, dtype=np.uint8)
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(e4m3_to_float32(codes), want)  # NaN == NaN for assert_array_equal
    halves = np.array([0, 0x8000, 0x3F80, 0x7F7F, 0x0001, 0x7F80, 0xFF80, 0x4049], np.uint16)
    np.testing.assert_array_equal(bf16_to_float32(halves), halves.view(ml_dtypes.bfloat16).astype(np.float32))


def _header_file(path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> Path:
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return path


@pytest.mark.parametrize("make, needle", [
    (lambda p: p.write_bytes(b"\x01\x02"), r"2 bytes, shorter than its 8-byte header length"),
    (lambda p: _header_file(p, b"{}", length=1 << 40), r"header length 1099511627776 does not fit"),
    (lambda p: _header_file(p, b"not json"), r"its header is not JSON"),
    (lambda p: _header_file(p, b"[1, 2]"), r"its header is not a JSON object"),
    (lambda p: _header_file(p, b'{"x": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}', bytes(8)),
     r"x: dtype 'C64' is not one trtio reads"),
    (lambda p: _header_file(p, b'{"x": {"dtype": "F16", "shape": [3], "data_offsets": [0, 4]}}', bytes(4)),
     r"x: data_offsets \[0, 4\] hold 4 bytes, but F16 \[3\] takes 6"),
    (lambda p: _header_file(p, b'{"x": {"dtype": "F16", "shape": [-1], "data_offsets": [0, 2]}}', bytes(2)),
     r"x: shape must be a list of ints >= 0"),
    (lambda p: _header_file(p, b'{"x": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}}', bytes(3)),
     r"x: its data ends at byte \d+, past the end of the \d+-byte file \(truncated\?\)"),
    (lambda p: _header_file(p, b'{"y": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}}', bytes(2)),
     r"holds no tensor 'x' \(it holds \['y'\]\)"),
    (lambda p: None, r"no such file"),
    # hostile headers: each was a bare TypeError / ValueError / OverflowError / RecursionError
    (lambda p: _header_file(p, b'{"x": {"dtype": ["F16"], "shape": [1], "data_offsets": [0, 2]}}', bytes(2)),
     r"x: dtype \['F16'\] is not one trtio reads"),
    (lambda p: _header_file(p, b'{"x": {"dtype": "F32", "shape": [4294967296, 4294967296], '
                               b'"data_offsets": [0, 0]}}'),  # 2**64 elements: int64 wrapped to 0 bytes
     r"x: data_offsets \[0, 0\] hold 0 bytes, but F32 \[4294967296, 4294967296\] takes 73786976294838206464"),
    (lambda p: _header_file(p, b'{"x": {"dtype": "F32", "shape": [1180591620717411303424], '
                               b'"data_offsets": [0, 8]}}', bytes(8)),
     r"x: data_offsets \[0, 8\] hold 8 bytes, but F32 \[1180591620717411303424\] takes"),
    (lambda p: _header_file(p, b'{"x": {"dtype": "F32", "shape": [' + b", ".join([b"1"] * 65) +
                            b'], "data_offsets": [0, 4]}}', bytes(4)),
     r"x: shape has 65 dimensions; trtio reads at most 64"),
    (lambda p: _header_file(p, b"[" * 100000 + b"]" * 100000), r"its header is not JSON \(nested too deeply\)"),
    (lambda p: _header_file(p, b'{"x": {"dtype": "F16", "shape": [1], "data_offsets": [-2, 0]}}', bytes(2)),
     r"x: data_offsets \[-2, 0\] must be \[begin, end\] with 0 <= begin <= end"),
])
def test_malformed_safetensors_name_the_file(tmp_path: Path, make: Any, needle: str) -> None:
    path = tmp_path / "bad.safetensors"
    make(path)
    with pytest.raises(ConfigError, match=needle) as info:
        read_safetensors(path, ["x"])
    assert str(path) in str(info.value)


def _llm_dir(tmp_path: Path, **files: dict[str, Any]) -> EngineDir:
    d = tmp_path / "llm"
    shutil.copytree(TINY_LLM, d)
    for name, tensors in files.items():
        write_safetensors(d / f"{name}.safetensors", tensors)
    return EngineDir.open(d)


def test_embedding_table_fp16_fp32_and_fp8(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    table = rng.standard_normal((512, 64)).astype(np.float16)
    got = _llm_dir(tmp_path, embedding={"embedding": table}).embedding_table()
    assert got.dtype == np.float16 and not got.flags.writeable
    np.testing.assert_array_equal(got, table)
    got = _llm_dir(tmp_path / "f32", embedding={"embedding": table.astype(np.float32)}).embedding_table()
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, table)

    # FP8 as Edge-LLM's writer stores it: e4m3 codes and one float32 scale per 128 columns of a row.
    d = tmp_path / "fp8"
    shutil.copytree(TINY_LLM, d)
    data = json.loads((d / "config.json").read_text())
    data["hidden_size"] = 256
    (d / "config.json").write_text(json.dumps(data))
    codes = rng.integers(0, 256, (512, 256), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x38  # no NaN codes
    scales = rng.uniform(0.5, 2.0, (512, 2)).astype(np.float32)
    write_safetensors(d / "embedding.safetensors", {"embedding": codes, "embedding_scale": scales},
                      tags={"embedding": "F8_E4M3"})
    got = EngineDir.open(d).embedding_table()
    want = (e4m3_to_float32(codes).reshape(512, 2, 128) * scales[:, :, None]).reshape(512, 256).astype(np.float16)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)


def test_embedding_table_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"embedding.safetensors: no such file \(Edge-LLM's builder writes"):
        _llm_dir(tmp_path / "none").embedding_table()
    d = tmp_path / "external"
    shutil.copytree(TINY_LLM, d)
    data = json.loads((d / "config.json").read_text())
    data["checkpoint_weight_bindings"] = [{"engine_name": "embedding"}]
    (d / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"config.json has checkpoint_weight_bindings: the builder may have left"):
        EngineDir.open(d).embedding_table()
    with pytest.raises(ConfigError, match=r"embedding: expected \[vocab, 64\] \(hidden_size of config.json\), got "
                                          r"F16 \[512, 32\]"):
        _llm_dir(tmp_path / "narrow", embedding={"embedding": np.zeros((512, 32), np.float16)}).embedding_table()
    with pytest.raises(ConfigError, match=r"holds no tensor 'embedding' \(it holds \['weight'\]\)"):
        _llm_dir(tmp_path / "named", embedding={"weight": np.zeros((512, 64), np.float16)}).embedding_table()
    d = _llm_dir(tmp_path / "fp8", embedding={"embedding": np.zeros((512, 64), np.uint8)})
    with pytest.raises(ConfigError, match=r"embedding: expected F16, BF16, F32 or F8_E4M3 elements, got U8"):
        d.embedding_table()


def _pair_dir(tmp_path: Path, d2t: Any = None) -> EngineDir:
    d = tmp_path / "pair"
    shutil.copytree(TINY_PAIR, d)  # base vocab 512, draft_vocab_size 256
    if d2t is not None:
        write_safetensors(d / "d2t.safetensors", {"d2t": d2t})
    return EngineDir.open(d)


def test_draft_to_target_reads_direct_and_offset_tables(tmp_path: Path) -> None:
    ids = np.arange(256)
    assert _pair_dir(tmp_path / "none").draft_to_target().tolist() == ids.tolist(), "no file: the identity"
    direct = (ids * 2 + 1).astype(np.int32)  # odd tokens; as offsets 3i + 1 would pass 511
    got = _pair_dir(tmp_path / "direct", direct).draft_to_target()
    assert got.dtype == np.int64 and got.tolist() == direct.tolist()
    offsets = np.full(256, 100, np.int64) - ids  # every entry is 100 read as an offset; -155.. direct
    assert _pair_dir(tmp_path / "offset", offsets).draft_to_target().tolist() == [100] * 256
    # Valid both ways: the reading that reaches more distinct tokens wins (Edge-LLM's rule).
    both = np.zeros(256, np.int32)  # direct: all token 0; offsets: the identity
    assert _pair_dir(tmp_path / "both", both).draft_to_target().tolist() == ids.tolist()
    same = np.arange(256, dtype=np.int32) // 2  # direct: 128 tokens; offsets i + i // 2: 256 distinct
    assert _pair_dir(tmp_path / "same", same).draft_to_target().tolist() == (ids + ids // 2).tolist()


def test_draft_to_target_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"maps outside the base's vocab_size \(512\) read either way: entry 0 is "
                                          r"600, as an offset 600"):
        _pair_dir(tmp_path / "far", np.full(256, 600, np.int32)).draft_to_target()
    with pytest.raises(ConfigError, match=r"d2t: expected an I32 or I64 tensor of draft_vocab_size = 256 entries "
                                          r"\(draft_config.json\), got I32 \[255\]"):
        _pair_dir(tmp_path / "short", np.zeros(255, np.int32)).draft_to_target()
    with pytest.raises(ConfigError, match=r"got F32 \[256\]"):
        _pair_dir(tmp_path / "float", np.zeros(256, np.float32)).draft_to_target()
    d = _pair_dir(tmp_path / "two")
    write_safetensors(d.path / "d2t.safetensors", {"a": np.zeros(256, np.int32), "b": np.zeros(256, np.int32)})
    with pytest.raises(ConfigError, match=r"expected exactly one tensor \(the map\), it holds \['a', 'b'\]"):
        d.draft_to_target()
    with pytest.raises(ConfigError, match=r"holds a llm engine; only a speculative pair has a draft-to-target map"):
        EngineDir.open(TINY_LLM).draft_to_target()


def test_a_pool_of_fewer_pages_than_every_slots_is_read_as_written() -> None:
    """Pages are handed out on demand: a pool smaller than max_batch_size x pages per sequence is a valid
    directory (Edge-LLM writes that product by default; a smaller pool serves fewer long sequences at once)."""
    raw = _tiny()
    raw["builder_config"]["max_kv_pool_pages"] = 3
    cfg = LLMEngineConfig.from_edgellm(raw)
    assert cfg.kv_pool_pages == 3 < cfg.min_kv_pool_pages == 4


# -- tensor-parallel directories (config_world{N}.json) ----------------------------------------------------

TINY_TP = SHARED / "qwen3-tiny-tp2"
TP_FIXTURES = [TINY_TP, *(p for p in _dirs(GENERATED) if p.name in TENSOR_PARALLEL)]


@pytest.mark.parametrize("folder", TP_FIXTURES, ids=lambda p: p.name)
def test_tensor_parallel_fixtures_open_with_every_rank(folder: Path) -> None:
    file = next(folder.glob("config_world*.json"))
    raw = _load(file)
    world = raw["builder_config"]["tp_size"]
    d = EngineDir.open(folder)
    assert (d.kind, d.roles, d.tp_size, d.is_tensor_parallel) == ("llm", ("llm",), world, True)
    assert d.config_path("llm") == file and d.raw() == raw and not d.has_engines
    whole = {k: v for k, v in raw.items() if k != "rank_configs"}
    whole["builder_config"] = {k: v for k, v in raw["builder_config"].items() if k != "tp_size"}
    assert d.config == LLMEngineConfig.from_edgellm(whole), "the whole model's keys map as a plain LLM's do"
    assert d.config.extras["builder_config.tp_size"] == world and "rank_configs" not in d.config.extras
    for entry in raw["rank_configs"]:
        r = entry["rank"]
        cfg = d.rank_config(r)
        over = entry["config_overrides"]
        assert cfg.num_attention_heads == over["num_attention_heads"] == raw["num_attention_heads"] // world
        assert cfg.num_kv_heads == over["num_key_value_heads"] == raw["num_key_value_heads"] // world
        assert cfg.extras["intermediate_size"] == over["intermediate_size"]
        assert (cfg.extras["tp_rank"], cfg.extras["tp_size"]) == (r, world)
        assert cfg.head_dim == d.config.head_dim == raw["head_dim"], "a rank's heads keep the model's head size"
        for name in ("hidden_size", "vocab_size", "num_attention_layers", "max_kv_cache_capacity", "kv_pool_pages",
                     "max_supported_batch_size", "rotary_dim", "rope_theta", "kv_cache_dtype"):
            assert getattr(cfg, name) == getattr(d.config, name), name
        assert d.engine_path(r) == folder / entry["engine"] == folder / f"llm_world{world}_rank{r}.engine"
    assert d.engine_paths == tuple(d.engine_path(r) for r in range(world))
    assert repr(d).endswith(f"tp_size={world}, configs only)")


def test_a_tensor_parallel_directory_has_engines_when_every_rank_has_one(tmp_path: Path) -> None:
    d = tmp_path / "tp"
    shutil.copytree(TINY_TP, d)
    (d / "llm_world2_rank0.engine").write_bytes(b"ftrt")
    assert not EngineDir.open(d).has_engines
    (d / "llm_world2_rank1.engine").write_bytes(b"ftrt")
    assert EngineDir.open(d).has_engines


def test_ranks_and_roles_of_a_tensor_parallel_directory() -> None:
    d = EngineDir.open(TINY_TP)
    with pytest.raises(ConfigError, match=r"role: .* is a tensor-parallel directory with one engine per rank: ask for "
                                          r"engine_path\(0\) \.\. engine_path\(1\)"):
        d.engine_path("llm")
    for bad in (2, -1, "0", 1.0, True):
        with pytest.raises(ConfigError, match=r"rank: expected a rank in 0\.\.1 .*tp_size 2"):
            d.rank_config(bad)  # type: ignore[arg-type]
    plain = EngineDir.open(TINY_LLM)
    assert (plain.tp_size, plain.is_tensor_parallel, plain.rank_config(0)) == (1, False, plain.config)
    assert plain.engine_path(0) == plain.engine_path("llm")
    with pytest.raises(ConfigError, match=r"holds a speculative pair: ask for the 'base' or 'draft' role"):
        EngineDir.open(TINY_PAIR).rank_config(0)


def test_a_tensor_parallel_config_read_alone_is_refused_naming_its_key() -> None:
    raw = _load(TINY_TP / "config_world2.json")
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_edgellm(raw)
    assert info.value.field == "Edge-LLM config: builder_config.tp_size"
    assert "marks a tensor-parallel build (tp_size 2" in str(info.value)
    assert "EngineDir.open(dir).rank_config(r)" in str(info.value)
    raw["builder_config"]["tp_size"] = 1
    with pytest.raises(ConfigError, match=r"Edge-LLM config: rank_configs: marks a tensor-parallel build"):
        LLMEngineConfig.from_edgellm(raw)
    assert unsupported_features(raw) == [], "tensor parallelism is read, not refused as an unsupported family"


def _tp_dir(tmp_path: Path, edit: Any, name: str = "config_world2.json") -> Path:
    d = tmp_path / "tp"
    d.mkdir(exist_ok=True)
    raw = _load(TINY_TP / "config_world2.json")
    edit(raw)
    (d / name).write_text(json.dumps(raw))
    return d


def _override(rank: int, **over: Any) -> Any:
    return lambda r: r["rank_configs"][rank]["config_overrides"].update(over)


BAD_TP = [
    ("rank count", lambda r: r["rank_configs"].pop(), "rank_configs",
     "has 1 entries, but tp_size is 2 (Edge-LLM's runtime: rank_configs length must match tpSize)"),
    ("no rank_configs", lambda r: r.pop("rank_configs"), "rank_configs", "is absent; a tensor-parallel config lists"),
    ("rank twice", lambda r: r["rank_configs"][1].update(rank=0), "rank_configs[1].rank",
     "rank 0 is listed twice (also rank_configs[0])"),
    ("rank out of range", lambda r: r["rank_configs"][1].update(rank=2), "rank_configs[1].rank",
     "expected a rank in 0..1, got 2"),
    ("entry not an object", lambda r: r["rank_configs"].__setitem__(1, "rank1"), "rank_configs[1]",
     "expected an object, got str"),
    ("engine path", lambda r: r["rank_configs"][1].update(engine="../x.engine"), "rank_configs[1].engine",
     "expected the rank's engine file name (beside the config), got '../x.engine'"),
    ("engine shared", lambda r: r["rank_configs"][1].update(engine="llm_world2_rank0.engine"),
     "rank_configs[1].engine", "'llm_world2_rank0.engine' is also rank 0's engine"),
    ("unknown key", _override(1, num_experts=2), "rank_configs[1].config_overrides.num_experts",
     "overrides a key config_world2.json does not have"),
    ("unsharded key", _override(0, vocab_size=512), "rank_configs[0].config_overrides.vocab_size",
     "is not a dimension Edge-LLM shards across ranks"),
    ("overrides not an object", lambda r: r["rank_configs"][0].update(config_overrides=[1]),
     "rank_configs[0].config_overrides", "expected an object, got list"),
    ("uneven heads", _override(1, num_attention_heads=1), "rank_configs[1].config_overrides.num_attention_heads",
     "rank 1 has 1 attention heads; 2 ranks split the model's 4 evenly (2 each)"),
    ("uneven kv heads", _override(1, num_attention_heads=2, num_key_value_heads=2),
     "rank_configs[1].config_overrides.num_key_value_heads", "rank 1 has 2 KV heads; 2 ranks split the model's 2: "
                                                            "1 each"),
    ("uneven mlp", _override(0, intermediate_size=300), "rank_configs[0].config_overrides.intermediate_size",
     "rank 0 has intermediate_size 300; 2 ranks split the model's 512 evenly (256 each)"),
    ("bad override value", _override(1, num_key_value_heads=0), "(rank 1): num_key_value_heads",
     "expected an int >= 1"),
    ("world size", lambda r: r["builder_config"].update(tp_size=4), "builder_config.tp_size",
     "is 4, but the file name says 2 ranks (config_world2.json)"),
    ("speculative role", lambda r: r.update(engine_role="base"), "engine_role",
     "is 'base': tensor-parallel speculative decoding is not supported"),
    ("speculative type", lambda r: r.update(spec_decode_type="eagle3"), "spec_decode_type",
     "is 'eagle3': tensor-parallel speculative decoding is not supported"),
    # hostile values: a string width passed unchecked, a huge int crashed the message, a NUL in a file name
    ("mlp as a string", _override(0, intermediate_size="256"), "rank_configs[0].config_overrides.intermediate_size",
     "rank 0 has intermediate_size '256'; 2 ranks split the model's 512 evenly (256 each)"),
    ("huge heads", lambda r: r.update(num_attention_heads=10 ** 400), ": num_attention_heads",
     "must be at most 2**31 - 1 (trtio's step inputs are 32-bit ints), got an int of 1332 bits"),
    ("engine name with NUL", lambda r: r["rank_configs"][0].update(engine="rank\x000.engine"),
     "rank_configs[0].engine", "expected the rank's engine file name (beside the config)"),
]


@pytest.mark.parametrize("edit,key,needle", [c[1:] for c in BAD_TP], ids=[c[0] for c in BAD_TP])
def test_bad_tensor_parallel_configs_are_refused_naming_the_file_and_key(tmp_path: Path, edit: Any, key: str,
                                                                         needle: str) -> None:
    d = _tp_dir(tmp_path, edit)
    with pytest.raises(ConfigError) as info:
        EngineDir.open(d)
    file = str(d / "config_world2.json")
    assert info.value.field.startswith(file) and info.value.field.endswith(key), info.value.field
    assert needle in str(info.value)


def test_kv_heads_fewer_than_ranks_are_replicated_one_per_rank() -> None:
    d = EngineDir.open(default_engines_dir() / "toy-llm-tp4")
    assert d.config.num_kv_heads == 2 and [d.rank_config(r).num_kv_heads for r in range(4)] == [1] * 4


def test_tensor_parallel_directory_layout_errors(tmp_path: Path) -> None:
    d = _tp_dir(tmp_path, lambda r: None)
    shutil.copy(d / "config_world2.json", d / "config_world4.json")
    with pytest.raises(ConfigError, match=r"holds config_world2\.json, config_world4\.json: one tensor-parallel "
                                          r"build per directory"):
        EngineDir.open(d)
    (d / "config_world4.json").unlink()
    shutil.copy(TINY_LLM / "config.json", d / "config.json")
    with pytest.raises(ConfigError, match=r"holds both a tensor-parallel build \(config_world2\.json\) and "
                                          r"config\.json; an engine directory holds one deployment"):
        EngineDir.open(d)
    (d / "config.json").unlink()
    (d / "config_world2.json").rename(d / "config_world0.json")
    with pytest.raises(ConfigError, match=r"names 0 ranks"):
        EngineDir.open(d)


# -- a tensor-parallel directory's roles and checkpoint, misused -------------------------------------------------


@pytest.mark.parametrize("role", [["llm"], {"llm": 1}, None])
def test_a_role_that_is_no_name_is_a_config_error(role: Any) -> None:
    """An unhashable role was a bare TypeError (unhashable type)."""
    d = EngineDir.open(TINY_TP)
    for call in (d.config_path, d.raw, d.checkpoint_bindings, lambda r: d.checkpoint_weights(role=r)):
        if role is None and call == d.raw:
            continue  # raw(None) is the plain LLM's config
        with pytest.raises(ConfigError, match=r"role: expected one of \['llm'\]"):
            call(role)


def _checkpoint_dir(tmp_path: Path, tensors: dict[str, Any], bindings: list[dict[str, Any]],
                    index: Any = None) -> EngineDir:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    write_safetensors(ckpt / "model.safetensors", tensors)
    if index is not None:
        (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    return EngineDir.open(_tp_dir(tmp_path, lambda r: r.update(checkpoint_weight_bindings=bindings,
                                                                checkpoint_dir=str(ckpt))))


def _weight(**over: Any) -> dict[str, Any]:
    return {"engine_name": "w", "checkpoint_keys": ["w"], "source_layout": "fp16", "dtype": "F32", "shape": [4, 4],
            "tp_shard": {"axis": 1, "size": 2}, **over}


def test_a_checkpoint_tensor_of_fewer_dims_than_its_binding_is_a_config_error(tmp_path: Path) -> None:
    """Split along axis 1 of a 1-D tensor was an IndexError."""
    d = _checkpoint_dir(tmp_path, {"w": np.ones(8, np.float32)}, [_weight()])
    with pytest.raises(ConfigError, match=r"checkpoint_weight_bindings: w: w is \[8\] \(1 dims\), the engine input "
                                          r"\[4, 4\] \(2 dims\)"):
        d.checkpoint_weights()


def test_a_binding_dtype_that_is_no_name_is_a_config_error(tmp_path: Path) -> None:
    d = _checkpoint_dir(tmp_path, {"w": np.ones((4, 8), np.float32)}, [_weight(dtype=["F32"])])
    with pytest.raises(ConfigError, match=r"checkpoint_weight_bindings\[0\]\.dtype: w: expected one of"):
        d.checkpoint_weights()


@pytest.mark.parametrize("file", [None, 5, "../../etc/passwd", ""])
def test_a_safetensors_index_entry_must_name_a_file_beside_it(tmp_path: Path, file: Any) -> None:
    """A null or numeric entry read a file named 'None' or '5'; a path left the checkpoint directory."""
    d = _checkpoint_dir(tmp_path, {"w": np.ones((4, 8), np.float32)}, [_weight()],
                        index={"weight_map": {"w": file}})
    with pytest.raises(ConfigError, match=r"model\.safetensors\.index\.json: weight_map\.w: expected the name of a "
                                          r"safetensors file beside the index"):
        d.checkpoint_weights()


@pytest.mark.parametrize("given", [5, 1.5, ["ckpt"]])
def test_a_checkpoint_dir_that_is_no_path_is_a_config_error(tmp_path: Path, given: Any) -> None:
    d = _checkpoint_dir(tmp_path, {"w": np.ones((4, 8), np.float32)}, [_weight()])
    assert [w["w"].shape for w in d.checkpoint_weights()] == [(4, 4), (4, 4)]
    with pytest.raises(ConfigError, match=r"checkpoint_dir: expected the path of the model's safetensors checkpoint"):
        d.checkpoint_weights(given)


@pytest.mark.parametrize("backend", [5, object(), 1.5])
def test_create_from_a_tensor_parallel_directory_names_a_backend_that_is_none(backend: Any) -> None:
    """A backend that was neither a name nor a Backend was an AttributeError ('int' object has no attribute
    'name')."""
    import trtio

    with pytest.raises(ConfigError, match=r"backend: a tensor-parallel directory runs on 'cuda'"):
        trtio.create_from_engine_dir(default_engines_dir() / "toy-llm-tp2", backend=backend)
    with pytest.raises(ConfigError, match=r"checkpoint_dir: expected the path of the model's safetensors checkpoint"):
        trtio.create_from_engine_dir(default_engines_dir() / "toy-llm-tp2", backend="host", checkpoint_dir=7)
