"""The component table (trtio/components/component_table.py, docs/architecture.md "Families and components"): an
Edge-LLM directory's engines beside the LLM are read and attached by the components the table binds; a folder
holding an engine no component binds is refused, naming it, rather than left out; ``components=`` opens what is
named and only that.

The speech model's directory is Qwen3-ASR's as Edge-LLM 0.11 writes it (``tests/fixtures/edgellm-0.11/qwen3-asr``:
the LLM's ``config.json`` and the audio encoder's ``audio/config.json``): the table's audio component binds it
(``tests/test_audio_component.py``). The folders no component binds are Qwen3-Omni's speech output (``talker/``,
``code_predictor/``, ``code2wav/``: ``tests/test_omni.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import trtio
from trtio import ConfigError, EngineDir
from trtio._setups import engine_dir
from trtio.testing import ReferenceEngine
from trtio.testing.toy_engines import VisionToyEngines

ASR = Path(__file__).parent / "fixtures" / "edgellm-0.11" / "qwen3-asr"


def _llm_alone(directory: Path) -> Any:
    """A stand-in for load_engine giving the directory's llm.engine a null-compute reference engine, and refusing to
    load any other engine (nothing beside the LLM may be opened)."""
    cfg = EngineDir.open(directory, components=("llm",)).config

    def load(path: Any, module: Any = "auto", *, plugins: Any = ()) -> Any:
        assert Path(path).name == "llm.engine", f"{path} was loaded, but only the LLM was asked for"
        return ReferenceEngine.from_config(cfg, device="host", null_compute=True)

    return load


def test_a_directory_holding_audio_opens_with_its_audio_encoder() -> None:
    d = EngineDir.open(ASR)
    assert list(d.components) == ["audio"] and d.audio_config is not None and d.visual_config is None
    assert d.engine_paths == (ASR / "llm.engine", ASR / "audio" / "audio_encoder.engine")


def test_a_directory_holding_audio_opens_with_the_llm_alone() -> None:
    d = EngineDir.open(ASR, components=("llm",))
    assert d.kind == "llm" and d.components == {} and d.visual_config is None and d.audio_config is None
    assert d.engine_paths == (ASR / "llm.engine",), "nothing beside the LLM is listed"


def test_create_from_engine_dir_opens_the_llm_alone_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_dir, "load_engine", _llm_alone(ASR))
    with pytest.raises(AssertionError, match="audio_encoder.engine was loaded, but only the LLM was asked for"):
        trtio.create_from_engine_dir(ASR, backend="host")
    with trtio.create_from_engine_dir(ASR, backend="host", components=("llm",)) as setup:
        assert isinstance(setup, trtio.LLMSetup) and setup.visual is None and setup.audio is None


# Qwen3-Omni's speech output; Alpamayo-R1's action expert; Cosmos3's policy (Diffusers subfolders: a config alone)
@pytest.mark.parametrize("folder, file", [("talker", "llm.engine"), ("code_predictor", "code_predictor.engine"),
                                          ("code2wav", "code2wav.engine"), ("action", "action.engine"),
                                          ("und_prefill", "config.json"), ("gen", "config.json"),
                                          ("vae_encoder", "config.json")])
def test_every_engine_folder_no_component_binds_is_refused(tmp_path: Path, folder: str, file: str) -> None:
    d = tmp_path / "omni"
    shutil.copytree(ASR, d, ignore=shutil.ignore_patterns("audio"))
    (d / folder).mkdir()
    (d / folder / file).write_text("{}")
    with pytest.raises(ConfigError, match=rf"holds an engine beside the LLM \({folder}/\) that trtio does not "
                                          rf"bind \(its component table binds \['audio', 'visual'\]\)") as info:
        EngineDir.open(d)
    assert info.value.field == str(d / folder)
    assert "components=('llm',)" in str(info.value), "the message says how to open the LLM alone"
    assert EngineDir.open(d, components=("llm",)).kind == "llm"
    (d / "notes").mkdir()  # a folder holding no engine and no config is none of the directory's engines
    (d / "notes" / "readme.txt").write_text("")
    assert EngineDir.open(d, components=("llm",)).components == {}


def test_components_names_what_to_open_and_refuses_what_no_component_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    toys = VisionToyEngines.load()
    root = toys.directory.path
    assert EngineDir.open(root).visual_config is not None
    assert EngineDir.open(root, components=("llm", "visual")).visual_config is not None
    assert EngineDir.open(root, components=("llm",)).visual_config is None
    with pytest.raises(ConfigError, match=r"components: 'talker' is not a component trtio binds \(it binds \['llm', "
                                          r"'visual', 'audio'\]\)"):
        EngineDir.open(root, components=("llm", "talker"))
    assert EngineDir.open(root, components=("llm", "audio")).visual_config is None, "only what is named opens"
    with pytest.raises(trtio.InvalidTypeError, match="components: expected a sequence of component names"):
        EngineDir.open(root, components="llm")
    monkeypatch.setattr(engine_dir, "load_engine", toys.loader(device="host"))
    with trtio.create_from_engine_dir(root, backend="host", components=("llm",)) as setup:
        assert setup.visual is None, "the encoder is not opened where only the LLM is asked for"
