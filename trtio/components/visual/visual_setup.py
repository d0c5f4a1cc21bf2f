"""create_for_visual: a vision encoder (Edge-LLM 0.11's ``visual/visual.engine``) bound to worst-case buffers,
and its one step, :meth:`VisualSetup.encode`.

Every buffer is allocated once, from the config's token caps
(:class:`~trtio.components.visual.visual_config.VisualConfig`:
``max_image_tokens`` merged tokens, frames, windows and the longest frame). An encode checks the images'
patch grids and patches first (a refusal names the input and changes nothing), computes every other input
from the grids on the host (:func:`trtio.components.visual.vit.vit_step`: rotary table, ``cu_seqlens``, window or fast
position-embedding indexes, the shape-only ``max_seqlen_carrier``; kept per grid in a
:class:`~trtio._cache.BoundedCache`), uploads them with one copy (a :class:`~trtio._staging.StepStaging`
block: a grid seen before uploads nothing new) and the patches through a fenced pinned ring, binds the
engine for the step's shapes and runs it, as one CUDA graph per grid shape where ``graphs=True``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from trtio._cache import BoundedCache
from trtio._cuda.backend import Backend
from trtio._dtypes import DType
from trtio._inputs import as_input, is_device_array
from trtio._memory import Arena, TensorRequest
from trtio._setups.calls import one_thread
from trtio._staging import StepStaging, UploadRing
from trtio._stream import Stream, StreamLike, as_stream
from trtio._tensor import Tensor
from trtio.components.encoder_setup import EncoderSetup
from trtio.components.visual.visual_config import VisualConfig
from trtio.components.visual.visual_kinds import kind_of
from trtio.components.visual.vit import (
    VitStep,
    deepstack_features,
    kMaxSeqLenCarrier,
    kVisualInput,
    kVisualOutput,
    vit_registry,
    vit_step,
)
from trtio.errors import InvalidTypeError, InvalidValueError, ShapeError

__all__ = ["VisualOutput", "VisualSetup", "create_for_visual"]

# Pinned slots the patches are uploaded through: an encode may be enqueued while the previous one's copy runs.
_PATCH_SLOTS = 2


class VisualOutput:
    """What one :meth:`VisualSetup.encode` returns: ``embeds``, the merged image tokens ``[tokens, out_hidden]``
    (float16), and ``deepstack``, Qwen3-VL's deepstack features (one ``[tokens, out_hidden]`` Tensor each; empty
    for Qwen2.5-VL). The images' tokens follow each other in the order of ``grid_thw``.

    The Tensors are views of the setup's output buffers, written on the encode's stream; they stay valid until
    the next encode overwrites them (copy them, or splice them into a prompt, before encoding again)."""

    __slots__ = ("embeds", "deepstack", "grid_thw")

    def __init__(self, embeds: Tensor, deepstack: list[Tensor], grid_thw: np.ndarray) -> None:
        self.embeds = embeds
        self.deepstack = deepstack
        self.grid_thw = grid_thw

    def __repr__(self) -> str:
        return (f"VisualOutput(embeds={list(self.embeds.shape)}, deepstack={len(self.deepstack)}, "
                f"images={len(self.grid_thw)})")


class VisualSetup(EncoderSetup):
    """A ViT engine bound to its worst-case buffers (see module docstring); build it with
    :func:`create_for_visual`. ``cfg``, ``executor``, ``tensor_map`` and ``registry`` are public views.

    Streams: :meth:`encode` runs on ``stream`` (None: the calling thread's trtio default stream); encodes run in
    call order whatever streams they are given (a stream other than the last encode's waits for an event after
    it). Follows trtio's close protocol."""

    FACTORY = "create_for_visual"
    WHAT = "visual"

    def __init__(self, engine: Any, cfg: VisualConfig, stream: StreamLike = None, *, graphs: bool = False,
                 backend: Backend | str | None = None) -> None:
        if not isinstance(cfg, VisualConfig):
            raise InvalidTypeError(f"create_for_visual: cfg must be a VisualConfig (EngineDir.visual_config, or "
                                   f"VisualConfig.from_dir), got {type(cfg).__name__}")
        self.cfg = cfg
        registry = vit_registry(cfg)
        geometry = [s for s in registry if s.is_input and s.name not in (kVisualInput, kMaxSeqLenCarrier)]
        worst = {n: tuple(spec.profiles[0][2]) for n, spec in ((s.name, s) for s in registry if s.is_input)}
        out_shape = (cfg.max_image_tokens, cfg.out_hidden_size)
        outputs = [kVisualOutput] + [deepstack_features(i) for i in range(cfg.num_deepstack)]
        requests = StepStaging.requests([TensorRequest.of(s.name, worst[s.name], s.dtype) for s in geometry])
        requests += [
            TensorRequest.of(kVisualInput, worst[kVisualInput], DType.FLOAT16),
            UploadRing.request(f"host_{kVisualInput}", worst[kVisualInput], DType.FLOAT16, slots=_PATCH_SLOTS),
            # Shape-only: the engine reads its extent, never its bytes.
            TensorRequest.of(kMaxSeqLenCarrier, worst[kMaxSeqLenCarrier], DType.INT32),
        ]
        requests += [TensorRequest.of(n, out_shape, DType.FLOAT16) for n in outputs]

        def staging(stack: contextlib.ExitStack, arena: Arena, be: Backend) -> None:
            self._staging = stack.enter_context(StepStaging(arena, [g.name for g in geometry],
                                                            title="visual step inputs"))
            self._patches = stack.enter_context(UploadRing(arena[f"host_{kVisualInput}"], be, slots=_PATCH_SLOTS,
                                                           title="patches staging"))

        self._bind(engine, registry, requests, stream, graphs=graphs, backend=backend, staging=staging)
        self._geometry_names = tuple(g.name for g in geometry)
        self._outputs = [self._arena[n] for n in outputs]
        self._steps: BoundedCache[tuple[tuple[int, int, int], ...], VitStep] = BoundedCache()

    # -- the step ----------------------------------------------------------------------------------
    @one_thread
    def encode(self, patches: Any, grid_thw: Any, stream: StreamLike = None) -> VisualOutput:
        """Run the ViT over the images of ``grid_thw`` (``[images, 3]`` patch grids, as
        :func:`trtio.vision.preprocess` returns them) whose ``patches`` (``[N, patch_dim]``, N the grids' total
        patches: a host float array, converted to float16, or a float16 device array) are packed one image after
        the other; returns the merged tokens (:class:`VisualOutput`, views valid until the next encode).

        Refused before any work, naming the input: a malformed grid, more patches, frames or windows than the
        engine's caps take (CapacityError), fewer patches than its minimum, patches of another shape or dtype,
        or values float16 cannot hold. Nothing is allocated; the host never waits for the device (except where
        it runs two encodes ahead of the patch copies)."""
        self._check_open()
        step = self.step_for(grid_thw)
        want = (step.patches, self.cfg.patch_dim)
        s = as_stream(stream, self._backend)
        x = self._checked_patches(patches, want, s)
        self._calls.stream(s)
        staging = self._staging
        staging.write_all(self._geometry_names, tuple(step.values[n] for n in self._geometry_names))
        staging.upload(s)
        dst = self._arena[kVisualInput]
        if isinstance(x, Tensor):
            self._calls.read(x)  # kept until the copy has run
            dst.reshape(want).copy_from(x, s)
        else:
            self._patches.upload(x, dst, s)
        ex = self.executor
        ex.prepare(0, self.tensor_map, step.dims, s)
        ex.execute(s)
        out = self._outputs
        return VisualOutput(out[0], out[1:], np.asarray(step.grid, np.int64))

    def step_for(self, grid_thw: Any) -> VitStep:
        """The inputs an encode of ``grid_thw`` binds (:func:`trtio.components.visual.vit.vit_step`, checked against
        the caps; kept
        per grid)."""
        self._check_open()
        key: tuple[tuple[int, int, int], ...] | None = None
        if isinstance(grid_thw, (list, tuple, np.ndarray)):
            arr = np.asarray(grid_thw)
            if arr.ndim == 2 and arr.shape[1:] == (3,) and arr.dtype.kind in "iu":
                key = tuple((int(t), int(h), int(w)) for t, h, w in arr.tolist())
        found = self._steps.get(key) if key is not None else None
        if found is None:
            found = vit_step(self.cfg, grid_thw)
            self._steps.put(found.grid, found)
        return found

    def _checked_patches(self, patches: Any, want: tuple[int, int], s: Stream) -> Tensor | np.ndarray:
        """``patches`` as float16 host data or a float16 device Tensor of shape ``want``."""
        x = as_input(patches, "patches", s, dtype=DType.FLOAT16 if is_device_array(patches) else None, ndim=2,
                     backend=self._backend)
        if isinstance(x, Tensor):
            if x.dtype is not DType.FLOAT16 or tuple(x.shape) != want:
                raise ShapeError(f"patches: expected a [{want[0]}, {want[1]}] float16 device array (the grids' "
                                 f"patches x in_channels * temporal_patch_size * patch_size ** 2), got "
                                 f"{list(x.shape)} {x.dtype}")
            return x
        arr = np.asarray(x)
        if arr.shape != want or arr.dtype.kind != "f":
            raise ShapeError(f"patches: expected [{want[0]}, {want[1]}] float values (the grids' patches x "
                             f"in_channels * temporal_patch_size * patch_size ** 2), got {arr.dtype} {list(arr.shape)}")
        with np.errstate(over="ignore"):  # an overflow is refused just below, naming the value
            out = np.ascontiguousarray(arr.astype(np.float16))
        bad = ~np.isfinite(out)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InvalidValueError(f"patches{list(where)} = {float(arr[where])!r} is not a finite float16 value")
        return out


def create_for_visual(engine: Any, cfg: Any, stream: StreamLike = None, *, graphs: bool = False,
                      backend: Backend | str | None = None) -> Any:
    """Bind a ViT engine (Qwen2.5-VL or Qwen3-VL: ``EngineDir.visual_config`` says which) to its worst-case
    buffers; see :class:`VisualSetup`. Its declared I/O is checked against ``cfg`` first (names, dtypes, ranks,
    fixed dims, the profile against the config's token caps: one BindingError lists every problem).
    Construction runs on ``stream`` and ends synchronised. A config of another encoder kind
    (:mod:`~trtio.components.visual.visual_kinds`: an InternVL config) binds that kind's setup."""
    kind = kind_of(cfg)
    if kind is not None:
        return kind.create(engine, cfg, stream, graphs=graphs, backend=backend)
    return VisualSetup(engine, cfg, stream, graphs=graphs, backend=backend)
