"""Decode-step host cost on a 36-layer, KV-bound, null-compute engine: what trtio adds per step.

Three ways to run the same steady decode step, measured side by side in one run:

* floor: the hand-written loop — ``set_input_shape`` for every dynamic input, then
  ``execute_async_v3`` (what a runtime without a binding manager does each step);
* trtio plain: ``EngineExecutor.prepare`` + ``execute`` (no TensorRT call at all when nothing
  changed, then the enqueue);
* trtio graph replay: the same with CUDA graphs (the host backend replays recorded calls).

Also shown for reference: ``execute_async_v3`` alone, the lower bound of any per-step loop.
The engine is ``ReferenceEngine(null_compute=True)``: full I/O contract and validation, no math,
so the numbers are binding overhead only.

Run: ``python benchmarks/bench_decode_step.py [--backend host|cuda] [--steps N]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, table, time_per_call  # noqa: E402

import trtio  # noqa: E402
from trtio import LLMEngineConfig, Stream, create_for_llm  # noqa: E402
from trtio._engine import DECODE_PROFILE  # noqa: E402
from trtio.testing import ReferenceEngine  # noqa: E402

CFG = dict(hidden_size=4096, vocab_size=151936, max_supported_batch_size=8, max_supported_input_length=128,
           max_kv_cache_capacity=4096, num_attention_layers=36, num_attention_heads=32, num_kv_heads=8,
           head_dim=128, rotary_dim=128)


def setup_for(graphs: bool, backend: str, batch: int):
    cfg = LLMEngineConfig(**CFG).validate()
    device = "gpu" if backend == "cuda" else "host"
    eng = ReferenceEngine.from_config(cfg, device=device, null_compute=True)
    setup = create_for_llm(eng, cfg, graphs=graphs, backend=backend)
    emb = np.zeros((batch, 4, cfg.hidden_size), np.float16)
    setup.prefill(emb, np.full(batch, 4))
    one = np.zeros((batch, 1, cfg.hidden_size), np.float16)
    setup.decode(one)  # switch to the decode profile, bind everything once
    return cfg, setup


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="host", choices=["host", "cuda"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args()
    be = trtio.get_backend(args.backend)
    cfg, plain = setup_for(False, args.backend, args.batch)
    _, graphed = setup_for(True, args.backend, args.batch)
    s = Stream.create(be)
    dims = cfg.decode_dims(args.batch)

    ex = plain.executor
    ctx = ex.context
    tm = plain.tensor_map
    shapes = [(info.name, tuple(ctx.get_tensor_shape(info.name))) for info in ex.io.inputs
              if any(d < 0 for d in info.shape)]

    def floor_step():
        for name, shape in shapes:
            ctx.set_input_shape(name, shape)
        ctx.execute_async_v3(s.handle)

    def execute_only():
        ctx.execute_async_v3(s.handle)

    def trtio_plain():
        ex.prepare(DECODE_PROFILE, tm, dims, s)
        ex.execute(s)

    gex, gtm = graphed.executor, graphed.tensor_map

    def trtio_graph():
        gex.prepare(DECODE_PROFILE, gtm, dims, s)
        gex.execute(s)

    trtio_graph()  # capture once
    n = args.steps
    t_floor = time_per_call(floor_step, number=n, sync=s.synchronize)
    t_exec = time_per_call(execute_only, number=n, sync=s.synchronize)
    t_plain = time_per_call(trtio_plain, number=n, sync=s.synchronize)
    t_graph = time_per_call(trtio_graph, number=n, sync=s.synchronize)
    calls_before = dict(ctx.calls)
    for _ in range(10):
        trtio_plain()
    set_calls = sum(ctx.calls[k] - calls_before[k] for k in ("set_input_shape", "set_tensor_address"))
    stats = gex.graph_stats
    n_io = len(ex.io.tensors)
    print(f"### Decode step, 36-layer KV-bound null-compute engine ({n_io} I/O tensors, batch {args.batch}) "
          f"— {machine(be)}\n")
    print(table(["per step", "µs", "ratio to floor"], [
        [f"floor: set_input_shape x{len(shapes)} + execute_async_v3", f"{t_floor * 1e6:.2f}", "1.00"],
        ["trtio plain: prepare + execute", f"{t_plain * 1e6:.2f}", f"{t_plain / t_floor:.2f}"],
        ["trtio graph replay: prepare + execute(graph)", f"{t_graph * 1e6:.2f}", f"{t_graph / t_floor:.2f}"],
        ["(reference) execute_async_v3 alone", f"{t_exec * 1e6:.2f}", f"{t_exec / t_floor:.2f}"],
    ]))
    print(f"\nTensorRT set_* calls made by 10 steady trtio steps: {set_calls}. "
          f"Graph stats: {stats.captures} capture(s), {stats.hits} hits, {stats.misses} miss(es).")
    for x in (plain, graphed, s):
        x.close()


if __name__ == "__main__":
    main()
