"""InternVL's images: dynamic tiling with a thumbnail, and the ``<img>`` + ``<IMG_CONTEXT>`` x N + ``</img>`` splice
(:class:`~trtio.components.visual.internvl_config.InternVLConfig`; reached through :func:`trtio.vision.preprocess` and
:func:`trtio.vision.splice`).

* :func:`preprocess_tiles` cuts each image into tiles as Hugging Face's ``GotOcr2ImageProcessorPil`` does with
  ``crop_to_patches`` (what InternVL's processor uses): the grid of ``columns x rows`` tiles (``min_tiles <= columns *
  rows <= max_tiles``) whose aspect ratio is closest to the image's (:func:`tile_grid`), the image resized to it with
  Pillow's 8-bit bicubic resampling (:func:`~trtio.components.visual.images.resize_bicubic`), the tiles taken row by
  row, then the whole image resized to one tile as a thumbnail where the grid has more than one tile; each tile
  rescaled and normalised (ImageNet mean and std for InternVL 3.5). It returns ``(pixels, tiles)``: float32
  ``[total tiles, C, S, S]`` for :meth:`InternVLSetup.encode
  <trtio.components.visual.internvl_setup.InternVLSetup.encode>`, and each image's tile count (int64 ``[images]``).
* :func:`splice_tiles` expands each image's one ``image_token_id`` (``<IMG_CONTEXT>``) of a prompt into ``<img>``,
  ``tokens_per_tile x tiles`` ``<IMG_CONTEXT>`` and ``</img>`` (as Edge-LLM's ``InternViTRunner::textPreprocess`` and
  Hugging Face's ``InternVLProcessor`` write it), looks the tokens up in the embedding table and writes the ViT's rows
  over the ``<IMG_CONTEXT>`` rows, in order. The LLM's RoPE is 1-D: every token's position is its index, what an LLM
  setup's prefill uses where no positions are given (:class:`ImagePrompt`).

Host-side numpy; nothing is enqueued except where :func:`splice_tiles` reads a device Tensor (a synchronising copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._stream import StreamLike
from trtio.components.splice_checks import checked_ids, embedding_table
from trtio.components.visual.images import _as_rgb, resize_bicubic
from trtio.components.visual.internvl_config import InternVLConfig
from trtio.errors import ConfigError, InvalidTypeError, ShapeError

__all__ = ["ImagePrompt", "expand_image_tokens", "preprocess_tiles", "splice_tiles", "tile_grid", "tiles_of"]


def _aspect_ratios(lo: int, hi: int) -> list[tuple[int, int]]:
    """Every ``(columns, rows)`` of ``lo .. hi`` tiles, by tile count (Hugging Face's
    ``get_all_supported_aspect_ratios``; Python's sort is stable, so equal counts keep the loop's order)."""
    grids = [(c, r) for c in range(1, hi + 1) for r in range(1, hi + 1) if lo <= c * r <= hi]
    return sorted(grids, key=lambda g: g[0] * g[1])


def tile_grid(height: int, width: int, cfg: InternVLConfig) -> tuple[int, int]:
    """The ``(columns, rows)`` of tiles an image of ``height x width`` pixels is cut into (Hugging Face's
    ``get_optimal_tiled_canvas``): the grid of ``cfg.min_tiles .. cfg.max_tiles`` tiles whose ``columns / rows`` is
    closest to ``width / height``; of grids equally close, the later one (more tiles) where the image's area exceeds
    half the grid's pixels."""
    if height < 1 or width < 1:
        raise ShapeError(f"image: {height} x {width} pixels; expected at least one pixel each way")
    aspect = width / height
    area = width * height
    tile_area = cfg.image_size * cfg.image_size
    best, best_diff = (1, 1), float("inf")
    for grid in _aspect_ratios(cfg.min_tiles, cfg.max_tiles):
        diff = abs(aspect - grid[0] / grid[1])
        if diff < best_diff:
            best, best_diff = grid, diff
        elif diff == best_diff and area > 0.5 * tile_area * grid[0] * grid[1]:
            best = grid
    return best


def tiles_of(height: int, width: int, cfg: InternVLConfig) -> int:
    """The tiles an image of ``height x width`` pixels becomes: its grid's, plus the thumbnail where the grid has more
    than one (1 where ``crop_to_patches`` is off or ``max_tiles`` is 1, as Hugging Face's processor does)."""
    if not cfg.crop_to_patches or cfg.max_tiles <= 1:
        return 1
    columns, rows = tile_grid(height, width, cfg)
    return columns * rows + (1 if columns * rows != 1 else 0)


def _tiles(arr: np.ndarray, cfg: InternVLConfig, i: int) -> list[np.ndarray]:
    """One image's uint8 tiles ``[S, S, C]``: the grid row by row, then the thumbnail."""
    s = cfg.image_size
    h, w = arr.shape[:2]
    if not cfg.crop_to_patches or cfg.max_tiles <= 1:
        if cfg.do_resize:
            return [resize_bicubic(arr, s, s)]
        if (h, w) != (s, s):
            raise ShapeError(f"images[{i}]: {h} x {w} pixels; without resizing (do_resize false) an image must be "
                             f"one {s} x {s} tile")
        return [arr]
    columns, rows = tile_grid(h, w, cfg)
    canvas = resize_bicubic(arr, rows * s, columns * s)
    out = [canvas[r * s:(r + 1) * s, c * s:(c + 1) * s] for r in range(rows) for c in range(columns)]
    if len(out) != 1:
        out.append(resize_bicubic(arr, s, s))
    return out


def preprocess_tiles(images: Any, cfg: InternVLConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(pixels, tiles)`` of ``images`` (one image or a sequence of them: uint8 ``[H, W, 3]`` RGB arrays or PIL
    images) for an InternVL encoder of ``cfg`` (see module docstring): float32 ``[total tiles, C, S, S]`` (each
    image's tiles, then the next image's) and int64 ``[images]``. Each tile is rescaled by ``rescale_factor`` (in
    float64, then float32) and normalised with ``image_mean`` / ``image_std`` (float32), as Hugging Face's processor
    computes it; the config's ``do_rescale`` / ``do_normalize`` are honoured."""
    if isinstance(images, np.ndarray) and images.ndim == 3 or hasattr(images, "mode"):
        images = [images]
    if isinstance(images, (str, bytes)) or not isinstance(images, Sequence) or not images:
        raise InvalidTypeError(f"preprocess: expected an image or a non-empty sequence of images, got "
                               f"{type(images).__name__}")
    mean = np.asarray(cfg.image_mean, np.float32)
    std = np.asarray(cfg.image_std, np.float32)
    out, counts = [], []
    for i, image in enumerate(images):
        tiles = _tiles(_as_rgb(image, i, cfg.in_channels), cfg, i)
        counts.append(len(tiles))
        for tile in tiles:
            x: np.ndarray = tile
            if cfg.do_rescale:
                x = (tile.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
            if cfg.do_normalize:
                x = (x.astype(np.float32) - mean) / std
            out.append(np.asarray(x, np.float32).transpose(2, 0, 1))
    return np.ascontiguousarray(np.stack(out)), np.asarray(counts, np.int64)


# -- the splice -------------------------------------------------------------------------------------------------------


def _markers(cfg: InternVLConfig) -> tuple[int, int]:
    if cfg.img_start_token_id is None or cfg.img_end_token_id is None:
        missing = "img_start_token_id" if cfg.img_start_token_id is None else "img_end_token_id"
        raise ConfigError(missing, "is missing from visual/config.json (Edge-LLM's builder finds <img> / </img> in "
                                   "the tokenizer); give both to splice an image (dataclasses.replace(cfg, "
                                   "img_start_token_id=..., img_end_token_id=...))")
    return cfg.img_start_token_id, cfg.img_end_token_id


def _tile_counts(tiles: Any, what: str = "tiles") -> np.ndarray:
    if tiles is None:
        return np.zeros(0, np.int64)
    arr = np.asarray(tiles)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu") or (arr < 1).any():
        raise ShapeError(f"{what}: expected each image's tile count (integers >= 1, [images], as preprocess returns "
                         f"them), got {arr.dtype} {arr.tolist()}")
    return arr.astype(np.int64)


def expand_image_tokens(token_ids: Any, tiles: Any, cfg: InternVLConfig) -> np.ndarray:
    """``token_ids`` (int ``[L]``, one ``image_token_id`` per image) with image ``i``'s token replaced by
    ``<img>``, ``tokens_per_tile * tiles[i]`` image tokens and ``</img>``. ShapeError when the image tokens and the
    images do not pair up."""
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.shape[0] < 1 or ids.dtype.kind not in "iu":
        raise ShapeError(f"token_ids: expected a non-empty 1-D sequence of integer token ids, got {ids.dtype} "
                         f"{list(ids.shape)}")
    ids = ids.astype(np.int64)
    counts = _tile_counts(tiles)
    pads = np.flatnonzero(ids == cfg.image_token_id)
    if pads.size != counts.size:
        raise ShapeError(f"token_ids: {pads.size} image token(s) ({cfg.image_token_id}) for {counts.size} image(s); "
                         f"a prompt holds one per image")
    if not pads.size:
        return ids
    start, end = _markers(cfg)
    parts, last = [], 0
    for pad, n in zip(pads.tolist(), counts.tolist()):
        parts += [ids[last:pad], np.array([start]), np.full(n * cfg.tokens_per_tile, cfg.image_token_id),
                  np.array([end])]
        last = pad + 1
    parts.append(ids[last:])
    return np.concatenate(parts).astype(np.int64)


@dataclass(frozen=True)
class ImagePrompt:
    """Prompts with their images spliced in, for an LLM setup's prefill (batch ``B``, longest prompt ``S``, hidden
    ``H``; shorter prompts right-padded with zeros): ``setup.prefill(p.inputs_embeds, p.context_lengths)``.

    ``token_ids`` ``[B, S]`` (image tokens expanded), ``inputs_embeds`` ``[B, S, H]``, ``context_lengths`` int64
    ``[B]``. Positions are 1-D: token ``k`` of a sequence is at position ``k``. Host arrays owned by the object."""

    token_ids: np.ndarray
    inputs_embeds: np.ndarray
    context_lengths: np.ndarray

    @classmethod
    def stack(cls, prompts: Sequence[ImagePrompt]) -> ImagePrompt:
        """Several prompts as one batch (each one's rows first, zeros after)."""
        if not prompts:
            raise ShapeError("ImagePrompt.stack: no prompts")
        hidden = {p.inputs_embeds.shape[2] for p in prompts}
        if len(hidden) != 1:
            raise ShapeError(f"ImagePrompt.stack: prompts of hidden sizes {sorted(hidden)}; a batch has one")
        b = sum(p.token_ids.shape[0] for p in prompts)
        s = max(p.token_ids.shape[1] for p in prompts)
        ids = np.zeros((b, s), np.int64)
        embeds = np.zeros((b, s, hidden.pop()), prompts[0].inputs_embeds.dtype)
        row = 0
        for p in prompts:
            n, width = p.token_ids.shape
            ids[row:row + n, :width] = p.token_ids
            embeds[row:row + n, :width] = p.inputs_embeds
            row += n
        return cls(ids, embeds, np.concatenate([p.context_lengths for p in prompts]))


def splice_tiles(token_ids: Any, tiles: Any, cfg: InternVLConfig, embedding: Any, image_embeds: Any = None,
                 stream: StreamLike = None) -> ImagePrompt:
    """One prompt with its images spliced in (an :class:`ImagePrompt` of batch 1).

    ``token_ids``: the tokenized prompt, one ``image_token_id`` per image; ``tiles``: each image's tile count (as
    :func:`preprocess_tiles` returns it; empty or None for a prompt without images); ``embedding``: the token
    embedding table ``[vocab, hidden]`` (host array); ``image_embeds``: the encoder's rows for all the images, in
    order (``[tokens_per_tile * total tiles, hidden]``: a host array, a device Tensor or the
    :class:`~trtio.components.visual.visual_setup.VisualOutput` an encode returned), read with a synchronising copy
    on ``stream`` where on a device. The rows come out in the embedding table's dtype."""
    if hasattr(image_embeds, "embeds") and hasattr(image_embeds, "deepstack"):  # a VisualOutput
        image_embeds = image_embeds.embeds
    counts = _tile_counts(tiles)
    ids = expand_image_tokens(token_ids, counts, cfg)
    table = embedding_table(embedding, cfg.out_hidden_size, "the encoder's rows have text_config.hidden_size")
    vocab, hidden = table.shape
    checked_ids(ids, vocab)
    embeds = table[ids].copy()
    n_image = int(counts.sum()) * cfg.tokens_per_tile
    if n_image:
        x = image_embeds
        rows: np.ndarray = x.to_numpy(stream) if hasattr(x, "to_numpy") else np.asarray(x)
        if rows.shape != (n_image, hidden) or rows.dtype.kind != "f":
            raise ShapeError(f"image_embeds: expected [{n_image}, {hidden}] float rows ({cfg.tokens_per_tile} a tile "
                             f"for {int(counts.sum())} tiles), got {rows.dtype} {list(rows.shape)}")
        embeds[ids == cfg.image_token_id] = rows.astype(embeds.dtype)
    return ImagePrompt(ids[None], embeds[None], np.array([ids.shape[0]], np.int64))
