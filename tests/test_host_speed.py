"""scripts/host_speed.py: the per-core Python speed scripts/gpu_session.sh records beside the cuda benchmarks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import host_speed  # noqa: E402 - from scripts/, as gpu_session.sh runs it

sys.path.remove(str(ROOT / "scripts"))

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")


def test_every_allowed_core_is_timed_on_itself_and_the_affinity_comes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    allowed = os.sched_getaffinity(0)
    seen: list[set[int]] = []
    real = host_speed.loop_ms

    def timed(n: int, repeats: int) -> float:  # the real loop, noting the core set it ran on
        seen.append(os.sched_getaffinity(0))
        return real(n, repeats)

    monkeypatch.setattr(host_speed, "loop_ms", timed)
    speeds = host_speed.per_core(1000, 3)
    assert list(speeds) == sorted(allowed)
    assert seen == [{core} for core in sorted(allowed)]
    assert all(ms > 0 for ms in speeds.values())
    assert os.sched_getaffinity(0) == allowed


def test_the_line_names_each_core_and_the_extremes(capsys: pytest.CaptureFixture[str]) -> None:
    assert host_speed.format_speeds({0: 6.5, 3: 12.25}) == \
        "pure-Python loop ms per core: 0:6.50 3:12.25 (fastest 6.50, slowest 12.25)"
    assert host_speed.main(["--repeats", "1", "--loop", "10"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("pure-Python loop ms per core: ")
    assert line.count(":") == len(os.sched_getaffinity(0)) + 1
