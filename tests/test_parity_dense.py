"""Real-graph parity of dense text models (DESIGN §17): NVIDIA's exported Qwen3 graph driven by trtio equals
Hugging Face's fp32 forward, scenario by scenario, and a wrong runtime input fails the check."""

from __future__ import annotations

import pytest

from tests._parity import TEXT_BUGS, TEXT_SCENARIOS, Case, planted, run

CASES = ["qwen3"]


RUNS = [pytest.param("host", False, id="host"),
        pytest.param("cuda", False, marks=pytest.mark.gpu, id="cuda"),
        pytest.param("cuda", True, marks=pytest.mark.gpu, id="cuda-graphs")]


@pytest.mark.parametrize("backend, graphs", RUNS)
@pytest.mark.parametrize("scenario", list(TEXT_SCENARIOS))
@pytest.mark.parametrize("name", CASES)
def test_equals_hugging_face(name: str, scenario: str, backend: str, graphs: bool) -> None:
    """On the host backend, and on the cuda backend (the graph runs in a CUDA host function between stream-ordered
    copies, also replayed from CUDA graphs)."""
    cmp = run(Case(name), scenario, backend=backend, graphs=graphs)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


@pytest.mark.parametrize("bug", list(TEXT_BUGS))
def test_a_planted_input_bug_fails_parity(bug: str) -> None:
    scenario, hook = TEXT_BUGS[bug]
    how = planted(Case("qwen3"), scenario, hook)
    assert how.startswith(("mismatch", "refused"))

