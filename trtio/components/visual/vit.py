"""A vision encoder's bindings (:func:`vit_registry`) and every input it takes besides the patches, computed
from the images' patch grids (:func:`vit_step`).

Edge-LLM 0.11's Qwen ViT engines (``visual/visual.engine``) take, for a batch of images (or video frames)
packed patch-major:

* ``input`` ``[N, C*T*P*P]`` float16: the patches, in Hugging Face's order (each image's merge blocks, each
  block's ``merge_size ** 2`` patches in raster order);
* ``rotary_pos_emb`` ``[N, head_dim / 2]`` float32: each patch's (row, column) times the ViT's inverse
  frequencies, ``[row * inv_freq | col * inv_freq]``;
* ``cu_seqlens`` ``[frames + 1]`` int32: where each frame's patches start (attention stays within a frame);
* ``max_seqlen_carrier`` ``[longest frame]`` int32: shape only, the attention plugin's launch bound;
* Qwen2.5-VL: ``cu_window_seqlens`` ``[windows + 1]`` int32, ``window_index`` / ``reverse_window_index``
  ``[N / merge**2]`` int64 (the merged tokens reordered window by window, and back);
* Qwen3-VL: ``fast_pos_embed_idx`` ``[4, N]`` int64 / ``fast_pos_embed_weight`` ``[4, N]`` float16 (the four
  corners and bilinear weights of each patch's position in the learned ``side x side`` grid);

and return ``output`` ``[N / merge**2, out_hidden]`` float16 (and Qwen3-VL's ``deepstack_features_i`` of the
same shape). Every value follows Hugging Face transformers' definitions (``transformers.vision_utils``:
``get_vision_position_ids``, ``get_vision_cu_seqlens``, ``get_vision_window_index``,
``get_vision_bilinear_indices_and_weights``) and Edge-LLM's ``qwenViTRunner`` (which computes the same, and
repeats a frame's windows for each of its ``t`` frames). Profiles follow Edge-LLM's builder
(``_setup_component_profile``: one optimization profile sized from ``builder_config``'s token caps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._dims import InferenceDims
from trtio._dtypes import DType
from trtio._registry import ProfileShapes, TensorRegistry, TensorSpec
from trtio._staging import constant
from trtio.components.visual.visual_config import VisualConfig
from trtio.errors import CapacityError, ShapeError

__all__ = ["FAST_POS_CORNERS", "VIT_ROTARY_THETA", "VitStep", "check_grid", "vit_registry", "vit_step"]

# Binding names (Edge-LLM's binding_names for the visual encoder).
kVisualInput = "input"
kVisualOutput = "output"
kRotaryPosEmb = "rotary_pos_emb"
kCuSeqlens = "cu_seqlens"
kMaxSeqLenCarrier = "max_seqlen_carrier"
kCuWindowSeqlens = "cu_window_seqlens"
kWindowIndex = "window_index"
kReverseWindowIndex = "reverse_window_index"
kFastPosEmbIdx = "fast_pos_embed_idx"
kFastPosEmbWeight = "fast_pos_embed_weight"


def deepstack_features(i: int) -> str:
    """The ``i``-th deepstack output of a Qwen3-VL ViT."""
    return f"deepstack_features_{i}"


#: Corners each patch's learned position is interpolated from (Qwen3-VL).
FAST_POS_CORNERS = 4
#: The base of the ViT's rotary frequencies (Hugging Face's VisionRotaryEmbedding; Edge-LLM's runner).
VIT_ROTARY_THETA = 10000.0


def _half(lo: int, hi: int) -> int:
    return (lo + hi) // 2


def _profiles(cfg: VisualConfig) -> dict[str, tuple[tuple[int, int, int], ...]]:
    """Each input's dynamic dims as (min, opt, max), as Edge-LLM's builder sets them (``_setup_component_profile``
    for the visual component, with ``merge_size ** 2`` patches per merged token)."""
    lo, hi, per_image = cfg.min_image_tokens, cfg.max_image_tokens, cfg.max_image_tokens_per_image
    unit = cfg.merge_unit
    patches = (lo * unit, max(lo, _half(lo, hi)) * unit, hi * unit)
    images = max(2, hi // lo + 1)
    out: dict[str, tuple[tuple[int, int, int], ...]] = {
        kVisualInput: (patches,),
        kRotaryPosEmb: (patches,),
        kCuSeqlens: ((2, max(2, images // 2), images),),
        kMaxSeqLenCarrier: ((1, max(1, per_image * unit // 2), per_image * unit),),
    }
    if cfg.has_windows:
        out[kCuWindowSeqlens] = ((2, hi, hi),)
        out[kWindowIndex] = out[kReverseWindowIndex] = ((lo, _half(lo, hi), hi),)
    else:
        out[kFastPosEmbIdx] = out[kFastPosEmbWeight] = (patches,)
    return out


def _profile(shape: tuple[int | str, ...], dynamic: tuple[tuple[int, int, int], ...]) -> ProfileShapes:
    lows, opts, highs = [], [], []
    found = iter(dynamic)
    for d in shape:
        if isinstance(d, int):
            lows.append(d)
            opts.append(d)
            highs.append(d)
        else:
            lo, opt, hi = next(found)
            lows.append(lo)
            opts.append(opt)
            highs.append(hi)
    return tuple(lows), tuple(opts), tuple(highs)


def vit_registry(cfg: VisualConfig) -> TensorRegistry:
    """Every binding a ViT engine of ``cfg``'s kind declares, in the order Edge-LLM's exporter writes them, with
    its dtype, symbolic shape (members of :class:`~trtio._dims.InferenceDims`: ``vit_patches``, ``vit_tokens``,
    ``vit_frames_p1``, ``vit_windows_p1``, ``vit_max_seqlen``) and its one optimization profile."""
    profiles = _profiles(cfg)
    f16, f32, i32, i64 = DType.FLOAT16, DType.FLOAT32, DType.INT32, DType.INT64
    inputs: list[tuple[str, DType, tuple[int | str, ...]]] = [
        (kVisualInput, f16, ("vit_patches", cfg.patch_dim)),
        (kRotaryPosEmb, f32, ("vit_patches", cfg.rotary_dim)),
        (kCuSeqlens, i32, ("vit_frames_p1",)),
    ]
    if cfg.has_windows:
        inputs += [(kCuWindowSeqlens, i32, ("vit_windows_p1",)), (kWindowIndex, i64, ("vit_tokens",)),
                   (kReverseWindowIndex, i64, ("vit_tokens",))]
    else:
        inputs += [(kFastPosEmbIdx, i64, (FAST_POS_CORNERS, "vit_patches")),
                   (kFastPosEmbWeight, f16, (FAST_POS_CORNERS, "vit_patches"))]
    inputs.append((kMaxSeqLenCarrier, i32, ("vit_max_seqlen",)))
    specs = [TensorSpec(name, "input", dtype, shape, profiles=(_profile(shape, profiles[name]),))
             for name, dtype, shape in inputs]
    outputs = [kVisualOutput] + [deepstack_features(i) for i in range(cfg.num_deepstack)]
    specs += [TensorSpec(name, "output", f16, ("vit_tokens", cfg.out_hidden_size)) for name in outputs]
    return TensorRegistry("visual", specs, contract="visual")


def check_grid(grid_thw: Any, cfg: VisualConfig, what: str = "grid_thw") -> np.ndarray:
    """``grid_thw`` as an int64 ``[images, 3]`` array of (frames, patch rows, patch columns), each at least 1,
    rows and columns whole merge blocks; ShapeError naming the row otherwise. Host data only."""
    arr = np.asarray(grid_thw)
    if arr.ndim == 1 and arr.shape == (3,):
        arr = arr[None]
    if arr.ndim != 2 or arr.shape[1] != 3 or arr.shape[0] < 1 or arr.dtype.kind not in "iu":
        raise ShapeError(f"{what}: expected integer (t, h, w) rows, [images, 3], got {arr.dtype} {list(arr.shape)}")
    arr = arr.astype(np.int64)
    m = cfg.merge_size
    for i, (t, h, w) in enumerate(arr.tolist()):
        if t < 1 or h < m or w < m or h % m or w % m:
            raise ShapeError(f"{what}[{i}] = ({t}, {h}, {w}): expected t >= 1 and h, w positive multiples of "
                             f"merge_size {m} (patch rows and columns of whole merge blocks)")
    return arr


@dataclass(frozen=True)
class VitStep:
    """What one call of a ViT engine takes besides its patches, for one set of patch grids: the dims its
    bindings resolve against, and each input's values (read-only arrays: :func:`~trtio._staging.constant`)."""

    grid: tuple[tuple[int, int, int], ...]
    dims: InferenceDims
    values: dict[str, np.ndarray]

    @property
    def patches(self) -> int:
        return self.dims.vit_patches

    @property
    def tokens(self) -> int:
        return self.dims.vit_tokens


def vit_step(cfg: VisualConfig, grid_thw: Any) -> VitStep:
    """The inputs of one ViT call over the images of ``grid_thw`` (see module docstring), checked against the
    engine's caps: patches within ``min_image_tokens .. max_image_tokens`` merged tokens, frames, windows and
    each frame's patches within what the engine's profile takes (:class:`~trtio.CapacityError` naming the cap
    otherwise)."""
    grid = check_grid(grid_thw, cfg)
    unit = cfg.merge_unit
    frame_patches = grid[:, 1] * grid[:, 2]
    n = int((grid[:, 0] * frame_patches).sum())
    frames = int(grid[:, 0].sum())
    longest = int(frame_patches.max())
    if n > cfg.max_patches or n < cfg.min_patches:
        raise CapacityError(f"grid_thw: the images hold {n} patches ({n // unit} merged tokens); the visual engine "
                            f"takes {cfg.min_patches}..{cfg.max_patches} patches per call (builder_config "
                            f"min_image_tokens {cfg.min_image_tokens}, max_image_tokens {cfg.max_image_tokens})")
    if frames > cfg.max_frames:
        raise CapacityError(f"grid_thw: {frames} frames (cu_seqlens segments) in one call; the visual engine takes "
                            f"{cfg.max_frames} (max_image_tokens // min_image_tokens)")
    if longest > cfg.max_frame_patches:
        i = int(np.argmax(frame_patches))
        raise CapacityError(f"grid_thw[{i}]: a frame of {longest} patches; the visual engine takes "
                            f"{cfg.max_frame_patches} per frame (builder_config max_image_tokens_per_image "
                            f"{cfg.max_image_tokens_per_image} merged tokens)")
    values: dict[str, np.ndarray] = {
        kRotaryPosEmb: rotary_pos_emb(cfg, grid),
        kCuSeqlens: cu_seqlens(grid),
    }
    windows = 0
    if cfg.has_windows:
        index, cu_windows = window_index(cfg, grid)
        windows = cu_windows.shape[0] - 1
        if windows > cfg.max_windows:
            raise CapacityError(f"grid_thw: {windows} attention windows in one call; the visual engine takes "
                                f"{cfg.max_windows} (cu_window_seqlens holds max_image_tokens entries)")
        values[kCuWindowSeqlens] = cu_windows
        values[kWindowIndex] = index
        values[kReverseWindowIndex] = np.argsort(index, kind="stable").astype(np.int64)
    else:
        idx, weight = fast_pos_embed(cfg, grid)
        values[kFastPosEmbIdx] = idx
        values[kFastPosEmbWeight] = weight.astype(np.float16)
    dims = InferenceDims(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, vit_patches=n, vit_tokens=n // unit,
                         vit_frames_p1=frames + 1, vit_windows_p1=windows + 1 if windows else 0,
                         vit_max_seqlen=longest)
    return VitStep(tuple((int(t), int(h), int(w)) for t, h, w in grid.tolist()), dims,
                   {name: constant(v) for name, v in values.items()})


# -- the values -------------------------------------------------------------------------------------


def _block_major(h: int, w: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Each patch's (row, column), in the order the patches are packed: merge block by merge block, a block's
    ``m x m`` patches in raster order."""
    rows = np.arange(h).reshape(h // m, m)[:, None, :, None]
    cols = np.arange(w).reshape(w // m, m)[None, :, None, :]
    shape = (h // m, w // m, m, m)
    return np.broadcast_to(rows, shape).reshape(-1), np.broadcast_to(cols, shape).reshape(-1)


def rotary_pos_emb(cfg: VisualConfig, grid: np.ndarray) -> np.ndarray:
    """float32 ``[N, head_dim / 2]``: ``[row * inv_freq | col * inv_freq]`` per patch, ``inv_freq = 1 /
    theta ** (arange(0, d, 2) / d)`` with ``d = head_dim / 2`` (computed in float32, as Hugging Face does);
    a frame's table repeats for each of its frames."""
    d = cfg.rotary_dim
    inv = (np.float32(1.0) / (np.float32(VIT_ROTARY_THETA) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))))
    parts = []
    for t, h, w in grid.tolist():
        rows, cols = _block_major(h, w, cfg.merge_size)
        frame = np.concatenate([rows[:, None].astype(np.float32) * inv, cols[:, None].astype(np.float32) * inv], 1)
        parts.append(np.tile(frame, (t, 1)))
    return np.ascontiguousarray(np.concatenate(parts).astype(np.float32))


def cu_seqlens(grid: np.ndarray) -> np.ndarray:
    """int32 ``[frames + 1]``: 0, then the running total of each frame's ``h * w`` patches."""
    per_frame = np.repeat(grid[:, 1] * grid[:, 2], grid[:, 0])
    return np.concatenate([[0], np.cumsum(per_frame)]).astype(np.int32)


def window_index(cfg: VisualConfig, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Qwen2.5-VL: the merged tokens reordered window by window (int64 ``[N / merge**2]``) and where each window
    starts, in patches (int32 ``[windows + 1]``). A window is ``window_size / patch_size / merge_size`` merged
    tokens on a side (fewer at the right and bottom edges); each frame of an image has its own windows."""
    side = cfg.window_size // cfg.factor
    m = cfg.merge_size
    index: list[np.ndarray] = []
    bounds = [0]
    base = 0
    for t, h, w in grid.tolist():
        lh, lw = h // m, w // m
        tokens = np.arange(lh * lw).reshape(lh, lw)
        for frame in range(t):
            for i in range(0, lh, side):
                for j in range(0, lw, side):
                    block = tokens[i:i + side, j:j + side].reshape(-1)
                    index.append(block + base + frame * lh * lw)
                    bounds.append(bounds[-1] + block.size * cfg.merge_unit)
        base += t * lh * lw
    return np.concatenate(index).astype(np.int64), np.asarray(bounds, np.int32)


def _spread(side: int, steps: int) -> np.ndarray:
    """``steps`` points spread evenly over ``0 .. side - 1`` (float64, exact up to one rounding)."""
    if steps == 1:
        return np.zeros(1)
    return np.arange(steps, dtype=np.float64) * (side - 1) / (steps - 1)


def fast_pos_embed(cfg: VisualConfig, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-VL: for each patch, the four corners (int64 ``[4, N]``, row-major in the ``side x side`` grid:
    top-left, top-right, bottom-left, bottom-right) and bilinear weights (float32 ``[4, N]``) of its place in
    the learned position grid, the image's rows and columns spread evenly over it (Hugging Face's
    ``linspace(0, side - 1, h)``, here in float64: torch's float32 linspace rounds differently per CPU), packed
    merge block by merge block and repeated for each frame."""
    side = cfg.grid_side
    idx_parts, weight_parts = [], []
    for t, h, w in grid.tolist():
        hs, ws = _spread(side, h), _spread(side, w)
        h0, w0 = np.floor(hs).astype(np.int64), np.floor(ws).astype(np.int64)
        h1, w1 = np.minimum(h0 + 1, side - 1), np.minimum(w0 + 1, side - 1)
        hf, wf = hs - h0, ws - w0
        corners = [
            (h0[:, None] * side + w0[None, :], (1 - hf)[:, None] * (1 - wf)[None, :]),
            (h0[:, None] * side + w1[None, :], (1 - hf)[:, None] * wf[None, :]),
            (h1[:, None] * side + w0[None, :], hf[:, None] * (1 - wf)[None, :]),
            (h1[:, None] * side + w1[None, :], hf[:, None] * wf[None, :]),
        ]
        rows, cols = _block_major(h, w, cfg.merge_size)
        order = np.tile(rows * w + cols, t)
        idx_parts.append(np.stack([c[0].reshape(-1)[order] for c in corners]))
        weight_parts.append(np.stack([c[1].reshape(-1)[order] for c in corners]))
    return np.concatenate(idx_parts, axis=1).astype(np.int64), np.concatenate(weight_parts, axis=1).astype(np.float32)
