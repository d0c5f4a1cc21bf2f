"""``trtio plan``'s sequence budget: how many sequences of a given length fit each engine's KV state.

On the ragged contract (Edge-LLM 0.11's paged pools) a sequence takes the KV pages of the entries it
holds, ``ceil(entries / page_size)``, from its engine's pool, which may be smaller than every slot's full
row; the sequences that fit are what the pool holds of them, and never more than the slots. On the batch
contract every slot owns a contiguous cache of ``max_kv_cache_capacity`` entries, so every slot fits a
sequence up to that length.

A sequence of ``N`` tokens holds ``N`` entries while it decodes on a plain LLM. On a speculative pair each
round writes past a sequence's length before it knows what the base accepts: the base's verify writes its
tree (``verify_size`` entries), the draft's proposal round its tree (``draft_top_k x draft_step`` entries)
and its catch-up the longest accepted path (``draft_step + 1``, at most ``verify_size``). A sequence of
``N`` tokens running a round therefore holds ``N`` plus that width (:func:`round_width`), and the longest
sequence a pair runs rounds on is ``max_kv_cache_capacity`` less its widest round.

:func:`sequence_fit` works on the KV-state rows of a dry run (:func:`trtio._tools.dry_run.kv_state_rows`);
:func:`format_sequence_fit` renders its result.
"""

from __future__ import annotations

from typing import Any

from trtio._config import SpecDecodeConfig
from trtio.errors import ConfigError

__all__ = ["format_sequence_fit", "round_width", "sequence_fit"]

_ROUND_STEP = {"base": "a verify writes", "draft": "a proposal round or catch-up writes"}


def round_width(role: str, spec: SpecDecodeConfig | None) -> int:
    """KV entries a step of the engine ``role`` writes past a sequence's length before they are committed:
    0 for a plain LLM (a decode writes the entry of the token it takes), ``verify_size`` for a spec-decode
    base, and for its draft the wider of a proposal round (``drafting_top_k x drafting_step``) and a catch-up
    over the longest accepted path (``drafting_step + 1`` nodes, at most ``verify_size``)."""
    if spec is None or role == "llm":
        return 0
    if role == "base":
        return spec.verify_size
    return max(spec.drafting_top_k * spec.drafting_step, min(spec.verify_size, spec.drafting_step + 1))


def _longest(rows: list[dict[str, Any]]) -> int:
    """The longest sequence every engine of ``rows`` can run its steps on."""
    return min(int(r["capacity"]) - int(r["round_width"]) for r in rows)


def sequence_fit(rows: list[dict[str, Any]], length: int | None = None) -> dict[str, Any]:
    """How many sequences of ``length`` tokens fit the KV state of each engine (``rows`` as
    :func:`~trtio._tools.dry_run.kv_state_rows` makes them, with ``capacity``, ``slots`` and ``round_width``).

    ``length`` defaults to the longest sequence the engines run their steps on (module docstring). Returns
    ``{"length", "defaulted", "longest", "engines": [{"role", "layout", "round_width", "entries", "pages"
    (None for contiguous caches), "page_size", "pool_pages", "fit_pool", "slots", "fit"}], "fit"}``: ``fit``
    is the fewest any engine holds (every engine of a pair holds each sequence). A length past the longest is
    a ConfigError naming ``--sequence-length``."""
    longest = _longest(rows)
    defaulted = length is None
    n = longest if length is None else int(length)
    if n < 1:
        raise ConfigError("--sequence-length", f"must be a positive number of tokens, got {n}")
    if n > longest:
        widest = min(rows, key=lambda r: r["capacity"] - r["round_width"])  # the engine that sets the limit
        why = (f"max_kv_cache_capacity is {widest['capacity']}" if not widest["round_width"] else
               f"{widest['role']}: {_ROUND_STEP.get(widest['role'], 'a step writes')} {widest['round_width']} "
               f"entries past a sequence's length, within max_kv_cache_capacity {widest['capacity']}")
        raise ConfigError("--sequence-length", f"{n} tokens: sequences hold at most {longest} here ({why})")
    engines = []
    for r in rows:
        entries = n + r["round_width"]
        row: dict[str, Any] = {"role": r["role"], "layout": r["layout"], "round_width": r["round_width"],
                               "entries": entries, "slots": r["slots"]}
        if r["layout"] == "paged":
            pages = -(-entries // r["page_size"])
            fit_pool = r["pool_pages"] // pages
            row.update(pages=pages, page_size=r["page_size"], pool_pages=r["pool_pages"], fit_pool=fit_pool,
                       fit=min(fit_pool, r["slots"]))
        else:  # a contiguous cache per slot, always max_kv_cache_capacity long
            row.update(pages=None, page_size=None, pool_pages=None, fit_pool=None, fit=r["slots"])
        engines.append(row)
    return {"length": n, "defaulted": defaulted, "longest": longest, "engines": engines,
            "fit": min(e["fit"] for e in engines)}


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def format_sequence_fit(fit: dict[str, Any]) -> list[str]:
    """Lines: the sequence budget of :func:`sequence_fit`."""
    n = fit["length"]
    widths = [e["round_width"] for e in fit["engines"]]
    if not fit["defaulted"]:
        source = "--sequence-length"
    elif any(widths):
        source = (f"default: the longest a speculative pair runs rounds on, max_kv_cache_capacity less its widest "
                  f"round of {max(widths)} entries")
    else:
        source = "default: max_kv_cache_capacity"
    lines = [f"sequences of {n} tokens ({source}):"]
    for e in fit["engines"]:
        held = (f"{n} + {e['round_width']} entries {_ROUND_STEP[e['role']]} past them = {e['entries']} entries"
                if e["round_width"] else f"{e['entries']} entries")
        if e["pages"] is None:
            lines.append(f"  {e['role']}: {held} in a contiguous cache per slot; {_count(e['slots'], 'slot')}: "
                         f"{e['fit']} fit")
            continue
        limit = ("the slots" if e["slots"] < e["fit_pool"] else "the pool" if e["fit_pool"] < e["slots"]
                 else "the pool and the slots")
        lines.append(f"  {e['role']}: {held}, {_count(e['pages'], 'page')} of {e['page_size']} tokens each; the "
                     f"pool's {e['pool_pages']} pages hold {e['fit_pool']} such sequences, with "
                     f"{_count(e['slots'], 'slot')}: {e['fit']} fit (limited by {limit})")
    if len(fit["engines"]) > 1:
        lines.append(f"  {fit['fit']} fit in every engine's KV state")
    return lines
