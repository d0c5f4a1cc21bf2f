"""How long the device takes over each step helper's graph at ``trtio bench`` scale (H200 check).

For each step graph of a steady round (decode, a proposal level, verify, the catch-up) and for the KV commit
of ``accept``: the median host time of one launch followed by a stream synchronisation (the tail a call
adds when the caller waits), and the time per launch of 300 launches in a row (the device's own time).
Needs the cuda backend.

Usage: PYTHONPATH=. python3 scripts/graph_latency.py [batch|ragged]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from trtio import Stream, get_backend
from trtio._setups import create_for_llm, create_for_spec_decode
from trtio._tools import bench


def _latency(launch: Callable[[], None], s: Stream, n: int = 300) -> tuple[float, float]:
    for _ in range(20):
        launch()
        s.synchronize()
    alone = []
    for _ in range(n):
        t = time.perf_counter()
        launch()
        s.synchronize()
        alone.append(time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(n):
        launch()
    s.synchronize()
    return statistics.median(alone) * 1e6, (time.perf_counter() - t) / n * 1e6


def main() -> None:
    contract = sys.argv[1] if len(sys.argv) > 1 else "ragged"
    be = get_backend("cuda")
    llm, bundle = bench.configs(contract, 4096)
    s = Stream.create(be)
    rng = np.random.default_rng(0)
    rows: list[tuple[str, str, tuple[float, float]]] = []

    def graph_of(executor: object) -> tuple[Callable[[], None], str]:
        plan = executor._plan  # type: ignore[attr-defined]
        graph = plan.graph
        return (lambda: be.launch_graph(graph, s.handle)), " + ".join(type(w).__name__ for w in plan.graph_before)

    with create_for_llm(bench._engine(llm, be), llm, s, graphs=True, backend=be) as setup:
        setup.prefill(bench._device(be, (8, 16, 4096), rng), np.full(8, 16))
        emb = setup.io.inputs_embeds
        for _ in range(5):
            setup.decode(emb.reshape((8, 1, 4096)))
        launch, work = graph_of(setup.engines()[0].executor)
        rows.append(("LLMSetup.decode", work, _latency(launch, s)))
    draft_cfg = bundle.draft
    assert draft_cfg is not None
    with create_for_spec_decode(bench._engine(bundle.base, be), bench._engine(draft_cfg, be), bundle, stream=s,
                                graphs=True, backend=be) as sd:
        prompt, level = bench._device(be, (8, 16, 4096), rng), bench._device(be, (8, 10, 4096), rng)
        sd.base_prefill(prompt, np.full(8, 16))
        sd.draft_prefill(prompt, np.full(8, 16))
        binary = [-1] + [(i - 1) // 2 for i in range(1, 60)]
        emb = sd.io.inputs_embeds
        for r in range(5):
            last = r == 4
            sd.draft_propose(level, parents=np.full(10, -1))
            if last:
                rows.append(("draft_propose, level 0", *_swap(graph_of(sd.draft.executor), s)))
            for lv in range(1, 5):
                sd.draft_propose(level, parents=(lv - 1) * 10 + np.arange(10) // 2)
            if last:
                rows.append(("draft_propose, level 4", *_swap(graph_of(sd.draft.executor), s)))
            sd.verify(emb.reshape((8, 60, 4096)), binary)
            if last:
                rows.append(("verify", *_swap(graph_of(sd.base.executor), s)))
            sd.accept([[0, 1, 3, 7]] * 8)
            sd.draft_accept(emb.reshape((8, 4, 4096)), np.full(8, 4))
            if last:
                rows.append(("draft_accept", *_swap(graph_of(sd.draft.executor), s)))
        state = sd.base.state
        moves = state._moves.tensors["kv_moves"]
        rows.append(("accept's KV commit", "KVCommit", _latency(lambda: state._commit.run(moves, 8, 6, s), s)))
    print(f"{contract}: a bare synchronisation {_latency(lambda: None, s)[0]:.1f} µs")
    print("| step graph | device work before the engine | launch + sync µs | µs per launch, 300 in a row |")
    print("| --- | --- | ---: | ---: |")
    for name, work, (alone, each) in rows:
        print(f"| {name} | {work} | {alone:.1f} | {each:.1f} |")
    s.close()


def _swap(found: tuple[Callable[[], None], str], s: Stream) -> tuple[str, tuple[float, float]]:
    launch, work = found
    return work, _latency(launch, s)


if __name__ == "__main__":
    main()
