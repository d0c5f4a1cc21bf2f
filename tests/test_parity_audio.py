"""Real-graph parity of a speech model (DESIGN §17): NVIDIA's exported Qwen3-ASR pair (the audio encoder graph, no
plugins; the LLM graph, dense Qwen3 fed through ``inputs_embeds``) driven by trtio's preprocessing, audio setup,
splice and LLM setup equals Hugging Face's feature extractor, audio tower and full Qwen3-ASR forward, and wrong
runtime inputs fail the check (tests/_parity_audio.py)."""

from __future__ import annotations

import pytest

from tests._parity import Case
from tests._parity_audio import (
    SCENARIOS,
    audio_as_one_position,
    mel_frame_late,
    one_window,
    planted,
    rows_spliced_late,
    run,
    tail_rows_shifted,
    windows_of_one_chunk,
)

CASE = "qwen3-asr"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_equals_hugging_face(scenario: str) -> None:
    cmp = run(Case(CASE), scenario)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


# (scenario, LLM hook factory or None, audio encoder hook or None): each plants one wrong runtime input. Windows of one
# chunk move the encoder rows by 0.057 std (5.7 x its tolerance) but the tiny LLM's logits by 0.079 only: the encoder
# check is the one that sees it.
BUGS = {
    "the mel one frame late": ("encoder", None, mel_frame_late),
    "attention windows of one chunk": ("encoder", None, windows_of_one_chunk),
    "one attention window over the clip": ("encoder", None, one_window),
    "the last chunk's rows one off": ("encoder", None, tail_rows_shifted),
    "the mel one frame late, seen in the logits": ("asr", None, mel_frame_late),
    "one attention window over the clip, seen in the logits": ("asr", None, one_window),
    "the audio rows spliced one token late": ("asr", rows_spliced_late, None),
    "the clip counted as one position": ("asr", audio_as_one_position, None),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_input_bug_fails_parity(bug: str) -> None:
    scenario, llm_bug, audio_bug = BUGS[bug]
    case = Case(CASE)
    how = planted(case, scenario, hook=llm_bug(case) if llm_bug else None, audio_hook=audio_bug)
    assert how.startswith(("mismatch", "refused"))


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_equals_hugging_face_on_the_cuda_backend(scenario: str, graphs: bool) -> None:
    """The same on device memory: both graphs run in CUDA host functions between stream-ordered copies, also
    replayed from CUDA graphs."""
    cmp = run(Case(CASE), scenario, backend="cuda", graphs=graphs)
    assert cmp.rows >= 4 and cmp.worst <= 0.1
