"""``trtio demo``'s LoRA toy: ``engines/toy-lora-ragged`` end to end (issue 37).

The toy LoRA directory (the ragged toy built with ``max_lora_rank`` 8; a ReferenceEngine computing ``x @ W + x @ A @
B``) runs greedy decoding of the demo's prompts with ``create_for_llm`` (CUDA graphs as asked) with no adapter, with
each of its two adapters (``adapters/chat``, rank 8, and ``adapters/terse``, rank 4 on two modules: each switch is
``set_lora`` between requests), and with ``chat`` again after ``terse``. The checks: each adapter's tokens are the
greedy tokens of the toy model with the adapter merged into its weights (``W + A @ B``, recomputed in numpy: each
token within :data:`TIE` of that model's best logit, so float rounding between two near-equal logits is no
difference), the adapters change the tokens, and ``chat`` set again gives its tokens again (a switch leaves nothing
behind).
:func:`run_lora` returns a JSON-able summary, :func:`format_lora` its lines.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trtio._cuda.backend import Backend
from trtio._setups import create_for_llm
from trtio._stream import Stream
from trtio.edgellm import EngineDir
from trtio.families.lora.adapters import LoraAdapter
from trtio.families.lora.lora_config import LoraConfig
from trtio.testing.reference_engine import ReferenceEngine
from trtio.testing.reference_lora import merged_weights
from trtio.testing.toy_engines import RAGGED_SEED
from trtio.testing.toy_model import ToyWeights, reference_logits, toy_embedding
from trtio.testing.toy_runtime import greedy_generate

__all__ = ["LORA_DIR", "TIE", "format_lora", "run_lora"]

#: The toy LoRA directory under the engines folder.
LORA_DIR = "toy-lora-ragged"
_ADAPTERS = ("chat", "terse")
#: How far below the merged model's best logit a greedy token may be (float rounding between near-equal logits).
TIE = 1e-2


def run_lora(root: Path, prompts: list[list[int]], max_new_tokens: int, backend: Backend, *,
             graphs: bool = True) -> dict[str, Any]:
    """``{LORA_DIR: {"max_rank", "adapters", "tokens", "graph_stats", "switch_ms", "ok"}}`` where ``root`` holds the
    toy LoRA directory, else ``{}``. ``tokens``: by adapter name (``"none"`` for no adapter, ``"chat again"``)."""
    path = Path(root) / LORA_DIR
    if not path.is_dir():
        return {}
    cfg = EngineDir.open(path).config
    adapters = {name: LoraAdapter.load(path / "adapters" / name) for name in _ADAPTERS}
    table = toy_embedding(cfg.vocab_size, cfg.hidden_size, RAGGED_SEED)
    weights = ToyWeights.generate(cfg, RAGGED_SEED)
    engine = ReferenceEngine.from_config(cfg, weights=weights,
                                         device="host" if backend.name == "host" else "gpu")
    tokens: dict[str, list[list[int]]] = {}
    switches: list[float] = []
    stream = Stream.create(backend)
    try:
        with create_for_llm(engine, cfg, stream, graphs=graphs, backend=backend) as setup:
            for name in ("none", *_ADAPTERS, "chat again"):
                adapter = None if name == "none" else adapters[name.split()[0]]
                t0 = time.perf_counter()
                setup.set_lora(adapter, stream)
                switches.append(time.perf_counter() - t0)
                tokens[name] = greedy_generate(setup, table, prompts, max_new_tokens, stream)
            stats = setup.graph_stats["llm"]
    finally:
        stream.close()
    changed = all(tokens[name] != tokens["none"] for name in _ADAPTERS)
    again = tokens["chat again"] == tokens["chat"]
    merged = all(_is_greedy(merged_weights(weights, cfg, adapters[name]), cfg, table, prompts, tokens[name])
                 for name in _ADAPTERS)
    return {LORA_DIR: {"max_rank": (cfg.feature(LoraConfig) or LoraConfig()).max_lora_rank,
                       "adapters": {n: sorted(set(a.ranks.values())) for n, a in adapters.items()},
                       "tokens": tokens, "merged": merged, "changed": changed, "again": again,
                       "graph_stats": {"hits": stats.hits, "captures": stats.captures},
                       "switch_ms": 1e3 * switches[-1], "ok": bool(merged and changed and again)}}


def _is_greedy(weights: ToyWeights, cfg: Any, table: Any, prompts: list[list[int]], tokens: list[list[int]]) -> bool:
    """Whether every token of ``tokens`` is (within :data:`TIE`) the best next token of the model of ``weights``."""
    for prompt, new in zip(prompts, tokens):
        seq = list(prompt) + list(new)
        logits = reference_logits(weights, cfg, table[seq])
        for i, token in enumerate(new):
            row = logits[len(prompt) - 1 + i]
            if not row[token] >= row.max() - TIE:
                return False
    return True


def format_lora(sections: dict[str, Any], *, verbose: bool = False) -> list[str]:
    """Lines for :func:`run_lora`'s summary: one line, or with ``verbose`` every adapter's tokens too."""
    lines = []
    for name, s in sections.items():
        ranks = ", ".join(f"{a} rank {'/'.join(map(str, r))}" for a, r in s["adapters"].items())
        first = " ".join(map(str, s["tokens"]["chat"][0][:8]))
        lines.append(f"LoRA {name} (max rank {s['max_rank']}; adapters {ranks}; set_lora between requests): greedy "
                     f"[0] with chat {first} ...; each adapter's tokens are the merged-weights model's: "
                     f"{_yes(s['merged'])}; the adapters change the tokens: {_yes(s['changed'])}; chat set again "
                     f"after terse gives its tokens again: {_yes(s['again'])}")
        if verbose:
            for adapter, rows in s["tokens"].items():
                lines += [f"  {adapter}:", *[f"    [{i}] " + " ".join(map(str, row)) for i, row in enumerate(rows)]]
            lines.append(f"  graphs {s['graph_stats']['hits']} replays, {s['graph_stats']['captures']} captures; the "
                         f"last set_lora took {s['switch_ms']:.3f} ms")
        lines.append("")
    return lines


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"
