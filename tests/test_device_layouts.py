"""Step inputs the device makes itself (issue 11): a ragged draft level grows a device copy of the draft tree
from one upload of its parents (:class:`trtio._ops.DraftLevel`), and a ragged decode advances a device copy
of the lengths (:class:`trtio._ops.DecodeAdvance`). Their outputs are compared with a tree walked node by
node in Python, on the host backend (also the asynchronous one, which runs each stream's work lazily) and on the
GPU; the setups then keep them in step with the host."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from _host_kernels import kernels_on_host

import trtio
from trtio import DType, Location, Stream, Tensor
from trtio._contracts.ragged import PHASE_DECODE, PHASE_VERIFY, TreeLayout, pack_rows
from trtio._cuda.backend import Backend
from trtio._ops import DecodeAdvance, DraftLevel, DraftTreeBuffers, TreeStep, TreeTargets
from trtio._trees import ancestor_mask
from trtio.edgellm import EngineDir
from trtio.testing import AsyncHostBackend, ReferenceEngine, ToyWeights, toy_embedding
from trtio.testing.toy_engines import ToyEngines, default_engines_dir
from trtio.testing.toy_runtime import embed_batch

E = toy_embedding(512, 64)


@pytest.fixture(params=["host", "async", "kernels", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """The host backend, the asynchronous host backend (each stream's work run lazily, interleaved: a copy left on
    another stream than the kernels' lands when it lands, as on a GPU), trtio's CUDA kernels built for the CPU and
    launched as on a GPU (tests/_host_kernels.py) and the cuda backend where a GPU answers."""
    if request.param == "async":
        return AsyncHostBackend(seed=3)
    if request.param == "kernels":
        return kernels_on_host(monkeypatch)
    return trtio.get_backend(request.param)


@contextmanager
def _tensors(backend: Backend, shapes: dict[str, tuple[tuple[int, ...], str]],
             s: Stream) -> Iterator[dict[str, Tensor]]:
    """Device tensors of ``shapes``, filled with garbage on ``s`` (the stream whose work must overwrite it)."""
    out = {n: Tensor.empty(shape, dtype, Location.DEVICE, backend=backend, name=n)
           for n, (shape, dtype) in shapes.items()}
    try:
        for t in out.values():
            t.copy_from(np.full(t.shape, 77, t.dtype.numpy), s)  # garbage a level must overwrite
        yield out
    finally:
        for t in out.values():
            t.close()


def _walk(parents: list[np.ndarray], past: np.ndarray, width: int, rope_cap: int) -> dict[str, np.ndarray]:
    """The step inputs of a draft tree whose levels have ``parents`` ([batch, k] each), node by node."""
    b = past.shape[0]
    words = max(1, -(-width // 32))
    out = {"positions": np.full((b, width), -1), "ids": np.zeros((b, width), np.int64),
           "parents": np.full((b, width), -1), "depths": np.zeros((b, width), np.int64),
           "mask": np.zeros((b, width, words), np.uint32), "rope": np.full((b, width), -1)}
    for s in range(b):
        parent_of: list[int] = []
        for level in parents:
            parent_of += [int(p) for p in level[s]]
        for node, p in enumerate(parent_of):
            chain, depth, at = [node], 0, p
            while at >= 0:
                chain.append(at)
                depth += 1
                at = parent_of[at]
            for a in chain:
                out["mask"][s, node, a // 32] |= np.uint32(1 << (a % 32))
            out["positions"][s, node] = out["ids"][s, node] = past[s] + depth
            out["parents"][s, node], out["depths"][s, node] = p, depth
            out["rope"][s, node] = s * rope_cap + past[s] + depth
    return out


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("layout", ["ragged", "mrope", "batch"])
def test_draft_levels_made_on_the_device_equal_the_tree_walked_on_the_host(backend: Backend, shared: bool,
                                                                          layout: str) -> None:
    """Random trees (2 rounds, levels of 1-5 nodes, up to 40 nodes, so two mask words), shared or
    per-sequence parents: after every level the step inputs equal the tree walked node by node, padding
    rows included, whatever the buffers held before. Ragged (with MRoPE rows or without): logits rows
    b * width + node, a parent's hidden row is its row in the previous level's output (row b for the root).
    Batch: logits are the node ids, a parent's hidden row is b * width + parent (the root's: given), and the
    start index and context lengths follow the round's lengths. The second round's first level reads the round's
    lengths where a catch-up left them (``past_from``) and writes them where the round's later steps read them."""
    b, width, cap = 3, 40, 1000
    rng = np.random.default_rng(7 + shared + 2 * len(layout))
    n_rows = b * width
    shapes = {"words": ((n_rows, 2), "int32"), "nodes": ((n_rows, 2), "int32"), "parents": ((n_rows,), "int32"),
              "past": ((b,), "int32"), "query_lengths": ((b,), "int32"), "logits": ((n_rows,), "int64"),
              "row_src": ((n_rows,), "int32"), "row_dst": ((n_rows,), "int32"), "positions": ((n_rows,), "int32"),
              "ids": ((n_rows,), "int32"), "parent_ids": ((n_rows,), "int32"), "depths": ((n_rows,), "int32"),
              "mask": ((n_rows, 2), "int32"), "rope": ((n_rows,), "int32"), "roots": ((b,), "int32"),
              "start": ((b,), "int32"), "ctx": ((b,), "int32"), "caught_up": ((b,), "int32")}
    ragged = layout != "batch"
    with Stream.create(backend) as s, _tensors(backend, shapes, s) as t:
        common = (t["words"], t["nodes"], t["parents"], t["past"], t["row_src"], t["row_dst"], t["logits"], t["mask"],
                  t["ids"], width, 2)
        if ragged:
            mrope = layout == "mrope"
            tree = DraftTreeBuffers(*common, logits_stride=width, query_lengths=t["query_lengths"],
                                    positions=t["positions"], parent_ids=t["parent_ids"], depths=t["depths"],
                                    rope_rows=t["rope"] if mrope else None, rope_cap=cap if mrope else 0)
        else:
            tree = DraftTreeBuffers(*common, logits_stride=0, roots=t["roots"], start=t["start"], ctx=t["ctx"])
        for r in range(2):
            past = rng.integers(0, 500, b)
            roots = rng.integers(0, 100, b)
            t["caught_up" if r else "past"].copy_from(past.astype(np.int32), s)
            t["roots"].copy_from(roots.astype(np.int32), s)
            levels: list[np.ndarray] = []
            n0, prev = 0, (0, 0)
            while True:
                k = int(rng.integers(1, 6))
                if n0 + k > width:
                    break
                if n0 == 0:
                    par = np.full((b, k), -1)
                else:
                    par = rng.integers(prev[0], prev[0] + prev[1], (1, k) if shared else (b, k))
                    par = np.broadcast_to(par, (b, k))
                staged = (par[0] if shared else par.reshape(-1)).astype(np.int32)
                t["parents"].reshape(staged.shape).copy_from(staged, s)
                level_rows = prev if ragged else (0, width)
                DraftLevel(tree, b, n0, k, *level_rows, shared, past_from=t["caught_up"] if r and not n0 else None
                           ).enqueue(s)
                levels.append(par)
                want = _walk(levels, past, width, cap)
                n = n0 + k
                got = {name: t[name].to_numpy(s) for name in shapes}
                np.testing.assert_array_equal(got["past"], past)
                np.testing.assert_array_equal(got["ids"], want["ids"].reshape(-1))
                np.testing.assert_array_equal(got["mask"].view(np.uint32), want["mask"].reshape(n_rows, 2))
                seq, new = np.arange(b)[:, None], np.arange(n0, n)
                np.testing.assert_array_equal(got["row_dst"][:b * k], (seq * width + new).reshape(-1))
                if n0 == 0:
                    src = np.broadcast_to(seq if ragged else roots[:, None], (b, k))
                else:
                    src = seq * level_rows[1] + par - level_rows[0]
                np.testing.assert_array_equal(got["row_src"][:b * k], src.reshape(-1))
                np.testing.assert_array_equal(got["logits"][:b * k],
                                              (seq * (width if ragged else 0) + new).reshape(-1))
                if ragged:
                    np.testing.assert_array_equal(got["positions"], want["positions"].reshape(-1))
                    np.testing.assert_array_equal(got["parent_ids"], want["parents"].reshape(-1))
                    np.testing.assert_array_equal(got["depths"], want["depths"].reshape(-1))
                    np.testing.assert_array_equal(got["query_lengths"], np.full(b, n))
                else:  # the batch contract's start index and context lengths, from the round's lengths
                    np.testing.assert_array_equal(got["start"], past)
                    np.testing.assert_array_equal(got["ctx"], past + width)
                if layout == "mrope":
                    np.testing.assert_array_equal(got["rope"], want["rope"].reshape(-1))
                prev, n0 = (n0, k), n


@pytest.mark.parametrize("contract", ["ragged", "mrope", "batch"])
@pytest.mark.parametrize("phase", [PHASE_DECODE, PHASE_VERIFY])
def test_tree_steps_made_on_the_device_equal_the_host_layout(backend: Backend, contract: str,
                                                             phase: int) -> None:
    """Random trees of 1-9 nodes in 9 rows per sequence (padding after them), random cached lengths: the
    device's positions, ids (padding value 7), attention lengths and MRoPE rows equal TreeLayout.at's
    (ragged); the start index, context lengths, position ids (0 on padding) and the copied mask and token
    selection equal what the batch contract uploads for such a step; the lengths after the step (``next``: past +
    the real rows) are where a draft's next round reads them."""
    b, w, cap = 4, 9, 512
    rng = np.random.default_rng(phase + len(contract))
    parents = [np.array([-1] + [int(rng.integers(0, t)) for t in range(1, int(rng.integers(1, w + 1)))])
               for _ in range(b)]
    vis = np.zeros((b, w, w), bool)
    for i, par in enumerate(parents):
        vis[i, :par.size, :par.size] = ancestor_mask(par)
    real = vis.any(axis=2)
    grid = np.array([np.pad(p, (0, w - p.size), constant_values=-1) for p in parents])
    layout = TreeLayout.of(pack_rows(vis, w), vis.sum(axis=2) - 1, real, phase=phase, logits_rows=np.arange(b * w),
                           parents=grid, padding_position=7)
    past = rng.integers(0, 300, b)
    select = rng.integers(0, 1000, (b, 3))
    shapes = {n: ((b,), "int32") for n in ("past", "lengths", "asl", "start", "ctx", "next")}
    shapes.update({n: ((b * w,), "int32") for n in ("depths", "positions", "ids", "rope")})
    shapes.update({"mask_src": (layout.packed_mask.shape, "int32"), "mask_dst": (layout.packed_mask.shape, "int32"),
                   "select_src": ((b, 3), "int64"), "select_dst": ((b, 3), "int64")})
    with Stream.create(backend) as s, _tensors(backend, shapes, s) as t:
        t["past"].copy_from(past.astype(np.int32), s)
        t["lengths"].copy_from(layout.query_lengths, s)
        t["depths"].copy_from(layout.tree_depths, s)
        t["mask_src"].copy_from(layout.packed_mask, s)
        t["select_src"].copy_from(select, s)
        if contract == "batch":
            targets = TreeTargets(t["past"], t["lengths"], t["depths"], start=t["start"], ctx=t["ctx"], ids=t["ids"],
                                  mask_src=t["mask_src"], mask_dst=t["mask_dst"], select_src=t["select_src"],
                                  select_dst=t["select_dst"], next=t["next"])
            TreeStep(targets, b, w, True, 0, layout.packed_mask.shape[1], 3).enqueue(s)
            np.testing.assert_array_equal(t["next"].to_numpy(s), past + real.sum(axis=1))
            np.testing.assert_array_equal(t["start"].to_numpy(s), past)
            np.testing.assert_array_equal(t["ctx"].to_numpy(s), past + w)
            want_ids = np.where(real, past[:, None] + vis.sum(axis=2) - 1, 0).reshape(-1)
            np.testing.assert_array_equal(t["ids"].to_numpy(s), want_ids)
            np.testing.assert_array_equal(t["mask_dst"].to_numpy(s), layout.packed_mask)
            np.testing.assert_array_equal(t["select_dst"].to_numpy(s), select)
            return
        mrope = contract == "mrope"
        targets = TreeTargets(t["past"], t["lengths"], t["depths"], asl=t["asl"], positions=t["positions"],
                              ids=t["ids"], rope_rows=t["rope"] if mrope else None, rope_cap=cap if mrope else 0,
                              next=t["next"])
        TreeStep(targets, b, w, phase > PHASE_DECODE, 7).enqueue(s)
        np.testing.assert_array_equal(t["next"].to_numpy(s), past + real.sum(axis=1))
        want = layout.at(past)
        np.testing.assert_array_equal(t["positions"].to_numpy(s), want.positions)
        np.testing.assert_array_equal(t["ids"].to_numpy(s), want.attention_position_ids)
        np.testing.assert_array_equal(t["asl"].to_numpy(s), want.attention_sequence_lengths)
        if mrope:
            slots = np.repeat(np.arange(b), w)
            np.testing.assert_array_equal(t["rope"].to_numpy(s),
                                          np.where(want.positions >= 0, slots * cap + want.positions, -1))


def test_decode_advance_lays_out_steps_from_the_device_lengths(backend: Backend) -> None:
    b, cap = 5, 4096
    lengths = np.array([3, 0, 17, 4000, 9], np.int32)
    shapes = {n: ((b,), "int32") for n in ("lengths", "past", "asl", "positions", "rope")}
    with Stream.create(backend) as s, _tensors(backend, shapes, s) as t:
        t["lengths"].copy_from(lengths, s)
        work = DecodeAdvance(t["lengths"], b, t["past"], t["asl"], t["positions"], t["rope"], cap)
        for step in range(3):
            work.enqueue(s)
            at = lengths + step
            np.testing.assert_array_equal(t["past"].to_numpy(s), at)
            np.testing.assert_array_equal(t["positions"].to_numpy(s), at)
            np.testing.assert_array_equal(t["asl"].to_numpy(s), at + 1)
            np.testing.assert_array_equal(t["rope"].to_numpy(s), np.arange(b) * cap + at)
            np.testing.assert_array_equal(t["lengths"].to_numpy(s), at + 1)


def _llm(graphs: bool, contract: str = "ragged") -> trtio.LLMSetup:
    if contract == "ragged":
        cfg = EngineDir.open(default_engines_dir() / "toy-llm-ragged").config
    else:
        cfg = ToyEngines.load().llm.base
    engine = ReferenceEngine.from_config(cfg, weights=ToyWeights.generate(cfg, 0), device="host")
    return trtio.create_for_llm(engine, cfg, graphs=graphs)


@pytest.mark.parametrize("contract", ["ragged", "batch"])
def test_decode_uploads_nothing_while_the_device_lengths_are_current_and_resyncs_after_a_prefill(
        host: Backend, contract: str) -> None:
    """Steady decodes upload nothing; after a prefill with other lengths, and after one that ends at the
    very lengths the device copy holds, decodes give the logits of a new setup running that prefill."""
    steps = [[[1, 2, 3], [4, 5]], [[6, 7, 8, 9], [10]], [[6, 7, 8, 9, 1, 2, 5], [10, 3, 4, 2]]]
    with _llm(True, contract) as reused:
        step = reused.io.step
        assert step is not None
        for prompts in steps:  # the last prompts end at the lengths the three decodes before leave: 7 and 4
            with _llm(True, contract) as fresh:
                logits: dict[bool, list[np.ndarray]] = {True: [], False: []}
                for setup in (reused, fresh):
                    emb, lens = embed_batch(E, prompts, np.float16)
                    setup.prefill(emb, lens)
                    for i in range(3):
                        uploads = step.uploads
                        x = E[np.full((2, 1), 11 + i)].astype(np.float16)
                        logits[setup is reused].append(setup.decode(x).to_numpy().copy())
                        if setup is reused and i:
                            assert step.uploads == uploads, "a steady decode uploaded its inputs"
                for got, want in zip(logits[True], logits[False]):
                    np.testing.assert_array_equal(got, want)
                np.testing.assert_array_equal(reused.lengths, fresh.lengths)


@pytest.mark.parametrize("contract", ["ragged", "batch"])
def test_an_llm_declares_the_device_lengths_in_its_step_block(contract: str) -> None:
    with _llm(False, contract) as setup:
        step = setup.io.step
        assert step is not None
        t = step.tensors["decode_lengths"]
        assert (t.dtype, t.location, t.capacity) == (DType.INT32, Location.DEVICE, 4 * setup.io.max_batch)


def _catch_up_case(width: int, seed: int) -> dict[str, np.ndarray]:
    """A catch-up's inputs: 5 sequences' accepted paths of 1 .. ``width`` nodes (random nodes of a 50-row verify
    step) as the KV commit's rows (``width + 4`` ints each: a wider commit row than the catch-up), and cached
    lengths."""
    rng = np.random.default_rng(seed)
    b, stride = 5, width + 4
    acc = rng.integers(1, width + 1, b)
    acc[0], acc[-1] = 1, width  # the shortest and the longest path
    moves = np.full((b, stride), -1, np.int32)
    moves[:, 0] = rng.integers(0, 100, b)
    moves[:, 1] = acc
    for i, n in enumerate(acc):
        moves[i, 2:2 + n] = rng.integers(0, 50, n)
    return {"moves": moves, "acc": acc, "past": rng.integers(0, 300, b).astype(np.int32)}


def _catch_up_walk(case: dict[str, np.ndarray], width: int, nodes: int, scratch: int, logits_stride: int,
                   roots_stride: int) -> dict[str, np.ndarray]:
    """What a catch-up's layout holds, row by row in Python."""
    moves, acc = case["moves"], case["acc"]
    b, words = acc.shape[0], max(1, -(-width // 32))
    out = {"lengths": acc.copy(), "logits": np.zeros(b, np.int64), "roots": np.zeros(b, np.int64),
           "parent_ids": np.zeros(b * width, np.int64), "depths": np.zeros(b * width, np.int64),
           "mask": np.zeros((b * width, words), np.uint32), "dst": np.zeros(b * width, np.int64),
           "src": np.zeros(b * width, np.int64)}
    for i in range(b):
        n = int(acc[i])
        out["logits"][i] = i * logits_stride + n - 1
        out["roots"][i] = i * roots_stride + n - 1
        for j in range(width):
            r = i * width + j
            out["parent_ids"][r], out["depths"][r] = j - 1, j
            real = j < n
            out["dst"][r] = i * scratch + j if real else -1
            out["src"][r] = i * nodes + int(moves[i, 2 + j]) if real else -1
            if real:
                for seen in range(j + 1):  # node j sees nodes 0 .. j
                    out["mask"][r, seen // 32] |= np.uint32(1 << (seen % 32))
    return out


def _catch_up_on(backend: Backend, case: dict[str, np.ndarray], width: int, tree_step: bool) -> dict[str, np.ndarray]:
    """Run :class:`~trtio._ops.CatchUpLayout` of ``case`` on ``backend`` (with the tree step of the batch contract's
    targets where ``tree_step``); every tensor it writes, read back."""
    from trtio._ops import CatchUpLayout, CatchUpTargets

    moves, acc = case["moves"], case["acc"]
    b, words = acc.shape[0], max(1, -(-width // 32))
    shapes = {"moves": (moves.shape, "int32"), "lengths": ((b,), "int32"), "logits": ((b,), "int64"),
              "roots": ((b,), "int32"), "past": ((b,), "int32"), "start": ((b,), "int32"), "ctx": ((b,), "int32"),
              "next": ((b,), "int32"), "select": ((b,), "int64"), "mask_dst": ((b * width, words), "int32"),
              "mask": ((b * width, words), "int32")}
    shapes.update({n: ((b * width,), "int32") for n in ("parent_ids", "depths", "dst", "src", "ids")})
    with Stream.create(backend) as s, _tensors(backend, shapes, s) as t:
        t["moves"].copy_from(moves, s)
        t["past"].copy_from(case["past"], s)
        tree = None
        if tree_step:
            tree = TreeStep(TreeTargets(t["past"], t["lengths"], t["depths"], start=t["start"], ctx=t["ctx"],
                                        ids=t["ids"], mask_src=t["mask"], mask_dst=t["mask_dst"],
                                        select_src=t["logits"], select_dst=t["select"], next=t["next"]),
                            b, width, True, 0, words, 1)
        targets = CatchUpTargets(t["dst"], t["src"], lengths=t["lengths"], logits=t["logits"],
                                 parent_ids=t["parent_ids"], depths=t["depths"], mask=t["mask"], roots=t["roots"])
        CatchUpLayout(targets, t["moves"], moves.shape[1], 50, b, width, 7, words=words, logits_stride=width,
                      roots_stride=width + 1, tree=tree).enqueue(s)
        return {n: v.to_numpy(s) for n, v in t.items()}


@pytest.mark.parametrize("width", [4, 40])
@pytest.mark.parametrize("tree_step", [False, True])
def test_a_catch_up_laid_out_on_the_device_equals_its_rows_walked_in_python(backend: Backend, width: int,
                                                                            tree_step: bool) -> None:
    """:class:`~trtio._ops.CatchUpLayout` (the catch-up's layout made from the KV commit's rows alone) writes what a
    walk of each path writes row by row: lengths, logits and root rows, parents, depths, causal mask words (two per
    row past 32 rows: the second word's bits from node 32 on), scratch rows and accepted rows (-1 past each path);
    its mask and logits rows are TreeLayout.chains' (the host layout it replaces). With its tree step, in the same
    launch, that step reads what the layout just wrote (the batch contract's: start, context lengths, ids, the mask
    and selection copied, the next round's lengths)."""
    case = _catch_up_case(width, width)
    got = _catch_up_on(backend, case, width, tree_step)
    want = _catch_up_walk(case, width, 50, 7, width, width + 1)
    for name, values in want.items():
        np.testing.assert_array_equal(got[name].reshape(values.shape).astype(values.dtype), values, err_msg=name)
    acc, past = case["acc"], case["past"].astype(np.int64)
    chains = TreeLayout.chains(acc, width, phase=PHASE_DECODE, logits_rows=np.arange(acc.shape[0]) * width + acc - 1)
    np.testing.assert_array_equal(got["mask"], chains.packed_mask)
    np.testing.assert_array_equal(got["logits"], chains.logits_indices)
    if tree_step:
        np.testing.assert_array_equal(got["next"], past + acc)
        np.testing.assert_array_equal(got["start"], past)
        np.testing.assert_array_equal(got["ctx"], past + width)
        depth = np.arange(width)[None, :]
        np.testing.assert_array_equal(got["ids"], np.where(depth < acc[:, None], past[:, None] + depth, 0).reshape(-1))
        np.testing.assert_array_equal(got["mask_dst"], chains.packed_mask)
        np.testing.assert_array_equal(got["select"], want["logits"])


@pytest.mark.gpu
@pytest.mark.parametrize("width", [4, 40])
def test_the_catch_up_layout_kernel_writes_what_its_host_op_writes(cuda: Backend, host: Backend, width: int) -> None:
    """The cuda kernel ``trtio_catch_up_layout`` and the host backend's numpy op, on the same random catch-up (with
    its tree step): every tensor they write is the same."""
    case = _catch_up_case(width, 11 + width)
    on_gpu, on_host = _catch_up_on(cuda, case, width, True), _catch_up_on(host, case, width, True)
    for name in on_host:
        np.testing.assert_array_equal(on_gpu[name], on_host[name], err_msg=name)
