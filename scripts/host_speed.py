"""How fast this host runs plain Python, core by core: the context an absolute µs figure of ``trtio bench`` needs.

A step's host cost is trtio's Python, so a table of µs per call is only as fast as the core it ran on. On a shared
(virtual) machine one core can run Python at half the speed of another at the same moment, and which cores are slow
changes from minute to minute (docs/BENCHMARKS.md). This times one fixed pure-Python loop (``LOOP`` additions, the
median of ``REPEATS``) pinned to each core the process may use, and prints one line: the core and its milliseconds.
scripts/gpu_session.sh runs it before and after the benchmarks.

Usage: python3 scripts/host_speed.py [--repeats N] [--loop N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

LOOP = 200_000
REPEATS = 9


def loop_ms(n: int = LOOP, repeats: int = REPEATS) -> float:
    """The median time, in milliseconds, of ``repeats`` runs of a loop of ``n`` integer additions."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        total = 0
        for i in range(n):
            total += i
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def per_core(n: int = LOOP, repeats: int = REPEATS) -> dict[int, float]:
    """:func:`loop_ms` pinned to each core this process may run on, in order; the affinity is restored after."""
    allowed = sorted(os.sched_getaffinity(0))
    out: dict[int, float] = {}
    try:
        for core in allowed:
            os.sched_setaffinity(0, {core})
            out[core] = loop_ms(n, repeats)
    finally:
        os.sched_setaffinity(0, allowed)
    return out


def format_speeds(speeds: dict[int, float]) -> str:
    """One line: ``core:ms`` for each core, then the fastest and the slowest."""
    cells = " ".join(f"{core}:{ms:.2f}" for core, ms in speeds.items())
    return f"pure-Python loop ms per core: {cells} (fastest {min(speeds.values()):.2f}, slowest " \
           f"{max(speeds.values()):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=REPEATS, help="runs of the loop per core (the median is kept)")
    parser.add_argument("--loop", type=int, default=LOOP, help="additions per run")
    args = parser.parse_args(argv)
    print(format_speeds(per_core(args.loop, args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
