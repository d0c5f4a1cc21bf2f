"""Real-graph parity of a mixture of experts (DESIGN §17): NVIDIA's exported Qwen3-MoE graph (Fp16MoePlugin) driven
by trtio equals Hugging Face's fp32 forward, scenario by scenario, and wrong runtime inputs fail the check."""

from __future__ import annotations

import pytest

from tests._parity import TEXT_BUGS, TEXT_SCENARIOS, Case, planted, run
from trtio.testing.edgellm_plugins.moe import build_limits

CASE = "qwen3-moe"


RUNS = [pytest.param("host", False, id="host"),
        pytest.param("cuda", False, marks=pytest.mark.gpu, id="cuda"),
        pytest.param("cuda", True, marks=pytest.mark.gpu, id="cuda-graphs")]


@pytest.mark.parametrize("backend, graphs", RUNS)
@pytest.mark.parametrize("scenario", list(TEXT_SCENARIOS))
def test_equals_hugging_face(scenario: str, backend: str, graphs: bool) -> None:
    cmp = run(Case(CASE), scenario, backend=backend, graphs=graphs)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


@pytest.mark.parametrize("bug", ["RoPE rows one position late", "past_lengths off by one (a chunk)",
                                 "two sequences' pages swapped (decode)", "logits row one early"])
def test_a_planted_input_bug_fails_parity(bug: str) -> None:
    scenario, hook = TEXT_BUGS[bug]
    assert planted(Case(CASE), scenario, hook).startswith(("mismatch", "refused"))


def test_the_fixture_is_below_what_a_real_plugin_builds() -> None:
    """The tiny fixture's 8 experts: the real Fp16MoePlugin builds for 128 or 256 only (documented, not hidden)."""
    import onnx

    model = onnx.load(str(Case(CASE).root / "llm" / "model.onnx"), load_external_data=False)
    (node, *_) = [n for n in model.graph.node if n.op_type == "Fp16MoePlugin"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["norm_topk_prob"] == 1
    assert build_limits(attrs) == ["num_experts 8 (the plugin builds for 128 or 256)"]
