"""Stream order and input lifetimes (``docs/architecture.md``, "Rules every module follows"), on
:class:`~trtio.testing.AsyncHostBackend`: a host backend whose device work runs behind the host, streams
interleaved in a seeded order, freed memory overwritten at once. What only a GPU showed before shows here:

- a setup's calls run in call order whatever streams (or threads' default streams) they come on;
- an input the caller drops as soon as a call returns (a temporary numpy array over pinned memory, a Tensor
  view whose owner goes, a torch tensor) is read intact by the copies the call enqueued.

Each scenario runs the same scripted steps (fixed tokens: no host read between steps, so nothing but trtio's
own ordering keeps the device in order) and compares every step's logits with a one-stream run of long-lived
inputs. The logits of each step are copied out on the step's stream into a tensor of their own.
"""

from __future__ import annotations

import gc
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import trtio
from tests._configs import tiny_bundle, tiny_llm
from trtio._cuda.backend import Location
from trtio.testing import AsyncHostBackend, ReferenceEngine, ToyWeights, toy_embedding

SEEDS = (0, 1, 2, 3)
CONTRACTS = ("batch", "ragged")
DECODES = 4


class _Runner:
    """Where each call of a script runs: ``stream(i)`` for call i on this thread, or a thread of ``pool``."""

    def __init__(self, be: trtio.Backend, mode: str) -> None:
        self.be = be
        self.mode = mode
        self.streams = [trtio.Stream.create(be), trtio.Stream.create(be)]
        self.pool = ThreadPoolExecutor(2) if mode == "threads" else None
        self._i = 0

    def __call__(self, step: Callable[[Any], Any]) -> Any:
        """Run ``step(stream)`` as the script's next call (a call of another thread ends before the next starts:
        the host waits for the call to return, never for the device)."""
        i, self._i = self._i, self._i + 1
        if self.mode == "one":
            return step(self.streams[0])
        if self.mode == "streams":
            return step(self.streams[i % 2])
        assert self.pool is not None
        # Each of the pool's two threads runs every other call on its own default stream (stream=None).
        barrier = self._worker(i % 2)
        return barrier.submit(step, None).result()

    def _worker(self, k: int) -> ThreadPoolExecutor:
        if not hasattr(self, "_pools"):
            self._pools = [ThreadPoolExecutor(1), ThreadPoolExecutor(1)]
        return self._pools[k]

    def close(self) -> None:
        for p in getattr(self, "_pools", []):
            p.shutdown()
        if self.pool is not None:
            self.pool.shutdown()
        for s in self.streams:
            s.close()


def _keep(logits: trtio.Tensor, stream: Any, be: trtio.Backend) -> trtio.Tensor:
    """A copy of a step's logits, made on the step's stream (None: this thread's default stream)."""
    out = trtio.Tensor.empty(logits.shape, logits.dtype, backend=be)
    out.copy_from(logits, stream)
    return out


class _Feed:
    """How a script's embeddings reach a step: long-lived numpy arrays (the reference), or temporaries the caller
    drops as the call returns."""

    def __init__(self, be: AsyncHostBackend, kind: str) -> None:
        self.be = be
        self.kind = kind
        self.kept: list[Any] = []  # the reference run keeps its inputs alive to the end

    def __call__(self, x: np.ndarray, stream: Any) -> Any:
        if self.kind == "long-lived":
            self.kept.append(x)
            return x
        if self.kind == "pinned numpy":  # a pinned block handed back to its allocator when dropped
            return self.be.pinned(x)
        if self.kind == "torch":
            torch = pytest.importorskip("torch")
            return torch.from_numpy(self.be.pinned(x))
        assert self.kind == "tensor view"  # a Tensor over a device block that goes with its last reference
        block = _Block(self.be, x.nbytes)
        view = trtio.Tensor.wrap(block.ptr, x.shape, trtio.DType.from_numpy(x.dtype), Location.DEVICE,
                                 backend=self.be, owner=block)
        view.copy_from(x, stream)
        return view


class _Block:
    """Device memory freed (and so overwritten, on AsyncHostBackend) when the last reference to it goes."""

    def __init__(self, be: trtio.Backend, nbytes: int) -> None:
        self.ptr = be.alloc(max(nbytes, 1), Location.DEVICE)
        weakref.finalize(self, be.free, self.ptr, Location.DEVICE)


def _llm(be: trtio.Backend, contract: str, graphs: bool) -> tuple[trtio.LLMSetup, np.ndarray]:
    cfg = tiny_llm(contract)
    engine = ReferenceEngine.from_config(cfg, backend=be)
    return trtio.create_for_llm(engine, cfg, graphs=graphs, backend=be), toy_embedding(32, 16)


def _llm_script(be: AsyncHostBackend, contract: str, graphs: bool, run: _Runner, feed: _Feed) -> np.ndarray:
    """A prefill of two prompts (wider than the embeddings ring's slot: a copy straight from the input) and
    decodes of fixed tokens, each call on the runner's stream; every step's logits, as they were."""
    setup, emb = _llm(be, contract, graphs)
    tokens = np.random.default_rng(5).integers(0, 32, (DECODES, 2))
    prompt = emb[np.array([[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 0, 0]])].astype(np.float16)
    outs = [run(lambda s: _keep(setup.prefill(feed(prompt, s), [8, 6], s), s, be))]
    for t in tokens:
        x = emb[t][:, None].astype(np.float16)
        outs.append(run(lambda s, x=x: _keep(setup.decode(feed(x, s), s), s, be)))
    gc.collect()  # temporaries the steps did not keep are freed (and overwritten) before the device runs
    got = np.concatenate([o.to_numpy() for o in outs])
    setup.close()
    return got


def _spec_script(be: AsyncHostBackend, contract: str, graphs: bool, run: _Runner, feed: _Feed) -> np.ndarray:
    """Two speculative rounds over fixed tokens, trees and paths (base_prefill, draft_prefill, two proposal
    levels, verify, accept, draft_accept), each call on the runner's stream; every step's logits."""
    b = tiny_bundle(contract)
    assert b.draft is not None
    bw = ToyWeights.generate(b.base, 0)
    base = ReferenceEngine.from_config(b.base, backend=be, weights=bw)
    draft = ReferenceEngine.from_config(b.draft, backend=be, weights=ToyWeights.generate_draft(b.draft, bw, 0))
    setup = trtio.create_for_spec_decode(base, draft, b, graphs=graphs, backend=be)
    emb = toy_embedding(32, 16)
    rng = np.random.default_rng(11)

    def e(shape: tuple[int, ...]) -> np.ndarray:
        return emb[rng.integers(0, 32, shape)].astype(np.float16)

    outs = [run(lambda s: _keep(setup.base_prefill(feed(e((2, 5)), s), [5, 4], s), s, be)),
            run(lambda s: _keep(setup.draft_prefill(feed(e((2, 5)), s), [5, 4], s), s, be))]
    for _ in range(2):
        outs.append(run(lambda s: _keep(setup.draft_propose(feed(e((2, 2)), s), s, parents=[-1, -1]), s, be)))
        outs.append(run(lambda s: _keep(setup.draft_propose(feed(e((2, 2)), s), s, parents=[0, 1]), s, be)))
        outs.append(run(lambda s: _keep(setup.verify(feed(e((2, 4)), s), [-1, 0, 0, 1], s), s, be)))
        run(lambda s: setup.accept([[0, 1, 3], [0, 2]], s))
        outs.append(run(lambda s: _keep(setup.draft_accept(feed(e((2, 3)), s), [3, 2], s), s, be)))
    gc.collect()
    got = np.concatenate([o.to_numpy().reshape(-1) for o in outs])
    setup.close()
    return got


SCRIPTS = {"llm": _llm_script, "spec": _spec_script}


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # temporaries dropped unclosed, on purpose
        yield


def _run(script: str, seed: int, contract: str, graphs: bool, mode: str, feed: str) -> np.ndarray:
    be = AsyncHostBackend(seed)
    run = _Runner(be, mode)
    try:
        return SCRIPTS[script](be, contract, graphs, run, _Feed(be, feed))
    finally:
        run.close()


_REFERENCE: dict[tuple[str, str, bool], np.ndarray] = {}


def _reference(script: str, contract: str, graphs: bool) -> np.ndarray:
    key = (script, contract, graphs)
    if key not in _REFERENCE:
        _REFERENCE[key] = _run(script, 0, contract, graphs, "one", "long-lived")
    return _REFERENCE[key]


@pytest.mark.parametrize("seeds", [SEEDS[1:3], pytest.param(SEEDS, marks=pytest.mark.slow)],
                         ids=["2-seeds", "all-seeds"])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("contract", CONTRACTS)
@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("mode", ["streams", "threads"])
def test_calls_on_two_streams_or_two_threads_run_in_call_order(mode: str, script: str, contract: str,
                                                              graphs: bool, seeds: tuple[int, ...]) -> None:
    """Calls alternating between two streams, or between two threads' default streams, give a one-stream run's
    logits for every seed's interleaving of the device's streams (two seeds in the quick suite, all at full
    count: -m slow)."""
    want = _reference(script, contract, graphs)
    assert np.isfinite(want).all()
    for seed in seeds:
        got = _run(script, seed, contract, graphs, mode, "long-lived")
        np.testing.assert_array_equal(got, want, err_msg=f"seed {seed}")


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("contract", CONTRACTS)
@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("feed", ["pinned numpy", "tensor view", "torch"])
def test_inputs_dropped_as_the_call_returns_are_read_intact(feed: str, script: str, contract: str,
                                                            graphs: bool) -> None:
    """Steps fed temporaries that the caller drops as each call returns (and the allocator overwrites at once)
    give what steps fed long-lived arrays give: each step keeps what its copies read until they have run."""
    want = _reference(script, contract, graphs)
    for seed in SEEDS[:2]:
        got = _run(script, seed, contract, graphs, "streams", feed)
        np.testing.assert_array_equal(got, want, err_msg=f"seed {seed}")


def _reused_script(be: AsyncHostBackend, contract: str, graphs: bool, run: _Runner, kind: str) -> np.ndarray:
    """Decodes fed each input twice in a row (a runtime feeding one buffer to consecutive steps), the caller
    dropping it after its second call (``kind`` "temporary": a Tensor view whose block goes with its last reference)
    or keeping every input (``kind`` "long-lived"); every step's logits."""
    setup, emb = _llm(be, contract, graphs)
    prompt = emb[np.array([[1, 2, 3, 4], [5, 6, 7, 8]])].astype(np.float16)
    outs = [run(lambda s: _keep(setup.prefill(prompt, [4, 3], s), s, be))]
    kept: list[Any] = []
    for t in ([9, 10], [11, 12], [13, 14]):
        x = emb[np.array(t)][:, None].astype(np.float16)
        if kind == "temporary":
            block = _Block(be, x.nbytes)
            fed: Any = trtio.Tensor.wrap(block.ptr, x.shape, trtio.DType.FLOAT16, Location.DEVICE, backend=be,
                                         owner=block)
            run(lambda s, fed=fed, x=x: fed.copy_from(x, s))
            del block
        else:
            fed = x
            kept.append(fed)
        for _ in range(2):
            outs.append(run(lambda s, fed=fed: _keep(setup.decode(fed, s), s, be)))
        del fed  # a temporary goes with the setup's last reference to it
    gc.collect()
    got = np.concatenate([o.to_numpy() for o in outs])
    setup.close()
    return got


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("contract", CONTRACTS)
def test_an_input_fed_to_consecutive_calls_then_dropped_is_read_intact(contract: str, graphs: bool) -> None:
    """A setup keeps the last input a call read referenced until a later call reads another (a loop feeding one
    buffer pays no slot of the ring of inputs in flight for it); the input then replaced is kept until the
    copies of every call that read it have run: the logits are those of long-lived inputs."""
    runs = []
    for kind in ("long-lived", "temporary"):
        be = AsyncHostBackend(1)
        run = _Runner(be, "streams")
        try:
            runs.append(_reused_script(be, contract, graphs, run, kind))
        finally:
            run.close()
    assert np.isfinite(runs[0]).all()
    np.testing.assert_array_equal(runs[1], runs[0])


# -- the backend itself ---------------------------------------------------------------------------------


def test_async_host_runs_work_only_when_the_host_waits_and_honours_stream_waits() -> None:
    """Work is queued, not run, until the host waits; a stream wait orders another stream's work after it for
    every seed; without the wait some seed runs the reader first."""
    orders = set()
    for seed in range(16):
        for wait in (True, False):
            be = AsyncHostBackend(seed)
            a, b = trtio.Stream.create(be), trtio.Stream.create(be)
            t = trtio.Tensor.empty((4,), "int32", backend=be)
            out = np.zeros(4, np.int32)
            t.copy_from(np.full(4, 7, np.int32), a)
            assert be.pending == 1, "queued, not run"
            if wait:
                trtio.Event.create(be).record(a).wait(b)
            b_out = trtio.Tensor.empty((4,), "int32", backend=be)
            be.memcpy(b_out.data_ptr, t.data_ptr, 16, b.handle)
            be.synchronize()
            b_out.copy_to(out)
            if wait:
                assert out.tolist() == [7] * 4, f"seed {seed}: the wait orders the read after the write"
            orders.add(out[0] == 7)
    assert orders == {True, False}, "without the wait, the seeds interleave both ways"


def test_async_host_overwrites_freed_memory_and_keeps_it_mapped_for_queued_work() -> None:
    be = AsyncHostBackend(0)
    s = trtio.Stream.create(be)
    src = trtio.Tensor.empty((4,), "float32", backend=be)
    src.copy_from(np.ones(4, np.float32), s)
    dst = trtio.Tensor.empty((4,), "float32", backend=be)
    dst.copy_from(src, s)
    src.close()  # freed while the copy that reads it is queued
    got = dst.to_numpy(s)
    assert np.isnan(got).all(), "the queued copy read the poison, not the freed bytes"
    pinned = be.pinned(np.arange(4, dtype=np.float32))
    dst.copy_from(pinned, s)
    del pinned
    gc.collect()
    assert np.isnan(dst.to_numpy(s)).all(), "a pinned temporary dropped before its copy ran"


def test_async_host_takes_pageable_memory_at_once() -> None:
    """A copy from memory the backend did not allocate reads it when issued (CUDA stages pageable memory)."""
    be = AsyncHostBackend(0)
    s = trtio.Stream.create(be)
    dst = trtio.Tensor.empty((4,), "int32", backend=be)
    src = np.arange(4, dtype=np.int32)
    dst.copy_from(src, s)
    src[:] = -5
    assert dst.to_numpy(s).tolist() == [0, 1, 2, 3]


def test_async_host_reports_a_wait_that_can_never_complete() -> None:
    be = AsyncHostBackend(0)
    a, b = trtio.Stream.create(be), trtio.Stream.create(be)
    ea, eb = trtio.Event.create(be), trtio.Event.create(be)
    t = trtio.Tensor.empty((1,), "int32", backend=be)
    t.zero_(a)
    t.zero_(b)
    ea.record(a)
    eb.record(b)
    ea.wait(b)
    eb.wait(a)  # each waits for the other's earlier work: fine; both queues drain
    be.synchronize()
    assert be.pending == 0
    with pytest.raises(trtio.InvalidValueError, match="poison"):
        AsyncHostBackend(poison=300)


def test_reference_engines_launch_on_the_backend_they_are_given() -> None:
    be = AsyncHostBackend(1)
    cfg = tiny_llm("ragged")
    engine = ReferenceEngine.from_config(cfg, backend=be)
    assert engine.trtio_backend is be
    with pytest.raises(trtio.InvalidValueError, match="disagrees"):
        ReferenceEngine.from_config(cfg, backend=be, device="gpu")
    setup = trtio.create_for_llm(engine, cfg, backend=be)
    assert setup.io.inputs_embeds.backend is be
    ops = be.op_count
    setup.prefill(toy_embedding(32, 16)[None, :3].astype(np.float16), [3])
    assert be.pending > 0 and be.op_count > ops, "the step's work, the engine's included, is queued on it"
    setup.close()


def test_threads_take_turns_on_a_setup_without_a_stream_of_their_own() -> None:
    """A setup handed from thread to thread (stream=None: each thread's default stream) orders each call after
    the last one's work, on the host backend as on the async one."""
    be = trtio.get_backend("host")
    setup, emb = _llm(be, "ragged", False)
    done = threading.Event()

    def other() -> None:
        setup.decode(emb[[1, 2]][:, None].astype(np.float16))
        done.set()

    setup.prefill(emb[None, [3, 4, 5]].repeat(2, 0).astype(np.float16), [3, 3])
    threading.Thread(target=other).start()
    assert done.wait(30)
    assert setup.lengths.tolist() == [4, 4]
    setup.close()


# -- the same on a GPU: a delayed stream, torch and CuPy temporaries -----------------------------------------

_DELAY = 50_000_000  # GPU cycles (~25 ms on an H200) a stream sleeps before a step's work


def _delayed(torch: Any, stream: Any) -> None:
    """Hold ``stream`` back: a long kernel on it before the step's work."""
    ext = torch.cuda.ExternalStream(int(stream.handle)) if stream is not None else \
        torch.cuda.ExternalStream(trtio.Stream.default("cuda").handle)
    with torch.cuda.stream(ext):
        torch.cuda._sleep(_DELAY)


class _GpuFeed:
    """Long-lived device arrays, or torch / CuPy temporaries dropped as the call returns, their blocks handed to
    the next allocation (filled at once on the library's own stream) while the step's copy may still be queued."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.kept: list[Any] = []
        self.torch = pytest.importorskip("torch")
        self.cupy = pytest.importorskip("cupy") if kind == "cupy" else None

    def __call__(self, x: np.ndarray, stream: Any) -> Any:
        torch = self.torch
        if self.kind == "long-lived":
            t = torch.from_numpy(x).cuda()
            torch.cuda.synchronize()
            self.kept.append(t)
            return t
        if self.kind == "torch":
            return torch.from_numpy(x).cuda()
        assert self.cupy is not None
        return self.cupy.asarray(x)

    def churn(self, nbytes: int) -> None:
        """What a runtime does next: allocate (and write) blocks of the size the temporary freed."""
        if self.kind == "torch":
            self.torch.full((nbytes // 2,), 7.0, dtype=self.torch.float16, device="cuda")
        elif self.kind == "cupy":
            self.cupy.full((nbytes // 2,), 7.0, dtype=self.cupy.float16)


def _gpu_llm_script(contract: str, graphs: bool, mode: str, feed: _GpuFeed) -> np.ndarray:
    torch = feed.torch
    be = trtio.get_backend("cuda")
    cfg = tiny_llm(contract)
    setup = trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="gpu"), cfg, graphs=graphs, backend=be)
    emb = toy_embedding(32, 16)
    streams = [trtio.Stream.create(be), trtio.Stream.create(be)]
    pools = [ThreadPoolExecutor(1), ThreadPoolExecutor(1)]
    outs: list[trtio.Tensor] = []

    def call(i: int, step: Callable[[Any], trtio.Tensor], nbytes: int) -> None:
        def run(s: Any) -> None:
            _delayed(torch, s)
            outs.append(_keep(step(s), s, be))
            feed.churn(nbytes)

        if mode == "one":
            run(streams[0])
        elif mode == "streams":
            run(streams[i % 2])
        else:
            pools[i % 2].submit(run, None).result()

    prompt = emb[np.array([[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 0, 0]])].astype(np.float16)
    call(0, lambda s: setup.prefill(feed(prompt, s), [8, 6], s), prompt.nbytes)
    for i, t in enumerate(np.random.default_rng(5).integers(0, 32, (DECODES, 2))):
        x = emb[t][:, None].astype(np.float16)
        call(i + 1, lambda s, x=x: setup.decode(feed(x, s), s), x.nbytes)
    got = np.concatenate([o.to_numpy() for o in outs])
    for p in pools:
        p.shutdown()
    setup.close()
    for s in streams:
        s.close()
    return got


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("contract", CONTRACTS)
def test_on_the_gpu_calls_on_a_delayed_stream_and_the_next_on_another_run_in_order(contract: str,
                                                                                    graphs: bool) -> None:
    """Each call's stream is held back ~25 ms before its work; the next call comes on the other stream (or the
    other thread's default stream) at once: its stream waits for the last call's work (an event), so the
    logits equal a one-stream run's."""
    want = _gpu_llm_script(contract, graphs, "one", _GpuFeed("long-lived"))
    for mode in ("streams", "threads"):
        got = _gpu_llm_script(contract, graphs, mode, _GpuFeed("long-lived"))
        np.testing.assert_array_equal(got, want, err_msg=mode)


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("feed", ["torch", "cupy"])
def test_on_the_gpu_temporaries_whose_blocks_are_reused_at_once_are_read_intact(feed: str, graphs: bool) -> None:
    """A torch or CuPy temporary fed to a step on a delayed stream and dropped as the call returns: its caching
    allocator hands the block to the next allocation, written at once on the library's own stream, while the
    step's copy is still queued. The step keeps the temporary until its copy has run: the logits are those of
    long-lived inputs."""
    want = _gpu_llm_script("ragged", graphs, "one", _GpuFeed("long-lived"))
    got = _gpu_llm_script("ragged", graphs, "streams", _GpuFeed(feed))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("contract", CONTRACTS)
def test_a_loop_fed_device_inputs_far_ahead_of_the_device_never_waits_for_it(contract: str) -> None:
    """The device runs nothing until the host waits (AsyncHostBackend): forty decodes fed device tensors, each
    kept until its copy has run, leave the host as far ahead as it goes; keeping them costs no host wait (a
    decode never synchronises the host), and the logits come out right when the host finally reads them."""
    be = AsyncHostBackend(0)
    setup, emb = _llm(be, contract, True)
    feed = _Feed(be, "tensor view")
    s = trtio.Stream.create(be)
    setup.prefill(emb[None, [1, 2, 3]].repeat(2, 0).astype(np.float16), [3, 3], s)
    syncs = be.sync_count
    for t in range(28):  # to the KV capacity (32)
        setup.decode(feed(emb[[t % 32, (t + 5) % 32]][:, None].astype(np.float16), s), s)
        if t == 0:  # the first decode captured the graph (a capture waits for its warm-up)
            syncs = be.sync_count
    assert be.sync_count == syncs and be.pending > 27, "the host ran ahead without one wait"
    assert np.isfinite(setup.io.output_logits.to_numpy(s)).all()
    setup.close()
    s.close()
