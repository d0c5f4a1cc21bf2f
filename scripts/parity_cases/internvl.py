"""InternVL 3.5 (``internvl``): a tiny seeded ``InternVLForConditionalGeneration`` (InternViT with a CLS token and
absolute positions, pixel shuffle, the two-layer projector; a dense Qwen3 LLM with 1-D RoPE), exported by the real
``tensorrt-edgellm-export`` into ``llm/`` and ``visual/`` (``input`` FP16 ``[tiles, 3, 448, 448]`` -> ``output``
``[256 * tiles, hidden]``).

The reference (``internvl_reference``) holds:

* ``preprocess``: seeded uint8 RGB images of several aspect ratios, each with the tile bounds of Hugging Face's
  ``GotOcr2ImageProcessorPil`` (``crop_to_patches``: the grid of 448-pixel tiles closest to the image's aspect ratio,
  then a thumbnail) it was processed with, and a digest of Hugging Face's ``pixel_values`` (a whole tile is 2.4 MB):
  every tile's pixels at a 16-pixel stride, and every row's and column's sums per channel (float32);
* ``vision``: images A (one tile) and B (two tiles and the thumbnail) processed together, and Hugging Face's projected
  image features on them (``get_image_features(...).pooler_output``, fp32);
* prompts (text, ``<img>`` + 256 x tiles ``<IMG_CONTEXT>`` + ``</img>``, text) and their greedy continuations, with
  the rows of Hugging Face's full forward (``input_ids`` + ``pixel_values``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from make_parity_fixtures import (
    CONTINUATION,
    GAP,
    Case,
    Role,
    Sequence,
    gap,
    greedy_continuation,
    save_checkpoint,
    seeded_model,
    stored_positions,
)

IMG_CONTEXT, IMG_START, IMG_END = 500, 501, 502
TEXT_TOKENS = (1, 490)
TILE = 448
TOKENS_PER_TILE = 256
LLM_BUILDER = {"max_batch_size": 2, "max_input_len": 1024, "max_kv_cache_capacity": 1024}
# 1 .. 8 tiles a call (Edge-LLM's builder: min_image_tokens // 256 .. max_image_tokens // 256)
VISUAL_BUILDER = {"min_image_tokens": 256, "max_image_tokens": 2048, "max_image_tokens_per_image": 1792}
PROCESSOR = {"min_patches": 1, "max_patches": 6}
STRIDE = 16  # the digest's pixel stride

# (height, width, min_patches, max_patches): the preprocessing references
PREPROCESS = ((50, 60, 1, 6), (40, 90, 1, 6), (130, 35, 1, 6), (70, 66, 2, 4), (45, 200, 1, 12), (300, 100, 1, 6))
IMAGES = {"A": (50, 60), "B": (40, 90)}  # one tile; two tiles and the thumbnail


@dataclass(frozen=True)
class Prompt:
    purpose: str
    parts: tuple[int | str, ...]


PROMPTS = (Prompt("image", (5, "A", 4)), Prompt("thumbnail", (3, "B", 3)), Prompt("text", (9,)))


def _processor(**overrides: Any) -> Any:
    from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
    from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil

    kwargs = {"crop_to_patches": True, "size": {"height": TILE, "width": TILE}, "image_mean": IMAGENET_DEFAULT_MEAN,
              "image_std": IMAGENET_DEFAULT_STD, **PROCESSOR, **overrides}
    return GotOcr2ImageProcessorPil(**kwargs)


def internvl(folder: Path, seed: int) -> None:
    from transformers import InternVLConfig, InternVLForConditionalGeneration

    config = InternVLConfig(
        # one head of 64 (the ViT plugin's FMHA head sizes); layer scale 1 so that both blocks count
        vision_config=dict(hidden_size=64, num_attention_heads=1, intermediate_size=128, num_hidden_layers=2,
                           image_size=TILE, patch_size=14, use_mean_pooling=True, layer_scale_init_value=1.0,
                           initializer_range=0.1, attention_bias=True),
        text_config=dict(model_type="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=2048, rope_theta=10000.0, initializer_range=0.2,
                         tie_word_embeddings=False),
        image_token_id=IMG_CONTEXT, downsample_ratio=0.5, projector_hidden_act="gelu", tie_word_embeddings=False)
    save_checkpoint(seeded_model(InternVLForConditionalGeneration, config, seed), folder)
    _processor().save_pretrained(folder)


# -- the reference -------------------------------------------------------------------------------------------------


def _image(case: Case, key: int, height: int, width: int) -> np.ndarray:
    rng = np.random.default_rng(case.seed * 1000 + 900 + key)
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def digest(pixels: np.ndarray) -> dict[str, np.ndarray]:
    """A tile stack's digest: pixels at the stride, row sums and column sums per channel (float32)."""
    x = pixels.astype(np.float64)
    return {"sampled": pixels[:, :, STRIDE // 2::STRIDE, STRIDE // 2::STRIDE].astype(np.float32),
            "rows": x.sum(axis=3).astype(np.float32), "cols": x.sum(axis=2).astype(np.float32)}


def _expanded(parts: tuple[int | str, ...], texts: list[np.ndarray], tokens_of: dict[str, int]) -> tuple[
        np.ndarray, np.ndarray, list[str]]:
    """(token ids with one ``<IMG_CONTEXT>`` per image, the same expanded as Edge-LLM's runner and HF's processor
    write it, the images in order)."""
    short: list[int] = []
    long: list[int] = []
    images: list[str] = []
    text = iter(texts)
    for part in parts:
        if isinstance(part, int):
            run = next(text).tolist()
            short += run
            long += run
        else:
            short += [IMG_CONTEXT]
            long += [IMG_START] + [IMG_CONTEXT] * tokens_of[part] + [IMG_END]
            images.append(part)
    return np.array(short, np.int32), np.array(long, np.int64), images


def internvl_reference(case: Case, checkpoint: Path, _out: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    import torch
    from transformers import AutoModelForImageTextToText

    torch.set_num_threads(1)  # a shared, loaded machine: one thread runs fastest
    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    arrays: dict[str, np.ndarray] = {}
    pre_meta = []
    for k, (h, w, lo, hi) in enumerate(PREPROCESS):
        image = _image(case, k, h, w)
        out = _processor(min_patches=lo, max_patches=hi)(images=[image], return_tensors="np")
        pixels = out["pixel_values"].astype(np.float32)
        arrays[f"pre_image_{k}"] = image
        for name, values in digest(pixels).items():
            arrays[f"pre_{name}_{k}"] = values
        pre_meta.append({"size": [h, w], "min_patches": lo, "max_patches": hi, "tiles": int(pixels.shape[0])})
    images = {name: _image(case, 100 + i, *size) for i, (name, size) in enumerate(IMAGES.items())}
    processor = _processor()
    per_image = {name: processor(images=[im], return_tensors="pt")["pixel_values"] for name, im in images.items()}
    tiles = {name: int(p.shape[0]) for name, p in per_image.items()}
    tokens_of = {name: t * TOKENS_PER_TILE for name, t in tiles.items()}
    both = torch.cat([per_image["A"], per_image["B"]])
    for name, im in images.items():
        arrays[f"image_{name}"] = im
    with torch.no_grad():
        feats = model.model.get_image_features(pixel_values=both).pooler_output
    arrays["vision_embeds"] = feats.reshape(-1, feats.shape[-1]).float().numpy()
    for name, values in digest(both.numpy().astype(np.float32)).items():
        arrays[f"vision_{name}"] = values

    def logits_of(ids: np.ndarray, which: list[str]) -> np.ndarray:
        """HF's full forward (``input_ids`` + ``pixel_values``)."""
        kwargs: dict[str, Any] = {}
        if which:
            kwargs["pixel_values"] = torch.cat([per_image[n] for n in which])
        with torch.no_grad():
            return model(input_ids=torch.tensor(ids)[None], use_cache=False, **kwargs).logits[0].float().numpy()

    with torch.no_grad():
        features = {n: model.model.get_image_features(pixel_values=p).pooler_output.reshape(-1, feats.shape[-1])
                    for n, p in per_image.items()}

    def drawn_logits(ids: np.ndarray, which: list[str]) -> np.ndarray:
        """The same forward with the image features computed once (what HF's forward scatters into the embeddings):
        the draws' greedy rows, cheaply; the stored rows are ``logits_of``'s."""
        with torch.no_grad():
            embeds = model.get_input_embeddings()(torch.tensor(ids)[None])
            if which:
                mask = torch.tensor(ids == IMG_CONTEXT)[None, :, None].expand_as(embeds)
                embeds = embeds.masked_scatter(mask, torch.cat([features[n] for n in which]))
            return model(inputs_embeds=embeds, use_cache=False).logits[0].float().numpy()

    sequences = []
    for i, prompt in enumerate(PROMPTS):
        rng = np.random.default_rng(case.seed * 1000 + i)
        for tries in range(2000):
            texts = [rng.integers(*TEXT_TOKENS, n) for n in prompt.parts if isinstance(n, int)]
            short, ids, which = _expanded(prompt.parts, texts, tokens_of)
            extended = greedy_continuation(ids, lambda t, w=which: drawn_logits(t, w)[-1])
            if extended is not None:
                ids = extended
                print(f"{case.name}: the {prompt.purpose} prompt after {tries + 1} draw(s)", flush=True)
                break
        else:
            raise RuntimeError(f"{case.name}: no {prompt.purpose} prompt with greedy gaps >= {GAP} in 2000 draws")
        length = len(ids) - CONTINUATION
        logits = logits_of(ids[:-1], which)
        cheap = drawn_logits(ids[:-1], which)
        if not np.allclose(logits, cheap, atol=1e-4):
            raise RuntimeError(f"{case.name}: the scattered features' logits are not HF's forward's")
        rows = stored_positions(Sequence(prompt.purpose, length))
        arrays[f"tokens_{i}"] = ids.astype(np.int32)
        arrays[f"prompt_ids_{i}"] = short
        arrays[f"positions_{i}"] = rows
        arrays[f"logits_{i}"] = logits[rows].astype(np.float32)
        greedy = logits[length - 1:length - 1 + CONTINUATION]
        sequences.append({"purpose": prompt.purpose, "prompt_length": length, "marks": [], "images": which,
                          "smallest_greedy_gap": round(min(gap(r) for r in greedy), 4)})
    return arrays, {"sequences": sequences, "continuation": CONTINUATION, "preprocess": pre_meta,
                    "tiles": tiles, "image_names": list(IMAGES), "stride": STRIDE,
                    "special_tokens": {"img_context": IMG_CONTEXT, "img_start": IMG_START, "img_end": IMG_END}}


_NOTES = ("The visual role's `config.json` is the exporter's (it writes `image_token_id`, `text_config`, "
          "`downsample_ratio` and the vision config with `[h, w]` sizes, not the `<img>` / `</img>` ids Edge-LLM's "
          "builder finds in a tokenizer: this checkpoint has none, so the tests give them); `builder_config.json` "
          "holds the token caps the builder adds (`min_image_tokens` 256 .. `max_image_tokens` 2048: 1 .. 8 tiles a "
          "call), `profiles.json` its one profile (`_setup_component_profile`, 4-D input: tiles = tokens // 256). "
          "The image processor is transformers' `GotOcr2ImageProcessorPil` (`crop_to_patches`, 1 .. 6 tiles, "
          "ImageNet mean and std; its config beside the graph). The ViT has one head of 64, the head size the "
          "ViTAttentionPlugin's FMHA kernels build for. A 448 x 448 tile's `pixel_values` take 2.4 MB, so the "
          "reference stores a digest of them (pixels at a 16-pixel stride, every row's and column's sums).")

CASES = [
    Case("internvl", "InternVL 3.5: LLM of 2 layers of 64 (Qwen3, 1-D RoPE, vocab 512); InternViT of 2 blocks of 64 "
                     "(one head of 64, 448-pixel tiles of 14-pixel patches, a CLS token), pixel shuffle 0.5 and the "
                     "projector: 256 rows of 64 a tile.",
         internvl, {"llm": Role("llm", LLM_BUILDER), "visual": Role("visual", VISUAL_BUILDER, component="visual")},
         reference=internvl_reference, notes=_NOTES, size_limit=3 * 1024 * 1024),
]
