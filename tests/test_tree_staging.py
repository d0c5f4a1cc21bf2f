"""How a speculative round's tree steps (verify, the draft's catch-up) stage their inputs on the ragged
contract: the base binds its own tree inputs, so a verify tree that repeats is staged once however many
draft steps ran since."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import trtio
from trtio import Location, Tensor, names
from trtio._contracts.ragged import pack_rows
from trtio._cuda.backend import Backend
from trtio.edgellm import EngineDir
from trtio.testing import ReferenceEngine, ToyWeights, toy_embedding
from trtio.testing.toy_engines import ToyEngines, default_engines_dir
from trtio.testing.toy_runtime import embed_batch

E = toy_embedding(512, 64)
TOP_K, STEPS = 2, 3
TREE = [-1, 0, 0, 1, 1, 2]  # as wide as the draft tree (TOP_K * STEPS nodes): the steps share their query offsets
PATHS = [[0, 1, 3], [0, 2], [0, 2, 5], [0]]


def _setup(contract: str = "ragged") -> trtio.SpecDecodeSetup:
    if contract == "ragged":
        bundle = EngineDir.open(default_engines_dir() / "toy-eagle3-ragged").deployment(TOP_K, STEPS, len(TREE))
        bw = ToyWeights.generate(bundle.base, 0)
        dw = ToyWeights.generate_draft(bundle.draft, bw, 0)
    else:
        toys = ToyEngines.load()
        spec = dataclasses.replace(toys.eagle.spec, drafting_top_k=TOP_K, drafting_step=STEPS, verify_size=len(TREE))
        bundle = dataclasses.replace(toys.eagle, spec=spec).validate()
        bw, dw = toys.weights("toy-eagle/base"), toys.weights("toy-eagle/draft")
    return trtio.create_for_spec_decode(ReferenceEngine.from_config(bundle.base, weights=bw, device="host"),
                                        ReferenceEngine.from_config(bundle.draft, weights=dw, device="host"), bundle,
                                        graphs=True)


def _embeds(sd: trtio.SpecDecodeSetup, shape: tuple[int, int], rng: np.random.Generator) -> Tensor:
    t = Tensor.empty(shape + (E.shape[1],), "float16", Location.DEVICE, backend=sd.io.inputs_embeds.backend)
    t.copy_from(E[rng.integers(0, 512, shape)].astype(np.float16))
    return t


def _prefilled(sd: trtio.SpecDecodeSetup) -> list[np.ndarray]:
    """Prefill base and draft with four prompts; returns each proposal level's parents (a round of STEPS levels
    of TOP_K nodes, each a child of the previous level's)."""
    emb, lens = embed_batch(E, [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11], [12]], np.float16)
    sd.base_prefill(emb, lens)
    sd.draft_prefill(emb, lens)
    return [np.full(TOP_K, -1)] + [lv * TOP_K + np.arange(TOP_K) // 2 for lv in range(STEPS - 1)]


def _visible(parents: list[int]) -> np.ndarray:
    """[N, N]: node t sees itself and its ancestors."""
    n = len(parents)
    out = np.zeros((n, n), bool)
    for t in range(n):
        at = t
        while at >= 0:
            out[t, at] = True
            at = parents[at]
    return out


def test_a_repeated_verify_tree_stays_in_the_base_inputs_across_the_draft_steps(host: Backend) -> None:
    """The draft's levels and catch-up rewrite the shared tree inputs on the device every round; the base's
    own ones keep the verify tree, so a steady verify stages nothing (its graph alone) and its engine reads the
    tree's mask, parents, depths, lengths and logits rows."""
    sd = _setup()
    rng = np.random.default_rng(0)
    be = sd.io.inputs_embeds.backend
    try:
        parents = _prefilled(sd)  # 4 sequences
        b = 4
        ops = []
        for _ in range(4):
            for p in parents:
                x = _embeds(sd, (b, TOP_K), rng)
                sd.draft_propose(x, parents=p)
                x.close()
            tree = sd.io.inputs_embeds.reshape((b, len(TREE), E.shape[1]))  # written in place, like a runtime
            tree.copy_from(E[rng.integers(0, 512, (b, len(TREE)))].astype(np.float16))
            before = be.op_count
            sd.verify(tree, TREE)
            ops.append(be.op_count - before)
            tm = sd.base.tensor_map
            n = len(TREE)
            want_mask = pack_rows(np.broadcast_to(_visible(TREE), (b, n, n)), n).view(np.int32).reshape(b * n, -1)
            np.testing.assert_array_equal(tm[names.kPackedAttentionMask].to_numpy(), want_mask)
            np.testing.assert_array_equal(tm[names.kTreeParentIds].to_numpy(), np.tile(TREE, b))
            np.testing.assert_array_equal(tm[names.kTreeDepths].to_numpy(), np.tile(_visible(TREE).sum(1) - 1, b))
            assert tm[names.kQueryLengths].to_numpy().tolist() == [n] * b
            assert tm[names.kLogitsIndices].to_numpy().tolist() == list(range(b * n))
            # The draft binds the shared inputs, which its levels rewrite: not the base's.
            assert sd.draft.tensor_map[names.kPackedAttentionMask].data_ptr != tm[names.kPackedAttentionMask].data_ptr
            sd.accept(PATHS)
            catch_up = _embeds(sd, (b, 3), rng)
            sd.draft_accept(catch_up, np.array([len(p) for p in PATHS]))
            catch_up.close()
        # The first verify stages its tree, the second captures its graph; from then on the graph alone.
        assert ops[2:] == [1, 1]
    finally:
        sd.close()


def test_a_catch_up_stages_its_offsets_with_its_tree_and_reads_the_rounds_cached_lengths(host: Backend) -> None:
    """The catch-up writes its query offsets with its tree layout's constants into inputs of its own (the levels
    keep theirs), and stages the draft's cached lengths as the round's levels did (the block holds them): its
    engine reads offsets of its own width and the lengths the draft had cached before it, round after round."""
    sd = _setup()
    rng = np.random.default_rng(1)
    try:
        parents = _prefilled(sd)  # 4 sequences
        b, a = 4, 3
        tm, cu = sd.draft.tensor_map, sd._catch_up_map  # the draft's maps: its levels', its catch-up's
        for r in range(4):
            for p in parents:
                x = _embeds(sd, (b, TOP_K), rng)
                sd.draft_propose(x, parents=p)
                x.close()
            assert tm[names.kQueryStartOffsets].to_numpy().tolist() == list(range(0, (b + 1) * TOP_K * STEPS,
                                                                                   TOP_K * STEPS))
            tree = _embeds(sd, (b, len(TREE)), rng)
            sd.verify(tree, TREE)
            tree.close()
            paths = PATHS if r % 2 else PATHS[::-1]
            sd.accept(paths)
            cached = sd.draft_lengths.tolist()
            catch_up = _embeds(sd, (b, a), rng)
            sd.draft_accept(catch_up, np.array([len(p) for p in paths]))
            catch_up.close()
            assert cu[names.kQueryStartOffsets].to_numpy().tolist() == list(range(0, (b + 1) * a, a)), r
            assert cu[names.kPastLengths].to_numpy().tolist() == cached, r
            assert sd.draft_lengths.tolist() == [c + len(p) for c, p in zip(cached, paths)]
    finally:
        sd.close()


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_the_catch_ups_row_lists_are_its_own_and_staged_when_its_paths_change(host: Backend,
                                                                              contract: str) -> None:
    """The catch-up gathers the accepted nodes' rows through row lists only it writes (the levels rewrite the
    shared ones on the device): each catch-up finds the rows of its own paths there, also when paths of the
    same lengths alternate, and a catch-up whose paths and lengths repeat stages nothing of them (on the
    batch contract, whose tree constants also stay: nothing at all, its graph alone)."""
    sd = _setup(contract)
    rng = np.random.default_rng(2)
    be = sd.io.inputs_embeds.backend
    step = sd.io.step
    assert step is not None
    other = [[0, 2, 5], [0, 1], [0, 1, 4], [0]]  # PATHS' lengths, other nodes
    try:
        parents = _prefilled(sd)  # 4 sequences
        b, a, n = 4, 3, len(TREE)
        scratch = sd.bundle.effective_max_draft_proposal_size()
        x = _embeds(sd, (b, TOP_K), rng)
        tree = _embeds(sd, (b, n), rng)
        ops = []
        for paths in (PATHS, other, PATHS, other, other, other, other):
            for p in parents:
                sd.draft_propose(x, parents=p)
            sd.verify(tree, TREE)
            sd.accept(paths)
            catch_up = sd.io.inputs_embeds.reshape((b, a, E.shape[1]))  # written in place, like a runtime
            catch_up.copy_from(E[rng.integers(0, 512, (b, a))].astype(np.float16))
            before = be.op_count
            sd.draft_accept(catch_up, np.array([len(p) for p in paths]))
            ops.append(be.op_count - before)
            want_src = np.array([[i * n + v for v in p] + [-1] * (a - len(p)) for i, p in enumerate(paths)])
            want_dst = np.array([[i * scratch + j if j < len(p) else -1 for j in range(a)]
                                 for i, p in enumerate(paths)])
            np.testing.assert_array_equal(step.tensors["catch_up_src"].to_numpy()[:b * a], want_src.reshape(-1))
            np.testing.assert_array_equal(step.tensors["catch_up_dst"].to_numpy()[:b * a], want_dst.reshape(-1))
        x.close()
        tree.close()
        # Paths that repeat are laid out read-only from their first repeat, and staged as such once more: from the
        # second repeat on, the graph alone (the ragged catch-up's tree constants stay in inputs of its own, which
        # its levels never rewrite; the batch contract's stay too).
        assert ops[-2:] == [1, 1]
    finally:
        sd.close()


def test_the_catch_up_plan_binds_its_own_tree_inputs_and_a_steady_one_uploads_none_of_them(
        host: Backend) -> None:
    """The draft's proposal plan binds the shared tree inputs (its levels rewrite them on the device), its catch-up
    plan step-block inputs of its own, every other name alike; a catch-up uploads none of the tree inputs, shared or
    its own, whatever the accept lengths: from the second round on (the block holds its lengths and offsets), it
    uploads nothing (the device lays its tree and rows' lists out from the accepted paths)."""
    sd = _setup()
    rng = np.random.default_rng(3)
    step = sd.io.step
    assert step is not None
    tm, cu = sd.draft.tensor_map, sd._catch_up_map
    own = {names.kQueryStartOffsets: "query_start_offsets", names.kQueryLengths: "query_lengths",
           names.kValidTreeCounts: "query_lengths", names.kLogitsIndices: "logits_indices",
           names.kPackedAttentionMask: "packed_attention_mask", names.kTreeParentIds: "spec_tree_parent_ids",
           names.kTreeDepths: "spec_tree_depths"}
    for name in tm.names():
        if name in own:
            assert tm[name] is sd.io.member(own[name]), name
            assert cu[name] is step.tensors[f"catch_up_{own[name]}".replace("spec_tree", "tree")], name
        else:
            assert cu[name] is tm[name], name
    tree_names = [n for n in step.tensors if n in own.values() or n.startswith("catch_up_") and
                  not n.endswith(("_src", "_dst"))]
    spans = [(step._slots[n][1], step._slots[n][1] + step.tensors[n].capacity) for n in tree_names]
    ranges: list[tuple[int, int]] = []
    upload = step.upload

    def spy(s: trtio.Stream) -> None:
        ranges.append((step._lo, step._hi))
        upload(s)

    other = [[0, 2, 5], [0, 1], [0, 1, 4], [0]]  # PATHS' lengths, other nodes
    try:
        parents = _prefilled(sd)  # 4 sequences
        b, a = 4, 3
        x = _embeds(sd, (b, TOP_K), rng)
        tree = _embeds(sd, (b, len(TREE)), rng)
        catch_up = _embeds(sd, (b, a), rng)
        for r, paths in enumerate((PATHS, other, PATHS, other)):
            for p in parents:
                sd.draft_propose(x, parents=p)
            sd.verify(tree, TREE)
            sd.accept(paths)
            ranges.clear()
            step.upload = spy  # type: ignore[method-assign]
            try:
                sd.draft_accept(catch_up, np.array([len(p) for p in paths]))
            finally:
                del step.upload
            for lo, hi in ranges:  # (the first catch-up stages its constant query offsets)
                assert not [n for n, (s0, s1) in zip(tree_names, spans) if s0 < hi and lo < s1 and
                            not (r == 0 and n == "catch_up_query_start_offsets")], r
            if r:  # its lengths were staged by the round's levels, its offsets by the first catch-up
                assert all(hi <= lo for lo, hi in ranges), (r, ranges)
        for t in (x, tree, catch_up):
            t.close()
    finally:
        sd.close()
