"""Inclusive host time of selected functions during steady decode / spec rounds (perf_counter wrappers).

Usage: PYTHONPATH=. python3 scripts/time_calls.py [host|cuda|dry-run] [contract]
A function-level profile of the same steps: PYTHONPATH=. python3 -m cProfile -s tottime scripts/time_calls.py ...
"""

from __future__ import annotations

import collections
import functools
import sys
import time

import numpy as np

from trtio import Stream, get_backend
from trtio._setups import create_for_llm, create_for_spec_decode
from trtio._tools import bench

TOTAL: dict[str, float] = collections.defaultdict(float)
COUNT: dict[str, int] = collections.defaultdict(int)


def wrap(owner: object, attr: str, label: str) -> None:
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def timed(*a, **k):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            TOTAL[label] += time.perf_counter() - t
            COUNT[label] += 1

    setattr(owner, attr, timed)


def report(title: str, calls: int) -> None:
    print(f"== {title}: inclusive µs per step")
    for k, v in sorted(TOTAL.items(), key=lambda kv: -kv[1]):
        print(f"  {k:40s} {v / calls * 1e6:8.1f}  ({COUNT[k] / calls:.1f} calls)")
    TOTAL.clear()
    COUNT.clear()


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "host"
    contract = sys.argv[2] if len(sys.argv) > 2 else "ragged"
    if kind == "dry-run":
        from trtio._tools.dry_run import DryRunBackend

        be = DryRunBackend()
    else:
        be = get_backend(kind)
    import trtio._cuda.kernels as kernels
    import trtio._engine as engine
    import trtio._staging as staging
    from trtio import _ops as ops
    from trtio import _state as state
    from trtio._setups import spec_decode as ssd

    for m in ("memcpy", "memcpy_2d", "record_event", "query_event", "launch_graph", "wait_event", "memset", "fill"):
        if hasattr(type(be), m):
            wrap(be, m, f"backend.{m}")
    wrap(kernels.Launch, "__call__", "kernels.Launch")
    wrap(staging.StepStaging, "write", "StepStaging.write")
    wrap(staging.StepStaging, "upload", "StepStaging.upload")
    wrap(engine.EngineExecutor, "prepare", "Executor.prepare")
    wrap(engine.EngineExecutor, "execute", "Executor.execute")
    wrap(ops, "copy_rows", "ops.copy_rows")
    wrap(state.EngineState, "commit_grid", "EngineState.commit_grid")
    wrap(ops.KVCommit, "run", "KVCommit.run")
    wrap(staging.UploadRing, "upload", "UploadRing.upload")
    for name in ("draft_propose", "verify", "accept", "draft_accept", "_draft_level", "_batch_level", "_check_parents",
                 "_stage_tree_embeds"):
        if hasattr(ssd.SpecDecodeSetup, name):
            wrap(ssd.SpecDecodeSetup, name, f"Spec.{name}")
    llm, bundle = bench.configs(contract, 1024)
    s = Stream.create(be)
    rng = np.random.default_rng(0)
    with create_for_llm(bench.null_engine(llm, be), llm, s, graphs=True, backend=be) as setup:
        setup.prefill(bench.device_tensor(be, (8, 16, 4096), rng), np.full(8, 16))
        emb = setup.io.inputs_embeds
        for _ in range(20):
            setup.decode(emb.reshape((8, 1, 4096)))
        s.synchronize()
        TOTAL.clear()
        COUNT.clear()
        t = time.perf_counter()
        for _ in range(300):
            setup.decode(emb.reshape((8, 1, 4096)))
        TOTAL["(decode total)"] = time.perf_counter() - t
        s.synchronize()
        report(f"LLMSetup.decode ({kind}, {contract})", 300)
    sd = create_for_spec_decode(bench.null_engine(bundle.base, be), bench.null_engine(bundle.draft, be), bundle,
                                stream=s, graphs=True, backend=be)
    prompt = bench.device_tensor(be, (8, 16, 4096), rng)
    level = bench.device_tensor(be, (8, 10, 4096), rng)
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
    TOTAL.clear()
    COUNT.clear()
    for _ in range(50):
        round_()
    s.synchronize()
    report(f"spec round ({kind}, {contract})", 50)
    sd.close()


if __name__ == "__main__":
    main()
