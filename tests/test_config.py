import json

import pytest
from _configs import bundle, llm_config

from trtio import ConfigError, ShapeError
from trtio.config import DeploymentConfig, LLMEngineConfig, SpecDecodeConfig
from trtio.dims import InferenceDims


def test_defaults_and_normalisation():
    cfg = llm_config(rotary_dim=None, activation_dtype="HALF")
    assert cfg.output_vocab_size == cfg.vocab_size == 512
    assert cfg.rotary_dim == cfg.head_dim
    assert cfg.activation_dtype == "float16"
    assert cfg.role == "llm"


def test_frozen():
    cfg = llm_config()
    with pytest.raises(AttributeError):
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
    assert str(value) in str(info.value) or field in ("num_kv_heads",)


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
