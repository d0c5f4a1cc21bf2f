"""The audio component in the component table (trtio/components/audio/audio_component.py): ``EngineDir.audio_config``
read and checked against the LLM's config, ``create_from_engine_dir`` attaching the audio encoder as ``setup.audio``,
and ``trtio generate --audio FILE.wav``: run on NVIDIA's real Qwen3-ASR export (the parity fixture's ONNX graphs laid
out as an engine directory, ``tests/_asr_dir.py``) and held to Hugging Face's audio tower and greedy tokens."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trtio
from tests._asr_dir import asr_directory, onnx_loader, write_wav
from tests._parity import TOLERANCE, Case, Compare
from tests._parity_audio import ENCODER_TOLERANCE
from trtio import ConfigError, EngineDir
from trtio._setups import engine_dir
from trtio.audio import preprocess
from trtio.components.audio import AudioSetup

ASR = Path(__file__).parent / "fixtures" / "edgellm-0.11" / "qwen3-asr"


@pytest.fixture(scope="module")
def case() -> Case:
    return Case("qwen3-asr")


@pytest.fixture
def asr(tmp_path: Path, case: Case) -> Path:
    return asr_directory(tmp_path / "asr", case)


def test_the_audio_config_is_read_with_the_directory() -> None:
    d = EngineDir.open(ASR)
    cfg = d.audio_config
    assert cfg is not None and cfg.model_type == "qwen3_asr_thinker" and d.components == {"audio": cfg}
    assert (cfg.output_dim, cfg.audio_token_id, cfg.audio_start_token_id, cfg.audio_end_token_id) == \
        (d.config.hidden_size, 995, 993, 994)
    assert (cfg.min_time_steps, cfg.max_time_steps, cfg.n_window_infer) == (100, 6000, 800)
    assert d.engine_path("audio") == ASR / "audio" / "audio_encoder.engine"
    assert EngineDir.open(ASR, components=("llm", "audio")).audio_config == cfg


def _edit(data: dict[str, Any], dotted: str, value: Any) -> None:
    *path, key = dotted.split(".")
    for part in path:
        data = data[part]
    data[key] = value


# (file, dotted key, value, the error): each breaks one thing the audio encoder and the LLM must agree on.
MISMATCHES = [
    ("audio", "audio_config.output_dim", 64, r"audio/config.json: audio_config.output_dim: is 64, but the LLM's "
                                             r"hidden_size is 128"),
    ("audio", "audio_token_id", 990, r"audio/config.json: audio_token_id: is 990, the LLM's config says 995"),
    ("llm", "audio_start_token_id", 980, r"audio/config.json: audio_start_token_id: is 993, the LLM's config says "
                                         r"980"),
    ("llm", "audio_end_token_id", 981, r"audio_end_token_id: is 994, the LLM's config says 981"),
    ("audio", "text_config.rope_theta", 10000.0, r"audio/config.json: text_config.rope_theta: is 10000.0, the "
                                                 r"LLM's rope_theta is 1000000.0"),
    ("llm", "vocab_size", 900, r"audio/config.json: audio_token_id: is 995, outside the LLM's vocabulary "
                               r"\(vocab_size 900\)"),
]


@pytest.mark.parametrize(("file", "key", "value", "error"), MISMATCHES, ids=[m[1] for m in MISMATCHES])
def test_an_audio_config_that_does_not_fit_the_llm_is_refused(tmp_path: Path, file: str, key: str, value: Any,
                                                              error: str) -> None:
    d = shutil.copytree(ASR, tmp_path / "asr")
    target = d / ("audio/config.json" if file == "audio" else "config.json")
    data = json.loads(target.read_text())
    _edit(data, key, value)
    target.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=error):
        EngineDir.open(d)
    assert EngineDir.open(d, components=("llm",)).audio_config is None, "the LLM alone still opens"


@pytest.mark.parametrize("backend", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_create_from_engine_dir_attaches_the_real_audio_encoder(asr: Path, case: Case, backend: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The real export's directory gives the LLM's setup with its audio encoder attached (on the setup's backend);
    the clip encoded through ``setup.audio`` equals Hugging Face's audio tower (the parity check's tolerance), and
    closing the setup closes it."""
    loaded: list[str] = []
    monkeypatch.setattr(engine_dir, "load_engine", onnx_loader(asr, case, loaded, backend))
    with trtio.create_from_engine_dir(asr, backend=backend) as setup:
        assert isinstance(setup, trtio.LLMSetup) and isinstance(setup.audio, AudioSetup) and setup.visual is None
        assert setup.audio.cfg == EngineDir.open(asr).audio_config
        clip = case.arrays["clip_0"].astype(np.float32) / np.float32(32768.0)
        rows = setup.audio.encode(preprocess(clip, 16000, setup.audio.cfg)).to_numpy().astype(np.float32)
        want = case.arrays["audio_embeds_0"]
        assert rows.shape == want.shape == (33, 128)
        assert float(np.abs(rows - want).max()) / max(1.0, float(want.std())) <= ENCODER_TOLERANCE
        audio = setup.audio
    assert loaded == ["llm", "audio"] and audio.is_closed, "the encoder is closed with the LLM's setup"
    loaded.clear()
    with trtio.create_from_engine_dir(asr, backend=backend, components=("llm",)) as setup:
        assert setup.audio is None and loaded == ["llm"]


def _generate(capsys: pytest.CaptureFixture[str], directory: Path, prompt: str, *flags: str) -> tuple[int, str, str]:
    from trtio._cli import main

    rc = main(["generate", str(directory), "--prompt", prompt, "--max-new-tokens", "8", "--backend", "host", *flags])
    out, err = capsys.readouterr()
    return rc, out, err


def _words(ids: Any) -> str:
    return " ".join(f"t{int(i)}" for i in ids)


def test_generate_with_audio_gives_hugging_faces_greedy_tokens(asr: Path, case: Case,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``trtio generate --audio`` on the real graphs: the fixture's ``asr`` prompt (text, the audio markers around one
    pad, text) with its 2.5 s clip read from a WAV file continues with exactly Hugging Face's greedy tokens, and each
    step's logits equal Hugging Face's (the parity tolerance)."""
    monkeypatch.setattr(engine_dir, "load_engine", onnx_loader(asr, case))
    logits: list[np.ndarray] = []
    for step in ("prefill", "decode"):
        monkeypatch.setattr(trtio.LLMSetup, step, _recording(getattr(trtio.LLMSetup, step), logits))
    (seq,) = case.of("asr")
    wav = write_wav(asr / "clip.wav", case.arrays["clip_0"], case.meta["sample_rate"])
    prompt = _words(case.arrays["prompt_ids_0"])
    rc, out, err = _generate(capsys, asr, prompt, "--audio", str(wav))
    assert rc == 0 and out.startswith(prompt), err
    got = [int(t) for t in re.findall(r"t(\d+)", out[len(prompt):])]
    assert got == seq.greedy.tolist() and len(got) == 8
    assert "8 tokens in" in err
    cmp = Compare()
    for row, found in zip(range(seq.prompt_length - 1, seq.prompt_length + 7), logits):
        cmp.row(seq, row, found[0], "generate")
    assert cmp.rows == 8 and cmp.worst <= TOLERANCE


def _recording(step: Any, logits: list[np.ndarray]) -> Any:
    def record(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = step(self, *args, **kwargs)
        logits.append(out.to_numpy().copy())
        return out
    return record


def test_generate_puts_the_clip_before_the_text_between_the_audio_markers(asr: Path, case: Case,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt without the audio pad gets ``<|audio_start|> <|audio_pad|> <|audio_end|>`` before its text, the pad
    expanded to the clip's rows (as the CLI hands the prefill)."""
    from trtio._tools import generate as gen

    monkeypatch.setattr(engine_dir, "load_engine", onnx_loader(asr, case))
    seen: list[Any] = []
    monkeypatch.setattr(gen, "_greedy", lambda setup, embed, ids, sink, prompt=None: seen.append((ids, prompt)) or {})
    wav = write_wav(asr / "clip.wav", case.arrays["clip_2"], 16000)  # 0.3 s: 7 rows
    gen.run_generate(gen.GenerateOptions(asr, "t274 t458", audio=(wav,), backend="host"), out=_Null(), err=_Null())
    ((ids, prompt),) = seen
    assert ids == [501, *[500] * 7, 502, 274, 458]
    np.testing.assert_array_equal(prompt.token_ids[0], ids)


class _Null:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def test_bad_audio_input_is_refused_before_any_engine(asr: Path, tmp_path: Path, case: Case,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an engine was loaded")

    monkeypatch.setattr(engine_dir, "load_engine", never)
    wav = write_wav(tmp_path / "clip.wav", case.arrays["clip_2"], 16000)
    stereo = tmp_path / "stereo.wav"
    import wave

    with wave.open(str(stereo), "wb") as f:
        f.setnchannels(2)
        f.setsampwidth(2)
        f.setframerate(16000)
        f.writeframes(np.zeros(200, "<i2").tobytes())
    text = shutil.copytree(asr, tmp_path / "text", ignore=shutil.ignore_patterns("audio"))
    bare = shutil.copytree(asr, tmp_path / "bare", ignore=shutil.ignore_patterns("*.engine"))
    fast = write_wav(tmp_path / "fast.wav", case.arrays["clip_2"], 8000)
    cases = [
        ((asr, "--audio", str(stereo)), f"{stereo}: holds 2 channels"),
        ((asr, "--audio", str(tmp_path / "none.wav")), "--audio " + str(tmp_path / "none.wav") + ": no such file"),
        ((asr, "--audio", str(fast)), "sample_rate"),
        ((asr, "--audio", str(wav), "--image", str(wav)), "--audio: given with --image: the positions Edge-LLM's "
                                                           "runner gives audio and images in one prompt"),
        ((text, "--audio", str(wav)), f"--audio: {text} has no audio encoder"),
        ((bare, "--audio", str(wav)), f"--audio: needs the directory's engine files; {bare} lacks"),
    ]
    for (directory, *flags), needle in cases:
        rc, out, err = _generate(capsys, directory, "t1", *flags)
        assert rc != 0 and needle in err, (flags, err)
