"""trtio.testing.OnnxEngine: the exported graph's I/O as an engine's, Edge-LLM's builder profiles, its execution
rules (DESIGN §17). What it computes is held to Hugging Face by the tests/test_parity_*.py files."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import trtio
from trtio._cuda.backend import Location

pytest.importorskip("onnx")

from tests._parity import FIXTURES, TEXT_SCENARIOS, Case, Compare, llm_setup  # noqa: E402

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


class _DeviceBehindHost:
    """The host backend, except that its "device" memory is said to be out of the host's reach: OnnxEngine then takes
    its cuda path (pinned mirrors, copies in and out around a host function), which this machine can run."""

    def __init__(self) -> None:
        self._inner = trtio.get_backend("host")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def is_host_accessible(self, location: Location) -> bool:
        return location is not Location.DEVICE and bool(self._inner.is_host_accessible(location))


def test_the_mirrored_path_equals_hugging_face() -> None:
    """The cuda path's copies (inputs and pools in, outputs and pools out, one mirror per device address) compute
    what the in-place path computes: the batch scenario equals HF through them."""
    backend = _DeviceBehindHost()
    cmp = run_on(Case("qwen3"), "batch", backend)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


def test_a_refused_step_on_the_mirrored_path_leaves_nan_and_raises_at_the_next_execute() -> None:
    """A host function cannot raise into CUDA: the failed step's logits are NaN and the next execute raises."""
    backend = _DeviceBehindHost()
    case = Case("qwen3")
    table, (s, *_) = case.table(), case.of("batch")

    def cumulative(inputs: dict[str, np.ndarray]) -> None:
        lengths = inputs["query_lengths"]
        inputs["query_start_offsets"] = np.concatenate([[0], np.cumsum(lengths) + 1]).astype(np.int32)

    with llm_setup(case, backend, hook=cumulative) as setup:
        logits = setup.prefill(table[s.prompt][None], [s.prompt_length]).to_numpy()
        assert np.isnan(logits).all()
        with pytest.raises(trtio.errors.InvalidValueError, match="query_start_offsets"):
            setup.prefill(table[s.prompt][None], [s.prompt_length])


def run_on(case: Case, scenario: str, backend: Any) -> Compare:
    cmp = Compare()
    with llm_setup(case, backend) as setup:
        TEXT_SCENARIOS[scenario](setup, case, cmp)
    return cmp


def test_the_graph_runs_in_stream_order_on_a_lazy_device() -> None:
    """On AsyncHostBackend (device work queued per stream, run lazily, freed host buffers overwritten) the graph reads
    its inputs when the stream reaches it, as on a GPU: every scenario still equals HF."""
    from trtio.testing import AsyncHostBackend

    backend = AsyncHostBackend(seed=3)
    for scenario in ("batch", "prefix"):
        cmp = run_on(Case("qwen3"), scenario, backend)
        assert cmp.rows >= 4 and cmp.worst <= 0.1


def test_the_mirrored_path_shares_one_mirror_per_device_address() -> None:
    """Gemma 4's KV-sharing layers read their donors' pools, bound at the donors' addresses: through the cuda path's
    mirrors a consumer must read the donor's writes of the same step (one mirror per address), or it attends over
    the pool as it was before the step."""
    from tests._parity_gemma4 import CASE, run

    cmp = run(Case(CASE), "batch", "full", backend=_DeviceBehindHost())
    assert cmp.rows >= 4 and cmp.worst <= 0.1
