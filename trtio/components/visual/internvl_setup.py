"""InternVL's vision encoder bound (``visual/visual.engine``, ``model_type`` ``internvl``): its bindings
(:func:`internvl_registry`) and :class:`InternVLSetup`, whose :meth:`~InternVLSetup.encode` runs the engine over the
tiles :func:`trtio.vision.preprocess` cut.

Edge-LLM 0.11's exporter (``InternVL3_5VisualModel.get_onnx_export_args``) writes one input and one output: ``input``
FP16 ``[tiles, C, S, S]`` (the tiles, ``S = vision_config.image_size``) and ``output`` FP16 ``[tokens_per_tile *
tiles, text hidden]`` (each tile's patches without the CLS row, pixel-shuffled and projected, tile after tile); the
ViT attention's ragged descriptors are constants inside the graph. Edge-LLM's builder gives ``input`` one profile of
``max(1, min_image_tokens // 256) .. max(1, max_image_tokens // 256)`` tiles (``_setup_component_profile``), and
``InternViTRunner`` binds ``[maxNumBlocks, C, S, S]`` and ``[maxNumBlocks * tokens_per_tile, hidden]`` buffers once:
so does this setup, from the config's caps.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from trtio._cuda.backend import Backend
from trtio._dims import InferenceDims
from trtio._dtypes import DType
from trtio._inputs import as_input, is_device_array
from trtio._memory import Arena, TensorRequest
from trtio._registry import TensorRegistry, TensorSpec
from trtio._setups.calls import one_thread
from trtio._staging import UploadRing
from trtio._stream import Stream, StreamLike, as_stream
from trtio._tensor import Tensor
from trtio.components.encoder_setup import EncoderSetup
from trtio.components.visual.internvl_config import InternVLConfig
from trtio.components.visual.visual_setup import VisualOutput
from trtio.errors import CapacityError, InvalidTypeError, InvalidValueError, ShapeError

__all__ = ["InternVLSetup", "create_for_internvl", "internvl_registry"]

kVisualInput = "input"
kVisualOutput = "output"
_SLOTS = 2  # pinned slots the tiles are uploaded through


def internvl_registry(cfg: InternVLConfig) -> TensorRegistry:
    """The engine's two bindings: ``input`` FP16 ``("vit_patches", C, S, S)`` (``vit_patches``: the call's tiles, what
    Hugging Face's processor calls patches) with its one profile, and ``output`` FP16 ``("vit_tokens", hidden)``."""
    lo, hi = cfg.min_engine_tiles, cfg.max_engine_tiles
    c, s, _ = cfg.tile_shape
    profile = ((lo, c, s, s), ((lo + hi) // 2, c, s, s), (hi, c, s, s))
    return TensorRegistry("visual", [
        TensorSpec(kVisualInput, "input", DType.FLOAT16, ("vit_patches", c, s, s), profiles=(profile,)),
        TensorSpec(kVisualOutput, "output", DType.FLOAT16, ("vit_tokens", cfg.out_hidden_size)),
    ], contract="visual")


class InternVLSetup(EncoderSetup):
    """An InternVL encoder bound to its worst-case buffers (``max_engine_tiles`` tiles); build it with
    :func:`trtio.create_for_visual` (an :class:`~trtio.components.visual.internvl_config.InternVLConfig` picks this
    setup). ``cfg``, ``executor``, ``tensor_map`` and ``registry`` are public views.

    Streams: :meth:`encode` runs on ``stream`` (None: the calling thread's trtio default stream); encodes run in call
    order whatever streams they are given. Follows trtio's close protocol."""

    FACTORY = "create_for_visual"
    WHAT = "visual"

    def __init__(self, engine: Any, cfg: InternVLConfig, stream: StreamLike = None, *, graphs: bool = False,
                 backend: Backend | str | None = None) -> None:
        if not isinstance(cfg, InternVLConfig):
            raise InvalidTypeError(f"create_for_visual: cfg must be an InternVLConfig here, got {type(cfg).__name__}")
        self.cfg = cfg
        worst = (cfg.max_engine_tiles, *cfg.tile_shape)
        requests = [
            TensorRequest.of(kVisualInput, worst, DType.FLOAT16),
            UploadRing.request(f"host_{kVisualInput}", worst, DType.FLOAT16, slots=_SLOTS),
            TensorRequest.of(kVisualOutput, (cfg.max_engine_tiles * cfg.tokens_per_tile, cfg.out_hidden_size),
                             DType.FLOAT16),
        ]

        def staging(stack: contextlib.ExitStack, arena: Arena, be: Backend) -> None:
            self._tiles = stack.enter_context(UploadRing(arena[f"host_{kVisualInput}"], be, slots=_SLOTS,
                                                         title="tiles staging"))

        self._bind(engine, internvl_registry(cfg), requests, stream, graphs=graphs, backend=backend, staging=staging)

    @one_thread
    def encode(self, pixels: Any, tiles: Any = None, stream: StreamLike = None) -> VisualOutput:
        """Run the encoder over ``pixels`` (``[total tiles, C, S, S]``, as :func:`trtio.vision.preprocess` returns
        them: a host float array, converted to float16, or a float16 device array); ``tiles``: each image's tile
        count (the second value preprocess returns; None: the tiles are one image's). Returns a
        :class:`~trtio.components.visual.visual_setup.VisualOutput`: ``embeds`` ``[tokens_per_tile * total tiles,
        hidden]`` (views valid until the next encode), no deepstack, ``grid_thw`` each image's ``(tiles, patch rows,
        patch columns)``.

        Refused before any work, naming the input: tiles of another shape or dtype, values float16 cannot hold,
        tile counts that do not add up to the pixels' tiles, or a call of fewer or more tiles than the engine's
        profile takes (CapacityError naming the builder cap). Nothing is allocated."""
        self._check_open()
        cfg = self.cfg
        s = as_stream(stream, self._backend)
        x = self._checked_pixels(pixels, s)
        n = int(x.shape[0])
        counts = np.asarray([n] if tiles is None else tiles)
        if counts.ndim != 1 or counts.dtype.kind not in "iu" or (counts < 1).any() or int(counts.sum()) != n:
            raise ShapeError(f"tiles: expected each image's tile count adding up to the {n} tiles of pixels, got "
                             f"{counts.tolist()}")
        if not cfg.min_engine_tiles <= n <= cfg.max_engine_tiles:
            raise CapacityError(f"pixels: {n} tiles in one call; the visual engine takes {cfg.min_engine_tiles}.."
                                f"{cfg.max_engine_tiles} (builder_config min_image_tokens {cfg.min_image_tokens}, "
                                f"max_image_tokens {cfg.max_image_tokens}: {cfg.tokens_per_tile} tokens a tile)")
        self._calls.stream(s)
        dst = self._arena[kVisualInput]
        if isinstance(x, Tensor):
            self._calls.read(x)  # kept until the copy has run
            dst.reshape(tuple(x.shape)).copy_from(x, s)
        else:
            self._tiles.upload(x, dst, s)
        dims = InferenceDims(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, vit_patches=n, vit_tokens=n * cfg.tokens_per_tile)
        self.executor.prepare(0, self.tensor_map, dims, s)
        self.executor.execute(s)
        side = cfg.patches_per_side
        grid = np.asarray([(int(t), side, side) for t in counts.tolist()], np.int64)
        return VisualOutput(self._arena[kVisualOutput], [], grid)

    def _checked_pixels(self, pixels: Any, s: Stream) -> Tensor | np.ndarray:
        """``pixels`` as float16 host data or a float16 device Tensor of shape ``[tiles, C, S, S]``."""
        tile = self.cfg.tile_shape
        x = as_input(pixels, "pixels", s, dtype=DType.FLOAT16 if is_device_array(pixels) else None, ndim=4,
                     backend=self._backend)
        shape = tuple(x.shape) if isinstance(x, Tensor) else np.asarray(x).shape
        if len(shape) != 4 or tuple(shape[1:]) != tile or shape[0] < 1:
            raise ShapeError(f"pixels: expected [tiles, {tile[0]}, {tile[1]}, {tile[2]}] (tiles of "
                             f"vision_config.image_size), got {list(shape)}")
        if isinstance(x, Tensor):
            if x.dtype is not DType.FLOAT16:
                raise ShapeError(f"pixels: expected a float16 device array, got {x.dtype}")
            return x
        arr = np.asarray(x)
        if arr.dtype.kind != "f":
            raise ShapeError(f"pixels: expected float values, got {arr.dtype}")
        with np.errstate(over="ignore"):  # an overflow is refused just below, naming the value
            out = np.ascontiguousarray(arr.astype(np.float16))
        bad = ~np.isfinite(out)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InvalidValueError(f"pixels{list(where)} = {float(arr[where])!r} is not a finite float16 value")
        return out


def create_for_internvl(engine: Any, cfg: InternVLConfig, stream: StreamLike = None, *, graphs: bool = False,
                        backend: Backend | str | None = None) -> InternVLSetup:
    """Bind an InternVL encoder engine (see :class:`InternVLSetup`); its declared I/O is checked against ``cfg``
    first (one BindingError lists every problem). Construction runs on ``stream`` and ends synchronised."""
    return InternVLSetup(engine, cfg, stream, graphs=graphs, backend=backend)
