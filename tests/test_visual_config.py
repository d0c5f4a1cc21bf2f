"""VisualConfig (``visual/config.json`` + ``visual/preprocessor_config.json``) and a vision-language model's
EngineDir: the two ViT kinds read from what Edge-LLM 0.11's builder wrote, every other kind refused by name, and
the encoder checked against its LLM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from trtio import ConfigError, EngineDir
from trtio.components.visual.visual_config import VisualConfig

FIXTURES = Path(__file__).parent / "fixtures" / "edgellm-0.11"
QWEN25, QWEN3 = FIXTURES / "qwen25vl-visual", FIXTURES / "qwen3vl-visual"


def raw(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "visual" / "config.json").read_text())
    return data


def test_qwen2_5_vl_reads_as_its_builder_wrote_it() -> None:
    cfg = VisualConfig.from_dir(QWEN25 / "visual")
    assert cfg.model_type == "qwen2_5_vl" and cfg.has_windows and cfg.num_deepstack == 0
    assert (cfg.patch_size, cfg.temporal_patch_size, cfg.merge_size, cfg.patch_dim) == (14, 2, 2, 1176)
    assert (cfg.hidden_size, cfg.num_heads, cfg.rotary_dim, cfg.out_hidden_size) == (64, 4, 8, 128)
    assert (cfg.window_size, cfg.image_token_id, cfg.vision_start_token_id) == (112, 996, 993)
    assert (cfg.min_image_tokens, cfg.max_image_tokens, cfg.max_image_tokens_per_image) == (4, 256, 128)
    assert cfg.mrope_section == (4, 6, 6) and not cfg.mrope_interleaved
    # preprocessor_config.json: CLIP's mean and std; its own bounds (3136 .. 1003520 pixels) within the caps'
    assert cfg.image_mean == pytest.approx((0.48145466, 0.4578275, 0.40821073))
    assert cfg.image_std == pytest.approx((0.26862954, 0.26130258, 0.27577711))
    assert (cfg.min_pixels, cfg.max_pixels) == (4 * 28 * 28, 128 * 28 * 28)
    assert cfg.extras["vision_config.fullatt_block_indexes"] == [1, 3]


def test_qwen3_vl_reads_without_a_preprocessor_config() -> None:
    cfg = VisualConfig.from_dir(QWEN3 / "visual")  # the fixture holds config.json only
    assert cfg.model_type == "qwen3_vl" and not cfg.has_windows
    assert (cfg.patch_dim, cfg.grid_side, cfg.deepstack_visual_indexes) == (1536, 8, (0, 1, 2))
    assert cfg.mrope_section == (6, 5, 5) and cfg.mrope_interleaved
    assert cfg.image_mean is None and cfg.image_std is None
    assert (cfg.max_patches, cfg.max_frames, cfg.max_frame_patches) == (4096, 256, 2048)


@pytest.mark.parametrize("kind", ["internvl", "phi4mm", "qwen2_vl", "qwen3_5", "gemma4_vision", None])
def test_other_vit_kinds_are_refused_naming_the_model_type(kind: str | None) -> None:
    data = raw(QWEN3)
    data["model_type"] = kind
    with pytest.raises(ConfigError, match=f"config.json: model_type: {kind!r} is not a ViT kind trtio binds"):
        VisualConfig.from_edgellm(data)


@pytest.mark.parametrize("path, why", [
    (("builder_config",), r"builder_config: is absent; expected an object \(it holds the token caps"),
    (("builder_config", "max_image_tokens"), "builder_config.max_image_tokens: is missing"),
    (("vision_config", "num_position_embeddings"), "vision_config.num_position_embeddings: is missing"),
    (("image_token_id",), "image_token_id: is missing"),
    (("vision_config", "patch_size"), "vision_config.patch_size: is missing"),
])
def test_a_missing_key_is_named(path: tuple[str, ...], why: str) -> None:
    data = raw(QWEN3)
    node = data
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    with pytest.raises(ConfigError, match=why):
        VisualConfig.from_edgellm(data, what="visual/config.json")


@pytest.mark.parametrize("key, value, why", [
    ("num_position_embeddings", 60, "a square number"),
    ("spatial_merge_size", 0, "expected an integer >= 1"),
    ("num_heads", 3, "head size divisible by 4"),
])
def test_bad_vision_values_are_named(key: str, value: Any, why: str) -> None:
    data = raw(QWEN3)
    data["vision_config"][key] = value
    with pytest.raises(ConfigError, match=why):
        VisualConfig.from_edgellm(data)


def test_a_window_must_be_whole_merged_tokens() -> None:
    data = raw(QWEN25)
    data["vision_config"]["window_size"] = 100
    with pytest.raises(ConfigError, match="vision_config.window_size: expected a multiple of .* = 28"):
        VisualConfig.from_edgellm(data)


def test_the_preprocessing_keys_are_honoured_or_refused() -> None:
    data = raw(QWEN25)
    pre = json.loads((QWEN25 / "visual" / "preprocessor_config.json").read_text())
    with pytest.raises(ConfigError, match="preprocessor_config.json: resample: is 2; trtio resizes bicubically"):
        VisualConfig.from_edgellm(data, preprocessor={**pre, "resample": 2})
    with pytest.raises(ConfigError, match="patch_size: is 16, but the visual engine's config says 14"):
        VisualConfig.from_edgellm(data, preprocessor={**pre, "patch_size": 16})
    with pytest.raises(ConfigError, match="image_std: is missing"):
        VisualConfig.from_edgellm(data, preprocessor={k: v for k, v in pre.items() if k != "image_std"})
    cfg = VisualConfig.from_edgellm(data, preprocessor={**pre, "do_normalize": False, "min_pixels": 40000,
                                                         "max_pixels": 60000, "rescale_factor": 0.5})
    assert (cfg.do_normalize, cfg.rescale_factor, cfg.min_pixels, cfg.max_pixels) == (False, 0.5, 40000, 60000)
    wide = VisualConfig.from_edgellm(data, preprocessor={**pre, "size": {"shortest_edge": 10, "longest_edge": 10**9}})
    assert (wide.min_pixels, wide.max_pixels) == (4 * 784, 128 * 784), "the engine's caps bound the processor's"


def _copy(src: Path, tmp: Path) -> Path:
    dst = tmp / src.name
    shutil.copytree(src, dst)
    return dst


def test_engine_dir_reads_the_visual_folder() -> None:
    d = EngineDir.open(QWEN25)
    assert d.visual_config == VisualConfig.from_dir(QWEN25 / "visual")
    assert d.engine_path("visual") == QWEN25 / "visual" / "visual.engine"
    assert d.engine_paths == (QWEN25 / "llm.engine", QWEN25 / "visual" / "visual.engine")
    assert "visual='qwen2_5_vl'" in repr(d)
    text = EngineDir.open(FIXTURES / "qwen3-tiny-llm")
    assert text.visual_config is None
    with pytest.raises(ConfigError, match="has no vision encoder"):
        text.engine_path("visual")


@pytest.mark.parametrize("edit, why", [
    (lambda v, llm: v["vision_config"].__setitem__("out_hidden_size", 64),
     "vision_config.out_hidden_size: is 64, but the LLM's hidden_size is 128"),
    (lambda v, llm: v["vision_config"].__setitem__("deepstack_visual_indexes", [0, 1]),
     "gives 2 deepstack feature.* the LLM takes num_deepstack_features = 3"),
    (lambda v, llm: v["rope_scaling"].__setitem__("mrope_section", [4, 6, 6]),
     r"rope_scaling.mrope_section: is \[4, 6, 6\], the LLM's is \[6, 5, 5\]"),
    (lambda v, llm: v.__setitem__("image_token_id", 7), "image_token_id: is 7, the LLM's config says 996"),
    (lambda v, llm: llm.__setitem__("rope_scaling", None), "the LLM's RoPE is not MRoPE"),
])
def test_the_encoder_must_fit_its_llm(tmp_path: Path, edit: Any, why: str) -> None:
    folder = _copy(QWEN3, tmp_path)
    v, llm = raw(folder), json.loads((folder / "config.json").read_text())
    edit(v, llm)
    (folder / "visual" / "config.json").write_text(json.dumps(v))
    (folder / "config.json").write_text(json.dumps(llm))
    with pytest.raises(ConfigError, match=why):
        EngineDir.open(folder)


def test_a_directory_with_another_vit_is_refused_at_open(tmp_path: Path) -> None:
    folder = _copy(QWEN3, tmp_path)
    v = raw(folder)
    v["model_type"] = "qwen2_vl"
    (folder / "visual" / "config.json").write_text(json.dumps(v))
    with pytest.raises(ConfigError, match=r"visual/config.json: model_type: 'qwen2_vl' is not a ViT kind"):
        EngineDir.open(folder)
