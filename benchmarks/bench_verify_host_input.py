"""Verify fed a host numpy input at 8B-class scale, against one copy of that input and decode (issue 50).

A 60-node verify tree at batch 8 takes a 3.9 MB input. Each round times ``SpecDecodeSetup.verify`` fed it as numpy,
one ``np.copyto`` of an input of the same size (the least any step spends on those bytes), and ``LLMSetup.decode``
fed a numpy step, in that order, on null-compute engines (graphs on). Prints the medians and the minima, and verify
beyond one copy as a multiple of decode (the issue's target: at most 6x). To compare commits, copy it into a worktree
of each (``git worktree add``) and run the copies alternated, on an idle machine where possible.

Run: ``python benchmarks/bench_verify_host_input.py [--backend dry-run|host|cuda] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtio import Stream, create_for_llm, create_for_spec_decode  # noqa: E402
from trtio._tools.bench import BATCH, HIDDEN, VERIFY, bench_backend, configs, null_engine  # noqa: E402


def measure(backend_kind: str, rounds: int) -> dict[str, list[float]]:
    """Seconds per call of verify, one copy and decode, ``rounds`` of each, alternated."""
    be = bench_backend(backend_kind)
    llm, bundle = configs("batch", 1024)
    assert bundle.draft is not None
    s = Stream.create(be)
    rng = np.random.default_rng(0)
    prompt = (rng.standard_normal((BATCH, 16, HIDDEN)) * 0.1).astype(np.float16)
    tree = (rng.standard_normal((BATCH, VERIFY, HIDDEN)) * 0.1).astype(np.float16)
    step = (rng.standard_normal((BATCH, 1, HIDDEN)) * 0.1).astype(np.float16)
    src, dst = tree.copy(), np.zeros_like(tree)
    binary = [-1] + [(i - 1) // 2 for i in range(1, VERIFY)]
    times: dict[str, list[float]] = {"verify": [], "one copy": [], "decode": []}
    try:
        with create_for_llm(null_engine(llm, be), llm, s, graphs=True, backend=be) as setup, \
                create_for_spec_decode(null_engine(bundle.base, be), null_engine(bundle.draft, be), bundle, stream=s,
                                       graphs=True, backend=be) as sd:
            setup.prefill(prompt, np.full(BATCH, 16), s)
            sd.base_prefill(prompt, np.full(BATCH, 16), s)
            sd.draft_prefill(prompt, np.full(BATCH, 16), s)
            for _ in range(5):  # graphs captured
                setup.decode(step, s)
                sd.verify(tree, binary, s)
            clock = time.perf_counter
            for _ in range(rounds):
                t0 = clock()
                sd.verify(tree, binary, s)
                t1 = clock()
                np.copyto(dst, src)
                t2 = clock()
                setup.decode(step, s)
                t3 = clock()
                times["verify"].append(t1 - t0)
                times["one copy"].append(t2 - t1)
                times["decode"].append(t3 - t2)
            s.synchronize()
    finally:
        s.close()
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["dry-run", "host", "cuda"], default="dry-run")
    p.add_argument("--rounds", type=int, default=400)
    args = p.parse_args(argv)
    times = measure(args.backend, args.rounds)
    for name, pick in (("median", statistics.median), ("min", min)):
        v, c, d = (pick(times[k]) * 1e6 for k in ("verify", "one copy", "decode"))
        print(f"{name}: verify {v:.1f} µs, one copy {c:.1f} µs, decode {d:.1f} µs; verify beyond one copy = "
              f"{(v - c) / d:.2f}x decode")
    return 0


if __name__ == "__main__":
    sys.exit(main())
