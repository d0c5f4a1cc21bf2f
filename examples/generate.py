"""Greedy generation with the sampling on the device.

    python3 examples/generate.py               # the toy LLM (host backend without a GPU, cuda with one)
    python3 examples/generate.py ENGINE_DIR    # an Edge-LLM engine directory (config.json + llm.engine)

Each step: argmax over the logits trtio returns (read in place), the embedding rows of those tokens gathered
on the device by the directory's embeddings (``EngineDir.embeddings``: with a Gemma 4 directory's per-layer
rows too), handed to ``decode`` as they are. The tokens stay on
the device until the end. Prints each prompt's tokens and the tokens per second.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from common import array_library, check_budget, check_kind, embedded, open_directory, padded, parser, prompt_ids, run


def generate(setup: Any, emb: Any, prompts: list[list[int]], max_new_tokens: int, lib: Any) -> np.ndarray:
    """Greedy tokens [batch, max_new_tokens] of ``prompts``, sampled with the array library ``lib``; ``emb``: the
    directory's embeddings."""
    with lib.running():
        ids, lengths = padded(prompts)
        x, extra = embedded(emb, lib, ids)
        logits = setup.prefill(x, lengths, **extra)
        tokens = []
        for step in range(max_new_tokens):
            token = lib.logits(logits).argmax(-1)  # [batch]
            tokens.append(token)
            if step + 1 < max_new_tokens:
                x, extra = embedded(emb, lib, token[:, None])
                logits = setup.decode(x, **extra)
        return lib.host(lib.cat([t[:, None] for t in tokens]))  # the one read to the host


def main() -> None:
    p = parser(__doc__.splitlines()[0], "toy-llm-ragged")
    args = p.parse_args()
    d = check_kind(p, args.engine_dir, "llm")
    prompts = prompt_ids(args.engine_dir)
    check_budget(d, max(map(len, prompts)), args.max_new_tokens)
    setup, emb, _ = open_directory(args.engine_dir, args.backend)
    with setup, emb:
        lib = array_library(args.array, setup)
        generate(setup, emb, prompts, 2, lib)  # warm-up: the decode step's CUDA graph is captured here
        start = time.perf_counter()
        tokens = generate(setup, emb, prompts, args.max_new_tokens, lib)
        seconds = time.perf_counter() - start
    for i, row in enumerate(tokens):
        print(f"tokens {i}: {row.tolist()}")
    count = tokens.size
    print(f"{count} tokens in {seconds:.3f} s: {count / seconds:.1f} tokens/s "
          f"({setup.io.backend.name} backend, sampling with {lib.name})")


if __name__ == "__main__":
    run(main)
