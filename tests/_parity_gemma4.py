"""Gemma 4's real-graph parity scenarios (DESIGN §17): the text scenarios of ``tests/_parity.py`` with each step's
per-layer embeddings (``ple_embeds``: the token's row of the export's ``ple_embedding.safetensors``), over exported
graphs each built two ways: ``llm`` (full SWA storage) and ``llm-bounded`` (the bounded SWA pool).

The window is 24 tokens; every prompt is longer, so each prefill row past the 24th and every decode attends over a
window that slides. ``gemma4`` (KV sharing): a batch whose long prompt (126 tokens) decodes across the 128-token
page (the window on two pages), and an admission into a released slot. ``gemma4-unshared`` (no KV sharing: Edge-LLM
0.11 mis-rotates a KV-sharing layer's queries in a step over a cached prefix, and trtio refuses those steps there):
a prompt prefilled in chunks, each starting on the last chunk's window (the last one's spans two pages), whose
decodes move the window's first key past token 128 (a bounded window retires page 0 and rotates it back to the
sequence's reserve), and a pinned prefix continued.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import trtio
from tests._parity import Case, Compare, ParityMismatch, Seq
from trtio.testing import OnnxEngine

CASE = "gemma4"  # KV sharing: steps from an empty cache
UNSHARED = "gemma4-unshared"  # no KV sharing: steps over a cached prefix (refused on a KV-sharing engine)
ROLES = {"full": "llm", "bounded": "llm-bounded"}
# fp16 graph against fp32 Hugging Face, as for the dense families (worst 0.069 here; Hugging Face's own fp16 forward
# is up to 0.10 off on the same rows: reference.json's hf_fp16_worst)
TOLERANCE = 0.1
Hook = Callable[[dict[str, np.ndarray]], None]


class Tables:
    """The export's lookup tables: the embedding and the per-layer embedding (``[vocab, L x ple_hidden]``)."""

    def __init__(self, case: Case) -> None:
        from safetensors.numpy import load_file

        self.embedding = case.table()
        (ple,) = load_file(case.root / "llm" / "ple_embedding.safetensors").values()
        self.ple = ple.astype(np.float16)

    def rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(inputs_embeds, ple_embeds)`` of token ids ``[batch, seq]``."""
        return self.embedding[ids], self.ple[ids]


def _padded(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    return ids, np.array([len(r) for r in rows], np.int32)


def decode_all(setup: Any, t: Tables, seqs: list[Seq], cmp: Compare, next_row: list[int], steps: int,
               slots: list[int] | None = None) -> None:
    """``steps`` decodes of ``seqs`` (in ``slots``' order), each fed the previous greedy token; rows compared."""
    for _ in range(steps):
        ids = np.array([[s.tokens[p + 1]] for s, p in zip(seqs, next_row)])
        x, ple = t.rows(ids)
        logits = setup.decode(x, slots=slots, ple_embeds=ple).to_numpy()
        for i, s in enumerate(seqs):
            next_row[i] += 1
            cmp.row(s, next_row[i], logits[i], "decode")
            cmp.token(s, next_row[i], int(logits[i].argmax()), "decode")


def _prefill(setup: Any, t: Tables, prompts: list[np.ndarray], **kwargs: Any) -> np.ndarray:
    ids, lens = _padded(prompts)
    x, ple = t.rows(ids)
    out: np.ndarray = setup.prefill(x, lens, ple_embeds=ple, **kwargs).to_numpy()
    return out


def batch(setup: Any, case: Case, cmp: Compare) -> None:
    """Two prompts of different lengths, both past the window (the longer, 126 tokens, five windows), prefilled
    together and decoded together: the longer one's window moves onto a second page."""
    t, seqs = Tables(case), case.of("batch")
    logits = _prefill(setup, t, [s.prompt for s in seqs])
    for i, s in enumerate(seqs):
        cmp.row(s, s.prompt_length - 1, logits[i], "prefill")
        cmp.token(s, s.prompt_length - 1, int(logits[i].argmax()), "prefill")
    decode_all(setup, t, seqs, cmp, [s.prompt_length - 1 for s in seqs], case.meta["continuation"] - 1)


def chunked(setup: Any, case: Case, cmp: Compare, chunk: int = 48) -> None:
    """150 tokens prefilled 48 at a time (phase 2 after the first: each chunk's first rows see the last chunk's
    window), then decoded past the point where the window leaves the first page."""
    t, (s,) = Tables(case), case.of("chunked")
    done = 0
    while done < s.prompt_length:
        n = min(chunk, s.prompt_length - done)
        logits = _prefill(setup, t, [s.prompt[done:done + n]], slots=[0],
                          past_lengths=None if done == 0 else [done])
        done += n
        cmp.row(s, done - 1, logits[0], f"chunk ending at {done}")
    cmp.token(s, s.prompt_length - 1, int(logits[0].argmax()), "last chunk")
    decode_all(setup, t, [s], cmp, [s.prompt_length - 1], case.meta["continuation"] - 1)


def admission(setup: Any, case: Case, cmp: Compare) -> None:
    """The batch decodes; its first sequence is released and a new request admitted into that slot while the
    long one goes on decoding across its page (a bounded window's pages back to the pool and reserved again)."""
    t, seqs, (new,) = Tables(case), case.of("batch"), case.of("admit")
    _prefill(setup, t, [s.prompt for s in seqs])
    rows = [s.prompt_length - 1 for s in seqs]
    decode_all(setup, t, seqs, cmp, rows, 2)
    setup.release([0])
    logits = _prefill(setup, t, [new.prompt], slots=[0])
    cmp.row(new, new.prompt_length - 1, logits[0], "admitted")
    cmp.token(new, new.prompt_length - 1, int(logits[0].argmax()), "admitted")
    decode_all(setup, t, [new, seqs[1]], cmp, [new.prompt_length - 1, rows[1]], 4, slots=[0, 1])


def prefix(setup: Any, case: Case, cmp: Compare, chunk: int = 48) -> None:
    """Full storage only: a prefix of 133 tokens pinned in one slot, the slot released, a new request continuing
    from the prefix in another slot (Hugging Face ran the whole prompt)."""
    t, (s,) = Tables(case), case.of("prefix")
    (mark,) = s.marks
    pinned = mark + 1
    done = 0
    while done < pinned:
        n = min(chunk, pinned - done)
        logits = _prefill(setup, t, [s.prompt[done:done + n]], slots=[2],
                          past_lengths=None if done == 0 else [done])
        done += n
    cmp.row(s, mark, logits[0], "prefix prefill")
    with contextlib.closing(setup.pin_prefix(2, pinned)) as pfx:
        setup.release([2])
        logits = _prefill(setup, t, [s.prompt[pinned:]], slots=[0], prefix=pfx)
        cmp.row(s, s.prompt_length - 1, logits[0], "after the prefix")
        cmp.token(s, s.prompt_length - 1, int(logits[0].argmax()), "after the prefix")
        decode_all(setup, t, [s], cmp, [s.prompt_length - 1], case.meta["continuation"] - 1, slots=[0])
        setup.release([0])


SCENARIOS: dict[str, Callable[[Any, Case, Compare], None]] = {
    "batch": batch, "chunked": chunked, "admission": admission, "prefix": prefix,
}
# case -> storage -> its scenarios (pin_prefix is refused in bounded storage)
RUNS = {CASE: {"full": ("batch", "admission"), "bounded": ("batch", "admission")},
        UNSHARED: {"full": ("chunked", "prefix"), "bounded": ("chunked",)}}


@contextlib.contextmanager
def gemma4_setup(case: Case, storage: str, backend: str = "host", graphs: bool = False,
                 hook: Hook | None = None) -> Iterator[Any]:
    """trtio's setup on the case's graph built for ``storage`` ("full" or "bounded"); checks the SWA mode it
    binds is that one."""
    role = ROLES[storage]
    engine: OnnxEngine = case.engine(role, backend)
    engine.input_hook = hook
    cfg = trtio.LLMEngineConfig.from_edgellm(engine.config, what=f"{case.name}/{role}/config.json")
    with trtio.create_for_llm(engine, cfg, graphs=graphs, backend=backend) as setup:
        modes = {e.state.kv_parts["swa_mode"].bounded for e in setup.engines() if "swa_mode" in e.state.kv_parts}
        if modes != {storage == "bounded"}:
            raise AssertionError(f"{role}: trtio bound {'bounded' if True in modes else 'full'} SWA storage")
        yield setup


def run(case: Case, scenario: str, storage: str = "full", backend: str = "host", graphs: bool = False,
        hook: Hook | None = None, tolerance: float = TOLERANCE) -> Compare:
    cmp = Compare(tolerance)
    with gemma4_setup(case, storage, backend, graphs, hook) as setup:
        SCENARIOS[scenario](setup, case, cmp)
    return cmp


def planted(case: Case, scenario: str, storage: str, hook: Hook) -> str:
    """``scenario`` with ``hook`` planting a wrong input: how the check failed (AssertionError if it passed)."""
    try:
        run(case, scenario, storage, hook=hook)
    except ParityMismatch as exc:
        return f"mismatch: {exc}"
    except trtio.errors.InvalidValueError as exc:
        return f"refused: {exc}"
    raise AssertionError(f"{case.name}/{storage}/{scenario}: the planted bug passed the parity check")
