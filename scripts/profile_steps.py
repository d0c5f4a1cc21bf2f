"""Profile step helpers (cProfile, tottime) on a backend: where a step's host time goes.

Usage: PYTHONPATH=. python3 scripts/profile_steps.py [host|cuda|dry-run] [contract] > profile.txt
"""

from __future__ import annotations

import cProfile
import pstats
import sys

import numpy as np

from trtio import Stream, get_backend
from trtio.setups import create_for_llm, create_for_spec_decode
from trtio.tools import bench


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "host"
    contract = sys.argv[2] if len(sys.argv) > 2 else "ragged"
    if kind == "dry-run":
        from trtio.tools.dry_run import DryRunBackend

        be = DryRunBackend()
    else:
        be = get_backend(kind)
    llm, bundle = bench.configs(contract, 1024)
    s = Stream.create(be)
    rng = np.random.default_rng(0)
    with create_for_llm(bench._engine(llm, be), llm, s, graphs=True, backend=be) as setup:
        setup.prefill(bench._device(be, (8, 16, 4096), rng), np.full(8, 16))
        emb = setup.io.inputs_embeds
        for _ in range(20):
            setup.decode(emb.reshape((8, 1, 4096)))
        s.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(300):
            setup.decode(emb.reshape((8, 1, 4096)))
        pr.disable()
        s.synchronize()
        print(f"== LLMSetup.decode x300 ({kind}, {contract})")
        pstats.Stats(pr).sort_stats("tottime").print_stats(22)
    sd = create_for_spec_decode(bench._engine(bundle.base, be), bench._engine(bundle.draft, be), bundle, stream=s,
                                graphs=True, backend=be)
    prompt = bench._device(be, (8, 16, 4096), rng)
    level = bench._device(be, (8, 10, 4096), rng)
    sd.base_prefill(prompt, np.full(8, 16))
    sd.draft_prefill(prompt, np.full(8, 16))
    binary = [-1] + [(i - 1) // 2 for i in range(1, 60)]
    emb = sd.io.inputs_embeds

    def round_() -> None:
        sd.draft_propose(level, parents=np.full(10, -1))
        for lv in range(1, 5):
            sd.draft_propose(level, parents=(lv - 1) * 10 + np.arange(10) // 2)
        sd.verify(emb.reshape((8, 60, 4096)), binary)
        sd.accept([[0, 1, 3, 7]] * 8)
        sd.draft_accept(emb.reshape((8, 4, 4096)), np.full(8, 4))

    for _ in range(3):
        round_()
    s.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(30):
        round_()
    pr.disable()
    s.synchronize()
    print(f"== spec-decode rounds x30 ({kind}, {contract})")
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)
    sd.close()


if __name__ == "__main__":
    main()
