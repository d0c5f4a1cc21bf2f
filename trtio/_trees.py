"""Tree attention masks and their companion inputs for speculative (EAGLE-style) decoding.

A draft tree of ``N`` nodes is described by an unpacked mask ``[B, N, N]``: row ``t`` is query
node ``t`` and entry ``i`` is nonzero iff node ``t`` attends to node ``i`` (itself and its
ancestors). Nodes are topologically ordered, so a valid mask is lower-triangular. Rows past a
sequence's actual tree size are all zero (padding).

The attention plugin reads the mask packed into bits, as Edge-LLM's ``assembleDraftTreeDescKernel``
writes it (``cpp/kernels/speculative/eagleUtilKernels.cu``): int32 ``[B, N, W]`` with
``W = ceil(N / 32)``, where bit ``i % 32`` of word ``i // 32`` (LSB first) holds entry ``i``. Bit 31
lands in the int32 sign bit, so a word with it set reads negative.

The functions here are numpy: they run on the host, take array-likes, and return new arrays that
the caller owns. Only :func:`write_tree_inputs` touches device tensors: it stages a step's inputs
into a spec-decode :class:`~trtio._pipeline_io.PipelineIO` on a stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from trtio.errors import ShapeError

if TYPE_CHECKING:
    from trtio._pipeline_io import PipelineIO

__all__ = [
    "EDGE_LLM_MAX_TREE_SIZE",
    "CAUSAL_MASK_TRAILING_DIMS",
    "pack_tree_mask",
    "unpack_tree_mask",
    "tree_position_ids",
    "tree_context_lengths",
    "tree_last_token_ids",
    "causal_mask_shape",
    "ancestor_mask",
    "validate_tree_mask",
    "chain_mask",
    "TreeInputs",
    "write_tree_inputs",
]

#: The largest tree Edge-LLM's speculative kernels accept: they keep at most 4 packed words per
#: row (4 * 32 = 128 nodes). The functions here take any ``N >= 1``; a tree larger than this packs
#: correctly but an Edge-LLM engine will not accept it.
EDGE_LLM_MAX_TREE_SIZE: Final[int] = 128

#: The trailing dims of the ``attention_mask`` binding that mean "no tree mask". Bound as
#: ``[B, 1, 1]``, the attention plugin ignores the mask buffer's contents and applies plain causal
#: attention; Edge-LLM binds it this way for prefill (and the engine's context profile is built
#: with ``attention_mask`` at ``[1..B, 1, 1]``). See :func:`causal_mask_shape`.
CAUSAL_MASK_TRAILING_DIMS: Final[tuple[int, int]] = (1, 1)

_BITS_PER_WORD = 32
_INT32_MAX = int(np.iinfo(np.int32).max)


# -- host-side masks and companion inputs ------------------------------------------------------


def pack_tree_mask(unpacked: npt.ArrayLike) -> np.ndarray:
    """Pack a tree mask ``[B, N, N]`` into Edge-LLM's bit layout, int32 ``[B, N, ceil(N/32)]``.

    Bit ``i % 32`` of word ``i // 32`` of row ``(b, t)`` is set iff ``unpacked[b, t, i] != 0``.
    Every entry is packed as given, including any above the diagonal; use
    :func:`validate_tree_mask` to check that the mask is a tree.

    Args:
        unpacked: bool or integer array ``[B, N, N]``, ``N >= 1``; nonzero means "sees".

    Returns:
        A new C-contiguous int32 array ``[B, N, W]`` owned by the caller. Words whose bit 31 is
        set are negative.

    Raises:
        ShapeError: ``unpacked`` is not a square ``[B, N, N]`` bool or integer array.
    """
    mask = _as_tree_mask(unpacked, "unpacked")
    batch, num_nodes, _ = mask.shape
    words = _num_words(num_nodes)
    padded = np.zeros((batch, num_nodes, words * _BITS_PER_WORD), dtype=np.uint32)
    padded[:, :, :num_nodes] = mask
    bits = padded.reshape(batch, num_nodes, words, _BITS_PER_WORD)
    shifts = np.arange(_BITS_PER_WORD, dtype=np.uint32)
    # Each bit position contributes a distinct power of two, so the sum is the bitwise OR.
    packed = np.sum(bits << shifts, axis=-1, dtype=np.uint32)
    return np.ascontiguousarray(packed).view(np.int32)


def unpack_tree_mask(packed: npt.ArrayLike, num_nodes: int) -> np.ndarray:
    """Unpack Edge-LLM's packed mask ``[B, N, ceil(N/32)]`` into a bool ``[B, N, N]`` array.

    The inverse of :func:`pack_tree_mask`: ``unpack_tree_mask(pack_tree_mask(m), N)`` equals
    ``m != 0``.

    Args:
        packed: integer array ``[B, N, W]`` with ``W == ceil(num_nodes / 32)``. int32 words (as the
            engine holds them) and uint32 words are both accepted; every value must fit 32 bits.
        num_nodes: the tree size ``N`` the mask was packed for, ``>= 1``.

    Returns:
        A new bool array ``[B, N, N]`` owned by the caller.

    Raises:
        ShapeError: ``num_nodes`` is not an integer ``>= 1``; ``packed`` has the wrong rank, row
            count or word count, a value that does not fit 32 bits, or a bit set for a node
            ``>= num_nodes``.
    """
    num_nodes = _check_int(num_nodes, "num_nodes", minimum=1)
    words = _num_words(num_nodes)
    array = np.asarray(packed)
    _check_integer_dtype(array, "packed")
    if array.ndim != 3:
        raise ShapeError(
            f"packed: expected a [B, N, W] array, got shape {array.shape} (rank {array.ndim})"
        )
    if array.shape[1] != num_nodes or array.shape[2] != words:
        raise ShapeError(
            f"packed: expected shape [B, {num_nodes}, {words}] for num_nodes={num_nodes} "
            f"(W = ceil(N/32) = {words}), got {array.shape}"
        )
    lowest, highest = int(np.iinfo(np.int32).min), int(np.iinfo(np.uint32).max)
    if array.size and (int(array.min()) < lowest or int(array.max()) > highest):
        raise ShapeError(
            f"packed: values must fit 32 bits (int32 or uint32 words), "
            f"got range [{array.min()}, {array.max()}]"
        )
    # Casting through int64 maps negative int32 words onto their uint32 bit patterns.
    unsigned = (array.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)
    shifts = np.arange(_BITS_PER_WORD, dtype=np.uint32)
    bits = ((unsigned[..., np.newaxis] >> shifts) & 1).astype(bool)
    batch = array.shape[0]
    flat = bits.reshape(batch, num_nodes, words * _BITS_PER_WORD)
    stray = np.argwhere(flat[:, :, num_nodes:])
    if stray.size:
        b, t, extra = (int(v) for v in stray[0])
        raise ShapeError(
            f"packed: row (b={b}, t={t}) has bit {num_nodes + extra} set, but "
            f"num_nodes={num_nodes} (bits for nodes >= num_nodes must be 0)"
        )
    return np.ascontiguousarray(flat[:, :, :num_nodes])


def tree_position_ids(unpacked: npt.ArrayLike, kv_lengths: npt.ArrayLike) -> np.ndarray:
    """Position ids of the tree's nodes: ``kv_lengths[b] + depth``, int32 ``[B, N]``.

    The depth of node ``t`` is the number of nodes its row sees minus one (the root has depth 0),
    as Edge-LLM computes it: ``kvLen(b) + popcount(row) - 1``. Rows that see nothing (padding past
    the tree size) get position 0. The mask is assumed to be a valid tree
    (:func:`validate_tree_mask`); that is not checked here.

    Args:
        unpacked: bool or integer array ``[B, N, N]``; nonzero means "sees".
        kv_lengths: integer array ``[B]``, each ``>= 0``: tokens already in each KV cache.

    Returns:
        A new int32 array ``[B, N]`` owned by the caller.

    Raises:
        ShapeError: ``unpacked`` is not ``[B, N, N]``; ``kv_lengths`` is not ``[B]`` non-negative
            integers; a position would not fit int32.
    """
    mask = _as_tree_mask(unpacked, "unpacked")
    batch = mask.shape[0]
    kv = _as_lengths(kv_lengths, "kv_lengths", batch=batch, batch_from="unpacked")
    seen = mask.sum(axis=-1, dtype=np.int64)
    positions = np.where(seen > 0, kv[:, np.newaxis] + seen - 1, 0)
    return _to_int32(positions, "tree_position_ids: kv_lengths + depth")


def tree_context_lengths(kv_lengths: npt.ArrayLike, padded_tree_size: int) -> np.ndarray:
    """``context_lengths`` for a tree step: ``kv_lengths + padded_tree_size``, int32 ``[B]``.

    Edge-LLM uses the padded tree size on purpose, not each sequence's actual tree size: the
    attention plugin derives the range of past keys from it.

    Args:
        kv_lengths: integer array ``[B]``, each ``>= 0``.
        padded_tree_size: the tree size every sequence is padded to, ``>= 1``.

    Returns:
        A new int32 array ``[B]`` owned by the caller.

    Raises:
        ShapeError: ``kv_lengths`` is not ``[B]`` non-negative integers, ``padded_tree_size`` is
            not an integer ``>= 1``, or a length would not fit int32.
    """
    kv = _as_lengths(kv_lengths, "kv_lengths")
    padded = _check_int(padded_tree_size, "padded_tree_size", minimum=1)
    return _to_int32(kv + padded, "tree_context_lengths: kv_lengths + padded_tree_size")


def tree_last_token_ids(tree_sizes: npt.ArrayLike, select_len: int) -> np.ndarray:
    """``last_token_ids`` for each tree's last ``select_len`` nodes, int64 ``[B, select_len]``.

    Row ``b`` is ``tree_sizes[b] - select_len + i`` for ``i`` in ``range(select_len)``. For base
    verify Edge-LLM passes ``select_len == tree size`` (every node); for a draft proposal step it
    passes top-K (the newest layer of the tree).

    Args:
        tree_sizes: integer array ``[B]``: each sequence's actual tree size, ``>= select_len``.
        select_len: how many trailing nodes to select, ``>= 1``.

    Returns:
        A new int64 array ``[B, select_len]`` owned by the caller.

    Raises:
        ShapeError: ``tree_sizes`` is not ``[B]`` integers, ``select_len`` is not an integer
            ``>= 1``, or ``select_len`` exceeds some ``tree_sizes[b]``.
    """
    sizes = _as_lengths(tree_sizes, "tree_sizes")
    select = _check_int(select_len, "select_len", minimum=1)
    short = np.flatnonzero(sizes < select)
    if short.size:
        b = int(short[0])
        raise ShapeError(
            f"select_len: {select} is larger than tree_sizes[{b}] = {int(sizes[b])}; "
            f"select at most the tree size"
        )
    offsets = np.arange(select, dtype=np.int64)
    return (sizes[:, np.newaxis] - select + offsets).astype(np.int64)


def causal_mask_shape(batch: int) -> tuple[int, int, int]:
    """The ``attention_mask`` shape ``(batch, 1, 1)`` that means "ignore the mask, be causal".

    See :data:`CAUSAL_MASK_TRAILING_DIMS`. Bind the mask tensor with this shape for prefill; its
    contents are not read.

    Raises:
        ShapeError: ``batch`` is not an integer ``>= 1``.
    """
    batch = _check_int(batch, "batch", minimum=1)
    return (batch, *CAUSAL_MASK_TRAILING_DIMS)


def ancestor_mask(parents: npt.ArrayLike) -> np.ndarray:
    """The unpacked mask of a tree given by its parent list, bool ``[N, N]``.

    Row ``t`` has ``t`` and every ancestor of ``t`` set. Stack the results (with zero padding rows
    and columns) to build a batched ``[B, P, P]`` mask.

    Args:
        parents: integer array ``[N]``, ``N >= 1``. ``parents[i]`` is the index of node ``i``'s
            parent, or ``-1`` for a root. Nodes must be in topological order:
            ``parents[i] < i``. Several roots are allowed.

    Returns:
        A new bool array ``[N, N]`` owned by the caller; it is lower-triangular.

    Raises:
        ShapeError: ``parents`` is not a non-empty 1-D integer array, or some ``parents[i]`` is
            ``< -1`` or ``>= i``.
    """
    array = np.asarray(parents)
    _check_integer_dtype(array, "parents")
    if array.ndim != 1 or array.size == 0:
        raise ShapeError(
            f"parents: expected a non-empty [N] array, got shape {array.shape}"
        )
    num_nodes = array.size
    below_root = np.flatnonzero(array < -1)
    if below_root.size:
        i = int(below_root[0])
        raise ShapeError(
            f"parents: parents[{i}] = {int(array[i])}; use -1 for a root or the index of an "
            f"earlier node"
        )
    not_earlier = np.flatnonzero(array >= np.arange(num_nodes))
    if not_earlier.size:
        i = int(not_earlier[0])
        raise ShapeError(
            f"parents: parents[{i}] = {int(array[i])}, but a parent must come before its node "
            f"(topological order: parents[i] < i, or -1 for a root)"
        )
    mask = np.zeros((num_nodes, num_nodes), dtype=bool)
    # One row per node; a node's row is its parent's row (already complete) plus itself.
    for node in range(num_nodes):
        parent = int(array[node])
        if parent >= 0:
            mask[node] = mask[parent]
        mask[node, node] = True
    return mask


def validate_tree_mask(unpacked: npt.ArrayLike) -> None:
    """Check that an unpacked mask ``[B, N, N]`` is a topologically ordered tree mask.

    Two rules, the ones Edge-LLM's kernels rely on:

    - no row sees a later node (``unpacked[b, t, i] != 0`` with ``i > t``): only the lower
      triangle is read, so such a bit would be silently lost;
    - every real row (one that sees anything) sees itself. All-zero rows are padding and allowed.

    Raises:
        ShapeError: ``unpacked`` is not ``[B, N, N]``, or a rule is broken; the message names the
            first offending ``(b, t, i)``.
    """
    mask = _as_tree_mask(unpacked, "unpacked")
    num_nodes = mask.shape[1]
    upper = np.triu(np.ones((num_nodes, num_nodes), dtype=bool), k=1)
    later = np.argwhere(mask & upper)
    if later.size:
        b, t, i = (int(v) for v in later[0])
        raise ShapeError(
            f"unpacked: row (b={b}, t={t}) sees later node i={i}; a node may only see itself "
            f"and earlier nodes (nodes must be in topological order)"
        )
    diagonal = np.diagonal(mask, axis1=1, axis2=2)
    blind = np.argwhere(mask.any(axis=-1) & ~diagonal)
    if blind.size:
        b, t = (int(v) for v in blind[0])
        raise ShapeError(
            f"unpacked: row (b={b}, t={t}) does not see itself (entry (b={b}, t={t}, i={t}) "
            f"is 0); every real row (one that sees any node) must set its own node"
        )


def chain_mask(n: int) -> np.ndarray:
    """The mask of a chain of ``n`` nodes (a degenerate tree): bool ``[n, n]`` lower-triangular.

    Row ``t`` sees nodes ``0..t``, i.e. plain causal attention.

    Raises:
        ShapeError: ``n`` is not an integer ``>= 1``.
    """
    n = _check_int(n, "n", minimum=1)
    return np.tril(np.ones((n, n), dtype=bool))


# -- device tensors ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeInputs:
    """The host values :func:`write_tree_inputs` staged (kept for inspection and tests)."""

    packed_mask: np.ndarray  # int32 [B, N, W]
    position_ids: np.ndarray  # int32 [B, N]
    context_lengths: np.ndarray  # int32 [B]
    last_token_ids: np.ndarray  # int64 [B, select_len]


def write_tree_inputs(
    io: PipelineIO,
    unpacked: npt.ArrayLike,
    kv_lengths: npt.ArrayLike,
    *,
    select_len: int | None = None,
    tree_sizes: npt.ArrayLike | None = None,
    stream: Any = None,
) -> TreeInputs:
    """Stage a tree step's inputs into a spec-decode PipelineIO on ``stream``.

    Writes ``packed_attention_mask`` [B, N, W], ``spec_decode_position_ids`` [B, N] (KV length +
    depth), ``context_lengths`` (KV length + N, the padded size, as Edge-LLM does) and
    ``select_token_indices`` (the last ``select_len`` nodes of each tree; all N by default, as a
    verify step wants). Each goes through its fenced pinned twin, so nothing here synchronises
    unless a previous upload from the same pinned buffer is still in flight. The engine reads
    these tensors as ``attention_mask``, ``attention_pos_id``, ``context_lengths`` and
    ``last_token_ids``.
    """
    mask = _as_tree_mask(unpacked, "unpacked")
    batch, n = mask.shape[0], mask.shape[1]
    kv = _as_lengths(kv_lengths, "kv_lengths", batch=batch, batch_from="unpacked")
    k = n if select_len is None else _check_int(select_len, "select_len", minimum=1)
    sizes = np.full(batch, n, dtype=np.int64) if tree_sizes is None else tree_sizes
    values = TreeInputs(
        packed_mask=pack_tree_mask(mask),
        position_ids=tree_position_ids(mask, kv),
        context_lengths=tree_context_lengths(kv, n),
        last_token_ids=tree_last_token_ids(sizes, k),
    )
    io.upload_tree(values.packed_mask, values.position_ids, stream)
    io.upload_context_lengths(values.context_lengths, stream)
    io.upload_select_token_indices(values.last_token_ids, stream)
    return values



# -- helpers -----------------------------------------------------------------------------------


def _num_words(num_nodes: int) -> int:
    return -(-num_nodes // _BITS_PER_WORD)


def _check_int(value: Any, name: str, *, minimum: int) -> int:
    # bool is an int subclass; True as a size is always a mistake.
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ShapeError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ShapeError(f"{name}: expected an integer >= {minimum}, got {int(value)}")
    return int(value)


def _check_integer_dtype(array: np.ndarray, name: str) -> None:
    if not np.issubdtype(array.dtype, np.integer):
        raise ShapeError(f"{name}: expected an integer array, got dtype {array.dtype}")


def _as_tree_mask(unpacked: npt.ArrayLike, name: str) -> np.ndarray:
    array = np.asarray(unpacked)
    if array.dtype != np.bool_ and not np.issubdtype(array.dtype, np.integer):
        raise ShapeError(f"{name}: expected a bool or integer mask, got dtype {array.dtype}")
    if array.ndim != 3:
        raise ShapeError(
            f"{name}: expected a [B, N, N] mask, got shape {array.shape} (rank {array.ndim})"
        )
    if array.shape[1] != array.shape[2]:
        raise ShapeError(
            f"{name}: expected a square [B, N, N] mask (one row and one column per node), "
            f"got shape {array.shape}"
        )
    if array.shape[1] < 1:
        raise ShapeError(f"{name}: expected at least one node (N >= 1), got shape {array.shape}")
    mask: npt.NDArray[np.bool_] = array != 0
    return mask


def _as_lengths(
    values: npt.ArrayLike, name: str, *, batch: int | None = None, batch_from: str = ""
) -> np.ndarray:
    array = np.asarray(values)
    _check_integer_dtype(array, name)
    if array.ndim != 1:
        raise ShapeError(f"{name}: expected a [B] array, got shape {array.shape}")
    if batch is not None and array.shape[0] != batch:
        raise ShapeError(
            f"{name}: expected {batch} entries (the batch of {batch_from}), got {array.shape[0]}"
        )
    negative = np.flatnonzero(array < 0)
    if negative.size:
        b = int(negative[0])
        raise ShapeError(f"{name}: expected values >= 0, got {name}[{b}] = {int(array[b])}")
    return array.astype(np.int64)


def _to_int32(values: np.ndarray, what: str) -> np.ndarray:
    if values.size and int(values.max()) > _INT32_MAX:
        raise ShapeError(f"{what}: {int(values.max())} does not fit int32 (max {_INT32_MAX})")
    return values.astype(np.int32)
