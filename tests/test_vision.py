"""trtio.vision: preprocessing equal to Hugging Face's Qwen image processor, the splice of image tokens into a
prompt, and 3-axis MRoPE positions equal to transformers' ``get_rope_index``.

The comparisons run where transformers (with Pillow, and torch for ``get_rope_index``) is installed, CI included
(``.ci/requirements.txt`` pins transformers 5.25.0 and Pillow 13.0.0); they build the processors and models
from the fixtures' local configs, never from the hub.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trtio import ConfigError, EngineDir, InvalidTypeError, ShapeError
from trtio.components.visual.visual_config import VisualConfig
from trtio.vision import (
    VisionPrompt,
    expand_image_pads,
    mrope_positions,
    preprocess,
    resize_bicubic,
    smart_resize,
    splice,
)

FIXTURES = Path(__file__).parent / "fixtures" / "edgellm-0.11"
ENGINES = Path(__file__).resolve().parents[1] / "engines"


def qwen25() -> VisualConfig:
    cfg = VisualConfig.from_dir(FIXTURES / "qwen25vl-visual" / "visual")
    return cfg


def qwen3() -> VisualConfig:
    """The toy VLM's Qwen3-VL encoder (patch 16, mean and std 0.5): its preprocessor_config.json is there."""
    cfg = EngineDir.open(ENGINES / "toy-vlm-ragged").visual_config
    assert cfg is not None
    return cfg


CONFIGS = {"qwen2_5_vl": qwen25, "qwen3_vl": qwen3}


def image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """An 8-bit RGB image with smooth structure and noise (both matter to a resize)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([(xx * 255) // max(w - 1, 1), (yy * 255) // max(h - 1, 1), ((xx + yy) * 7) % 256], -1)
    return np.clip(base + rng.integers(-40, 41, (h, w, 3)), 0, 255).astype(np.uint8)


def hf_processor(cfg: VisualConfig) -> Any:
    """transformers' PIL-backend Qwen2-VL image processor (Qwen2.5-VL's and Qwen3-VL's) with the config's numbers."""
    pytest.importorskip("PIL")
    mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    assert cfg.image_mean is not None and cfg.image_std is not None
    return mod.Qwen2VLImageProcessorPil(
        patch_size=cfg.patch_size, temporal_patch_size=cfg.temporal_patch_size, merge_size=cfg.merge_size,
        image_mean=list(cfg.image_mean), image_std=list(cfg.image_std), min_pixels=cfg.min_pixels,
        max_pixels=cfg.max_pixels, rescale_factor=cfg.rescale_factor)


SIZES = [(224, 224), (100, 333), (480, 640), (37, 91), (1000, 200), (28, 28), (57, 58), (5, 700), (333, 40),
         (64, 64), (81, 300)]


@pytest.mark.parametrize("size", SIZES, ids=str)
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_preprocess_equals_the_hugging_face_processor(kind: str, size: tuple[int, int]) -> None:
    cfg = CONFIGS[kind]()
    img = image(*size, seed=size[0] * 7 + size[1])
    want = hf_processor(cfg)(images=[img], return_tensors="np")
    patches, grid = preprocess(img, cfg)
    np.testing.assert_array_equal(grid, want["image_grid_thw"])
    assert patches.dtype == np.float32
    np.testing.assert_array_equal(patches, want["pixel_values"])


def test_several_images_of_one_call_follow_each_other() -> None:
    cfg = qwen3()
    imgs = [image(90, 160, 1), image(200, 120, 2), image(64, 64, 3)]
    want = hf_processor(cfg)(images=imgs, return_tensors="np")
    patches, grid = preprocess(imgs, cfg)
    np.testing.assert_array_equal(grid, want["image_grid_thw"])
    np.testing.assert_array_equal(patches, want["pixel_values"])


def test_pil_images_are_converted_to_rgb_as_the_processor_converts_them() -> None:
    pil = pytest.importorskip("PIL.Image")
    cfg = qwen25()
    rgba = np.concatenate([image(120, 90, 5), np.full((120, 90, 1), 128, np.uint8)], -1)
    pictures = [pil.fromarray(rgba, "RGBA"), pil.fromarray(image(50, 70, 6)).convert("L")]
    want = hf_processor(cfg)(images=pictures, return_tensors="np")
    patches, grid = preprocess(pictures, cfg)
    np.testing.assert_array_equal(grid, want["image_grid_thw"])
    np.testing.assert_array_equal(patches, want["pixel_values"])
    rgba[:20, :30, 3] = 0  # partly transparent arrays: composited onto white as well
    arrays = [rgba, image(50, 70, 6)[..., :1]]
    want = hf_processor(cfg)(images=arrays, return_tensors="np")
    np.testing.assert_array_equal(preprocess(arrays, cfg)[0], want["pixel_values"])


def test_the_processor_flags_are_honoured() -> None:
    cfg = dataclasses.replace(qwen25(), do_normalize=False, rescale_factor=0.5)
    proc = hf_processor(cfg)
    img = image(140, 84, 9)
    want = proc(images=[img], do_normalize=False, return_tensors="np")
    np.testing.assert_array_equal(preprocess(img, cfg)[0], want["pixel_values"])
    raw = dataclasses.replace(cfg, do_resize=False, do_rescale=False)
    fits = image(56, 84, 1)
    want = proc(images=[fits], do_resize=False, do_rescale=False, do_normalize=False, return_tensors="np")
    np.testing.assert_array_equal(preprocess(fits, raw)[0], want["pixel_values"])
    with pytest.raises(ShapeError, match="without resizing .* whole 28-pixel blocks"):
        preprocess(image(57, 84), raw)


@pytest.mark.parametrize("seed", range(6))
def test_resize_equals_pillow_13s_bicubic(seed: int) -> None:
    """Both pass orders of Pillow 13 (the vertical pass first where an image loses more than twice as many rows as
    columns), upscaling and downscaling, one channel of random noise and structure."""
    pil = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(seed)
    for _ in range(40):
        h, w, oh, ow = (int(x) for x in rng.integers(1, 180, 4))
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = np.asarray(pil.fromarray(img).resize((ow, oh), resample=pil.BICUBIC))
        np.testing.assert_array_equal(resize_bicubic(img, oh, ow), want, err_msg=f"{(h, w)} -> {(oh, ow)}")


def test_smart_resize_equals_transformers() -> None:
    mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    cfg = qwen25()
    rng = np.random.default_rng(3)
    for h, w in [*SIZES, *((int(a), int(b)) for a, b in rng.integers(1, 3000, (200, 2)))]:
        if max(h, w) / min(h, w) > 200:
            with pytest.raises(ShapeError, match="aspect ratio"):
                smart_resize(h, w, cfg)
            continue
        assert smart_resize(h, w, cfg) == mod.smart_resize(h, w, factor=28, min_pixels=cfg.min_pixels,
                                                           max_pixels=cfg.max_pixels), (h, w)


def test_bad_images_are_refused() -> None:
    cfg = qwen25()
    with pytest.raises(ShapeError, match=r"images\[0\]: expected 8-bit RGB pixels, uint8 \[height, width, 3\]"):
        preprocess(image(40, 40).astype(np.float32), cfg)
    with pytest.raises(ShapeError, match=r"images\[1\]: expected 8-bit RGB"):
        preprocess([image(40, 40), np.zeros((40, 40), np.uint8)], cfg)
    with pytest.raises(InvalidTypeError, match="expected an image or a non-empty sequence"):
        preprocess([], cfg)
    with pytest.raises(ConfigError, match="preprocessor_config.json: the visual directory has no image processor"):
        preprocess(image(40, 40), VisualConfig.from_dir(FIXTURES / "qwen3vl-visual" / "visual"))


# -- MRoPE positions against transformers' get_rope_index ------------------------------------------

def hf_model(kind: str) -> tuple[Any, VisualConfig]:
    """A tiny transformers model of the kind (its get_rope_index reads only the configs' merge size and, for
    Qwen2.5-VL, tokens_per_second), and the matching VisualConfig."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if kind == "qwen2_5_vl":
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

        hf = json.loads((FIXTURES / "qwen25vl-visual" / "hf_config.json").read_text())
        return Qwen2_5_VLModel(transformers.Qwen2_5_VLConfig(**hf)), qwen25()
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    cfg = qwen3()
    text = dict(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32,
                rope_parameters={"rope_type": "default", "mrope_section": [6, 5, 5], "mrope_interleaved": True,
                                 "rope_theta": 10000.0})
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                  deepstack_visual_indexes=[0])
    hf_cfg = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=cfg.image_token_id,
                                        video_token_id=cfg.video_token_id,
                                        vision_start_token_id=cfg.vision_start_token_id,
                                        vision_end_token_id=cfg.vision_end_token_id)
    return Qwen3VLModel(hf_cfg), cfg


def prompt_with_images(cfg: VisualConfig, grids: list[tuple[int, int, int]], seed: int) -> list[int]:
    """Text, then each image (vision start, one pad, vision end) with text between and after them."""
    rng = np.random.default_rng(seed)
    ids = [int(t) for t in rng.integers(10, 300, 3)]
    for _ in grids:
        ids += [cfg.vision_start_token_id, cfg.image_token_id]
        if cfg.vision_end_token_id is not None:
            ids.append(cfg.vision_end_token_id)
        ids += [int(t) for t in rng.integers(10, 300, int(rng.integers(1, 6)))]
    return ids


@pytest.mark.parametrize("images", [0, 1, 2])
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_mrope_positions_equal_transformers_get_rope_index(kind: str, images: int) -> None:
    torch = pytest.importorskip("torch")

    model, cfg = hf_model(kind)
    rng = np.random.default_rng(images)
    for trial in range(4):
        grids = [(1, 2 * int(rng.integers(1, 9)), 2 * int(rng.integers(1, 9))) for _ in range(images)]
        ids = expand_image_pads(prompt_with_images(cfg, grids, trial), grids, cfg)
        assert (ids == cfg.image_token_id).sum() == sum(t * h * w // 4 for t, h, w in grids)
        got, delta = mrope_positions(ids, grids, cfg)
        t = torch.tensor(ids)[None]
        want, want_delta = model.get_rope_index(t, (t == cfg.image_token_id).int(),
                                                image_grid_thw=torch.tensor(grids) if grids else None)
        np.testing.assert_array_equal(got, want[:, 0].numpy(), err_msg=f"{kind} {grids}")
        assert delta == int(want_delta.reshape(-1)[0])
        if images == 0:
            assert delta == 0


def test_decode_positions_continue_from_the_delta() -> None:
    """What a decode step's position is (k + delta) equals transformers' positions of the prompt extended by
    generated text tokens."""
    torch = pytest.importorskip("torch")

    model, cfg = hf_model("qwen3_vl")
    grids = [(1, 8, 4), (1, 2, 6)]
    ids = expand_image_pads(prompt_with_images(cfg, grids, 7), grids, cfg)
    positions, delta = mrope_positions(ids, grids, cfg)
    extended = np.concatenate([ids, [77, 78, 79]])
    t = torch.tensor(extended)[None]
    want, _ = model.get_rope_index(t, (t == cfg.image_token_id).int(), image_grid_thw=torch.tensor(grids))
    for k in range(ids.shape[0], extended.shape[0]):
        assert (want[:, 0, k].numpy() == k + delta).all()
    assert delta < 0, "images take fewer positions than tokens"


# -- the splice -------------------------------------------------------------------------------------

def test_splice_writes_the_vit_rows_over_the_image_tokens() -> None:
    cfg = qwen3()
    grids = [(1, 4, 6), (1, 2, 2)]
    ids = prompt_with_images(cfg, grids, 3)
    table = np.random.default_rng(0).standard_normal((512, 64)).astype(np.float16)
    tokens = sum(cfg.image_tokens(g) for g in grids)
    rows = np.arange(tokens * 64, dtype=np.float32).reshape(tokens, 64) / 1000
    deep = [rows + 100 * (i + 1) for i in range(3)]
    p = splice(ids, grids, cfg, table, rows, deep)
    expanded = expand_image_pads(ids, grids, cfg)
    n = expanded.shape[0]
    assert p.token_ids.shape == (1, n) and (p.token_ids[0] == expanded).all()
    assert p.inputs_embeds.shape == (1, n, 64) and p.inputs_embeds.dtype == np.float16
    image = expanded == cfg.image_token_id
    np.testing.assert_array_equal(p.inputs_embeds[0, ~image], table[expanded[~image]])
    np.testing.assert_array_equal(p.inputs_embeds[0, image], rows.astype(np.float16))
    assert len(p.deepstack_embeds) == 3
    for d, want in zip(p.deepstack_embeds, deep):
        assert not d[0, ~image].any(), "zero rows outside the images"
        np.testing.assert_array_equal(d[0, image], want.astype(np.float16))
    positions, delta = mrope_positions(expanded, grids, cfg)
    np.testing.assert_array_equal(p.mrope_positions[:, 0], positions)
    assert (p.context_lengths.tolist(), p.rope_deltas.tolist()) == ([n], [delta])


def test_a_prompt_without_images_is_text() -> None:
    cfg = qwen25()
    table = np.ones((1000, 128), np.float32)
    p = splice([5, 6, 7, 8], None, cfg, table)
    assert p.deepstack_embeds == () and p.rope_deltas.tolist() == [0]
    np.testing.assert_array_equal(p.mrope_positions[:, 0], np.tile(np.arange(4), (3, 1)))


def test_stacked_prompts_are_right_padded() -> None:
    cfg = qwen3()
    table = np.random.default_rng(1).standard_normal((512, 64)).astype(np.float16)
    short = splice([9, 10, 11], None, cfg, table)
    grids = [(1, 4, 4)]
    rows = np.ones((4, 64), np.float16)
    long = splice(prompt_with_images(cfg, grids, 0), grids, cfg, table, rows, [rows, rows, rows])
    batch = VisionPrompt.stack([long, short])
    n = long.token_ids.shape[1]
    assert batch.inputs_embeds.shape == (2, n, 64) and batch.context_lengths.tolist() == [n, 3]
    np.testing.assert_array_equal(batch.inputs_embeds[1, :3], short.inputs_embeds[0])
    assert not batch.inputs_embeds[1, 3:].any() and not batch.deepstack_embeds[0][1].any()
    np.testing.assert_array_equal(batch.mrope_positions[:, 0], long.mrope_positions[:, 0])
    assert batch.rope_deltas.tolist() == [long.rope_deltas[0], 0]


@pytest.mark.parametrize("call, why", [
    (lambda cfg, t: splice([3, 5, 4, 5], [(1, 4, 4)], cfg, t, np.ones((4, 64))),
     r"2 image pad\(s\) \(token 5\) for 1 image\(s\)"),
    (lambda cfg, t: splice([3, 5, 4], [(1, 4, 4)], cfg, t, np.ones((3, 64)), [np.ones((4, 64))] * 3),
     r"image_embeds: expected \[4, 64\] float rows"),
    (lambda cfg, t: splice([3, 5, 4], [(1, 4, 4)], cfg, t, np.ones((4, 64))),
     r"deepstack: the ViT has 3 deepstack feature\(s\), got none"),
    (lambda cfg, t: splice([3, 6, 4], [(1, 4, 4)], cfg, t, np.ones((4, 64))), "holds the video pad 6"),
    (lambda cfg, t: splice([3, 5, 4], [(2, 4, 4)], cfg, t, np.ones((8, 64))), r"t = 2; trtio splices still images"),
    (lambda cfg, t: splice([3, 5, 4, 600], [(1, 4, 4)], cfg, t, np.ones((4, 64)), [np.ones((4, 64))] * 3),
     "token 600 at 6 is outside the 512-row embedding"),
    (lambda cfg, t: splice([3, 5, 4], None, cfg, t), r"1 image pad\(s\) .* for 0 image\(s\)"),
    (lambda cfg, t: mrope_positions([3, 5, 5, 4], [(1, 4, 4)], cfg), "needs 4 image tokens from index 1"),
])
def test_splice_refuses_what_does_not_pair_up(call: Any, why: str) -> None:
    cfg = qwen3()
    with pytest.raises(ShapeError, match=why):
        call(cfg, np.zeros((512, 64), np.float16))
