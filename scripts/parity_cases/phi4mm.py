"""Phi-4-multimodal's LLM (``phi4_multimodal``): LongRoPE with partial rotary 0.75 (head 32, rotary 24: 12 short and
12 long factors), the Phi-3 decoder (fused ``qkv_proj`` / ``gate_up_proj``), exported without its visual and audio
encoders (``--skip-visual --skip-audio``: the visual export hard-codes SigLIP-so400m).

Edge-LLM 0.11's runtime rotates every position with one static table (``cpp/runtime/state/ropeCache.cpp``): the
short factors where the KV capacity is within ``original_max_position_embeddings``, else the long ones. Hugging
Face picks per forward (``longrope_frequency_update``: long once ``max(position_ids) + 1`` passes the original
length). The two agree for every sequence only where the capacity is within the original length, which is what
trtio accepts (``docs/edgellm-assumptions.md`` 5.2): so the case's original length is the KV capacity (256), every
scenario runs under HF's switch on the short factors, and its factor ``max_position_embeddings / original`` = 4 gives
the attention factor ``sqrt(1 + ln 4 / ln 256)`` = 1.118 on cos and sin. The short factors (1 .. 3.2) change the
table at every position the scenarios use; the long ones (1 .. 12) are far from them, so a swapped table shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from make_parity_fixtures import GAP, TEXT_BUILDER, Case, Role, gap, load_hf, save_checkpoint, seeded_model

ORIGINAL = TEXT_BUILDER["max_kv_cache_capacity"]
SHORT = [round(1.0 + 0.2 * i, 2) for i in range(12)]
LONG = [round(1.0 + 1.0 * i, 2) for i in range(12)]
IMAGE_TOKEN_ID = 500


# The switch case: the same model with its switch at 64 tokens, inside the KV capacity (trtio refuses to bind it;
# the test lifts the refusal to measure what it avoids): HF rotates the batch's and the admitted prompts (<= 25
# tokens) with the short factors, the chunked and the prefix sequences (> 64) with the long ones at every position.
SWITCH = 64


def phi4mm(folder: Path, seed: int, original: int = ORIGINAL) -> None:
    import torch
    from transformers import Phi4MultimodalConfig, Phi4MultimodalForCausalLM

    config = Phi4MultimodalConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=4 * original, original_max_position_embeddings=original,
        initializer_range=0.2, bos_token_id=499, eos_token_id=[499, 501], pad_token_id=499,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                         "short_factor": SHORT, "long_factor": LONG, "original_max_position_embeddings": original},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_token_id": IMAGE_TOKEN_ID},
        audio_config={"hidden_size": 32, "intermediate_size": 64, "num_blocks": 1, "num_attention_heads": 2,
                      "audio_token_id": 502},
        architectures=["Phi4MultimodalForCausalLM"])
    model = seeded_model(Phi4MultimodalForCausalLM, config, seed)
    # The separator rows start at zero in transformers (a trained checkpoint has learned ones): drawn here, from their
    # own generator (every other weight stays as drawn), so that a layout that drops or moves them shows.
    emb = model.model.embed_tokens_extend.image_embed
    rng = np.random.default_rng(seed + 51)
    with torch.no_grad():
        for param in (emb.global_img_feature_extensor, emb.sub_img_feature_extensor):
            param.copy_(torch.from_numpy(rng.standard_normal(tuple(param.shape)).astype(np.float16)).float())
    save_checkpoint(model, folder)


def phi4mm_switch(folder: Path, seed: int) -> None:
    phi4mm(folder, seed, SWITCH)


def phi4mm_long_prompt(folder: Path, seed: int) -> None:
    """The model with its switch at 1024, the image case's KV capacity (its prompt of 817 tokens stays under it)."""
    phi4mm(folder, seed, IMAGE_CAPACITY)


# The image case: one 448 x 896 image (a whole 1 x 2 grid: nothing padded, so Hugging Face's ViT masks nothing and
# Edge-LLM's graph, which takes no mask, computes the same rows) between two runs of text.
IMAGE_SIZE = (448, 896)
IMAGE_CAPACITY = 1024
TEXT_BEFORE, TEXT_AFTER, IMAGE_CONTINUATION = 10, 6, 4


def synthetic_image(height: int, width: int) -> np.ndarray:
    """``scripts/make_phi4mm_image_fixture.py``'s images (integer arithmetic only)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.int64)
    r = (x * 7 + y * 3) % 256
    g = ((x // 3 + y // 3) % 2) * 200 + (y * 5) % 56
    b = (x * y) % 251
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


_PROCESSOR = """
import sys, types
import numpy as np
sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
from PIL import Image
from transformers import Phi4MultimodalImageProcessor
image = np.load(sys.argv[1])["image"]
out = Phi4MultimodalImageProcessor()(images=[Image.fromarray(image)], return_tensors="np")
np.savez(sys.argv[1], **{k: np.asarray(v) for k, v in out.items()})
"""


def _hf_processor(image: np.ndarray) -> dict[str, Any]:
    """HF's ``Phi4MultimodalImageProcessor`` on ``image``, run in a child process with ``TORCHVISION_PATH`` on its
    path (the exporter, run by the parent, must not import that torchvision), as torch tensors."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "image.npz"
        np.savez(file, image=image)
        env = {**os.environ, "PYTHONPATH": os.environ.get("TORCHVISION_PATH", "")}
        subprocess.run([sys.executable, "-c", _PROCESSOR, str(file)], check=True, env=env)
        with np.load(file) as data:
            return {k: torch.from_numpy(np.asarray(data[k])) for k in data.files}


def image_reference(case: Case, checkpoint: Path, _out: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Hugging Face's forward of a prompt holding one image, and what stands in for the visual engine's output: HF's
    own image tower and projection per block (``get_img_features``, ``img_projection_up`` / gelu / ``down``), the
    rows Edge-LLM's visual graph computes per block, and the projected ``glb_GN`` / ``sub_GN`` (the builder's sidecar).
    Needs torchvision (HF's image processor): a folder holding it in ``TORCHVISION_PATH`` (:func:`_hf_processor`).
    PyPI's torchvision cannot register its ops' meta kernels on a CPU-only torch; the child stubs that module (the
    processor uses none of those ops)."""
    import torch

    pre = _hf_processor(synthetic_image(*IMAGE_SIZE))
    model = load_hf(checkpoint)
    count = int(pre["num_img_tokens"][0])
    emb = model.model.embed_tokens_extend.image_embed

    def project(x: Any) -> Any:
        return emb.img_projection_down(torch.nn.functional.gelu(emb.img_projection_up(x)))

    with torch.no_grad():
        pixels = pre["image_pixel_values"]
        feats = emb.get_img_features(pixels.flatten(0, 1),
                                     attention_mask=pre["image_attention_mask"].flatten(0, 1).to(torch.bool))
        encoded = project(feats).reshape(-1, model.config.hidden_size).numpy()
        glb = project(emb.global_img_feature_extensor).reshape(-1).numpy()
        sub = project(emb.sub_img_feature_extensor).reshape(-1).numpy()
    rng = np.random.default_rng(case.seed)
    image_id = model.config.vision_config.image_token_id
    for _ in range(200):
        before, after = rng.integers(1, 499, TEXT_BEFORE), rng.integers(1, 499, TEXT_AFTER)
        tokens = np.concatenate([before, [image_id] * count, after]).astype(np.int64)
        logits = []
        for _step in range(IMAGE_CONTINUATION + 1):
            with torch.no_grad():
                out = model(input_ids=torch.tensor(tokens)[None], image_pixel_values=pixels,
                            image_sizes=pre["image_sizes"], image_attention_mask=pre["image_attention_mask"])
            logits = out.logits[0].float().numpy()
            if gap(logits[-1]) < GAP:
                break
            tokens = np.append(tokens, int(logits[-1].argmax()))
        else:
            break
    else:
        raise RuntimeError("no prompt whose greedy rows all have a gap >= GAP")
    prompt = TEXT_BEFORE + count + TEXT_AFTER
    rows = np.array([TEXT_BEFORE - 1, TEXT_BEFORE + count // 2, TEXT_BEFORE + count - 1]
                    + list(range(prompt - 1, prompt + IMAGE_CONTINUATION)), np.int64)
    arrays = {"tokens": tokens[:prompt + IMAGE_CONTINUATION].astype(np.int32),
              "prompt": np.concatenate([before, [image_id], after]).astype(np.int32),
              "rows": rows, "logits": logits[rows].astype(np.float32),
              "encoded": encoded.astype(np.float16), "glb_GN": glb.astype(np.float16), "sub_GN": sub.astype(np.float16),
              "image_sizes": pre["image_sizes"][0].numpy(), "num_img_tokens": np.array([count])}
    return arrays, {"sequences": [], "image": list(IMAGE_SIZE), "num_img_tokens": count, "prompt_length": prompt,
                    "continuation": IMAGE_CONTINUATION, "smallest_greedy_gap": round(min(
                        gap(r) for r in logits[prompt - 1:prompt - 1 + IMAGE_CONTINUATION]), 4)}


CASES = [
    Case("phi4mm", "Phi-4-multimodal's LLM (LongRoPE: 12 short factors 1..3.2, 12 long 1..12, original 256 = the KV "
                   "capacity, factor 4: attention factor 1.118; partial rotary 0.75 of a 32-wide head): 4 layers of "
                   "64, 2 query heads and 1 KV head, vocab 512; exported with --skip-visual --skip-audio.",
         phi4mm, {"llm": Role("llm", TEXT_BUILDER)}, export_flags=("--skip-visual", "--skip-audio")),
    Case("phi4mm-switch", "The phi4mm case's model with LongRoPE's switch at 64 tokens (max_position_embeddings 256: "
                          "attention factor 1.153), inside the KV capacity of 256: HF's reference rotates prompts "
                          "within 64 tokens with the short factors, longer ones with the long factors everywhere.",
         phi4mm_switch, {"llm": Role("llm", TEXT_BUILDER)}, export_flags=("--skip-visual", "--skip-audio")),
    Case("phi4mm-image", "The phi4mm case's model (switch and KV capacity at 1024) with a prompt holding one 448 x 896 "
                         "image (a 1 x 2 grid: 801 image tokens between 10 and 6 text tokens, 4 greedy tokens after); "
                         "the encoder's rows are HF's tower and projection per block (Edge-LLM's visual export fails "
                         "on a CPU).",
         phi4mm_long_prompt,
         {"llm": Role("llm", {**TEXT_BUILDER, "max_input_len": IMAGE_CAPACITY,
                              "max_kv_cache_capacity": IMAGE_CAPACITY})},
         export_flags=("--skip-visual", "--skip-audio"), sequences=(), reference=image_reference,
         notes="Needs torchvision for HF's image processor: `TORCHVISION_PATH=/tmp/tv python "
               "scripts/make_parity_fixtures.py --case phi4mm-image` after `pip install --no-deps --target /tmp/tv "
               "torchvision==0.28.0`."),
]
