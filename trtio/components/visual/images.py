"""The glue between images and a vision-language model's LLM: preprocessing, the image-token splice and
3-axis MRoPE positions (Qwen2.5-VL and Qwen3-VL; :class:`~trtio.components.visual.visual_config.VisualConfig`).

* :func:`preprocess` resizes each image (:func:`smart_resize`: whole ``patch_size * merge_size`` blocks,
  between the config's ``min_pixels`` and ``max_pixels``) with bicubic resampling computed exactly as
  Pillow computes it on 8-bit images, rescales and normalises it and cuts it into patches: the numbers
  Hugging Face's Qwen2-VL image processor (``Qwen2VLImageProcessorPil``, which Qwen2.5-VL and Qwen3-VL
  use) gives for the same image and config. It returns ``(patches, grid_thw)`` for
  :meth:`trtio.components.visual.visual_setup.VisualSetup.encode`.
* :func:`splice` expands each image pad of a prompt into its ``t * h * w / merge_size ** 2`` image
  tokens, looks the text tokens up in the embedding table, writes the ViT's rows over the image tokens'
  rows, scatters the deepstack features (zero rows elsewhere) and computes the MRoPE positions
  (:func:`mrope_positions`, Hugging Face's ``get_rope_index`` for images) and the sequence's position delta:
  a generated token at cache position ``k`` has position ``k + delta`` on all three axes. The result
  (:class:`VisionPrompt`, or several stacked with :meth:`VisionPrompt.stack`) is what an LLM setup's
  ``prefill(..., deepstack_embeds=, mrope_positions=)`` takes.

Everything here is host-side numpy; nothing is enqueued on a device except where :func:`splice` reads a
:class:`~trtio.components.visual.visual_setup.VisualOutput` (a synchronising copy, see there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._stream import StreamLike
from trtio.components.splice_checks import checked_ids, embedding_table
from trtio.components.visual.visual_config import VisualConfig
from trtio.components.visual.visual_kinds import kind_of
from trtio.components.visual.vit import check_grid
from trtio.errors import ConfigError, InvalidTypeError, ShapeError

__all__ = ["VisionPrompt", "expand_image_pads", "mrope_positions", "preprocess", "smart_resize", "splice"]

_MAX_RATIO = 200  # the widest aspect ratio Hugging Face's smart_resize takes


# -- resizing ---------------------------------------------------------------------------------------


def smart_resize(height: int, width: int, cfg: VisualConfig) -> tuple[int, int]:
    """The size Hugging Face's Qwen ``smart_resize`` gives an image of ``height x width`` pixels: each side a
    multiple of ``patch_size * merge_size`` nearest the original, then scaled (keeping the aspect ratio) into
    ``cfg.min_pixels .. cfg.max_pixels``. ShapeError for an aspect ratio over 200."""
    factor = cfg.factor
    if height < 1 or width < 1:
        raise ShapeError(f"image: {height} x {width} pixels; expected at least one pixel each way")
    if max(height, width) / min(height, width) > _MAX_RATIO:
        raise ShapeError(f"image: {height} x {width} pixels, an aspect ratio of "
                         f"{max(height, width) / min(height, width):g}; the Qwen image processors take up to "
                         f"{_MAX_RATIO}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > cfg.max_pixels:
        beta = math.sqrt((height * width) / cfg.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < cfg.min_pixels:
        beta = math.sqrt(cfg.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


# Pillow's 8-bit resampling (libImaging/Resample.c): coefficients in fixed point with this many fraction bits.
_PRECISION_BITS = 32 - 8 - 2
_BICUBIC_SUPPORT = 2.0
_BICUBIC_A = -0.5


def _bicubic(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    a = _BICUBIC_A
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    out: np.ndarray = np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))
    return out


def _coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's ``precompute_coeffs`` + ``normalize_coeffs_8bpc`` for a bicubic resize of ``in_size`` samples to
    ``out_size``: each output's first input (int ``[out]``) and its fixed-point weights (int32 ``[out, k]``, zero
    past the window)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = _BICUBIC_SUPPORT * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    centers = (np.arange(out_size) + 0.5) * scale
    # C's (int) cast truncates toward zero; both bounds are then clamped into the input.
    xmin = np.maximum(np.trunc(centers - support + 0.5).astype(np.int64), 0)
    xmax = np.minimum(np.trunc(centers + support + 0.5).astype(np.int64), in_size) - xmin
    x = np.arange(ksize)
    taps = x[None, :] < xmax[:, None]
    weights = np.where(taps, _bicubic((x[None, :] + xmin[:, None] - centers[:, None] + 0.5) / filterscale), 0.0)
    total = weights.sum(axis=1, keepdims=True)
    weights = np.where(total != 0.0, weights / np.where(total != 0.0, total, 1.0), weights)
    scaled = weights * (1 << _PRECISION_BITS)
    fixed = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int32)
    return xmin, fixed


def _resample_axis(img: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    """One of Pillow's two passes over ``img`` (uint8 ``[H, W, C]``) along ``axis``: each output sample the
    rounded, clipped fixed-point sum of its window."""
    in_size = img.shape[axis]
    start, fixed = _coefficients(in_size, out_size)
    src = np.moveaxis(img, axis, 0).astype(np.int32)  # [in, other, C]
    acc = np.full((out_size,) + src.shape[1:], 1 << (_PRECISION_BITS - 1), np.int32)
    for j in range(fixed.shape[1]):
        at = np.minimum(start + j, in_size - 1)  # taps past the window weigh 0
        acc += src[at] * fixed[:, j][:, None, None]
    out = np.clip(acc >> _PRECISION_BITS, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(np.moveaxis(out, 0, axis))


def resize_bicubic(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 ``[H, W, C]`` resized to ``[height, width, C]`` as Pillow 13's ``Image.resize(..., BICUBIC)`` does: two
    passes, each rounded to 8 bits, the vertical one first where the image loses more than twice as many rows as
    columns, else the horizontal one (a copy of the image where the size is the same). Pillow before 13.0 always
    ran the horizontal pass first, which can change a pixel by one level."""
    rows_lost, cols_lost = img.shape[0] - height, img.shape[1] - width
    order = (0, 1) if rows_lost > 0 and rows_lost > cols_lost * 2 else (1, 0)
    out = img
    for axis in order:
        size = height if axis == 0 else width
        if size != out.shape[axis]:
            out = _resample_axis(out, size, axis)
    return out if out is not img else img.copy()


# -- preprocessing ----------------------------------------------------------------------------------


def _as_rgb(image: Any, i: int, channels: int) -> np.ndarray:
    """An image as uint8 ``[H, W, channels]``, converted as Hugging Face's processor (transformers 5.25) converts
    it: a PIL image to RGB, transparency composited onto white; a uint8 ``[H, W, 4]`` array composited onto white
    (``round(a * rgb + (1 - a) * 255)``, ``a = alpha / 255``), a ``[H, W, 1]`` one repeated to three channels."""
    if hasattr(image, "convert") and hasattr(image, "getbands"):  # a PIL image (pillow is optional: no import)
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            from PIL import Image  # noqa: PLC0415 - the caller's own PIL image: pillow is there

            rgba = image.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            image = Image.alpha_composite(white, rgba).convert("RGB")
        elif image.mode != "RGB":
            image = image.convert("RGB")
    arr = np.asarray(image)
    if arr.dtype == np.uint8 and arr.ndim == 3 and channels == 3 and arr.shape[2] in (1, 4):
        if arr.shape[2] == 1:
            arr = np.repeat(arr, 3, axis=2)
        else:
            alpha = arr[..., 3:4] / 255
            arr = np.round(alpha * arr[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != channels:
        raise ShapeError(f"images[{i}]: expected 8-bit RGB pixels, uint8 [height, width, {channels}] (or a PIL image), "
                         f"got {arr.dtype} {list(arr.shape)}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ShapeError(f"images[{i}]: an empty image {list(arr.shape)}")
    return arr


def preprocess(images: Any, cfg: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(patches, grid_thw)`` of ``images`` (one image or a sequence of them: uint8 ``[H, W, 3]`` RGB arrays or
    PIL images) for a ViT of ``cfg``: float32 ``[N, in_channels * temporal_patch_size * patch_size ** 2]`` and
    int64 ``[images, 3]``, the images' patches one after the other.

    Each image is resized to :func:`smart_resize`'s size with Pillow's 8-bit bicubic resampling, rescaled by
    ``rescale_factor`` (in float64, then float32), normalised with ``image_mean`` / ``image_std`` (float32), repeated
    ``temporal_patch_size`` times and cut into patches in Hugging Face's order (merge block by merge block;
    each patch channel, frame, row, column). The config's ``do_resize`` / ``do_rescale`` / ``do_normalize`` are
    honoured. Needs the directory's ``preprocessor_config.json`` (ConfigError naming it otherwise).

    A config of another encoder kind (:mod:`~trtio.components.visual.visual_kinds`) is that kind's preprocessing:
    InternVL's tiles and each image's tile count
    (:func:`~trtio.components.visual.internvl_images.preprocess_tiles`)."""
    kind = kind_of(cfg)
    if kind is not None:
        return kind.preprocess(images, cfg)
    if cfg.image_mean is None or cfg.image_std is None:
        raise ConfigError("preprocessor_config.json", "the visual directory has no image processor config: "
                                                      "preprocess needs its image_mean and image_std (Edge-LLM's "
                                                      "builder copies the checkpoint's file there)")
    if isinstance(images, np.ndarray) and images.ndim == 3 or hasattr(images, "mode"):
        images = [images]
    if isinstance(images, (str, bytes)) or not isinstance(images, Sequence) or not images:
        raise InvalidTypeError(f"preprocess: expected an image or a non-empty sequence of images, got "
                               f"{type(images).__name__}")
    mean = np.asarray(cfg.image_mean, np.float32)
    std = np.asarray(cfg.image_std, np.float32)
    all_patches, grids = [], []
    for i, image in enumerate(images):
        arr = _as_rgb(image, i, cfg.in_channels)
        h, w = arr.shape[:2]
        if cfg.do_resize:
            h, w = smart_resize(h, w, cfg)
            arr = resize_bicubic(arr, h, w)
        elif h % cfg.factor or w % cfg.factor:
            raise ShapeError(f"images[{i}]: {h} x {w} pixels; without resizing (do_resize false) an image must be "
                             f"whole {cfg.factor}-pixel blocks")
        x: np.ndarray = arr
        if cfg.do_rescale:
            x = (arr.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
        if cfg.do_normalize:
            x = (x.astype(np.float32) - mean) / std
        x = np.asarray(x, np.float32).transpose(2, 0, 1)  # [C, H, W]
        all_patches.append(_patchify(x, cfg))
        grids.append((1, h // cfg.patch_size, w // cfg.patch_size))
    return np.ascontiguousarray(np.concatenate(all_patches)), np.asarray(grids, np.int64)


def _patchify(image: np.ndarray, cfg: VisualConfig) -> np.ndarray:
    """``[C, H, W]`` as Hugging Face's flattened patches: the frame repeated ``temporal_patch_size`` times, the
    patches merge block by merge block."""
    c, h, w = image.shape
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    frames = np.broadcast_to(image[None], (tp, c, h, w))
    gh, gw = h // p, w // p
    x = frames.reshape(1, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gh * gw, c * tp * p * p)


# -- the splice and MRoPE positions --------------------------------------------------------------------


def expand_image_pads(token_ids: Any, grid_thw: Any, cfg: VisualConfig) -> np.ndarray:
    """``token_ids`` (int ``[L]``, one ``image_token_id`` pad per image, as a tokenizer gives it) with pad ``i``
    repeated ``t * h * w / merge_size ** 2`` times (image ``i`` of ``grid_thw``). ShapeError when the pads and
    the images do not pair up, or for a video."""
    ids = _token_ids(token_ids)
    grid = _image_grid(grid_thw, cfg, allow_empty=True)
    if cfg.video_token_id is not None and (ids == cfg.video_token_id).any():
        raise ShapeError(f"token_ids: holds the video pad {cfg.video_token_id}; trtio splices images only")
    pads = np.flatnonzero(ids == cfg.image_token_id)
    if pads.size != grid.shape[0]:
        raise ShapeError(f"token_ids: {pads.size} image pad(s) (token {cfg.image_token_id}) for {grid.shape[0]} "
                         f"image(s) of grid_thw; a prompt holds one pad per image")
    counts = np.ones(ids.shape[0], np.int64)
    counts[pads] = [cfg.image_tokens(tuple(g)) for g in grid.tolist()]
    return np.repeat(ids, counts)


def mrope_positions(token_ids: Any, grid_thw: Any, cfg: VisualConfig) -> tuple[np.ndarray, int]:
    """The 3-axis (temporal, height, width) positions of an expanded prompt (int64 ``[3, L]``) and its position
    delta (``max position + 1 - L``), as Hugging Face's ``get_rope_index`` computes them for images: text
    tokens count on from the last position on all three axes; image ``i``'s tokens (the ``i``-th run of
    ``t * h * w / merge_size ** 2`` image tokens) take ``start + (0, row, column)`` over its merged grid, and the
    text after it starts at ``start + max(rows, columns)``."""
    ids = _token_ids(token_ids)
    grid = _image_grid(grid_thw, cfg, allow_empty=True)
    m = cfg.merge_size
    out = np.empty((3, ids.shape[0]), np.int64)
    is_image = ids == cfg.image_token_id
    pos, i, image = 0, 0, 0
    n_tokens = ids.shape[0]
    while i < n_tokens:
        if not is_image[i]:
            stop = i + 1
            while stop < n_tokens and not is_image[stop]:
                stop += 1
            out[:, i:stop] = np.arange(pos, pos + stop - i)
            pos += stop - i
            i = stop
            continue
        if image >= grid.shape[0]:
            raise ShapeError(f"token_ids: image tokens at {i} beyond the {grid.shape[0]} image(s) of grid_thw")
        t, h, w = (int(x) for x in grid[image])
        lh, lw = h // m, w // m
        n = t * lh * lw
        if i + n > n_tokens or not is_image[i:i + n].all():
            raise ShapeError(f"token_ids: image {image} (grid {t} x {h} x {w}) needs {n} image tokens from index {i}; "
                             f"expand each image pad first (expand_image_pads)")
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(lh), np.arange(lw), indexing="ij")
        out[0, i:i + n] = tt.reshape(-1) + pos
        out[1, i:i + n] = hh.reshape(-1) + pos
        out[2, i:i + n] = ww.reshape(-1) + pos
        pos += max(lh, lw)
        i += n
        image += 1
    if image != grid.shape[0]:
        raise ShapeError(f"token_ids: image tokens for {image} image(s), grid_thw has {grid.shape[0]}")
    delta = int(out.max()) + 1 - n_tokens if n_tokens else 0
    return out, delta


@dataclass(frozen=True)
class VisionPrompt:
    """Prompts with their images spliced in, shaped for an LLM setup's prefill (batch ``B``, longest prompt
    ``S``, hidden ``H``; shorter prompts right-padded with zeros):

    ``setup.prefill(p.inputs_embeds, p.context_lengths, deepstack_embeds=p.deepstack_embeds or None,
    mrope_positions=p.mrope_positions)``.

    ``token_ids`` ``[B, S]`` (image pads expanded), ``inputs_embeds`` ``[B, S, H]``, ``deepstack_embeds`` one
    ``[B, S, H]`` array per deepstack feature (empty for Qwen2.5-VL), ``mrope_positions`` int64 ``[3, B, S]``,
    ``context_lengths`` int64 ``[B]``, ``rope_deltas`` int64 ``[B]`` (each sequence's decode position delta).
    Host arrays owned by the object."""

    token_ids: np.ndarray
    inputs_embeds: np.ndarray
    deepstack_embeds: tuple[np.ndarray, ...]
    mrope_positions: np.ndarray
    context_lengths: np.ndarray
    rope_deltas: np.ndarray

    @classmethod
    def stack(cls, prompts: Sequence[VisionPrompt]) -> VisionPrompt:
        """Several prompts as one batch (each one's rows first, zeros after)."""
        if not prompts:
            raise ShapeError("VisionPrompt.stack: no prompts")
        hidden = {p.inputs_embeds.shape[2] for p in prompts}
        features = {len(p.deepstack_embeds) for p in prompts}
        if len(hidden) != 1 or len(features) != 1:
            raise ShapeError(f"VisionPrompt.stack: prompts of hidden sizes {sorted(hidden)} and deepstack feature "
                             f"counts {sorted(features)}; a batch has one of each")
        b = sum(p.token_ids.shape[0] for p in prompts)
        s = max(p.token_ids.shape[1] for p in prompts)
        (h,), (nd,) = hidden, features
        dtype = prompts[0].inputs_embeds.dtype
        ids = np.zeros((b, s), np.int64)
        embeds = np.zeros((b, s, h), dtype)
        deep = [np.zeros((b, s, h), dtype) for _ in range(nd)]
        positions = np.zeros((3, b, s), np.int64)
        row = 0
        for p in prompts:
            n, width = p.token_ids.shape
            ids[row:row + n, :width] = p.token_ids
            embeds[row:row + n, :width] = p.inputs_embeds
            for d, src in zip(deep, p.deepstack_embeds):
                d[row:row + n, :width] = src
            positions[:, row:row + n, :width] = p.mrope_positions
            row += n
        return cls(ids, embeds, tuple(deep), positions, np.concatenate([p.context_lengths for p in prompts]),
                   np.concatenate([p.rope_deltas for p in prompts]))


def splice(token_ids: Any, grid_thw: Any, cfg: Any, embedding: Any, image_embeds: Any = None,
           deepstack: Sequence[Any] | None = None, stream: StreamLike = None) -> Any:
    """One prompt with its images spliced in (a :class:`VisionPrompt` of batch 1).

    ``token_ids``: the tokenized prompt, one ``image_token_id`` pad per image; ``grid_thw``: the images' patch
    grids (``[images, 3]``, as :func:`preprocess` gives them; empty or None for a prompt without images);
    ``embedding``: the token embedding table ``[vocab, hidden]`` (host array); ``image_embeds``: the ViT's
    merged rows for all the images, in order (``[tokens, hidden]``: a host array or the ``embeds`` Tensor of
    :meth:`VisualSetup.encode <trtio.components.visual.visual_setup.VisualSetup.encode>`'s
    :class:`~trtio.components.visual.visual_setup.VisualOutput`, which may be passed whole); ``deepstack``: the ViT's
    deepstack
    rows (the VisualOutput's, or host arrays), one per feature of the config. Device tensors are read with a
    synchronising copy on ``stream`` (the stream ``encode`` ran on). The rows come out in the embedding table's
    dtype.

    A config of another encoder kind (:mod:`~trtio.components.visual.visual_kinds`) is that kind's splice, with
    ``grid_thw`` the images' layout its preprocessing returned: InternVL's tile counts, ``<img>`` / ``</img>`` around
    the image tokens and 1-D positions (an :class:`~trtio.components.visual.internvl_images.ImagePrompt`)."""
    kind = kind_of(cfg)
    if kind is not None:
        if deepstack:
            raise InvalidTypeError(f"splice: {kind.model_type} has no deepstack features, got deepstack=")
        return kind.splice(token_ids, grid_thw, cfg, embedding, image_embeds, stream)
    grid = _image_grid(grid_thw, cfg, allow_empty=True)
    visual = image_embeds
    if hasattr(visual, "embeds") and hasattr(visual, "deepstack"):  # a VisualOutput
        if deepstack is not None:
            raise InvalidTypeError("splice: deepstack= is given and image_embeds is a VisualOutput carrying its own")
        deepstack, visual = visual.deepstack, visual.embeds
    ids = expand_image_pads(token_ids, grid, cfg)
    table = embedding_table(embedding, cfg.out_hidden_size, "the ViT's merged tokens have out_hidden_size")
    vocab, hidden = table.shape
    checked_ids(ids, vocab)
    image_rows = np.flatnonzero(ids == cfg.image_token_id) if grid.shape[0] else np.zeros(0, np.int64)
    n_image = int(sum(cfg.image_tokens(tuple(g)) for g in grid.tolist()))
    nd = cfg.num_deepstack
    rows = _rows(visual, "image_embeds", n_image, hidden, stream) if n_image else None
    feats: list[np.ndarray] = []
    if n_image and nd:
        if deepstack is None or len(deepstack) != nd:
            got = "none" if deepstack is None else len(deepstack)
            raise ShapeError(f"deepstack: the ViT has {nd} deepstack feature(s), got {got}")
        feats = [_rows(f, f"deepstack[{i}]", n_image, hidden, stream) for i, f in enumerate(deepstack)]
    elif n_image and deepstack:
        raise ShapeError(f"deepstack: {cfg.model_type} has no deepstack features, got {len(deepstack)}")
    embeds = table[ids].copy()
    deep = [np.zeros_like(embeds) for _ in range(nd)]
    if rows is not None:
        embeds[image_rows] = rows.astype(embeds.dtype)
        for d, f in zip(deep, feats):
            d[image_rows] = f.astype(d.dtype)
    positions, delta = mrope_positions(ids, grid, cfg)
    n = ids.shape[0]
    return VisionPrompt(ids[None], embeds[None], tuple(d[None] for d in deep), positions[:, None, :],
                        np.array([n], np.int64), np.array([delta], np.int64))


def _token_ids(token_ids: Any) -> np.ndarray:
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.shape[0] < 1 or ids.dtype.kind not in "iu":
        raise ShapeError(f"token_ids: expected a non-empty 1-D sequence of integer token ids, got {ids.dtype} "
                         f"{list(ids.shape)}")
    return ids.astype(np.int64)


def _image_grid(grid_thw: Any, cfg: VisualConfig, *, allow_empty: bool = False) -> np.ndarray:
    """Images' patch grids (``t`` must be 1: a still image), or ``[0, 3]`` for none where allowed."""
    if grid_thw is None or (isinstance(grid_thw, (list, tuple)) and not grid_thw) or \
            (isinstance(grid_thw, np.ndarray) and grid_thw.size == 0):
        if allow_empty:
            return np.zeros((0, 3), np.int64)
        raise ShapeError("grid_thw: no images")
    grid = check_grid(grid_thw, cfg)
    video = np.flatnonzero(grid[:, 0] != 1)
    if video.size:
        i = int(video[0])
        raise ShapeError(f"grid_thw[{i}] = {tuple(int(x) for x in grid[i])}: t = {int(grid[i, 0])}; trtio splices "
                         f"still images (t = 1), not videos")
    return grid


def _rows(x: Any, what: str, n: int, hidden: int, stream: StreamLike) -> np.ndarray:
    """``[n, hidden]`` rows from a host array or a device Tensor (read with a synchronising copy)."""
    arr: np.ndarray = x.to_numpy(stream) if hasattr(x, "to_numpy") else np.asarray(x)
    if arr.shape != (n, hidden) or arr.dtype.kind != "f":
        raise ShapeError(f"{what}: expected [{n}, {hidden}] float rows (the images' merged tokens), got {arr.dtype} "
                         f"{list(arr.shape)}")
    return arr
