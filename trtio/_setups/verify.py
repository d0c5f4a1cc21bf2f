"""Verify trees and accepted paths: what ``verify`` and ``accept`` check and lay out.

A verify tree is given as a parent list (shared by the batch, or one per sequence) or an unpacked mask;
:class:`VerifyTrees` checks it and lays it out once per distinct tree (a runtime's tree shape repeats).
:class:`AcceptedPaths` reads the paths a runtime accepts from the verified tree, checked node by node
against it, as the grid the KV commit takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import add, itemgetter
from typing import Any, NamedTuple

import numpy as np

from trtio._cache import BoundedCache
from trtio._contracts.ragged import PHASE_VERIFY, TreeLayout, pack_rows
from trtio._staging import constant
from trtio._state import MAX_PATH_MOVES, EngineState, path_grid
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio._trees import ancestor_mask, validate_tree_mask
from trtio.errors import ShapeError

__all__ = ["AcceptedPaths", "PlacedPaths", "VerifyTree", "VerifyTrees"]

_LISTS, _INTS = {list}, {int}
_LAST = itemgetter(-1)
_PYTHON_PATH_NODES = 512  # accepted paths of at most this many nodes in all are checked in Python (faster there)


def _accepted_rows(firsts: np.ndarray, grid: np.ndarray, full: bool) -> np.ndarray:
    """The verify step's output rows of accepted nodes ``grid`` ([b, longest], -1 past each path; ``full``: no
    path is shorter), each sequence's first row ``firsts`` ([b, 1]) added: node j of sequence i at row
    i * nodes + j, padding -1 (an array of its own)."""
    rows: np.ndarray = firsts + grid if full else grid + firsts * (grid >= 0)
    return rows


@dataclass(frozen=True)
class VerifyTree:
    """A checked verify tree, laid out for both contracts: packed rows, depths, parents, real rows."""

    nodes: int
    packed: np.ndarray  # uint32 [B, N, ceil(N/32)]
    depth: np.ndarray  # int64 [B, N]
    parents: np.ndarray  # int64 [B, N], -1 for the root and padding rows
    real: np.ndarray  # bool [B, N]
    select: np.ndarray  # int64 [B, N]: the batch contract's last_token_ids (every node)
    layout: TreeLayout  # the ragged contract's verify step, less what depends on the cached lengths
    parent_lists: list[list[int]]  # ``parents`` as Python lists (accept walks a few paths through them)

    @classmethod
    def of(cls, vis: np.ndarray) -> VerifyTree:
        b, n = vis.shape[0], vis.shape[1]
        real: np.ndarray = np.asarray(vis.any(axis=2))
        packed, depth, parents = pack_rows(vis, n), vis.sum(axis=2) - 1, _parents_of(vis)
        layout = TreeLayout.of(packed, depth, real, phase=PHASE_VERIFY, logits_rows=np.arange(b * n), parents=parents)
        return cls(n, packed, depth, parents, real, constant(np.broadcast_to(np.arange(n), (b, n))), layout,
                   parents.tolist())


def _parents_of(vis: np.ndarray) -> np.ndarray:
    """Each node's parent (its deepest other ancestor; -1 for roots and padding) from a tree mask [B, N, N]."""
    n = vis.shape[1]
    strict = vis & ~np.eye(n, dtype=bool)[None]
    idx = np.where(strict, np.arange(n)[None, None, :], -1)
    return np.asarray(idx.max(axis=2))


class VerifyTrees:
    """Verify trees seen, checked and laid out once each (see module docstring)."""

    def __init__(self) -> None:
        self._trees: BoundedCache[tuple[Any, ...], VerifyTree] = BoundedCache()
        # The last parent list given: b, a copy of it, its tree, and whether it is one list per sequence.
        self._last: tuple[int, list[Any], VerifyTree, bool] | None = None

    def get(self, tree: Any, b: int) -> VerifyTree:
        """``tree`` for ``b`` sequences: a parent list ([N] shared, or [b, N]; -1 for the root) or an
        unpacked mask [b, N, N]; a ShapeError names what is wrong with it."""
        last = self._last
        # A runtime's tree shape repeats: the same list of ints as the last one (anything else equal to an int
        # is not one: it is read as an array below, where a float is refused).
        if last is not None and type(tree) is list and last[0] == b and tree == last[1] and \
                set(map(type, chain.from_iterable(tree) if last[3] else tree)) == _INTS:
            return last[2]
        found = self._get(tree, b)
        if type(tree) is list:  # kept (a copy) where it holds plain ints only
            nested = bool(tree) and type(tree[0]) is list
            rows = [list(r) for r in tree] if nested else list(tree)
            if all(type(v) is int for v in ([v for r in rows for v in r] if nested else rows)):
                self._last = (b, rows, found, nested)
        return found

    def _get(self, tree: Any, b: int) -> VerifyTree:
        arr = np.asarray(tree)
        if arr.dtype.kind not in "iub":
            raise ShapeError(f"tree: expected a parent list or a [batch, N, N] mask, got dtype {arr.dtype}")
        key = (b, arr.shape, arr.dtype.str, arr.tobytes())
        found = self._trees.get(key)
        if found is None:
            found = self._trees.put(key, VerifyTree.of(_tree_mask(arr, b)))
        return found


def _tree_mask(arr: np.ndarray, b: int) -> np.ndarray:
    """The checked ancestor mask [b, N, N] of a parent list or mask: node 0 the root, padding rows last,
    every other node with a parent."""
    if arr.ndim == 1:
        vis = np.broadcast_to(ancestor_mask(arr), (b, arr.shape[0], arr.shape[0]))
    elif arr.ndim == 2 and arr.shape[0] == b and arr.dtype.kind in "iu":
        vis = np.stack([ancestor_mask(p) for p in arr])
    elif arr.ndim == 3 and arr.shape[0] == b:
        vis = arr != 0
    else:
        raise ShapeError(f"tree: expected a parent list [N] or [batch={b}, N], or a [batch={b}, N, N] mask, "
                         f"got shape {arr.shape}")
    validate_tree_mask(vis)
    real: np.ndarray = np.asarray(vis.any(axis=2))
    if not real[:, 0].all() or vis[:, 0, 1:].any():
        bi = int(np.flatnonzero(~real[:, 0] | vis[:, 0, 1:].any(axis=1))[0])
        raise ShapeError(f"tree: node 0 of sequence {bi} must be the root (it sees itself only)")
    gaps = real[:, 1:] & ~real[:, :-1]
    if gaps.any():
        bi, t = (int(v) for v in np.argwhere(gaps)[0])
        raise ShapeError(f"tree: sequence {bi} has a padding row before node {t + 1}; padding rows come last")
    orphans = real[:, 1:] & (vis[:, 1:, :].sum(axis=2) < 2)
    if orphans.any():
        bi, t = (int(v) for v in np.argwhere(orphans)[0])
        raise ShapeError(f"tree: node {t + 1} of sequence {bi} has no parent; only node 0 is a root")
    return np.ascontiguousarray(vis)


class PlacedPaths(NamedTuple):
    """Where accept() left the accepted paths on the device: the KV commit's rows (``moves``, int32 ``[batch,
    stride]``: ``[start, length, nodes padded with -1]``), read when the next work runs, and the verify step's rows
    per sequence (``nodes``)."""

    moves: Tensor
    stride: int
    nodes: int


class _PathTables:
    """A verify tree's accepted paths as table lookups, made once per tree: per parent list (sequences that share
    one share its tables), each node's root path (at most MAX_PATH_MOVES + 1 nodes; None for padding nodes and
    deeper ones), the KV commit's row of it (``[0, length, nodes padded with -1]``, ``2 + width`` ints: width the
    tree's longest root path) and per sequence its nodes' rows of the verify step's outputs (``seq * nodes + node``,
    -1 past the path). A batch of paths is then checked by comparing it with its last nodes' paths and laid out by
    indexing the tables with them: C loops and a few numpy calls, whatever the batch."""

    def __init__(self, parent_lists: list[list[int]], seqs: np.ndarray) -> None:
        by_list: dict[tuple[int, ...], int] = {}
        lists: list[list[list[int] | None]] = []
        which = []
        for parents in parent_lists:
            key = tuple(parents)
            found = by_list.get(key)
            if found is None:
                found = by_list[key] = len(lists)
                lists.append(_root_paths(parents))
            which.append(found)
        self.nodes = len(parent_lists[0]) if parent_lists else 0
        self.width = max((len(p) for paths in lists for p in paths if p is not None), default=1)
        table = np.full((len(lists), self.nodes, 2 + self.width), -1, np.int64)
        table[:, :, :2] = 0
        for i, paths in enumerate(lists):
            for c, p in enumerate(paths):
                if p is not None:
                    table[i, c, 1] = len(p)
                    table[i, c, 2:2 + len(p)] = p
        self.shared = len(lists) == 1
        # shared: one parent list's paths by node; else each sequence's
        self.paths: Any = lists[0] if self.shared else [lists[i] for i in which]
        # flat, sequence i's node c at row i * N + c: its commit row [2 + W] and its nodes' rows of the verify step's
        # outputs [W] (one lookup each, whatever the batch)
        self.rows = table[which].reshape(-1, 2 + self.width)
        nodes = table[which, :, 2:]
        firsts = seqs[:len(which)] * self.nodes
        self.accepted = np.where(nodes >= 0, firsts[:, None, None] + nodes, -1).reshape(-1, self.width)
        # per longest path n met, the table's first n columns, contiguous (ndarray.take is fast on a contiguous table
        # only): made when first met
        self._by_longest: BoundedCache[int, np.ndarray] = BoundedCache()  # at most MAX_PATH_MOVES + 1 widths
        self.firsts: list[int] = firsts.tolist()

    def lay_out(self, paths: list[list[int]],
                b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[int]]] | None:
        """``b`` paths (lists of ints) as (the commit's rows [b, 2 + width], their starts 0; lengths [b]; the
        accepted nodes' rows [b, longest], -1 past each path; the paths as the tables hold them: equal to
        ``paths``, lists no caller writes), or None where a path is not the root path of a node."""
        try:  # an empty path, or a last node past the tree's, raises
            ends = [*map(_LAST, paths)]
            want = [*map(self.paths.__getitem__, ends)] if self.shared else \
                [*map(list.__getitem__, self.paths, ends)]
        except IndexError:
            return None
        if want != paths:  # (a negative last node looks up a node counted from the end, whose path ends elsewhere)
            return None
        at = np.fromiter(map(add, self.firsts, ends), np.intp, b)
        moves = self.rows.take(at, 0)  # (ndarray.take: an array of its own, faster than indexing with `at`)
        longest = max(map(len, paths))
        table = self._by_longest.get(longest)
        if table is None:
            table = self._by_longest.put(longest, np.ascontiguousarray(self.accepted[:, :longest]))
        return moves, moves[:, 1], table.take(at, 0), want


def _root_paths(parents: list[int]) -> list[list[int] | None]:
    """Each node's path from the root (at most MAX_PATH_MOVES + 1 nodes; None for padding nodes and deeper ones)."""
    out: list[list[int] | None] = [[0]] + [None] * (len(parents) - 1)
    for c in range(1, len(parents)):
        up = [c]  # c and its ancestors, up to the root (a padding node's parent is -1)
        while up[-1] > 0 and len(up) <= MAX_PATH_MOVES + 1:
            up.append(parents[up[-1]])
        if up[-1] == 0 and len(up) <= MAX_PATH_MOVES + 1:
            out[c] = up[::-1]
    return out


class AcceptedPaths:
    """Reads accepted paths against a verified tree (see module docstring)."""

    def __init__(self, max_batch: int) -> None:
        self._path_ids = np.arange(MAX_PATH_MOVES + 1)
        self._batch_rows = np.arange(max_batch)[:, None]
        self._first_rows: BoundedCache[tuple[int, int], np.ndarray] = BoundedCache()
        # Per verify tree (by id, kept beside it): its path tables and each sequence's first row.
        self._paths: BoundedCache[int, tuple[VerifyTree, _PathTables, np.ndarray]] = BoundedCache()
        # The last paths walked: their tree, a copy of them, the commit rows (starts rewritten per call), the
        # lengths, the accepted rows, and the tree's path tables and first rows (:meth:`_tables`).
        self._last: tuple[VerifyTree, list[list[int]], np.ndarray, np.ndarray, np.ndarray, _PathTables,
                          np.ndarray] | None = None
        # The last paths' commit rows as a constant, for a commit that reads the starts on the device (None: not
        # made yet for them).
        self._fixed: np.ndarray | None = None

    def read(self, paths: Sequence[Sequence[int]] | np.ndarray, b: int,
             tree: VerifyTree) -> tuple[np.ndarray, np.ndarray]:
        """``paths`` as (grid [b, longest] padded with -1, lengths); a ShapeError names the first path that
        does not start at the root or leaves the verified tree. (A runtime's lists of ints on the tree take
        :meth:`walk`; this is for anything else: the general checks name what is wrong.)"""
        grid, acc = path_grid(paths, b)
        if grid.shape[1] > MAX_PATH_MOVES + 1:
            i = int(np.argmax(acc))
            raise ShapeError(f"paths[{i}]: {int(acc[i])} nodes, more than the {MAX_PATH_MOVES + 1} an accepted "
                             f"path may have (depth {MAX_PATH_MOVES})")
        bad = self._bad(grid, acc, tree)
        if bad is not None:
            i, t = bad
            path = grid[i, :acc[i]].tolist()
            if t == 0:
                raise ShapeError(f"paths[{i}] = {path}: a path starts at the root, node 0")
            raise ShapeError(f"paths[{i}] = {path}: node {path[t]} is not a child of node {path[t - 1]} in "
                             f"the verified tree")
        return grid, acc

    def walk(self, paths: Any, b: int, tree: VerifyTree,
             starts: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """What a runtime passes, ``b`` lists of plain ints each a root-to-node path of the verified ``tree`` (at
        most MAX_PATH_MOVES + 1 nodes), checked and laid out for the KV commit and the catch-up: the commit's rows
        ([b, 2 + the tree's longest root path]: the sequence's cached length ``starts[i]``, the path's length, its
        nodes padded with -1; one width per tree, so the commit's rows keep their shape whatever is accepted), the
        lengths ([b]) and the accepted nodes' rows of the verify step's outputs ([b, longest], -1 past each path).
        None for anything else, which :meth:`read` then refuses or reads.

        A node has one path from the root, so a path is checked as a whole against its last node's, and laid out
        by table lookups made once per tree (:class:`_PathTables`): no Python work per path. The same paths as the
        last call's, on the same tree, are laid out once: only the commit rows' starts are written, and from their
        first repeat on the lengths and rows are read-only (a catch-up's step values, kept while the paths repeat).
        ``starts`` None: the commit reads the cached lengths on the device (the rows' starts are 0), and from the
        first repeat on the commit rows too are one read-only array (a :func:`~trtio._staging.constant`: its upload
        is skipped while they repeat)."""
        if type(paths) is not list or len(paths) != b or set(map(type, paths)) != _LISTS or \
                set(map(type, chain.from_iterable(paths))) != _INTS:
            return None  # not b lists of ints only (bools and floats are no nodes: read() names them)
        last = self._last
        if last is not None and last[0] is tree:
            if paths == last[1]:
                moves, acc, rows = last[2], last[3], last[4]
                if acc.flags.writeable:  # the paths repeat: their layout is kept, read-only from here on
                    acc.flags.writeable = rows.flags.writeable = False
                if starts is None:
                    fixed = self._fixed
                    if fixed is None:
                        moves[:, 0] = 0
                        fixed = self._fixed = constant(moves)
                    return fixed, acc, rows
                moves[:, 0] = starts
                return moves, acc, rows
            tables, firsts = last[5], last[6]
        else:
            tables, firsts = self._tables(tree, b)
        laid = tables.lay_out(paths, b)
        if laid is None:
            return None
        moves, acc, rows, held = laid
        if starts is not None:
            moves[:, 0] = starts
        self._last = (tree, held, moves, acc, rows, tables, firsts)  # (held: the tables' lists, equal to paths)
        self._fixed = None
        return moves, acc, rows

    def _tables(self, tree: VerifyTree, b: int) -> tuple[_PathTables, np.ndarray]:
        """The path tables of ``tree`` (:class:`_PathTables`), made once per tree, with each sequence's first row
        of the verify step (``[b, 1]``)."""
        found = self._paths.get(id(tree))
        if found is not None and found[0] is tree:
            return found[1], found[2]
        tables = _PathTables(tree.parent_lists, self._batch_rows[:b, 0])
        firsts = self._firsts(b, tree.nodes)
        self._paths.put(id(tree), (tree, tables, firsts))
        return tables, firsts

    def commit(self, paths: Any, b: int, tree: VerifyTree, state: EngineState, lengths: np.ndarray,
               stream: Stream, *, staged: Tensor | None = None) -> tuple[np.ndarray, np.ndarray, PlacedPaths]:
        """Check ``paths`` against the verified ``tree`` (a ShapeError before anything is enqueued), then enqueue
        the KV commit of ``state`` (whose cached lengths of the ``b`` sequences are ``lengths``); returns the
        path lengths, the accepted nodes' rows of the verify step's outputs ([b, longest], -1 past each path) and
        where the commit's rows lie on the device (:class:`PlacedPaths`: a catch-up lays itself out from them). A
        runtime's lists of ints take one walk; anything else is read and checked by :meth:`read`. ``staged``:
        ``lengths`` as the device holds them (int32 [b], staged by the verify step), which a walked commit reads
        there (its rows then repeat with the paths: no upload while they do)."""
        walked = self.walk(paths, b, tree, None if staged is not None else lengths)
        if walked is not None:
            moves, acc, rows = walked
            placed = state.commit_rows(moves, stream, starts=staged)
            return acc, rows, PlacedPaths(placed, moves.shape[1], tree.nodes)
        grid, acc = self.read(paths, b, tree)
        placed, stride = state.commit_grid(lengths, grid, acc, stream)
        rows = _accepted_rows(self._firsts(b, tree.nodes), grid, int(acc.min()) == grid.shape[1])
        return acc, rows, PlacedPaths(placed, stride, tree.nodes)

    def _firsts(self, b: int, n: int) -> np.ndarray:
        """``[b, 1]``: each sequence's first row of a verify step of ``n`` nodes."""
        found = self._first_rows.get((b, n))
        if found is None:
            found = self._first_rows.put((b, n), self._batch_rows[:b] * n)
        return found

    def _bad(self, grid: np.ndarray, acc: np.ndarray, tree: VerifyTree) -> tuple[int, int] | None:
        """The first wrong node of the accepted paths (``grid`` [B, L], lengths ``acc``) in the verified
        ``tree``: (sequence, 0) for a path that does not start at the root (checked for every sequence
        first), else (sequence, t) for node t that is not a child of node t - 1; None when all follow it.
        A few dozen nodes (a runtime's paths) are walked in Python, more with numpy."""
        n = tree.nodes
        if grid.size <= _PYTHON_PATH_NODES:
            rows, lens = grid.tolist(), acc.tolist()
            for i, row in enumerate(rows):
                if row[0] != 0:
                    return i, 0
            for i, row in enumerate(rows):
                parents, prev = tree.parent_lists[i], 0
                for t in range(1, lens[i]):
                    node = row[t]
                    if not 0 < node < n or parents[node] != prev:
                        return i, t
                    prev = node
            return None
        roots = np.flatnonzero(grid[:, 0] != 0)
        if roots.size:
            return int(roots[0]), 0
        child, parent = grid[:, 1:], grid[:, :-1]
        ok = (child > 0) & (child < n)
        ok &= tree.parents[self._batch_rows[:grid.shape[0]], np.where(ok, child, 0)] == parent
        ok |= self._path_ids[1:grid.shape[1]] >= acc[:, None]  # past a path's end
        if ok.all():
            return None
        i, t = (int(v) for v in np.argwhere(~ok)[0])
        return i, t + 1
