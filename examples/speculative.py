"""Speculative decoding (EAGLE drafting with a fixed tree) with the sampling on the device.

    python3 examples/speculative.py              # the toy EAGLE3 pair (host backend without a GPU, cuda with one)
    python3 examples/speculative.py ENGINE_DIR   # an Edge-LLM pair (base_config.json + draft_config.json + engines)

Each round the draft proposes ``--top-k`` chains of ``--depth`` tokens: its top-k first tokens after the
pending one, then its greedy continuation of each chain, one ``draft_propose`` per level. The base verifies
the pending token and every drafted one in one ``verify``; a drafted token is accepted when its parent is and
the base chose it there. The longest accepted chain and the base's next token are emitted, which gives exactly
greedy decoding's tokens. Top-k, argmax, the acceptance test and every embedding gather run on the device; the
host reads the accepted chains once per round, for ``accept``. Prints each prompt's tokens, the tokens per
second and the accepted tokens per verify.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from common import (
    array_library,
    check_budget,
    check_kind,
    embedded,
    open_directory,
    padded,
    parser,
    positive_int,
    prompt_ids,
    run,
)


class Tree:
    """The fixed verify tree: node 0 is the pending token, draft node j (level j // k, chain j % k) is node j + 1."""

    def __init__(self, k: int, depth: int) -> None:
        self.k, self.depth = k, depth
        self.parents = np.array([-1] + [0 if j < k else j - k + 1 for j in range(k * depth)])
        self.depth_of = np.array([0] + [j // k + 1 for j in range(k * depth)])
        self.paths = []  # each node's path from the root
        for node in range(len(self.parents)):
            path = [node]
            while path[-1] != 0:
                path.append(int(self.parents[path[-1]]))
            self.paths.append(path[::-1])
        # What a round emits when node n is the deepest accepted one: the tokens of its path after the root,
        # then the base's next token (column N of [tokens, bonus]); padded with that column.
        n = len(self.parents)
        self.emit_columns = np.array([p[1:] + [n] * (depth + 1 - len(p[1:])) for p in self.paths])


def speculative(setup: Any, emb: Any, d2t: np.ndarray, prompts: list[list[int]], max_new_tokens: int,
                lib: Any, tree: Tree) -> tuple[list[list[int]], dict[str, float]]:
    """Each prompt's first ``max_new_tokens`` tokens, and the rounds and accepted draft tokens per verify. ``emb``: the
    directory's embeddings (``EngineDir.embeddings``: the base's table, which the EAGLE3 draft reads too)."""
    k, depth, batch = tree.k, tree.depth, len(prompts)
    with lib.running():
        to_target = lib.array(d2t)
        def gather(ids: Any) -> Any:
            return embedded(emb, lib, ids)[0]  # an EAGLE3 pair has no per-layer embeddings

        parent_of = lib.array(np.maximum(tree.parents, 0))
        depth_of, emit_columns = lib.array(tree.depth_of), lib.array(tree.emit_columns)
        rows = lib.array(np.arange(batch))
        ids, lengths = padded(prompts)
        pending = lib.logits(setup.base_prefill(gather(ids), lengths)).argmax(-1)
        shifted = lib.array(np.concatenate([ids[:, 1:], ids[:, :1]], axis=1))  # the prompt shifted by one token
        shifted[rows, lib.array(lengths - 1)] = pending
        draft_logits = lib.logits(setup.draft_prefill(gather(shifted), lengths))
        out: list[list[int]] = [[] for _ in prompts]
        first = lib.host(pending)
        rounds = accepted = 0
        while min(len(o) for o in out) + 1 < max_new_tokens:
            level = to_target[lib.topk(draft_logits, k)]  # [batch, k]: level 0 of the draft tree
            levels = [pending[:, None], level]
            for n in range(1, depth):  # the draft reads level n - 1 (joining its tree) and proposes level n
                parents = np.full(k, -1) if n == 1 else np.arange(k) + (n - 2) * k
                step = lib.logits(setup.draft_propose(gather(level), parents=parents))
                level = to_target[step.argmax(-1)].reshape(batch, k)
                levels.append(level)
            tokens = lib.cat(levels)  # [batch, N]
            greedy = lib.logits(setup.verify(gather(tokens), tree.parents)).argmax(-1).reshape(batch, -1)
            ok = tokens == greedy[:, parent_of]  # the base chose this token after its parent
            ok[:, 0] = True
            for _ in range(depth):
                ok = ok & ok[:, parent_of]  # ... and its parent was accepted too
            best = (ok * (depth_of + 1)).argmax(-1)  # the deepest accepted node
            bonus = greedy[rows, best]  # the base's token after it: the next round's pending token
            emitted = lib.gather(lib.cat([tokens, bonus[:, None]]), emit_columns[best])
            read = lib.host(lib.cat([best[:, None], emitted]))  # the round's one read to the host
            paths = [tree.paths[int(b)] for b in read[:, 0]]
            setup.accept(paths)
            for o, path, row in zip(out, paths, read[:, 1:]):
                o.extend(row[:len(path)].tolist())
            rounds += 1
            accepted += sum(len(p) - 1 for p in paths)
            pending = bonus
            draft_logits = lib.logits(setup.draft_accept(gather(emitted), [len(p) for p in paths]))
        tokens_out = [[int(f)] + o for f, o in zip(first, out)]
    stats = {"rounds": rounds, "accepted_per_verify": accepted / max(rounds * batch, 1)}
    return [t[:max_new_tokens] for t in tokens_out], stats


def main() -> None:
    p = parser(__doc__.splitlines()[0], "toy-eagle3-ragged")
    p.add_argument("--top-k", type=positive_int, default=2, help="draft chains per round (default 2)")
    p.add_argument("--depth", type=positive_int, default=3, help="tokens per chain (default 3)")
    args = p.parse_args()
    d = check_kind(p, args.engine_dir, "spec_decode")
    tree = Tree(args.top_k, args.depth)
    prompts = prompt_ids(args.engine_dir)
    check_budget(d, max(map(len, prompts)), args.max_new_tokens, extra=len(tree.parents) + args.depth)
    setup, emb, d2t = open_directory(args.engine_dir, args.backend, draft_top_k=args.top_k, draft_step=args.depth,
                                       verify_size=len(tree.parents))
    assert d2t is not None
    with setup, emb:
        lib = array_library(args.array, setup)
        speculative(setup, emb, d2t, prompts, 8, lib, tree)  # warm-up: the steps' CUDA graphs are captured here
        start = time.perf_counter()
        tokens, stats = speculative(setup, emb, d2t, prompts, args.max_new_tokens, lib, tree)
        seconds = time.perf_counter() - start
    for i, row in enumerate(tokens):
        print(f"tokens {i}: {row}")
    count = sum(len(t) for t in tokens)
    print(f"{count} tokens in {seconds:.3f} s: {count / seconds:.1f} tokens/s, "
          f"{stats['accepted_per_verify']:.2f} accepted tokens per verify "
          f"({setup.io.backend.name} backend, sampling with {lib.name})")


if __name__ == "__main__":
    run(main)
