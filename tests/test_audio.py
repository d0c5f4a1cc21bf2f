"""The audio component (trtio.components.audio, trtio.audio): the config reader, the log-mel and the encoder's inputs
held to Hugging Face's feature extractor and audio tower bookkeeping (stored in the qwen3-asr parity fixture: CI has
no transformers), the splice, the WAV reader, and the setup's refusals."""

from __future__ import annotations

import json
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trtio
from trtio.audio import AudioPrompt, expand_audio_pads, preprocess, read_wav, splice
from trtio.components.audio import AudioConfig, AudioFeatures
from trtio.components.audio.audio_config import conv_output_length
from trtio.components.audio.audio_setup import audio_registry
from trtio.errors import CapacityError, ConfigError, InvalidTypeError, InvalidValueError, ShapeError

FIXTURE = Path(__file__).parent / "fixtures" / "parity" / "qwen3-asr"
BUILDER = json.loads((FIXTURE / "builder_config.json").read_text())["audio"]
PREPROCESSOR = json.loads((FIXTURE / "audio" / "preprocessor_config.json").read_text())


def _data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURE / "audio" / "config.json").read_text())
    data["builder_config"] = dict(BUILDER)
    for key, value in changes.items():
        section, _, name = key.rpartition("__")
        target = data[section] if section else data
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value
    return data


@pytest.fixture(scope="module")
def cfg() -> AudioConfig:
    return AudioConfig.from_edgellm(_data(), preprocessor=PREPROCESSOR)


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(FIXTURE / "reference.npz") as data:
        return {k: data[k] for k in data.files}


def _clip(reference: dict[str, np.ndarray], i: int) -> np.ndarray:
    return reference[f"clip_{i}"].astype(np.float32) / np.float32(32768.0)


# -- the config --------------------------------------------------------------------------------------------------------


def test_the_config_reads_what_the_exporter_and_builder_write(cfg: AudioConfig) -> None:
    assert (cfg.model_type, cfg.num_mel_bins, cfg.n_window, cfg.n_window_infer, cfg.output_dim) == \
        ("qwen3_asr_thinker", 128, 50, 200, 128)
    assert (cfg.audio_token_id, cfg.audio_start_token_id, cfg.audio_end_token_id) == (500, 501, 502)
    assert (cfg.chunk_frames, cfg.chunk_tokens, cfg.window_chunks) == (100, 13, 2)
    assert (cfg.min_chunks, cfg.max_chunks, cfg.max_tokens, cfg.max_frames) == (1, 6, 78, 600)
    assert cfg.min_samples == 8000  # Qwen3ASRFeatureExtractor's min_length
    assert cfg.extras["audio_config.d_model"] == 64
    # without the feature extractor's config: the model type's extractor (Qwen3-ASR pads, Qwen3-Omni does not)
    assert AudioConfig.from_edgellm(_data()).min_samples == 8000
    assert AudioConfig.from_edgellm(_data(model_type="qwen3_omni_audio_encoder")).min_samples == 0


def test_from_dir_reads_the_folder_and_its_feature_extractor(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_data()))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(dict(PREPROCESSOR, min_length=0)))
    assert AudioConfig.from_dir(tmp_path).min_samples == 0
    with pytest.raises(InvalidTypeError, match="directory path"):
        AudioConfig.from_dir(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(("changes", "match"), [
    ({"model_type": "qwen3_omni_next_audio_encoder"}, "model_type: 'qwen3_omni_next_audio_encoder'"),
    ({"model_type": "gemma4_audio"}, "model_type: 'gemma4_audio' is not an audio encoder"),
    ({"audio_config__n_window_infer": None}, "audio_config.n_window_infer: is missing"),
    ({"audio_config__output_dim": None}, "audio_config.output_dim: is missing"),
    ({"audio_config__num_mel_bins": 80}, "audio_config.num_mel_bins: is 80; Edge-LLM's Whisper front end"),
    ({"audio_config__n_window_infer": 50}, "n_window_infer: is 50, less than a chunk"),
    ({"builder_config": None}, "builder_config: is missing"),
    ({"builder_config__max_time_steps": 50}, "min_time_steps <= max_time_steps"),
    ({"audio_token_id": None}, "audio_token_id: is missing"),
])
def test_the_config_refuses_what_it_cannot_honour(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        AudioConfig.from_edgellm(_data(**changes))


@pytest.mark.parametrize(("changes", "match"), [
    ({"sampling_rate": 24000}, "preprocessor_config.json: sampling_rate: is 24000"),
    ({"hop_length": 320}, "hop_length: is 320"),
    ({"n_fft": 512}, "n_fft: is 512"),
    ({"feature_size": 80}, "feature_size: is 80, the encoder's audio_config.num_mel_bins 128"),
    ({"dither": 1e-5}, "dither"),
    ({"n_window": 100}, "n_window: is 100"),
    ({"feature_extractor_type": "ParakeetFeatureExtractor"}, "feature_extractor_type: 'ParakeetFeatureExtractor'"),
])
def test_a_feature_extractor_trtio_cannot_equal_is_refused(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        AudioConfig.from_edgellm(_data(), preprocessor=dict(PREPROCESSOR, **changes))


def test_the_exported_llm_config_opens() -> None:
    """Its ``rope_scaling`` holds the hub's ``interleaved`` beside ``mrope_interleaved`` (tests/test_rope.py)."""
    pytest.importorskip("onnx")
    from trtio.testing import OnnxEngine

    engine = OnnxEngine.from_export(FIXTURE / "llm", json.loads((FIXTURE / "builder_config.json").read_text())["llm"])
    assert trtio.LLMEngineConfig.from_edgellm(engine.config).is_mrope  # the exported LLM config opens


# -- the features ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("i", [0, 1, 2])
def test_the_features_equal_hugging_faces(cfg: AudioConfig, reference: dict[str, np.ndarray], i: int) -> None:
    """The log-mel of each clip equals Hugging Face's ``Qwen3ASRFeatureExtractor`` (values within 1e-4: float64 here,
    float32 in torch; the frames and the padding to whole chunks exactly; the 0.3 s clip zero-padded to 0.5 s); the
    rows kept after the convolutions and the attention windows equal the audio tower's own (``valid_mask`` and
    ``get_audio_cu_seqlens``)."""
    f = preprocess(_clip(reference, i), 16000, cfg)
    want = reference[f"audio_features_{i}"]
    assert f.input_features.shape == want.shape and f.frames == int(reference[f"audio_frames_{i}"])
    np.testing.assert_allclose(f.input_features, want, rtol=0, atol=1e-4)
    steps = cfg.chunk_tokens
    np.testing.assert_array_equal(f.indices[:, 0] * steps + f.indices[:, 1], reference[f"audio_kept_rows_{i}"])
    np.testing.assert_array_equal(np.concatenate([[0], np.cumsum(f.windows)]), reference[f"audio_cu_seqlens_{i}"])
    assert f.tokens == reference[f"audio_embeds_{i}"].shape[0]
    # the mask: 0 inside each window, float16's lowest across
    starts = np.repeat(np.arange(len(f.windows)), f.windows)
    np.testing.assert_array_equal(f.attention_mask == 0, starts[:, None] == starts[None, :])
    assert f.attention_mask.dtype == np.float16
    assert float(f.attention_mask.min()) == (-65504.0 if len(f.windows) > 1 else 0.0)
    np.testing.assert_array_equal(f.padded_feature.transpose(1, 0, 2).reshape(128, -1), f.input_features)
    assert f.feature_mask.sum() == f.frames


def test_the_encoders_bookkeeping_by_hand(cfg: AudioConfig) -> None:
    """Edge-LLM's computeFeatExtractOutputLength: 13 rows a full chunk of 100, the tail (t - 1) // 2 + 1 thrice."""
    assert [conv_output_length(n) for n in (1, 2, 7, 8, 9, 50, 99, 100)] == [1, 1, 1, 1, 2, 7, 13, 13]
    mel = np.zeros((128, 250), np.float32)
    from trtio.components.audio.audio_features import features_of

    f = features_of(mel, cfg)
    assert f.chunk_tokens.tolist() == [13, 13, 7] and f.windows.tolist() == [26, 7] and f.tokens == 33
    assert f.indices[13].tolist() == [1, 0] and f.indices[-1].tolist() == [2, 6]


def test_preprocess_refuses_before_any_work(cfg: AudioConfig) -> None:
    clip = np.zeros(16000, np.float32)
    with pytest.raises(InvalidValueError, match="sample_rate 44100 Hz: qwen3_asr_thinker's feature extractor takes "
                                                "16000 Hz"):
        preprocess(clip, 44100, cfg)
    with pytest.raises(ShapeError, match="mono"):
        preprocess(np.zeros((2, 16000), np.float32), 16000, cfg)
    with pytest.raises(InvalidValueError, match=r"waveform\[3\] = nan"):
        preprocess(np.where(np.arange(16000) == 3, np.nan, 0.0), 16000, cfg)
    with pytest.raises(CapacityError, match="max_time_steps 600"):
        preprocess(np.zeros(16000 * 7, np.float32), 16000, cfg)
    omni = AudioConfig.from_edgellm(_data(model_type="qwen3_omni_audio_encoder"))
    with pytest.raises(ShapeError, match="200"):
        preprocess(np.zeros(150, np.float32), 16000, omni)
    with pytest.raises(InvalidValueError, match="AudioConfig"):
        preprocess(clip, 16000, {"n_window": 50})  # type: ignore[arg-type]
    assert preprocess(clip[None], 16000, cfg).frames == 100  # [1, n] is mono too


def test_hugging_face_live_on_odd_lengths(cfg: AudioConfig) -> None:
    """Where transformers is installed: lengths around the hop, the chunk and min_length."""
    pytest.importorskip("torch")
    extractor = pytest.importorskip("transformers.models.qwen3_asr.feature_extraction_qwen3_asr")
    fe = extractor.Qwen3ASRFeatureExtractor()
    rng = np.random.default_rng(1)
    for n in (7999, 8000, 8161, 15999, 16000, 16160, 33333):
        clip = (0.2 * rng.standard_normal(n)).astype(np.float32)
        hf = fe(clip, sampling_rate=16000, padding=True, return_attention_mask=True, n_window=50, return_tensors="np")
        f = preprocess(clip, 16000, cfg)
        assert f.frames == int(hf["attention_mask"].sum()), n
        np.testing.assert_allclose(f.input_features, hf["input_features"][0], rtol=0, atol=1e-4)


# -- the splice --------------------------------------------------------------------------------------------------------


def test_the_splice_expands_each_pad_and_writes_the_rows(cfg: AudioConfig) -> None:
    table = np.arange(512 * 128, dtype=np.float32).reshape(512, 128) / 1000
    rows = [np.full((3, 128), 7.0, np.float32), np.full((2, 128), 9.0, np.float32)]
    ids = [5, 501, 500, 502, 6, 501, 500, 502]
    p = splice(ids, cfg, table, rows)
    want = [5, 501, 500, 500, 500, 502, 6, 501, 500, 500, 502]
    assert p.token_ids.tolist() == [want]
    assert p.inputs_embeds.shape == (1, 11, 128) and p.inputs_embeds.dtype == np.float32
    np.testing.assert_array_equal(p.inputs_embeds[0, 2:5], 7.0)
    np.testing.assert_array_equal(p.inputs_embeds[0, 8:10], 9.0)
    np.testing.assert_array_equal(p.inputs_embeds[0, [0, 1, 5, 6, 7, 10]], table[[5, 501, 502, 6, 501, 502]])
    assert p.positions.tolist() == [list(range(11))] and p.context_lengths.tolist() == [11]
    assert p.mrope_positions.shape == (3, 1, 11) and (p.mrope_positions == p.positions).all()
    assert p.rope_deltas.tolist() == [0]
    text = splice([7, 8], cfg, table)
    both = AudioPrompt.stack([p, text])
    assert both.token_ids.shape == (2, 11) and both.context_lengths.tolist() == [11, 2]
    assert both.positions[1].tolist() == [0, 1] + [0] * 9
    assert expand_audio_pads([1, 500], [4], cfg).tolist() == [1, 500, 500, 500, 500]


def test_the_splice_refuses_pads_and_rows_that_do_not_pair(cfg: AudioConfig) -> None:
    table = np.zeros((512, 128), np.float16)
    row = np.zeros((3, 128), np.float32)
    with pytest.raises(ShapeError, match=r"2 audio pad\(s\) \(token 500\) for 1 clip"):
        splice([500, 500], cfg, table, row)
    with pytest.raises(ShapeError, match=r"0 audio pad\(s\)"):
        splice([1, 2], cfg, table, row)
    with pytest.raises(ShapeError, match="output_dim 128"):
        splice([500], cfg, np.zeros((512, 64), np.float16), row)
    with pytest.raises(ShapeError, match=r"audio_embeds\[0\]: expected \[N, 128\]"):
        splice([500], cfg, table, np.zeros((3, 64), np.float32))
    with pytest.raises(ShapeError, match="outside the 512-row embedding"):
        splice([600, 500], cfg, table, row)
    with pytest.raises(ShapeError, match="no prompts"):
        AudioPrompt.stack([])


# -- the WAV reader ----------------------------------------------------------------------------------------------------


def _wav(path: Path, samples: np.ndarray, *, rate: int = 16000, channels: int = 1, width: int = 2) -> Path:
    with wave.open(str(path), "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(width)
        f.setframerate(rate)
        f.writeframes(samples.tobytes())
    return path


def test_read_wav_gives_the_samples_preprocess_takes(tmp_path: Path, cfg: AudioConfig,
                                                     reference: dict[str, np.ndarray]) -> None:
    pcm = reference["clip_1"]
    samples, rate = read_wav(_wav(tmp_path / "a.wav", pcm))
    assert rate == 16000 and samples.dtype == np.float32
    np.testing.assert_array_equal(samples, _clip(reference, 1))
    np.testing.assert_allclose(preprocess(samples, rate, cfg).input_features, reference["audio_features_1"],
                               rtol=0, atol=1e-4)


def test_read_wav_refuses_what_it_does_not_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="8-bit samples"):
        read_wav(_wav(tmp_path / "b.wav", np.zeros(10, np.uint8), width=1))
    with pytest.raises(ConfigError, match="2 channels"):
        read_wav(_wav(tmp_path / "c.wav", np.zeros(20, np.int16), channels=2))
    (tmp_path / "d.wav").write_bytes(b"not a wav file at all")
    with pytest.raises(ConfigError, match="not a PCM WAV file"):
        read_wav(tmp_path / "d.wav")
    with pytest.raises(ConfigError, match="cannot be read"):
        read_wav(tmp_path / "missing.wav")


# -- the setup ---------------------------------------------------------------------------------------------------------


def test_the_registry_matches_the_exported_graph(cfg: AudioConfig) -> None:
    """Names, dtypes, ranks and fixed widths as the exporter wrote the graph (no cu_seqlens / kv_lengths: the
    0.11 exporter's TensorRT-attention path for Qwen3-ASR raises)."""
    onnx = pytest.importorskip("onnx")
    from trtio._dtypes import DType

    graph = onnx.load(str(FIXTURE / "audio" / "model.onnx"), load_external_data=False).graph
    onnx_dtypes = {1: DType.FLOAT32, 6: DType.INT32, 7: DType.INT64, 10: DType.FLOAT16}
    declared = {v.name: (io, onnx_dtypes[v.type.tensor_type.elem_type],
                         tuple(d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim))
                for io, values in (("input", graph.input), ("output", graph.output)) for v in values}
    mine = {s.name: (s.io, s.dtype, s.engine_shape) for s in audio_registry(cfg)}
    assert mine == declared
    with_seqlens = audio_registry(cfg, {"cu_seqlens", "kv_lengths"})
    assert [s.name for s in with_seqlens if s.optional] == ["cu_seqlens", "kv_lengths"]


def test_the_setup_refuses_features_the_engine_cannot_take(cfg: AudioConfig, reference: dict[str, np.ndarray]) -> None:
    pytest.importorskip("onnx")
    from trtio.testing import OnnxEngine

    engine = OnnxEngine.from_export(FIXTURE / "audio", BUILDER)
    small = AudioConfig.from_edgellm(_data(builder_config__max_time_steps=200), preprocessor=PREPROCESSOR)
    with trtio.components.audio.create_for_audio(engine, cfg) as setup:
        f = preprocess(_clip(reference, 2), 16000, cfg)
        rows = setup.encode(f)
        assert rows.shape == (7, 128) and rows.dtype is trtio.DType.FLOAT16
        with pytest.raises(InvalidTypeError, match="AudioFeatures"):
            setup.encode(f.input_features)  # type: ignore[arg-type]
        other = AudioFeatures(np.zeros((128, 200), np.float32), 150, 200, np.array([7], np.int64),
                              f.indices, f.windows, f.attention_mask)
        with pytest.raises(ShapeError, match="chunks of 200"):
            setup.encode(other)
        broken = AudioFeatures(f.input_features, f.frames, 100, np.array([6], np.int64), f.indices, f.windows,
                               f.attention_mask)
        with pytest.raises(ShapeError, match="disagree"):
            setup.encode(broken)
        assert "AudioSetup(qwen3_asr_thinker" in repr(setup)
    long = preprocess(_clip(reference, 0), 16000, cfg)  # 3 chunks; a 200-step config takes 2
    with trtio.components.audio.create_for_audio(OnnxEngine.from_export(FIXTURE / "audio", BUILDER), small) as setup:
        with pytest.raises(CapacityError, match="1..2"):
            setup.encode(long)
    with pytest.raises(trtio.BindingError, match="padded_feature: profile 0 goes up to"):
        big = AudioConfig.from_edgellm(_data(builder_config__max_time_steps=1000), preprocessor=PREPROCESSOR)
        trtio.components.audio.create_for_audio(OnnxEngine.from_export(FIXTURE / "audio", BUILDER), big)
    with pytest.raises(InvalidTypeError, match="AudioConfig"):
        trtio.components.audio.create_for_audio(engine, {"model_type": "qwen3_asr_thinker"})  # type: ignore[arg-type]
