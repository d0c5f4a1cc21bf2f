"""accept and draft_accept: what they lay out once and reuse stays right when the paths, the tree or the
lengths change.

:class:`~trtio._setups.verify.AcceptedPaths` checks a runtime's lists of ints as whole root paths and keeps the
last paths' layout; a catch-up keeps the last accept lengths' layout. These tests hold both to the general
checks (:meth:`AcceptedPaths.read`) and to what a round commits. A host input's staging slot is reused while
its copy has run.
"""

from __future__ import annotations

import numpy as np
import pytest
from _configs import bundle, tiny_bundle

from trtio import ShapeError, Stream
from trtio._setups import create_for_spec_decode
from trtio._setups.verify import AcceptedPaths, VerifyTrees
from trtio._state import MAX_PATH_MOVES
from trtio.testing import ReferenceEngine, ToyWeights, toy_embedding
from trtio.testing.toy_runtime import embed_batch


def _random_tree(rng: np.random.Generator, n: int) -> list[int]:
    """A parent list of ``n`` nodes: node 0 the root, every other node's parent an earlier node."""
    return [-1] + [int(rng.integers(0, i)) for i in range(1, n)]


def _random_path(rng: np.random.Generator, parents: list[int]) -> list[int]:
    """A node list: a node's root path (most often), or one with a node changed, dropped or added."""
    node = int(rng.integers(0, len(parents)))
    path = [node]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    path.reverse()
    kind = rng.integers(0, 6)
    if kind == 1 and len(path) > 1:
        path[int(rng.integers(1, len(path)))] = int(rng.integers(-1, len(parents) + 2))
    elif kind == 2 and len(path) > 1:
        del path[int(rng.integers(0, len(path)))]
    elif kind == 3:
        path.append(int(rng.integers(0, len(parents))))
    elif kind == 4:
        path = []
    return path


def _read_or_none(paths: AcceptedPaths, given: list[list[int]], b: int, tree: object
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        return paths.read(given, b, tree)  # type: ignore[arg-type]
    except ShapeError:
        return None


def _root(parents: list[int], c: int) -> list[int]:
    """Node ``c``'s path from the root (nodes of a padding chain end at -1)."""
    up = [c]
    while up[-1] > 0:
        up.append(parents[up[-1]])
    return up[::-1]


def test_walk_takes_exactly_the_paths_the_general_checks_take() -> None:
    """On random trees (shared, and one per sequence) and node lists, :meth:`walk` lays out every list of ints
    the general checks accept, as they read it, and refuses (None) every one they refuse."""
    rng = np.random.default_rng(0)
    trees = VerifyTrees()
    taken = refused = 0
    for trial in range(300):
        b, n = int(rng.integers(1, 5)), int(rng.integers(1, 12))
        shared = trial % 2 == 0
        lists = [_random_tree(rng, n)] if shared else [_random_tree(rng, n) for _ in range(b)]
        tree = trees.get(lists[0] if shared else lists, b)
        paths = AcceptedPaths(8)
        given = [_random_path(rng, lists[0 if shared else i]) for i in range(b)]
        starts = rng.integers(0, 100, b)
        walked = paths.walk(given, b, tree, starts)
        read = _read_or_none(paths, given, b, tree)
        if read is None:
            assert walked is None, f"walk took {given} on tree {lists}, which the general checks refuse"
            refused += 1
            continue
        assert walked is not None, f"walk refused {given} on tree {lists}, which the general checks take"
        taken += 1
        grid, acc = read
        moves, lens, rows = walked
        np.testing.assert_array_equal(lens, acc)
        np.testing.assert_array_equal(moves[:, 0], starts)
        np.testing.assert_array_equal(moves[:, 1], acc)
        longest = grid.shape[1]  # the commit's rows are as wide as the tree's longest root path, whatever is accepted
        deepest = max(len(_root(p, c)) for p in lists for c in range(len(p)) if len(_root(p, c)) <= MAX_PATH_MOVES + 1)
        assert moves.shape[1] == 2 + deepest
        np.testing.assert_array_equal(moves[:, 2:2 + longest], grid)
        assert (moves[:, 2 + longest:] == -1).all()
        np.testing.assert_array_equal(rows, np.where(grid >= 0, np.arange(b)[:, None] * n + grid, -1))
    assert taken > 50 and refused > 50, "the trial mixes paths on and off the trees"


def test_walk_refuses_a_path_past_the_deepest_an_accept_may_commit() -> None:
    """A chain deeper than MAX_PATH_MOVES: its root path of MAX_PATH_MOVES + 1 nodes is laid out, one more is
    left to the general checks (which name it)."""
    n = MAX_PATH_MOVES + 3
    tree = VerifyTrees().get(list(range(-1, n - 1)), 1)
    paths = AcceptedPaths(1)
    assert paths.walk([list(range(MAX_PATH_MOVES + 1))], 1, tree, np.zeros(1, np.int64)) is not None
    assert paths.walk([list(range(MAX_PATH_MOVES + 2))], 1, tree, np.zeros(1, np.int64)) is None


def test_the_last_paths_again_take_the_new_starts_and_are_checked_again_on_another_tree() -> None:
    paths = AcceptedPaths(2)
    trees = VerifyTrees()
    first = trees.get([-1, 0, 1, 1], 2)
    given = [[0, 1, 3], [0, 1]]
    moves, acc, rows = paths.walk(given, 2, first, np.array([5, 9]))  # type: ignore[misc]
    assert moves.tolist() == [[5, 3, 0, 1, 3], [9, 2, 0, 1, -1]]
    again = paths.walk([list(p) for p in given], 2, first, np.array([8, 11]))
    assert again is not None
    assert again[0].tolist() == [[8, 3, 0, 1, 3], [11, 2, 0, 1, -1]]
    assert again[1].tolist() == acc.tolist() == [3, 2] and again[2].tolist() == rows.tolist() == [[0, 1, 3], [4, 5, -1]]
    # The same lists on a tree where node 3 is no child of node 1: refused, not taken from the last call.
    other = trees.get([-1, 0, 1, 0], 2)
    assert paths.walk(given, 2, other, np.array([8, 11])) is None
    # Equal values that are no plain ints (True == 1) are left to the general checks, which refuse them.
    assert paths.walk([[0, True, 3], [0, 1]], 2, first, np.array([8, 11])) is None
    assert paths.walk([[0, 1.0, 3], [0, 1]], 2, first, np.array([8, 11])) is None
    # The caller's lists changed in place since: read as they are now.
    given[0][1] = 2  # node 3's parent is node 1
    assert paths.walk(given, 2, first, np.array([8, 11])) is None
    given[0][1:] = [1, 2]
    walked = paths.walk(given, 2, first, np.array([8, 11]))
    assert walked is not None and walked[0].tolist() == [[8, 3, 0, 1, 2], [11, 2, 0, 1, -1]]


def test_paths_that_change_are_laid_out_afresh_and_paths_that_repeat_are_kept_read_only() -> None:
    """Paths new since the last call get arrays of their own, left writable (kept by no one); the same paths
    again return the same lengths and rows, read-only from then on (a catch-up keeps its layout by them), and
    the next new paths leave those as they were."""
    paths = AcceptedPaths(2)
    tree = VerifyTrees().get([-1, 0, 1, 1], 2)
    first = paths.walk([[0, 1, 3], [0, 1]], 2, tree, np.array([5, 9]))
    assert first is not None and first[1].flags.writeable and first[2].flags.writeable
    again = paths.walk([[0, 1, 3], [0, 1]], 2, tree, np.array([6, 9]))
    assert again is not None and again[1] is first[1] and again[2] is first[2]
    assert not again[1].flags.writeable and not again[2].flags.writeable
    other = paths.walk([[0, 1], [0, 1, 2]], 2, tree, np.array([7, 9]))
    assert other is not None and other[1] is not again[1] and other[1].flags.writeable
    assert other[1].tolist() == [2, 3] and other[2].tolist() == [[0, 1, -1], [4, 5, 6]]
    assert again[1].tolist() == [3, 2] and again[2].tolist() == [[0, 1, 3], [4, 5, -1]]


def _spec(device: str = "host"):  # type: ignore[no-untyped-def]
    b = bundle(draft_vocab=512, verify_size=6, max_verify=8, max_proposal=8, top_k=2, step=3)
    bw = ToyWeights.generate(b.base, 0)
    dw = ToyWeights.generate_draft(b.draft, bw, 0)
    base = ReferenceEngine.from_config(b.base, weights=bw, device=device)
    draft = ReferenceEngine.from_config(b.draft, weights=dw, device=device)
    return create_for_spec_decode(base, draft, b)


def _padded(paths: list[list[int]]) -> np.ndarray:
    """``paths`` as an int array padded with -1 (read by the general checks, never kept)."""
    out = np.full((len(paths), max(map(len, paths))), -1, np.int64)
    for i, p in enumerate(paths):
        out[i, :len(p)] = p
    return out


@pytest.mark.parametrize("repeat", [False, True])
def test_rounds_of_the_same_paths_commit_what_paths_read_afresh_commit(repeat: bool) -> None:
    """Rounds accepting the same paths (the same list objects, or equal new ones), with other paths in between
    (other accept lengths of the same width among them), on two trees: the verify and catch-up logits, the
    lengths and both caches' committed entries equal a setup given the paths as padded arrays (read afresh
    every round, nothing kept)."""
    E = toy_embedding(512, 64, 0)
    emb, lens = embed_batch(E, [[1, 2, 3, 4], [5, 6, 7]], np.float16)
    rng = np.random.default_rng(2)
    trees = [[-1, 0, 0, 1, 3], [-1, 0, 1, 1, 3]]
    same = [[0, 1, 3], [0, 1]]
    rounds = [(0, same), (0, [[0], [0, 1, 3, 4]]), (0, same), (0, [[0, 2], [0, 1, 3]]), (1, same), (1, same),
              (0, same)]
    inputs = [(E[rng.integers(0, 512, (2, 5))].astype(np.float16), E[rng.integers(0, 512, (2, 4))].astype(np.float16))
              for _ in rounds]
    kept, fresh = _spec(), _spec()
    results: list[list[np.ndarray]] = [[], []]
    for sd, out in zip((kept, fresh), results):
        sd.base_prefill(emb, lens)
        sd.draft_prefill(emb, lens)
        for (t, paths), (x, catch_up) in zip(rounds, inputs):
            out.append(sd.verify(x, trees[t]).to_numpy().copy())
            acc = [len(p) for p in paths]
            if sd is kept:
                sd.accept(paths if repeat else [list(p) for p in paths])
                out.append(sd.draft_accept(catch_up[:, :max(acc)], acc).to_numpy().copy())
            else:
                sd.accept(_padded(paths))
                out.append(sd.draft_accept(catch_up[:, :max(acc)], np.array(acc)).to_numpy().copy())
            out.append(sd.base_lengths.copy())
            out.append(sd.draft_lengths.copy())
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    for state in ("base", "draft"):  # the committed entries of every cache ([batch, heads, capacity, head_dim])
        mine, theirs = getattr(kept, state).state, getattr(fresh, state).state
        committed = mine.lengths[:2].tolist()
        assert committed == theirs.lengths[:2].tolist()
        for name, t in mine.tensors.items():
            ours, ref = t.to_numpy(), theirs.tensors[name].to_numpy()
            assert ours.ndim == 4, name
            for i, m in enumerate(committed):
                np.testing.assert_array_equal(ours[i, :, :m], ref[i, :, :m], err_msg=f"{state} {name}")
    kept.close()
    fresh.close()


@pytest.mark.parametrize("contract", ["ragged", "batch"])
def test_rounds_of_the_same_paths_commit_at_the_starts_verify_staged_without_uploading_them(contract: str) -> None:
    """Accept's KV commit reads each sequence's start from the cached lengths the verify step staged, so paths
    that repeat while the lengths grow are not uploaded again (one device operation per accept) and still
    commit what paths read afresh commit (their rows carrying the starts): equal logits, lengths and pools."""
    b = tiny_bundle(contract)
    E = toy_embedding(32, 16, 0)
    emb, lens = embed_batch(E, [[1, 2, 3, 4], [5, 6, 7]], np.float16)
    rng = np.random.default_rng(5)
    trees = [[-1, 0, 0, 1], [-1, 0, 1, 1]]
    same = [[0, 1, 3], [0, 1]]
    other = [[0, 2], [0, 1, 3]]
    rounds = [(0, same), (0, same), (0, same), (0, other), (0, other), (1, same), (1, same), (1, same), (0, same)]
    inputs = [(E[rng.integers(0, 32, (2, 4))].astype(np.float16), E[rng.integers(0, 32, (2, 3))].astype(np.float16))
              for _ in rounds]
    bw = ToyWeights.generate(b.base, 0)
    dw = ToyWeights.generate_draft(b.draft, bw, 0)
    kept, fresh = (create_for_spec_decode(ReferenceEngine.from_config(b.base, weights=bw),
                                          ReferenceEngine.from_config(b.draft, weights=dw), b) for _ in range(2))
    results: list[list[np.ndarray]] = [[], []]
    for sd, out in zip((kept, fresh), results):
        sd.base.state.reset(clear=True)  # pools compared whole below: no bytes left from before
        sd.base_prefill(emb, lens)
        sd.draft_prefill(emb, lens)
        moves = sd.base.state._moves
        for i, ((t, paths), (x, catch_up)) in enumerate(zip(rounds, inputs)):
            out.append(sd.verify(x, trees[t]).to_numpy().copy())
            acc = [len(p) for p in paths]
            uploads = moves.uploads
            sd.accept(paths if sd is kept else _padded(paths))
            if sd is kept and i in (2, 7):  # the same paths a third time on one tree: their rows are on the device
                assert moves.uploads == uploads, f"round {i}: the repeated paths were uploaded again"
            else:
                assert moves.uploads == uploads + 1, f"round {i}"
            out.append(sd.draft_accept(catch_up[:, :max(acc)], acc).to_numpy().copy())
            out.append(sd.base_lengths.copy())
    assert kept.base_lengths.tolist() != [4, 3] and kept.base_lengths.tolist() == fresh.base_lengths.tolist()
    for a, c in zip(*results):
        np.testing.assert_array_equal(a, c)
    for name, t in kept.base.state.tensors.items():
        np.testing.assert_array_equal(t.to_numpy(), fresh.base.state.tensors[name].to_numpy(), err_msg=name)
    kept.close()
    fresh.close()


def test_a_commit_reads_the_starts_on_the_device_where_given(backend) -> None:  # type: ignore[no-untyped-def]
    """``starts`` given: each sequence's start is read from that device tensor, the rows' first ints ignored."""
    from trtio import Location, Tensor
    from trtio._ops import KVCommit, KVLayout

    rng = np.random.default_rng(4)
    b, heads, dim, cap = 3, 2, 8, 32
    with Stream.create(backend) as s:
        cache = Tensor.empty((b, heads, cap, dim), "float16", Location.DEVICE, backend=backend, name="cache")
        table = Tensor.empty((1,), "int64", Location.DEVICE, backend=backend, name="table")
        moves = Tensor.empty((b, 6), "int32", Location.DEVICE, backend=backend, name="moves")
        starts = Tensor.empty((b,), "int32", Location.DEVICE, backend=backend, name="starts")
        try:
            table.copy_from(np.array([cache.data_ptr], np.int64), s)
            value = rng.standard_normal(cache.shape).astype(np.float16)
            cache.copy_from(value, s)
            paths, at = [[0, 2, 3], [0, 1, 3, 4], [0, 3]], [4, 10, 0]
            rows = np.full((b, 6), -1, np.int32)
            for i, path in enumerate(paths):
                rows[i, :2 + len(path)] = [20 + i, len(path), *path]  # starts no commit may read
            moves.copy_from(rows, s)
            starts.copy_from(np.array(at, np.int32), s)
            KVCommit([cache], table, KVLayout(paged=False, heads=heads, capacity=cap, entry_bytes=2 * dim)).run(
                moves, b, 6, s, starts=starts)
            want = value.copy()
            for i, (path, start) in enumerate(zip(paths, at)):
                for j, node in enumerate(path):
                    want[i, :, start + j] = want[i, :, start + node]
            np.testing.assert_array_equal(cache.to_numpy(s), want)
        finally:
            for t in (cache, table, moves, starts):
                t.close()
