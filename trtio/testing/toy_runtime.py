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

from trtio._setups import LLMSetup, SpecDecodeSetup
from trtio._trees import ancestor_mask

__all__ = ["CandidateTree", "SpecStats", "embed_batch", "expand_level", "greedy_generate", "spec_generate"]


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
    """What speculation achieved over a run of :func:`spec_generate`.

    ``rounds`` counts base verify steps, ``proposed`` the draft tree nodes of every round and sequence,
    ``accepted`` the draft tokens the base accepted (the bonus token each verify adds is not counted),
    ``levels`` the draft levels of a round (``drafting_step``): one verify accepts at most that many
    tokens per sequence.
    """

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    accepted_per_sequence: list[int] = field(default_factory=list)
    levels: int = 0

    @property
    def accepted_per_verify(self) -> float:
        """Mean draft tokens accepted per verify step and sequence (0 .. ``levels``)."""
        n = len(self.accepted_per_sequence) or 1
        return self.accepted / max(self.rounds * n, 1)

    @property
    def acceptance_rate(self) -> float:
        """The share of draft levels whose token the base accepted: :attr:`accepted_per_verify` over
        ``levels``. Each level drafts one position of the sequence (``top_k`` candidates for it); with
        chain drafting (``top_k = 1``) it is the share of drafted tokens accepted."""
        return self.accepted_per_verify / self.levels if self.levels else 0.0

    @property
    def node_acceptance_rate(self) -> float:
        """``accepted / proposed``: the share of draft tree nodes accepted. At most one node per level can
        be accepted, so a tree of ``top_k`` nodes per level stays at or below ``1 / top_k``."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_verify(self) -> float:
        """Tokens emitted per base verify step per sequence (1 = no gain over plain decoding)."""
        return 1.0 + self.accepted_per_verify


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    out: np.ndarray = x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    return out


@dataclass
class CandidateTree:
    """One sequence's candidate tokens of a round, as a tree: each node's token, parent (-1: the root,
    the pending token) and cumulative log-probability under the draft. The verify tree is selected from
    it (:meth:`select`)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)

    def add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.scores.append(score)
        return len(self.tokens) - 1

    def select(self, count: int) -> list[int]:
        """The ``count`` best nodes by score whose ancestors are all selected (Edge-LLM keeps the verify
        tree closed under ancestors), in tree order."""
        order = sorted(range(len(self.tokens)), key=lambda i: (-self.scores[i], i))
        chosen: set[int] = set()
        for i in order:
            if len(chosen) == count:
                break
            if self.parents[i] < 0 or self.parents[i] in chosen:
                chosen.add(i)
        return sorted(chosen)


def expand_level(trees: list[CandidateTree], level: list[list[int]], logp: np.ndarray, top_k: int,
                 token_map: np.ndarray | None = None) -> list[list[int]]:
    """One level of EAGLE drafting: for each sequence, the ``top_k`` best children over every node of
    ``level`` (by cumulative log-probability; ``logp`` [B, len(level), V]) join its tree; returns the new
    level's node indices. ``token_map`` maps a column of ``logp`` to the token the node holds (an EAGLE3
    draft's reduced vocabulary; none: the column is the token)."""
    out = []
    for b, tree in enumerate(trees):
        nodes = level[b]
        base = np.array([tree.scores[n] if n >= 0 else 0.0 for n in nodes])[:, None]
        cand = base + logp[b]  # [len(level), V]
        flat = np.argsort(-cand, axis=None, kind="stable")[:top_k]
        parent_pos, token = np.unravel_index(flat, cand.shape)
        tokens = token if token_map is None else token_map[token]
        out.append([tree.add(int(t), nodes[int(p)], float(cand[p, c]))
                    for p, c, t in zip(parent_pos, token, tokens)])
    return out


def spec_generate(setup: SpecDecodeSetup, embedding: np.ndarray, prompts: Sequence[Sequence[int]],
                  max_new_tokens: int, *, depth: int | None = None, top_k: int | None = None,
                  verify_size: int | None = None, draft_to_target: np.ndarray | None = None,
                  stream: Any = None) -> tuple[list[list[int]], SpecStats]:
    """Greedy speculative decoding with EAGLE tree drafting; returns exactly the tokens greedy decoding
    of the base would.

    Each round the draft builds a tree from the pending token (the root): the ``top_k`` best tokens of
    the root, then ``depth - 1`` more levels, each the ``top_k`` best children (by cumulative draft
    log-probability) over the previous level, one ``draft_propose`` call per level. The ``verify_size - 1``
    best nodes (closed under ancestors) and the root form the verify tree, which the base checks in one
    step; the longest path whose tokens match the base's own greedy choices is accepted, plus the base's
    next token after it. ``top_k == 1`` is chain drafting. ``draft_to_target`` maps a column of the
    draft's logits to a base token id (an EAGLE3 draft with a reduced vocabulary,
    :meth:`trtio.edgellm.EngineDir.draft_to_target`); without it the columns are base token ids. Both
    engines take rows of ``embedding`` (the base's token embedding table).
    """
    spec = setup.bundle.spec
    assert spec is not None
    depth = spec.drafting_step if depth is None else depth
    top_k = spec.drafting_top_k if top_k is None else top_k
    verify_size = spec.verify_size if verify_size is None else verify_size
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
    stats = SpecStats(accepted_per_sequence=[0] * batch, levels=depth)
    while min(len(o) for o in out) < max_new_tokens:
        trees = [CandidateTree() for _ in range(batch)]
        level = expand_level(trees, [[-1] for _ in range(batch)], _log_softmax(draft_logits)[:, None, :], top_k,
                             draft_to_target)
        for _ in range(depth - 1):
            toks = np.array([[trees[b].tokens[n] for n in level[b]] for b in range(batch)])
            parents = np.array([[trees[b].parents[n] for n in level[b]] for b in range(batch)])
            step = setup.draft_propose(embedding[toks].astype(dtype), stream, parents=parents).to_numpy(stream)
            level = expand_level(trees, level, _log_softmax(step).reshape(batch, len(level[0]), -1), top_k,
                                 draft_to_target)
        # The verify tree: the root (the pending token) and the best draft nodes, in tree order.
        chosen = [t.select(verify_size - 1) for t in trees]
        n = 1 + max(len(c) for c in chosen)
        tokens = np.zeros((batch, n), np.int64)
        mask = np.zeros((batch, n, n), bool)
        for b, (tree, sel) in enumerate(zip(trees, chosen)):
            where = {node: 1 + i for i, node in enumerate(sel)}
            tokens[b, 0] = pending[b]
            par = [-1] + [where.get(tree.parents[node], 0) for node in sel]
            tokens[b, 1:len(sel) + 1] = [tree.tokens[node] for node in sel]
            mask[b, :len(par), :len(par)] = ancestor_mask(np.array(par))
        verify_logits = setup.verify(embedding[tokens].astype(dtype), mask, stream).to_numpy(stream)
        greedy = verify_logits.reshape(batch, n, -1).argmax(axis=-1)  # the base's choice after each node
        paths, emitted = [], []
        for b in range(batch):
            children: dict[int, list[int]] = {}
            for node in range(1, n):
                ancestors = np.flatnonzero(mask[b, node, :node])
                if ancestors.size:  # a real node: its parent is its deepest ancestor
                    children.setdefault(int(ancestors[-1]), []).append(node)
            path, cur = [0], 0
            while True:
                nxt = next((c for c in children.get(cur, []) if tokens[b, c] == greedy[b, cur]), None)
                if nxt is None:
                    break
                path.append(nxt)
                cur = nxt
            paths.append(path)
            emitted.append([int(tokens[b, node]) for node in path[1:]] + [int(greedy[b, cur])])
            stats.accepted += len(path) - 1
            stats.accepted_per_sequence[b] += len(path) - 1
        stats.proposed += sum(len(t.tokens) for t in trees)
        stats.rounds += 1
        setup.accept(paths, stream)
        for b in range(batch):
            out[b].extend(emitted[b])
        pending = np.array([e[-1] for e in emitted])
        # The draft catches up over the accepted nodes, each row shifted by one token (as in prefill).
        emb, acc = embed_batch(embedding, emitted, dtype)
        draft_logits = setup.draft_accept(emb, acc, stream).to_numpy(stream)
    return [o[:max_new_tokens] for o in out], stats
