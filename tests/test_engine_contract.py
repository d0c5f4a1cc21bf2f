"""The toy engines' I/O contract: what a TensorRT-RTX build declares equals what the ReferenceEngine declares.

trtio's CPU tests bind and run ReferenceEngines; GPU users bind and run plans built by
scripts/build_toy_engines.py. The two are interchangeable only if their I/O contracts are equal, name
for name: order, modes, dtypes, dynamic dims, every profile's min / opt / max, locations, aliasing. The
``rtx`` tests build each network of the engines/ configs with tensorrt_rtx (on the CPU) and compare it
with ``EngineIO.from_engine(ReferenceEngine.from_config(...)).to_dict()``; a perturbation test shows
the comparison catches a change in any one field. The unmarked tests pin the engines/ configs
themselves (one model, one seed, the sizes the demo relies on) and their loader.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trtio import ConfigError, DeploymentConfig, LLMEngineConfig
from trtio._config import read_config
from trtio._engine import EngineIO
from trtio.testing.toy_build import build_network, contract_diff, network_engine_io
from trtio.testing.toy_engines import ENGINE_NAMES, ToyEngines, default_engines_dir

ENGINES = default_engines_dir()


def reference_io(toys: ToyEngines, name: str) -> dict[str, Any]:
    return EngineIO.from_engine(toys.reference_engine(name, device="host", null_compute=True)).to_dict()


@pytest.fixture(scope="module")
def toys() -> ToyEngines:
    return ToyEngines.load()


@pytest.fixture(scope="module")
def network_ios(toys: ToyEngines) -> dict[str, dict[str, Any]]:
    trt = pytest.importorskip("tensorrt_rtx", exc_type=ImportError)
    out = {}
    for name in ENGINE_NAMES:
        builder, network, profiles = build_network(trt, toys.config(name), toys.weights(name))
        out[name] = network_engine_io(network, profiles)
        del builder, network, profiles
    return out


# -- the network contract equals the reference engine's ---------------------------------------------


@pytest.mark.rtx
@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_built_network_declares_the_reference_engines_contract(network_ios: dict[str, dict[str, Any]],
                                                               toys: ToyEngines, name: str) -> None:
    got, want = network_ios[name], reference_io(toys, name)
    assert contract_diff(got, want, labels=("tensorrt_rtx network", "ReferenceEngine")) == []
    assert got == want
    # The comparison covers every tensor and every field EngineIO reports.
    assert len(got["tensors"]) == len(toys.reference_engine(name, device="host", null_compute=True).io_contract())
    assert set(got["tensors"][0]) == {"index", "name", "mode", "dtype", "shape", "location", "is_shape_tensor",
                                      "profiles", "aliased_input"}


def _tensor(d: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in d["tensors"] if t["name"] == name)


def _rename(d: dict[str, Any]) -> None:
    _tensor(d, "context_lengths")["name"] = "context_length"


def _swap(d: dict[str, Any]) -> None:
    t = d["tensors"]
    t[1], t[2] = t[2], t[1]


def _mode(d: dict[str, Any]) -> None:
    _tensor(d, "hidden_states")["mode"] = "input"


def _dtype(d: dict[str, Any]) -> None:
    _tensor(d, "k_cache_1")["dtype"] = "bfloat16"


def _static_dim(d: dict[str, Any]) -> None:
    _tensor(d, "inputs_embeds")["shape"][0] = 4


def _profile(which: str, profile: int) -> Callable[[dict[str, Any]], None]:
    def perturb(d: dict[str, Any]) -> None:
        _tensor(d, "last_token_ids")["profiles"][profile][which][1] += 1
    return perturb


def _alias(d: dict[str, Any]) -> None:
    _tensor(d, "present_v_cache_0")["aliased_input"] = None


def _alias_other(d: dict[str, Any]) -> None:
    _tensor(d, "present_v_cache_0")["aliased_input"] = "k_cache_0"


def _location(d: dict[str, Any]) -> None:
    _tensor(d, "context_lengths")["location"] = "host"


def _shape_tensor(d: dict[str, Any]) -> None:
    _tensor(d, "kvcache_start_index")["is_shape_tensor"] = True


def _profiles(d: dict[str, Any]) -> None:
    d["num_profiles"] = 3


def _missing(d: dict[str, Any]) -> None:
    d["tensors"] = [t for t in d["tensors"] if t["name"] != "rope_rotary_cos_sin"]


def _extra(d: dict[str, Any]) -> None:
    d["tensors"].append(dict(copy.deepcopy(d["tensors"][0]), name="deepstack_embeds_0", index=len(d["tensors"])))


def _engine_name(d: dict[str, Any]) -> None:
    d["name"] = "toy-other"


PERTURBATIONS = {
    "name": (_rename, "context_length"),
    "order": (_swap, "order"),
    "mode": (_mode, "hidden_states.mode"),
    "dtype": (_dtype, "k_cache_1.dtype"),
    "dynamic dim": (_static_dim, "inputs_embeds.shape[0]"),
    "profile 0 min": (_profile("min", 0), "last_token_ids.profiles[0].min[1]"),
    "profile 1 opt": (_profile("opt", 1), "last_token_ids.profiles[1].opt[1]"),
    "profile 1 max": (_profile("max", 1), "last_token_ids.profiles[1].max[1]"),
    "alias dropped": (_alias, "present_v_cache_0.aliased_input"),
    "alias moved": (_alias_other, "present_v_cache_0.aliased_input"),
    "location": (_location, "context_lengths.location"),
    "shape tensor": (_shape_tensor, "kvcache_start_index.is_shape_tensor"),
    "profile count": (_profiles, "num_profiles"),
    "missing tensor": (_missing, "rope_rotary_cos_sin"),
    "extra tensor": (_extra, "deepstack_embeds_0"),
    "engine name": (_engine_name, "name"),
}


@pytest.mark.rtx
@pytest.mark.parametrize("what", list(PERTURBATIONS))
def test_contract_comparison_catches_any_one_change(network_ios: dict[str, dict[str, Any]], toys: ToyEngines,
                                                    what: str) -> None:
    perturb, needle = PERTURBATIONS[what]
    want = reference_io(toys, "toy-eagle/base")
    got = copy.deepcopy(network_ios["toy-eagle/base"])
    assert contract_diff(got, want) == []
    perturb(got)
    problems = contract_diff(got, want, labels=("network", "reference"))
    assert problems, f"a change of {what} went unnoticed"
    assert any(needle in p for p in problems), problems
    assert got != want


def test_contract_diff_reports_every_difference_with_both_values() -> None:
    want = {"name": "e", "num_profiles": 2, "tensors": [
        {"name": "a", "dtype": "float16", "profiles": [{"min": [1], "opt": [2], "max": [4]}]},
        {"name": "b", "dtype": "int32", "profiles": []}]}
    got = copy.deepcopy(want)
    got["tensors"][0]["dtype"] = "float32"
    got["tensors"][0]["profiles"][0]["max"] = [8]
    got["tensors"][1]["profiles"] = [{"min": [1], "opt": [1], "max": [1]}]
    problems = contract_diff(got, want, labels=("plan", "reference"))
    assert problems == [
        "a.dtype: 'float32' in plan, 'float16' in reference",
        "a.profiles[0].max[0]: 8 in plan, 4 in reference",
        "b.profiles: 1 entries in plan [{'min': [1], 'opt': [1], 'max': [1]}], 0 in reference []",
    ]
    assert contract_diff(want, copy.deepcopy(want)) == []
    # bool and int are different things in a contract (is_shape_tensor False is not 0).
    assert contract_diff({"x": False}, {"x": 0})


# -- the engines/ configs -----------------------------------------------------------------------------


def test_engines_configs_describe_one_small_model(toys: ToyEngines) -> None:
    llm, base, draft = (toys.config(n) for n in ENGINE_NAMES)
    spec = toys.eagle.spec
    assert spec is not None
    assert (llm.role, base.role, draft.role) == ("llm", "base", "draft")
    assert dataclasses.replace(base, is_spec_decode_base=False, max_verify_tree_size=0) == llm
    assert toys.llm.extra["seed"] == toys.eagle.extra["seed"] == toys.seed
    assert (toys.llm.extra["name"], toys.eagle.extra["name"]) == ("toy-llm", "toy-eagle")
    heads = (llm.num_attention_heads, llm.num_kv_heads, llm.head_dim, llm.rotary_dim)
    assert (llm.hidden_size, *heads) == (64, 4, 2, 16, 16)
    # The draft copies the base's two layers (ToyWeights.generate_draft), so that it agrees with the base.
    assert (llm.num_attention_layers, draft.num_attention_layers, llm.vocab_size) == (2, 2, 512)
    assert (llm.max_supported_batch_size, llm.max_supported_input_length, llm.max_kv_cache_capacity) == (4, 64, 128)
    assert llm.activation_dtype == llm.kv_cache_dtype == "float16"
    assert draft.base_model_hidden_size == base.hidden_size
    assert draft.vocab_size == base.output_vocab_size  # the draft shares the base's lm head
    assert (spec.drafting_step, spec.drafting_top_k, spec.max_verify_size, spec.max_draft_proposal_size) == (3, 2, 8, 8)
    assert spec.verify_size == 1 + spec.drafting_top_k * spec.drafting_step  # the demo verifies every drafted node


@pytest.mark.parametrize("name", ["toy-eagle/base", "toy-eagle/draft"])
def test_per_engine_configs_repeat_the_deployment(toys: ToyEngines, name: str) -> None:
    assert LLMEngineConfig.from_json(ENGINES / name / "config.json") == toys.config(name)
    assert read_config(ENGINES / name / "config.json") == toys.config(name)
    assert isinstance(read_config(ENGINES / "toy-eagle" / "config.json"), DeploymentConfig)


def test_weights_make_one_model_and_a_draft_that_approximates_it(toys: ToyEngines) -> None:
    base = toys.weights("toy-eagle/base")
    assert base is toys.weights("toy-llm")
    draft = toys.weights("toy-eagle/draft")
    assert draft.w_lm is base.w_lm
    assert (draft.we == np.eye(64, dtype=np.float32)).all()
    assert toys.embedding().shape == (512, 64)


def _copy(tmp_path: Path, edit: Callable[[dict[str, Any], dict[str, Any]], None] | None = None) -> Path:
    root = tmp_path / "engines"
    ToyEngines.load().write_configs(root)
    if edit is not None:
        llm_path, eagle_path = root / "toy-llm" / "config.json", root / "toy-eagle" / "config.json"
        llm, eagle = json.loads(llm_path.read_text()), json.loads(eagle_path.read_text())
        edit(llm, eagle)
        llm_path.write_text(json.dumps(llm))
        eagle_path.write_text(json.dumps(eagle))
    return root


def test_write_configs_round_trips(tmp_path: Path, toys: ToyEngines) -> None:
    back = ToyEngines.load(_copy(tmp_path))
    assert (back.llm, back.eagle, back.seed) == (toys.llm, toys.eagle, toys.seed)
    assert back.fingerprint() == toys.fingerprint()


@pytest.mark.parametrize("edit, needles", [
    (lambda llm, eagle: eagle["base"].update(hidden_size=32), ["toy-eagle", "base", "hidden_size 32 vs 64"]),
    (lambda llm, eagle: eagle.update(seed=1), ["toy-eagle", "seed", "differs"]),
    (lambda llm, eagle: llm["base"].update(is_spec_decode_base=True, max_verify_tree_size=8), ["toy-llm", "plain LLM"]),
    (lambda llm, eagle: eagle.pop("draft") and eagle.pop("spec"), ["toy-eagle", "draft"]),
    (lambda llm, eagle: llm.update(seed=-1), ["seed", "non-negative"]),
])
def test_load_refuses_configs_that_are_not_one_model(tmp_path: Path, edit: Any, needles: list[str]) -> None:
    root = _copy(tmp_path, edit)
    with pytest.raises(ConfigError) as info:
        ToyEngines.load(root)
    for needle in needles:
        assert needle in str(info.value)


def test_load_refuses_a_per_engine_config_that_disagrees(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    path = root / "toy-eagle" / "draft" / "config.json"
    data = json.loads(path.read_text())
    data["max_draft_tree_size"] = 6
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"draft/config.json.*max_draft_tree_size 6 vs 8"):
        ToyEngines.load(root)


def test_load_names_a_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        ToyEngines.load(tmp_path)
    root = _copy(tmp_path)
    (root / "toy-llm" / "config.json").write_text("{ not json")
    with pytest.raises(ConfigError, match="toy-llm/config.json: is not valid JSON"):
        ToyEngines.load(root)


def test_plans_in_finds_checks_and_refuses_stale_plans(tmp_path: Path, toys: ToyEngines) -> None:
    root = _copy(tmp_path)
    assert toys.plans_in(root) is None  # configs, no plans
    for name in ENGINE_NAMES:
        (root / name / "model.plan").write_bytes(b"plan")
    assert toys.plans_in(root) == {n: root / n / "model.plan" for n in ENGINE_NAMES}
    stale = _copy(tmp_path / "stale", lambda llm, eagle: (llm.update(seed=3), eagle.update(seed=3)))
    for name in ENGINE_NAMES:
        (stale / name / "model.plan").write_bytes(b"plan")
    with pytest.raises(ConfigError, match="seed 3 vs 0"):
        toys.plans_in(stale)
    assert ToyEngines.load(stale).fingerprint() != toys.fingerprint()
