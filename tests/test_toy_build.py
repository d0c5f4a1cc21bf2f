"""trtio.testing.toy_build and scripts/build_toy_engines.py: real TensorRT-RTX networks and plans, built on the CPU.

TensorRT-RTX builds plans ahead of time without a GPU; it cannot run them here, so these tests check
what a build can show: that each network builds and serializes, and that its I/O contract (names,
order, dtypes, shapes, both profiles, aliasing) is exactly the table of docs/toy-model.md; and that
the script reads the engines/ deployments and writes plans and configs in the engines layout.
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from _contract import expected_contract

from trtio import ConfigError, EngineError, LLMEngineConfig
from trtio.testing import toy_build as tb
from trtio.testing.toy_engines import ToyEngines, default_engines_dir
from trtio.testing.toy_model import ToyWeights

pytestmark = pytest.mark.rtx

trt = pytest.importorskip("tensorrt_rtx", exc_type=ImportError)  # absent, or present but unloadable

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "build_toy_engines.py"


def _load_script() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("build_toy_engines", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script runs
    spec.loader.exec_module(module)
    return module


bte = _load_script()

SMALL: dict[str, Any] = dict(
    hidden_size=64,
    vocab_size=512,
    output_vocab_size=512,
    max_supported_batch_size=4,
    max_supported_input_length=64,
    max_kv_cache_capacity=128,
    num_attention_layers=2,
    num_attention_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rotary_dim=16,
    activation_dtype="float16",
    kv_cache_dtype="float16",
    num_deepstack_features=0,
    rope_type="rope",
    is_spec_decode_base=False,
    base_model_hidden_size=0,
    max_verify_tree_size=8,
    max_draft_tree_size=8,
)

ROLE_CONFIGS = {
    "llm": dict(SMALL, max_verify_tree_size=0, max_draft_tree_size=0),
    "base": dict(SMALL, is_spec_decode_base=True, max_draft_tree_size=0),
    "draft": dict(SMALL, num_attention_layers=1, base_model_hidden_size=64, max_verify_tree_size=0),
}


def cfg_for(role: str, **overrides: Any) -> LLMEngineConfig:
    """An LLMEngineConfig of the role, not validated (the builder's own checks are under test too)."""
    return LLMEngineConfig(**{**ROLE_CONFIGS[role], **overrides})


def build(cfg: LLMEngineConfig) -> tuple[Any, Any, list[Any]]:
    return tb.build_network(trt, cfg, ToyWeights.generate(cfg))


def serialize(builder: Any, network: Any, profiles: list[Any]) -> Any:
    config = builder.create_builder_config()
    for profile in profiles:
        assert config.add_optimization_profile(profile) >= 0
    return builder.build_serialized_network(network, config)


def assert_contract(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [(e["name"], e["mode"]) for e in got] == [(e["name"], e["mode"]) for e in want]
    for g, w in zip(got, want):
        assert g == w, f"{w['name']}: got {g}, want {w}"


# -- networks and plans ---------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["llm", "base", "draft"])
def test_network_contract_matches_the_doc(role: str) -> None:
    cfg = cfg_for(role)
    builder, network, profiles = build(cfg)
    assert len(profiles) == 2
    assert_contract(tb.network_contract(network, profiles), expected_contract(cfg))


@pytest.mark.parametrize("role", ["llm", "base", "draft"])
def test_plan_builds_on_the_cpu(role: str) -> None:
    cfg = cfg_for(role)
    t0 = time.perf_counter()
    plan = serialize(*build(cfg))
    seconds = time.perf_counter() - t0
    assert plan is not None and plan.nbytes > 0
    # About half a second each on a CPU (TensorRT-RTX 1.7); the bound only catches a build gone badly wrong.
    assert seconds < 60, f"{role} plan took {seconds:.1f} s"


@pytest.mark.parametrize(
    "role, overrides",
    [
        ("llm", dict(num_deepstack_features=2, output_vocab_size=300)),
        ("llm", dict(rope_type="mrope")),
        ("llm", dict(activation_dtype="bfloat16", kv_cache_dtype="bfloat16")),
        ("llm", dict(kv_cache_dtype="float32", rotary_dim=8)),
        ("base", dict(max_verify_tree_size=40)),  # two mask words per row
        ("draft", dict(base_model_hidden_size=96, max_draft_tree_size=5)),
    ],
    ids=["deepstack+vout", "mrope", "bf16", "fp32-cache+partial-rope", "tree40", "draft-wide-base"],
)
def test_variants_keep_the_contract_and_build(role: str, overrides: dict[str, Any]) -> None:
    cfg = cfg_for(role, **overrides)
    builder, network, profiles = build(cfg)
    assert_contract(tb.network_contract(network, profiles), expected_contract(cfg))
    plan = serialize(builder, network, profiles)
    assert plan is not None and plan.nbytes > 0


def test_profile_shapes_cover_every_dynamic_input() -> None:
    for role in ("llm", "base", "draft"):
        cfg = cfg_for(role, num_deepstack_features=1)
        _, network, _ = build(cfg)
        dynamic = [network.get_input(i).name for i in range(network.num_inputs)
                   if -1 in tuple(network.get_input(i).shape)]
        assert list(tb.profile_shapes(cfg)) == dynamic


def test_bad_configs_are_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        build(cfg_for("llm", num_kv_heads=3))
    with pytest.raises(ValueError, match="rotary_dim=18"):
        build(cfg_for("llm", rotary_dim=18))
    with pytest.raises(ValueError, match="kv_cache_dtype=int8"):
        build(cfg_for("llm", kv_cache_dtype="int8"))
    with pytest.raises(ValueError, match="num_deepstack_features=3"):
        build(cfg_for("llm", num_deepstack_features=3))
    with pytest.raises(ValueError, match="EAGLE draft"):
        tb.build_network(trt, cfg_for("draft"), ToyWeights.generate(cfg_for("llm", num_attention_layers=1)))


def test_bad_configs_are_one_config_error_listing_every_problem() -> None:
    with pytest.raises(ConfigError) as info:
        build(cfg_for("llm", num_kv_heads=3, rotary_dim=18))
    assert info.value.field == "num_kv_heads"
    assert "num_kv_heads=3" in str(info.value) and "rotary_dim=18" in str(info.value)


# -- build_plan and main() ------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_build_plan_writes_the_plan_and_draws_progress(tmp_path: Path) -> None:
    cfg = cfg_for("llm", num_attention_layers=1)
    term = _Terminal()
    result = tb.build_plan(trt, cfg, ToyWeights.generate(cfg), tmp_path / "toy" / "model.plan",
                            stream=term, label="toy")
    assert result.path.stat().st_size == result.nbytes > 0
    assert result.seconds > 0
    text = term.getvalue()
    assert "toy [" in text and "%" in text, "IProgressMonitor drew no bar"
    assert text.rstrip().splitlines()[-1].startswith("built toy:")


def test_build_plan_quiet_and_non_terminal(tmp_path: Path) -> None:
    cfg = cfg_for("llm", num_attention_layers=1)
    quiet = io.StringIO()
    tb.build_plan("tensorrt_rtx", cfg, ToyWeights.generate(cfg), tmp_path / "a.plan", progress=False, stream=quiet)
    assert quiet.getvalue() == ""
    pipe = io.StringIO()  # not a terminal: just the summary line
    tb.build_plan(trt, cfg, ToyWeights.generate(cfg), tmp_path / "b.plan", stream=pipe, label="b")
    assert pipe.getvalue().count("\n") == 1 and "\r" not in pipe.getvalue()


def _engines_copy(tmp_path: Path, **edits: Any) -> Path:
    """A copy of engines/ (configs only) with ``edits`` applied to toy-eagle's draft."""
    root = tmp_path / "cfg"
    toys = ToyEngines.load()
    toys.write_configs(root)
    if edits:
        path = root / "toy-eagle" / "config.json"
        data = json.loads(path.read_text())
        data["draft"].update(edits)
        path.write_text(json.dumps(data))
        (root / "toy-eagle" / "draft" / "config.json").unlink()
    return root


@pytest.fixture(scope="module")
def built_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("engines")
    rc = bte.main(["--out", str(out), "--module", "tensorrt_rtx", "--quiet"])
    return out, rc


def test_main_builds_three_plans_from_the_engines_configs(built_out: tuple[Path, int]) -> None:
    out, rc = built_out
    assert rc == 0
    toys = ToyEngines.load()
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("model.plan")) == [
        "toy-eagle/base/model.plan", "toy-eagle/draft/model.plan", "toy-llm/model.plan",
    ]
    for name in ("toy-eagle/base", "toy-eagle/draft"):
        assert (out / name / "model.plan").stat().st_size > 0
        assert LLMEngineConfig.from_json(out / name / "config.json") == toys.config(name)
    # The output is an engines folder in its own right: the same deployments, seed included.
    built = ToyEngines.load(out)
    assert (built.llm, built.eagle, built.seed) == (toys.llm, toys.eagle, toys.seed)
    assert json.loads((out / "toy-llm" / "config.json").read_text())["name"] == "toy-llm"
    assert toys.plans_in(out) == {n: out / n / "model.plan" for n in ("toy-llm", "toy-eagle/base", "toy-eagle/draft")}


def test_the_draft_plan_bakes_the_generate_draft_weights() -> None:
    # build_plans passes ToyEngines.weights(name): for the draft, generate_draft over the base's weights.
    toys = ToyEngines.load()
    base, draft = toys.weights("toy-eagle/base"), toys.weights("toy-eagle/draft")
    assert base is toys.weights("toy-llm")
    assert draft.w_lm is base.w_lm and draft.is_draft
    plain = ToyWeights.generate(toys.config("toy-eagle/draft"), toys.seed)
    assert not (plain.we == draft.we).all()


def test_main_builds_one_group(tmp_path: Path) -> None:
    rc = bte.main(["--out", str(tmp_path / "out"), "--engines", "toy-eagle/draft", "--module", "tensorrt_rtx",
                   "--quiet"])
    assert rc == 0
    assert [p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("model.plan")] == [
        "toy-eagle/draft/model.plan"]


def test_main_reads_the_config_dir(tmp_path: Path) -> None:
    root = _engines_copy(tmp_path, max_draft_tree_size=9)
    out = tmp_path / "out"
    rc = bte.main(["--out", str(out), "--engines", "toy-eagle/draft", "--config-dir", str(root), "--quiet"])
    assert rc == 0
    assert LLMEngineConfig.from_json(out / "toy-eagle" / "draft" / "config.json").max_draft_tree_size == 9


def test_default_out_is_git_ignored() -> None:
    assert bte.DEFAULT_OUT == default_engines_dir() / "build"
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    for rel in ("engines/build/toy-llm/model.plan", "engines/build/toy-eagle/config.json"):
        assert subprocess.run(["git", "check-ignore", "-q", rel], cwd=REPO).returncode == 0, rel
    assert subprocess.run(["git", "check-ignore", "-q", "engines/toy-llm/config.json"], cwd=REPO).returncode == 1


@pytest.mark.parametrize("argv, needle", [
    (["--module", "onnxruntime"], "unknown --module 'onnxruntime'"),
    (["--engines", "toy-gpt"], "unknown engine 'toy-gpt'"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
])
def test_main_usage_errors_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               argv: list[str], needle: str) -> None:
    rc = bte.main(["--out", str(tmp_path), *argv])
    assert rc == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_main_reports_a_broken_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _engines_copy(tmp_path, num_kv_heads=3)
    rc = bte.main(["--out", str(tmp_path / "out"), "--config-dir", str(root), "--quiet"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "num_kv_heads" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_resolve_module() -> None:
    assert tb.resolve_module(trt) is trt
    assert tb.resolve_module("tensorrt_rtx") is trt
    assert tb.resolve_module("auto").__name__ in ("tensorrt", "tensorrt_rtx")
    with pytest.raises(EngineError, match="unknown TensorRT module"):
        tb.resolve_module("onnx")


def test_script_runs_as_a_program(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--engines", "toy-llm",
                           "--module", "tensorrt_rtx"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "built toy-llm" in proc.stderr
    assert (tmp_path / "toy-llm" / "model.plan").stat().st_size > 0


@pytest.mark.rtx
def test_rtx_plans_are_built_for_user_allocation_so_graphs_can_capture_them():
    import tensorrt_rtx as trt

    from trtio._trt import trt_logger

    builder = trt.Builder(trt_logger(trt))
    config = builder.create_builder_config()
    assert not config.get_flag(trt.BuilderFlag.REQUIRE_USER_ALLOCATION)
    tb.configure_builder(trt, config)
    assert config.get_flag(trt.BuilderFlag.REQUIRE_USER_ALLOCATION)


def test_a_tensorrt_without_the_kv_cache_layer_is_named():
    old = types.SimpleNamespace(__name__="tensorrt", __version__="10.8.0")
    with pytest.raises(EngineError, match=r"tensorrt 10.8.0 has no add_kv_cache_update, add_rotary_embedding: "
                                           r"the toy plans need TensorRT 10.15 or later"):
        tb._require_layers(old, object())
