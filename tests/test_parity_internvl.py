"""Real-graph parity of InternVL 3.5 (DESIGN §17): NVIDIA's exported ``visual/`` graph (InternViT with its
ViTAttentionPlugin, pixel shuffle, projector) and ``llm/`` graph (Qwen3, 1-D RoPE) of a tiny seeded InternVL, driven by
trtio's tiling (:func:`trtio.vision.preprocess`), its encoder setup, its splice (:func:`trtio.vision.splice`) and the
LLM setup, held to Hugging Face's image processor, its projected image features and its full forward on the same
images and tokens (``scripts/parity_cases/internvl.py`` wrote the references).

Scenarios: ``vision`` (images A, one tile, and B, two tiles and the thumbnail, in one encode: the tiles equal Hugging
Face's ``pixel_values`` digest, the rows its image features), ``image`` and ``thumbnail`` (text + image + text
prefilled alone, then decoded), ``batch`` (the image prompt and a text prompt prefilled together, then decoded
together). The planted bugs rewrite what trtio would get wrong: the normalisation, the tiles' order, the thumbnail,
the splice's rows, the ``<img>`` markers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pytest

import trtio
from tests._parity import Case, Compare, ParityMismatch, Seq, decode_all, llm_setup
from trtio._dtypes import DType
from trtio.components.visual.internvl_config import InternVLConfig
from trtio.components.visual.internvl_images import ImagePrompt, expand_image_tokens
from trtio.components.visual.internvl_setup import internvl_registry
from trtio.vision import preprocess, splice

Hook = Callable[[dict[str, np.ndarray]], None]
PixelsHook = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]

# The fp16 encoder against HF's fp32 image features: max |Δ| over max(1, their std) (measured: 0.0039 for the 4 tiles
# of images A and B; the logits of the prompts holding them differ from HF's by 0.015 at most).
VISION_TOLERANCE = 0.01
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


@functools.cache
def _case() -> Case:
    return Case("internvl")


def visual_config(case: Case, config: dict[str, Any]) -> InternVLConfig:
    """The encoder's config from the exported ``config.json`` (with the builder's caps) and the processor's config,
    with the ``<img>`` / ``</img>`` ids Edge-LLM's builder takes from a tokenizer (this checkpoint has none)."""
    pre = json.loads((case.root / "visual" / "preprocessor_config.json").read_text())
    cfg = InternVLConfig.from_edgellm(config, preprocessor=pre, what=f"{case.name}/visual/config.json")
    tokens = case.meta["special_tokens"]
    return dataclasses.replace(cfg, img_start_token_id=tokens["img_start"], img_end_token_id=tokens["img_end"])


def digest_problem(pixels: np.ndarray, arrays: dict[str, np.ndarray], prefix: str) -> str | None:
    """Where ``pixels`` differ from the digest of Hugging Face's ``pixel_values`` stored under ``prefix``: the tile
    count, a sampled pixel (to 1e-6) or a row's or column's sum (to 1e-5 relative); None where they agree."""
    stride = int(_case().meta["stride"])
    want = arrays[f"{prefix}_sampled"]
    if pixels.shape[0] != want.shape[0]:
        return f"{pixels.shape[0]} tiles, Hugging Face's processor gives {want.shape[0]}"
    sampled = pixels[:, :, stride // 2::stride, stride // 2::stride]
    delta = float(np.abs(sampled - want).max())
    if not delta <= 1e-6:
        return f"sampled pixels differ by up to {delta:.4g}"
    x = pixels.astype(np.float64)
    for name, got in (("rows", x.sum(axis=3)), ("cols", x.sum(axis=2))):
        ref = arrays[f"{prefix}_{name}"].astype(np.float64)
        err = float(np.abs(got - ref).max() / max(1.0, float(np.abs(ref).max())))
        if not err <= 1e-5:
            return f"{name} sums differ by up to {err:.3g} (relative)"
    return None


@dataclass
class InternVL:
    """One scenario's setups: the case, the LLM setup, the encoder setup and its config, the embedding table, and a
    hook between preprocessing and the encoder (a planted preprocessing bug)."""

    case: Case
    llm: Any
    visual: Any
    cfg: InternVLConfig
    table: np.ndarray
    pixels_hook: PixelsHook | None = None

    def images(self, which: list[str]) -> list[np.ndarray]:
        return [self.case.arrays[f"image_{name}"] for name in which]

    def tiles(self, which: list[str]) -> tuple[np.ndarray, np.ndarray]:
        pixels, tiles = preprocess(self.images(which), self.cfg)
        return self.pixels_hook(pixels, tiles) if self.pixels_hook is not None else (pixels, tiles)

    def prompt(self, seq: Seq) -> ImagePrompt:
        """``seq``'s prompt spliced with its images (one encode a prompt): the tokens must be Hugging Face's."""
        which = self.case.meta["sequences"][seq.index]["images"]
        ids = self.case.arrays[f"prompt_ids_{seq.index}"]
        if not which:
            p = splice(ids, None, self.cfg, self.table)
        else:
            pixels, tiles = self.tiles(which)
            expanded = expand_image_tokens(ids, tiles, self.cfg)
            if expanded.shape != seq.prompt.shape or (expanded != seq.prompt).any():
                raise ParityMismatch(f"sequence {seq.index}: the expanded prompt ({expanded.shape[0]} tokens) is not "
                                     f"Hugging Face's ({seq.prompt.shape[0]})")
            p = splice(ids, tiles, self.cfg, self.table, self.visual.encode(pixels, tiles))
        assert isinstance(p, ImagePrompt)
        np.testing.assert_array_equal(p.token_ids[0], seq.prompt)
        return p


@contextlib.contextmanager
def internvl(case: Case, backend: str = "host", graphs: bool = False, hook: Hook | None = None,
             visual_hook: Hook | None = None, pixels_hook: PixelsHook | None = None) -> Iterator[InternVL]:
    engine = case.engine("visual", backend)
    engine.input_hook = visual_hook
    cfg = visual_config(case, engine.config)
    with llm_setup(case, backend, graphs, hook) as llm, \
            trtio.create_for_visual(engine, cfg, backend=backend, graphs=graphs) as visual:
        yield InternVL(case, llm, visual, cfg, case.table(), pixels_hook)


# -- the scenarios --------------------------------------------------------------------------------------------------


def vision(v: InternVL, cmp: Compare) -> None:
    """Images A and B cut and encoded in one call: the tiles are Hugging Face's, the rows its image features."""
    arrays = v.case.arrays
    pixels, tiles = v.tiles(v.case.meta["image_names"])
    problem = digest_problem(pixels, arrays, "vision")
    if problem is not None:
        raise ParityMismatch(f"vision tiles: {problem}")
    got = v.visual.encode(pixels, tiles).embeds.to_numpy().astype(np.float32)
    want = arrays["vision_embeds"]
    if got.shape != want.shape:
        raise ParityMismatch(f"vision rows: {list(got.shape)}, Hugging Face's {list(want.shape)}")
    delta = float(np.abs(got - want).max()) / max(1.0, float(want.std()))
    cmp.worst = max(cmp.worst, delta)
    cmp.rows += want.shape[0]
    if not delta <= VISION_TOLERANCE:
        raise ParityMismatch(f"vision rows: max |Δ| / std {delta:.4f} > {VISION_TOLERANCE}")


def _prefill(v: InternVL, p: ImagePrompt) -> np.ndarray:
    logits: np.ndarray = v.llm.prefill(p.inputs_embeds, p.context_lengths).to_numpy()
    return logits


def _alone(purpose: str) -> Callable[[InternVL, Compare], None]:
    def scenario(v: InternVL, cmp: Compare) -> None:
        (s,) = v.case.of(purpose)
        logits = _prefill(v, v.prompt(s))
        cmp.row(s, s.prompt_length - 1, logits[0], "prefill")
        cmp.token(s, s.prompt_length - 1, int(logits[0].argmax()), "prefill")
        decode_all(v.llm, v.table, [s], cmp, [s.prompt_length - 1], v.case.meta["continuation"] - 1)
    scenario.__doc__ = f"The {purpose!r} prompt prefilled alone, then decoded: each row equals Hugging Face's."
    return scenario


def batch(v: InternVL, cmp: Compare) -> None:
    """The image prompt and a text prompt prefilled together, then decoded together."""
    seqs = [v.case.of(p)[0] for p in ("image", "text")]
    logits = _prefill(v, ImagePrompt.stack([v.prompt(s) for s in seqs]))
    for i, s in enumerate(seqs):
        cmp.row(s, s.prompt_length - 1, logits[i], "batch prefill")
        cmp.token(s, s.prompt_length - 1, int(logits[i].argmax()), "batch prefill")
    decode_all(v.llm, v.table, seqs, cmp, [s.prompt_length - 1 for s in seqs], v.case.meta["continuation"] - 1)


SCENARIOS: dict[str, Callable[[InternVL, Compare], None]] = {
    "vision": vision, "image": _alone("image"), "thumbnail": _alone("thumbnail"), "batch": batch,
}


def run(scenario: str, backend: str = "host", graphs: bool = False, **hooks: Any) -> Compare:
    cmp = Compare()
    with internvl(_case(), backend, graphs, **hooks) as v:
        SCENARIOS[scenario](v, cmp)
    return cmp


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_equals_hugging_face(scenario: str) -> None:
    cmp = run(scenario)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_equals_hugging_face_on_the_cuda_backend(scenario: str, graphs: bool) -> None:
    """The same on device memory, also replayed from CUDA graphs."""
    cmp = run(scenario, backend="cuda", graphs=graphs)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


# -- preprocessing and the graph's I/O -----------------------------------------------------------------------------


def _tiling_config(lo: int, hi: int) -> InternVLConfig:
    case = _case()
    config = json.loads((case.root / "visual" / "config.json").read_text())
    config["builder_config"] = case.builder["visual"]
    return dataclasses.replace(visual_config(case, config), min_tiles=lo, max_tiles=hi)


def test_preprocess_equals_hugging_faces_image_processor() -> None:
    """Every stored image (several aspect ratios, tile bounds 1..6, 2..4, 1..12): trtio's tiles equal the digest of
    Hugging Face's ``GotOcr2ImageProcessorPil`` output (tile count, pixels, every row's and column's sums)."""
    case = _case()
    assert len(case.meta["preprocess"]) >= 5
    seen = set()
    for k, info in enumerate(case.meta["preprocess"]):
        cfg = _tiling_config(info["min_patches"], info["max_patches"])
        pixels, tiles = preprocess(case.arrays[f"pre_image_{k}"], cfg)
        assert tiles.tolist() == [info["tiles"]] and pixels.dtype == np.float32
        problem = _pre_problem(pixels, k)
        assert problem is None, f"image {k} {info}: {problem}"
        seen.add(info["tiles"])
    assert len(seen) >= 4  # one tile, several grids with their thumbnail


def _pre_problem(pixels: np.ndarray, k: int) -> str | None:
    arrays = _case().arrays
    renamed = {f"pre{k}_{name}": arrays[f"pre_{name}_{k}"] for name in ("sampled", "rows", "cols")}
    return digest_problem(pixels, renamed, f"pre{k}")


PREPROCESS_BUGS: dict[str, Callable[[InternVLConfig], InternVLConfig]] = {
    "CLIP's mean and std instead of ImageNet's": lambda c: dataclasses.replace(c, image_mean=CLIP_MEAN,
                                                                                image_std=CLIP_STD),
    "one tile fewer allowed": lambda c: dataclasses.replace(c, max_tiles=c.max_tiles - 1),
    "no rescale": lambda c: dataclasses.replace(c, do_rescale=False),
}


@pytest.mark.parametrize("bug", list(PREPROCESS_BUGS))
def test_a_planted_preprocessing_bug_differs_from_hugging_face(bug: str) -> None:
    case = _case()
    found = []
    for k, info in enumerate(case.meta["preprocess"]):
        cfg = PREPROCESS_BUGS[bug](_tiling_config(info["min_patches"], info["max_patches"]))
        pixels, _ = preprocess(case.arrays[f"pre_image_{k}"], cfg)
        found.append(_pre_problem(pixels, k))
    assert any(p is not None for p in found), f"{bug}: every image still equals Hugging Face's"


def test_the_registry_matches_the_exported_graph() -> None:
    """trtio's bindings for the encoder are the exporter's graph I/O (names, dtypes, ranks, fixed widths), and its
    profile is the one the real builder function set (``profiles.json``)."""
    case = _case()
    model = onnx.load(str(case.root / "visual" / "model.onnx"), load_external_data=False)
    graph = {v.name: (io, v) for io, values in (("input", model.graph.input), ("output", model.graph.output))
             for v in values}
    config = json.loads((case.root / "visual" / "config.json").read_text())
    config["builder_config"] = case.builder["visual"]
    registry = internvl_registry(visual_config(case, config))
    assert {s.name for s in registry} == set(graph) == {"input", "output"}
    for spec in registry:
        io, value = graph[spec.name]
        t = value.type.tensor_type
        assert spec.is_input == (io == "input")
        assert spec.dtype is DType.FLOAT16 and t.elem_type == onnx.TensorProto.FLOAT16
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        assert len(spec.shape) == len(dims)
        for want, got in zip(spec.shape, dims):
            assert (got is None) == isinstance(want, str), (spec.name, spec.shape, dims)
            if got is not None:
                assert want == got
    (profile,) = registry.get("input").profiles
    assert [list(p) for p in profile] == case.profiles["visual"]["input"]["profile0"]


# -- planted bugs ---------------------------------------------------------------------------------------------------


def _renormalised(pixels: np.ndarray, tiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tiles normalised with CLIP's mean and std instead of ImageNet's."""
    mean, std = (np.asarray(v, np.float32)[:, None, None] for v in ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))
    raw = pixels * std + mean
    return ((raw - np.asarray(CLIP_MEAN, np.float32)[:, None, None]) / np.asarray(CLIP_STD, np.float32)[:, None, None],
            tiles)


def _thumbnail_first(pixels: np.ndarray, tiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The last image's thumbnail put before its grid (HF and Edge-LLM append it)."""
    n = int(tiles[-1])
    start = pixels.shape[0] - n
    order = list(range(start)) + [pixels.shape[0] - 1] + list(range(start, pixels.shape[0] - 1))
    return pixels[order], tiles


def _grid_swapped(pixels: np.ndarray, tiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The last image's first two tiles swapped (its grid read right to left)."""
    start = pixels.shape[0] - int(tiles[-1])
    order = list(range(pixels.shape[0]))
    order[start], order[start + 1] = order[start + 1], order[start]
    return pixels[order], tiles


def _thumbnail_dropped(pixels: np.ndarray, tiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The last image's thumbnail missing."""
    counts = tiles.copy()
    counts[-1] -= 1
    return pixels[:-1], counts


def _image_rows_late(inputs: dict[str, np.ndarray]) -> None:
    """The prefill's embeddings one row late (the splice writes the ViT's rows one token off)."""
    if inputs["execution_phase_marker"].shape[0] == 1:
        inputs["inputs_embeds"] = np.roll(inputs["inputs_embeds"], 1, axis=0)


# name -> (scenario, hooks)
BUGS: dict[str, tuple[str, dict[str, Any]]] = {
    "CLIP's mean and std instead of ImageNet's": ("image", {"pixels_hook": _renormalised}),
    "the thumbnail before the grid": ("thumbnail", {"pixels_hook": _thumbnail_first}),
    "the grid's tiles swapped": ("thumbnail", {"pixels_hook": _grid_swapped}),
    "the thumbnail missing": ("thumbnail", {"pixels_hook": _thumbnail_dropped}),
    "the image rows spliced one token late": ("image", {"hook": _image_rows_late}),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_bug_fails_parity(bug: str) -> None:
    scenario, hooks = BUGS[bug]
    with pytest.raises(ParityMismatch):
        run(scenario, **hooks)


def test_the_markers_swapped_differ_from_hugging_faces_tokens() -> None:
    """The expansion writes ``<img>`` before and ``</img>`` after the image tokens, as HF's processor: with the two
    ids swapped the expanded prompt is not HF's."""
    case = _case()
    (s,) = case.of("image")
    config = json.loads((case.root / "visual" / "config.json").read_text())
    config["builder_config"] = case.builder["visual"]
    cfg = visual_config(case, config)
    ids = case.arrays[f"prompt_ids_{s.index}"]
    tiles = np.array([case.meta["tiles"]["A"]])
    np.testing.assert_array_equal(expand_image_tokens(ids, tiles, cfg), s.prompt)
    swapped = dataclasses.replace(cfg, img_start_token_id=cfg.img_end_token_id, img_end_token_id=cfg.img_start_token_id)
    assert (expand_image_tokens(ids, tiles, swapped) != s.prompt).sum() == 2
