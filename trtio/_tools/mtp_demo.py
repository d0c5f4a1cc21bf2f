"""``trtio demo``'s MTP pairs: the MTP toy directories of ``engines/`` end to end.

Each directory of :data:`MTP_DIRS` (an MTP pair in Edge-LLM 0.11's layout: ``toy-mtp-ragged``, a dense one-layer
base, and ``toy-qwen35-mtp-ragged``, a Gated-DeltaNet hybrid base whose accept commits the accepted token's
recurrent states into its slot; ReferenceEngines of the toy model, the draft derived from the base) decodes the
demo's prompts speculatively with chain drafting (``create_for_spec_decode``, the EAGLE3 phases), and the tokens are
checked against the numpy base's greedy tokens. :func:`run_mtp` returns a JSON-able summary, :func:`format_mtp` its
lines.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio._config import LLMEngineConfig
from trtio._cuda.backend import Backend
from trtio._rope import rope_cos_sin_table
from trtio._setups import create_for_spec_decode
from trtio._stream import Stream
from trtio.edgellm import EngineDir
from trtio.families.hybrid.hybrid_config import HybridConfig
from trtio.testing.reference_engine import ReferenceEngine
from trtio.testing.toy_model import ToyWeights, reference_forward
from trtio.testing.toy_runtime import spec_generate

__all__ = ["MTP_DIRS", "format_mtp", "greedy_tokens", "run_mtp"]

#: The MTP toy directories the demo runs (those present under its engines folder).
MTP_DIRS = ("toy-mtp-ragged", "toy-qwen35-mtp-ragged")
_DEPTH = 3  # drafted tokens per chain


def greedy_tokens(weights: ToyWeights, cfg: Any, table: np.ndarray, prompt: list[int], count: int) -> list[int]:
    """The numpy toy model's ``count`` greedy tokens after ``prompt`` (each over the whole sequence)."""
    rope = rope_cos_sin_table(cfg.max_kv_cache_capacity, cfg.rotary_dim, cfg.rope_theta)
    tokens = list(prompt)
    for _ in range(count):
        logits = reference_forward(weights, cfg, table[tokens].astype(np.float16), rope=rope)[1]
        tokens.append(int(logits[-1].argmax()))
    return tokens[len(prompt):]


def base_kind(cfg: LLMEngineConfig) -> str:
    """How a pair's base is named in the demo: "dense", or "hybrid: " and its layers' mixers in order, each
    recurrent layer by its kind (Edge-LLM's ``layer_types`` call every recurrent layer "mamba", Qwen3.5's
    Gated-DeltaNet layers too)."""
    hybrid = cfg.feature(HybridConfig)
    kind = hybrid.recurrent_kind if hybrid is not None else None
    if kind is None:
        return "dense"
    return "hybrid: " + ", ".join(kind if t == "mamba" else t for t in cfg.layer_types)


def run_mtp(root: Any, prompts: list[list[int]], max_new_tokens: int, backend: Backend, *,
            graphs: bool = True) -> dict[str, Any]:
    """Every MTP toy directory under ``root`` (those present): ``{name: {"base", "tokens", "acceptance",
    "accepted_per_verify", "ok"}}``."""
    device = "host" if backend.name == "host" else "gpu"
    out: dict[str, Any] = {}
    for name in MTP_DIRS:
        path = root / name
        if not path.is_dir():
            continue
        directory = EngineDir.open(path)
        bundle = directory.deployment(1, _DEPTH, _DEPTH + 1)
        assert bundle.draft is not None
        bw = ToyWeights.generate(bundle.base, 0)
        dw = ToyWeights.generate_draft(bundle.draft, bw, 0)
        table = np.asarray(directory.embedding_table(), np.float32)
        stream = Stream.create(backend)
        try:
            with create_for_spec_decode(ReferenceEngine.from_config(bundle.base, device=device, weights=bw),
                                        ReferenceEngine.from_config(bundle.draft, device=device, weights=dw),
                                        bundle, stream=stream, graphs=graphs, backend=backend) as setup:
                tokens, stats = spec_generate(setup, table, prompts, max_new_tokens, stream=stream)
        finally:
            stream.close()
        truth = [greedy_tokens(bw, bundle.base, table, p, len(t)) for p, t in zip(prompts, tokens)]
        out[name] = {"base": base_kind(bundle.base), "tokens": tokens, "acceptance": stats.acceptance_rate,
                     "accepted_per_verify": stats.accepted_per_verify, "ok": tokens == truth}
    return out


def format_mtp(sections: dict[str, Any], *, verbose: bool = False) -> list[str]:
    """One line for :func:`run_mtp`'s summary (a line per pair with ``verbose``, with its tokens)."""
    if not sections:
        return []
    parts = [f"{name} ({s['base']}): {s['acceptance']:.0%} of drafted tokens accepted, equal to greedy "
             f"{'yes' if s['ok'] else 'NO'}" for name, s in sections.items()]
    if not verbose:
        return ["MTP pairs (chains of 3): " + "; ".join(parts), ""]
    lines = ["MTP pairs (chains of 3, the EAGLE3 phases):"]
    for part, s in zip(parts, sections.values()):
        lines.append(f"  {part}")
        lines += [f"    {row}" for row in s["tokens"]]
    return [*lines, ""]
