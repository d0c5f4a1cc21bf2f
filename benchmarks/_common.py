"""Shared helpers for the benchmark scripts: timing and markdown tables."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def time_per_call(fn: Callable[[], object], *, repeat: int = 7, number: int = 1000,
                  sync: Callable[[], object] | None = None) -> float:
    """Median over ``repeat`` runs of the mean seconds per call of ``fn`` (called ``number`` times)."""
    fn()
    if sync:
        sync()
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        if sync:
            sync()
        runs.append((time.perf_counter() - t0) / number)
    return statistics.median(runs)


def table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def machine(backend) -> str:
    import platform

    if backend.name == "cuda":
        return f"{backend.device_name} (cuda backend), Python {platform.python_version()}"
    cores = __import__('os').cpu_count()
    return f"{platform.machine()} host, {cores} cores (host backend), Python {platform.python_version()}"
