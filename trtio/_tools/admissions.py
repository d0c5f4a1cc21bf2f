"""``trtio demo``'s admission story: requests that arrive and leave one LLM setup (ragged contract).

A small serving loop over the sequence slots of an :class:`~trtio._setups.LLMSetup`: requests of different
lengths arrive at different decode steps and are admitted into free slots (``prefill(..., slots=[s])``)
while the others keep decoding; each ends at its token budget and is released (``release``), its slot and
pages going to the next request. One request's prompt starts with a system prompt, which is prefilled
first and pinned whole (``pin_prefix``; on a hybrid model a prefix keeps the recurrent states after its last
token), the rest of the prompt prefilled after it (``past_lengths``); a later request starts from that prefix
(``prefill(..., prefix=P)``, its inputs only the tokens after it). Which slot each request takes and how
many KV pages are in use (``kv_pages``) are recorded at every event. Afterwards every request is run alone,
greedily, from its whole prompt (:func:`~trtio.testing.toy_runtime.greedy_generate`): the story's tokens must
equal those.

:func:`run_admissions` plays it and returns a JSON-able summary; :func:`format_admissions` renders it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtio._pages import Prefix
from trtio._setups import LLMSetup
from trtio._stream import Stream
from trtio.testing.toy_runtime import embed_batch, greedy_generate

__all__ = ["Request", "format_admissions", "run_admissions", "story_requests", "summarize_admissions"]

SYSTEM_TOKENS = 40  # the pinned system prompt: a partly filled first page of 128 tokens


@dataclass
class Request:
    """One request of the story: its prompt, the step it arrives at, its token budget, whether it starts from
    the pinned prefix (``prompt`` then holds the prefix's tokens too) or pins one (its first ``pins`` tokens)."""

    prompt: list[int]
    arrive: int
    budget: int
    from_prefix: bool = False
    pins: int = 0
    slot: int = -1
    admitted: int = -1
    finished: int = -1
    tokens: list[int] = field(default_factory=list)


def story_requests(prompts: list[list[int]], vocab: int, seed: int, max_new_tokens: int) -> list[Request]:
    """Five requests for four slots: the demo's four prompts (the second behind a seeded 40-token system prompt
    it pins; the third with a quarter of the budget, so it finishes early) arriving at steps 0, 2, 3 and 3, and
    a fifth that starts from the pinned system prompt, arrives at step 4 and waits for a free slot (the early
    finisher's, unless the budget is so small that others end first)."""
    rng = np.random.default_rng(seed + 7)
    system = [int(t) for t in rng.integers(0, vocab, SYSTEM_TOKENS)]
    own = [int(t) for t in rng.integers(0, vocab, 6)]
    short = max(1, max_new_tokens // 4)
    return [
        Request(list(prompts[0]), 0, max_new_tokens),
        Request(system + list(prompts[1]), 2, max_new_tokens, pins=len(system)),
        Request(list(prompts[2]), 3, short),
        Request(list(prompts[3]), 3, max_new_tokens),
        Request(system + own, 4, max_new_tokens, from_prefix=True),
    ]


def _event(setup: LLMSetup, step: int, what: str, req: int, slot: int, **extra: Any) -> dict[str, Any]:
    pages = setup.kv_pages
    return {"step": step, "event": what, "request": req, "slot": slot, "active": setup.active.tolist(),
            "pages_used": pages.used, "pages_total": pages.total, **extra}


def run_admissions(setup: LLMSetup, embedding: np.ndarray, requests: list[Request],
                   stream: Stream) -> dict[str, Any]:
    """Play the story (module docstring) on ``setup`` (ragged contract; it is reset first and after) and check
    each request's tokens against its greedy run alone. Returns ``{"slots", "pool_pages", "page_size",
    "events", "requests", "equal", "decode_steps", "graph_stats"}``."""
    dtype = setup.io.inputs_embeds.dtype.numpy
    slots = setup.io.max_batch
    setup.reset(stream)
    graphs_before = setup.graph_stats["llm"]
    hits, captures = graphs_before.hits, graphs_before.captures
    events: list[dict[str, Any]] = []
    waiting = list(range(len(requests)))
    where: dict[int, int] = {}  # slot -> request
    pending: dict[int, int] = {}  # slot -> the token it feeds next
    prefix: Prefix | None = None
    step = decodes = 0

    def finish(slot: int) -> None:
        req = where.pop(slot)
        pending.pop(slot)
        requests[req].finished = step
        setup.release([slot], stream)
        events.append(_event(setup, step, "release", req, slot, tokens=len(requests[req].tokens)))

    while waiting or where:
        while waiting and requests[waiting[0]].arrive <= step and len(where) < slots:
            req = waiting.pop(0)
            r = requests[req]
            slot = next(s for s in range(slots) if s not in where)
            reused = any(e["slot"] == slot and e["event"] == "release" for e in events)
            start = prefix.tokens if r.from_prefix and prefix is not None else 0
            # A request that pins its first tokens prefills them first and pins them whole, then goes on from
            # there (a prefill with past_lengths): a hybrid model's prefix keeps the states after its last token.
            head = r.pins or len(r.prompt)
            x, lens = embed_batch(embedding, [r.prompt[start:head]], dtype)
            logits = setup.prefill(x, lens, stream, slots=[slot], prefix=prefix if start else None)
            events.append(_event(setup, step, "admit", req, slot, prompt=len(r.prompt), prefix=start,
                                 reused=reused))
            if r.pins:
                prefix = setup.pin_prefix(slot, r.pins, stream)
                events.append(_event(setup, step, "pin", req, slot, tokens=prefix.tokens))
                x, lens = embed_batch(embedding, [r.prompt[head:]], dtype)
                logits = setup.prefill(x, lens, stream, slots=[slot], past_lengths=[head])
            token = int(logits.to_numpy(stream)[0].argmax())
            r.slot, r.admitted, r.tokens = slot, step, [token]
            where[slot], pending[slot] = req, token
            if len(r.tokens) == r.budget:
                finish(slot)
        if where:
            active = setup.active.tolist()  # ascending, as decode takes them by default
            x = embedding[[pending[s] for s in active]][:, None, :].astype(dtype)
            nxt = setup.decode(x, stream).to_numpy(stream).argmax(axis=-1)
            decodes += 1
            for s, t in zip(active, nxt.tolist()):
                requests[where[s]].tokens.append(int(t))
                pending[s] = int(t)
            for s in active:
                if len(requests[where[s]].tokens) == requests[where[s]].budget:
                    finish(s)
        step += 1
    if prefix is not None:
        prefix.release()
        events.append(_event(setup, step, "unpin", -1, -1, tokens=prefix.tokens))
    graphs = setup.graph_stats["llm"]
    story_graphs = {"hits": graphs.hits - hits, "captures": graphs.captures - captures}
    rows = []
    for i, r in enumerate(requests):
        solo = greedy_generate(setup, embedding, [r.prompt], r.budget, stream)[0]
        rows.append({**dataclasses.asdict(r), "request": i, "solo_tokens": solo, "equal": solo == r.tokens})
    setup.reset(stream)
    return {"slots": slots, "pool_pages": setup.kv_pages.total, "page_size": int(setup.state.page_size),
            "events": events, "requests": rows, "equal": all(r["equal"] for r in rows), "decode_steps": decodes,
            "graph_stats": story_graphs}


def summarize_admissions(a: dict[str, Any]) -> str:
    """The story of :func:`run_admissions` in one line: how many requests, slots reused, prefixes, peak KV pages,
    and whether each request's tokens equal its solo run."""
    admits = [e for e in a["events"] if e["event"] == "admit"]
    reused = sum(1 for e in admits if e["reused"])
    prefixed = sum(1 for e in admits if e["prefix"])
    peak = max((e["pages_used"] for e in a["events"]), default=0)
    steps = sorted({e["step"] for e in admits})
    return (f"sequences: {len(admits)} requests admitted into {a['slots']} slots at steps "
            f"{', '.join(map(str, steps))} while others decoded ({reused} into a released slot, {prefixed} from a "
            f"pinned prefix; KV pages in use at most {peak} of {a['pool_pages']}); each request's tokens equal its "
            f"solo greedy run: {_yes(a['equal'])}")


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def _event_line(e: dict[str, Any], requests: list[dict[str, Any]]) -> str:
    pages = f"pages in use {e['pages_used']} of {e['pages_total']}"
    if e["event"] == "admit":
        r = requests[e["request"]]
        what = (f"{e['prompt'] - e['prefix']} tokens after the pinned {e['prefix']}-token prefix" if e["prefix"]
                else f"{e['prompt']} tokens")
        slot = f"slot {e['slot']}" + (" (reused)" if e["reused"] else "")
        return (f"  step {e['step']}: request {e['request']} ({what}, budget {r['budget']}) admitted into {slot}; "
                f"active {e['active']}; {pages}")
    if e["event"] == "pin":
        return (f"  step {e['step']}: pinned the first {e['tokens']} tokens of slot {e['slot']} (request "
                f"{e['request']}'s system prompt) as a prefix, its partly filled page shared: a sequence copies "
                f"it before writing there; {pages}")
    if e["event"] == "release":
        tokens = f"{e['tokens']} token" + ("" if e["tokens"] == 1 else "s")
        return (f"  step {e['step']}: request {e['request']} finished ({tokens}, its budget); slot "
                f"{e['slot']} released; active {e['active']}; {pages}")
    return f"  end: the prefix of {e['tokens']} tokens released; {pages}"


def format_admissions(a: dict[str, Any], engine: str) -> list[str]:
    """Lines: the story of :func:`run_admissions` on the engine named ``engine``."""
    g = a["graph_stats"]
    lines = [f"requests arriving and leaving ({engine}, create_for_llm: {a['slots']} slots, a KV pool of "
             f"{a['pool_pages']} pages of {a['page_size']} tokens; {a['decode_steps']} decode steps, "
             f"{g['hits']} graph replays, {g['captures']} captures):"]
    lines += [_event_line(e, a["requests"]) for e in a["events"]]
    for r in a["requests"]:
        lines.append(f"  [{r['request']}] slot {r['slot']}, steps {r['admitted']}..{r['finished']}: "
                     + " ".join(str(t) for t in r["tokens"]))
    lines.append(f"each request's tokens equal its solo greedy run: {_yes(a['equal'])}")
    return lines
