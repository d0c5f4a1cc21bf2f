"""Setup time of create_for_llm for an 8B-class config, and populate_from_prefill copy throughput
against a raw device-to-device copy of the same bytes, side by side in one run.

Run: ``python benchmarks/bench_setup_and_streaming.py [--backend host|cuda]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, table, time_per_call  # noqa: E402
from bench_pipeline_memory import BASE_8B  # noqa: E402

import trtio  # noqa: E402
from trtio import LLMEngineConfig, PipelineIO, Stream, create_for_llm  # noqa: E402
from trtio.testing import ReferenceEngine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="host", choices=["host", "cuda"])
    args = ap.parse_args()
    be = trtio.get_backend(args.backend)
    cfg = LLMEngineConfig(**{**BASE_8B, "max_kv_cache_capacity": 4096}).validate()
    device = "gpu" if args.backend == "cuda" else "host"
    eng = ReferenceEngine.from_config(cfg, device=device, null_compute=True)

    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        setup = create_for_llm(eng, cfg, backend=be)
        times.append(time.perf_counter() - t0)
        rep = setup.memory_report()
        setup.close()
    t_setup = statistics.median(times)

    s = Stream.create(be)
    io = PipelineIO.create_for_llm(cfg, s, backend=be)
    batch, seq, h = 8, 2048, cfg.hidden_size
    live_in = io.inputs_embeds.reshape((batch, seq, h))
    live_h = io.output_hidden_states.reshape((batch, seq, h))
    sp = io.streaming_prefill
    sp.populate_from_prefill(live_in, live_h, batch, seq, h, io.max_batch, io.max_seq, s)  # allocate once
    nbytes = 2 * live_in.nbytes
    dst_a, dst_b = sp.input_embeds.data_ptr, sp.engine_hidden_states.data_ptr

    def populate():
        sp.populate_from_prefill(live_in, live_h, batch, seq, h, io.max_batch, io.max_seq, s)

    def raw():
        be.memcpy(dst_a, live_in.data_ptr, live_in.nbytes, s.handle)
        be.memcpy(dst_b, live_h.data_ptr, live_h.nbytes, s.handle)

    number = 20 if args.backend == "host" else 50
    t_pop = time_per_call(populate, number=number, sync=s.synchronize)
    t_raw = time_per_call(raw, number=number, sync=s.synchronize)
    io.close()
    s.close()
    gib = 1 << 30
    print(f"### Setup and streaming prefill — {machine(be)}\n")
    print(table(["what", "value"], [
        ["create_for_llm, 8B-class config (36 layers, batch 8, KV 4096), null-compute engine: median of 5",
         f"{t_setup * 1e3:.1f} ms"],
        ["bytes it allocates (PipelineIO + KV state + context memory + staging)",
         f"{rep.total_allocated / gib:.2f} GiB"],
    ]))
    print()
    print(table(["copy of the prefill snapshot (2 x 8x2048x4096 fp16 = "
                 f"{nbytes / gib:.2f} GiB)", "ms", "GiB/s", "ratio"], [
        ["raw: two backend.memcpy calls", f"{t_raw * 1e3:.3f}", f"{nbytes / t_raw / gib:.1f}", "1.00"],
        ["populate_from_prefill", f"{t_pop * 1e3:.3f}", f"{nbytes / t_pop / gib:.1f}", f"{t_pop / t_raw:.2f}"],
    ]))


if __name__ == "__main__":
    main()
