"""Token embeddings on the device: the rows of an engine directory's embedding tables for token ids.

:class:`TokenEmbeddings` holds ``embedding.safetensors``' table (and, for a Gemma 4 directory with per-layer
embeddings, ``ple_embedding.safetensors``') in device memory and gathers the rows of a batch of token ids in one
row copy per table, on a stream: what a step's ``inputs_embeds`` (and ``ple_embeds=``) take. Made with
:meth:`TokenEmbeddings.from_dir`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from trtio._lifetime import Closeable
from trtio.cuda.backend import Backend, Location, get_backend
from trtio.dtypes import DType
from trtio.edgellm import EngineDir
from trtio.errors import ShapeError
from trtio.memory import Arena, TensorRequest
from trtio.ops import copy_rows
from trtio.staging import INPUT_RING_SLOTS, UploadRing
from trtio.stream import StreamLike, as_stream
from trtio.tensor import Tensor

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

    @classmethod
    def from_dir(cls, directory: EngineDir, stream: StreamLike = None, *, max_tokens: int | None = None,
                 backend: Backend | str | None = None) -> TokenEmbeddings:
        """The tables of an engine directory (:meth:`EngineDir.embedding_table`, and
        :meth:`EngineDir.ple_embedding_table` where it has one); ``max_tokens`` (default: max batch x max input
        length of its config) bounds one :meth:`embed`."""
        cfg = directory.config if directory.kind == "llm" else directory.deployment().base
        tokens = max_tokens or cfg.max_supported_batch_size * cfg.max_supported_input_length
        return cls(directory.embedding_table(), directory.ple_embedding_table(), max_tokens=tokens, backend=backend,
                   stream=stream)

    def embed(self, token_ids: Any, stream: StreamLike = None) -> Tensor | tuple[Tensor, Tensor]:
        """The embedding rows of ``token_ids`` (ints ``[batch, seq]``), gathered on ``stream``: ``inputs_embeds``
        ``[batch, seq, hidden]``, or ``(inputs_embeds, ple_embeds [batch, seq, L x ple_hidden])`` where the
        directory has per-layer embeddings. Ids outside the vocabulary are refused (:class:`ShapeError`)."""
        self._check_open()
        ids = np.asarray(token_ids)
        if ids.ndim != 2 or ids.dtype.kind not in "iu":
            raise ShapeError(f"token_ids: expected integer ids [batch, seq], got {ids.dtype} {list(ids.shape)}")
        n = ids.size
        if n > self.max_tokens:
            raise ShapeError(f"token_ids: {n} tokens, more than max_tokens ({self.max_tokens})")
        bad = np.flatnonzero((ids < 0) | (ids >= self.vocab))
        if bad.size:
            raise ShapeError(f"token_ids: id {int(ids.reshape(-1)[bad[0]])} is outside the {self.vocab} rows of the "
                             "embedding table")
        s = as_stream(stream, self._arena.backend)
        rows = self._ring.upload(ids.reshape(-1).astype(np.int32), self._arena["token_ids"], s, reshape=False)
        out = self._arena["inputs_embeds"]
        copy_rows(out, self._arena["embedding"], rows, n, row_bytes=2 * self.hidden, stream=s)
        embeds = out.reshape((ids.shape[0], ids.shape[1], self.hidden))
        if not self.ple_width:
            return embeds
        ple = self._arena["ple_embeds"]
        copy_rows(ple, self._arena["ple_embedding"], rows, n, row_bytes=2 * self.ple_width, stream=s)
        return embeds, ple.reshape((ids.shape[0], ids.shape[1], self.ple_width))

    def _close_owned(self) -> None:
        with contextlib.ExitStack() as release:
            release.callback(self._arena.close)
            release.callback(self._ring.close)
