"""``trtio demo``'s Gemma 4 toy: ``engines/toy-gemma4-ragged`` end to end (issue 34).

The toy Gemma-4-like directory (per-layer KV geometry: sliding layers of 1 x 16, full layers of 1 x 32; a sliding
window of 16 tokens; two RoPE tables; layers 4 and 5 reading layers 3's and 2's KV; per-layer embeddings; a
ReferenceEngine computing ``trtio.testing.reference_gemma4``'s model) decodes the demo's prompts greedily with
``create_for_llm`` (CUDA graphs as asked), its tables gathered on the device by
:meth:`EngineDir.embeddings <trtio.edgellm.EngineDir.embeddings>` (``inputs_embeds`` and ``ple_embeds``), twice:
with the bounded SWA pool the directory's config builds for, and with full SWA storage (the config's
``num_swa_pages`` set below the bounded budget, which forces full mode). The sequences grow past three windows
(49 new tokens at least; given 160 or more, past a page and a window too, so the bounded windows retire their first
page); the check: both give the same tokens. :func:`run_gemma4` returns a JSON-able summary,
:func:`format_gemma4` its lines.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from trtio._config import LLMEngineConfig
from trtio._cuda.backend import Backend
from trtio._embeddings import TokenEmbeddings
from trtio._setups import create_for_llm
from trtio._stream import Stream
from trtio.edgellm import EngineDir
from trtio.families.gemma4.gemma4_config import Gemma4Config
from trtio.testing.reference_engine import ReferenceEngine

__all__ = ["GEMMA4_DIR", "format_gemma4", "run_gemma4"]

#: The toy Gemma 4 directory under the engines folder.
GEMMA4_DIR = "toy-gemma4-ragged"


def run_gemma4(root: Path, prompts: list[list[int]], max_new_tokens: int, backend: Backend, *,
               graphs: bool = True) -> dict[str, Any]:
    """``{GEMMA4_DIR: {"window", "swa_mode", "new_tokens", "tokens", "graph_stats", "ok"}}`` where ``root`` holds
    the toy Gemma 4 directory, else ``{}``. ``tokens``: the bounded run's first ``max_new_tokens`` of each prompt;
    each sequence decodes ``max(max_new_tokens, 3 x window + 1)`` new tokens."""
    path = Path(root) / GEMMA4_DIR
    if not path.is_dir():
        return {}
    d = EngineDir.open(path)
    cfg = d.config
    g = cfg.feature(Gemma4Config)
    assert g is not None
    count = max(max_new_tokens, 3 * g.sliding_window + 1)
    full_g = dataclasses.replace(g, num_swa_pages=1)  # below the budget: full
    full_cfg = dataclasses.replace(cfg, features=tuple(full_g if f is g else f for f in cfg.features))
    device = "host" if backend.name == "host" else "gpu"
    runs: dict[str, Any] = {}
    stream = Stream.create(backend)
    try:
        with d.embeddings(backend, stream) as emb:
            for name, c in (("bounded", cfg), ("full", full_cfg)):
                runs[name] = _greedy(c, emb, prompts, count, backend, stream, device, graphs)
    finally:
        stream.close()
    bounded, full = runs["bounded"], runs["full"]
    return {GEMMA4_DIR: {"window": g.sliding_window, "swa_mode": bounded["mode"], "full_mode": full["mode"],
                         "new_tokens": count, "tokens": [row[:max_new_tokens] for row in bounded["tokens"]],
                         "graph_stats": bounded["graph_stats"],
                         "ok": bool(bounded["tokens"] == full["tokens"] and bounded["bounded"]
                                    and not full["bounded"])}}


def _greedy(cfg: LLMEngineConfig, emb: TokenEmbeddings, prompts: list[list[int]], count: int, backend: Backend,
            stream: Stream, device: str, graphs: bool) -> dict[str, Any]:
    """Greedy decoding of ``prompts`` (one prefill each into its own slot, then decodes of every sequence) on the
    toy Gemma 4 engine of ``cfg``, fed ``emb``'s rows."""
    engine = ReferenceEngine.from_config(cfg, device=device)
    out: list[list[int]] = []
    with create_for_llm(engine, cfg, stream, graphs=graphs, backend=backend) as setup:
        mode = setup.state.kv_parts.get("swa_mode")
        assert mode is not None
        for slot, prompt in enumerate(prompts):
            x, ple = emb.embed(np.array([prompt]), stream)  # type: ignore[misc]
            logits = setup.prefill(x, [len(prompt)], stream, slots=[slot], ple_embeds=ple)
            out.append([int(logits.to_numpy(stream).argmax(-1)[0])])
        for _ in range(count - 1):
            x, ple = emb.embed(np.array([[row[-1]] for row in out]), stream)  # type: ignore[misc]
            nxt = setup.decode(x, stream, ple_embeds=ple).to_numpy(stream).argmax(-1)
            for row, token in zip(out, nxt):
                row.append(int(token))
        stats = setup.graph_stats["llm"]
        return {"mode": mode.describe(), "bounded": mode.bounded, "tokens": out,
                "graph_stats": {"hits": stats.hits, "captures": stats.captures}}


def format_gemma4(sections: dict[str, Any], *, verbose: bool = False) -> list[str]:
    """Lines for :func:`run_gemma4`'s summary: a line per model, or with ``verbose`` its tokens, SWA modes and graph
    statistics."""
    lines = []
    for name, s in sections.items():
        ok = "yes" if s["ok"] else "NO"
        if not verbose:
            first = " ".join(map(str, s["tokens"][0][:8]))
            lines += [f"gemma4 {name} (per-layer KV, bounded SWA, dual RoPE, KV sharing, PLE): greedy [0] {first} ...; "
                      f"bounded SWA equals full SWA over {s['new_tokens']} tokens: {ok}", ""]
            continue
        lines += [f"== Gemma 4 model: {name} (window {s['window']} tokens) ==",
                  f"SWA: {s['swa_mode']}", f"compared with: {s['full_mode']}",
                  f"graphs {s['graph_stats']['hits']} replays, {s['graph_stats']['captures']} captures",
                  *[f"  [{i}] " + " ".join(map(str, row)) for i, row in enumerate(s["tokens"])],
                  f"bounded SWA equals full SWA over {s['new_tokens']} new tokens: {ok}", ""]
    return lines
