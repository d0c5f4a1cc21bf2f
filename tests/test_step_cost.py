"""Step cost (issue 11): each step helper stages its inputs with one copy and runs its engine, with the
device work that feeds it (RoPE gathers, hidden-row moves, zeroing), as one graph; a captured spec-decode
round replays to the same KV state as plain execution; a steady round makes no TensorRT set_* call,
allocates nothing and never syncs. Counted on the host backend (every device operation it enqueues);
timings are benchmarks (``trtio bench``), never tests."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from _threads import run_at_once

import trtio
from trtio import Location, Tensor
from trtio._cache import BoundedCache
from trtio._cuda.backend import Backend, cuda_available
from trtio.edgellm import EngineDir
from trtio.testing import ReferenceEngine, ToyWeights, toy_embedding
from trtio.testing.toy_engines import ToyEngines, default_engines_dir
from trtio.testing.toy_runtime import embed_batch

E = toy_embedding(512, 64)
TOP_K, STEPS, VERIFY = 2, 3, 7
BINARY = [-1, 0, 0, 1, 1, 2, 2]  # the verify tree: a binary tree of 7 nodes


def _pair(contract: str) -> tuple[trtio.DeploymentConfig, ToyWeights, ToyWeights]:
    if contract == "ragged":
        bundle = EngineDir.open(default_engines_dir() / "toy-eagle3-ragged").deployment(TOP_K, STEPS, VERIFY)
        bw = ToyWeights.generate(bundle.base, 0)
        return bundle, bw, ToyWeights.generate_draft(bundle.draft, bw, 0)
    toys = ToyEngines.load()
    spec = dataclasses.replace(toys.eagle.spec, drafting_top_k=TOP_K, drafting_step=STEPS, verify_size=VERIFY)
    bundle = dataclasses.replace(toys.eagle, spec=spec).validate()
    return bundle, toys.weights("toy-eagle/base"), toys.weights("toy-eagle/draft")


def _setup(contract: str, graphs: bool, device: str = "host") -> trtio.SpecDecodeSetup:
    bundle, bw, dw = _pair(contract)
    base = ReferenceEngine.from_config(bundle.base, weights=bw, device=device)
    draft = ReferenceEngine.from_config(bundle.draft, weights=dw, device=device)
    return trtio.create_for_spec_decode(base, draft, bundle, graphs=graphs)


def _embeds(sd: trtio.SpecDecodeSetup, tokens: np.ndarray) -> Tensor:
    """Embeddings of ``tokens`` [batch, n] as a device tensor (a runtime's embedding lookup output)."""
    t = Tensor.empty(tokens.shape + (E.shape[1],), "float16", Location.DEVICE, backend=sd.io.inputs_embeds.backend)
    t.copy_from(E[tokens].astype(np.float16))
    return t


def _round(sd: trtio.SpecDecodeSetup, r: int, levels: list[Tensor],
           ops: dict[str, list[int]] | None = None, parents: list[np.ndarray] | None = None,
           paths: list[list[int]] | None = None) -> list[np.ndarray]:
    """One round with fixed shapes and round-dependent tokens and paths: every level, verify, accept and
    the catch-up; returns every logits output. ``ops`` collects device operations per helper; ``parents``:
    each level's (else a binary tree's, made afresh); ``paths``: the accepted paths (else one of two patterns, by
    the round's parity)."""
    b = sd.batch
    assert b is not None
    rng = np.random.default_rng(r)
    be = sd.io.inputs_embeds.backend

    def counted(name: str, fn: Callable[[], object]) -> object:
        before = getattr(be, "op_count", 0)
        out = fn()
        if ops is not None:
            ops.setdefault(name, []).append(be.op_count - before)
        return out

    out = []
    for x in levels:  # the level embedding buffers, written in place (a runtime's lookup output)
        x.copy_from(E[rng.integers(0, 512, (b, TOP_K))].astype(np.float16))
    if parents is None:
        parents = [np.full(TOP_K, -1)] + [lv * TOP_K + np.arange(TOP_K) // 2 for lv in range(STEPS - 1)]
    for x, p in zip(levels, parents):
        out.append(counted("draft_propose", lambda x=x, p=p: sd.draft_propose(x, parents=p)).to_numpy())
    tree = sd.io.inputs_embeds.reshape((b, VERIFY, E.shape[1]))
    tree.copy_from(E[rng.integers(0, 512, (b, VERIFY))].astype(np.float16))  # written in place, like a runtime
    out.append(counted("verify", lambda: sd.verify(tree, BINARY)).to_numpy())
    if paths is None:
        paths = [[0, 1, 3], [0, 2], [0, 2, 6], [0]][:b] if r % 2 else [[0, 2, 5], [0, 1, 4], [0], [0, 1]][:b]
    counted("accept", lambda: sd.accept(paths))
    a = 3
    catch_up = sd.io.inputs_embeds.reshape((b, a, E.shape[1]))
    catch_up.copy_from(E[rng.integers(0, 512, (b, a))].astype(np.float16))
    lens = np.array([len(p) for p in paths])
    out.append(counted("draft_accept", lambda: sd.draft_accept(catch_up, lens)).to_numpy())
    return out


def _level_buffers(sd: trtio.SpecDecodeSetup, rounds: int = 1) -> list[list[Tensor]]:
    """Embedding buffers for each level of ``rounds`` rounds, all alive at once (so no two share an address):
    one set kept from round to round is a runtime's lookup output; a set per round, buffers that move."""
    return [[_embeds(sd, np.zeros((4, TOP_K), np.int64)) for _ in range(STEPS)] for _ in range(rounds)]


def within(got: dict[str, list[int]], budget: dict[str, list[int]]) -> None:
    """Every call of every helper enqueued at most its budget of device operations (the budgets are what the steps
    cost when they were written): a change that keeps or removes work passes, one that adds work fails."""
    assert sorted(got) == sorted(budget), (got, budget)
    for name, counts in got.items():
        assert len(counts) == len(budget[name]), (name, counts, budget[name])
        over = [(i, c, b) for i, (c, b) in enumerate(zip(counts, budget[name])) if c > b]
        assert not over, f"{name}: calls over their budget (call, ops, budget): {over}; all: {got}"


def _close(buffers: list[list[Tensor]]) -> None:
    for level in buffers:
        for x in level:
            x.close()


def _start(sd: trtio.SpecDecodeSetup) -> None:
    for e in sd.engines():
        e.state.reset(clear=True)  # zeroed caches: slots past the committed lengths compare too
    emb, lens = embed_batch(E, [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11], [12]], np.float16)
    sd.base_prefill(emb, lens)
    sd.draft_prefill(emb, lens)


def _two_rounds_in(sd: trtio.SpecDecodeSetup) -> list[Tensor]:
    """Start ``sd`` and run two rounds (every graph captured); returns the level buffers a steady round reuses."""
    _start(sd)
    levels = _level_buffers(sd)[0]
    for r in range(2):
        _round(sd, r, levels)
    return levels


def _kv(sd: trtio.SpecDecodeSetup) -> dict[str, np.ndarray]:
    return {f"{e.role}/{n}": t.view(trtio.DType.UINT8).to_numpy() for e in sd.engines() for n, t in
            e.state.tensors.items()}


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_a_captured_round_replays_to_the_kv_state_of_plain_execution(contract: str, device: str) -> None:
    """verify -> accept -> draft_accept (and the proposal levels) captured once, replayed with other
    tokens and other accepted paths: the same logits and the same KV caches, byte for byte, as plain
    execution, round after round."""
    plain, graphed = _setup(contract, False, device), _setup(contract, True, device)
    try:
        for sd in (plain, graphed):
            _start(sd)
        buffers = {id(sd): _level_buffers(sd)[0] for sd in (plain, graphed)}
        stats = graphed.graph_stats
        for r in range(4):
            before = {role: (st.hits, st.captures) for role, st in stats.items()}
            outs = [_round(sd, r, buffers[id(sd)]) for sd in (plain, graphed)]
            for a, b in zip(*outs):
                np.testing.assert_array_equal(a, b)
            want, got = _kv(plain), _kv(graphed)
            for name in want:
                np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name}, round {r}")
        # The last rounds replay graphs only: 3 levels + a catch-up on the draft, a verify on the base. (The
        # second round captured the levels again, copying their embeddings, whose addresses had held.)
        assert {role: (st.hits - before[role][0], st.captures - before[role][1]) for role, st in stats.items()} == \
            {"base": (1, 0), "draft": (STEPS + 1, 0)}
        for x in (*buffers[id(plain)], *buffers[id(graphed)]):
            x.close()
    finally:
        plain.close()
        graphed.close()


@pytest.fixture(params=["host", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> str:
    if request.param == "gpu":
        pytest.importorskip("cupy")
        if not cuda_available():
            pytest.skip("no CUDA device answers here")
    return str(request.param)


def test_ragged_steps_are_one_staged_copy_and_one_graph(host: Backend) -> None:
    """Steady rounds on the token-major contract, graphs on: every helper that runs an engine enqueues
    its staged inputs (one copy) and one graph (the engine and the gathers, moves and zeroing before
    it); a level's embeddings add one 2D copy; accept is one copy and one kernel over every KV cache."""
    sd = _setup("ragged", True)
    try:
        _start(sd)
        levels, moved = _level_buffers(sd, 2)
        for r in range(2):
            _round(sd, r, levels)  # capture every graph
        ops: dict[str, list[int]] = {}
        for r in range(2, 4):
            _round(sd, r, levels, ops)
        # A level's embeddings, from the buffers of the rounds before, are copied in its graph; a later level
        # whose parents repeat the last round's finds them in the step block: its graph alone.
        within(ops, {"draft_propose": [2] + [1] * (STEPS - 1) + [2] + [1] * (STEPS - 1), "verify": [2, 2],
                     "accept": [2, 2], "draft_accept": [2, 2]})
        ops.clear()
        # Other buffers: their embeddings are copied outside the graphs, which stay (the first such round captures
        # its first level's: the rounds before copied in the graph, the first round staged its lengths).
        _round(sd, 4, moved)
        _round(sd, 5, levels, ops)
        within({"draft_propose": ops["draft_propose"]}, {"draft_propose": [3] + [2] * (STEPS - 1)})
    finally:
        sd.close()


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_the_copies_of_a_step_graph_are_one_kernel_per_stage(host: Backend, contract: str) -> None:
    """Each node of a graph costs the device about 2 µs whatever it moves, so the copies around a step's
    layout kernel are one kernel where they are independent (``ops.CopyJobs``): a later proposal level is
    its tree level, then its embeddings, RoPE and hidden rows; a round's first level zeroes and copies
    before the tree level; a catch-up is its layout, one kernel of copies, then the scatter that reads
    what that kernel gathered."""
    sd = _setup(contract, True)
    try:
        _start(sd)
        (levels,) = _level_buffers(sd, 1)
        for r in range(3):
            _round(sd, r, levels)  # the level buffers stay in place: their copies join the level graphs

        def works() -> list[str]:
            return [type(w).__name__ for w in sd.draft.executor._plan.graph_before]

        def at_most(budget: list[str]) -> None:  # no more kernels than these (a copy not merged is one more)
            got = works()
            assert len(got) <= len(budget), f"{got}: more kernels than {budget}"

        at_most(["TreeStep", "CopyJobs", "RowCopy"])
        sd.draft_propose(levels[0], parents=np.full(TOP_K, -1))
        at_most(["CopyJobs", "DraftLevel", "CopyJobs" if contract == "ragged" else "RowCopy"])
        sd.draft_propose(levels[1], parents=np.arange(TOP_K) // 2)
        at_most(["DraftLevel", "CopyJobs"])
        _close([levels])
    finally:
        sd.close()


def test_level_embeddings_from_new_addresses_every_round_cost_no_new_graphs(host: Backend) -> None:
    """A runtime that hands each level a buffer at another address each round: the copies stay outside the
    graphs (one 2D copy each), and the level graphs captured in the first two rounds replay (the first round's
    first level stages the lengths the prefill left; a later round's reads them where the catch-up left them on the
    device: a graph of its own)."""
    sd = _setup("ragged", True)
    try:
        _start(sd)
        buffers = _level_buffers(sd, 4)  # all alive: no round's buffers share an address with another's
        for r, levels in enumerate(buffers):
            before = sd.graph_stats["draft"].captures
            ops: dict[str, list[int]] = {}
            _round(sd, r, levels, ops)
            if r > 1:
                assert sd.graph_stats["draft"].captures == before
                within({"draft_propose": ops["draft_propose"]},  # later levels: their parents held
                       {"draft_propose": [3] + [2] * (STEPS - 1)})
        _close(buffers)
    finally:
        sd.close()


def test_batch_steps_stay_within_sixteen_device_operations(host: Backend) -> None:
    """The batch contract's steady rounds, with the worst case for a level (buffers that move each round, so
    every level's embeddings are copied outside its graph): at most 3 device operations per helper."""
    sd = _setup("batch", True)
    try:
        _start(sd)
        buffers = _level_buffers(sd, 4)
        ops: dict[str, list[int]] = {}
        for r, levels in enumerate(buffers):
            _round(sd, r, levels, ops if r >= 2 else None)
        # a round's later levels find their parents (those of the last round) in the step block: no copy
        within(ops, {"draft_propose": [3] + [2] * (STEPS - 1) + [3] + [2] * (STEPS - 1), "verify": [1, 1],
                     "accept": [2, 2], "draft_accept": [2, 2]})
        _close(buffers)
    finally:
        sd.close()


def _serving_paths(rounds: int, b: int = 4) -> list[list[list[int]]]:
    """Per round, each sequence's accepted root path of 1-3 nodes of the binary verify tree, at random; every round's
    pattern of lengths new (none seen in an earlier round), as a serving loop's."""
    rng = np.random.default_rng(7)
    out: list[list[list[int]]] = []
    seen: set[tuple[int, ...]] = set()
    while len(out) < rounds:
        lens = tuple(int(n) for n in rng.integers(1, 4, b))
        if lens in seen:
            continue
        seen.add(lens)
        paths = []
        for n in lens:
            walk = [0]
            for _ in range(n - 1):
                walk.append(2 * walk[-1] + 1 + int(rng.integers(0, 2)))
            paths.append(walk)
        out.append(paths)
    return out


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_a_serving_round_costs_the_steady_round_and_one_upload(host: Backend, contract: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds whose accepted paths are new every round (a serving loop's: 1-3 nodes a sequence at random, a new
    pattern of lengths each round), beside steady rounds (the same paths each round): a serving round enqueues at
    most one device operation more than a steady one (accept's upload of the new paths' commit rows), its catch-up
    is laid out on the device from those rows (no host layout: TreeLayout.chains is never called) and uploads
    nothing, and the next round's first level uploads nothing either (the batch contract's roots are written by the
    catch-up's layout)."""
    from trtio._contracts.ragged import TreeLayout

    sd = _setup(contract, True)
    step, moves = sd.io.step, sd.base.state._moves
    assert step is not None
    chains: list[object] = []
    real_chains = TreeLayout.chains.__func__  # type: ignore[attr-defined]

    def spy(cls: type, *args: Any, **kwargs: Any) -> TreeLayout:
        chains.append(args)
        return real_chains(cls, *args, **kwargs)  # type: ignore[no-any-return]

    try:
        levels = _two_rounds_in(sd)
        steady: dict[str, list[int]] = {}
        for r in range(2):
            before = step.uploads
            _round(sd, r, levels, steady, paths=[[0, 1, 3], [0, 2], [0, 2, 6], [0]])
        steady_uploads = step.uploads - before  # the step block's, in the last steady round
        monkeypatch.setattr(TreeLayout, "chains", classmethod(spy))
        for r, paths in enumerate(_serving_paths(4)):
            ops: dict[str, list[int]] = {}
            uploads = {"step": step.uploads, "moves": moves.uploads}
            _round(sd, 2 + r, levels, ops, paths=paths)
            if contract == "batch":  # the host's roots are the ones the catch-up's layout wrote on the device
                b = len(paths)
                on_device = step.tensors["draft_roots"].to_numpy()[:b]
                np.testing.assert_array_equal(sd._roots.rows[:b], on_device, err_msg=f"round {r}")
                np.testing.assert_array_equal(on_device, [i * 3 + len(p) - 1 for i, p in enumerate(paths)])
            if r == 0:  # (a round after the steady ones: its first level read the steady catch-up's)
                continue
            total, steady_total = sum(sum(v) for v in ops.values()), sum(v[-1] for v in steady.values()) + \
                sum(steady["draft_propose"][-STEPS:-1])
            assert total <= steady_total + 1, (r, ops, steady)
            assert ops["draft_accept"] == steady["draft_accept"][-1:], (r, ops, steady)
            assert ops["accept"][0] == steady["accept"][-1] + 1, (r, ops, steady)  # its commit rows, uploaded
            assert moves.uploads == uploads["moves"] + 1
            # the step block: no upload more than a steady round's (none in the catch-up nor the next first level)
            assert step.uploads - uploads["step"] == steady_uploads, (r, step.uploads - uploads["step"])
        assert not chains, f"a serving round laid a catch-up out on the host: {len(chains)} layouts"
        for x in levels:
            x.close()
    finally:
        sd.close()


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_steady_spec_rounds_make_no_set_call_allocation_or_sync(host: Backend, contract: str) -> None:
    sd = _setup(contract, True)
    try:
        levels = _two_rounds_in(sd)
        calls = {e.role: dict(e.executor.context.calls) for e in sd.engines()}
        for _ in range(2):
            allocs, syncs = host.alloc_count, host.sync_count
            parents = [np.full(TOP_K, -1)] + [lv * TOP_K + np.arange(TOP_K) // 2 for lv in range(STEPS - 1)]
            for x, p in zip(levels, parents):
                sd.draft_propose(x, parents=p)
            sd.verify(sd.io.inputs_embeds.reshape((4, VERIFY, 64)), BINARY)
            sd.accept([[0, 1, 3], [0, 2], [0], [0, 1]])
            sd.draft_accept(sd.io.inputs_embeds.reshape((4, 3, 64)), np.array([3, 2, 1, 2]))
            assert (host.alloc_count, host.sync_count) == (allocs, syncs), "a round allocated or synced"
        for x in levels:
            x.close()
        for e in sd.engines():
            new = {k: v - calls[e.role].get(k, 0) for k, v in e.executor.context.calls.items() if k.startswith("set")}
            assert not any(new.values()), (e.role, new)
    finally:
        sd.close()


def test_work_before_an_engine_is_captured_in_its_graph(host: Backend) -> None:
    """The executor's ``before`` work runs before the engine, is captured with it, and a different
    ``before`` is another graph: a replay runs the captured work (reading its indices afresh)."""
    from trtio._ops import RowCopy

    llm = EngineDir.open(default_engines_dir() / "toy-llm-ragged").config
    with trtio.create_for_llm(ReferenceEngine.from_config(llm, device="host"), llm, graphs=True) as setup:
        emb, lens = embed_batch(E, [[1, 2, 3]], np.float16)
        setup.prefill(emb, lens)
        setup.decode(emb[:, :1])  # stages a decode step's inputs, which the calls below run on
        ex, s = setup.executor, trtio.Stream.create(host)
        src = Tensor.from_numpy(np.arange(8, dtype=np.float32).reshape(4, 2), backend=host)
        dst = Tensor.from_numpy(np.zeros((4, 2), np.float32), backend=host)
        rows = Tensor.from_numpy(np.array([3, 2, 1, 0], np.int32), backend=host)
        work = RowCopy(dst, src, rows, 4, 8)
        dims = llm.decode_dims(1)
        for i in range(3):
            rows.copy_from(np.roll(np.array([3, 2, 1, 0], np.int32), i), s)
            ex.prepare(1, setup.engines()[0].tensor_map, dims, s)
            ex.execute(s, before=(work,))
            s.synchronize()
            np.testing.assert_array_equal(dst.to_numpy(), src.to_numpy()[np.roll([3, 2, 1, 0], i)])
        captures = ex.graph_stats.captures
        assert ex.graph_stats.hits >= 2
        ex.execute(s, before=(RowCopy(dst, src, rows, 2, 8),))  # other work: another graph
        assert ex.graph_stats.captures == captures + 1
        assert "other device work before the engine" in ex.graph_stats.last_miss_reason
        for t in (src, dst, rows):
            t.close()
        s.close()


def _steady_llm(host: Backend) -> tuple[trtio.LLMSetup, np.ndarray]:
    """A toy LLM with graphs, two sequences prefilled and decoded until its decode step is a steady replay."""
    llm = EngineDir.open(default_engines_dir() / "toy-llm-ragged").config
    setup = trtio.create_for_llm(ReferenceEngine.from_config(llm, device="host"), llm, graphs=True)
    emb, lens = embed_batch(E, [[1, 2, 3], [4, 5]], np.float16)
    setup.prefill(emb, lens)
    x = E[np.array([[6], [7]])].astype(np.float16)
    for _ in range(3):  # the first step runs plain, the second is captured, the third replays
        setup.decode(x)
    return setup, x


def test_a_steady_decode_sets_back_views_changed_since_it_last_ran(host: Backend) -> None:
    """Between two steady decodes (graph replays without a prepare) a shared tensor's view may change: one
    reshape (set back alone), several, or a view another executor set (set back all at once). Each step
    returns the logits at its own view and still replays its graph; its logits are a plain run's."""
    setup, x = _steady_llm(host)
    plain, _ = _steady_llm(host)
    plain.executor.graphs_enabled = False
    try:
        ex, io = setup.executor, setup.io
        rows = io.output_logits.shape
        embeds = io.inputs_embeds.shape
        changes: list[Callable[[], object]] = [
            lambda: io.output_logits.reshape((rows[0] * rows[1],)),  # one reshape since the last step
            lambda: (io.output_logits.reshape((1, rows[0] * rows[1])),  # two
                     io.inputs_embeds.reshape((int(np.prod(embeds)),))),
            lambda: io.output_logits._set_view((rows[1], rows[0]), io.output_logits.nbytes),  # an executor's way
            lambda: io.inputs_embeds.reshape((1, int(np.prod(embeds)))),  # the tensor the step uploads into
        ]
        for change in changes:
            change()
            hits = ex.graph_stats.hits
            got = setup.decode(x)
            want = plain.decode(x)
            assert ex.graph_stats.hits == hits + 1, "the steady step replayed its graph"
            assert got.shape == rows, "the logits view is the step's own again"
            assert io.inputs_embeds.shape == embeds, "the embeddings' view is the step's own again"
            np.testing.assert_array_equal(got.to_numpy(), want.to_numpy())
    finally:
        setup.close()
        plain.close()


def test_a_view_another_executor_of_the_same_owner_set_is_set_back_by_a_steady_decode(host: Backend) -> None:
    """Executors that share a context memory are one owner: they share a view log. Another executor bound to the
    same tensor map (a one-sequence decode step: every shared view at its own shape) between two steady decodes:
    the next steady decode still replays its graph, sets every view back to its own and returns a plain run's
    logits."""
    from trtio._engine import EngineExecutor

    setup, x = _steady_llm(host)
    plain, _ = _steady_llm(host)
    plain.executor.graphs_enabled = False
    e = setup.engines()[0]
    other = EngineExecutor(ReferenceEngine.from_config(e.cfg, device="host"), context_memory=e.executor.context_memory,
                           name="other", registry=e.executor.registry, backend=host)
    s = trtio.Stream.create(host)
    try:
        io, ex = setup.io, setup.executor
        rows, embeds = io.output_logits.shape, io.inputs_embeds.shape
        for _ in range(2):
            other.prepare(1, e.tensor_map, e.cfg.decode_dims(1), s)
            assert io.output_logits.shape != rows and io.inputs_embeds.shape != embeds, "the other step's views"
            hits = ex.graph_stats.hits
            got = setup.decode(x)
            assert ex.graph_stats.hits == hits + 1, "a steady step: its graph replayed"
            assert got.shape == rows and io.inputs_embeds.shape == embeds, "every view is the step's own again"
            np.testing.assert_array_equal(got.to_numpy(), plain.decode(x).to_numpy())
    finally:
        s.close()
        other.close()
        setup.close()
        plain.close()


def test_setups_stepped_from_two_threads_at_once_leave_no_view_of_theirs_unset(host: Backend) -> None:
    """Two setups, each stepped by its own thread at the same time, thread switches as frequent as the interpreter
    allows: every steady decode (its caller viewing io.inputs_embeds as the step's embeddings, a reshape of the
    setup's own tensor just before it) returns with each of its views set back to its own, whatever the other
    thread reshaped meanwhile."""
    setups = [_steady_llm(host) for _ in range(2)]
    failures: list[str] = []
    start = threading.Barrier(2)

    def steps(setup: trtio.LLMSetup, x: np.ndarray) -> None:
        io = setup.io
        rows, embeds = io.output_logits.shape, io.inputs_embeds.shape
        dev = Tensor.from_numpy(x, backend=host)
        step = (x.shape[0], 1, x.shape[2])
        try:
            start.wait()
            for i in range(200):  # within the KV capacity (256)
                io.inputs_embeds.reshape(step)
                got = setup.decode(dev)
                if got.shape != rows or io.inputs_embeds.shape != embeds:
                    failures.append(f"step {i}: logits {got.shape}, inputs_embeds {io.inputs_embeds.shape}")
                    return
        except BaseException as exc:  # noqa: BLE001 - a thread's error fails the test
            failures.append(repr(exc))
        finally:
            dev.close()

    try:
        run_at_once([functools.partial(steps, *pair) for pair in setups])
    finally:
        for setup, _ in setups:
            setup.close()
    assert failures == []


def _reversed_rows(host: Backend) -> tuple[Tensor, Tensor, Tensor, tuple[Any, ...], tuple[Any, ...]]:
    """Host tensors src [4, 2], dst and rows [3, 2, 1, 0], with two works before an engine: a RowCopy of all four
    rows reversed, and one of two rows (other work)."""
    from trtio._ops import RowCopy

    src = Tensor.from_numpy(np.arange(8, dtype=np.float32).reshape(4, 2), backend=host)
    dst = Tensor.from_numpy(np.zeros((4, 2), np.float32), backend=host)
    rows = Tensor.from_numpy(np.array([3, 2, 1, 0], np.int32), backend=host)
    return src, dst, rows, (RowCopy(dst, src, rows, 4, 8),), (RowCopy(dst, src, rows, 2, 8),)


def test_a_replay_runs_only_the_graph_of_the_last_steps_plan_and_work(host: Backend) -> None:
    """``EngineExecutor.replay`` stands for prepare + execute only where the last execute replayed the graph of
    the same plan and the same ``before``: other work before the engine, other dims, another profile or a
    tensor map changed since return False and enqueue nothing."""
    setup, x = _steady_llm(host)
    try:
        e = setup.engines()[0]
        ex, tm, s = e.executor, e.tensor_map, trtio.Stream.create(host)
        dims = e.cfg.decode_dims(2)
        tm.generation += 1  # what a sanctioned rebinding does: a new plan, of these dims
        src, dst, rows, work, other = _reversed_rows(host)
        for _ in range(2):  # a plain run, then the capture
            ex.prepare(1, tm, dims, s)
            ex.execute(s, before=work)
        ops, hits = host.op_count, ex.graph_stats.hits
        assert ex.replay(1, tm, dims, s, work), "the same plan and work: a replay"
        assert ex.graph_stats.hits == hits + 1 and host.op_count <= ops + 1, "one graph launch"
        np.testing.assert_array_equal(dst.to_numpy(), src.to_numpy()[[3, 2, 1, 0]])
        ops = host.op_count
        assert not ex.replay(1, tm, dims, s, other), "other work before the engine"
        assert not ex.replay(1, tm, e.cfg.decode_dims(1), s, work), "other dims"
        assert not ex.replay(0, tm, dims, s, work), "another profile"
        ex.prepare(1, tm, dims, s)
        ex.execute(s, before=other)  # the last execute ran other work: its graph is not `work`'s
        ops = host.op_count
        assert not ex.replay(1, tm, dims, s, work), "the last execute ran other work"
        assert host.op_count == ops, "a refused replay enqueues nothing"
        ex.prepare(1, tm, dims, s)
        ex.execute(s, before=work)
        assert ex.replay(1, tm, dims, s, work)
        tm.generation += 1  # what a sanctioned rebinding does: the plan's bindings may be stale
        assert not ex.replay(1, tm, dims, s, work), "a tensor map changed since"
        for t in (src, dst, rows):
            t.close()
        s.close()
    finally:
        setup.close()


def test_a_replay_again_launches_only_the_graph_the_last_replay_launched(host: Backend) -> None:
    """``EngineExecutor.replay_again`` (the caller's checks stand for the step's key) launches the graph of the
    executor's last step where that step ran the same ``before`` as a graph; other work, a last step that ran
    other work, or graphs cleared since return False and enqueue nothing."""
    setup, x = _steady_llm(host)
    try:
        e = setup.engines()[0]
        ex, tm, s = e.executor, e.tensor_map, trtio.Stream.create(host)
        dims = e.cfg.decode_dims(2)
        src, dst, rows, work, other = _reversed_rows(host)
        for _ in range(2):  # a plain run, then the capture
            ex.prepare(1, tm, dims, s)
            ex.execute(s, before=work)
        ops, hits = host.op_count, ex.graph_stats.hits
        assert ex.replay_again(s, work), "the last step's plan and work: a launch"
        assert ex.graph_stats.hits == hits + 1 and host.op_count <= ops + 1, "one graph launch"
        np.testing.assert_array_equal(dst.to_numpy(), src.to_numpy()[[3, 2, 1, 0]])
        ops = host.op_count
        assert not ex.replay_again(s, other), "other work before the engine"
        ex.prepare(1, tm, dims, s)
        ex.execute(s, before=other)  # the last step ran other work: its graph is not `work`'s
        ops = host.op_count
        assert not ex.replay_again(s, work), "the last step ran other work"
        ex.clear_graphs()
        assert not ex.replay_again(s, other), "no graph since"
        assert host.op_count == ops, "a refused launch enqueues nothing"
        for t in (src, dst, rows):
            t.close()
        s.close()
    finally:
        setup.close()


def test_a_view_set_back_by_identity_keeps_its_bytes_and_its_checks(host: Backend) -> None:
    """A view that goes back and forth (a runtime's, then a step's) is set back without checks, by the identity
    of the shape tuple: its byte count comes back with it, an equal shape of other ints is checked, and a
    closed tensor still refuses."""
    t = Tensor.empty((8, 64), "float16", Location.DEVICE, backend=host)
    a, b = (8, 1, 64), (2, 64)
    for _ in range(3):
        assert t.reshape(a).shape == a and t.nbytes == 8 * 64 * 2
        assert t.reshape(b).shape == b and t.nbytes == 2 * 64 * 2
    with pytest.raises(trtio.ShapeError, match="non-integer"):
        t.reshape((8, 1, 64.5))
    t.reshape(a)
    assert t.reshape((np.int64(2), 64)).shape == b and type(t.shape[0]) is int, "numpy ints: checked, not kept"
    assert t.nbytes == 2 * 64 * 2
    for shape in (a, b, a):  # the view before is b, given as that very tuple
        t.reshape(shape)
    t.close()
    with pytest.raises(trtio.ClosedError):
        t.reshape(b)


def test_a_runtime_s_view_of_the_step_s_embeddings_is_taken_back_unchecked_after_a_steady_decode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime writing each step's embeddings through ``io.inputs_embeds.reshape(shape)`` (one tuple): on the
    ragged contract a steady decode sets the token-major view back, and the runtime's view is then the view before,
    taken back by identity: no step checks a shape."""
    from trtio._tools.bench import configs, null_engine
    from trtio._tools.dry_run import DryRunBackend

    be = DryRunBackend()
    llm, _ = configs("ragged", 256)
    with trtio.create_for_llm(null_engine(llm, be), llm, graphs=True, backend=be) as setup:
        prompt = Tensor.empty((4, 8, llm.hidden_size), "float16", Location.DEVICE, backend=be)
        setup.prefill(prompt, np.full(4, 8))
        shape = (4, 1, llm.hidden_size)
        for _ in range(3):
            setup.decode(setup.io.inputs_embeds.reshape(shape))
        checked: list[object] = []
        real = trtio._tensor._checked_view
        monkeypatch.setattr(trtio._tensor, "_checked_view", lambda *a: (checked.append(a[0]), real(*a))[1])
        for _ in range(5):
            setup.decode(setup.io.inputs_embeds.reshape(shape))
        assert setup.io.inputs_embeds.shape != shape, "the step's own view is set back (token-major)"
        assert checked == [], f"shapes checked again at steady steps: {checked}"
        prompt.close()


@contextlib.contextmanager
def _dry_run_tp(n: int = 2, backend: Backend | None = None) -> Iterator[tuple[Any, Callable[[], Tensor],
                                                                                 trtio.Stream]]:
    """A tensor-parallel LLM of ``n`` null-compute ranks on the dry-run backend (or ``backend``; graphs on),
    prefilled and decoded until its decode step is steady: (setup, the step's embeddings: rank 0's
    io.inputs_embeds viewed as a step's, stream)."""
    from trtio._setups.tensor_parallel import RankSpec, TensorParallelLLMSetup
    from trtio._tools.bench import configs, null_engine
    from trtio._tools.dry_run import DryRunBackend

    be = backend or DryRunBackend()
    llm, _ = configs("ragged", 256)
    rank = dataclasses.replace(llm, num_attention_heads=llm.num_attention_heads // n,
                               num_kv_heads=llm.num_kv_heads // n).validate()
    specs = [RankSpec(rank, r, functools.partial(null_engine, rank, be), {}) for r in range(n)]
    with TensorParallelLLMSetup(llm, specs, backend=be, graphs=True) as tp:
        s = trtio.Stream.create(be)
        prompt = Tensor.empty((4, 8, llm.hidden_size), "float16", Location.DEVICE, backend=be)
        tp.prefill(prompt, np.full(4, 8), s)
        shape = (4, 1, llm.hidden_size)

        def x() -> Tensor:
            return tp.io.inputs_embeds.reshape(shape)
        for _ in range(3):
            tp.decode(x(), s)
        try:
            yield tp, x, s
        finally:
            prompt.close()
            s.close()


def test_a_steady_tensor_parallel_decode_enqueues_every_rank_from_the_calling_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where device work runs apart from the host (here the dry-run backend), a steady decode replays every rank's
    graph from the calling thread, no hand-off to the rank threads: rank 0 on the caller's stream, each other rank
    on its own stream after waiting for the caller's; every rank's lengths advance."""
    with _dry_run_tp() as (tp, x, s):
        threads: list[tuple[int, int]] = []
        be = tp.io.inputs_embeds.backend
        rank_of = {s.handle: 0, tp._streams[1].handle: 1}  # each rank's step is a graph launch on its stream
        real = be.launch_graph

        def spy(graph: int, stream: int) -> None:
            threads.append((rank_of[stream], threading.get_ident()))
            real(graph, stream)

        monkeypatch.setattr(be, "launch_graph", spy)
        waits: list[tuple[int, int]] = []
        real_wait = be.wait_event
        monkeypatch.setattr(be, "wait_event", lambda stream, event: (waits.append((stream, event)),
                                                                     real_wait(stream, event))[1])
        hits = [r.executor.graph_stats.hits for r in tp.rank_setups]
        lengths = tp.rank_setups[1].lengths
        for _ in range(3):
            assert tp.decode(x(), s) is tp.io.output_logits
        me = threading.get_ident()
        assert threads == [(0, me), (1, me)] * 3, "every rank's step on the calling thread, rank 0 first"
        assert [r.executor.graph_stats.hits for r in tp.rank_setups] == [h + 3 for h in hits], "one replay each"
        assert (tp.rank_setups[1].lengths == lengths + 3).all() and (tp.lengths == lengths + 3).all()
        rank1 = tp._streams[1].handle
        assert [w for w in waits if w[0] == rank1] == [(rank1, tp._ready.handle)] * 3, "rank 1 waits for the caller"


def _copy_log() -> Any:
    """A dry-run backend whose copies are kept in ``copies`` as (stream, dst, src, nbytes) when they run: a copy
    enqueued into a graph capture runs (and is kept) at each launch of the graph."""
    from trtio._tools.dry_run import DryRunBackend

    class CopyLog(DryRunBackend):
        def __init__(self) -> None:
            super().__init__()
            self.copies: list[tuple[int, int, int, int]] = []

        def memcpy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
            self._run(stream, lambda: self.copies.append((stream, dst, src, nbytes)))

    return CopyLog()


def test_a_steady_tensor_parallel_decode_fed_rank_0_s_input_is_a_copy_and_a_graph_launch_per_rank() -> None:
    """Fed rank 0's io.inputs_embeds (written in place), each other rank's planned step (its public decode, fed a
    view of that input) copies it into the rank's own, on the rank's stream, and launches its graph."""
    be = _copy_log()
    with _dry_run_tp(backend=be) as (tp, x, s):
        mine = tp.rank_setups[1].io.inputs_embeds
        rank1 = tp._streams[1].handle
        for _ in range(3):
            be.copies.clear()
            ops = be.op_count
            step = x()
            tp.decode(step, s)
            assert be.op_count - ops <= 3, "a graph launch per rank, and rank 1's copy of the input, nothing else"
            assert be.copies[:1] == [(rank1, mine.data_ptr, tp.io.inputs_embeds.data_ptr, step.nbytes)]
            assert len(be.copies) <= 1, "that copy and nothing else"


def test_a_steady_tensor_parallel_decode_fed_another_tensor_copies_that_one() -> None:
    """Fed a device tensor of its own, each other rank copies that tensor (not rank 0's io.inputs_embeds) before
    it replays its graph; fed rank 0's input again, the rank's graph copies that one again."""
    be = _copy_log()
    with _dry_run_tp(backend=be) as (tp, x, s):
        mine = tp.rank_setups[1].io.inputs_embeds
        rank1 = tp._streams[1].handle
        y = Tensor.empty(x().shape, "float16", Location.DEVICE, backend=be)
        try:
            for _ in range(2):
                hits = tp.rank_setups[1].executor.graph_stats.hits
                be.copies.clear()
                tp.decode(y, s)
                copies = [c for c in be.copies if c[0] == rank1]  # rank 0 copies y into its own input too
                assert copies[:1] == [(rank1, mine.data_ptr, y.data_ptr, y.nbytes)] and len(copies) <= 1, \
                    "y copied, and nothing else"
                assert tp.rank_setups[1].executor.graph_stats.hits == hits + 1, "a steady step"
            be.copies.clear()
            step = x()
            tp.decode(step, s)
            assert be.copies[:1] == [(rank1, mine.data_ptr, tp.io.inputs_embeds.data_ptr, step.nbytes)]
            assert len(be.copies) <= 1, "that copy and nothing else"
        finally:
            y.close()


def test_a_steady_tensor_parallel_decode_checks_rank_0_once_but_replays_no_rank_whose_state_moved() -> None:
    """A steady decode checks rank 0's steady state alone (every rank holds the same slots and lengths), as long as
    no rank's state moved since the decode that planned it: a rank setup reset on its own (what the setup's
    callers must not do) is not replayed as if it still held its sequences; the step takes every rank's full
    checks, and rank 1's refuse it."""
    with _dry_run_tp() as (tp, x, s):
        hits = [r.executor.graph_stats.hits for r in tp.rank_setups]
        tp.decode(x(), s)
        assert [r.executor.graph_stats.hits for r in tp.rank_setups] == [h + 1 for h in hits], "a steady step"
        tp.rank_setups[1].reset(s)
        with pytest.raises(trtio.TrtioError, match="before prefill"):
            tp.decode(x(), s)
        assert tp.rank_setups[1].lengths.size == 0 and tp.rank_setups[1].executor.graph_stats.hits == hits[1] + 1


def test_a_steady_tensor_parallel_decode_orders_its_input_before_the_event_the_other_ranks_wait_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A steady decode fed a device tensor written on another stream: the caller's stream waits for that stream
    before the event the other ranks wait on is recorded (so every rank copies the written bytes)."""
    with _dry_run_tp() as (tp, x, s):
        be = tp.io.inputs_embeds.backend
        y = Tensor.empty(x().shape, "float16", Location.DEVICE, backend=be)
        other = trtio.Stream.create(be)
        try:
            y.copy_from(np.zeros(y.shape, np.float16), other)
            calls: list[tuple[str, int, int]] = []
            real_record, real_wait = be.record_event, be.wait_event
            monkeypatch.setattr(be, "record_event", lambda ev, st: (calls.append(("record", ev, st)),
                                                                    real_record(ev, st))[1])
            monkeypatch.setattr(be, "wait_event", lambda st, ev: (calls.append(("wait", st, ev)),
                                                                  real_wait(st, ev))[1])
            hits = tp.rank_setups[1].executor.graph_stats.hits
            tp.decode(y, s)
            assert tp.rank_setups[1].executor.graph_stats.hits == hits + 1, "a steady step"
            ready = calls.index(("record", tp._ready.handle, s.handle))
            waited = [i for i, c in enumerate(calls) if c[0] == "wait" and c[1] == s.handle]
            assert waited and waited[0] < ready, "the caller's stream waits for y's before _ready is recorded"
        finally:
            other.close()
            y.close()


def test_a_steady_tensor_parallel_decode_sets_back_every_view_that_changed() -> None:
    """The caller viewing rank 0's io.inputs_embeds as a step's embeddings, and a view of another rank's tensor
    changed after it: a steady step sets both back."""
    with _dry_run_tp() as (tp, x, s):
        plain = tp.io.inputs_embeds.shape
        for _ in range(3):
            tp.decode(x(), s)
            assert tp.io.inputs_embeds.shape == plain
        own = tp.rank_setups[1].io.inputs_embeds
        x()
        own.reshape((plain[0], 1, plain[1]))  # after rank 0's: the last change is not rank 0's
        tp.decode(x(), s)
        assert tp.io.inputs_embeds.shape == plain and own.shape == plain


def test_a_view_rank_0_s_caller_changes_sets_no_other_rank_s_views_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank is its own owner of views: the caller viewing rank 0's io.inputs_embeds as a step's embeddings
    before every steady step is a change rank 0's plan sets back alone, and no rank's plan sets its views
    wholesale; a view of rank 1's own tensor changed is still set back, by rank 1's plan."""
    import trtio._engine as engine

    with _dry_run_tp() as (tp, x, s):
        applied: list[int] = []
        real, real_set = engine._apply_views, engine._set_views
        monkeypatch.setattr(engine, "_apply_views", lambda views: (applied.append(len(views)), real(views))[1])
        monkeypatch.setattr(engine, "_set_views",
                            lambda views, log: (applied.append(len(views)), real_set(views, log))[1])
        plain = tp.io.inputs_embeds.shape
        for _ in range(3):
            tp.decode(x(), s)
            assert tp.io.inputs_embeds.shape == plain
        assert applied == [], "no plan set all its views again"
        own = tp.rank_setups[1].io.inputs_embeds
        own.reshape((plain[0], 1, plain[1]))
        tp.decode(x(), s)
        assert tp.io.inputs_embeds.shape == plain and own.shape == plain


@pytest.mark.parametrize("failing", [0, 1])
def test_a_rank_failing_in_a_steady_tensor_parallel_decode_stops_the_ranks_after_it(
        monkeypatch: pytest.MonkeyPatch, failing: int) -> None:
    """A rank whose steady step fails ends the step: the ranks after it never start. The first rank failing
    leaves every rank as it was (the setup goes on); a later one leaves the ranks before it stepped: the setup is
    broken, naming the failure."""
    with _dry_run_tp() as (tp, x, s):
        ex = tp.rank_setups[failing].executor

        def refuse(*args: Any) -> bool:
            raise trtio.EngineError("planted: the graph launch failed")

        monkeypatch.setattr(ex, "replay", refuse)
        monkeypatch.setattr(ex, "replay_again", refuse)  # a rank > 0's steady step fed rank 0's input
        before = [r.lengths.tolist() for r in tp.rank_setups]
        with pytest.raises(trtio.EngineError, match="planted"):
            tp.decode(x(), s)
        after = [r.lengths.tolist() for r in tp.rank_setups]
        if failing == 0:
            assert after == before and not tp.is_broken, "rank 1 never started"
            monkeypatch.undo()
            tp.decode(x(), s)
            assert [r.lengths.tolist() for r in tp.rank_setups] == [[v + 1 for v in b] for b in before]
        else:
            assert after[0] != before[0] and after[1] == before[1]
            assert tp.is_broken
            with pytest.raises(trtio.TrtioError, match="broken: rank 1 .*planted.*sequences differ"):
                tp.decode(x(), s)


def test_a_decode_fed_a_foreign_array_is_a_steady_step(host: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Embeddings given as a foreign array (a torch tensor here, in host memory) are checked and read once, then
    the step is a steady one like numpy's: no full decode, the logits a plain run's."""
    torch = pytest.importorskip("torch")
    setup, x = _steady_llm(host)
    plain, _ = _steady_llm(host)
    try:
        full: list[int] = []
        real = trtio.LLMSetup._decode_checked
        monkeypatch.setattr(trtio.LLMSetup, "_decode_checked", lambda self, *a: (full.append(1), real(self, *a))[1])
        for i in range(3):
            got = setup.decode(torch.from_numpy(x + np.float16(i)))
            np.testing.assert_array_equal(got.to_numpy(), plain.decode(x + np.float16(i)).to_numpy())
        assert full == [], "no step took the full path"
    finally:
        setup.close()
        plain.close()


def _kept_copies(be: Backend) -> tuple[list[tuple[int, int]], Callable[[int, int, int, int], None]]:
    """``be``'s memcpy, keeping each copy's (dst, src) in the list returned with it (patch it in, and back)."""
    copies: list[tuple[int, int]] = []
    real = be.memcpy

    def memcpy(dst: int, src: int, nbytes: int, stream: int) -> None:
        copies.append((dst, src))
        real(dst, src, nbytes, stream)

    return copies, memcpy


def test_a_steady_decode_fed_its_own_inputs_bytes_copies_nothing(host: Backend,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Embeddings written in place into the step's own input, handed over as another tensor over those bytes (a
    runtime's view of io.inputs_embeds), are read where they are: the steady step copies nothing onto itself.
    A tensor of its own is copied in, once. The logits are a plain run's either way."""
    setup, x = _steady_llm(host)
    plain, _ = _steady_llm(host)
    io = setup.io
    over = Tensor.wrap(io.inputs_embeds.data_ptr, x.shape, "float16", Location.DEVICE, backend=host)
    apart = Tensor.empty(x.shape, "float16", Location.DEVICE, backend=host)
    copies, memcpy = _kept_copies(host)
    try:
        for i, fed in enumerate((over, apart, over)):
            fed.copy_from(x + np.float16(i + 1))
            hits = setup.executor.graph_stats.hits
            monkeypatch.setattr(host, "memcpy", memcpy)
            got = setup.decode(fed)
            monkeypatch.undo()
            assert setup.executor.graph_stats.hits == hits + 1, "a steady step"
            into = [c for c in copies if c[0] == io.inputs_embeds.data_ptr]
            assert into == ([] if fed is over else [(io.inputs_embeds.data_ptr, apart.data_ptr)]), i
            copies.clear()
            np.testing.assert_array_equal(got.to_numpy(), plain.decode(x + np.float16(i + 1)).to_numpy())
        # a step that checks everything (slots named) takes it in place too
        over.copy_from(x + np.float16(4))
        monkeypatch.setattr(host, "memcpy", memcpy)
        got = setup.decode(over, slots=setup.active.tolist())
        monkeypatch.undo()
        assert [c for c in copies if c[0] == io.inputs_embeds.data_ptr] == []
        np.testing.assert_array_equal(got.to_numpy(), plain.decode(x + np.float16(4)).to_numpy())
    finally:
        over.close()
        apart.close()
        setup.close()
        plain.close()


def _read_host_torch(torch: Any, host: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steady decodes on ``host`` read torch tensors as they would on a GPU: the reader
    (trtio._foreign.TorchDeviceInput) is made for "device -1" (what get_device() says of a host tensor), with
    torch's current stream the step's (as in test_inputs.py's reader test)."""
    from trtio._foreign import TorchDeviceInput

    step = trtio.Stream.default(host)

    def reader(be: Backend, dtype: Any, shape: tuple[int, ...]) -> TorchDeviceInput:
        made = TorchDeviceInput(torch, torch.float16, shape, host)
        made._device = -1
        made._current_stream = lambda index: types.SimpleNamespace(cuda_stream=step.handle, native_handle=step.handle)
        return made

    monkeypatch.setattr("trtio._setups.llm.torch_device_input", reader)


def test_a_steady_decode_fed_a_torch_tensor_over_its_own_input_copies_nothing(
        host: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The steady decode's torch reader (trtio._foreign.TorchDeviceInput) finds the embeddings at the step's own
    input's address (a runtime's torch view of io.inputs_embeds, written in place): nothing is copied onto
    itself. On the CPU the host backend's "device" memory is host memory, read as a GPU's
    (:func:`_read_host_torch`); the GPU suite runs the same step on the H200."""
    import ctypes

    torch = pytest.importorskip("torch")
    setup, x = _steady_llm(host)
    plain, _ = _steady_llm(host)
    io = setup.io
    _read_host_torch(torch, host, monkeypatch)
    raw = (ctypes.c_uint16 * x.size).from_address(io.inputs_embeds.data_ptr)
    over = torch.frombuffer(raw, dtype=torch.float16).view(x.shape)  # the step's input, as torch sees it
    assert over.data_ptr() == io.inputs_embeds.data_ptr
    copies, memcpy = _kept_copies(host)
    real = host.memcpy
    try:
        for i in range(3):
            over.copy_(torch.from_numpy(x + np.float16(i + 1)))
            hits = setup.executor.graph_stats.hits
            monkeypatch.setattr(host, "memcpy", memcpy)
            got = setup.decode(over)
            monkeypatch.setattr(host, "memcpy", real)
            assert setup.executor.graph_stats.hits == hits + 1, "a steady step"
            assert [c for c in copies if c[0] == io.inputs_embeds.data_ptr] == [], i
            np.testing.assert_array_equal(got.to_numpy(), plain.decode(x + np.float16(i + 1)).to_numpy())
    finally:
        del over, raw
        setup.close()
        plain.close()


def test_embeddings_partly_over_the_steps_own_input_are_refused_before_any_work(
        host: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Embeddings whose bytes overlap io.inputs_embeds without starting at its address (a view 256 bytes on, in
    a batch of four whose embeddings hold 512) would be copied onto themselves in part: refused, naming the
    input, by the steady decode (fed a Tensor, or a torch tensor through the steady reader) and by a checked
    step (``slots=``, and a prefill), with nothing enqueued. The next step's logits are a plain setup's."""
    import ctypes

    torch = pytest.importorskip("torch")
    llm = EngineDir.open(default_engines_dir() / "toy-llm-ragged").config
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8]]
    step = E[np.array([[9], [10], [11], [12]])].astype(np.float16)
    setups = [trtio.create_for_llm(ReferenceEngine.from_config(llm, device="host"), llm, graphs=True) for _ in "ab"]
    setup, plain = setups
    _read_host_torch(torch, host, monkeypatch)
    try:
        for s in setups:
            s.prefill(*embed_batch(E, prompts, np.float16))
            for _ in range(3):  # steady by then
                s.decode(step)
        dst = setup.io.inputs_embeds.data_ptr
        over = Tensor.wrap(dst + 256, step.shape, "float16", Location.DEVICE, setup.io.inputs_embeds, name="over",
                           backend=host)
        raw = (ctypes.c_uint16 * step.size).from_address(dst + 256)
        torch_over = torch.frombuffer(raw, dtype=torch.float16).view(step.shape)
        attempts = {"steady, a Tensor": lambda: setup.decode(over),
                    "steady, torch": lambda: setup.decode(torch_over),
                    "checked, slots=": lambda: setup.decode(over, slots=setup.active.tolist()),
                    "prefill": lambda: setup.prefill(over, np.ones(4, np.int64))}
        for i, (what, attempt) in enumerate(attempts.items()):
            for s in setups:  # a refused steady step leaves the next one checked: one step makes it steady again
                s.decode(step + np.float16(i))
            np.testing.assert_array_equal(setup.io.output_logits.to_numpy(), plain.io.output_logits.to_numpy())
            assert setup.decode_planned, "the next decode of every sequence runs the plan as it is"
            lengths, ops = setup.lengths.tolist(), host.op_count
            with pytest.raises(trtio.InvalidValueError, match="inputs_embeds: its 512 bytes at 0x[0-9a-f]+ overlap "
                                                              "inputs_embeds"):
                attempt()
            assert (setup.lengths.tolist(), host.op_count) == (lengths, ops), f"{what}: nothing enqueued"
        np.testing.assert_array_equal(setup.decode(step + np.float16(9)).to_numpy(),
                                      plain.decode(step + np.float16(9)).to_numpy())
        over.close()
    finally:
        for s in setups:
            s.close()


def test_a_steady_decode_fed_a_torch_tensor_torch_cannot_describe_names_the_input(
        host: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch tensor of the step's dtype on its device whose shape torch cannot give (a nested one: torch raises
    RuntimeError) is passed over by the steady reader, and the general path refuses it with trtio's error naming
    the input, before any work: the next step's logits are a plain setup's."""
    torch = pytest.importorskip("torch")
    setup, x = _steady_llm(host)
    plain, _ = _steady_llm(host)
    _read_host_torch(torch, host, monkeypatch)
    rows = [torch.from_numpy(r) for r in x]  # one [1, hidden] row per sequence
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: nested tensors are a prototype
        nested = torch.nested.nested_tensor(rows)
    assert type(nested) is torch.Tensor and nested.get_device() == -1 and nested.dtype is torch.float16
    try:
        ops = host.op_count
        with pytest.raises(trtio.InvalidValueError, match="inputs_embeds"):
            setup.decode(nested)
        assert host.op_count == ops, "nothing enqueued"
        np.testing.assert_array_equal(setup.decode(x + np.float16(1)).to_numpy(),
                                      plain.decode(x + np.float16(1)).to_numpy())
    finally:
        setup.close()
        plain.close()


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_a_rounds_later_levels_and_its_verify_stage_only_what_changed(host: Backend, contract: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """In a steady round, the first proposal level stages no lengths (the last catch-up left them on the device), a
    level after the first writes only its parents into the step block (the round's lengths, roots, slots and pages
    are there from the first level; its parents too, from the last round), and verify finds the cached
    lengths the levels staged (the base's equal the draft's) in the block rather than staging them again.
    What is written is recorded by name, with whether the block already held that very constant."""
    sd = _setup(contract, True)
    try:
        levels = _two_rounds_in(sd)
        step = sd._steps.step
        writes: list[tuple[str, bool]] = []
        real_write = step.write

        def write(name: str, values: np.ndarray) -> Tensor:
            writes.append((name, step._held.get(name) is values))
            return real_write(name, values)

        real_write_at = step.write_at

        def write_at(name: str, at: int, values: np.ndarray) -> None:
            writes.append((name, step._held_at.get(name, {}).get(at) is values))
            real_write_at(name, at, values)

        real_write_all = step.write_all

        def write_all(names: tuple[str, ...], values: tuple[np.ndarray, ...]) -> None:
            writes.extend((n, step._held.get(n) is v) for n, v in zip(names, values))
            real_write_all(names, values)

        monkeypatch.setattr(step, "write", write)
        monkeypatch.setattr(step, "write_at", write_at)
        monkeypatch.setattr(step, "write_all", write_all)
        per_call: list[list[tuple[str, bool]]] = []
        parents = [np.full(TOP_K, -1)] + [lv * TOP_K + np.arange(TOP_K) // 2 for lv in range(STEPS - 1)]
        for x, p in zip(levels, parents):
            writes.clear()
            sd.draft_propose(x, parents=p)
            per_call.append(list(writes))
        writes.clear()
        sd.verify(sd.io.inputs_embeds.reshape((4, VERIFY, 64)), BINARY)
        lengths = "tree_past" if contract == "batch" else "past_lengths"
        # the round's first level reads its lengths where the last catch-up left them on the device: none staged
        assert lengths not in [name for name, _held in per_call[0]], per_call[0]
        # the parents, at each level's own place, where the block holds them since the last round (same values)
        assert per_call[1:] == [[("draft_parents", True)]] * (STEPS - 1)
        assert (lengths, True) in writes and (lengths, False) not in writes
        sd.accept([[0, 1, 3], [0, 2], [0], [0, 1]])
        sd.draft_accept(sd.io.inputs_embeds.reshape((4, 3, 64)), np.array([3, 2, 1, 2]))
        for x in levels:
            x.close()
    finally:
        sd.close()


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_level_parents_that_change_reach_the_device_and_repeated_ones_cost_no_copy(host: Backend,
                                                                                   contract: str) -> None:
    """Each level's parents stay in the step block while they repeat: a later level whose parents repeat the
    last round's is its graph alone (no staging copy). Parents the caller changed in place since, given per
    sequence, or written over by other parents are staged afresh (one copy): every round's logits are those of
    a setup without graphs fed the same."""
    sd, plain = _setup(contract, True), _setup(contract, False)
    try:
        _start(sd)
        _start(plain)
        levels, plain_levels = _level_buffers(sd)[0], _level_buffers(plain)[0]
        parents = [np.full(TOP_K, -1), np.zeros(TOP_K, np.int64), TOP_K + np.arange(TOP_K) // 2]
        per_sequence = np.array([[1, 0], [0, 1], [1, 1], [0, 0]])
        ops: dict[str, list[int]] = {}
        later: list[list[int]] = []  # the device operations of each round's second and third levels
        for r in range(6):
            if r == 3:
                parents[1][:] = [1, 0]  # changed in place: the same array, other values
            given = [parents[0], per_sequence, parents[2]] if r == 4 else parents
            ops.clear()
            got = _round(sd, r, levels, ops, parents=given)
            later.append(ops["draft_propose"][1:])
            want = _round(plain, r, plain_levels, parents=given)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
        graph = later[2][1]  # a steady level: its graph's launch
        assert later[2] == [graph, graph]
        assert later[3] == [graph + 1, graph], "level 2's parents changed in place: staged again"
        assert later[5] == [graph + 1, graph], "level 2's slot held round 4's per-sequence parents: staged again"
        _close([levels, plain_levels])
    finally:
        sd.close()
        plain.close()


def test_a_verify_whose_lengths_differ_from_the_rounds_stages_its_own(host: Backend) -> None:
    """The draft tree hands verify the round's lengths constant only where the values are the same."""
    sd = _setup("batch", True)
    try:
        _start(sd)
        levels = _level_buffers(sd)[0]
        tree = sd._tree
        assert tree.round_past(sd.base_lengths.tolist()) is None  # no level ran this round
        sd.draft_propose(levels[0], parents=np.full(TOP_K, -1))
        lengths = sd.base_lengths.tolist()
        same = tree.round_past(lengths)
        assert same is not None and same.tolist() == lengths and not same.flags.writeable
        assert tree.round_past([n + 1 for n in lengths]) is None
        for x in levels:
            x.close()
    finally:
        sd.close()


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_a_verify_after_a_catch_up_finds_its_tree_in_the_step_block(host: Backend, contract: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Verify stages its tree's constants into names of the base's own (on the ragged contract its query offsets
    too, which differ from the levels' where the draft's tree is narrower than the verify's: 6 nodes against 7
    here): the levels and the catch-up between two verifies of the same tree (paths that differ every round) leave
    them in the block, so the later verify makes no staging copy at all (its lengths are the proposal levels')."""
    sd = _setup(contract, True)
    try:
        _start(sd)
        levels = _level_buffers(sd)[0]
        for r in range(2):
            _round(sd, r, levels)
        step = sd._steps.step
        uploads: list[int] = []
        real_verify = sd.verify

        def verify(*args: object, **kwargs: object) -> Tensor:
            before = step.uploads
            out = real_verify(*args, **kwargs)  # type: ignore[arg-type]
            uploads.append(step.uploads - before)
            return out

        monkeypatch.setattr(sd, "verify", verify)
        for r in range(2, 4):  # the catch-ups before these verifies staged other paths' trees
            _round(sd, r, levels)
        assert uploads == [0, 0]
        for x in levels:
            x.close()
    finally:
        sd.close()


class _NothingKept(BoundedCache[Any, Any]):
    """A cache that keeps nothing: every level takes its full path."""

    def put(self, key: Any, value: Any) -> Any:
        return value


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_a_later_level_after_a_previous_level_of_another_shape_runs_its_own_work(host: Backend,
                                                                                 contract: str) -> None:
    """A round's later level at the same first node as last round's, where the level before it had another count
    (its parents' hidden rows lie elsewhere; same parents constant), or where its parents are given per sequence
    after shared ones: the level runs its own device work, so every logits output is that of a setup that keeps
    no level's work from round to round."""
    sd, plain = _setup(contract, True), _setup(contract, False)
    plain._tree._steady = _NothingKept()
    try:
        _start(sd)
        _start(plain)
        rng = np.random.default_rng(5)
        # (k, parents) per level: node 2's level hangs off node 1 after a level of 2 or of 1 nodes, or its parents
        # are given per sequence
        shapes = [[(2, [-1, -1]), (2, [1, 1]), (2, [2, 3])],
                  [(2, [-1, -1]), (2, [[1, 1], [0, 0], [1, 0], [0, 1]]), (2, [2, 3])],
                  [(1, [-1]), (1, [0]), (2, [1, 1])]]
        parents = {(n, lv): np.array(p) for n, shape in enumerate(shapes) for lv, (_k, p) in enumerate(shape)}
        for r in range(6):
            n = r % 3
            tokens = [rng.integers(0, 512, (4, k)) for k, _p in shapes[n]]
            tree = rng.integers(0, 512, (4, VERIFY))
            catch_up = rng.integers(0, 512, (4, 2))
            outs = []
            for setup in (sd, plain):
                got = [setup.draft_propose(E[t].astype(np.float16), parents=parents[n, lv]).to_numpy()
                       for lv, t in enumerate(tokens)]
                got.append(setup.verify(E[tree].astype(np.float16), BINARY).to_numpy())
                setup.accept([[0, 1], [0, 2], [0, 1], [0, 2]])
                got.append(setup.draft_accept(E[catch_up].astype(np.float16), np.full(4, 2)).to_numpy())
                outs.append(got)
            for g, w in zip(*outs):
                np.testing.assert_array_equal(g, w)
    finally:
        sd.close()
        plain.close()


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_a_rounds_first_level_like_the_last_rounds_reuses_its_device_work(host: Backend, contract: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A round's first level with the batch, nodes, parents and embeddings source of the last round's returns
    that round's device work as it was and stages the round's new lengths (the accepted paths moved them): every
    round's logits are those of a setup without graphs fed the same. Embeddings from another buffer take the full
    path, and still match."""
    sd, plain = _setup(contract, True), _setup(contract, False)
    try:
        _start(sd)
        _start(plain)
        kept, moved = _level_buffers(sd, 2)
        plain_levels = _level_buffers(plain)[0]
        tree = sd._tree
        firsts: list[object] = []
        real_propose = tree.propose

        def propose(*args: object, **kwargs: object) -> object:
            work = real_propose(*args, **kwargs)  # type: ignore[arg-type]
            if tree.nodes == 0:
                firsts.append(work)
            return work

        monkeypatch.setattr(tree, "propose", propose)
        for r in range(6):
            levels = moved if r == 4 else kept
            got = _round(sd, r, levels)
            want = _round(plain, r, plain_levels)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
        assert firsts[3] is firsts[2], "a steady round's first level: last round's device work"
        assert firsts[4] is not firsts[3], "embeddings from another buffer: the full path"
        _close([kept, moved, plain_levels])
    finally:
        sd.close()
        plain.close()


def test_a_steady_dflash_rounds_uploads_copy_only_what_the_round_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upload copies one byte range of the step block, from the first value a step wrote to the last. A DFlash
    round writes its cached lengths and its delta's positions every round (the rest of a repeated round is in the
    block already), so those lie next to each other: at 8B-class scale (bench's pair, dry-run backend) each upload of
    a steady round covers only tensors the round wrote, where a range reaching the delta rows across the block copied
    42 KB a round."""
    from trtio._tools import bench  # noqa: PLC0415
    from trtio._tools.dry_run import DryRunBackend  # noqa: PLC0415

    backend = DryRunBackend()
    bundle = bench.dflash_bundle(bench.configs("ragged")[1])
    b, n, hidden = bench.BATCH, bench.DFLASH_BLOCK, bench.HIDDEN
    with trtio.Stream.create(backend) as s, \
            trtio.create_for_spec_decode(bench.null_engine(bundle.base, backend),
                                         bench.null_engine(bundle.draft, backend), bundle, stream=s, graphs=True,
                                         backend=backend) as sd:
        x = sd.io.inputs_embeds
        lens = np.full(b, 16)
        sd.base_prefill(x.reshape((b, 16, hidden)), lens)
        sd.draft_prefill(x.reshape((b, n, hidden)), lens)
        step = sd._steps.step
        written: set[str] = set()
        copied: list[tuple[set[str], set[str]]] = []  # per upload: the tensors its range covers, those written

        def wrap(method: str, names: Callable[..., tuple[str, ...]]) -> None:
            real = getattr(step, method)

            def recorded(*args: Any) -> Any:
                written.update(names(*args))
                return real(*args)

            monkeypatch.setattr(step, method, recorded)

        wrap("write", lambda name, _v: (name,))
        wrap("write_all", lambda names, _v: names)
        wrap("write_at", lambda name, _at, _v: (name,))
        wrap("write_prepared", lambda group: group.names)
        real_upload = step.upload

        def upload(stream: trtio.Stream) -> None:
            lo, hi = step._lo, step._hi
            # a slot is (view, offset, itemsize, size, tensor)
            covered = {name for name, slot in step._slots.items() if lo < slot[1] + slot[3] * slot[2] and slot[1] < hi}
            copied.append((covered, set(written)))
            written.clear()
            real_upload(stream)

        monkeypatch.setattr(step, "upload", upload)
        chain, path = list(range(-1, n - 1)), list(range(n))
        for r in range(6):
            if r == 3:
                copied.clear()  # the last three rounds: steady
            sd.verify(x.reshape((b, n, hidden)), chain)
            sd.accept([path] * b)
            sd.draft_accept(x.reshape((b, n, hidden)), np.full(b, n))
        uploads = [(covered, wrote) for covered, wrote in copied if covered]
        assert uploads, "a steady round uploads its lengths"
        for covered, wrote in uploads:
            assert covered <= wrote, f"an upload copied {sorted(covered - wrote)}, which the round did not write"
