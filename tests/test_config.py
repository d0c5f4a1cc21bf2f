import dataclasses
import json
from pathlib import Path

import pytest
from _configs import bundle, llm_config

from trtio import ConfigError, ShapeError
from trtio._config import DeploymentConfig, LLMEngineConfig, SpecDecodeConfig
from trtio._dims import InferenceDims
from trtio._rope import RopeScaling


def test_defaults_and_normalisation():
    cfg = llm_config(rotary_dim=0, activation_dtype="HALF", kv_cache_dtype="fp8")
    assert cfg.output_vocab_size == cfg.vocab_size == 512
    assert cfg.rotary_dim == cfg.head_dim == 16
    assert cfg.activation_dtype == "float16"
    assert cfg.kv_cache_dtype == "fp8"
    assert cfg.role == "llm"
    assert (cfg.contract, cfg.kv_page_size, cfg.kv_pool_pages, cfg.rope_scaling) == (None, 128, 4, None)
    assert cfg.max_position_embeddings == 0
    assert cfg.eagle_hidden_state_layers == () and dict(cfg.extras) == {}


def test_rotary_dim_and_output_vocab_are_ints_from_construction():
    """The "derive me" value never escapes: the field reads as the int the engine uses."""
    cfg = LLMEngineConfig(hidden_size=64, vocab_size=300, max_supported_batch_size=1, max_supported_input_length=8,
                          max_kv_cache_capacity=8, num_attention_layers=1, num_attention_heads=4, num_kv_heads=4,
                          head_dim=16)
    assert type(cfg.rotary_dim) is int and cfg.rotary_dim == 16
    assert type(cfg.output_vocab_size) is int and cfg.output_vocab_size == 300
    data = cfg.to_dict()
    assert (data["rotary_dim"], data["output_vocab_size"]) == (16, 300)
    data.update(rotary_dim=None, output_vocab_size=None)  # hand-written JSON may leave them null
    back = LLMEngineConfig.from_dict(data)
    assert (back.rotary_dim, back.output_vocab_size) == (16, 300)


def test_frozen():
    cfg = llm_config()
    with pytest.raises(AttributeError, match="cannot assign to field 'hidden_size'"):
        cfg.hidden_size = 3


@pytest.mark.parametrize("field,value,needle", [
    ("hidden_size", 0, "positive int"),
    ("hidden_size", 64.0, "positive int"),
    ("vocab_size", -1, "positive int"),
    ("max_supported_batch_size", True, "positive int"),
    ("num_kv_heads", 3, "must divide num_attention_heads"),
    ("rotary_dim", 15, "even"),
    ("rotary_dim", 32, "<= head_dim"),
    ("activation_dtype", "int8", "activation_dtype"),
    ("kv_cache_dtype", "float64", "kv_cache_dtype"),
    ("rope_type", "yarn", "rope_type"),
    ("rope_theta", 0, "positive number"),
    ("rope_theta", float("nan"), "finite"),
    ("rope_theta", float("inf"), "finite"),
    ("rope_theta", "1e4", "finite positive number"),
    ("contract", "paged", "one of ['batch', 'ragged']"),
    ("kv_page_size", 0, "positive int"),
    ("kv_pool_pages", -1, "non-negative"),
    ("rope_scaling", [1, 2], "JSON object"),
    ("eagle_hidden_state_layers", "2,4", "list of layer indices"),
    ("max_kv_cache_capacity", 32, "cannot hold max_supported_input_length"),
    ("num_deepstack_features", 3, "exceeds num_attention_layers"),
    ("num_deepstack_features", -1, "non-negative"),
    ("is_spec_decode_base", 1, "true or false"),
])
def test_bad_fields_are_named(field, value, needle):
    with pytest.raises(ConfigError) as info:
        llm_config(**{field: value})
    assert info.value.field == field
    assert needle in str(info.value)
    assert str(value) in str(info.value) or field in ("num_kv_heads", "rope_scaling")


def test_role_checks():
    with pytest.raises(ConfigError, match="max_verify_tree_size: a spec-decode base needs a positive value"):
        llm_config(is_spec_decode_base=True)
    with pytest.raises(ConfigError, match="max_draft_tree_size"):
        llm_config(base_model_hidden_size=64)
    with pytest.raises(ConfigError, match="cannot also be a draft"):
        llm_config(is_spec_decode_base=True, max_verify_tree_size=4, base_model_hidden_size=64, max_draft_tree_size=4)


def test_json_round_trip(tmp_path):
    cfg = llm_config(activation_dtype="bfloat16", num_deepstack_features=1, rope_type="mrope")
    path = tmp_path / "c.json"
    cfg.to_json(path)
    assert LLMEngineConfig.from_json(path) == cfg
    data = json.loads(path.read_text())
    data["hiden_size"] = 3
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="hiden_size: is not a LLMEngineConfig field"):
        LLMEngineConfig.from_json(path)
    del data["hiden_size"], data["hidden_size"]
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="hidden_size: is required"):
        LLMEngineConfig.from_json(path)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        LLMEngineConfig.from_json(path)
    with pytest.raises(ConfigError, match="no such config file"):
        LLMEngineConfig.from_json(tmp_path / "missing.json")


def test_recipes_follow_edge_llm_table():
    cfg = llm_config(is_spec_decode_base=True, max_verify_tree_size=40, max_draft_tree_size=40)
    C = cfg.max_kv_cache_capacity
    # the last three: query_offsets_len (S+1), execution_phase_len, context_seq_len (the ragged contract's)
    assert cfg.prefill_dims(3, 17) == InferenceDims(3, 17, C, 1, 1, 1, 1, 0, 0, 0, 0, 4, 1, 3)
    restored = cfg.prefill_dims(3, 17, kv_cache_empty=False)
    assert (restored.start_index_len, restored.execution_phase_len, restored.context_seq_len) == (3, 2, 3)
    assert cfg.decode_dims(2) == InferenceDims(2, 1, C, 1, 1, 1, 1, 0, 2, 0, 0, 3, 3, 0)
    assert cfg.spec_verify_dims(2, 33) == InferenceDims(2, 33, C, 33, 33, 1, 2, 0, 2, 1, 0, 3, 5, 0)
    assert cfg.reset_dims() == InferenceDims(1, 1, C, 1, 1, 1, 1, 0, 1, 0, 0, 2, 1, 1)
    mrope = llm_config(rope_type="mrope", is_spec_decode_base=True, max_verify_tree_size=8)
    assert mrope.decode_dims(3).rope_batch == 3
    assert mrope.reset_dims().rope_batch == 1, "reset dims use rope batch 1 even for MRoPE"


def test_draft_recipes():
    draft = llm_config(base_model_hidden_size=64, max_draft_tree_size=12)
    d = draft.proposal_dims(2, 6, 3)
    assert (d.seq_len, d.select_len, d.attn_mask_seq_len, d.packed_mask_len) == (6, 3, 6, 1)
    a = draft.accept_dims(2, 4)
    assert (a.seq_len, a.select_len, a.attn_mask_seq_len) == (4, 1, 4)
    assert (d.execution_phase_len, a.execution_phase_len, d.context_seq_len) == (4, 4, 0)
    assert draft.accept_dims(2, 1).execution_phase_len == 3, "a one-row draft step is a decode (phase 3)"


@pytest.mark.parametrize("call,needle", [
    (lambda c: c.prefill_dims(0, 4), "batch must be an int in 1..4"),
    (lambda c: c.prefill_dims(5, 4), "batch must be an int in 1..4"),
    (lambda c: c.prefill_dims(2, 65), "seq_len must be an int in 1..64"),
    (lambda c: c.prefill_dims(2, 0), "seq_len"),
    (lambda c: c.spec_verify_dims(2, 9), "verify_size must be an int in 1..8"),
    (lambda c: c.proposal_dims(2, 4, 5), "top_k must be an int in 1..4"),
])
def test_recipe_arguments_checked(call, needle):
    cfg = llm_config(is_spec_decode_base=True, max_verify_tree_size=8, max_draft_tree_size=8)
    with pytest.raises(ShapeError, match=needle):
        call(cfg)


def test_inference_dims_validation():
    with pytest.raises(ShapeError, match="seq_len must not be negative"):
        InferenceDims(1, -1, 1, 1, 1, 1, 1, 0, 0, 0, 0)
    with pytest.raises(ShapeError, match="batch must be an int"):
        InferenceDims(1.0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0)
    d = InferenceDims(1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0)
    d.check(["start_index_len", "spec_verify_phase_len"])  # shape carriers may be 0
    with pytest.raises(ShapeError, match="seq_len is 0 but a binding uses it"):
        d.check(["seq_len"])
    assert d.replace(seq_len=5).seq_len == 5


def test_spec_config_checks():
    with pytest.raises(ConfigError, match="verify_size: 9 exceeds max_verify_size"):
        SpecDecodeConfig(64, 64, 8, 8, verify_size=9).validate()
    with pytest.raises(ConfigError,
                       match=r"drafting_step \* drafting_top_k = 3 \* 3 exceeds max_draft_proposal_size \(8\)"):
        SpecDecodeConfig(64, 64, 8, 8, drafting_top_k=3, drafting_step=3).validate()


def test_deployment_bundle_checks_and_sizes():
    b = bundle(verify_size=6, max_proposal=8, base_batch=4, draft_batch=3)
    assert b.max_runtime_batch_size() == 3
    assert b.effective_max_draft_proposal_size() == 8
    assert bundle(verify_size=8, max_proposal=6, step=3, top_k=2).effective_max_draft_proposal_size() == 8
    with pytest.raises(ConfigError, match="spec.verify_size"):
        bundle(verify_size=8, max_verify=8).replace if False else DeploymentConfig(
            llm_config(is_spec_decode_base=True, max_verify_tree_size=4), b.draft,
            SpecDecodeConfig(64, 64, 8, 8, verify_size=6)).validate()
    with pytest.raises(ConfigError, match="draft.base_model_hidden_size"):
        DeploymentConfig(b.base, llm_config(base_model_hidden_size=32, max_draft_tree_size=8), b.spec).validate()
    with pytest.raises(ConfigError, match="base.is_spec_decode_base"):
        DeploymentConfig(llm_config(), b.draft, b.spec).validate()
    with pytest.raises(ConfigError, match="needs both a draft and a spec"):
        DeploymentConfig(b.base, b.draft, None).validate()
    with pytest.raises(ConfigError, match="draft.activation_dtype"):
        DeploymentConfig(b.base, llm_config(base_model_hidden_size=64, max_draft_tree_size=8,
                                            activation_dtype="bfloat16"), b.spec).validate()


def test_a_base_and_draft_of_two_contracts_is_a_config_error():
    b = bundle()
    draft = llm_config(base_model_hidden_size=64, max_draft_tree_size=8, contract="ragged")
    with pytest.raises(ConfigError, match=r"draft.contract: 'ragged' differs from base.contract \('batch'\)"):
        DeploymentConfig(llm_config(is_spec_decode_base=True, max_verify_tree_size=8, contract="batch"), draft,
                         b.spec).validate()
    # A contract left to the engine (None) is decided when the engines are bound, not here.
    DeploymentConfig(llm_config(is_spec_decode_base=True, max_verify_tree_size=8), draft, b.spec).validate()


def test_deployment_json_round_trip(tmp_path):
    b = bundle()
    p = tmp_path / "d.json"
    b.to_json(p)
    assert DeploymentConfig.from_json(p) == b
    data = json.loads(p.read_text())
    data["seed"] = 3
    p.write_text(json.dumps(data))
    assert DeploymentConfig.from_json(p).extra == {"seed": 3}
    data["spek"] = {}
    p.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="spek: is not a DeploymentConfig key"):
        DeploymentConfig.from_json(p)
    data.pop("spek")
    data["spec"]["verify_size"] = 99
    p.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="verify_size"):
        DeploymentConfig.from_json(p)


def test_kv_pool_pages_derived_or_checked():
    cfg = llm_config(max_supported_batch_size=3, max_kv_cache_capacity=300)  # ceil(300 / 128) = 3 pages each
    assert (cfg.pages_per_sequence, cfg.min_kv_pool_pages, cfg.kv_pool_pages) == (3, 9, 9)
    assert type(cfg.kv_pool_pages) is int and cfg.to_dict()["kv_pool_pages"] == 9
    assert llm_config(max_supported_batch_size=3, max_kv_cache_capacity=300, kv_pool_pages=12).kv_pool_pages == 12
    assert llm_config(kv_page_size=64).pages_per_sequence == 2
    # Fewer pages than every slot's: sequences take pages on demand (the ragged contract), so it is accepted.
    assert llm_config(max_supported_batch_size=3, max_kv_cache_capacity=300, kv_pool_pages=2).kv_pool_pages == 2


def test_rope_scaling_is_read_only_hashable_and_round_trips(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    cfg = llm_config(rope_scaling=dict(scaling), eagle_hidden_state_layers=[0, 1], is_spec_decode_base=True,
                     max_verify_tree_size=4, extras={"model": "llama", "eos_token_id": [1, 2]})
    assert isinstance(cfg.rope_scaling, RopeScaling) and cfg.rope_scaling.to_dict() == scaling
    with pytest.raises(AttributeError, match="cannot assign to field 'factor'"):
        cfg.rope_scaling.factor = 2.0  # type: ignore[misc]
    assert cfg.eagle_hidden_state_layers == (0, 1)
    assert cfg.extras["eos_token_id"] == (1, 2)
    with pytest.raises(TypeError, match="'FrozenMap' object does not support item assignment"):
        cfg.extras["model"] = "x"  # type: ignore[index]
    hash(cfg)  # usable as a cache key
    path = tmp_path / "c.json"
    cfg.to_json(path)
    data = json.loads(path.read_text())
    assert data["rope_scaling"] == scaling and data["eagle_hidden_state_layers"] == [0, 1]
    assert data["extras"] == {"model": "llama", "eos_token_id": [1, 2]}
    back = LLMEngineConfig.from_json(path)
    assert back == cfg and dict(back.extras) == dict(cfg.extras)
    assert llm_config(rope_scaling={}).rope_scaling is None


def test_extras_do_not_take_part_in_equality():
    assert llm_config(extras={"model": "a"}) == llm_config(extras={"model": "b"})
    assert hash(llm_config(extras={"model": "a"})) == hash(llm_config())


def test_eagle_hidden_state_layers_checked():
    with pytest.raises(ConfigError, match=r"eagle_hidden_state_layers: .*\[0, 2\) \(the decoder layers\), got 2"):
        llm_config(is_spec_decode_base=True, max_verify_tree_size=4, eagle_hidden_state_layers=(0, 2))
    with pytest.raises(ConfigError, match="only a spec-decode base feeds hidden states"):
        llm_config(eagle_hidden_state_layers=(0,))
    with pytest.raises(ConfigError, match="names a layer twice"):
        llm_config(is_spec_decode_base=True, max_verify_tree_size=4, eagle_hidden_state_layers=(1, 1))


def test_nan_literal_in_a_json_file_is_refused_naming_the_key(tmp_path):
    cfg = llm_config()
    path = tmp_path / "c.json"
    cfg.to_json(path)
    text = path.read_text().replace('"rope_theta": 10000.0', '"rope_theta": NaN')
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_json(path)
    assert info.value.field == f"{path}: rope_theta"
    assert "is NaN, which JSON does not allow" in str(info.value)
    b = bundle()
    dep = tmp_path / "d.json"
    b.to_json(dep)
    dep.write_text(dep.read_text().replace('"verify_size": 6', '"verify_size": -Infinity'))
    with pytest.raises(ConfigError, match=r"d\.json: spec\.verify_size: is -Infinity"):
        DeploymentConfig.from_json(dep)


def test_validation_errors_from_a_file_name_the_file(tmp_path):
    path = tmp_path / "c.json"
    data = llm_config().to_dict()
    data["hidden_size"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_json(path)
    assert info.value.field == f"{path}: hidden_size"
    assert str(info.value) == f"{path}: hidden_size: must be a positive int, got 0"
    dep = tmp_path / "d.json"
    bundle().to_json(dep)
    data = json.loads(dep.read_text())
    data["draft"]["rope_theta"] = 0
    dep.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"d\.json: draft\.rope_theta: must be a finite positive number, got 0"):
        DeploymentConfig.from_json(dep)


def test_deployment_from_json_bad_files_name_the_path(tmp_path):
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_json(tmp_path)
    assert info.value.field == str(tmp_path) and "is a directory, not a config file" in str(info.value)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"Edge-LLM engine directory: open it with trtio\.edgellm\.EngineDir"):
        DeploymentConfig.from_json(tmp_path)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_json(latin)
    assert info.value.field == str(latin) and "is not UTF-8 text (byte 0xe9 at offset 13)" in str(info.value)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError) as info:
        DeploymentConfig.from_json(listed)
    assert str(info.value) == f'{listed}: must hold a JSON object with a "base" section, got a list'
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(ConfigError, match=r"empty\.json: base: is required"):
        DeploymentConfig.from_json(empty)
    with pytest.raises(ConfigError, match=r"must be a JSON object, got a number"):
        LLMEngineConfig.from_json(_write(tmp_path / "n.json", "3"))


def _write(path, text):
    path.write_text(text)
    return path


def test_configs_with_json_fields_copy_and_pickle():
    import copy
    import pickle

    from trtio._config import freeze_json

    cfg = llm_config(rope_scaling={"rope_type": "linear", "factor": 2.0}, extras={"eos_token_id": [1, 2]})
    for clone in (copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg))):
        assert clone == cfg and dict(clone.extras) == dict(cfg.extras)
        assert isinstance(clone.rope_scaling, RopeScaling)
    frozen = freeze_json({"a": [1, {"b": 2}]})
    assert frozen == {"a": (1, {"b": 2})} and hash(frozen) == hash(freeze_json({"a": [1, {"b": 2}]}))
    with pytest.raises(AttributeError, match="read-only"):
        frozen._items = {}


@pytest.mark.parametrize("scaling,field,needle", [
    ({"rope_type": "llama3", "factor": 8.0}, "rope_scaling.original_max_position_embeddings",
     "is required for rope_type 'llama3'"),
    ({"rope_type": "linear", "factor": float("nan")}, "rope_scaling.factor", "finite"),
    ({"rope_type": "bogus"}, "rope_scaling.rope_type", "expected one of"),
    ({"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings", "is required for rope_type 'dynamic'"),
    ({"rope_type": "default", "mrope_section": [2, 3, 4]}, "rope_scaling.mrope_section",
     "summing to rotary_dim / 2 = 8"),
])
def test_rope_scaling_is_validated_against_the_model(scaling, field, needle):
    with pytest.raises(ConfigError) as info:
        llm_config(rope_scaling=scaling, rope_type="mrope" if "mrope_section" in scaling else "rope")
    assert info.value.field == field and needle in str(info.value)


def test_mrope_scaling_needs_rope_type_mrope():
    with pytest.raises(ConfigError, match="rope_type: is 'rope', but rope_scaling is MRoPE's"):
        llm_config(rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]})
    assert llm_config(rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]}, rope_type="mrope").is_mrope
    assert llm_config(rope_scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=4096)


def test_dynamic_rope_is_refused_where_the_kv_capacity_passes_max_position_embeddings(tmp_path):
    """NTK ``dynamic`` scaling rescales the base only past max_position_embeddings, by the sequence's length (HF), and
    Edge-LLM's runtime refuses a table longer than that: a KV capacity above it is refused naming the keys, one
    within it binds (the plain table, as HF's for such lengths), and HunYuan's static ``alpha`` is not dynamic."""
    dynamic = {"type": "dynamic", "factor": 2.0}
    with pytest.raises(ConfigError) as info:
        llm_config(rope_scaling=dynamic, max_position_embeddings=64, max_kv_cache_capacity=128)
    assert info.value.field == "max_kv_cache_capacity"
    for needle in ("128 is above max_position_embeddings (64)", "rope_scaling.type 'dynamic'",
                   "expected max_kv_cache_capacity <= 64"):
        assert needle in str(info.value)
    assert llm_config(rope_scaling=dynamic, max_position_embeddings=128, max_kv_cache_capacity=128)
    assert llm_config(rope_scaling={**dynamic, "alpha": 1000.0}, max_position_embeddings=64, max_kv_cache_capacity=128)
    source = Path(__file__).parent / "fixtures" / "edgellm" / "mistral-dynamic-swa-tiny" / "config.json"
    data = json.loads(source.read_text())
    capacity = data["builder_config"]["max_kv_cache_capacity"]
    assert LLMEngineConfig.from_edgellm(source).max_position_embeddings >= capacity
    data["max_position_embeddings"] = capacity // 2
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"max_kv_cache_capacity: \d+ is above max_position_embeddings .* "
                                          r"rope_scaling.type 'dynamic'"):
        LLMEngineConfig.from_edgellm(path)


def test_rope_scaling_errors_from_a_file_name_the_file_and_key(tmp_path):
    data = llm_config().to_dict()
    data["rope_scaling"] = {"rope_type": "yarn"}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_json(path)
    assert info.value.field == f"{path}: rope_scaling.factor"


def test_frozen_maps_equal_in_any_order_hash_alike():
    from trtio._config import freeze_json

    a, b = freeze_json({"x": 1, "y": [2]}), freeze_json({"y": [2], "x": 1})
    assert a == b and hash(a) == hash(b)


_READERS = {"LLMEngineConfig.from_json": LLMEngineConfig.from_json,
            "DeploymentConfig.from_json": DeploymentConfig.from_json,
            "LLMEngineConfig.from_edgellm": LLMEngineConfig.from_edgellm}


@pytest.mark.parametrize("reader", list(_READERS))
@pytest.mark.parametrize("name,content,needle", [
    ("folder", None, "is a directory, not a config file"),
    ("missing.json", ..., "no such config file"),
    ("latin.json", b'{"name": "caf\xe9"}', r"is not UTF-8 text \(byte 0xe9 at offset 13\)"),
    ("bad.json", b"{not json", "is not valid JSON"),
    ("nan.json", b'{"rope_theta": NaN}', "rope_theta: is NaN, which JSON does not allow"),
    ("list.json", b"[1, 2]", "got a list"),
    ("null.json", b"null", "got a null"),
])
def test_every_config_reader_names_the_file_of_a_bad_config(tmp_path, reader, name, content, needle):
    """Each reader, each bad file: a ConfigError naming the path, never IsADirectoryError,
    UnicodeDecodeError or a message about a missing "base" section."""
    path = tmp_path / name
    if content is None:
        path.mkdir()
    elif content is not ...:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=needle) as info:
        _READERS[reader](path)
    assert str(path) in str(info.value)
    assert "base: is required" not in str(info.value)


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("hidden_size", 2**31, "2147483648"),
    ("vocab_size", 10**400, "an int of 1332 bits"),  # longer than Python prints: named by its size
    ("max_position_embeddings", 10**5000, "an int of 16612 bits"),
], ids=["2**31", "10**400", "10**5000"])
def test_sizes_beyond_32_bits_are_refused_naming_the_field(field: str, value: int, shown: str) -> None:
    with pytest.raises(ConfigError) as info:
        dataclasses.replace(llm_config(), **{field: value}).validate()
    assert str(info.value) == (f"{field}: must be at most 2**31 - 1 (trtio's step inputs are 32-bit ints), "
                               f"got {shown}")
    dataclasses.replace(llm_config(), **{field: 2**31 - 1}).validate()  # the largest that fits is taken
