"""Real-graph parity of dense text models (DESIGN §17): NVIDIA's exported Qwen3 graph driven by trtio equals
Hugging Face's fp32 forward, scenario by scenario, and a wrong runtime input fails the check."""

from __future__ import annotations

import numpy as np
import pytest

from tests._parity import TEXT_SCENARIOS, Case, planted, run, when

CASES = ["qwen3"]


@pytest.mark.parametrize("scenario", list(TEXT_SCENARIOS))
@pytest.mark.parametrize("name", CASES)
def test_equals_hugging_face(name: str, scenario: str) -> None:
    cmp = run(Case(name), scenario)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


def _copy(inputs: dict[str, np.ndarray], name: str) -> np.ndarray:
    inputs[name] = np.array(inputs[name])
    return inputs[name]


def _rope_halves_swapped(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "rope_rotary_cos_sin")
    half = t.shape[1] // 2
    t[:] = np.concatenate([t[:, half:], t[:, :half]], axis=1)


def _rope_row_late(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "rope_rotary_cos_sin")
    t[1:] = t[:-1].copy()


def _past_plus_one(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "past_lengths")[:] += 1


def _sequence_lengths_plus_one(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "attention_sequence_lengths")[:] += 1


def _query_lengths_minus_one(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "query_lengths")[:] -= 1


def _logits_row_early(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "logits_indices")[:] -= 1


def _v_ids_unshifted(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "kv_page_table")
    t[:, 1] = t[:, 0]


def _pages_swapped(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "kv_page_table")
    t[[0, 1]] = t[[1, 0]]


def _context_count_in_decode(inputs: dict[str, np.ndarray]) -> None:
    inputs["context_sequence_count_carrier"] = np.zeros(inputs["query_lengths"].shape[0], np.int32)


def _cumulative_offsets(inputs: dict[str, np.ndarray]) -> None:
    lengths = inputs["query_lengths"]
    inputs["query_start_offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _phase_one_for_a_chunk(inputs: dict[str, np.ndarray]) -> None:
    inputs["execution_phase_marker"] = np.zeros(1, np.int32)


# (scenario, hook): each plants one wrong runtime input, as a trtio bug would write it.
BUGS = {
    "RoPE halves swapped": ("batch", _rope_halves_swapped),
    "RoPE rows one position late": ("batch", _rope_row_late),
    "past_lengths off by one (a chunk)": ("chunked", when(phase=2)(_past_plus_one)),
    "attention_sequence_lengths off by one (decode)": ("batch", when(phase=3)(_sequence_lengths_plus_one)),
    "query_lengths one short (prefill)": ("batch", when(phase=1)(_query_lengths_minus_one)),
    "logits row one early": ("batch", _logits_row_early),
    "V page ids not shifted by the pool": ("batch", _v_ids_unshifted),
    "two sequences' pages swapped (decode)": ("batch", when(phase=3)(_pages_swapped)),
    "a context count in decode": ("batch", when(phase=3)(_context_count_in_decode)),
    "cumulative query offsets": ("batch", when(phase=1)(_cumulative_offsets)),
    "phase 1 where a chunk over a cached prefix needs phase 2": ("chunked", when(phase=2)(_phase_one_for_a_chunk)),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_input_bug_fails_parity(bug: str) -> None:
    scenario, hook = BUGS[bug]
    how = planted(Case("qwen3"), scenario, hook)
    assert how.startswith(("mismatch", "refused"))
