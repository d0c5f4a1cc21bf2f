"""A SpecDecodeSetup's calls have one order, kept in one phase state (``SpecDecodeSetup.phase``): every call out
of order is refused naming what comes next, and changes nothing."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import trtio
from tests._configs import tiny_bundle
from trtio._setups.spec_decode import Phase
from trtio.testing import ReferenceEngine, ToyWeights, toy_embedding

EMB = toy_embedding(32, 16)


def _e(*shape: int) -> np.ndarray:
    return EMB[np.arange(int(np.prod(shape))).reshape(shape) % 32].astype(np.float16)


def _setup(contract: str) -> trtio.SpecDecodeSetup:
    b = tiny_bundle(contract)
    assert b.draft is not None
    bw = ToyWeights.generate(b.base, 0)
    return trtio.create_for_spec_decode(ReferenceEngine.from_config(b.base, weights=bw),
                                        ReferenceEngine.from_config(b.draft,
                                                                    weights=ToyWeights.generate_draft(b.draft, bw, 0)),
                                        b)


# Each call with inputs that are right for it in its own place (one sequence, in slot 0; slot 1 stays free).
CALLS: dict[str, Callable[[trtio.SpecDecodeSetup], Any]] = {
    "base_prefill(slots=...)": lambda s: s.base_prefill(_e(1, 5), [5], slots=[1]),
    "draft_prefill()": lambda s: s.draft_prefill(_e(1, 5), [5]),
    "draft_propose()": lambda s: s.draft_propose(_e(1, 2), parents=[0, 1] if s.draft_tree.size else [-1, -1]),
    "verify()": lambda s: s.verify(_e(1, 4), [-1, 0, 0, 1]),
    "accept()": lambda s: s.accept([[0, 1]]),
    "draft_accept()": lambda s: s.draft_accept(_e(1, 2), [2]),
}
# The calls that lead from EMPTY to each phase, and the calls each phase lets through.
PATH = {Phase.EMPTY: [], Phase.PROMPTED: ["prompt"], Phase.READY: ["prompt", "draft_prefill()"],
        Phase.PROPOSING: ["prompt", "draft_prefill()", "draft_propose()"],
        Phase.VERIFIED: ["prompt", "draft_prefill()", "draft_propose()", "verify()"],
        Phase.ACCEPTED: ["prompt", "draft_prefill()", "draft_propose()", "verify()", "accept()"],
        Phase.BASE_VERIFIED: ["prompt", "verify()"], Phase.BASE_ONLY: ["prompt", "verify()", "accept()"]}
ALLOWED = {Phase.EMPTY: {"base_prefill(slots=...)"}, Phase.PROMPTED: {"draft_prefill()", "verify()"},
           Phase.READY: {"base_prefill(slots=...)", "draft_propose()", "verify()"},
           Phase.PROPOSING: {"draft_propose()", "verify()"}, Phase.VERIFIED: {"accept()", "verify()"},
           Phase.ACCEPTED: {"draft_accept()"}, Phase.BASE_VERIFIED: {"accept()", "verify()"},
           Phase.BASE_ONLY: {"verify()"}}


def _in_phase(contract: str, phase: Phase) -> trtio.SpecDecodeSetup:
    setup = _setup(contract)
    for call in PATH[phase]:
        if call == "prompt":
            setup.base_prefill(_e(1, 5), [5], slots=[0] if contract == "ragged" else None)
        else:
            CALLS[call](setup)
    assert setup.phase is phase
    return setup


def _state(setup: trtio.SpecDecodeSetup) -> tuple[Any, ...]:
    pages = setup.kv_pages if setup.contract == "ragged" else None
    return (setup.phase, setup.active.tolist(), setup.base_lengths.tolist(), setup.draft_lengths.tolist(), pages,
            setup.draft_tree.tolist())


@pytest.mark.parametrize("contract", ["batch", "ragged"])
@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.name)
def test_every_call_out_of_order_is_refused_naming_what_comes_next(contract: str, phase: Phase) -> None:
    if contract == "batch" and phase is Phase.EMPTY:
        pytest.skip("slots= is for the ragged contract")
    wrong = sorted(set(CALLS) - ALLOWED[phase])
    for call in wrong:
        if contract == "batch" and call == "base_prefill(slots=...)":
            continue  # the batch contract refuses slots= on its own
        setup = _in_phase(contract, phase)
        before = _state(setup)
        with pytest.raises(trtio.TrtioError, match=re.escape(f"{call} is out of order: {phase.value}")):
            CALLS[call](setup)
        assert _state(setup) == before, f"{call} in {phase.name} changed the setup"
        setup.close()


@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.name)
def test_every_call_in_order_is_taken(phase: Phase) -> None:
    for call in sorted(ALLOWED[phase]):
        setup = _in_phase("ragged", phase)
        CALLS[call](setup)
        setup.close()


def test_the_issues_sequence_is_refused_at_its_first_wrong_step() -> None:
    """base_prefill → verify → accept → draft_accept → draft_prefill used to run and leave the base at 6 tokens,
    the draft at 4: the base ran alone (its verify came before the draft's prefill), so the draft's calls are
    refused until a base_prefill restarts the batch."""
    setup = _in_phase("ragged", Phase.BASE_ONLY)
    for call in ("draft_accept()", "draft_prefill()", "draft_propose()"):
        with pytest.raises(trtio.TrtioError, match=re.escape(f"{call} is out of order: the base runs alone")):
            CALLS[call](setup)
    assert setup.base_lengths.tolist() == [7] and setup.draft_lengths.tolist() == [0]
    setup.release([0])  # sequences may still end
    setup.close()


def test_a_restart_and_a_reset_are_taken_from_any_phase() -> None:
    for phase in Phase:
        setup = _in_phase("ragged", phase)
        setup.base_prefill(_e(1, 5), [5])
        assert setup.phase is Phase.PROMPTED
        setup.reset()
        assert setup.phase is Phase.EMPTY and setup.active.tolist() == []
        setup.close()
