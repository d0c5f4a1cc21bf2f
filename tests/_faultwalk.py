"""The fault walk: every backend call (and engine enqueue) a step makes, made to fail in turn.

For one setup kind, a script of steps is run once without faults (the reference results), once recording
the calls each step makes, and then, for each call of the step under test, on a fresh setup: the steps
before it, the step with that call made to fail, then the same step again and every later step. The rule
(``docs/faults.md``): the step raises a TrtioError and leaves the setup as it was, so that the retry and
every later step give the reference results; or the setup says it is broken, refuses every later step with
one error naming that, and ``reset()`` (then the script from its start) or ``close()`` still work. After
``close()`` the backend's live allocations, events, streams and graphs are back at their baseline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import _configs
import numpy as np

import trtio
from trtio import DeploymentConfig, LLMEngineConfig, TrtioError
from trtio._cuda.backend import Backend
from trtio.testing import FaultyBackend, ReferenceEngine
from trtio.testing.faulty import Call

H = 16
KINDS = ["llm-batch", "llm-ragged", "spec-batch", "spec-ragged"]
# Ragged: pages of 4 tokens in pools of 12 (< 2 slots x 8 pages), so that steps take pages and prefixes share them.
PAGES = {"page": 4, "pool": 12}


def tiny_llm(contract: str) -> LLMEngineConfig:
    return _configs.tiny_llm(contract, **PAGES)


def tiny_bundle(contract: str) -> DeploymentConfig:
    return _configs.tiny_bundle(contract, **PAGES)


_RNG = np.random.default_rng(20)


def _x(*shape: int) -> np.ndarray:
    return (_RNG.standard_normal((*shape, H)) * 0.5).astype(np.float16)


def _prompt(lens: list[int], width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    w = width or max(lens)
    x = _x(len(lens), w)
    for i, n in enumerate(lens):
        x[i, n:] = 0
    return x, np.array(lens, np.int64)


Step = tuple[str, Callable[[Any, dict[str, Any]], Any]]


def _read(t: Any) -> Any:
    """A step's result as the host reads it (outside the fault window: reading synchronises)."""
    return t.to_numpy().copy() if isinstance(t, trtio.Tensor) else None


def _llm_batch_script() -> list[Step]:
    p0, p1, p2 = _prompt([3, 4]), _prompt([2]), _prompt([5])
    d = [_x(2, 1) for _ in range(3)] + [_x(1, 1)]
    return [
        ("prefill", lambda s, c: s.prefill(*p0)),
        ("populate_streaming", lambda s, c: s.populate_streaming()),
        ("decode", lambda s, c: s.decode(d[0])),
        ("decode", lambda s, c: s.decode(d[1])),
        ("decode", lambda s, c: s.decode(d[2])),
        ("reset", lambda s, c: s.reset()),
        ("prefill", lambda s, c: s.prefill(*p1)),
        ("decode", lambda s, c: s.decode(d[3])),
        ("prefill", lambda s, c: s.prefill(*p2)),
    ]


def _llm_ragged_script() -> list[Step]:
    p0, p1, p2, p3 = _prompt([5]), _prompt([3]), _prompt([2]), _prompt([2])
    d = [_x(2, 1) for _ in range(3)] + [_x(1, 1), _x(2, 1)]

    def pin(s: Any, c: dict[str, Any]) -> None:
        c["prefix"] = s.pin_prefix(0, 6)

    return [
        ("prefill", lambda s, c: s.prefill(*p0)),
        ("prefill(slots)", lambda s, c: s.prefill(*p1, slots=[1])),
        ("prefill(past_lengths)", lambda s, c: s.prefill(*p3, slots=[1], past_lengths=[3])),
        ("decode", lambda s, c: s.decode(d[0])),
        ("decode", lambda s, c: s.decode(d[1])),
        ("decode(slots)", lambda s, c: s.decode(d[3], slots=[1])),
        ("pin_prefix", pin),
        ("release", lambda s, c: s.release([0])),
        ("prefill(prefix)", lambda s, c: s.prefill(*p2, slots=[0], prefix=c["prefix"])),
        ("decode", lambda s, c: s.decode(d[2])),
        ("decode", lambda s, c: s.decode(d[4])),
        ("reset", lambda s, c: s.reset()),
        ("prefill", lambda s, c: s.prefill(*p1)),
    ]


def _round(tree: list[int], paths: list[list[int]], width: int) -> list[Step]:
    """A speculative round: two draft levels, a verify of ``tree``, ``paths`` accepted, the catch-up."""
    lv0, lv1 = _x(2, 2), _x(2, 2)
    ver = _x(2, len(tree))
    acc = [len(p) for p in paths]
    catch = _x(2, width)
    return [
        ("draft_propose", lambda s, c: s.draft_propose(lv0, parents=[-1, -1])),
        ("draft_propose", lambda s, c: s.draft_propose(lv1, parents=[[0, 1], [1, 1]])),
        ("verify", lambda s, c: s.verify(ver, tree)),
        ("accept", lambda s, c: s.accept(paths)),
        ("draft_accept", lambda s, c: s.draft_accept(catch, acc)),
    ]


def _spec_script(contract: str) -> list[Step]:
    p0 = _prompt([3, 4])
    shifted = _prompt([3, 4])
    tree = [-1, 0, 0, 2]  # paths [0, 2, 3] and [0, 1]: the catch-up's rows move onto rows it reads
    steps: list[Step] = [
        ("base_prefill", lambda s, c: s.base_prefill(*p0)),
        ("draft_prefill", lambda s, c: s.draft_prefill(*shifted)),
    ]
    steps += _round(tree, [[0, 2, 3], [0, 1]], 3)
    steps += _round(tree, [[0, 1], [0, 2, 3]], 3)
    if contract == "ragged":
        q = _prompt([2])
        q2 = _prompt([2])
        steps += [
            ("release", lambda s, c: s.release([1])),
            ("base_prefill(slots)", lambda s, c: s.base_prefill(*q, slots=[1])),
            ("draft_prefill(slots)", lambda s, c: s.draft_prefill(*q2, slots=[1])),
        ]
        steps += _round(tree, [[0, 2], [0, 2, 3]], 3)
    steps.append(("reset", lambda s, c: s.reset()))
    steps.append(("base_prefill", lambda s, c: s.base_prefill(*p0)))
    return steps


class Kind:
    """Setups of one kind on a FaultyBackend over ``inner``, their engines made once, and the script."""

    def __init__(self, kind: str, inner: Backend, device: str = "host", *, graphs: bool = True,
                 plant: Callable[[Any], None] | None = None) -> None:
        self.kind = kind
        self.plant = plant  # a bug planted into each setup made (the walk must then fail)
        role, self.contract = kind.split("-")
        self.spec = role == "spec"
        self.graphs = graphs
        self.faulty = FaultyBackend(inner)
        self.script = self.script_of(kind)
        if self.spec:
            self.bundle = tiny_bundle(self.contract)
            self.engines = (ReferenceEngine.from_config(self.bundle.base, device=device),
                            ReferenceEngine.from_config(self.bundle.draft, device=device))
        else:
            self.cfg = tiny_llm(self.contract)
            self.engine = ReferenceEngine.from_config(self.cfg, device=device)

    @staticmethod
    def script_of(kind: str) -> list[Step]:
        """The steps a setup of ``kind`` runs: every step helper, first captures and replays, admissions."""
        role, contract = kind.split("-")
        if role == "spec":
            return _spec_script(contract)
        return _llm_batch_script() if contract == "batch" else _llm_ragged_script()

    def create(self) -> Any:
        if self.spec:
            setup = trtio.create_for_spec_decode(*self.engines, self.bundle, graphs=self.graphs, backend=self.faulty)
        else:
            setup = trtio.create_for_llm(self.engine, self.cfg, graphs=self.graphs, backend=self.faulty)
        for e in setup.engines():  # fresh memory may hold anything: every run starts from zeros
            e.state.reset(None, clear=True)
        self.faulty.watch(setup)
        if self.plant is not None:
            self.plant(setup)
        return setup


def live(be: Backend) -> dict[str, int]:
    return {"allocations": be.live_allocations, "events": be.live_events, "streams": be.live_streams,
            "graphs": be.live_graphs}


def snapshot(setup: Any) -> dict[str, Any]:
    """What a failed step must leave as it was: lengths, slots, pages, tree state, live resources."""
    out: dict[str, Any] = {"active": setup.active.tolist()}
    for e in setup.engines():
        out[f"{e.role}.lengths"] = e.state.lengths.tolist()
    seqs = setup._seqs
    for role, t in seqs.tables.items():
        out[f"{role}.rows"] = t.rows.tolist()
        out[f"{role}.limit"] = t.limit.tolist()
        out[f"{role}.refs"] = t.pool._refs.tolist()
        out[f"{role}.free"] = sorted(t.pool._free)
    if hasattr(setup, "_streaming_pending"):
        out["streaming_pending"] = setup._streaming_pending
    if hasattr(setup, "_tree"):
        tree = setup._tree
        out["tree"] = (tree.nodes, tree._level, [p.tolist() for p in tree._parents])
        out["prompt"] = setup._prompt is not None
        out["phase"] = setup.phase.name
        out["verified"] = setup._verified is not None
        out["accepted"] = None if setup._accepted is None else setup._accepted.tolist()
        out["roots"] = setup._roots.rows.tolist()
    out["live"] = live(setup._backend)
    return out


def equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return bool(np.array_equal(a, b, equal_nan=True))


@dataclass
class Outcome:
    """What became of one fault position."""

    step: int
    name: str
    call: Call
    result: str  # "retried", "absorbed", "broken", or what went wrong
    detail: str = ""


@dataclass
class Walk:
    """The walk over one setup kind (see module docstring): the reference results and each step's calls
    (:meth:`prepare`), and the outcome of each fault position walked so far."""

    kind: Kind
    reference: list[Any] = field(default_factory=list)
    calls: list[list[Call]] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)

    def prepare(self) -> None:
        """The reference results and each step's calls (one run each, without faults)."""
        k = self.kind
        with k.create() as setup:
            ctx: dict[str, Any] = {}
            for _name, fn in k.script:
                with k.faulty.recording() as calls:
                    got = fn(setup, ctx)
                self.calls.append(calls)
                self.reference.append(_read(got))
        with k.create() as setup:  # a second run gives the same results: the comparison is sound
            ctx = {}
            for i, (name, fn) in enumerate(k.script):
                again = _read(fn(setup, ctx))
                assert equal(again, self.reference[i]), f"step {i} ({name}) differs between two fault-free runs"

    def run(self, step: int, call: Call) -> Outcome:
        """The script on a fresh setup with ``call`` of step ``step`` made to fail (see module docstring); after
        ``close()`` the backend's live resources must be at their baseline."""
        k = self.kind
        inner = k.faulty.inner
        base = live(inner)
        setup = k.create()
        try:
            outcome = self._attempt(setup, step, call)
        except Exception as exc:  # noqa: BLE001 - reported as the outcome
            outcome = Outcome(step, k.script[step][0], call, "unexpected error", f"{type(exc).__name__}: {exc}")
        finally:
            k.faulty.clear()
            setup.close()
        if live(inner) != base:
            return Outcome(step, k.script[step][0], call, "leak", f"{base} -> {live(inner)}")
        return outcome

    def _attempt(self, setup: Any, step: int, call: Call) -> Outcome:
        k, name = self.kind, self.kind.script[step][0]
        ctx: dict[str, Any] = {}
        for i in range(step):
            k.script[i][1](setup, ctx)
        before = snapshot(setup)
        k.faulty.fail(*call)
        got = None
        try:
            got = k.script[step][1](setup, ctx)
        except TrtioError as exc:
            error: TrtioError | None = exc
        else:
            error = None
        if k.faulty.armed:
            return Outcome(step, name, call, "fault did not fire")
        got = _read(got)
        why = "" if error is None else f"{type(error).__name__}: {error}"
        if error is None:
            result = "absorbed"
            if not equal(got, self.reference[step]):
                return Outcome(step, name, call, "absorbed fault gave other results")
        elif setup.is_broken:
            return self._broken(setup, step, call, why)
        else:
            result = "retried"
            after = snapshot(setup)
            if after != before:
                diff = {key: (before[key], after.get(key)) for key in before if before[key] != after.get(key)}
                return Outcome(step, name, call, "state changed", f"{why}; {diff}")
            got = _read(k.script[step][1](setup, ctx))
            if not equal(got, self.reference[step]):
                return Outcome(step, name, call, "retry differs", why)
        for i in range(step + 1, len(k.script)):
            got = _read(k.script[i][1](setup, ctx))
            if not equal(got, self.reference[i]):
                return Outcome(step, name, call, f"later step {i} ({k.script[i][0]}) differs", why)
        return Outcome(step, name, call, result, why)

    def _broken(self, setup: Any, step: int, call: Call, why: str) -> Outcome:
        """A broken setup refuses the step (naming that it is broken); after reset() the script runs again from
        its start with the reference results."""
        k, name = self.kind, self.kind.script[step][0]
        try:
            k.script[step][1](setup, {})
        except TrtioError as exc:
            if "is broken" not in str(exc) or "reset()" not in str(exc):
                return Outcome(step, name, call, "broken setup refused with another error", str(exc))
        else:
            return Outcome(step, name, call, "broken setup ran a step")
        setup.reset()
        for e in setup.engines():
            e.state.reset(None, clear=True)
        ctx: dict[str, Any] = {}
        for i, (n, fn) in enumerate(k.script):
            got = _read(fn(setup, ctx))
            if not equal(got, self.reference[i]):
                return Outcome(step, name, call, f"after reset, step {i} ({n}) differs")
        return Outcome(step, name, call, "broken", why)

    def walk(self, step: int) -> list[Outcome]:
        """Every call of step ``step`` made to fail in turn (:meth:`run`)."""
        out = [self.run(step, call) for call in self.calls[step]]
        self.outcomes += out
        return out



def positions_table(backend: str = "host", graphs: tuple[bool, ...] = (False, True)) -> str:
    """The walk of every kind and step on ``backend`` (``"cuda"``: the GPU ReferenceEngine), as the Markdown
    table of ``docs/faults.md``: positions per setup kind and graphs setting, by outcome."""
    names = {"llm": "LLM", "spec": "spec decode"}
    heads = ["retried", "absorbed", "broken"]
    rows = ["| setup | graphs | positions | " + " | ".join(heads) + " | other |",
            "| --- | --- | ---: | " + " | ".join("---:" for _ in heads) + " | ---: |"]
    device = "gpu" if backend == "cuda" else "host"
    for kind in KINDS:
        for g in graphs:
            walk = Walk(Kind(kind, trtio.get_backend(backend), device, graphs=g))
            walk.prepare()
            for step in range(len(walk.calls)):
                walk.walk(step)
            results = [o.result for o in walk.outcomes]
            other = len(results) - sum(results.count(h) for h in heads)
            role, contract = kind.split("-")
            rows.append(f"| {names[role]}, {contract} | {'on' if g else 'off'} | {len(results)} | "
                        + " | ".join(str(results.count(h)) for h in heads) + f" | {other} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python3 tests/_faultwalk.py [host|cuda]: the table of docs/faults.md
    import sys

    print(positions_table(sys.argv[1] if len(sys.argv) > 1 else "host"))
