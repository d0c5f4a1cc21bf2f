"""Greedy generation loops over trtio's setups: a small, complete runtime for the toy engines.

trtio itself works on embeddings and logits; these loops add what an LLM runtime adds on top —
token embedding lookup, greedy sampling, and EAGLE-style speculative decoding (propose, verify a
tree, accept the longest matching path) — so tests and ``trtio demo`` can check that speculative
decoding produces exactly the tokens of plain greedy decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtio.setups import LLMSetup, SpecDecodeSetup

__all__ = ["greedy_generate", "spec_generate", "SpecStats", "embed_batch", "tree_parents"]


def embed_batch(embedding: np.ndarray, rows: Sequence[Sequence[int]], dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded embeddings [B, max_len, H] of token rows, and their lengths."""
    lens = np.array([len(r) for r in rows], dtype=np.int64)
    out = np.zeros((len(rows), int(lens.max()), embedding.shape[1]), dtype=dtype)
    for b, r in enumerate(rows):
        out[b, :len(r)] = embedding[list(r)]
    return out, lens


def greedy_generate(setup: LLMSetup, embedding: np.ndarray, prompts: Sequence[Sequence[int]],
                    max_new_tokens: int, stream: Any = None) -> list[list[int]]:
    """Plain greedy decoding: prefill, then one decode step per new token."""
    dtype = setup.io.inputs_embeds.dtype.numpy
    emb, lens = embed_batch(embedding, prompts, dtype)
    setup.reset()
    logits = setup.prefill(emb, lens, stream).to_numpy(stream)
    out: list[list[int]] = [[] for _ in prompts]
    for step in range(max_new_tokens):
        nxt = logits.argmax(axis=-1)
        for b, t in enumerate(nxt):
            out[b].append(int(t))
        if step + 1 == max_new_tokens:
            break
        logits = setup.decode(embedding[nxt][:, None, :].astype(dtype), stream).to_numpy(stream)
    return out


@dataclass
class SpecStats:
    """What speculation achieved: draft tokens proposed and accepted, base verify steps."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    accepted_per_sequence: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_verify(self) -> float:
        """Tokens emitted per base verify step per sequence (1 = no gain over plain decoding)."""
        n = len(self.accepted_per_sequence) or 1
        return 1.0 + self.accepted / max(self.rounds * n, 1)


def tree_parents(top_k: int, depth: int) -> list[int]:
    """The tree :func:`spec_generate` verifies: the root (the pending token), ``top_k`` children, and a
    chain of ``depth - 1`` nodes under the first child; ``1 + top_k + depth - 1`` nodes."""
    parents = [-1] + [0] * top_k + [1] + list(range(top_k + 1, top_k + depth - 1))
    return parents[:1 + top_k + depth - 1]


def _top(logits: np.ndarray, k: int) -> np.ndarray:
    """The k best token ids per row, best first (ties to the lower id, like argmax)."""
    order = np.argsort(-logits, axis=-1, kind="stable")
    return order[..., :k]


def spec_generate(setup: SpecDecodeSetup, embedding: np.ndarray, prompts: Sequence[Sequence[int]],
                  max_new_tokens: int, *, depth: int | None = None, top_k: int | None = None,
                  stream: Any = None) -> tuple[list[list[int]], SpecStats]:
    """Greedy speculative decoding; returns exactly the tokens greedy decoding of the base would.

    Each round the draft proposes a tree: the ``top_k`` best first tokens as children of the
    pending token, and a chain of ``depth - 1`` more greedy proposals under the best of them
    (``top_k == 1`` is plain chain speculation). The base verifies the whole tree in one step; the
    longest path whose tokens match the base's own greedy choices is accepted, plus the base's
    next token after it.
    """
    spec = setup.bundle.spec
    assert spec is not None
    depth = spec.drafting_step if depth is None else depth
    top_k = spec.drafting_top_k if top_k is None else top_k
    parents = tree_parents(top_k, depth)
    nodes = len(parents)
    dtype = setup.io.inputs_embeds.dtype.numpy
    batch = len(prompts)
    setup.reset()
    emb, lens = embed_batch(embedding, prompts, dtype)
    logits = setup.base_prefill(emb, lens, stream).to_numpy(stream)
    pending = logits.argmax(axis=-1)
    out: list[list[int]] = [[int(t)] for t in pending]
    shifted = [list(p[1:]) + [int(t)] for p, t in zip(prompts, pending)]
    emb, _ = embed_batch(embedding, shifted, dtype)
    draft_logits = setup.draft_prefill(emb, lens, stream).to_numpy(stream)
    stats = SpecStats(accepted_per_sequence=[0] * batch)
    while min(len(o) for o in out) < max_new_tokens:
        first = _top(draft_logits, top_k)  # [B, top_k]
        chain = [first[:, 0]]
        for _ in range(depth - 1):
            step = setup.draft_propose(embedding[chain[-1]][:, None, :].astype(dtype), stream).to_numpy(stream)
            chain.append(step.argmax(axis=-1))
        tokens = np.column_stack([pending, first, *chain[1:]])[:, :nodes]
        verify_logits = setup.verify(embedding[tokens].astype(dtype), parents, stream).to_numpy(stream)
        greedy = verify_logits.reshape(batch, nodes, -1).argmax(axis=-1)  # the base's choice after each node
        children: dict[int, list[int]] = {}
        for node, parent in enumerate(parents):
            if parent >= 0:
                children.setdefault(parent, []).append(node)
        paths, emitted = [], []
        for b in range(batch):
            path, cur = [0], 0
            while True:
                nxt = next((c for c in children.get(cur, []) if tokens[b, c] == greedy[b, cur]), None)
                if nxt is None:
                    break
                path.append(nxt)
                cur = nxt
            paths.append(path)
            emitted.append([int(tokens[b, n]) for n in path[1:]] + [int(greedy[b, cur])])
            stats.accepted += len(path) - 1
            stats.accepted_per_sequence[b] += len(path) - 1
        stats.proposed += batch * depth
        stats.rounds += 1
        setup.accept(paths, stream)
        for b in range(batch):
            out[b].extend(emitted[b])
        pending = np.array([e[-1] for e in emitted])
        # The draft catches up over the accepted nodes, each row shifted by one token (as in prefill).
        emb, acc = embed_batch(embedding, emitted, dtype)
        draft_logits = setup.draft_accept(emb, acc, stream).to_numpy(stream)
    return [o[:max_new_tokens] for o in out], stats
