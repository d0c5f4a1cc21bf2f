"""Greedy generation with the sampling on the device.

    python3 examples/generate.py               # the toy LLM (host backend without a GPU, cuda with one)
    python3 examples/generate.py ENGINE_DIR    # an Edge-LLM engine directory (config.json + llm.engine)

Each step: argmax over the logits trtio returns (read in place), the embedding rows of those tokens gathered
from the table on the device, handed to ``decode`` as they are (trtio reads them in place). The tokens stay on
the device until the end. Prints each prompt's tokens and the tokens per second.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from common import array_library, check_budget, check_kind, open_directory, padded, parser, prompt_ids, run


def generate(setup: Any, table: np.ndarray, prompts: list[list[int]], max_new_tokens: int, lib: Any) -> np.ndarray:
    """Greedy tokens [batch, max_new_tokens] of ``prompts``, sampled with the array library ``lib``."""
    with lib.running():
        emb = lib.array(table)  # the embedding table, on the device with a GPU
        ids, lengths = padded(prompts)
        logits = setup.prefill(lib.to_input(emb[lib.array(ids)]), lengths)
        tokens = []
        for step in range(max_new_tokens):
            token = lib.logits(logits).argmax(-1)  # [batch]
            tokens.append(token)
            if step + 1 < max_new_tokens:
                logits = setup.decode(lib.to_input(emb[token][:, None, :]))
        return lib.host(lib.cat([t[:, None] for t in tokens]))  # the one read to the host


def main() -> None:
    p = parser(__doc__.splitlines()[0], "toy-llm-ragged")
    args = p.parse_args()
    d = check_kind(p, args.engine_dir, "llm")
    prompts = prompt_ids(args.engine_dir)
    check_budget(d, max(map(len, prompts)), args.max_new_tokens)
    setup, table, _ = open_directory(args.engine_dir, args.backend)
    with setup:
        lib = array_library(args.array, setup)
        generate(setup, table, prompts, 2, lib)  # warm-up: the decode step's CUDA graph is captured here
        start = time.perf_counter()
        tokens = generate(setup, table, prompts, args.max_new_tokens, lib)
        seconds = time.perf_counter() - start
    for i, row in enumerate(tokens):
        print(f"tokens {i}: {row.tolist()}")
    count = tokens.size
    print(f"{count} tokens in {seconds:.3f} s: {count / seconds:.1f} tokens/s "
          f"({setup.io.backend.name} backend, sampling with {lib.name})")


if __name__ == "__main__":
    run(main)
