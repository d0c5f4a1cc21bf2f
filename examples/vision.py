"""Images into a vision-language model: preprocess, encode with the ViT, splice, prefill, decode.

    python3 examples/vision.py                                 # the toy VLM (engines/toy-vlm-ragged)
    python3 examples/vision.py ENGINE_DIR --image a.png --image b.jpg   # an Edge-LLM Qwen2.5-VL / Qwen3-VL build

Two requests, each one image and a question: the first is admitted at step 0, the second at step 3 while the
first decodes (continuous batching: ``prefill(slots=...)``). For each request the image is resized and cut into
patches as Hugging Face's image processor does (``trtio.vision.preprocess``), encoded by the directory's ViT
(``setup.visual.encode``), and spliced into the prompt (``trtio.vision.splice``: the image pad expanded into its
image tokens, the ViT's rows written over them, the deepstack features, the 3-axis MRoPE positions); the
prefill takes all of it, and later tokens continue from the sequence's position delta. Prints each request's
tokens and the tokens per second.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import ENGINES, positive_int, run

import trtio
from trtio.vision import preprocess, splice

QUESTIONS = ("Describe the picture.", "What colour is it?")


def synthetic_images() -> list[np.ndarray]:
    """Two 8-bit RGB images (a gradient and a checkerboard), in place of files."""
    yy, xx = np.mgrid[0:96, 0:128]
    gradient = np.stack([xx * 2, yy * 2, (xx + yy) % 256], -1).astype(np.uint8)
    board = (((np.mgrid[0:160, 0:80].sum(0) // 16) % 2) * 200 + 30).astype(np.uint8)
    return [gradient, np.stack([board, board // 2, 255 - board], -1)]


def read_image(path: Path) -> np.ndarray:
    if path.suffix == ".npy":
        return np.asarray(np.load(path))
    from PIL import Image  # pip install pillow (trtio[vision])

    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def open_directory(path: Path, backend: str) -> Any:
    """The LLM setup with its ViT attached (``setup.visual``): the directory's engines, or for configs alone (the
    toy) reference engines computing the toy model."""
    d = trtio.EngineDir.open(path)
    if d.visual_config is None:
        raise trtio.ConfigError(str(path), "holds no vision encoder (visual/config.json)")
    be = None if backend == "auto" else backend
    if d.has_engines:
        return trtio.create_from_engine_dir(path, graphs=True, backend=be)
    from trtio.testing.toy_engines import VisionToyEngines

    toys = VisionToyEngines.load(path)
    device = {"cuda": "gpu"}.get(backend, backend)
    setup = trtio.create_for_llm(toys.reference_engine(device=device), toys.config, graphs=True)
    setup.attach_visual(trtio.create_for_visual(toys.visual_engine(device=device), toys.visual_config, graphs=True,
                                                backend=setup.io.backend))
    return setup


def prompt_ids(path: Path, question: str, vcfg: trtio.VisualConfig) -> list[int]:
    """The vision markers and one image pad, then the question (tokenized where Hugging Face tokenizers is there)."""
    marker = [vcfg.vision_start_token_id, vcfg.image_token_id]
    if vcfg.vision_end_token_id is not None:
        marker.append(vcfg.vision_end_token_id)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return marker + [40 + len(question) % 50, 41, 42, 43]
    return marker + Tokenizer.from_file(str(path / "tokenizer.json")).encode(question).ids


def serve(setup: Any, table: np.ndarray, emb: Any, prompts: list[list[int]], images: list[np.ndarray],
          admit: list[int], budget: int, eos: set[int]) -> list[list[int]]:
    """Greedy tokens of each request, request ``i`` admitted at decode step ``admit[i]`` into a free slot. A prompt's
    embeddings are its token rows of ``table`` with the image's rows spliced over them (``trtio.vision.splice``); a
    decode's are gathered on the device by the directory's embeddings ``emb`` (``EngineDir.embeddings``)."""
    visual = setup.visual
    tokens: list[list[int]] = [[] for _ in prompts]
    slot_of: dict[int, int] = {}  # request -> slot, while it runs
    step = 0
    while slot_of or step <= max(admit):
        for i in range(len(prompts)):
            if admit[i] == step:
                patches, grid = preprocess(images[i], visual.cfg)
                p = splice(prompts[i], grid, visual.cfg, table, visual.encode(patches, grid))
                slot = min(set(range(setup.cfg.max_supported_batch_size)) - set(slot_of.values()))
                logits = setup.prefill(p.inputs_embeds, p.context_lengths, slots=[slot],
                                       deepstack_embeds=list(p.deepstack_embeds) or None,
                                       mrope_positions=p.mrope_positions)
                tokens[i].append(int(logits.to_numpy()[0].argmax()))
                slot_of[i] = slot
        for i, slot in list(slot_of.items()):  # finished: end of sequence or its budget
            if tokens[i][-1] in eos or len(tokens[i]) >= budget:
                setup.release([slot])
                del slot_of[i]
        if slot_of:
            order = sorted(slot_of, key=slot_of.__getitem__)  # the active slots, ascending
            x = emb.embed(np.array([[tokens[i][-1]] for i in order]))
            rows = setup.decode(x).to_numpy()
            for row, i in zip(rows, order):
                tokens[i].append(int(row.argmax()))
        step += 1
    return tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("engine_dir", nargs="?", type=Path, default=ENGINES / "toy-vlm-ragged",
                   help="a vision-language model's engine directory (default: engines/toy-vlm-ragged)")
    p.add_argument("--image", type=Path, action="append", help="an image per request (default: two synthetic ones)")
    p.add_argument("--max-new-tokens", type=positive_int, default=16)
    p.add_argument("--backend", default="auto", choices=["auto", "host", "cuda"])
    args = p.parse_args()
    images = [read_image(f) for f in args.image] if args.image else synthetic_images()
    if len(images) != len(QUESTIONS):
        p.error(f"give {len(QUESTIONS)} images (one per request), got {len(images)}")
    d = trtio.EngineDir.open(args.engine_dir)
    table = np.array(d.embedding_table(), np.float32)
    eos = set(d.raw().get("eos_token_id") or [])
    with open_directory(args.engine_dir, args.backend) as setup, d.embeddings(setup.io.backend) as emb:
        prompts = [prompt_ids(args.engine_dir, q, setup.visual.cfg) for q in QUESTIONS]
        start = time.perf_counter()
        tokens = serve(setup, table, emb, prompts, images, [0, 3], args.max_new_tokens, eos)
        seconds = time.perf_counter() - start
        backend = setup.io.backend.name
    for i, row in enumerate(tokens):
        print(f"tokens {i}: {row}")
    count = sum(map(len, tokens))
    print(f"{count} tokens in {seconds:.3f} s: {count / seconds:.1f} tokens/s ({backend} backend)")


if __name__ == "__main__":
    run(main)
