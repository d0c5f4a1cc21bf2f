"""InternVL 3.5's vision encoder as a kind of the visual component: its directory read and checked against the LLM's
(``tests/fixtures/edgellm-0.11/internvl``: the configs Edge-LLM 0.11's builder wrote), the tiling rule, the token
expansion and splice, and the encoder setup's refusals (on the parity fixture's exported graph). Equality with Hugging
Face's processor and model is ``tests/test_parity_internvl.py``'s."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trtio
from trtio.components.visual.internvl_config import InternVLConfig
from trtio.components.visual.internvl_images import ImagePrompt, expand_image_tokens, tile_grid, tiles_of
from trtio.edgellm import EngineDir
from trtio.errors import CapacityError, ConfigError, ShapeError
from trtio.testing import OnnxEngine
from trtio.vision import preprocess, splice

FIXTURES = Path(__file__).parent / "fixtures"
INTERNVL = FIXTURES / "edgellm-0.11" / "internvl"
PARITY = FIXTURES / "parity" / "internvl"


def raw() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((INTERNVL / "visual" / "config.json").read_text())
    return data


def _copy(tmp: Path) -> Path:
    dst = tmp / "internvl"
    shutil.copytree(INTERNVL, dst)
    return dst


def test_engine_dir_reads_the_internvl_encoder() -> None:
    """The builder's directory opens with an InternVL config: 256 rows a 448-pixel tile, the engine's tile range from
    the token caps, and (no preprocessor file) Edge-LLM's own tile bounds and ImageNet statistics."""
    d = EngineDir.open(INTERNVL)
    cfg = d.visual_config
    assert isinstance(cfg, InternVLConfig) and cfg.kind == "internvl"
    assert (cfg.image_size, cfg.patch_size, cfg.tokens_per_tile, cfg.out_hidden_size) == (448, 14, 256, 128)
    assert (cfg.image_token_id, cfg.img_start_token_id, cfg.img_end_token_id) == (997, 993, 994)
    # max_image_tokens_per_image 512 -> 512 // 256 - 1 = 1 tile; max_image_tokens 1024 -> 4 tiles a call
    assert (cfg.min_tiles, cfg.max_tiles, cfg.min_engine_tiles, cfg.max_engine_tiles) == (1, 1, 1, 4)
    assert cfg.image_mean == (0.485, 0.456, 0.406) and cfg.image_std == (0.229, 0.224, 0.225)


@pytest.mark.parametrize("edit, why", [
    (lambda v, llm: v["text_config"].__setitem__("hidden_size", 64), "text_config.hidden_size: is 64, but the LLM's"),
    (lambda v, llm: v.__setitem__("image_token_id", 7), "image_token_id: is 7, the LLM's config says 997"),
    (lambda v, llm: v["vision_config"].__setitem__("image_size", [448, 224]), "vision_config.image_size: is "
                                                                              r"\[448, 224\]; .* square"),
    (lambda v, llm: v.__setitem__("downsample_ratio", 0.3), "downsample_ratio: expected 1 / n"),
    (lambda v, llm: v["builder_config"].__setitem__("max_image_tokens_per_image", 2048), "builder_config: expected"),
    (lambda v, llm: v.pop("image_token_id"), "image_token_id: is missing"),
    (lambda v, llm: llm.__setitem__("num_deepstack_features", 2), "gives no deepstack features"),
])
def test_the_encoder_must_fit_its_llm(tmp_path: Path, edit: Any, why: str) -> None:
    folder = _copy(tmp_path)
    v, llm = raw(), json.loads((folder / "config.json").read_text())
    edit(v, llm)
    (folder / "visual" / "config.json").write_text(json.dumps(v))
    (folder / "config.json").write_text(json.dumps(llm))
    with pytest.raises(ConfigError, match=why):
        EngineDir.open(folder)


@pytest.mark.parametrize("key, value, why", [
    ("resample", 2, "resample: is 2; trtio resizes bicubically"),
    ("size", {"height": 384, "width": 384}, "size: is .*, but the visual engine's tiles are 448 x 448"),
    ("image_mean", [0.5, 0.5], "image_mean: expected 3 numbers"),
    ("do_center_crop", True, "do_center_crop: is set"),
    ("max_patches", 0, "max_patches: expected an integer >= 1"),
])
def test_the_processor_config_is_honoured_or_refused(key: str, value: Any, why: str) -> None:
    pre = json.loads((PARITY / "visual" / "preprocessor_config.json").read_text())
    cfg = InternVLConfig.from_edgellm(raw(), preprocessor=pre)
    assert (cfg.min_tiles, cfg.max_tiles, cfg.crop_to_patches) == (pre["min_patches"], pre["max_patches"], True)
    pre[key] = value
    with pytest.raises(ConfigError, match=f"preprocessor_config.json: {why}"):
        InternVLConfig.from_edgellm(raw(), preprocessor=pre)


def test_the_tile_grid_follows_the_aspect_ratio_and_hugging_faces_tie_break() -> None:
    cfg = dataclasses.replace(EngineDir.open(INTERNVL).visual_config, min_tiles=1, max_tiles=6)
    assert tile_grid(100, 100, cfg) == (1, 1) and tiles_of(100, 100, cfg) == 1  # one tile: no thumbnail
    assert tile_grid(100, 200, cfg) == (2, 1) and tiles_of(100, 200, cfg) == 3  # two tiles and the thumbnail
    assert tile_grid(300, 100, cfg) == (1, 3)
    # width / height 2.5: (2, 1) and (3, 1) are equally close; the larger grid wins only for an image whose area
    # exceeds half its pixels (3 * 448 * 448 / 2 = 301056)
    assert tile_grid(40, 100, cfg) == (2, 1)
    assert tile_grid(400, 1000, cfg) == (3, 1)
    assert tiles_of(400, 1000, dataclasses.replace(cfg, crop_to_patches=False)) == 1
    with pytest.raises(ShapeError, match="at least one pixel"):
        tile_grid(0, 10, cfg)


def test_expansion_and_splice() -> None:
    cfg = EngineDir.open(INTERNVL).visual_config
    assert isinstance(cfg, InternVLConfig)
    ids = np.array([5, 997, 6, 7])
    got = expand_image_tokens(ids, [2], cfg)
    assert got.tolist() == [5, 993] + [997] * 512 + [994, 6, 7]
    table = np.random.default_rng(0).standard_normal((1000, 128)).astype(np.float16)
    rows = np.random.default_rng(1).standard_normal((512, 128)).astype(np.float32)
    p = splice(ids, [2], cfg, table, rows)
    assert isinstance(p, ImagePrompt) and p.context_lengths.tolist() == [517]
    np.testing.assert_array_equal(p.inputs_embeds[0, 2:514], rows.astype(np.float16))
    np.testing.assert_array_equal(p.inputs_embeds[0, [0, 1, 514, 515, 516]], table[[5, 993, 994, 6, 7]])
    text = splice(np.array([1, 2, 3]), None, cfg, table)
    both = ImagePrompt.stack([p, text])
    assert both.inputs_embeds.shape == (2, 517, 128) and both.context_lengths.tolist() == [517, 3]
    with pytest.raises(ShapeError, match="1 image token.* for 2 image"):
        expand_image_tokens(ids, [1, 1], cfg)
    with pytest.raises(ShapeError, match=r"image_embeds: expected \[512, 128\]"):
        splice(ids, [2], cfg, table, rows[:256])
    with pytest.raises(ConfigError, match="img_start_token_id: is missing"):
        expand_image_tokens(ids, [1], dataclasses.replace(cfg, img_start_token_id=None))


def test_the_encoder_refuses_bad_tiles_before_any_work() -> None:
    """On the parity fixture's exported graph (1..8 tiles a call): too many tiles, another tile shape, counts that do
    not add up, values float16 cannot hold: each refused naming it; nothing runs."""
    builder = json.loads((PARITY / "builder_config.json").read_text())["visual"]
    engine = OnnxEngine.from_export(PARITY / "visual", builder)
    pre = json.loads((PARITY / "visual" / "preprocessor_config.json").read_text())
    cfg = InternVLConfig.from_edgellm(engine.config, preprocessor=pre)
    ran = []
    engine.input_hook = ran.append
    with trtio.create_for_visual(engine, cfg, backend="host") as visual:
        assert visual.registry.get("input").profiles[0][2] == (8, 3, 448, 448)
        tile = np.zeros((1, 3, 448, 448), np.float32)
        with pytest.raises(CapacityError, match=r"9 tiles in one call; the visual engine takes 1..8"):
            visual.encode(np.repeat(tile, 9, axis=0), [9])
        with pytest.raises(ShapeError, match=r"pixels: expected \[tiles, 3, 448, 448\]"):
            visual.encode(np.zeros((1, 3, 224, 224), np.float32))
        with pytest.raises(ShapeError, match="tiles: expected each image's tile count adding up to the 2 tiles"):
            visual.encode(np.repeat(tile, 2, axis=0), [1])
        with pytest.raises(trtio.errors.InvalidValueError, match="not a finite float16"):
            visual.encode(tile + 1e6, [1])
    assert ran == []


def test_preprocess_gives_each_images_tiles() -> None:
    pre = json.loads((PARITY / "visual" / "preprocessor_config.json").read_text())
    cfg = InternVLConfig.from_edgellm({**raw(), "text_config": {"hidden_size": 128, "vocab_size": 1000}},
                                      preprocessor=pre)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (30, 30, 3), dtype=np.uint8), rng.integers(0, 256, (30, 70, 3), dtype=np.uint8)]
    pixels, tiles = preprocess(images, cfg)
    assert tiles.tolist() == [1, 3] and pixels.shape == (4, 3, 448, 448) and pixels.dtype == np.float32
    # the thumbnail is the whole image at one tile: the second image's last tile equals it preprocessed alone
    alone, _ = preprocess(images[1], dataclasses.replace(cfg, crop_to_patches=False))
    np.testing.assert_array_equal(pixels[3], alone[0])


def test_the_toy_vit_refuses_an_internvl_config() -> None:
    """A directory without engine files runs on the toy models (``trtio generate``); the toy ViT is a Qwen ViT's,
    so an InternVL encoder is refused naming the config rather than failing on a missing attribute."""
    from trtio.testing.reference_visual import VitWeights

    with pytest.raises(ConfigError, match="the toy ViT is a Qwen ViT's .* there is none of a InternVLConfig"):
        VitWeights.generate(EngineDir.open(INTERNVL).visual_config)
