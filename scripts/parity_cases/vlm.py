"""Vision-language models: Qwen2.5-VL (window attention in the ViT) and Qwen3-VL (learned position grid, deepstack
features, QK norm in the LLM's attention plugin). Each case is a pair: the exporter's ``llm/`` and ``visual/`` graphs.

The reference (``vlm_reference``) holds, besides the usual rows of logits:

* the images (seeded uint8 RGB, sizes that the processor resizes), Hugging Face's ``pixel_values`` and
  ``image_grid_thw`` for both images processed together, and its vision tower's output on them (``vision_embeds``,
  and each ``vision_deepstack_j`` for Qwen3-VL), in fp32;
* for each prompt its token ids as a tokenizer gives them (``prompt_ids_i``: one image pad per image) and expanded
  (``tokens_i``: each pad repeated for the image's merged tokens, as Hugging Face's processor writes them, then the
  greedy continuation), with the rows of Hugging Face's full forward (``input_ids``, ``pixel_values``,
  ``image_grid_thw``, ``mm_token_type_ids``: its MRoPE positions from ``get_rope_index``).
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

IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END = 500, 501, 502, 503
TEXT_TOKENS = (1, 490)  # text tokens are drawn from here (the vision markers sit above)
LLM_BUILDER = {"max_batch_size": 4, "max_input_len": 64, "max_kv_cache_capacity": 256}
VISUAL_BUILDER = {"min_image_tokens": 4, "max_image_tokens": 64, "max_image_tokens_per_image": 32}


@dataclass(frozen=True)
class Prompt:
    """A prompt's layout: ``parts`` are text runs (an int: that many drawn tokens) and images (``"A"`` / ``"B"``:
    vision start, the image pad, vision end); ``split``: the parts a pinned prefix holds (the prefix scenario)."""

    purpose: str
    parts: tuple[int | str, ...]
    split: int = 0


PROMPTS = (
    Prompt("image", (5, "A", 4)),
    Prompt("two-images", (3, "A", 2, "B", 3)),
    Prompt("text", (9,)),
    Prompt("prefix", (4, "A", 6, 5), split=3),
)
IMAGE_NAMES = ("A", "B")


def _processor(patch: int, cls: Any) -> Any:
    factor = patch * 2
    return cls(patch_size=patch, merge_size=2, temporal_patch_size=2,
               min_pixels=VISUAL_BUILDER["min_image_tokens"] * factor * factor,
               max_pixels=VISUAL_BUILDER["max_image_tokens_per_image"] * factor * factor)


def _save_processor(folder: Path, patch: int) -> None:
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    _processor(patch, Qwen2VLImageProcessorPil).save_pretrained(folder)


def qwen25_vl(folder: Path, seed: int) -> None:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         rope_theta=10000.0, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
                         initializer_range=0.2, tie_word_embeddings=False),
        # head size 64 (what the ViT plugin's FMHA kernels build for); window 56 px = 2 x 2 merged tokens; block 0
        # windowed, block 1 full
        vision_config=dict(depth=2, hidden_size=128, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                           fullatt_block_indexes=[1], in_channels=3, initializer_range=0.1),
        image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, tie_word_embeddings=False, initializer_range=0.2)
    save_checkpoint(seeded_model(Qwen2_5_VLForConditionalGeneration, config, seed), folder)
    _save_processor(folder, 14)


def qwen3_vl(folder: Path, seed: int) -> None:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    # Interleaved sections [3, 3, 2] over 8 frequencies: T H W T H W T H, the height run reaching the last frequency
    # (3 * 3 > 8), as Qwen3.5's [11, 11, 10] over 32 does.
    rope = {"rope_type": "default", "mrope_section": [3, 3, 2], "mrope_interleaved": True}
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                         rope_theta=10000.0, rope_scaling=rope, initializer_range=0.2, tie_word_embeddings=False),
        # one head of 64 (the ViT plugin's FMHA head sizes); a 4 x 4 learned position grid; deepstack from both blocks
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=64, num_heads=1, out_hidden_size=64,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                           deepstack_visual_indexes=[0, 1], in_channels=3, initializer_range=0.1),
        image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, tie_word_embeddings=False, initializer_range=0.2)
    save_checkpoint(seeded_model(Qwen3VLForConditionalGeneration, config, seed), folder)
    _save_processor(folder, 16)


# -- the reference -------------------------------------------------------------------------------------------------


def _images(case: Case) -> list[np.ndarray]:
    """The case's images: seeded uint8 RGB of sizes the processor resizes (to 6 x 8 and 4 x 6 patches)."""
    rng = np.random.default_rng(case.seed * 1000 + 999)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in case.extra["image_sizes"]]


def _expanded(parts: tuple[int | str, ...], texts: list[np.ndarray], tokens_of: dict[str, int]) -> tuple[
        np.ndarray, np.ndarray, list[int]]:
    """(token ids with one pad per image, the same expanded, the images' indexes in order)."""
    short: list[int] = []
    long: list[int] = []
    images: list[int] = []
    text = iter(texts)
    for part in parts:
        if isinstance(part, int):
            run = next(text).tolist()
            short += run
            long += run
        else:
            short += [VISION_START, IMAGE_PAD, VISION_END]
            long += [VISION_START] + [IMAGE_PAD] * tokens_of[part] + [VISION_END]
            images.append(IMAGE_NAMES.index(part))
    return np.array(short, np.int32), np.array(long, np.int64), images


def vlm_reference(case: Case, checkpoint: Path, _out: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    processor = _processor(int(model.config.vision_config.patch_size), Qwen2VLImageProcessorPil)
    images = _images(case)
    both = processor(images=images, return_tensors="np")
    grid = both["image_grid_thw"].astype(np.int64)
    merge = int(model.config.vision_config.spatial_merge_size) ** 2
    tokens_of = {name: int(np.prod(g)) // merge for name, g in zip(IMAGE_NAMES, grid)}
    arrays: dict[str, np.ndarray] = {f"image_{i}": im for i, im in enumerate(images)}
    arrays["vision_pixels"] = both["pixel_values"].astype(np.float32)
    arrays["vision_grid"] = grid
    with torch.no_grad():
        out = model.model.visual(torch.tensor(both["pixel_values"]), grid_thw=torch.tensor(grid))
    arrays["vision_embeds"] = out.pooler_output.float().numpy()
    for j, feature in enumerate(getattr(out, "deepstack_features", None) or []):
        arrays[f"vision_deepstack_{j}"] = feature.float().numpy()
    pixels = {i: processor(images=[images[i]], return_tensors="pt") for i in range(len(images))}

    def logits_of(ids: np.ndarray, which: list[int]) -> np.ndarray:
        kwargs: dict[str, Any] = {}
        if which:
            kwargs["pixel_values"] = torch.cat([pixels[i]["pixel_values"] for i in which])
            kwargs["image_grid_thw"] = torch.cat([pixels[i]["image_grid_thw"] for i in which])
            kwargs["mm_token_type_ids"] = torch.tensor((ids == IMAGE_PAD).astype(np.int64))[None]
        with torch.no_grad():
            return model(input_ids=torch.tensor(ids)[None], use_cache=False, **kwargs).logits[0].float().numpy()

    sequences = []
    for i, prompt in enumerate(PROMPTS):
        rng = np.random.default_rng(case.seed * 1000 + i)
        for _ in range(2000):
            texts = [rng.integers(*TEXT_TOKENS, n) for n in prompt.parts if isinstance(n, int)]
            short, ids, which = _expanded(prompt.parts, texts, tokens_of)
            extended = greedy_continuation(ids, lambda t, w=which: logits_of(t, w)[-1])
            if extended is not None:
                ids = extended
                break
        else:
            raise RuntimeError(f"{case.name}: no {prompt.purpose} prompt with greedy gaps >= {GAP} in 2000 draws")
        length = len(ids) - CONTINUATION
        marks: tuple[int, ...] = ()
        if prompt.split:  # the pinned prefix's last token
            head = sum(p if isinstance(p, int) else tokens_of[p] + 2 for p in prompt.parts[:prompt.split])
            marks = (head - 1,)
        logits = logits_of(ids[:-1], which)
        rows = stored_positions(Sequence(prompt.purpose, length, marks))
        arrays[f"tokens_{i}"] = ids.astype(np.int32)
        arrays[f"prompt_ids_{i}"] = short
        arrays[f"positions_{i}"] = rows
        arrays[f"logits_{i}"] = logits[rows].astype(np.float32)
        greedy = logits[length - 1:length - 1 + CONTINUATION]
        sequences.append({"purpose": prompt.purpose, "prompt_length": length, "marks": list(marks),
                          "images": which, "smallest_greedy_gap": round(min(gap(r) for r in greedy), 4)})
    return arrays, {"sequences": sequences, "continuation": CONTINUATION,
                    "image_tokens": [tokens_of[n] for n in IMAGE_NAMES]}


_NOTES = ("The visual role's `config.json` is the exporter's; `builder_config.json` holds the token caps Edge-LLM's "
          "builder adds to it (`min_image_tokens`, `max_image_tokens`, `max_image_tokens_per_image`), and "
          "`profiles.json` its one profile (`_setup_component_profile`). The ViT's head size is 64, which the "
          "ViTAttentionPlugin's FMHA kernels build for. The images are seeded noise of sizes the processor resizes; "
          "the processor is transformers' `Qwen2VLImageProcessorPil` (its config beside the graph).")

CASES = [
    Case("qwen25-vl", "Qwen2.5-VL: LLM of 2 layers of 64 (MRoPE sections [2, 3, 3], vocab 512); ViT of 2 blocks of 128 "
                      "(2 heads of 64; block 0 in windows of 2 x 2 merged tokens, block 1 full).",
         qwen25_vl, {"llm": Role("llm", LLM_BUILDER), "visual": Role("visual", VISUAL_BUILDER, component="visual")},
         reference=vlm_reference, notes=_NOTES, size_limit=3 * 1024 * 1024,
         extra={"image_sizes": ((90, 100), (60, 80))}),
    Case("qwen3-vl", "Qwen3-VL: LLM of 3 layers of 64 (interleaved MRoPE [3, 3, 2], QK norm, 2 deepstack inputs, "
                     "vocab 512); ViT of 2 blocks of 64 (one head of 64, a 4 x 4 learned position grid, deepstack "
                     "from both blocks).",
         qwen3_vl, {"llm": Role("llm", LLM_BUILDER), "visual": Role("visual", VISUAL_BUILDER, component="visual")},
         reference=vlm_reference, notes=_NOTES, size_limit=3 * 1024 * 1024,
         extra={"image_sizes": ((90, 120), (60, 100))}),
]
