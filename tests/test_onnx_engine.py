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
            got = [engine.get_tensor_profile_shape(input_name, p) for p in (0, 1)]
            assert [[list(s) for s in r] for r in got] == [want["profile0"], want["profile1"]], (role, input_name)
        declared = {engine[i] for i in range(len(engine)) if engine.get_tensor_mode(engine[i]).name == "INPUT"}
        dynamic = {n for n in declared if -1 in engine.get_tensor_shape(n)}
        assert dynamic <= set(recorded), f"{role}: dynamic inputs the builder sets no profile for"


def test_inputs_bound_to_one_device_range_share_one_host_mirror() -> None:
    """On the cuda backend the graph runs on pinned host mirrors: a KV-sharing consumer's pool bound to its donor's
    memory must be the donor's mirror, or the consumer would read the pool as it was before the step (and its stale
    copy, copied back last, would undo the donor's writes)."""
    from trtio.dtypes import DType
    from trtio.testing.onnx_engine import _IO, _mirrored

    def io(name: str, is_input: bool = True) -> _IO:
        return _IO(name, is_input, DType.FLOAT16, (-1,), (None,))

    binding = [(io("past_key_values_3"), 4096, (64,)), (io("past_key_values_4"), 4096, (64,)),
               (io("past_key_values_5"), 8192, (64,)), (io("other_at_the_same_address"), 8192, (32,)),
               (io("logits", False), 4096, (64,))]
    assert _mirrored(binding) == {"past_key_values_3": "past_key_values_3", "past_key_values_4": "past_key_values_3",
                                  "past_key_values_5": "past_key_values_5",
                                  "other_at_the_same_address": "other_at_the_same_address", "logits": "logits"}
