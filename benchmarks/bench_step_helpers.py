"""Every step helper at 8B-class scale, both contracts, beside ``prepare + execute`` alone (issue 11).

Host time per call (with and without a stream synchronisation) and device operations per call (counted by
the host and dry-run backends) for ``LLMSetup.decode`` and every ``SpecDecodeSetup`` step, on
null-compute ReferenceEngines, so every figure is trtio's own cost. The same as ``trtio bench``.

Run: ``python benchmarks/bench_step_helpers.py [--backend host|cuda|dry-run] [--steps N] [--rounds N]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtio._cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
