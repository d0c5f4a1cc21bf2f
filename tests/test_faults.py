"""Faults (issue 20): a step that fails leaves nothing behind.

The rule (``docs/faults.md``): a call that raises leaves the setup as it was before the call, so that the
same call can be retried; where a step's own work has already overwritten what a retry would read, the
setup says it is broken instead, refuses every later call but ``reset()`` and ``close()`` with one error
naming that, and ``close()`` frees everything. A CUDA-graph capture that fails after its warm-up ran the
step costs only the graph: the step returns its results.

The walk (``tests/_faultwalk.py``) makes every backend call each step helper makes, and the engine's
enqueue, fail in turn, on both setups, both contracts, with graphs off and on (first captures and replays).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _faultwalk import KINDS, Kind, Walk, live, tiny_bundle, tiny_llm

import trtio
from trtio import ClosedError, CudaError, EngineError, InvalidValueError, Location, Stream, TrtioError
from trtio._cuda.backend import Backend
from trtio._engine import EngineExecutor
from trtio._pipeline_io import PipelineIO
from trtio._staging import RING_SLOTS, UploadRing
from trtio.testing import FaultyBackend, ReferenceEngine
from trtio.testing.faulty import ENGINE_CALLS, FAULTABLE, Call

# -- the walk ---------------------------------------------------------------------------------------------

_WALKS: dict[tuple[str, str, bool], Walk] = {}
#: What may become of a fault: the step raised and its retry (and every later step) gave the fault-free
#: results; the fault cost only a graph (no error, the fault-free results); or the setup is broken.
OUTCOMES = {"retried", "absorbed", "broken"}


def _walk(kind: str, graphs: bool, backend: str = "host") -> Walk:
    key = (kind, backend, graphs)
    found = _WALKS.get(key)
    if found is None:
        device = "gpu" if backend == "cuda" else "host"
        found = _WALKS[key] = Walk(Kind(kind, trtio.get_backend(backend), device, graphs=graphs))
        found.prepare()
    return found


STEPS = [pytest.param(kind, i, id=f"{kind}-{i}-{name}") for kind in KINDS
         for i, (name, _fn) in enumerate(Kind.script_of(kind))]


def _check(walk: Walk, step: int, graphs: bool) -> list[Any]:
    gc.collect()  # what earlier tests left to the collector is freed now, not mid-walk (it would read as a leak)
    outcomes = walk.walk(step)
    assert len(outcomes) == len(walk.calls[step])
    bad = [o for o in outcomes if o.result not in OUTCOMES]
    assert not bad, "\n".join(f"{o.call}: {o.result} {o.detail}" for o in bad)
    for o in outcomes:
        if o.result == "absorbed":  # only a capture after its warm-up ran the step, or a refused capture
            assert graphs, f"{o.call}: absorbed without graphs"
        if o.result == "broken":  # only where the engine's work ran and overwrote what a retry reads
            assert o.name in ("draft_propose", "draft_accept") and o.call.method == "synchronize_stream", o
    return outcomes


# With graphs on, every step again (the capture's own failures among its calls): the slow step (-m slow) runs it.
@pytest.mark.parametrize("graphs", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["plain", "graphs"])
@pytest.mark.parametrize("kind,step", STEPS)
def test_a_step_failing_at_any_call_leaves_the_setup_as_it_was(kind: str, step: int, graphs: bool) -> None:
    """Each call the step makes (and the engine's enqueue) fails in turn: the step raises a TrtioError with
    lengths, slots, pages and the round's state unchanged, and its retry and every later step give the
    fault-free results; or (a capture failing after its warm-up) it returns the fault-free results; or the
    setup is broken, refuses the step naming that, and works again after reset(). After close() the backend's
    live allocations, events, streams and graphs are at their baseline."""
    walk = _walk(kind, graphs)
    outcomes = _check(walk, step, graphs)
    name = walk.kind.script[step][0]
    if name not in ("reset", "release", "pin_prefix"):  # host bookkeeping only: no call to make fail
        methods = {o.call.method for o in outcomes}
        engine = {"execute_async_v3", "launch_graph"} & methods  # its enqueue, or its graph's replay
        assert engine or name in ("populate_streaming", "accept"), methods
    else:
        assert not outcomes


def test_the_walk_fails_on_a_length_advanced_before_the_engine_is_enqueued() -> None:
    """The planted bug: the decode's lengths move before its engine is enqueued (and stay moved when the
    enqueue fails); the walk sees the state changed."""
    def plant(setup: Any) -> None:
        real = setup.executor.execute

        def execute(stream: Any = None, **kw: Any) -> None:
            lengths = setup.state.lengths
            lengths[setup.active] += 1  # advanced before the engine is enqueued ...
            real(stream, **kw)
            lengths[setup.active] -= 1  # ... (and where it succeeds, the step advances them as it should)

        setup.executor.execute = execute

    walk = Walk(Kind("llm-batch", trtio.get_backend("host"), graphs=False, plant=plant))
    walk.prepare()
    decode = next(i for i, (name, _fn) in enumerate(walk.kind.script) if name == "decode")
    outcomes = walk.walk(decode)
    changed = [o for o in outcomes if o.result == "state changed"]
    assert changed and all("llm.lengths" in o.detail for o in changed)
    assert {o.call.method for o in changed} >= {"execute_async_v3"}


@pytest.mark.gpu
@pytest.mark.parametrize("kind,step", STEPS)
def test_a_step_failing_at_any_call_leaves_the_setup_as_it_was_on_the_gpu(kind: str, step: int) -> None:
    """The walk through a FaultyBackend over the cuda backend, graphs on (the GPU ReferenceEngine)."""
    pytest.importorskip("cupy")
    _check(_walk(kind, True, "cuda"), step, True)


# -- factories ----------------------------------------------------------------------------------------------


def _factories(be: Backend) -> dict[str, Callable[[], Any]]:
    out: dict[str, Callable[[], Any]] = {}
    for contract in ("batch", "ragged"):
        cfg = tiny_llm(contract)
        llm = ReferenceEngine.from_config(cfg)
        out[f"create_for_llm-{contract}"] = lambda cfg=cfg, e=llm: trtio.create_for_llm(e, cfg, graphs=True,
                                                                                         backend=be)
        b = tiny_bundle(contract)
        pair = (ReferenceEngine.from_config(b.base), ReferenceEngine.from_config(b.draft))
        out[f"create_for_spec_decode-{contract}"] = lambda b=b, p=pair: trtio.create_for_spec_decode(
            *p, b, graphs=True, backend=be)
        out[f"PipelineIO.create_for_llm-{contract}"] = lambda cfg=cfg: PipelineIO.create_for_llm(cfg,
                                                                                                      backend=be)
        out[f"PipelineIO.create_for_spec_decode-{contract}"] = lambda b=b: PipelineIO.create_for_spec_decode(
            b, backend=be)
        out[f"EngineExecutor-{contract}"] = lambda e=llm: EngineExecutor(e, backend=be)
    return out


@pytest.mark.parametrize("factory", list(_factories(trtio.get_backend("host"))))
def test_a_factory_that_fails_at_any_call_frees_what_it_made_before_it_raises(factory: str) -> None:
    """Every allocation, event and stream creation, copy and synchronisation of a factory fails in turn: the
    factory raises a TrtioError, and the backend's live allocations, events, streams and graphs are back at
    their baseline at once (inside the except block, before any garbage collection)."""
    faulty = FaultyBackend("host")
    make = _factories(faulty)[factory]
    Stream.default(faulty)  # this thread's default stream lives on: part of the baseline
    make().close()  # one-time work first
    with faulty.recording() as calls:
        made = make()
    made.close()
    assert "alloc" in {c.method for c in calls}
    gc.collect()
    gc.disable()  # a leak freed only by the garbage collector must show
    try:
        for call in calls:
            base = live(faulty)
            faulty.fail(*call)
            with pytest.raises(TrtioError, match="made to fail by FaultyBackend") as caught:
                make()
            assert live(faulty) == base, f"{call}: {base} -> {live(faulty)} ({caught.value})"
            del caught
    finally:
        gc.enable()
    assert not faulty.armed


# -- what each fix is made of --------------------------------------------------------------------------------


def test_a_capture_that_fails_after_its_warm_up_costs_only_the_graph(caplog: pytest.LogCaptureFixture) -> None:
    """The warm-up ran the step: the failed capture is logged, graph_stats says why, the step returns the
    results of a fault-free run, and that binding snapshot runs without a graph from then on."""
    faulty = FaultyBackend("host")
    cfg = tiny_llm("batch")
    engine = ReferenceEngine.from_config(cfg)
    x = np.full((2, 4, 16), 0.25, np.float16)
    d = np.full((2, 1, 16), 0.5, np.float16)
    with trtio.create_for_llm(engine, cfg, graphs=True, backend=faulty) as ref:
        ref.prefill(x, [3, 4])
        want = [ref.decode(d).to_numpy() for _ in range(3)]
    with trtio.create_for_llm(engine, cfg, graphs=True, backend=faulty) as setup:
        setup.prefill(x, [3, 4])
        graphs = faulty.live_graphs
        faulty.fail("end_capture")
        with caplog.at_level(logging.WARNING, logger="trtio"):
            got = [setup.decode(d).to_numpy() for _ in range(3)]
        stats = setup.graph_stats
        assert faulty.failed == [Call("end_capture", 1)] and faulty.live_graphs == graphs
        assert "not captured: cudaStreamEndCapture: cudaErrorStreamCaptureInvalidated" in stats.last_miss_reason
        assert stats.captures == 0 and stats.hits == 0 and stats.misses == 1
        assert "the CUDA-graph capture failed after the step ran" in caplog.text
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_a_failed_warm_up_sync_of_a_proposal_breaks_the_setup_until_reset() -> None:
    """The proposal's engine ran (it overwrote the root hidden states its retry would read) and the
    synchronisation after it failed: the error says the setup is now broken, every later call but reset()
    and close() is refused naming that, and after reset() a fresh round gives a fresh setup's logits."""
    faulty = FaultyBackend("host")
    b = tiny_bundle("ragged")
    pair = (ReferenceEngine.from_config(b.base), ReferenceEngine.from_config(b.draft))
    x = np.full((2, 4, 16), 0.25, np.float16)
    lv = np.full((2, 2, 16), 0.5, np.float16)

    def round_start(sd: Any) -> np.ndarray:
        sd.base_prefill(x, [3, 4])
        sd.draft_prefill(x, [3, 4])
        return sd.draft_propose(lv, parents=[-1, -1]).to_numpy()

    with trtio.create_for_spec_decode(*pair, b, graphs=True, backend=faulty) as fresh:
        want = round_start(fresh)
    sd = trtio.create_for_spec_decode(*pair, b, graphs=True, backend=faulty)
    sd.base_prefill(x, [3, 4])
    sd.draft_prefill(x, [3, 4])
    faulty.fail("synchronize_stream")
    with pytest.raises(CudaError, match="cudaStreamSynchronize") as caught:
        sd.draft_propose(lv, parents=[-1, -1])
    assert any("now broken: reset() or close() it" in note for note in caught.value.__notes__)
    assert sd.is_broken
    refused = r"this SpecDecodeSetup is broken: the proposal's engine ran .*; reset\(\) it .* or close\(\) it"
    for call in (lambda: sd.draft_propose(lv, parents=[-1, -1]), lambda: sd.verify(np.zeros((2, 2, 16)), [-1, 0]),
                 lambda: sd.accept([[0], [0]]), lambda: sd.base_prefill(x, [3, 4]), lambda: sd.release([0]),
                 lambda: sd.pin_prefix(0, 2), lambda: sd.draft_accept(lv, [1, 1])):
        with pytest.raises(TrtioError, match=refused):
            call()
    sd.reset()
    assert not sd.is_broken
    for e in sd.engines():
        e.state.reset(None, clear=True)
    np.testing.assert_array_equal(round_start(sd), want)
    sd.close()
    with pytest.raises(ClosedError):
        sd.reset()


def test_a_broken_setup_still_frees_everything_on_close() -> None:
    faulty = FaultyBackend("host")
    b = tiny_bundle("batch")
    pair = (ReferenceEngine.from_config(b.base), ReferenceEngine.from_config(b.draft))
    Stream.default(faulty)
    gc.collect()
    base = live(faulty)
    sd = trtio.create_for_spec_decode(*pair, b, graphs=True, backend=faulty)
    x = np.full((2, 4, 16), 0.25, np.float16)
    sd.base_prefill(x, [3, 4])
    sd.draft_prefill(x, [3, 4])
    faulty.fail("synchronize_stream")
    with pytest.raises(CudaError):
        sd.draft_propose(np.zeros((2, 2, 16), np.float16), parents=[-1, -1])
    assert sd.is_broken
    sd.close()
    assert live(faulty) == base


def test_a_proposal_that_fails_leaves_the_draft_tree_as_it_was() -> None:
    """The issue's defect: a proposal that raised moved the tree (its retry proposed the next level)."""
    faulty = FaultyBackend("host")
    b = tiny_bundle("batch")
    pair = (ReferenceEngine.from_config(b.base), ReferenceEngine.from_config(b.draft))
    x = np.full((2, 4, 16), 0.25, np.float16)
    lv = np.full((2, 2, 16), 0.5, np.float16)
    with trtio.create_for_spec_decode(*pair, b, backend=faulty) as sd:
        faulty.watch(sd)
        sd.base_prefill(x, [3, 4])
        sd.draft_prefill(x, [3, 4])
        faulty.fail("execute_async_v3")
        with pytest.raises(EngineError, match="execute_async_v3 returned False"):
            sd.draft_propose(lv, parents=[-1, -1])
        assert sd.draft_tree.shape == (2, 0) and sd._tree.nodes == 0
        first = sd.draft_propose(lv, parents=[-1, -1]).to_numpy()
        assert sd.draft_tree.tolist() == [[-1, -1], [-1, -1]]
    with trtio.create_for_spec_decode(*pair, b, backend=faulty) as fresh:
        fresh.base_prefill(x, [3, 4])
        fresh.draft_prefill(x, [3, 4])
        np.testing.assert_array_equal(first, fresh.draft_propose(lv, parents=[-1, -1]).to_numpy())


def test_a_catch_up_whose_engine_fails_after_its_rows_moved_reads_them_where_they_went() -> None:
    """The catch-up puts the accepted rows in order in place before its engine; an enqueue that fails after
    that leaves them moved, and the retry reads them there (paths [0, 2, 3] and [0, 1]: the scatter writes
    rows the gather reads)."""
    faulty = FaultyBackend("host")
    b = tiny_bundle("batch")
    pair = (ReferenceEngine.from_config(b.base), ReferenceEngine.from_config(b.draft))
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 4, 16)) * 0.5).astype(np.float16)
    ver = (rng.standard_normal((2, 4, 16)) * 0.5).astype(np.float16)
    catch = (rng.standard_normal((2, 3, 16)) * 0.5).astype(np.float16)

    def to_catch_up(sd: Any) -> None:
        for e in sd.engines():
            e.state.reset(None, clear=True)
        sd.base_prefill(x, [3, 4])
        sd.draft_prefill(x, [3, 4])
        sd.verify(ver, [-1, 0, 0, 2])
        sd.accept([[0, 2, 3], [0, 1]])

    with trtio.create_for_spec_decode(*pair, b, backend=faulty) as fresh:
        to_catch_up(fresh)
        want = fresh.draft_accept(catch, [3, 2]).to_numpy()
    with trtio.create_for_spec_decode(*pair, b, backend=faulty) as sd:
        faulty.watch(sd)
        to_catch_up(sd)
        faulty.fail("execute_async_v3")
        with pytest.raises(EngineError):
            sd.draft_accept(catch, [3, 2])
        assert sd.draft_lengths.tolist() == [3, 4] and sd.base_lengths.tolist() == [6, 6]
        np.testing.assert_array_equal(sd.draft_accept(catch, [3, 2]).to_numpy(), want)


def test_an_undone_page_plan_gives_each_slot_its_limit_back() -> None:
    """A step that fails gives its pages back and each slot the page limit it had (not 0)."""
    from trtio._pages import PagePool, PageTable

    table = PageTable(PagePool(8), 2, 4, 4)
    first = table.plan([0, 1], [0, 0], [3, 6])
    first.commit()
    assert table.limit.tolist() == [4, 8]
    rows, limits, free = table.rows.copy(), table.limit.copy(), table.pool.free
    plan = table.plan([0, 1], [3, 6], [5, 7])
    plan.commit()
    assert table.limit.tolist() == [8, 8] and table.pool.free == free - 1
    plan.undo()
    assert table.rows.tolist() == rows.tolist() and table.limit.tolist() == limits.tolist()
    assert table.pool.free == free


def test_streaming_buffers_a_first_populate_that_fails_frees_them() -> None:
    """The first populate_from_prefill allocates the snapshot buffers; when its copy fails they are freed
    (and a later call allocates them again)."""
    faulty = FaultyBackend("host")
    cfg = tiny_llm("batch")
    with trtio.create_for_llm(ReferenceEngine.from_config(cfg), cfg, backend=faulty) as setup:
        setup.prefill(np.full((2, 4, 16), 0.25, np.float16), [3, 4])
        base = live(faulty)
        faulty.fail("memcpy", 2)  # the hidden states' copy
        with pytest.raises(CudaError, match="cudaMemcpyAsync"):
            setup.populate_streaming()
        streaming = setup.io.streaming_prefill
        assert live(faulty) == base and not streaming.is_allocated and streaming.input_embeds.capacity == 0
        with pytest.raises(TrtioError, match="populate_from_prefill has not been called yet"):
            streaming.ready_event  # noqa: B018 - reading it is the test
        setup.populate_streaming()
        assert streaming.is_allocated
        np.testing.assert_array_equal(streaming.input_embeds.to_numpy(), setup.io.inputs_embeds.to_numpy())


def test_an_upload_ring_whose_fence_failed_fences_the_open_group_before_reusing_a_slot() -> None:
    """The copy was enqueued but its fence failed to record: the group stays open, and the next use of its slot
    records the fence first (and waits for it), so the pinned slot is never overwritten under its copy."""
    faulty = FaultyBackend("host")
    host = trtio.Tensor.empty((1, 4), "int32", Location.PINNED, backend=faulty)
    dev = trtio.Tensor.empty((4,), "int32", backend=faulty)
    s = Stream.create(faulty)
    with UploadRing(host, faulty, slots=1) as ring:
        faulty.fail("record_event")
        with pytest.raises(CudaError, match="cudaEventRecord"):
            ring.upload(np.arange(4, dtype=np.int32), dev, s)
        records = faulty.counts["record_event"]
        ring.upload(np.arange(4, dtype=np.int32) + 1, dev, s)
        assert faulty.counts["record_event"] > records, "the open group is fenced before its slot is reused"
        np.testing.assert_array_equal(dev.to_numpy(s), np.arange(4) + 1)
    for t in (host, dev, s):
        t.close()


def test_a_step_block_whose_fence_failed_fences_the_open_group_at_the_next_upload() -> None:
    """A fence that failed to record leaves its group of copies open (no event index is skipped); the next
    upload records it before reusing a slot, and every value arrives."""
    faulty = FaultyBackend("host")
    io = PipelineIO.create_for_llm(tiny_llm("ragged"), backend=faulty)
    step = io.step
    assert step is not None
    s = Stream.create(faulty)
    for i in range(3):  # three copies of an open group; the fourth closes it with an event
        step.write("positions", np.full(4, i, np.int32))
        step.upload(s)
    groups = step.ring._groups
    step.write("positions", np.full(4, 3, np.int32))
    faulty.fail("record_event")
    with pytest.raises(CudaError, match="cudaEventRecord"):
        step.upload(s)
    assert step.ring._groups == groups and step.pending, "nothing fenced, the values still pending"
    for i in range(3, 3 + 2 * RING_SLOTS):
        step.write("positions", np.full(4, i, np.int32))
        step.upload(s)
        np.testing.assert_array_equal(step.tensors["positions"].to_numpy(s)[:4], np.full(4, i))
    io.close()
    s.close()


# -- FaultyBackend ------------------------------------------------------------------------------------------


def test_faulty_backend_fails_the_nth_call_of_a_method_once_with_the_cuda_error_of_that_call() -> None:
    faulty = FaultyBackend("host")
    s = faulty.create_stream()
    a, b = faulty.alloc(64, Location.DEVICE), faulty.alloc(64, Location.DEVICE)
    faulty.fail("memcpy", 2)
    faulty.fail("alloc", error="cudaErrorInvalidValue")
    assert faulty.armed == [Call("memcpy", 2), Call("alloc", 1)]
    faulty.memcpy(a, b, 8, s)
    with pytest.raises(CudaError, match=r"^cudaMemcpyAsync: cudaErrorInvalidValue: made to fail by FaultyBackend "
                                        r"\(call 2 of memcpy since armed\)$") as caught:
        faulty.memcpy(a, b, 8, s)
    assert caught.value.call == "cudaMemcpyAsync"
    faulty.memcpy(a, b, 8, s)  # once
    with pytest.raises(CudaError, match=r"^cudaMallocHost: cudaErrorInvalidValue"):
        faulty.alloc(64, Location.PINNED)
    live_before = faulty.live_allocations
    assert faulty.failed == [Call("memcpy", 2), Call("alloc", 1)] and not faulty.armed
    assert faulty.live_allocations == live_before == faulty.inner.live_allocations
    assert faulty.counts["memcpy"] == 3 and faulty.counts["alloc"] == 3
    for p in (a, b):
        faulty.free(p, Location.DEVICE)
    faulty.destroy_stream(s)


def test_faulty_backend_a_failed_call_does_nothing() -> None:
    faulty = FaultyBackend("host")
    host = faulty.inner
    s = faulty.create_stream()
    dst, src = faulty.alloc(8, Location.HOST), faulty.alloc(8, Location.HOST)
    faulty.memset(dst, 0, 8, s)
    faulty.memset(src, 7, 8, s)
    ops, live_events = host.op_count, host.live_events  # type: ignore[attr-defined]
    for method, call in [("memcpy", lambda: faulty.memcpy(dst, src, 8, s)),
                         ("memset", lambda: faulty.memset(dst, 7, 8, s)),
                         ("launch_host_func", lambda: faulty.launch_host_func(s, lambda: None)),
                         ("create_event", faulty.create_event)]:
        faulty.fail(method)
        with pytest.raises(CudaError):
            call()
    assert host.op_count == ops and host.live_events == live_events  # type: ignore[attr-defined]
    assert bytes(trtio._cuda._hostmem.host_view(dst, 8)) == bytes(8)
    for p in (dst, src):
        faulty.free(p, Location.HOST)
    faulty.destroy_stream(s)


def test_faulty_backend_a_failed_end_capture_still_ends_the_capture() -> None:
    faulty = FaultyBackend("host")
    s = faulty.create_stream()
    graphs = faulty.live_graphs
    faulty.begin_capture(s)
    faulty.fail("end_capture")
    with pytest.raises(CudaError, match="cudaStreamEndCapture: cudaErrorStreamCaptureInvalidated"):
        faulty.end_capture(s)
    assert not faulty.is_capturing(s) and faulty.live_graphs == graphs
    faulty.synchronize_stream(s)  # the stream works again
    faulty.destroy_stream(s)


def test_faulty_backend_records_calls_numbered_from_the_recordings_start() -> None:
    faulty = FaultyBackend("host")
    s = faulty.create_stream()
    ptr = faulty.alloc(16, Location.DEVICE)
    faulty.memset(ptr, 0, 16, s)
    with faulty.recording() as calls:
        faulty.memset(ptr, 1, 16, s)
        faulty.synchronize_stream(s)
        with faulty.recording() as inner:
            faulty.memset(ptr, 2, 16, s)
    assert calls == [Call("memset", 1), Call("synchronize_stream", 1), Call("memset", 2)]
    assert inner == [Call("memset", 1)]
    faulty.free(ptr, Location.DEVICE)
    faulty.destroy_stream(s)


def test_faulty_backend_watch_fails_an_engines_enqueue_and_refuses_its_capture() -> None:
    faulty = FaultyBackend("host")
    cfg = tiny_llm("batch")
    x = np.full((1, 2, 16), 0.25, np.float16)
    with trtio.create_for_llm(ReferenceEngine.from_config(cfg), cfg, graphs=True, backend=faulty) as setup:
        faulty.watch(setup)
        faulty.watch(setup.executor)  # twice is harmless
        faulty.fail("execute_async_v3")
        with pytest.raises(EngineError, match="execute_async_v3 returned False"):
            setup.prefill(x, [2])
        assert setup.lengths.tolist() == [] and setup.batch is None
        setup.prefill(x, [2])
        faulty.fail("is_stream_capturable")
        setup.decode(x[:, :1])
        assert "the execution context reports the stream is not capturable" in setup.graph_stats.last_miss_reason
        assert faulty.counts["execute_async_v3"] == 3 and faulty.counts["is_stream_capturable"] == 1


def test_faulty_backend_is_a_backend_with_the_wrapped_ones_extras() -> None:
    faulty = FaultyBackend("host")
    assert isinstance(faulty, Backend)
    assert faulty.name == "host" and faulty.device_id == -1 and "FaultyBackend(HostBackend())" == repr(faulty)
    assert faulty.op_count == faulty.inner.op_count  # type: ignore[attr-defined]
    assert callable(faulty.launch_host_func)  # type: ignore[attr-defined]
    faulty.fail("sync" + "hronize")
    assert "armed: synchronize#1" in repr(faulty)
    faulty.clear()
    assert not faulty.armed
    assert set(ENGINE_CALLS) == {"execute_async_v3", "is_stream_capturable"} and "alloc" in FAULTABLE


def test_faulty_backend_refuses_what_it_cannot_arm() -> None:
    faulty = FaultyBackend("host")
    with pytest.raises(InvalidValueError, match=r"FaultyBackend.fail: 'mem_info' is not a call a fault can be "
                                                r"armed on"):
        faulty.fail("mem_info")
    for nth in (0, -1, True, 1.0):
        with pytest.raises(InvalidValueError, match=r"nth = .*; expected an int >= 1"):
            faulty.fail("memcpy", nth)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="wrap the backend itself"):
        FaultyBackend(faulty)
    with pytest.raises(InvalidValueError, match="has no execution context to watch"):
        faulty.watch(object())
