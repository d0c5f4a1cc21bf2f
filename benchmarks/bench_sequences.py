"""Sequences that come and go (issue 18), at 8B-class scale on the ragged contract, beside whole-batch steps.

A decode of 8 slots after admissions and releases against a decode of a batch prefilled whole, an admission's
prefill against a whole-batch prefill of the same prompt, and the host time of ``release`` and ``pin_prefix``,
with the device operations and host synchronisations each call makes, on a null-compute engine, so every
figure is trtio's own cost. The same as ``trtio bench --sequences``.

Run: ``python benchmarks/bench_sequences.py [--backend host|cuda|dry-run] [--steps N]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtio._cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", "--sequences", *sys.argv[1:]]))
