"""Threads: every thread that passes ``stream=None`` gets a default stream of its own.

The stress test runs create / prefill / decode / close cycles of an LLM setup with CUDA graphs on
8 threads at once, half on their thread's default stream and half on a stream of their own, with
the interpreter switching threads as often as it can, on both engine contracts (batch-major, and
Edge-LLM's token-major ragged one with its paged KV cache). Every thread must produce exactly the
tokens of a single-threaded run. Before the default stream was per thread, captures of one thread
recorded the work of others (host backend: wrong tokens, heap corruption, SIGSEGV; cuda:
CUDA_ERROR_STREAM_CAPTURE_INVALIDATED). It is a correctness test, not a timed one.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from _configs import bundle, llm_config

import trtio
from trtio._cuda.backend import Backend
from trtio.testing import ReferenceEngine, toy_embedding
from trtio.testing.toy_runtime import greedy_generate, spec_generate

THREADS = 8
CYCLES = 40  # per thread, at full count (-m slow, and on the GPU); the quick host runs take QUICK_CYCLES
QUICK_CYCLES = 10
NEW_TOKENS = 4
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Make the interpreter switch threads as often as it can, so that races show up."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _run_threads(n: int, work: Callable[[int], None]) -> list[BaseException]:
    """Run ``work(i)`` on ``n`` threads started together; return what they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def main(i: int) -> None:
        try:
            start.wait()
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=main, args=(i,), name=f"worker-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


CONTRACTS = ["batch", "ragged"]


def _config(contract: str) -> trtio.LLMEngineConfig:
    if contract == "ragged":  # one layer: a ragged setup costs more to create and step on the host
        return llm_config(contract="ragged", kv_page_size=64, num_attention_layers=1)
    return llm_config()


def _stress(backend_kind: str, device: str, contract: str, cycles: int = CYCLES) -> None:
    be = trtio.get_backend(backend_kind)
    cfg = _config(contract)
    engine = ReferenceEngine.from_config(cfg, device=device)  # one engine, one context per setup (as TensorRT)
    E = toy_embedding(cfg.vocab_size, cfg.hidden_size, 0)

    def generate(stream: Any) -> list[list[int]]:
        with trtio.create_for_llm(engine, cfg, stream, graphs=True, backend=be) as setup:
            tokens = greedy_generate(setup, E, PROMPTS, NEW_TOKENS, stream)
            assert setup.contract == contract
            assert setup.graph_stats.captures >= 1, "the decode steps ran as captured graphs"
            return tokens

    _every_thread_gives_the_tokens_of_one(be, generate, cycles)


def _every_thread_gives_the_tokens_of_one(be: Backend, generate: Callable[[Any], list[list[int]]],
                                          cycles: int) -> None:
    """``generate(stream)`` ``cycles`` times on each of THREADS threads (half on their default stream, half
    on a stream of their own): no thread raises, and every run's tokens equal a single-threaded run's."""
    expected = generate(None)
    got: dict[tuple[int, int], list[list[int]]] = {}

    def work(i: int) -> None:
        own = trtio.Stream.create(be) if i % 2 else None
        try:
            for cycle in range(cycles):
                got[i, cycle] = generate(own)
        finally:
            if own is not None:
                own.close()

    errors = _run_threads(THREADS, work)
    assert not errors, f"{len(errors)} thread(s) failed; first: {errors[0]!r}"
    wrong = sorted(key for key, tokens in got.items() if tokens != expected)
    assert len(got) == THREADS * cycles
    assert not wrong, f"{len(wrong)} runs gave other tokens than a single thread, e.g. (thread, cycle) {wrong[0]}"


SPEC_CYCLES = 6
QUICK_SPEC_CYCLES = 2


def _spec_stress(backend_kind: str, device: str, cycles: int = SPEC_CYCLES) -> None:
    """The same with spec-decode setups (a base and a draft sharing context memory, both captured), fewer
    cycles: every thread's tokens equal a single-threaded run's."""
    be = trtio.get_backend(backend_kind)
    b = bundle(draft_vocab=512)
    engines = (ReferenceEngine.from_config(b.base, device=device), ReferenceEngine.from_config(b.draft, device=device))
    E = toy_embedding(b.base.vocab_size, b.base.hidden_size, 0)

    def generate(stream: Any) -> list[list[int]]:
        with trtio.create_for_spec_decode(*engines, b, stream=stream, graphs=True, backend=be) as sd:
            tokens, _ = spec_generate(sd, E, PROMPTS, NEW_TOKENS + 2, stream=stream)
            assert all(stats.captures >= 1 for stats in sd.graph_stats.values())
            return tokens

    _every_thread_gives_the_tokens_of_one(be, generate, cycles)


def test_a_capture_on_one_thread_records_none_of_another_threads_work(host: Backend) -> None:
    """Thread A captures on its default stream; thread B works with stream=None meanwhile: B's copy runs
    at once (it is not recorded into A's graph) and B may allocate (the capture rule is per thread)."""
    a_capturing, b_done = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def thread_a() -> None:
        s = trtio.Stream.default(host)
        host.begin_capture(s.handle)
        a_capturing.set()
        b_done.wait()
        graph = host.end_capture(s.handle)
        seen["a_recorded"] = len(host._graphs[graph])  # type: ignore[attr-defined]
        host.destroy_graph(graph)

    def thread_b() -> None:
        a_capturing.wait()
        try:
            with trtio.Tensor.empty((4,), "int32", name="b", backend=host) as t:
                t.copy_from(np.arange(4, dtype=np.int32))
                seen["b_values"] = t.to_numpy().tolist()
        finally:
            b_done.set()

    errors = _run_threads(2, lambda i: (thread_a if i == 0 else thread_b)())
    assert not errors, errors
    assert seen == {"a_recorded": 0, "b_values": [0, 1, 2, 3]}


@pytest.mark.parametrize("cycles", [QUICK_CYCLES, pytest.param(CYCLES, marks=pytest.mark.slow)])
@pytest.mark.parametrize("contract", CONTRACTS)
@pytest.mark.usefixtures("fast_switching")
def test_threads_capturing_graphs_on_the_host_backend(contract: str, cycles: int) -> None:
    _stress("host", "host", contract, cycles)


@pytest.mark.gpu
@pytest.mark.parametrize("contract", CONTRACTS)
@pytest.mark.usefixtures("fast_switching")
def test_threads_capturing_graphs_on_the_cuda_backend(contract: str) -> None:
    pytest.importorskip("cupy")
    _stress("cuda", "gpu", contract)


@pytest.mark.parametrize("cycles", [QUICK_SPEC_CYCLES, pytest.param(SPEC_CYCLES, marks=pytest.mark.slow)])
@pytest.mark.usefixtures("fast_switching")
def test_threads_capturing_spec_decode_graphs_on_the_host_backend(cycles: int) -> None:
    _spec_stress("host", "host", cycles)


@pytest.mark.gpu
@pytest.mark.usefixtures("fast_switching")
def test_threads_capturing_spec_decode_graphs_on_the_cuda_backend() -> None:
    pytest.importorskip("cupy")
    _spec_stress("cuda", "gpu")
