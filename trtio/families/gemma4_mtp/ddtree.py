"""A Gemma 4 MTP round's verify tree where top-K > 1: Edge-LLM 0.11's DDTree (``kernels/speculative/ddtreeKernels.h``,
``ddtreeBuild``, which ``gemma4MTPDecoder.cpp`` runs on the assistant's stacked step logits; greedy decoding only),
on the host: the assistant drafts one chain (each step fed the last step's argmax), and the tree is grown from its
steps' distributions, each depth's top-K tokens the candidate children of every node one depth up.

Node 0 is the root (the pending token). The builder takes each depth's top ``top_k`` tokens of that step's logits,
then repeatedly appends the highest-scoring available child (score: the sum of the log-probabilities along its path
from the root) whose parent is already in the tree, until the tree holds ``nodes`` nodes or no child is left: a
prefix-closed tree, flattened in the order its nodes were taken (a parent before its children).
"""

from __future__ import annotations

import heapq

import numpy as np

from trtio.errors import InvalidValueError

__all__ = ["ddtree"]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    out: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


def ddtree(steps: np.ndarray, top_k: int, nodes: int) -> tuple[list[int], list[int]]:
    """The draft nodes of a verify tree of at most ``nodes`` nodes (the root included) grown from ``steps``
    ([depth, vocab]: the logits of the round's assistant steps, step ``d`` scoring depth ``d + 1``): their tokens
    and their parents (node indices, the root 0), in the tree's order (module docstring)."""
    if steps.ndim != 2 or steps.shape[0] < 1 or top_k < 1 or nodes < 1:
        raise InvalidValueError(f"ddtree: expected steps [depth >= 1, vocab], top_k >= 1 and nodes >= 1, got "
                                f"{list(steps.shape)}, {top_k}, {nodes}")
    logp = _log_softmax(steps)
    k = min(top_k, steps.shape[1])
    cand = np.argsort(-logp, axis=1, kind="stable")[:, :k]  # [depth, k]: each depth's candidates, best first
    tokens: list[int] = []
    parents: list[int] = []
    heap: list[tuple[float, int, int, int, int]] = []  # (-score, order pushed, parent node, depth index, rank)
    pushed = 0
    for j in range(k):
        heapq.heappush(heap, (-float(logp[0, cand[0, j]]), pushed, 0, 0, j))
        pushed += 1
    while heap and len(tokens) + 1 < nodes:
        neg, _, parent, d, j = heapq.heappop(heap)
        tokens.append(int(cand[d, j]))
        parents.append(parent)
        node = len(tokens)  # this node's index (the root is 0)
        if d + 1 < steps.shape[0]:
            for c in range(k):
                heapq.heappush(heap, (neg - float(logp[d + 1, cand[d + 1, c]]), pushed, node, d + 1, c))
                pushed += 1
    return tokens, parents
