"""Test helper: a Qwen3-Omni engine directory as Edge-LLM 0.11's builder lays it out
(``reference/edge-llm-0.11-families-2.md`` §3 in the project's shared notes), assembled from the committed fixture
configs of the parts it shares with other families: the thinker's ``config.json`` is the Qwen3-ASR fixture's LLM
config with the thinker's model type, experts and vision token ids (the builder writes ``num_deepstack_features`` 2,
the length of the tower's ``deepstack_visual_indexes``, where the thinker graph declares three ``deepstack_embeds``);
``visual/config.json`` is the Qwen3-VL fixture's ViT config under the exporter's ``qwen3_omni_vision_encoder`` model
type (the exporter builds it with Qwen3-VL's ``Qwen3VLVisualModel``); ``audio/config.json`` the Qwen3-ASR fixture's
under ``qwen3_omni_audio_encoder``; ``talker/``, ``code_predictor/`` and ``code2wav/`` hold the configs' keys the notes
list and empty engine files (nothing here runs them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures" / "edgellm-0.11"
SPEECH_OUTPUT = ("talker", "code_predictor", "code2wav")
# The thinker's vision token ids (distinct from the audio ones the Qwen3-ASR fixture uses: 993-996).
VISION_IDS = {"image_token_id": 985, "video_token_id": 986, "vision_start_token_id": 987, "vision_end_token_id": 988}


def _read(*parts: str) -> Any:
    return json.loads(FIXTURES.joinpath(*parts).read_text())


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


def thinker_config() -> dict[str, Any]:
    cfg: dict[str, Any] = _read("qwen3-asr", "config.json")
    cfg.update(model="qwen3_omni_moe_text", num_deepstack_features=2, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=64, enable_moe_block=False, **VISION_IDS)
    return cfg


def visual_config() -> dict[str, Any]:
    cfg: dict[str, Any] = _read("qwen3vl-visual", "visual", "config.json")
    cfg["model_type"] = "qwen3_omni_vision_encoder"
    vision = dict(cfg["vision_config"], model_type="qwen3_omni_vision_encoder", deepstack_visual_indexes=[0, 1],
                  position_id_per_seconds=25)
    cfg.update(vision_config=vision, rope_theta=1000000.0, **VISION_IDS)
    cfg["text_config"] = dict(cfg["text_config"], rope_theta=1000000.0)
    return cfg


def audio_config(builder: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = _read("qwen3-asr", "audio", "config.json")
    cfg["model_type"] = "qwen3_omni_audio_encoder"
    if builder is not None:
        cfg["builder_config"] = dict(cfg["builder_config"], **builder)
    return cfg


def omni_directory(root: Path, *, speech_output: tuple[str, ...] = SPEECH_OUTPUT,
                   audio_builder: dict[str, Any] | None = None) -> Path:
    """Write the directory at ``root`` (the folders of ``speech_output`` among them) with empty engine files."""
    _write(root / "config.json", thinker_config())
    (root / "llm.engine").write_bytes(b"")
    _write(root / "visual" / "config.json", visual_config())
    (root / "visual" / "visual.engine").write_bytes(b"")
    _write(root / "audio" / "config.json", audio_config(audio_builder))
    (root / "audio" / "audio_encoder.engine").write_bytes(b"")
    sidecars = {
        "talker": ({"model": "qwen3_omni_moe_talker", "accept_hidden_layer": 2, "thinker_hidden_size": 128,
                    "text_vocab_size": 1000, "speaker_id": {"default": 0}, "default_speaker_id": 0}, "llm.engine"),
        "code_predictor": ({"model": "qwen3_omni_moe_code_predictor", "use_embeddings_input": True,
                            "num_code_groups": 4}, "llm.engine"),
        "code2wav": ({"model_type": "qwen3_omni_code2wav", "num_quantizers": 4, "codec_chunk_frames": 10},
                     "code2wav.engine"),
    }
    for folder in speech_output:
        data, engine = sidecars[folder]
        _write(root / folder / "config.json", data)
        (root / folder / engine).write_bytes(b"")
    return root
