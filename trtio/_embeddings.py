"""Token embeddings on the device: the rows of an engine directory's embedding tables for token ids.

:class:`TokenEmbeddings` holds ``embedding.safetensors``' table (and, for a Gemma 4 directory with per-layer
embeddings, ``ple_embedding.safetensors``') in device memory and gathers the rows of a batch of token ids in one
row copy per table, on a stream: what a step's ``inputs_embeds`` (and ``ple_embeds=``) take. Made with
:meth:`EngineDir.embeddings <trtio.edgellm.EngineDir.embeddings>` for an engine directory (or from the tables
themselves). The token ids may be on the host (checked, then staged) or already on the device (a greedy loop's
argmax: read where they are, never copied to the host).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from trtio._cuda.backend import Backend, Location, get_backend
from trtio._dlpack import kDLCPU, kDLCUDAHost
from trtio._dtypes import DType
from trtio._foreign import cuda_array_interface, dlpack_device
from trtio._lifetime import Closeable
from trtio._memory import Arena, TensorRequest
from trtio._ops import copy_rows
from trtio._staging import INPUT_RING_SLOTS, UploadRing
from trtio._stream import StreamLike, as_stream
from trtio._tensor import Tensor
from trtio.errors import ShapeError

__all__ = ["TokenEmbeddings"]


class TokenEmbeddings(Closeable):
    """An engine directory's embedding tables on the device (see the module docstring).

    :meth:`embed` returns views of buffers this object owns, ``[batch, seq, width]``: valid until the next
    :meth:`embed` (stream-ordered after it) or :meth:`close`. Follows trtio's close protocol.
    """

    def __init__(self, table: np.ndarray, ple_table: np.ndarray | None = None, stream: StreamLike = None, *,
                 max_tokens: int, backend: Backend | str | None = None) -> None:
        """``stream`` orders the tables' upload."""
        be = get_backend(backend)
        self._init_lifetime("token embeddings")
        self.vocab, self.hidden = int(table.shape[0]), int(table.shape[1])
        self.ple_width = int(ple_table.shape[1]) if ple_table is not None else 0
        self.max_tokens = int(max_tokens)
        reqs = [TensorRequest("embedding", tuple(table.shape), DType.FLOAT16, Location.DEVICE),
                TensorRequest.of("token_ids", (self.max_tokens,), DType.INT32),
                TensorRequest.of("inputs_embeds", (self.max_tokens, self.hidden), DType.FLOAT16),
                UploadRing.request("ring_token_ids", (self.max_tokens,), DType.INT32, slots=INPUT_RING_SLOTS)]
        if ple_table is not None:
            reqs += [TensorRequest("ple_embedding", tuple(ple_table.shape), DType.FLOAT16, Location.DEVICE),
                     TensorRequest.of("ple_embeds", (self.max_tokens, self.ple_width), DType.FLOAT16)]
        s = as_stream(stream, be)
        with contextlib.ExitStack() as undo:
            self._arena = Arena(reqs, backend=be, title="token embeddings")
            undo.callback(self._arena.close)
            self._ring = UploadRing(self._arena["ring_token_ids"], be, slots=INPUT_RING_SLOTS,
                                    title="token ids staging")
            undo.callback(self._ring.close)
            self._arena["embedding"].copy_from(np.ascontiguousarray(table, np.float16), s)
            if ple_table is not None:
                self._arena["ple_embedding"].copy_from(np.ascontiguousarray(ple_table, np.float16), s)
            undo.pop_all()

    def embed(self, token_ids: Any, stream: StreamLike = None) -> Tensor | tuple[Tensor, Tensor]:
        """The embedding rows of ``token_ids`` ``[batch, seq]``, gathered on ``stream``: ``inputs_embeds``
        ``[batch, seq, hidden]``, or ``(inputs_embeds, ple_embeds [batch, seq, L x ple_hidden])`` where the
        directory has per-layer embeddings.

        ``token_ids``: host ints (numpy, a list, a CPU torch tensor), checked and staged (an id outside the
        vocabulary is a :class:`ShapeError`, nothing enqueued); or int32 ids on the device (a ``Tensor``, or a
        torch / CuPy CUDA array, read in place, its producer ordered before ``stream``), which the host never
        reads: an id outside the table raises from the enqueued work on the host backend and gathers no row (the
        row keeps what it held) on the cuda backend."""
        self._check_open()
        s = as_stream(stream, self._arena.backend)
        device = self._device_ids(token_ids, s)
        if device is not None:
            shape, rows = device.shape, device
        else:
            ids = np.asarray(token_ids)
            if ids.ndim != 2 or ids.dtype.kind not in "iu":
                raise ShapeError(f"token_ids: expected integer ids [batch, seq], got {ids.dtype} {list(ids.shape)}")
            self._check_count(ids.size)
            bad = np.flatnonzero((ids < 0) | (ids >= self.vocab))
            if bad.size:
                raise ShapeError(f"token_ids: id {int(ids.reshape(-1)[bad[0]])} is outside the {self.vocab} rows of "
                                 "the embedding table")
            shape = ids.shape
            rows = self._ring.upload(ids.reshape(-1).astype(np.int32), self._arena["token_ids"], s, reshape=False)
        n = int(shape[0]) * int(shape[1])
        out = self._arena["inputs_embeds"]
        copy_rows(out, self._arena["embedding"], rows, n, row_bytes=2 * self.hidden, stream=s)
        embeds = out.reshape((shape[0], shape[1], self.hidden))
        if not self.ple_width:
            return embeds
        ple = self._arena["ple_embeds"]
        copy_rows(ple, self._arena["ple_embedding"], rows, n, row_bytes=2 * self.ple_width, stream=s)
        return embeds, ple.reshape((shape[0], shape[1], self.ple_width))

    def _check_count(self, n: int) -> None:
        if n > self.max_tokens:
            raise ShapeError(f"token_ids: {n} tokens, more than max_tokens ({self.max_tokens})")

    def _device_ids(self, token_ids: Any, s: Any) -> Tensor | None:
        """``token_ids`` as a device Tensor of int32 ``[batch, seq]`` (its producer ordered before ``s``), or None
        for ids on the host."""
        if isinstance(token_ids, Tensor):
            ids = token_ids
            if ids.location is not Location.DEVICE:
                return None
            if ids._last_stream is not None:
                ids._order_consumer(s._handle)
        else:
            found = dlpack_device(token_ids, "token_ids")
            on_device = found[0] not in (kDLCPU, kDLCUDAHost) if found is not None else \
                cuda_array_interface(token_ids) is not None
            if not on_device:
                return None
            ids = Tensor.from_dlpack(token_ids, s, name="token_ids", backend=self._arena.backend)
        if ids.dtype is not DType.INT32 or len(ids.shape) != 2:
            raise ShapeError(f"token_ids: ids on the device must be int32 [batch, seq], got {ids.dtype} "
                             f"{list(ids.shape)}")
        self._check_count(int(ids.shape[0]) * int(ids.shape[1]))
        return ids

    def _close_owned(self) -> None:
        with contextlib.ExitStack() as release:
            release.callback(self._arena.close)
            release.callback(self._ring.close)
