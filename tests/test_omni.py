"""Qwen3-Omni's directory (``tests/_omni_dir.py``: the thinker, ``visual/``, ``audio/`` and the speech output's
``talker/``, ``code_predictor/``, ``code2wav/``, as Edge-LLM 0.11's builder lays them out): the speech output is
refused, each folder named; ``components=("llm", "visual", "audio")`` opens the thinker with its two encoders, the
vision encoder (``qwen3_omni_vision_encoder``) bound as Qwen3-VL's ViT and the audio encoder as Qwen3-ASR's."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trtio
from tests._omni_dir import SPEECH_OUTPUT, omni_directory
from tests._parity import Case
from trtio import BindingError, ConfigError, EngineDir, LLMEngineConfig
from trtio._setups import engine_dir
from trtio.audio import preprocess
from trtio.components.audio import AudioSetup
from trtio.components.visual.visual_config import VisualConfig
from trtio.components.visual.vit import vit_registry
from trtio.errors import UnknownNameError
from trtio.testing import ReferenceEngine
from trtio.testing.reference_visual import ReferenceVisualEngine

ENCODERS = ("llm", "visual", "audio")


@pytest.fixture
def omni(tmp_path: Path) -> Path:
    # the audio engine run below is the Qwen3-ASR parity export (Qwen3-Omni's audio graph has its I/O): its caps
    return omni_directory(tmp_path / "omni", audio_builder={"max_time_steps": 600})


def test_the_speech_output_is_refused_naming_each_folder(omni: Path) -> None:
    with pytest.raises(ConfigError) as info:
        EngineDir.open(omni)
    assert "holds engines beside the LLM (code2wav/, code_predictor/, talker/) that trtio does not bind" in \
        str(info.value)
    assert "components=('llm',)" in str(info.value)
    for kept in SPEECH_OUTPUT:  # each folder alone is named too
        shutil.rmtree(omni / "one", ignore_errors=True)
        one = omni_directory(omni / "one", speech_output=(kept,))
        with pytest.raises(ConfigError, match=rf"holds an engine beside the LLM \({kept}/\) that trtio does not bind"):
            EngineDir.open(one)


def test_create_from_engine_dir_refuses_the_speech_output_before_loading_an_engine(
        omni: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an engine was loaded")

    monkeypatch.setattr(engine_dir, "load_engine", never)
    with pytest.raises(ConfigError, match=r"\(code2wav/, code_predictor/, talker/\)"):
        trtio.create_from_engine_dir(omni, backend="host")


def test_the_thinker_opens_with_its_two_encoders(omni: Path) -> None:
    d = EngineDir.open(omni, components=ENCODERS)
    vcfg, acfg = d.visual_config, d.audio_config
    assert vcfg.model_type == "qwen3_omni_vision_encoder" and acfg.model_type == "qwen3_omni_audio_encoder"
    assert vcfg.num_deepstack == d.config.num_deepstack_features == 2 and vcfg.mrope_interleaved
    assert vcfg.extras["vision_config.position_id_per_seconds"] == 25, "kept (video only), not read"
    assert acfg.min_samples == 0, "Qwen3-Omni's WhisperFeatureExtractor does not pad a short clip"
    assert {p.parent.name for p in d.engine_paths} == {"omni", "visual", "audio"}, "no speech-output engine listed"
    assert EngineDir.open(omni, components=("llm", "audio")).visual_config is None


def test_the_omni_vision_encoder_binds_as_qwen3_vls(omni: Path) -> None:
    """Edge-LLM exports it with Qwen3-VL's module: every binding (name, dtype, shape, profile) is Qwen3-VL's."""
    vcfg = EngineDir.open(omni, components=ENCODERS).visual_config
    assert isinstance(vcfg, VisualConfig)
    as_vl = dataclasses.replace(vcfg, model_type="qwen3_vl")
    mine, theirs = vit_registry(vcfg), vit_registry(as_vl)
    assert [(s.name, s.dtype, s.shape, s.profiles) for s in mine] == \
        [(s.name, s.dtype, s.shape, s.profiles) for s in theirs]
    assert {"deepstack_features_0", "deepstack_features_1"} <= {s.name for s in mine}


def _loader(d: EngineDir, loaded: list[str]) -> Any:
    case = Case("qwen3-asr")
    engines = {
        d.engine_path("llm"): lambda: ReferenceEngine.from_config(d.config, device="host", null_compute=True),
        d.engine_path("visual"): lambda: ReferenceVisualEngine.from_config(d.visual_config, device="host",
                                                                           null_compute=True),
        d.engine_path("audio"): lambda: case.engine("audio", "host"),
    }

    def load(path: Any, module: Any = "auto", *, plugins: Any = ()) -> Any:
        if Path(path) not in engines:
            raise UnknownNameError(f"{path} is not an engine of {d.path}")
        loaded.append(Path(path).name)
        return engines[Path(path)]()

    return load


def test_create_from_engine_dir_attaches_both_encoders_to_the_thinker(omni: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The thinker (a null-compute double of its config) with the ViT (a double) and the audio encoder (NVIDIA's
    exported Qwen3-ASR audio graph: Qwen3-Omni's has its inputs and outputs) attached; a clip encodes through it."""
    d = EngineDir.open(omni, components=ENCODERS)
    loaded: list[str] = []
    monkeypatch.setattr(engine_dir, "load_engine", _loader(d, loaded))
    with trtio.create_from_engine_dir(omni, backend="host", components=ENCODERS) as setup:
        assert isinstance(setup, trtio.LLMSetup) and isinstance(setup.audio, AudioSetup)
        assert setup.visual is not None and setup.visual.cfg.model_type == "qwen3_omni_vision_encoder"
        clip = np.sin(np.arange(8000, dtype=np.float32) * 0.05) * 0.1  # 0.5 s: no padding for Whisper's extractor
        rows = setup.audio.encode(preprocess(clip, 16000, setup.audio.cfg)).to_numpy()
        assert rows.shape == (7, 128) and np.isfinite(rows).all()
    assert sorted(loaded) == ["audio_encoder.engine", "llm.engine", "visual.engine"]


def test_a_thinker_graph_with_three_deepstack_inputs_is_refused_by_name(omni: Path) -> None:
    """Edge-LLM's divergence: the builder writes ``num_deepstack_features`` 2 (the tower's deepstack layers) where the
    thinker graph declares ``deepstack_embeds_0..2``; trtio refuses the third input by name rather than leave it
    unbound."""
    d = EngineDir.open(omni, components=ENCODERS)
    three = LLMEngineConfig.from_edgellm(dict(d.raw("llm"), num_deepstack_features=3))
    engine = ReferenceEngine.from_config(three, device="host", null_compute=True)
    with pytest.raises(BindingError, match="deepstack_embeds_2: the engine declares this input"):
        trtio.create_for_llm(engine, d.config, backend="host")
