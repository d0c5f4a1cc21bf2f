"""Write ``tests/fixtures/phi4mm-images/hf_processor.npz``: Hugging Face's ``Phi4MultimodalImageProcessor``
(transformers 5.14) on a few synthetic images, for ``tests/test_phi4mm_visual.py`` (which needs no torch).

Run with the export venv (torch, transformers) and torchvision on the path: HF's Phi-4-MM processor is a torchvision
backend. With a CPU-only torch, PyPI's torchvision cannot register its custom ops; the script stubs its meta
registrations module (the resize and pad it uses are plain torch ops)::

    pip install --no-deps --target /tmp/tv torchvision==0.28.0
    PYTHONPATH=/tmp/tv python scripts/make_phi4mm_image_fixture.py

Stored per image: its size and ``dynamic_hd``, HF's ``num_img_tokens``, ``image_sizes``, ``image_attention_mask``,
every block's mean, and the blocks sampled at every 8th row and column from 3 (the whole blocks would take 2.4 MB
each).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "phi4mm-images" / "hf_processor.npz"
# (height, width, dynamic_hd): padding in height (upscaled); padding in width (tall, upscaled); an exact 1 x 2 grid
# (no resize, no padding: Edge-LLM's layout); more crops than dynamic_hd 4 (downscaled into a closest ratio).
IMAGES = ((200, 330, 36), (500, 120, 36), (448, 896, 36), (700, 980, 4))
STRIDE, OFFSET = 8, 3


def synthetic_image(height: int, width: int) -> np.ndarray:
    """uint8 [height, width, 3] from integer arithmetic only (the test rebuilds it bit for bit): ramps, a fine
    checkerboard (what antialiasing smooths) and a product term."""
    y, x = np.mgrid[0:height, 0:width].astype(np.int64)
    r = (x * 7 + y * 3) % 256
    g = ((x // 3 + y // 3) % 2) * 200 + (y * 5) % 56
    b = (x * y) % 251
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def main() -> int:
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    import transformers
    from PIL import Image
    from transformers import Phi4MultimodalImageProcessor

    arrays: dict[str, np.ndarray] = {"images": np.asarray(IMAGES, np.int64),
                                     "sample": np.asarray([STRIDE, OFFSET], np.int64)}
    for i, (h, w, hd) in enumerate(IMAGES):
        out = Phi4MultimodalImageProcessor(dynamic_hd=hd)(images=[Image.fromarray(synthetic_image(h, w))],
                                                          return_tensors="np")
        pixels = np.asarray(out["image_pixel_values"][0], np.float32)  # [crops + 1, 3, 448, 448]
        arrays[f"num_img_tokens_{i}"] = np.asarray(out["num_img_tokens"], np.int64)
        arrays[f"image_sizes_{i}"] = np.asarray(out["image_sizes"][0], np.int64)
        arrays[f"mask_{i}"] = np.asarray(out["image_attention_mask"][0], np.uint8)
        arrays[f"block_means_{i}"] = pixels.mean(axis=(1, 2, 3), dtype=np.float64)
        arrays[f"sampled_{i}"] = np.ascontiguousarray(pixels[:, :, OFFSET::STRIDE, OFFSET::STRIDE])
    arrays["transformers_version"] = np.asarray(transformers.__version__)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **arrays)
    print(f"{OUT}: {OUT.stat().st_size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
