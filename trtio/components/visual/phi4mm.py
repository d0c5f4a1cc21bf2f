"""Phi-4-multimodal's vision encoder (``visual/config.json`` model_type ``phi4mm``): its config, its graph's
bindings, Hugging Face's HD transform and the image-token layout with the ``sub_GN`` / ``glb_GN`` separator rows.

* :class:`Phi4mmVisualConfig` reads ``visual/config.json`` (``embd_layer.image_embd_layer.crop_size``, the SigLIP
  ``vision_config``, ``image_token_id``, ``vocab_size``, the builder's token caps), the optional
  ``preprocessor_config.json`` (Hugging Face's ``Phi4MultimodalImageProcessor`` keys; its defaults otherwise) and
  the builder's sidecar ``phi4mm_gn_proj.safetensors`` (``glb_GN`` and ``sub_GN``, already projected to the LLM's
  hidden size: Edge-LLM's ``phi4mmViTRunner`` reads them from there).
* :func:`phi4mm_registry`: the graph Edge-LLM's builder writes (``models/phi4mm/modeling_phi4mm_visual.py``):
  ``input`` float16 ``[blocks, 3, crop, crop]`` -> ``output`` float16 ``[blocks * 256, hidden]``, one profile of
  ``max(1, min_image_tokens // 256) .. max(1, max_image_tokens // 256)`` blocks (``core/builder.py``).
* :func:`preprocess`: the numbers Hugging Face's ``Phi4MultimodalImageProcessor`` (transformers 5.14) gives: each
  image resized keeping its aspect ratio into a grid of ``crop``-pixel blocks (at most ``dynamic_hd``; torchvision's
  antialiased bilinear on 8 bits, computed as Pillow computes it), padded with white, rescaled and normalised; the
  global block a bicubic (A = -0.75, no antialias) resize of that normalised picture; blocks global first, then
  the grid row by row. Also each image's layout: grid rows and columns and the useful token rows and columns (HF's
  attention mask: tokens of the white padding are dropped).
* :func:`image_tokens` / :func:`expand_image_pads` / :func:`image_rows` / :func:`splice`: the placeholder expansion
  and the rows spliced over it, per image: the sub-grid's useful tokens row by row, each row ended by ``sub_GN``; then
  ``glb_GN``; then the global block's 16 x 16 tokens, each row ended by ``sub_GN`` (Hugging Face's
  ``Phi4MultimodalImageEmbedding.forward``; Edge-LLM's ``phi4mmViTRunner::infer`` and
  ``phi4mmPostprocessVisionTokens`` put them in the same places for a grid without padding).

``docs/edgellm-assumptions.md`` section 19 lists what is assumed, and where Edge-LLM's own preprocessing differs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from trtio._checks import is_int
from trtio._dtypes import DType
from trtio._registry import TensorRegistry, TensorSpec
from trtio._safetensors import read_safetensors
from trtio.components.config_files import ComponentFiles, keys_of
from trtio.errors import ConfigError, InvalidTypeError, ShapeError

__all__ = ["GN_FILE", "PHI4MM_KIND", "Phi4mmVisualConfig", "expand_image_pads", "image_rows", "image_tokens",
           "phi4mm_registry", "preprocess", "splice"]

PHI4MM_KIND = "phi4mm"
GN_FILE = "phi4mm_gn_proj.safetensors"
_CONFIG_FILE = "config.json"
# Edge-LLM's runner: each block's ViT tokens are average-pooled 2 x 2 (``blockDownsampleRatio`` 28 = 2 patches).
_POOL = 2
# Hugging Face's Phi4MultimodalImageProcessor defaults (transformers 5.14).
_HF_MEAN = (0.5, 0.5, 0.5)
_HF_STD = (0.5, 0.5, 0.5)
_HF_DYNAMIC_HD = 36
# A layout row: (grid rows, grid columns, useful token rows, useful token columns).
LAYOUT_WIDTH = 4


@dataclass(frozen=True)
class Phi4mmVisualConfig:
    """Phi-4-MM's vision encoder config (see module docstring); build it with :meth:`from_dir`.

    ``out_hidden_size`` is the LLM's hidden size, the width of the graph's output and of the sidecar's ``glb_GN`` /
    ``sub_GN`` rows (float16 ``[out_hidden_size]`` each)."""

    crop_size: int
    patch_size: int
    hidden_size: int  # the ViT's width
    out_hidden_size: int
    vocab_size: int
    image_token_id: int
    min_image_tokens: int
    max_image_tokens: int
    max_image_tokens_per_image: int
    glb_gn: np.ndarray = field(compare=False, repr=False)
    sub_gn: np.ndarray = field(compare=False, repr=False)
    image_mean: tuple[float, ...] = _HF_MEAN
    image_std: tuple[float, ...] = _HF_STD
    rescale_factor: float = 1.0 / 255.0
    dynamic_hd: int = _HF_DYNAMIC_HD
    in_channels: int = 3
    model_type: str = PHI4MM_KIND
    extras: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.model_type != PHI4MM_KIND:
            raise ConfigError("model_type", f"expected {PHI4MM_KIND!r}, got {self.model_type!r}")
        for name in ("crop_size", "patch_size", "hidden_size", "out_hidden_size", "vocab_size", "min_image_tokens",
                     "max_image_tokens", "max_image_tokens_per_image", "dynamic_hd", "in_channels"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ConfigError(name, f"expected an integer >= 1, got {value!r}")
        if self.crop_size % (self.patch_size * _POOL):
            raise ConfigError("embd_layer.image_embd_layer.crop_size",
                              f"{self.crop_size} is not a multiple of patch_size x 2 = {self.patch_size * _POOL} "
                              f"(a block's tokens are its patches pooled 2 x 2)")
        if not is_int(self.image_token_id) or not 0 <= self.image_token_id < self.vocab_size:
            raise ConfigError("image_token_id", f"expected a token id in 0..{self.vocab_size - 1}, got "
                                                f"{self.image_token_id!r}")
        if not self.min_image_tokens <= self.max_image_tokens_per_image <= self.max_image_tokens:
            raise ConfigError("builder_config", f"expected min_image_tokens <= max_image_tokens_per_image <= "
                                                f"max_image_tokens, got {self.min_image_tokens}, "
                                                f"{self.max_image_tokens_per_image}, {self.max_image_tokens}")
        for name in ("glb_gn", "sub_gn"):
            row = getattr(self, name)
            if not isinstance(row, np.ndarray) or row.shape != (self.out_hidden_size,) or row.dtype != np.float16:
                got = f"{row.dtype} {list(row.shape)}" if isinstance(row, np.ndarray) else type(row).__name__
                raise ConfigError(f"{GN_FILE}: {name[:3]}_GN",
                                  f"expected float16 [{self.out_hidden_size}] (projected to the LLM's hidden size), "
                                  f"got {got}")
            own = row.copy()
            own.flags.writeable = False
            object.__setattr__(self, name, own)
        for stat in ("image_mean", "image_std"):
            values = getattr(self, stat)
            if len(values) != self.in_channels or (stat == "image_std" and min(values) <= 0):
                raise ConfigError(stat, f"expected {self.in_channels} numbers (one per channel), got {list(values)}")
        object.__setattr__(self, "extras", MappingProxyType(dict(self.extras)))

    @property
    def kind(self) -> str:
        """Which vision encoder this is: ``"phi4mm"``."""
        return self.model_type

    @property
    def tokens_per_side(self) -> int:
        """A block's tokens along each side: ``crop_size / patch_size / 2`` (16 for 448 / 14)."""
        return self.crop_size // self.patch_size // _POOL

    @property
    def tokens_per_block(self) -> int:
        """The graph's output rows per input block (256)."""
        return self.tokens_per_side ** 2

    @property
    def min_blocks(self) -> int:
        """The fewest blocks one call takes (Edge-LLM's builder: ``max(1, min_image_tokens // 256)``)."""
        return max(1, self.min_image_tokens // self.tokens_per_block)

    @property
    def max_blocks(self) -> int:
        """The most blocks one call takes (``max(1, max_image_tokens // 256)``)."""
        return max(1, self.max_image_tokens // self.tokens_per_block)

    # -- reading ----------------------------------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str | os.PathLike[str]) -> Phi4mmVisualConfig:
        """``path/config.json``, ``path/phi4mm_gn_proj.safetensors`` and, where present, ``path/
        preprocessor_config.json``. ConfigError naming the file and the key for a missing or malformed one."""
        files = ComponentFiles("Phi4mmVisualConfig.from_dir", path, _CONFIG_FILE)
        root, file, data, pre = Path(path), files.what, files.data, files.preprocessor
        if not isinstance(data, Mapping):
            raise ConfigError(file, f"expected a JSON object, got {type(data).__name__}")
        gn_file = root / GN_FILE
        if not gn_file.is_file():
            raise ConfigError(str(gn_file), "is missing: Edge-LLM's builder writes the projected glb_GN / sub_GN "
                                            "separator rows there, and the image-token layout needs them")
        tensors = read_safetensors(gn_file, ("glb_GN", "sub_GN"))
        with keys_of(file):
            values = _values(data)
        if pre is not None:
            with keys_of(files.preprocessor_what):
                values.update(_preprocessing(pre, values))
        glb, sub = (np.array(tensors[n].array) for n in ("glb_GN", "sub_GN"))
        try:
            return cls(**values, out_hidden_size=int(glb.shape[-1]), glb_gn=glb.reshape(-1), sub_gn=sub.reshape(-1))
        except ConfigError as exc:  # a sidecar problem names the sidecar, any other the config
            where = str(root / exc.field) if exc.field.startswith(GN_FILE) else f"{file}: {exc.field}"
            raise ConfigError(where, exc.message) from None


def _int(data: Mapping[str, Any], key: str, where: str = "", minimum: int = 1) -> int:
    value = data.get(key)
    name = f"{where}.{key}" if where else key
    if value is None:
        raise ConfigError(name, "is missing")
    if not is_int(value) or value < minimum:
        raise ConfigError(name, f"expected an integer >= {minimum}, got {value!r}")
    return int(value)


def _section(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    section = data.get(key)
    if not isinstance(section, Mapping):
        raise ConfigError(key, f"expected an object, got {'nothing' if section is None else type(section).__name__}")
    return section


def _values(data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of Edge-LLM's ``visual/config.json`` for phi4mm (``runtime_config.py::component_runtime_config``)."""
    if data.get("model_type") != PHI4MM_KIND:
        raise ConfigError("model_type", f"expected {PHI4MM_KIND!r}, got {data.get('model_type')!r}")
    vision = _section(data, "vision_config")
    embd = _section(_section(data, "embd_layer"), "image_embd_layer") if "embd_layer" in data else None
    if embd is None:
        raise ConfigError("embd_layer.image_embd_layer.crop_size", "is missing (Edge-LLM's runner reads the block "
                                                                    "size there)")
    crop = _int(embd, "crop_size", "embd_layer.image_embd_layer")
    image_size = vision.get("image_size", crop)
    if image_size != crop:
        raise ConfigError("vision_config.image_size", f"is {image_size!r}, but embd_layer.image_embd_layer.crop_size "
                                                      f"is {crop}: the graph's blocks and the runner's crops differ")
    builder = _section(data, "builder_config")
    token = data.get("image_token_id", vision.get("image_token_id"))
    if token is None:
        raise ConfigError("vision_config.image_token_id", "is missing")
    used = {"image_size", "patch_size", "hidden_size", "image_token_id", "num_channels"}
    extras = {f"vision_config.{k}": v for k, v in vision.items() if k not in used}
    return {
        "crop_size": crop, "patch_size": _int(vision, "patch_size", "vision_config"),
        "hidden_size": _int(vision, "hidden_size", "vision_config"),
        "in_channels": int(vision.get("num_channels", 3)),
        "vocab_size": _int(data, "vocab_size"), "image_token_id": token,
        "min_image_tokens": _int(builder, "min_image_tokens", "builder_config"),
        "max_image_tokens": _int(builder, "max_image_tokens", "builder_config"),
        "max_image_tokens_per_image": _int(builder, "max_image_tokens_per_image", "builder_config"),
        "extras": extras,
    }


def _preprocessing(data: Any, values: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of Hugging Face's ``Phi4MultimodalImageProcessor`` config that change its numbers; a key it reads
    that trtio does not implement (another resample filter, rescale or normalise turned off) is refused."""
    if not isinstance(data, Mapping):
        raise ConfigError("", f"expected a JSON object, got {type(data).__name__}")
    out: dict[str, Any] = {}
    size = data.get("size")
    if size is not None:
        sides = {size.get("height"), size.get("width")} if isinstance(size, Mapping) else {size}
        if sides != {values["crop_size"]}:
            raise ConfigError("size", f"is {size!r}; the visual engine's blocks are {values['crop_size']} pixels "
                                      f"square")
    for key, want in (("do_rescale", True), ("do_normalize", True), ("do_convert_rgb", True), ("resample", 3)):
        if key in data and data[key] != want:
            raise ConfigError(key, f"is {data[key]!r}; trtio implements the processor with {key} {want!r}")
    if data.get("patch_size") not in (None, values["patch_size"]):
        raise ConfigError("patch_size", f"is {data['patch_size']!r}, the visual config says {values['patch_size']}")
    for stat in ("image_mean", "image_std"):
        v = data.get(stat)
        if v is not None:
            if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                raise ConfigError(stat, f"expected a list of numbers, got {v!r}")
            out[stat] = tuple(float(x) for x in v)
    for key, name in (("dynamic_hd", "dynamic_hd"),):
        if data.get(key) is not None:
            out[name] = _int(data, key)
    factor = data.get("rescale_factor")
    if factor is not None:
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not factor > 0:
            raise ConfigError("rescale_factor", f"expected a number > 0, got {factor!r}")
        out["rescale_factor"] = float(factor)
    return out


# -- the graph -------------------------------------------------------------------------------------------------------

kVisualInput = "input"
kVisualOutput = "output"


def phi4mm_registry(cfg: Phi4mmVisualConfig) -> TensorRegistry:
    """The graph's two bindings (Edge-LLM's builder, ``models/phi4mm/modeling_phi4mm_visual.py``): ``input`` float16
    ``[vit_patches, 3, crop, crop]`` (here ``vit_patches`` counts blocks) and ``output`` float16 ``[vit_tokens,
    out_hidden_size]`` (256 tokens a block), with the builder's one profile over the blocks."""
    lo, hi = cfg.min_blocks, cfg.max_blocks
    c, s = cfg.in_channels, cfg.crop_size
    profile = ((lo, c, s, s), ((lo + hi) // 2, c, s, s), (hi, c, s, s))
    return TensorRegistry("visual", [
        TensorSpec(kVisualInput, "input", DType.FLOAT16, ("vit_patches", c, s, s), profiles=(profile,)),
        TensorSpec(kVisualOutput, "output", DType.FLOAT16, ("vit_tokens", cfg.out_hidden_size)),
    ], contract="visual")


# -- preprocessing ---------------------------------------------------------------------------------------------------


def _closest_ratio(aspect: float, ratios: list[tuple[int, int]], width: int, height: int, side: int) -> tuple[int, int]:
    """Hugging Face's ``find_closest_aspect_ratio``: the first of ``ratios`` nearest ``aspect``; a tie goes to the
    later one where the image covers more than half its area."""
    best_diff, best = float("inf"), (1, 1)
    for ratio in ratios:
        diff = abs(aspect - ratio[0] / ratio[1])
        if diff < best_diff:
            best_diff, best = diff, ratio
        elif diff == best_diff and width * height > 0.5 * side * side * ratio[0] * ratio[1]:
            best = ratio
    return best


def hd_grid(height: int, width: int, cfg: Phi4mmVisualConfig) -> tuple[tuple[int, int], tuple[int, int], np.ndarray]:
    """Hugging Face's ``dynamic_preprocess`` for an image of ``height x width`` pixels: ``((grid columns, grid
    rows), (resized width, resized height), the patch mask [rows * crop / patch, cols * crop / patch])``."""
    side, patch, most = cfg.crop_size, cfg.patch_size, cfg.dynamic_hd
    w_crops, h_crops = math.ceil(width / float(side)), math.ceil(height / float(side))
    if w_crops * h_crops > most:
        # the set HF builds, sorted by area as HF sorts it (ties keep the set's order, as in HF)
        ratios = sorted({(i, j) for n in range(1, most + 1) for i in range(1, n + 1) for j in range(1, n + 1)
                         if 1 <= i * j <= most}, key=lambda x: x[0] * x[1])
        grid = _closest_ratio(width / height, ratios, width, height, side)
    else:
        grid = (w_crops, h_crops)
    tw, th = side * grid[0], side * grid[1]
    if tw / width < th / height:
        size = (tw, int(height * (tw / width)))
        pad_w, pad_h = 0, th - size[1]
    else:
        size = (int(width * (th / height)), th)
        pad_w, pad_h = tw - size[0], 0
    if min(size[1], th) < 10 or min(size[0], tw) < 10:
        raise ShapeError(f"image: {height} x {width} pixels, an aspect ratio too extreme for Phi-4-MM's HD transform "
                         f"(resized to {size[1]} x {size[0]})")
    mask = np.ones((side // patch * grid[1], side // patch * grid[0]), np.int64)
    if pad_w >= patch:
        mask[:, -(pad_w // patch):] = 0
    if pad_h >= patch:
        mask[-(pad_h // patch):, :] = 0
    return grid, size, mask


# torch's uint8 antialiased resize keeps its fixed-point weights in int16 (``UpSampleKernel.cpp``,
# ``_compute_indices_int16_weights_aa``): the fraction bits where the largest weight first reaches 2^14 (at most 22).
_MAX_PRECISION = 22
_INT16_LIMIT = 1 << 15


def _bilinear_coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The coefficients of torch's uint8 antialiased bilinear resize along one axis (the path torchvision takes on a
    CPU with AVX2): each output's first input, its fixed-point weights and their fraction bits. The weights are
    Pillow's (a triangle of support 1, widened by the scale where the image shrinks, normalised per output)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    centers = (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum(np.trunc(centers - support + 0.5).astype(np.int64), 0)
    xmax = np.minimum(np.trunc(centers + support + 0.5).astype(np.int64), in_size) - xmin
    x = np.arange(ksize)
    taps = x[None, :] < xmax[:, None]
    weights = np.where(taps, np.maximum(0.0, 1.0 - np.abs((x[None, :] + xmin[:, None] - centers[:, None] + 0.5)
                                                          / filterscale)), 0.0)
    total = weights.sum(axis=1, keepdims=True)
    weights = np.where(total != 0.0, weights / np.where(total != 0.0, total, 1.0), weights)
    top = float(weights.max())
    bits = 0
    while bits < _MAX_PRECISION and int(0.5 + top * (1 << (bits + 1))) < _INT16_LIMIT:
        bits += 1
    scaled = weights * (1 << bits)
    return xmin, np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int64), bits


def _bilinear_axis(img: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    in_size = img.shape[axis]
    start, fixed, bits = _bilinear_coefficients(in_size, out_size)
    src = np.moveaxis(img, axis, 0).astype(np.int64)
    acc = np.full((out_size,) + src.shape[1:], 1 << (bits - 1), np.int64)
    for j in range(fixed.shape[1]):
        at = np.minimum(start + j, in_size - 1)
        acc += src[at] * fixed[:, j][:, None, None]
    return np.ascontiguousarray(np.moveaxis(np.clip(acc >> bits, 0, 255).astype(np.uint8), 0, axis))


def resize_bilinear_aa(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 ``[H, W, C]`` resized to ``[height, width, C]`` as torchvision's ``resize`` (bilinear, antialias) does
    on a uint8 image: the horizontal pass, then the vertical one, each rounded to 8 bits."""
    out = img
    if width != out.shape[1]:
        out = _bilinear_axis(out, width, 1)
    if height != out.shape[0]:
        out = _bilinear_axis(out, height, 0)
    return out


def _cubic_weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """torch's ``interpolate(mode="bicubic", align_corners=False)`` without antialias: each output's 4 source indices
    (clamped into the input) and weights (A = -0.75)."""
    a = -0.75
    src = (np.arange(out_size) + 0.5) * (in_size / out_size) - 0.5
    x0 = np.floor(src)
    t = src - x0
    d = np.stack([t + 1, t, 1 - t, 2 - t], axis=1)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    w = np.where(d <= 1, near, far)
    idx = np.clip(x0[:, None].astype(np.int64) + np.arange(-1, 3)[None, :], 0, in_size - 1)
    return idx, w


def resize_bicubic_float(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """float32 ``[C, H, W]`` resized to ``[C, height, width]`` as torch's bicubic ``interpolate`` (no antialias)."""
    ri, rw = _cubic_weights(img.shape[1], height)
    ci, cw = _cubic_weights(img.shape[2], width)
    x = img.astype(np.float64)
    rows = (x[:, ri, :] * rw[None, :, :, None]).sum(axis=2)  # [C, height, W]
    out: np.ndarray = (rows[:, :, ci] * cw[None, None, :, :]).sum(axis=3).astype(np.float32)
    return out


def _as_rgb(image: Any, i: int) -> np.ndarray:
    if hasattr(image, "convert") and hasattr(image, "mode"):  # a PIL image: HF converts it to RGB
        image = image.convert("RGB") if image.mode != "RGB" else image
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ShapeError(f"images[{i}]: expected 8-bit RGB pixels, uint8 [height, width, 3] (or a PIL image), got "
                         f"{arr.dtype} {list(arr.shape)}")
    return arr


def _one_image(arr: np.ndarray, cfg: Phi4mmVisualConfig) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """One image's blocks (float32 ``[1 + rows * cols, 3, crop, crop]``, the global one first) and its layout row."""
    side = cfg.crop_size
    (cols, rows), (new_w, new_h), mask = hd_grid(arr.shape[0], arr.shape[1], cfg)
    resized = resize_bilinear_aa(arr, new_h, new_w) if (new_h, new_w) != arr.shape[:2] else arr
    padded = np.full((rows * side, cols * side, 3), 255, np.uint8)
    padded[:new_h, :new_w] = resized
    mean = np.asarray(cfg.image_mean, np.float32) * np.float32(1.0 / cfg.rescale_factor)
    std = np.asarray(cfg.image_std, np.float32) * np.float32(1.0 / cfg.rescale_factor)
    hd = ((padded.astype(np.float32) - mean) / std).transpose(2, 0, 1)  # [3, H, W]
    glb = resize_bicubic_float(hd, side, side)
    subs = hd.reshape(3, rows, side, cols, side).transpose(1, 3, 0, 2, 4).reshape(rows * cols, 3, side, side)
    pooled = mask[0::_POOL, 0::_POOL]  # HF: the mask sampled at every other patch, as the tokens are pooled
    useful = (int(pooled[:, 0].sum()), int(pooled[0, :].sum()))
    return np.concatenate([glb[None], subs]), (rows, cols, *useful)


def preprocess(images: Any, cfg: Phi4mmVisualConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(blocks, layout)`` of ``images`` (one image or a sequence: uint8 ``[H, W, 3]`` RGB arrays or PIL images):
    float32 ``[blocks, 3, crop, crop]`` (each image's global block, then its grid row by row; what
    :meth:`Phi4mmVisualSetup.encode <trtio.components.visual.phi4mm_setup.Phi4mmVisualSetup.encode>` takes) and
    int64 ``[images, 4]`` (grid rows, grid columns, useful token rows, useful token columns)."""
    if isinstance(images, np.ndarray) and images.ndim == 3 or hasattr(images, "mode"):
        images = [images]
    if isinstance(images, (str, bytes)) or not isinstance(images, Sequence) or not images:
        raise InvalidTypeError(f"preprocess: expected an image or a non-empty sequence of images, got "
                               f"{type(images).__name__}")
    blocks, layout = [], []
    for i, image in enumerate(images):
        b, row = _one_image(_as_rgb(image, i), cfg)
        blocks.append(b)
        layout.append(row)
    return np.ascontiguousarray(np.concatenate(blocks)), np.asarray(layout, np.int64)


# -- the image-token layout ------------------------------------------------------------------------------------------


def check_layout(layout: Any, cfg: Phi4mmVisualConfig) -> np.ndarray:
    """``layout`` as int64 ``[images, 4]``; ShapeError naming the row where the useful tokens pass the grid."""
    arr = np.asarray(layout)
    if arr.ndim == 1 and arr.shape == (LAYOUT_WIDTH,):
        arr = arr[None]
    if arr.ndim != 2 or arr.shape[1] != LAYOUT_WIDTH or arr.dtype.kind not in "iu":
        raise ShapeError(f"layout: expected integer rows (grid rows, grid columns, useful token rows, useful token "
                         f"columns), [images, 4], got {arr.dtype} {list(arr.shape)}")
    n = cfg.tokens_per_side
    for i, (rows, cols, ur, uc) in enumerate(arr.tolist()):
        if rows < 1 or cols < 1 or not 1 <= ur <= rows * n or not 1 <= uc <= cols * n:
            raise ShapeError(f"layout[{i}] = ({rows}, {cols}, {ur}, {uc}): expected a grid of at least one block and "
                             f"1..{n} useful token rows and columns per block row and column")
    return arr.astype(np.int64)


def image_tokens(layout_row: Sequence[int], cfg: Phi4mmVisualConfig) -> int:
    """The LLM tokens one image becomes: its useful sub tokens and one ``sub_GN`` per useful row, ``glb_GN``, the
    global block's tokens and one ``sub_GN`` per row (HF's ``num_img_tokens``: 256 + 1 + useful + rows + 16)."""
    _, _, ur, uc = (int(x) for x in layout_row)
    n = cfg.tokens_per_side
    return ur * (uc + 1) + 1 + n * (n + 1)


def expand_image_pads(token_ids: Any, layout: Any, cfg: Phi4mmVisualConfig) -> np.ndarray:
    """``token_ids`` with its i-th ``image_token_id`` expanded into :func:`image_tokens` copies for image i (HF's
    processor; Edge-LLM's ``Phi4MMViTRunner::textPreprocess``). ShapeError where the pads and the images differ in
    number."""
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ShapeError(f"token_ids: expected a 1-D integer array, got {ids.dtype} {list(ids.shape)}")
    grid = check_layout(layout, cfg)
    pads = np.flatnonzero(ids == cfg.image_token_id)
    if pads.size != grid.shape[0]:
        raise ShapeError(f"token_ids: {pads.size} image_token_id ({cfg.image_token_id}) placeholders for "
                         f"{grid.shape[0]} images; expected one per image")
    counts = np.ones(ids.shape[0], np.int64)
    counts[pads] = [image_tokens(row, cfg) for row in grid.tolist()]
    return np.repeat(ids.astype(np.int64), counts)


def image_rows(encoded: Any, layout: Any, cfg: Phi4mmVisualConfig) -> np.ndarray:
    """The rows spliced over the expanded placeholders (``[sum of image_tokens, out_hidden_size]``, float16) from
    the graph's output ``encoded`` (``[blocks * 256, out_hidden_size]``, the blocks in :func:`preprocess`'s
    order): per image its sub-grid's useful tokens row by row, each row ended by ``sub_GN``; ``glb_GN``; the
    global block's tokens row by row, each row ended by ``sub_GN``."""
    grid = check_layout(layout, cfg)
    n, h = cfg.tokens_per_side, cfg.out_hidden_size
    blocks = int(sum(1 + r * c for r, c, _, _ in grid.tolist()))
    x = np.asarray(encoded)
    if x.shape != (blocks * n * n, h) or x.dtype.kind != "f":
        raise ShapeError(f"encoded: expected [{blocks * n * n}, {h}] float rows ({blocks} blocks of {n * n} tokens), "
                         f"got {x.dtype} {list(x.shape)}")
    x = x.astype(np.float16).reshape(blocks, n, n, h)
    out, at = [], 0
    for rows, cols, ur, uc in grid.tolist():
        glb = x[at]
        sub = x[at + 1:at + 1 + rows * cols].reshape(rows, cols, n, n, h).transpose(0, 2, 1, 3, 4)
        sub = sub.reshape(rows * n, cols * n, h)[:ur, :uc]
        out.append(np.concatenate([sub, np.broadcast_to(cfg.sub_gn, (ur, 1, h))], axis=1).reshape(-1, h))
        out.append(cfg.glb_gn[None])
        out.append(np.concatenate([glb, np.broadcast_to(cfg.sub_gn, (n, 1, h))], axis=1).reshape(-1, h))
        at += 1 + rows * cols
    return np.ascontiguousarray(np.concatenate(out))



def splice(token_ids: Any, layout: Any, cfg: Phi4mmVisualConfig, embedding: Any,
           encoded: Any) -> tuple[np.ndarray, np.ndarray]:
    """One prompt with its images spliced in: ``(ids, inputs_embeds)``, the expanded token ids (``[n]``) and their rows
    (``[n, hidden]``, the embedding table's dtype): text tokens looked up in ``embedding`` (``[vocab, hidden]``, a
    host array), each image's :func:`image_rows` over its expanded placeholder. ``encoded``: the encoder's rows for
    all the images (a host array or the ``embeds`` Tensor of an encode, read with a synchronising copy).
    The prompt's positions are plain (0 .. n - 1): Phi-4-MM's LLM has no MRoPE."""
    ids = expand_image_pads(token_ids, layout, cfg)
    table = np.asarray(embedding)
    if table.ndim != 2 or table.dtype.kind != "f" or table.shape[1] != cfg.out_hidden_size:
        raise ShapeError(f"embedding: expected a [vocab, {cfg.out_hidden_size}] float table, got {table.dtype} "
                         f"{list(table.shape)}")
    bad = np.flatnonzero((ids < 0) | (ids >= table.shape[0]))
    if bad.size:
        raise ShapeError(f"token_ids: token {int(ids[bad[0]])} is outside the {table.shape[0]}-row embedding")
    rows = encoded.to_numpy() if hasattr(encoded, "to_numpy") else encoded
    embeds = table[ids].copy()
    embeds[ids == cfg.image_token_id] = image_rows(rows, layout, cfg).astype(table.dtype)
    return ids, embeds

# -- the component's reading -----------------------------------------------------------------------------------------


def read_phi4mm(folder: Path, llm: Any) -> Phi4mmVisualConfig:
    """``folder``'s config (:meth:`Phi4mmVisualConfig.from_dir`), checked against the LLM's ``llm`` (an
    LLMEngineConfig): the separator rows and the graph's output as wide as its hidden size, the same vocabulary and
    the same ``image_token_id`` (the LLM's top-level key, Edge-LLM's builder writes it there, or its
    ``vision_config``'s). ConfigError naming the file and the key."""
    cfg = Phi4mmVisualConfig.from_dir(folder)
    file = folder / _CONFIG_FILE
    if cfg.out_hidden_size != llm.hidden_size:
        raise ConfigError(f"{folder / GN_FILE}: glb_GN", f"rows of {cfg.out_hidden_size}, but the LLM's hidden_size is "
                                                         f"{llm.hidden_size}: the image tokens take the place of text "
                                                         f"embeddings")
    if cfg.vocab_size != llm.vocab_size:
        raise ConfigError(f"{file}: vocab_size", f"is {cfg.vocab_size}, the LLM's is {llm.vocab_size}")
    vision = llm.extras.get("vision_config")
    theirs = llm.extras.get("image_token_id", vision.get("image_token_id") if isinstance(vision, Mapping) else None)
    if theirs is not None and theirs != cfg.image_token_id:
        raise ConfigError(f"{file}: image_token_id", f"is {cfg.image_token_id}, the LLM's config says {theirs}")
    return cfg
