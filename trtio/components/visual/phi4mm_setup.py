"""create_for_phi4mm_visual: Phi-4-multimodal's vision encoder (``visual/visual.engine``, model_type ``phi4mm``)
bound to worst-case buffers, and its one step, :meth:`Phi4mmVisualSetup.encode`.

The engine takes ``input`` float16 ``[blocks, 3, crop, crop]`` (the blocks of
:func:`trtio.components.visual.phi4mm.preprocess`) and writes ``output`` float16 ``[blocks * 256, hidden]``
(:func:`~trtio.components.visual.phi4mm.phi4mm_registry`). Buffers are allocated once for the profile's most blocks;
an encode checks the blocks first (a refusal names the input and changes nothing), uploads them through a fenced
pinned ring, binds the engine for the step's block count and runs it, as one CUDA graph per block count where
``graphs=True``. :func:`~trtio.components.visual.phi4mm.image_rows` then lays the rows out with the separator rows.
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
from trtio._setups.calls import one_thread
from trtio._staging import UploadRing
from trtio._stream import Stream, StreamLike, as_stream
from trtio._tensor import Tensor
from trtio.components.encoder_setup import EncoderSetup
from trtio.components.visual.phi4mm import Phi4mmVisualConfig, kVisualInput, kVisualOutput, phi4mm_registry
from trtio.components.visual.visual_setup import VisualOutput
from trtio.errors import CapacityError, InvalidTypeError, InvalidValueError, ShapeError

__all__ = ["Phi4mmVisualSetup", "create_for_phi4mm_visual"]

_BLOCK_SLOTS = 2


class Phi4mmVisualSetup(EncoderSetup):
    """Phi-4-MM's vision encoder bound to its worst-case buffers (see module docstring); build it with
    :func:`create_for_phi4mm_visual` (or ``create_from_engine_dir``, which attaches it as the LLM setup's
    ``visual``). ``cfg``, ``executor``, ``tensor_map`` and ``registry`` are public views. Streams and the close
    protocol as :class:`~trtio.components.visual.visual_setup.VisualSetup`'s."""

    FACTORY = "create_for_phi4mm_visual"
    WHAT = "visual"

    def __init__(self, engine: Any, cfg: Phi4mmVisualConfig, stream: StreamLike = None, *, graphs: bool = False,
                 backend: Backend | str | None = None) -> None:
        if not isinstance(cfg, Phi4mmVisualConfig):
            raise InvalidTypeError(f"create_for_phi4mm_visual: cfg must be a Phi4mmVisualConfig (EngineDir."
                                   f"visual_config of a phi4mm directory), got {type(cfg).__name__}")
        self.cfg = cfg
        block = (cfg.in_channels, cfg.crop_size, cfg.crop_size)
        most = (cfg.max_blocks, *block)
        requests = [
            TensorRequest.of(kVisualInput, most, DType.FLOAT16),
            UploadRing.request(f"host_{kVisualInput}", most, DType.FLOAT16, slots=_BLOCK_SLOTS),
            TensorRequest.of(kVisualOutput, (cfg.max_blocks * cfg.tokens_per_block, cfg.out_hidden_size),
                             DType.FLOAT16),
        ]

        def staging(stack: contextlib.ExitStack, arena: Arena, be: Backend) -> None:
            self._blocks = stack.enter_context(UploadRing(arena[f"host_{kVisualInput}"], be, slots=_BLOCK_SLOTS,
                                                          title="blocks staging"))

        self._bind(engine, phi4mm_registry(cfg), requests, stream, graphs=graphs, backend=backend, staging=staging)
        self._block_shape = block

    @one_thread
    def encode(self, blocks: Any, stream: StreamLike = None) -> VisualOutput:
        """Run the encoder over ``blocks`` (``[n, 3, crop, crop]``: a host float array, converted to float16, or a
        float16 device array; :func:`~trtio.components.visual.phi4mm.preprocess`'s first result); returns its rows
        (:class:`~trtio.components.visual.visual_setup.VisualOutput`: ``embeds`` ``[n * 256, hidden]`` float16,
        no deepstack, ``grid_thw`` ``[[n]]``), views valid until the next encode.

        Refused before any work, naming the input: another shape or dtype, values float16 cannot hold, or a block
        count outside the engine's profile (CapacityError). Nothing is allocated; the host never waits for the
        device (except where it runs two encodes ahead of the block copies)."""
        self._check_open()
        s = as_stream(stream, self._backend)
        x = self._checked_blocks(blocks, s)
        n = int(x.shape[0])
        self._calls.stream(s)
        dst = self._arena[kVisualInput]
        if isinstance(x, Tensor):
            self._calls.read(x)
            dst.reshape(tuple(x.shape)).copy_from(x, s)
        else:
            self._blocks.upload(x, dst, s)
        ex = self.executor
        dims = InferenceDims(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, vit_patches=n, vit_tokens=n * self.cfg.tokens_per_block)
        ex.prepare(0, self.tensor_map, dims, s)
        ex.execute(s)
        return VisualOutput(self._arena[kVisualOutput], [], np.asarray([[n]], np.int64))

    def _checked_blocks(self, blocks: Any, s: Stream) -> Tensor | np.ndarray:
        cfg = self.cfg
        x = as_input(blocks, "blocks", s, dtype=DType.FLOAT16 if is_device_array(blocks) else None, ndim=4,
                     backend=self._backend)
        shape = tuple(int(d) for d in x.shape)
        if shape[1:] != self._block_shape or (isinstance(x, Tensor) and x.dtype is not DType.FLOAT16) or \
                (not isinstance(x, Tensor) and np.asarray(x).dtype.kind != "f"):
            dtype = x.dtype if isinstance(x, Tensor) else np.asarray(x).dtype
            raise ShapeError(f"blocks: expected [n, {cfg.in_channels}, {cfg.crop_size}, {cfg.crop_size}] float values "
                             f"(float16 on the device), got {dtype} {list(shape)}")
        if not cfg.min_blocks <= shape[0] <= cfg.max_blocks:
            raise CapacityError(f"blocks: {shape[0]} blocks in one call; the visual engine takes {cfg.min_blocks}.."
                                f"{cfg.max_blocks} (builder_config min_image_tokens {cfg.min_image_tokens}, "
                                f"max_image_tokens {cfg.max_image_tokens}, 256 tokens a block)")
        if isinstance(x, Tensor):
            return x
        arr = np.asarray(x)
        with np.errstate(over="ignore"):
            out = np.ascontiguousarray(arr.astype(np.float16))
        bad = ~np.isfinite(out)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InvalidValueError(f"blocks{list(where)} = {float(arr[where])!r} is not a finite float16 value")
        return out

    def __repr__(self) -> str:
        return f"Phi4mmVisualSetup(blocks {self.cfg.min_blocks}..{self.cfg.max_blocks}, " \
               f"graphs={self.executor.graphs_enabled})"


def create_for_phi4mm_visual(engine: Any, cfg: Phi4mmVisualConfig, stream: StreamLike = None, *, graphs: bool = False,
                             backend: Backend | str | None = None) -> Phi4mmVisualSetup:
    """Bind Phi-4-MM's vision encoder to its worst-case buffers (see :class:`Phi4mmVisualSetup`); its declared I/O is
    checked against ``cfg`` first (one BindingError lists every problem). Construction ends synchronised."""
    return Phi4mmVisualSetup(engine, cfg, stream, graphs=graphs, backend=backend)
