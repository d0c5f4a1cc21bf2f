"""The checks every component's splice makes of the LLM's embedding table and the expanded token ids (the visual
kinds' and the audio encoder's): each refused naming the argument and what was expected, before any row is read."""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio.errors import ShapeError

__all__ = ["checked_ids", "embedding_table"]


def embedding_table(embedding: Any, width: int, rows_have: str) -> np.ndarray:
    """``embedding`` as a float ``[vocab, hidden]`` array whose rows are ``width`` wide, the encoder's rows' width
    (``rows_have``: whose rows and which key give it, for the message)."""
    table = np.asarray(embedding)
    if table.ndim != 2 or table.dtype.kind != "f":
        raise ShapeError(f"embedding: expected a [vocab, hidden] float table, got {table.dtype} {list(table.shape)}")
    hidden = table.shape[1]
    if hidden != width:
        raise ShapeError(f"embedding: rows of {hidden}, but {rows_have} {width}")
    return table


def checked_ids(ids: np.ndarray, vocab: int) -> None:
    """Every id of ``ids`` (the token ids, pads expanded) is a row of a ``vocab``-row embedding."""
    bad = np.flatnonzero((ids < 0) | (ids >= vocab))
    if bad.size:
        raise ShapeError(f"token_ids: token {int(ids[bad[0]])} at {int(bad[0])} is outside the {vocab}-row embedding")
