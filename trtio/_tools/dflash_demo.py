"""``trtio demo``'s DFlash pairs: the DFlash toy directories of ``engines/`` end to end.

Each directory of :data:`DFLASH_DIRS` (a DFlash pair in Edge-LLM 0.11's layout: ``toy-dflash-ragged``, a dense
base, and ``toy-qwen35-dflash-ragged``, a Gated-DeltaNet hybrid base; ReferenceEngines of the toy model, the block
draft derived from the base) decodes the demo's prompts speculatively, a block a round (``trtio.families.spec.dflash``),
and the tokens are checked against the numpy base's greedy tokens. :func:`run_dflash` returns a JSON-able summary,
:func:`format_dflash` its lines.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio._cuda.backend import Backend
from trtio._setups import SpecDecodeSetup, create_for_spec_decode
from trtio._stream import Stream
from trtio._tools.mtp_demo import base_kind, greedy_tokens
from trtio.edgellm import EngineDir
from trtio.families.spec.dflash_bindings import block_size, mask_token
from trtio.testing.reference_engine import ReferenceEngine
from trtio.testing.toy_model import ToyWeights

__all__ = ["DFLASH_DIRS", "format_dflash", "run_dflash"]

#: The DFlash toy directories the demo runs (those present under its engines folder).
DFLASH_DIRS = ("toy-dflash-ragged", "toy-qwen35-dflash-ragged")


def _rounds(setup: SpecDecodeSetup, table: np.ndarray, prompts: list[list[int]], count: int, width: int,
            mask: int, stream: Stream) -> tuple[list[list[int]], int, int]:
    """The prompts decoded together, a block of ``width`` a round, until each has ``count`` new tokens: the new
    tokens, the drafted and the accepted counts."""
    def embeds(rows: list[list[int]]) -> np.ndarray:
        longest = max(len(r) for r in rows)
        out: np.ndarray = table[np.array([r + [0] * (longest - len(r)) for r in rows])].astype(np.float16)
        return out

    def guesses(logits: Any) -> np.ndarray:
        rows: np.ndarray = np.asarray(logits.to_numpy()).reshape(len(prompts), width, -1).argmax(-1)[:, 1:]
        return rows

    lens = [len(p) for p in prompts]
    first = setup.base_prefill(embeds(prompts), lens, stream).to_numpy().argmax(-1)
    new = [[int(t)] for t in first]
    drafts = guesses(setup.draft_prefill(embeds([[t[-1]] + [mask] * (width - 1) for t in new]), lens, stream))
    drafted = accepted = 0
    while min(len(t) for t in new) < count:
        tokens = np.array([[t[-1], *d] for t, d in zip(new, drafts)])
        greedy = setup.verify(table[tokens].astype(np.float16), list(range(-1, width - 1)), stream).to_numpy()
        greedy = greedy.reshape(len(prompts), width, -1).argmax(-1)
        paths = []
        for t, row, g in zip(new, tokens, greedy):
            n = 1
            while n < width and row[n] == g[n - 1]:
                n += 1
            paths.append(list(range(n)))
            t += [int(v) for v in row[1:n]] + [int(g[n - 1])]
            drafted, accepted = drafted + width - 1, accepted + n - 1
        setup.accept(paths, stream)
        block = embeds([[t[-1]] + [mask] * (width - 1) for t in new])
        drafts = guesses(setup.draft_accept(block, [len(p) for p in paths], stream))
    return [t[:count] for t in new], drafted, accepted


def run_dflash(root: Any, prompts: list[list[int]], max_new_tokens: int, backend: Backend, *,
               graphs: bool = True) -> dict[str, Any]:
    """Every DFlash toy directory under ``root`` (those present): ``{name: {"base", "block", "tokens",
    "acceptance", "ok"}}``."""
    device = "host" if backend.name == "host" else "gpu"
    out: dict[str, Any] = {}
    for name in DFLASH_DIRS:
        path = root / name
        if not path.is_dir():
            continue
        directory = EngineDir.open(path)
        draft_cfg, base_cfg = directory.draft_config, directory.base_config
        width = block_size(draft_cfg.extras, min(draft_cfg.max_draft_tree_size, base_cfg.max_verify_tree_size))
        bundle = directory.deployment(1, width - 1, width)
        assert bundle.draft is not None
        table = np.asarray(directory.embedding_table(), np.float32)
        mask = mask_token(bundle.draft.extras)
        bw = ToyWeights.generate(bundle.base, 0)
        dw = ToyWeights.generate_dflash_draft(bundle.draft, bw, table, mask, 0, base_cfg=bundle.base)
        stream = Stream.create(backend)
        try:
            with create_for_spec_decode(ReferenceEngine.from_config(bundle.base, device=device, weights=bw),
                                        ReferenceEngine.from_config(bundle.draft, device=device, weights=dw),
                                        bundle, stream=stream, graphs=graphs, backend=backend) as setup:
                tokens, drafted, accepted = _rounds(setup, table, prompts, max_new_tokens, width, mask, stream)
        finally:
            stream.close()
        truth = [greedy_tokens(bw, bundle.base, table, p, len(t)) for p, t in zip(prompts, tokens)]
        out[name] = {"base": base_kind(bundle.base), "block": width, "tokens": tokens,
                     "acceptance": accepted / max(drafted, 1), "ok": tokens == truth}
    return out


def format_dflash(sections: dict[str, Any], *, verbose: bool = False) -> list[str]:
    """One line for :func:`run_dflash`'s summary (a line per pair with ``verbose``, with its tokens)."""
    if not sections:
        return []
    parts = [f"{name} ({s['base']}): {s['acceptance']:.0%} of drafted tokens accepted, equal to greedy "
             f"{'yes' if s['ok'] else 'NO'}" for name, s in sections.items()]
    block = next(iter(sections.values()))["block"]
    if not verbose:
        return [f"DFlash pairs (blocks of {block}): " + "; ".join(parts), ""]
    lines = [f"DFlash pairs (blocks of {block}: the root and mask tokens, verified as one chain):"]
    for part, s in zip(parts, sections.values()):
        lines.append(f"  {part}")
        lines += [f"    {row}" for row in s["tokens"]]
    return [*lines, ""]
