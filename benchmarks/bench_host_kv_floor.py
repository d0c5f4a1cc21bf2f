"""What numpy alone needs to move the KV entries one ``accept`` moves at ``trtio bench`` scale, beside
``LLMSetup.decode`` and ``SpecDecodeSetup.accept`` on the host backend, in one run (issue 11).

The host backend runs a step's device work in numpy, in the calling thread, so its ``accept`` costs at
least what numpy needs to move the accepted entries of every cache. This script measures that floor
without trtio: caches laid out as the bench's (36 layers, K and V, batch 8, 8 KV heads of 128, fp16,
1024 tokens per sequence; batch contract: contiguous ``[B, H, C, D]`` caches, one 256-byte piece per
head; ragged contract: paged pools, one 2 KB piece per entry), paths of 4 nodes ``[0, 1, 3, 7]`` (two
entries per sequence move, the root and node 1 stay), one numpy fancy-index move over every cache, as
trtio's host kernel does. "cold": each round's paths start 4 tokens further on, as in a real run, so the
entries are new to the CPU's caches; "hot": the same entries every round. A contiguous copy of as many
bytes is the bound no gather reaches.

Run: ``python benchmarks/bench_host_kv_floor.py [--rounds N]``. Prints a markdown section for
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, table  # noqa: E402

from trtio import get_backend  # noqa: E402
from trtio._tools import bench  # noqa: E402

LAYERS, BATCH, HEADS, DIM, CAPACITY, PAGE = 36, bench.BATCH, 8, 128, 1024, 128
SOURCES, DESTINATIONS = (3, 7), (2, 3)  # path [0, 1, 3, 7]: nodes 3 and 7 move to slots 2 and 3


def _moves(contract: str, start: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(source pieces, destination pieces, piece bytes, pieces per cache) of one accept in one cache."""
    seq = np.arange(BATCH)[:, None]
    src = start + np.array(SOURCES)[None, :]
    dst = start + np.array(DESTINATIONS)[None, :]
    if contract == "batch":  # [B, H, C, D]: a piece per (sequence, head, slot)
        heads = np.arange(HEADS)[None, :, None]
        rows = (seq[..., None] * HEADS + heads) * CAPACITY
        return ((rows + src[:, None, :]).ravel(), (rows + dst[:, None, :]).ravel(), DIM * 2,
                BATCH * HEADS * CAPACITY)
    # Paged pools [2, P, page, H, D] (K pages, then V pages), each sequence's pages in a row of its own.
    pages = CAPACITY // PAGE
    kv = np.arange(2)[None, :, None]
    first = (kv * BATCH + seq[..., None]) * pages * PAGE
    return ((first + src[:, None, :]).ravel(), (first + dst[:, None, :]).ravel(), HEADS * DIM * 2,
            2 * BATCH * CAPACITY)


def _floor(contract: str, rounds: int) -> tuple[float, float, float, int]:
    """Median µs of numpy's move of one accept's entries (cold, hot), a contiguous copy of as many bytes,
    and the bytes moved."""
    _, _, piece, per_cache = _moves(contract, 0)
    arena = np.ones(2 * LAYERS * per_cache * piece if contract == "batch" else LAYERS * per_cache * piece,
                    np.uint8)  # written once: page faults are not part of the floor
    n_caches = arena.size // (per_cache * piece)
    caches = arena.view(np.dtype((np.void, piece))).reshape(n_caches, per_cache)

    def move(start: int) -> float:
        s, d, _, _ = _moves(contract, start)
        t0 = time.perf_counter()
        caches[:, d] = caches[:, s]
        return time.perf_counter() - t0

    cold = [move(16 + 4 * r) for r in range(rounds)]
    hot = [move(16) for _ in range(rounds)]
    nbytes = n_caches * _moves(contract, 0)[0].size * piece
    a, b = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    copy = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        np.copyto(b, a)
        copy.append(time.perf_counter() - t0)
    return (statistics.median(cold[2:]) * 1e6, statistics.median(hot[2:]) * 1e6,
            statistics.median(copy[2:]) * 1e6, nbytes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args()
    results = bench.run("host", steps=100, rounds=10)
    rows = []
    for contract in ("batch", "ragged"):
        decode = results[contract]["LLMSetup.decode"].synced
        accept = results[contract]["SpecDecodeSetup.accept"]
        cold, hot, copy, nbytes = _floor(contract, args.rounds)
        rows.append([contract, f"{nbytes / 2**20:.2f}", f"{decode:.1f}", f"{10 * decode:.0f}", f"{accept.synced:.1f}",
                     f"{accept.work:.1f}", f"{cold:.1f}", f"{hot:.1f}", f"{copy:.1f}"])
    print(f"### An accept's KV moves in numpy alone — {machine(get_backend('host'))}\n")
    print(table(["contract", "MiB moved", "decode µs", "10x decode µs", "accept µs", "of which device work µs",
                 "numpy alone, cold µs", "numpy alone, hot µs", "contiguous copy of as many bytes µs"], rows))


if __name__ == "__main__":
    main()
