"""``trtio demo``'s hybrid models: the hybrid toy directories of ``engines/`` end to end.

Each directory of :data:`~trtio.testing.toy_engines.HYBRID_DIRS` (a Gated-DeltaNet model like Qwen3.5's and a Mamba2
model like Nemotron-H's, in Edge-LLM 0.11's layout; ReferenceEngines computing the toy model's recurrences) runs
greedy decoding of the demo's prompts with ``create_for_llm`` (CUDA graphs as asked), then the admission story of
:mod:`trtio._tools.admissions` (requests admitted into slots other sequences used, a prompt pinned as a prefix whose
recurrent-state snapshot starts a later request in another slot), each request's tokens checked against its solo
greedy run. :func:`run_hybrid` returns a JSON-able summary, :func:`format_hybrid` its lines.
"""

from __future__ import annotations

import time
from typing import Any

from trtio._cuda.backend import Backend
from trtio._setups import create_for_llm
from trtio._stream import Stream
from trtio._tools.admissions import format_admissions, run_admissions, story_requests
from trtio.families.hybrid.hybrid_config import HybridConfig
from trtio.testing.toy_engines import HYBRID_DIRS, RAGGED_SEED, HybridToyEngine
from trtio.testing.toy_runtime import greedy_generate

__all__ = ["format_hybrid", "run_hybrid"]


def run_hybrid(root: Any, prompts: list[list[int]], max_new_tokens: int, backend: Backend, *,
               graphs: bool = True) -> dict[str, Any]:
    """Every hybrid toy directory under ``root`` (those present): ``{name: {"kind", "layers", "tokens",
    "admissions", "graph_stats", "decode_step_ms", "ok"}}``."""
    device = "host" if backend.name == "host" else "gpu"
    out: dict[str, Any] = {}
    for name in HYBRID_DIRS:
        path = root / name
        if not path.is_dir():
            continue
        toy = HybridToyEngine.load(path)
        cfg = toy.config
        table = toy.embedding()
        stream = Stream.create(backend)
        try:
            with create_for_llm(toy.reference_engine(device=device), cfg, stream, graphs=graphs,
                                backend=backend) as setup:
                t0 = time.perf_counter()
                tokens = greedy_generate(setup, table, prompts, max_new_tokens, stream)
                seconds = time.perf_counter() - t0
                requests = story_requests(prompts, cfg.vocab_size, RAGGED_SEED, max_new_tokens)
                story = run_admissions(setup, table, requests, stream)
                stats = setup.graph_stats["llm"]
        finally:
            stream.close()
        hybrid = cfg.feature(HybridConfig)
        out[name] = {"kind": hybrid.recurrent_kind if hybrid is not None else None, "layers": list(cfg.layer_types),
                     "use_rope": cfg.use_rope,
                     "tokens": tokens, "admissions": story,
                     "graph_stats": {"hits": stats.hits, "captures": stats.captures},
                     "decode_step_ms": 1e3 * seconds / max(max_new_tokens, 1), "ok": bool(story["equal"])}
    return out


def format_hybrid(sections: dict[str, Any], *, verbose: bool = False) -> list[str]:
    """Lines for :func:`run_hybrid`'s summary: a line per model, or with ``verbose`` its tokens, graph
    statistics and the requests' story."""
    lines = []
    for name, s in sections.items():
        mixers = ", ".join(s["layers"])
        if not verbose:
            first = " ".join(map(str, s["tokens"][0][:8]))
            lines += [f"hybrid {name} ({s['kind']}, recurrent state per slot): greedy [0] {first} ...; "
                      f"requests admitted among others give their solo tokens: {_yes(s['ok'])}", ""]
            continue
        lines += [f"== hybrid model: {name} ({s['kind']}; layers {mixers}; RoPE {'on' if s['use_rope'] else 'off'}; "
                  f"recurrent state per slot) ==",
                  f"greedy (create_for_llm): {s['decode_step_ms']:.2f} ms per token; graphs "
                  f"{s['graph_stats']['hits']} replays, {s['graph_stats']['captures']} captures",
                  *[f"  [{i}] " + " ".join(map(str, row)) for i, row in enumerate(s["tokens"])],
                  *format_admissions(s["admissions"], name), ""]
    return lines


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"
