"""Real-graph parity of dense text models with scaled RoPE (DESIGN §17): NVIDIA's exported graphs of a Llama 3.x
(``rope_type: llama3``), a Qwen3 with YaRN and a HunYuan V1 dense (DynamicNTKAlpha, QK norm after RoPE), driven by
trtio, equal Hugging Face's fp32 forward scenario by scenario; a RoPE table without the scaling, or rows one position
late, fails the check.

The graphs take the RoPE rows as a runtime input (``rope_rotary_cos_sin``, one row per token), which trtio gathers
from the table it builds (``rope.py``); only the comparison with HF's logits shows whether that table is HF's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

import trtio
from tests._parity import TEXT_SCENARIOS, Case, ParityMismatch, planted, run
from trtio._rope import rope_cos_sin_table

CASES = ["llama3", "yarn", "hunyuan"]

Hook = Callable[[dict[str, np.ndarray]], None]

RUNS = [pytest.param("host", False, id="host"),
        pytest.param("cuda", False, marks=pytest.mark.gpu, id="cuda"),
        pytest.param("cuda", True, marks=pytest.mark.gpu, id="cuda-graphs")]


@pytest.mark.parametrize(("backend", "graphs"), RUNS)
@pytest.mark.parametrize("scenario", list(TEXT_SCENARIOS))
@pytest.mark.parametrize("name", CASES)
def test_equals_hugging_face(name: str, scenario: str, backend: str, graphs: bool) -> None:
    cmp = run(Case(name), scenario, backend=backend, graphs=graphs)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


def _config(case: Case) -> trtio.LLMEngineConfig:
    return trtio.LLMEngineConfig.from_edgellm(case.engine().config, what=f"{case.name}/llm/config.json")


def _scaled_table(case: Case) -> np.ndarray:
    """The table trtio gathers the case's rows from: [capacity, rotary_dim]."""
    cfg = _config(case)
    assert cfg.rope_scaling is not None, "the case's config lost its rope_scaling"
    return rope_cos_sin_table(cfg.max_kv_cache_capacity, cfg.rotary_dim, cfg.rope_theta, scaling=cfg.rope_scaling,
                              max_position_embeddings=cfg.max_position_embeddings)[0]


def _unscaled_table(case: Case) -> np.ndarray:
    cfg = _config(case)
    return rope_cos_sin_table(cfg.max_kv_cache_capacity, cfg.rotary_dim, cfg.rope_theta)[0]


def _rows_from(table: np.ndarray, other: np.ndarray, shift: int = 0) -> Hook:
    """A hook that replaces each RoPE row (``table``'s row of some position p) by ``other``'s row of p - shift:
    the rows trtio would gather from another table, or from positions ``shift`` late."""
    def hook(inputs: dict[str, np.ndarray]) -> None:
        rows = np.asarray(inputs["rope_rotary_cos_sin"], np.float32)
        positions = np.argmin(((rows[:, None, :] - table[None, :, :]) ** 2).sum(-1), axis=1)
        inputs["rope_rotary_cos_sin"] = np.ascontiguousarray(other[np.maximum(positions - shift, 0)])
    return hook


def _attention_factor_dropped(table: np.ndarray, factor: float) -> Hook:
    def hook(inputs: dict[str, np.ndarray]) -> None:
        inputs["rope_rotary_cos_sin"] = np.asarray(inputs["rope_rotary_cos_sin"], np.float32) / np.float32(factor)
    return hook


def test_the_scaling_changes_the_rows_the_scenarios_use() -> None:
    """Each case's scaling moves the table at the positions the scenarios reach (up to 157), by far more than the
    tolerance could hide: else a dropped scaling could pass for the wrong reason."""
    for name in CASES:
        case = Case(name)
        scaled, unscaled = _scaled_table(case), _unscaled_table(case)
        assert np.abs(scaled[:24] - unscaled[:24]).max() > 0.5, name  # the batch's positions
        assert np.abs(scaled[:160] - unscaled[:160]).max() > 1.0, name


def test_the_yarn_rows_carry_hf_attention_factor() -> None:
    """HF multiplies YaRN's cos and sin by 0.1 ln(factor) + 1 (factor 4: 1.1386); so does trtio's table."""
    table = _scaled_table(Case("yarn"))
    norms = np.hypot(table[:, :32], table[:, 32:])
    assert np.allclose(norms, 0.1 * np.log(4.0) + 1.0, atol=1e-6)


def test_hunyuan_exports_its_qk_norm_after_rope() -> None:
    """HunYuan V1 normalizes q and k after RoPE (transformers' HunYuanDenseV1Attention); the export says so to the
    plugin (``qk_norm_post_rope`` 1), so the case's parity covers the plugin's rotate-then-normalize path."""
    for name, post in (("hunyuan", 1), ("yarn", 0)):
        model = onnx.load(str(Case(name).root / "llm" / "model.onnx"), load_external_data=False)
        nodes = [n for n in model.graph.node if n.op_type == "AttentionPlugin"]
        assert len(nodes) == 4
        for node in nodes:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert attrs["enable_qk_norm"] == 1 and attrs["qk_norm_post_rope"] == post, (name, attrs)


def test_hunyuan_parity_tells_the_qk_norm_order(tmp_path: Path) -> None:
    """The same graph with ``qk_norm_post_rope`` 0 (normalize, then rotate: Qwen3's order) fails the check: the
    case's parity depends on the order the export asks for, not only on the table."""
    case = Case("hunyuan")
    shutil.copytree(case.root / "llm", tmp_path / "llm")
    model = onnx.load(str(tmp_path / "llm" / "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type == "AttentionPlugin" and a.name == "qk_norm_post_rope":
                a.i = 0
    onnx.save(model, str(tmp_path / "llm" / "model.onnx"))
    case.root = tmp_path
    with pytest.raises(ParityMismatch):
        run(case, "batch")


def _unscaled(case: Case) -> Hook:
    return _rows_from(_scaled_table(case), _unscaled_table(case))


def _one_late(case: Case) -> Hook:
    table = _scaled_table(case)
    return _rows_from(table, table, shift=1)


def _no_attention_factor(case: Case) -> Hook:
    return _attention_factor_dropped(_scaled_table(case), 0.1 * np.log(4.0) + 1.0)


# (case, bug) -> (scenario, the hook planting it): each plants one wrong runtime input, as a trtio bug would write it.
BUGS: dict[tuple[str, str], tuple[str, Callable[[Case], Hook]]] = {
    **{(name, "the scaling dropped (default frequencies)"): ("batch", _unscaled) for name in CASES},
    **{(name, "the scaling dropped, across a page (chunked)"): ("chunked", _unscaled) for name in CASES},
    **{(name, "RoPE rows one position late"): ("batch", _one_late) for name in CASES},
    ("yarn", "YaRN's attention factor dropped"): ("batch", _no_attention_factor),
}


@pytest.mark.parametrize(("name", "bug"), list(BUGS))
def test_a_planted_input_bug_fails_parity(name: str, bug: str) -> None:
    scenario, make = BUGS[name, bug]
    case = Case(name)
    how = planted(case, scenario, make(case))
    assert how.startswith(("mismatch", "refused"))
