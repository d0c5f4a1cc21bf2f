"""Memory-layer costs: one 60-slice arena vs 60 separate allocations; reshape + copy_from of a small tensor.

Run: ``python benchmarks/bench_memory_layer.py [--backend auto|host|cuda]``. Prints a markdown
section for docs/BENCHMARKS.md. All numbers of one section come from one run, side by side.
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
from trtio import Location, Stream, Tensor  # noqa: E402
from trtio._memory import Arena, TensorRequest  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="auto")
    args = ap.parse_args()
    be = trtio.get_backend(args.backend)
    rng = np.random.default_rng(0)
    sizes = [int(x) for x in rng.integers(1 << 10, 1 << 20, size=60)]  # 1 KiB .. 1 MiB
    requests = [TensorRequest.of(f"t{i}", (n,), "uint8") for i, n in enumerate(sizes)]

    def arena_cycle():
        Arena(requests, backend=be).close()

    def separate_cycle():
        ts = [Tensor.empty((n,), "uint8", backend=be) for n in sizes]
        for t in ts:
            t.close()

    before = be.alloc_count
    arena_cycle()
    arena_allocs = be.alloc_count - before
    before = be.alloc_count
    separate_cycle()
    separate_allocs = be.alloc_count - before
    t_arena = time_per_call(arena_cycle, number=50)
    t_sep = time_per_call(separate_cycle, number=50)
    arena = Arena(requests, backend=be)
    rep = arena.report()
    arena.close()

    s = Stream.create(be)
    dev = Tensor.empty((64,), "int32", backend=be)
    pinned = Tensor.empty((64,), "int32", Location.PINNED, backend=be)
    host = np.arange(8, dtype=np.int32)
    state = {"n": 8}

    def trtio_step():
        n = 4 if state["n"] == 8 else 8
        state["n"] = n
        dev.reshape((n,))
        pinned.reshape((n,))
        pinned.copy_from(host[:n])
        dev.copy_from(pinned, s)

    dst, src, stream = dev.data_ptr, pinned.data_ptr, s.handle

    def floor_step():
        be.memcpy(dst, src, 32, stream)

    t_step = time_per_call(trtio_step, number=5000, sync=s.synchronize)
    t_floor = time_per_call(floor_step, number=5000, sync=s.synchronize)
    s.synchronize()
    for x in (dev, pinned, s):
        x.close()

    print(f"### Memory layer — {machine(be)}\n")
    print(table(["what", "backend allocations", "µs per cycle (alloc + free)", "ratio"], [
        ["one arena, 60 slices", arena_allocs, f"{t_arena * 1e6:.1f}", "1.00"],
        ["60 separate Tensor.empty", separate_allocs, f"{t_sep * 1e6:.1f}", f"{t_sep / t_arena:.2f}"],
    ]))
    print(f"\nArena bytes: required {rep.total_required}, allocated {rep.total_allocated} "
          f"(ratio {rep.ratio:.4f}; alignment only).\n")
    print(table(["what", "µs per call", "ratio to floor"], [
        ["floor: backend.memcpy of 32 bytes (pinned -> device)", f"{t_floor * 1e6:.2f}", "1.00"],
        ["trtio: reshape x2 + stage into pinned + copy_from (device)", f"{t_step * 1e6:.2f}",
         f"{t_step / t_floor:.2f}"],
    ]))


if __name__ == "__main__":
    main()
