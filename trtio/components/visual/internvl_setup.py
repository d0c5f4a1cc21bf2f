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

from trtio._lifetime import Closeable
from trtio.components.visual.internvl_config import InternVLConfig
from trtio.components.visual.visual_setup import VisualOutput
from trtio.cuda.backend import Backend
from trtio.dims import InferenceDims
from trtio.dtypes import DType
from trtio.engine import EngineExecutor
from trtio.errors import BindingError, CapacityError, InvalidTypeError, InvalidValueError, ShapeError
from trtio.inputs import as_input, is_device_array
from trtio.memory import Arena, MemoryReport, TensorRequest
from trtio.registry import TensorRegistry, TensorSpec
from trtio.setups.binding import declared_problems, engine_backend, engine_io, profile_problems
from trtio.setups.calls import Calls, one_thread
from trtio.staging import UploadRing
from trtio.stream import Stream, StreamLike, as_stream
from trtio.tensor import Tensor
from trtio.tensor_map import TensorMap

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


class InternVLSetup(Closeable):
    """An InternVL encoder bound to its worst-case buffers (``max_engine_tiles`` tiles); build it with
    :func:`trtio.create_for_visual` (an :class:`~trtio.components.visual.internvl_config.InternVLConfig` picks this
    setup). ``cfg``, ``executor``, ``tensor_map`` and ``registry`` are public views.

    Streams: :meth:`encode` runs on ``stream`` (None: the calling thread's trtio default stream); encodes run in call
    order whatever streams they are given. Follows trtio's close protocol."""

    def __init__(self, engine: Any, cfg: InternVLConfig, stream: StreamLike = None, *, graphs: bool = False,
                 backend: Backend | str | None = None) -> None:
        if not isinstance(cfg, InternVLConfig):
            raise InvalidTypeError(f"create_for_visual: cfg must be an InternVLConfig here, got {type(cfg).__name__}")
        eio = engine_io(engine, "create_for_visual")
        self.cfg = cfg
        self.registry = internvl_registry(cfg)
        problems = declared_problems(eio, self.registry)
        for info in eio.inputs:
            spec = self.registry.get(info.name)
            if spec is not None and info.profiles and spec.profiles and len(spec.shape) == len(info.shape):
                problems += profile_problems(info, spec, lower=True)
        if eio.num_profiles != 1:
            problems.append(f"the engine has {eio.num_profiles} optimization profiles; Edge-LLM's visual engines "
                            f"have one")
        if problems:
            raise BindingError(eio.name, problems)
        be = engine_backend(engine, backend)
        self._backend = be
        self._init_lifetime(f"visual setup {eio.name!r}")
        worst = (cfg.max_engine_tiles, *cfg.tile_shape)
        requests = [
            TensorRequest.of(kVisualInput, worst, DType.FLOAT16),
            UploadRing.request(f"host_{kVisualInput}", worst, DType.FLOAT16, slots=_SLOTS),
            TensorRequest.of(kVisualOutput, (cfg.max_engine_tiles * cfg.tokens_per_tile, cfg.out_hidden_size),
                             DType.FLOAT16),
        ]
        s = as_stream(stream, be)
        with contextlib.ExitStack() as stack:
            self._arena = stack.enter_context(Arena(requests, backend=be, title="visual"))
            self._tiles = stack.enter_context(UploadRing(self._arena[f"host_{kVisualInput}"], be, slots=_SLOTS,
                                                         title="tiles staging"))
            self._calls = stack.enter_context(Calls(be, "InternVLSetup"))
            tm = TensorMap("visual")
            for spec in self.registry:
                tm.add(spec.name, self._arena[spec.name])
            tm.freeze()
            self.tensor_map = tm
            self.executor = stack.enter_context(EngineExecutor(engine, name=eio.name, registry=self.registry,
                                                               graphs=graphs, backend=be))
            tm.add_user(self.executor)
            s.synchronize()
            self._resources: contextlib.ExitStack | None = stack.pop_all()

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

    # -- views ---------------------------------------------------------------------------------------
    @property
    def graph_stats(self) -> Any:
        """The executor's CUDA-graph telemetry (hits, captures, misses, last miss reason)."""
        return self.executor.graph_stats

    @property
    def backend(self) -> Backend:
        return self._backend

    def memory_report(self) -> MemoryReport:
        """Every buffer the setup owns (the arena and the executor's context memory)."""
        self._check_open()
        return MemoryReport.combine("create_for_visual", [self._arena.report(), self.executor.context_memory.report()])

    def _close_owned(self) -> None:
        resources, self._resources = self._resources, None
        if resources is not None:
            resources.close()

    def __repr__(self) -> str:
        return f"InternVLSetup(tiles {self.cfg.min_engine_tiles}..{self.cfg.max_engine_tiles}, " \
               f"graphs={self.executor.graphs_enabled})"


def create_for_internvl(engine: Any, cfg: InternVLConfig, stream: StreamLike = None, *, graphs: bool = False,
                        backend: Backend | str | None = None) -> InternVLSetup:
    """Bind an InternVL encoder engine (see :class:`InternVLSetup`); its declared I/O is checked against ``cfg``
    first (one BindingError lists every problem). Construction runs on ``stream`` and ends synchronised."""
    return InternVLSetup(engine, cfg, stream, graphs=graphs, backend=backend)
