"""Continuous batching: a serving loop over the sequence slots, with the sampling on the device.

    python3 examples/serve.py               # the toy LLM (host backend without a GPU, cuda with one)
    python3 examples/serve.py ENGINE_DIR    # an Edge-LLM engine directory (config.json + llm.engine)

Requests arrive at different steps, more of them than the engine has sequence slots. Each step the loop
admits the requests that have arrived into free slots (``prefill(..., slots=[s])``: the others keep their KV
and go on decoding), runs one ``decode`` over every active slot, and releases the requests that produced an
end-of-sequence token or reached their token budget (``release``): their slots and KV pages go to the
requests still waiting. Argmax and the embedding gather run on the device; the host reads each step's
tokens once (a server streams them to its clients) and each admitted request's first token. Prints when
each request came and went, its tokens, and the tokens per second.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from common import array_library, check_budget, check_kind, embedded, open_directory, parser, run

import trtio

TEXTS = ("Once upon a time", "The quick brown fox jumps over the lazy dog.", "In a hole in the ground there lived",
         "It was a bright cold day in April,", "Call me", "All happy families are alike;")
ARRIVALS = (0, 0, 2, 3, 5, 6)  # the step each request arrives at
SHARES = (1.0, 0.34, 1.0, 0.5, 1.0, 0.25)  # each request's token budget, as a share of --max-new-tokens


@dataclass
class Request:
    prompt: list[int]
    arrive: int
    budget: int
    slot: int = -1
    admitted: int = -1
    finished: int = -1
    reason: str = ""
    tokens: list[int] = field(default_factory=list)


def token_ids(path: Path, texts: tuple[str, ...]) -> list[list[int]]:
    """The texts as token ids: with the directory's tokenizer.json where Hugging Face tokenizers is installed,
    else fixed ids."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return [[3 + (7 * i + j) % 97 for j in range(3 + 2 * i)] for i in range(len(texts))]
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    return [tokenizer.encode(t).ids for t in texts]


def requests(path: Path, max_new_tokens: int) -> list[Request]:
    """The requests this example serves: the texts' tokens, arriving at ``ARRIVALS``, with budgets of
    ``SHARES`` x ``max_new_tokens`` (at least 1)."""
    return [Request(ids, arrive, max(1, round(share * max_new_tokens)))
            for ids, arrive, share in zip(token_ids(path, TEXTS), ARRIVALS, SHARES)]


def eos_ids(path: Path) -> set[int]:
    """The directory's end-of-sequence ids (``eos_token_id`` of its config)."""
    raw = trtio.EngineDir.open(path).raw("llm").get("eos_token_id")
    if raw is None:
        return set()
    return {int(t) for t in (raw if isinstance(raw, list) else [raw])}


def serve(setup: Any, emb: Any, reqs: list[Request], lib: Any, eos: set[int]) -> dict[str, int]:
    """Serve ``reqs`` (filled in place: slot, steps, tokens, why each ended); returns the steps and tokens. ``emb``:
    the directory's embeddings (``EngineDir.embeddings``)."""
    slots = setup.io.max_batch
    with lib.running():
        pending = lib.array(np.zeros(slots, np.int64))  # each slot's next input token, on the device
        waiting = deque(sorted(reqs, key=lambda r: r.arrive))
        where: dict[int, Request] = {}  # slot -> the request it serves
        step = count = 0

        def take(r: Request, token: int) -> None:
            nonlocal count
            r.tokens.append(token)
            count += 1
            r.reason = "end of sequence" if token in eos else "its budget" if len(r.tokens) == r.budget else ""
            if r.reason:
                r.finished = step
                setup.release([r.slot])
                del where[r.slot]

        while waiting or where:
            while waiting and waiting[0].arrive <= step and len(where) < slots:
                r = waiting.popleft()
                r.slot, r.admitted = next(s for s in range(slots) if s not in where), step
                where[r.slot] = r
                x, extra = embedded(emb, lib, np.array([r.prompt]))
                logits = setup.prefill(x, [len(r.prompt)], slots=[r.slot], **extra)
                first = lib.logits(logits)[0].argmax()
                pending[r.slot] = first
                take(r, int(lib.host(first)))  # the first token, streamed as soon as it is there
            if where:
                active = setup.active  # ascending, the order decode takes them in
                rows = lib.array(active)
                x, extra = embedded(emb, lib, pending[rows][:, None])
                logits = setup.decode(x, **extra)
                nxt = lib.logits(logits).argmax(-1)
                pending[rows] = nxt
                for slot, token in zip(active.tolist(), lib.host(nxt).tolist()):  # the step's one read
                    take(where[slot], int(token))
            step += 1
    return {"steps": step, "tokens": count}


def main() -> None:
    p = parser(__doc__.splitlines()[0], "toy-llm-ragged")
    p.add_argument("--eos", type=int, action="append", default=None, metavar="ID",
                   help="an end-of-sequence token id (repeatable; default: the config's eos_token_id)")
    args = p.parse_args()
    d = check_kind(p, args.engine_dir, "llm")
    check_budget(d, max(len(ids) for ids in token_ids(args.engine_dir, TEXTS)), args.max_new_tokens)
    eos = set(args.eos) if args.eos is not None else eos_ids(args.engine_dir)
    setup, emb, _ = open_directory(args.engine_dir, args.backend)
    with setup, emb:
        lib = array_library(args.array, setup)
        warm = requests(args.engine_dir, args.max_new_tokens)
        for r in warm:
            r.budget = min(r.budget, 4)
        serve(setup, emb, warm, lib, eos)  # warm-up: the decode graphs of most batch sizes are captured here
        reqs = requests(args.engine_dir, args.max_new_tokens)
        start = time.perf_counter()
        stats = serve(setup, emb, reqs, lib, eos)
        seconds = time.perf_counter() - start
    for i, r in enumerate(reqs):
        print(f"request {i}: {len(r.prompt)} prompt tokens, arrived at step {r.arrive}, admitted at step "
              f"{r.admitted} into slot {r.slot}, ended at step {r.finished} ({r.reason})")
    for i, r in enumerate(reqs):
        print(f"tokens {i}: {r.tokens}")
    print(f"{stats['tokens']} tokens in {seconds:.3f} s: {stats['tokens'] / seconds:.1f} tokens/s ({len(reqs)} "
          f"requests over {setup.io.max_batch} slots, {stats['steps']} steps; {setup.io.backend.name} backend, "
          f"sampling with {lib.name})")


if __name__ == "__main__":
    run(main)
