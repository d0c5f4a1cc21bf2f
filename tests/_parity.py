"""Real-graph parity (DESIGN §17): trtio drives NVIDIA's exported graph (:class:`trtio.testing.OnnxEngine`) of a
tiny seeded checkpoint, and every compared row of logits must equal Hugging Face's fp32 forward on the same
checkpoint within ``TOLERANCE``, with the same greedy tokens.

A case is a folder of ``tests/fixtures/parity/`` written by ``scripts/make_parity_fixtures.py``: each role's
exported graph, ``builder_config.json``, ``profiles.json`` (the real builder's profiles) and the reference
(``reference.npz`` + ``reference.json``). The scenario functions below are the ones every text family runs; each
returns the worst |Δ logits| it saw. :func:`planted` runs a scenario with an input hook that plants a wrong runtime
input (as a trtio bug would write it) and returns how the parity check failed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trtio

pytest.importorskip("onnx")

from trtio.testing import OnnxEngine  # noqa: E402 - after the skip: OnnxEngine needs onnx on use

FIXTURES = Path(__file__).parent / "fixtures" / "parity"
TOLERANCE = 0.1  # fp16 graph against fp32 Hugging Face; a wrong runtime input moves logits by 1-10


class ParityMismatch(AssertionError):
    """A compared row differs from Hugging Face's beyond the tolerance, or a greedy token differs."""


@dataclass(frozen=True)
class Seq:
    """One reference sequence: its prompt, its greedy continuation and HF's logits at the stored rows."""

    index: int
    purpose: str
    tokens: np.ndarray  # prompt + greedy continuation
    prompt_length: int
    marks: tuple[int, ...]
    rows: dict[int, np.ndarray]  # position -> HF's logits there

    @property
    def prompt(self) -> np.ndarray:
        return self.tokens[:self.prompt_length]

    @property
    def greedy(self) -> np.ndarray:
        return self.tokens[self.prompt_length:]


class Case:
    """A parity fixture folder, read once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.root = FIXTURES / name
        self.meta = json.loads((self.root / "reference.json").read_text())
        self.builder = json.loads((self.root / "builder_config.json").read_text())
        self.profiles = json.loads((self.root / "profiles.json").read_text())
        graphs = self.root / "graphs.json"  # a role that shares another role's graph (another builder config)
        self.graphs: dict[str, str] = json.loads(graphs.read_text()) if graphs.is_file() else {}
        with np.load(self.root / "reference.npz") as data:
            self.arrays = {k: data[k] for k in data.files}
        self.seqs = []
        for i, info in enumerate(self.meta["sequences"]):
            rows = {int(p): row for p, row in zip(self.arrays[f"positions_{i}"], self.arrays[f"logits_{i}"])}
            self.seqs.append(Seq(i, info["purpose"], self.arrays[f"tokens_{i}"], int(info["prompt_length"]),
                                 tuple(info.get("marks", ())), rows))

    def of(self, purpose: str) -> list[Seq]:
        return [s for s in self.seqs if s.purpose == purpose]

    def engine(self, role: str = "llm", backend: Any = "host") -> OnnxEngine:
        return OnnxEngine.from_export(self.root / self.graphs.get(role, role), self.builder[role], backend=backend)

    def table(self, role: str = "llm") -> np.ndarray:
        from safetensors.numpy import load_file

        (table,) = load_file(self.root / self.graphs.get(role, role) / "embedding.safetensors").values()
        return table.astype(np.float16)


class Compare:
    """Holds trtio's rows to HF's: the worst |Δ| seen, and the rows compared."""

    def __init__(self, tolerance: float = TOLERANCE) -> None:
        self.tolerance = tolerance
        self.worst = 0.0
        self.rows = 0

    def row(self, seq: Seq, position: int, got: np.ndarray, what: str) -> None:
        self.values(seq.rows[position], got, f"sequence {seq.index} ({seq.purpose}) row {position} ({what})")

    def values(self, want: np.ndarray, got: np.ndarray, what: str) -> None:
        """One row of logits held to a reference row (``what`` names it in a mismatch)."""
        delta = float(np.abs(np.asarray(got, np.float32) - want).max())
        self.worst = max(self.worst, delta)
        self.rows += 1
        if not delta <= self.tolerance:  # NaN fails too
            raise ParityMismatch(f"{what}: max |Δ logits| {delta:.4f} > {self.tolerance}")

    def token(self, seq: Seq, position: int, got: int, what: str) -> None:
        want = int(seq.tokens[position + 1])
        if got != want:
            raise ParityMismatch(f"sequence {seq.index} ({seq.purpose}) token after row {position} ({what}): trtio "
                                 f"{got}, Hugging Face {want}")


# -- the text scenarios -----------------------------------------------------------------------------------------------


def _embeds(table: np.ndarray, rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    return table[ids], np.array([len(r) for r in rows], np.int32)


def decode_all(setup: Any, table: np.ndarray, seqs: list[Seq], cmp: Compare, next_row: list[int],
               steps: int, slots: list[int] | None = None) -> None:
    """``steps`` decodes of ``seqs`` (in ``slots``' order), each fed the previous greedy token; rows compared."""
    for _ in range(steps):
        tokens = np.array([s.tokens[p + 1] for s, p in zip(seqs, next_row)])
        logits = setup.decode(table[tokens][:, None, :], slots=slots).to_numpy()
        for i, s in enumerate(seqs):
            next_row[i] += 1
            cmp.row(s, next_row[i], logits[i], "decode")
            cmp.token(s, next_row[i], int(logits[i].argmax()), "decode")


def batch(setup: Any, case: Case, cmp: Compare) -> None:
    """A batch of prompts of different lengths, prefilled together, then decoded together."""
    table, seqs = case.table(), case.of("batch")
    x, lens = _embeds(table, [s.prompt for s in seqs])
    logits = setup.prefill(x, lens).to_numpy()
    for i, s in enumerate(seqs):
        cmp.row(s, s.prompt_length - 1, logits[i], "prefill")
        cmp.token(s, s.prompt_length - 1, int(logits[i].argmax()), "prefill")
    decode_all(setup, table, seqs, cmp, [s.prompt_length - 1 for s in seqs], case.meta["continuation"] - 1)


def chunked(setup: Any, case: Case, cmp: Compare, chunk: int = 48) -> None:
    """One long prompt prefilled ``chunk`` tokens at a time (phase 2 after the first), across a 128-token page."""
    table, (s,) = case.table(), case.of("chunked")
    done = 0
    while done < s.prompt_length:
        n = min(chunk, s.prompt_length - done)
        x = table[s.prompt[done:done + n]][None]
        logits = setup.prefill(x, [n], slots=[0], past_lengths=None if done == 0 else [done]).to_numpy()
        done += n
        cmp.row(s, done - 1, logits[0], f"chunk ending at {done}")
    cmp.token(s, s.prompt_length - 1, int(logits[0].argmax()), "last chunk")
    decode_all(setup, table, [s], cmp, [s.prompt_length - 1], case.meta["continuation"] - 1)


def admission(setup: Any, case: Case, cmp: Compare) -> None:
    """Three sequences decode; the middle one is released; a new request is admitted into its slot while the
    other two go on decoding."""
    table, seqs, (new,) = case.table(), case.of("batch"), case.of("admit")
    x, lens = _embeds(table, [s.prompt for s in seqs])
    setup.prefill(x, lens)
    rows = [s.prompt_length - 1 for s in seqs]
    decode_all(setup, table, seqs, cmp, rows, 2)
    setup.release([1])
    logits = setup.prefill(table[new.prompt][None], [new.prompt_length], slots=[1]).to_numpy()
    cmp.row(new, new.prompt_length - 1, logits[0], "admitted")
    cmp.token(new, new.prompt_length - 1, int(logits[0].argmax()), "admitted")
    order = [seqs[0], new, seqs[2]]
    decode_all(setup, table, order, cmp, [rows[0], new.prompt_length - 1, rows[2]], 3, slots=[0, 1, 2])


def prefix(setup: Any, case: Case, cmp: Compare, chunk: int = 48) -> None:
    """A prefix (a full page and part of another) prefilled in one slot and pinned; the slot is released; a new
    request starts from the prefix in another slot with the rest of the prompt (HF ran the whole prompt)."""
    table, (s,) = case.table(), case.of("prefix")
    (mark,) = s.marks
    pinned = mark + 1
    done = 0
    while done < pinned:
        n = min(chunk, pinned - done)
        logits = setup.prefill(table[s.prompt[done:done + n]][None], [n], slots=[2],
                               past_lengths=None if done == 0 else [done]).to_numpy()
        done += n
    cmp.row(s, mark, logits[0], "prefix prefill")
    with contextlib.closing(setup.pin_prefix(2, pinned)) as pfx:
        setup.release([2])
        rest = s.prompt[pinned:]
        logits = setup.prefill(table[rest][None], [len(rest)], slots=[0], prefix=pfx).to_numpy()
        cmp.row(s, s.prompt_length - 1, logits[0], "after the prefix")
        cmp.token(s, s.prompt_length - 1, int(logits[0].argmax()), "after the prefix")
        decode_all(setup, table, [s], cmp, [s.prompt_length - 1], case.meta["continuation"] - 1, slots=[0])
        setup.release([0])


TEXT_SCENARIOS: dict[str, Callable[[Any, Case, Compare], None]] = {
    "batch": batch, "chunked": chunked, "admission": admission, "prefix": prefix,
}


# -- running them -----------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def llm_setup(case: Case, backend: str = "host", graphs: bool = False,
              hook: Callable[[dict[str, np.ndarray]], None] | None = None) -> Iterator[Any]:
    engine = case.engine("llm", backend)
    engine.input_hook = hook
    cfg = trtio.LLMEngineConfig.from_edgellm(engine.config, what=f"{case.name}/llm/config.json")
    with trtio.create_for_llm(engine, cfg, graphs=graphs, backend=backend) as setup:
        yield setup


def run(case: Case, scenario: str, backend: str = "host", graphs: bool = False,
        hook: Callable[[dict[str, np.ndarray]], None] | None = None) -> Compare:
    cmp = Compare()
    with llm_setup(case, backend, graphs, hook) as setup:
        TEXT_SCENARIOS[scenario](setup, case, cmp)
    return cmp


def planted(case: Case, scenario: str, hook: Callable[[dict[str, np.ndarray]], None]) -> str:
    """Run ``scenario`` with ``hook`` planting a wrong input; return how the check failed (a mismatch's message,
    or a plugin model's refusal). AssertionError if the scenario still passed: the bug went unseen."""
    try:
        run(case, scenario, hook=hook)
    except ParityMismatch as exc:
        return f"mismatch: {exc}"
    except trtio.errors.InvalidValueError as exc:
        return f"refused: {exc}"
    raise AssertionError(f"{case.name}/{scenario}: the planted bug passed the parity check")


def when(phase: int | None = None, after: int = 0) -> Callable[[Callable[[dict[str, np.ndarray]], None]],
                                                               Callable[[dict[str, np.ndarray]], None]]:
    """A hook that plants its bug only in steps of ``phase`` (the phase marker's extent), from the ``after``-th
    such step on: a bug in the decode's inputs leaves the prefill right, and so on."""
    def wrap(bug: Callable[[dict[str, np.ndarray]], None]) -> Callable[[dict[str, np.ndarray]], None]:
        seen = [0]

        def hook(inputs: dict[str, np.ndarray]) -> None:
            if phase is None or inputs["execution_phase_marker"].shape[0] == phase:
                seen[0] += 1
                if seen[0] > after:
                    bug(inputs)
        return hook
    return wrap


# -- planted input bugs ----------------------------------------------------------------------------------------------


def _copy(inputs: dict[str, np.ndarray], name: str) -> np.ndarray:
    inputs[name] = np.array(inputs[name])
    return inputs[name]


def _rope_halves_swapped(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "rope_rotary_cos_sin")
    half = t.shape[1] // 2
    t[:] = np.concatenate([t[:, half:], t[:, :half]], axis=1)


def _rope_row_late(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "rope_rotary_cos_sin")
    t[1:] = t[:-1].copy()


def _past_plus_one(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "past_lengths")[:] += 1


def _sequence_lengths_plus_one(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "attention_sequence_lengths")[:] += 1


def _query_lengths_minus_one(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "query_lengths")[:] -= 1


def _logits_row_early(inputs: dict[str, np.ndarray]) -> None:
    _copy(inputs, "logits_indices")[:] -= 1


def _v_ids_unshifted(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "kv_page_table")
    t[:, 1] = t[:, 0]


def _pages_swapped(inputs: dict[str, np.ndarray]) -> None:
    t = _copy(inputs, "kv_page_table")
    t[[0, 1]] = t[[1, 0]]


def _context_count_in_decode(inputs: dict[str, np.ndarray]) -> None:
    inputs["context_sequence_count_carrier"] = np.zeros(inputs["query_lengths"].shape[0], np.int32)


def _cumulative_offsets(inputs: dict[str, np.ndarray]) -> None:
    lengths = inputs["query_lengths"]
    inputs["query_start_offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _phase_one_for_a_chunk(inputs: dict[str, np.ndarray]) -> None:
    inputs["execution_phase_marker"] = np.zeros(1, np.int32)


# (scenario, hook): each plants one wrong runtime input, as a trtio bug would write it.
TEXT_BUGS: dict[str, tuple[str, Callable[[dict[str, np.ndarray]], None]]] = {
    "RoPE halves swapped": ("batch", _rope_halves_swapped),
    "RoPE rows one position late": ("batch", _rope_row_late),
    "past_lengths off by one (a chunk)": ("chunked", when(phase=2)(_past_plus_one)),
    "attention_sequence_lengths off by one (decode)": ("batch", when(phase=3)(_sequence_lengths_plus_one)),
    "query_lengths one short (prefill)": ("batch", when(phase=1)(_query_lengths_minus_one)),
    "logits row one early": ("batch", _logits_row_early),
    "V page ids not shifted by the pool": ("batch", _v_ids_unshifted),
    "two sequences' pages swapped (decode)": ("batch", when(phase=3)(_pages_swapped)),
    "a context count in decode": ("batch", when(phase=3)(_context_count_in_decode)),
    "cumulative query offsets": ("batch", when(phase=1)(_cumulative_offsets)),
    "phase 1 where a chunk over a cached prefix needs phase 2": ("chunked", when(phase=2)(_phase_one_for_a_chunk)),
}
