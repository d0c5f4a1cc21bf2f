"""trtio.testing.OnnxEngine: the exported graph's I/O as an engine's, Edge-LLM's builder profiles, its execution
rules (DESIGN §17). What it computes is held to Hugging Face by the tests/test_parity_*.py files."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")

from tests._parity import FIXTURES, Case  # noqa: E402

CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "profiles.json").is_file())


@pytest.mark.parametrize("name", CASES)
def test_profiles_equal_the_real_builders(name: str) -> None:
    """Each role's profiles equal what Edge-LLM's own builder function set on the same graph inputs
    (``profiles.json``, recorded by scripts/make_parity_fixtures.py)."""
    case = Case(name)
    for role, recorded in case.profiles.items():
        engine = case.engine(role)
        for input_name, want in recorded.items():
            got = [engine.get_tensor_profile_shape(input_name, p) for p in range(engine.num_optimization_profiles)]
            assert [[list(s) for s in r] for r in got] == [want[f"profile{p}"] for p in range(len(want))], \
                (role, input_name)
        declared = {engine[i] for i in range(len(engine)) if engine.get_tensor_mode(engine[i]).name == "INPUT"}
        dynamic = {n for n in declared if -1 in engine.get_tensor_shape(n)}
        assert dynamic <= set(recorded), f"{role}: dynamic inputs the builder sets no profile for"
