"""Sequences that come and go (ragged contract): slots, KV pages on demand, pinned prefixes.

Every sequence of a changing batch (admitted at different steps, released, its slot reused) must give
exactly the logits it gives alone, with a pool smaller than ``max_batch x pages per sequence``; pages are
taken when a step is about to write into them, a short pool is a CapacityError with nothing run and
nothing changed, and sequences started from one pinned prefix share its full pages. The ground truth is
the numpy toy model (``toy_model.reference_forward``) over each sequence's own tokens.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _threads import from_another_thread_inside

import trtio
from trtio import CapacityError, ShapeError, TrtioError
from trtio._cuda.backend import Backend
from trtio._pages import PagePool, PageTable
from trtio._rope import rope_cos_sin_table
from trtio.edgellm import EngineDir
from trtio.testing import ReferenceEngine, ToyWeights, reference_forward, toy_embedding
from trtio.testing.toy_engines import default_engines_dir

ENGINES = default_engines_dir()
E = toy_embedding(512, 64)
PAGE = 16  # small pages, so that short sequences cross page boundaries


def small_pool_cfg(pool: int = 12, **over: Any) -> trtio.LLMEngineConfig:
    """The ragged toy LLM with 16-token pages, 8 pages per sequence and a pool of ``pool`` (< 4 x 8)."""
    cfg = EngineDir.open(ENGINES / "toy-llm-ragged").config
    return dataclasses.replace(cfg, kv_page_size=PAGE, max_kv_cache_capacity=128, kv_pool_pages=pool,
                               **over).validate()


def weights(cfg: trtio.LLMEngineConfig) -> ToyWeights:
    return ToyWeights.generate(cfg, 0)


def llm(cfg: trtio.LLMEngineConfig, device: str = "host", *, graphs: bool = False) -> trtio.LLMSetup:
    return trtio.create_for_llm(ReferenceEngine.from_config(cfg, device=device, weights=weights(cfg)), cfg,
                                graphs=graphs)


def emb(tokens: list[list[int]], width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    width = width or max(map(len, tokens))
    out = np.zeros((len(tokens), width, 64), np.float16)
    for i, t in enumerate(tokens):
        out[i, :len(t)] = E[t]
    return out, np.array([len(t) for t in tokens], np.int64)


class Truth:
    """The numpy model's logits after every token of a sequence (causal: one pass gives them all)."""

    def __init__(self, cfg: trtio.LLMEngineConfig) -> None:
        self.cfg, self.w = cfg, weights(cfg)
        self.rope = rope_cos_sin_table(cfg.max_kv_cache_capacity, cfg.rotary_dim, cfg.rope_theta)

    def logits(self, tokens: list[int]) -> np.ndarray:
        return reference_forward(self.w, self.cfg, E[tokens].astype(np.float16), rope=self.rope)[1]


def assert_logits(got: np.ndarray, truth: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(got, truth, atol=2e-3, rtol=2e-3, err_msg=what)


# -- a changing batch ----------------------------------------------------------------------------------


@pytest.mark.parametrize("graphs", [False, True])
def test_a_changing_batch_gives_each_sequence_its_solo_logits(device: str, graphs: bool) -> None:
    """Sequences admitted at different steps into chosen slots, one released early and its slot reused, each
    give the logits of their own tokens alone; the pool (12 pages) is smaller than 4 slots x 8 pages."""
    cfg = small_pool_cfg()
    truth = Truth(cfg)
    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(0, 512, n))) for n in (20, 7, 33, 5)]
    tokens: dict[int, list[int]] = {}  # request -> its tokens so far
    seen: dict[int, list[tuple[int, np.ndarray]]] = {}  # request -> (position, logits) produced
    where: dict[int, int] = {}  # slot -> request
    with llm(cfg, device, graphs=graphs) as setup:
        assert setup.kv_pages.total == 12 < cfg.max_supported_batch_size * cfg.pages_per_sequence

        def admit(req: int, slot: int) -> None:
            x, lens = emb([prompts[req]])
            logits = setup.prefill(x, lens, slots=[slot]).to_numpy()
            tokens[req] = list(prompts[req])
            seen[req] = [(len(prompts[req]) - 1, logits[0])]
            where[slot] = req

        admit(0, 2)
        for step in range(24):
            if step == 3:
                admit(1, 0)
            if step == 5:
                admit(2, 1)
            if step == 12:
                setup.release([0])
                del where[0]
                admit(3, 0)  # the freed slot, reused
            active = setup.active.tolist()
            assert active == sorted(where)
            nxt = [int(seen[where[s]][-1][1].argmax()) for s in active]
            logits = setup.decode(E[nxt][:, None].astype(np.float16)).to_numpy()
            for i, s in enumerate(active):
                req = where[s]
                tokens[req].append(nxt[i])
                seen[req].append((len(tokens[req]) - 1, logits[i]))
            assert setup.lengths.tolist() == [len(tokens[where[s]]) for s in active]
        if graphs:
            assert setup.graph_stats.hits > 0, "the decode graphs replayed across admissions and releases"
        pages_in_use = setup.kv_pages.used
        want = sum(-(-len(tokens[where[s]]) // PAGE) for s in where)
        assert pages_in_use == want, "each active sequence holds the pages of its tokens, no more"
    for req in range(4):
        ref = truth.logits(tokens[req])
        for pos, logits in seen[req]:
            assert_logits(logits, ref[pos], f"request {req} at position {pos}")


def test_decode_runs_a_subset_of_the_active_slots_in_the_order_given(device: str) -> None:
    cfg = small_pool_cfg()
    truth = Truth(cfg)
    with llm(cfg, device) as setup:
        prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
        x, lens = emb(prompts)
        first = setup.prefill(x, lens, slots=[3, 1, 0]).to_numpy()
        toks = {3: prompts[0] + [1], 1: prompts[1] + [2], 0: prompts[2] + [3]}
        logits = setup.decode(E[[2, 1]][:, None].astype(np.float16), slots=[1, 3]).to_numpy()
        assert setup.active.tolist() == [0, 1, 3]
        assert setup.lengths.tolist() == [4, 3, 4], "slot 0 did not step"
    for i, (slot, p) in enumerate(zip([3, 1, 0], prompts)):
        assert_logits(first[i], truth.logits(p)[-1], f"prefill row {i} (slot {slot})")
    assert_logits(logits[0], truth.logits(toks[1])[-1], "decode row 0 = slot 1")
    assert_logits(logits[1], truth.logits(toks[3])[-1], "decode row 1 = slot 3")


def test_prefill_without_slots_restarts_the_batch_and_releases_every_other_slot() -> None:
    cfg = small_pool_cfg()
    with llm(cfg) as setup:
        x, lens = emb([[1, 2, 3]])
        setup.prefill(x, lens, slots=[2])
        assert setup.active.tolist() == [2] and setup.kv_pages.free == 11
        x, lens = emb([[4] * 20, [5, 6]])
        setup.prefill(x, lens)
        assert setup.active.tolist() == [0, 1] and setup.lengths.tolist() == [20, 2]
        assert setup.kv_pages.free == 12 - 2 - 1, "slot 2's page went back; 20 tokens take 2 pages, 2 take 1"


# -- pages on demand -----------------------------------------------------------------------------------


def test_a_sequence_takes_one_page_when_it_crosses_a_page_boundary() -> None:
    cfg = small_pool_cfg()
    with llm(cfg) as setup:
        x, lens = emb([[7] * (PAGE - 1)])
        setup.prefill(x, lens, slots=[1])
        assert setup.kv_pages.free == 11
        setup.decode(E[[3]][:, None].astype(np.float16))  # token 15: still the first page
        assert setup.kv_pages.free == 11
        setup.decode(E[[3]][:, None].astype(np.float16))  # token 16: the second page
        assert setup.kv_pages.free == 10
        table = setup._seqs.tables["llm"]
        assert (table.rows[1, :2] >= 0).all() and (table.rows[1, 2:] == -1).all()
        setup.release([1])
        assert setup.kv_pages.free == 12 and (table.rows[1] == -1).all()


def test_a_short_pool_refuses_the_step_with_nothing_changed_and_succeeds_after_a_release(device: str) -> None:
    """A decode whose sequences need more pages than are free raises CapacityError naming the slot, the pages
    and the pool's free / total before anything is enqueued; nothing moved, so after a release the same call
    succeeds, with the logits of the sequence alone."""
    cfg = small_pool_cfg(pool=3)
    truth = Truth(cfg)
    a, b = [11] * PAGE, [12] * (PAGE - 1) + [13] * PAGE  # one full page; two pages, the second full
    with llm(cfg, device) as setup:
        x, lens = emb([a, b])
        setup.prefill(x, lens, slots=[0, 2])
        assert setup.kv_pages.free == 0
        before = (setup.active.tolist(), setup.lengths.tolist(), setup._seqs.tables["llm"].rows.copy(),
                  setup.io.step.uploads)
        ops = setup.io.backend.op_count if device == "host" else None
        nxt = E[[1, 2]][:, None].astype(np.float16)
        with pytest.raises(CapacityError, match=r"slot 0 needs 1 more KV page\(s\) for tokens 16\.\.16, but the "
                                                r"pool has 0 free of 3"):
            setup.decode(nxt)
        after = (setup.active.tolist(), setup.lengths.tolist(), setup._seqs.tables["llm"].rows.copy(),
                 setup.io.step.uploads)
        assert before[:2] == after[:2] and np.array_equal(before[2], after[2]) and before[3] == after[3]
        if ops is not None:
            assert setup.io.backend.op_count == ops, "nothing was enqueued"
        setup.release([2])
        assert setup.kv_pages.free == 2
        logits = setup.decode(nxt[:1]).to_numpy()
    assert_logits(logits[0], truth.logits(a + [1])[-1], "the retried step, after the release")


def test_a_prefill_beyond_the_pool_is_refused_and_changes_nothing() -> None:
    cfg = small_pool_cfg(pool=4)
    with llm(cfg) as setup:
        x, lens = emb([[1] * 40])
        setup.prefill(x, lens, slots=[1])  # 3 pages
        x, lens = emb([[2] * 20])
        with pytest.raises(CapacityError, match=r"slot 0 needs 2 more KV page\(s\) for tokens 0\.\.19, but the pool "
                                                r"has 1 free of 4"):
            setup.prefill(x, lens, slots=[0])
        assert setup.active.tolist() == [1] and setup.kv_pages.free == 1 and setup.lengths.tolist() == [40]
        with pytest.raises(CapacityError, match=r"slot 1 needs 3 more KV page\(s\) for tokens 0\.\.39 \(6 with the "
                                                r"slots before it in this step\), but the pool has 4 free of 4"):
            setup.prefill(*emb([[3] * 40, [3] * 40]))  # a restart counts the pages it frees
        assert setup.active.tolist() == [1] and setup.kv_pages.free == 1, "the restart was undone"


# -- pinned prefixes -------------------------------------------------------------------------------------


def test_sequences_from_one_prefix_share_its_full_pages_and_give_their_solo_logits(device: str) -> None:
    cfg = small_pool_cfg()
    truth = Truth(cfg)
    rng = np.random.default_rng(4)
    system = list(map(int, rng.integers(0, 512, 2 * PAGE + 5)))  # two full pages and a partly filled one
    own = [list(map(int, rng.integers(0, 512, n))) for n in (6, 9)]
    with llm(cfg, device) as setup:
        x, lens = emb([system])
        setup.prefill(x, lens, slots=[3])
        prefix = setup.pin_prefix(3, len(system))
        assert prefix.tokens == len(system) and prefix.pages("llm") == setup._seqs.tables["llm"].pages_of(3)
        setup.release([3])
        assert setup.kv_pages.free == 12 - 3, "the prefix keeps its three pages"
        x, lens = emb(own)
        first = setup.prefill(x, lens, slots=[0, 2], prefix=prefix).to_numpy()
        table = setup._seqs.tables["llm"]
        full = prefix.pages("llm")[:2]
        assert table.rows[0, :2].tolist() == table.rows[2, :2].tolist() == full, "full pages shared"
        partial = prefix.pages("llm")[2]
        assert partial not in (table.rows[0, 2], table.rows[2, 2]), "the partly filled page is copied for each"
        assert setup.kv_pages.free == 12 - 3 - 2
        toks = [system + o for o in own]
        seen = [[(len(t) - 1, first[i])] for i, t in enumerate(toks)]
        for _ in range(12):
            nxt = [int(s[-1][1].argmax()) for s in seen]
            logits = setup.decode(E[nxt][:, None].astype(np.float16)).to_numpy()
            for i in range(2):
                toks[i].append(nxt[i])
                seen[i].append((len(toks[i]) - 1, logits[i]))
        setup.release([0, 2])
        assert setup.kv_pages.free == 12 - 3
        prefix.release()
        prefix.release()  # idempotent
        assert setup.kv_pages.free == 12
    for i in range(2):
        ref = truth.logits(toks[i])
        for pos, logits in seen[i]:
            assert_logits(logits, ref[pos], f"sequence {i} at position {pos}")


def test_writing_into_the_shared_partial_page_would_show(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: without the copy, both sequences write their tokens into the prefix's partly filled
    page; each then reads the other's entries, and the logits leave the solo run."""
    cfg = small_pool_cfg()
    truth = Truth(cfg)
    system = [int(t) for t in np.random.default_rng(5).integers(0, 512, PAGE + 3)]
    own = [[41, 42, 43, 44], [51, 52]]

    def run(*, copy: bool) -> np.ndarray:
        with llm(cfg) as setup:
            x, lens = emb([system])
            setup.prefill(x, lens, slots=[0])
            prefix = setup.pin_prefix(0, len(system))
            setup.release([0])
            if not copy:  # every page looks unshared: nothing is copied before a write
                monkeypatch.setattr(PagePool, "refs", lambda self, page: 1)
            x, lens = emb(own)
            return setup.prefill(x, lens, slots=[1, 2], prefix=prefix).to_numpy()

    good, bad = run(copy=True), run(copy=False)
    assert_logits(good[0], truth.logits(system + own[0])[-1], "with the copy")
    with pytest.raises(AssertionError):
        assert_logits(bad[0], truth.logits(system + own[0])[-1], "without the copy")


def test_the_sequence_that_pinned_a_prefix_copies_its_shared_page_before_writing_there() -> None:
    cfg = small_pool_cfg()
    truth = Truth(cfg)
    prompt = [int(t) for t in np.random.default_rng(6).integers(0, 512, PAGE + 2)]
    with llm(cfg) as setup:
        x, lens = emb([prompt])
        setup.prefill(x, lens, slots=[0])
        prefix = setup.pin_prefix(0, len(prompt))
        shared = setup._seqs.tables["llm"].rows[0, 1]
        logits = setup.decode(E[[9]][:, None].astype(np.float16)).to_numpy()
        assert setup._seqs.tables["llm"].rows[0, 1] != shared, "the writer took a copy"
        x, lens = emb([[77, 78]])
        other = setup.prefill(x, lens, slots=[1], prefix=prefix).to_numpy()
    assert_logits(logits[0], truth.logits(prompt + [9])[-1], "the pinning sequence")
    assert_logits(other[0], truth.logits(prompt + [77, 78])[-1], "a sequence from its prefix")


# -- misuse: refused before any work, naming the slot -------------------------------------------------------


MISUSE: dict[str, tuple[type[Exception], str, Callable[[trtio.LLMSetup, Any], Any]]] = {
    "prefill into an active slot": (TrtioError, r"prefill: slot 1 is active; release it first, or pass past_lengths",
                                    lambda s, p: s.prefill(*emb([[1, 2]]), slots=[1])),
    "slot out of range": (ShapeError, r"prefill: slot 4 is out of range 0\.\.3",
                          lambda s, p: s.prefill(*emb([[1, 2]]), slots=[4])),
    "slot given twice": (ShapeError, r"prefill: slot 0 is given twice",
                         lambda s, p: s.prefill(*emb([[1, 2], [3]]), slots=[0, 0])),
    "rows differ from the slots": (ShapeError, r"inputs_embeds: 2 rows for the 1 slots \[0\]",
                                   lambda s, p: s.prefill(*emb([[1, 2], [3]]), slots=[0])),
    "decode of a free slot": (TrtioError, r"decode: slot 2 is free",
                              lambda s, p: s.decode(E[[1, 2]][:, None].astype(np.float16), slots=[1, 2])),
    "decode rows differ from the slots": (ShapeError, r"inputs_embeds: 1 rows for the 2 slots \[1, 3\]",
                                          lambda s, p: s.decode(E[[1]][:, None].astype(np.float16), slots=[1, 3])),
    "release of a free slot": (TrtioError, r"release: slot 0 is free", lambda s, p: s.release([0])),
    "release of an active and a free slot": (TrtioError, r"release: slot 2 is free", lambda s, p: s.release([1, 2])),
    "release of a negative slot": (ShapeError, r"release: slot -1 is out of range 0\.\.3",
                                   lambda s, p: s.release([-1])),
    "release of a slot out of range": (ShapeError, r"release: slot 4 is out of range 0\.\.3",
                                       lambda s, p: s.release([4])),
    "release of a slot given twice": (ShapeError, r"release: slot 3 is given twice", lambda s, p: s.release([3, 3])),
    "release of a bool slot": (ShapeError, r"release: slots\[0\] = True is not a slot id \(an int\)",
                               lambda s, p: s.release([True])),
    "release of a float slot": (ShapeError, r"release: slots\[1\] = 1\.0 is not a slot id \(an int\)",
                                lambda s, p: s.release([3, 1.0])),
    "release of one slot not in a list": (ShapeError, r"release: slots must be a list of slot ids, got int 1",
                                          lambda s, p: s.release(1)),
    "release of no slot": (ShapeError, r"release: no slot given", lambda s, p: s.release([])),
    "release of a 0-d array of slots": (ShapeError, r"release: slots must be a list of slot ids, got ndarray",
                                        lambda s, p: s.release(np.array(1))),
    "prefill into a 0-d array of slots": (ShapeError, r"prefill: slots must be a list of slot ids, got ndarray",
                                          lambda s, p: s.prefill(*emb([[1]]), slots=np.array(2))),
    "prefill into a set of slots (no order)": (ShapeError, r"prefill: slots must be a list of slot ids, got set",
                                               lambda s, p: s.prefill(*emb([[1], [2]]), slots={2, 0})),
    "decode of a dict of slots": (ShapeError, r"decode: slots must be a list of slot ids, got dict",
                                  lambda s, p: s.decode(E[[1]][:, None].astype(np.float16), slots={1: 0})),
    "a prefix that is an int": (ShapeError, r"prefill: prefix must be a Prefix \(from pin_prefix\) or one per "
                                            r"sequence \(None for none\), got int 3",
                                lambda s, p: s.prefill(*emb([[1]]), slots=[2], prefix=3)),
    "a prefix that is a string": (ShapeError, r"prefill: prefix must be a Prefix .*, got str 'a'",
                                  lambda s, p: s.prefill(*emb([[1]]), slots=[2], prefix="a")),
    "a prefix longer than its sequence": (ShapeError, r"pin_prefix: tokens = 9, but slot 1's sequence holds 5 "
                                                      r"tokens", lambda s, p: s.pin_prefix(1, 9)),
    "pinning a free slot": (TrtioError, r"pin_prefix: slot 2 is free", lambda s, p: s.pin_prefix(2, 1)),
    "pinning a negative slot": (ShapeError, r"pin_prefix: slot -1 is not a slot id in 0\.\.3",
                                lambda s, p: s.pin_prefix(-1, 1)),
    "pinning a bool slot": (ShapeError, r"pin_prefix: slot True is not a slot id in 0\.\.3",
                            lambda s, p: s.pin_prefix(True, 1)),
    "pinning a float token count": (ShapeError, r"pin_prefix: tokens = 2\.0, but slot 1's sequence holds 5 tokens",
                                    lambda s, p: s.pin_prefix(1, 2.0)),
    "pinning no token": (ShapeError, r"pin_prefix: tokens = 0, but slot 1's sequence holds 5 tokens: a prefix pins "
                                     r"1\.\.5 of them", lambda s, p: s.pin_prefix(1, 0)),
    "a prefix of another setup": (TrtioError, r"prefill: prefix\[0\]: this prefix was pinned by another setup",
                                  lambda s, p: s.prefill(*emb([[1]]), slots=[2], prefix=p["other"])),
    "a released prefix": (TrtioError, r"prefill: prefix\[0\]: this prefix was released",
                          lambda s, p: s.prefill(*emb([[1]]), slots=[2], prefix=p["released"])),
    "continuing a slot past its cache": (ShapeError, r"past_lengths\[0\] = 4, but the cache of slot 3 holds 3 tokens",
                                         lambda s, p: s.prefill(*emb([[1]]), slots=[3], past_lengths=[4])),
    "continuing a slot past its capacity": (ShapeError, r"prefill: the sequence in slot 3 would hold 129 tokens, "
                                                        r"more than max_kv_cache_capacity \(128\)",
                                            lambda s, p: s.prefill(*emb([[1] * 126]), slots=[3], past_lengths=[3])),
    "prefix and past_lengths": (ShapeError, r"prefix= starts new sequences after a pinned prefix, past_lengths=",
                                lambda s, p: s.prefill(*emb([[1]]), slots=[1], prefix=p["mine"], past_lengths=[2])),
}


@pytest.mark.parametrize("case", sorted(MISUSE))
def test_every_misuse_is_refused_before_any_work(host: Backend, case: str) -> None:
    error, match, call = MISUSE[case]
    cfg = small_pool_cfg()
    with llm(cfg) as setup, llm(cfg) as other:
        x, lens = emb([[1, 2, 3, 4, 5], [6, 7, 8]])
        setup.prefill(x, lens, slots=[1, 3])
        other.prefill(*emb([[1, 2]]), slots=[0])
        released = setup.pin_prefix(1, 2)
        released.release()
        prefixes = {"mine": setup.pin_prefix(1, 3), "other": other.pin_prefix(0, 1), "released": released}
        state = (setup.active.tolist(), setup.lengths.tolist(), setup.kv_pages, setup.io.step.uploads)
        ops = setup.io.backend.op_count
        with pytest.raises(error, match=match):
            call(setup, prefixes)
        assert (setup.active.tolist(), setup.lengths.tolist(), setup.kv_pages, setup.io.step.uploads) == state
        assert setup.io.backend.op_count == ops, "nothing was enqueued"


def test_release_and_pin_take_numpy_ints_and_any_sequence_of_slots() -> None:
    with llm(small_pool_cfg()) as setup:
        setup.prefill(*emb([[1, 2, 3], [4, 5], [6], [7, 8]]), slots=[0, 1, 2, 3])
        prefix = setup.pin_prefix(np.int64(1), np.int32(2))
        assert prefix.tokens == 2 and prefix.pages("llm") == setup._seqs.tables["llm"].pages_of(1)
        setup.release(np.array([1]))
        setup.release((np.int64(3),))
        assert setup.active.tolist() == [0, 2] and setup.lengths.tolist() == [3, 1]
        setup.release(range(0, 3, 2))
        assert setup.active.tolist() == [] and setup.kv_pages.free == 12 - 1
        prefix.release()
        assert setup.kv_pages.free == 12


def test_release_and_pin_enqueue_nothing_and_neither_synchronise_nor_allocate(host: Backend) -> None:
    """Host bookkeeping only: the backend counts no device operation, no host synchronisation and no
    allocation for release, pin_prefix and Prefix.release (graphs on, as a server runs)."""
    with llm(small_pool_cfg(), graphs=True) as setup:
        setup.prefill(*emb([[1, 2, 3], [4, 5], [6, 7, 8, 9]]), slots=[0, 2, 3])
        setup.decode(E[[1, 2, 3]][:, None].astype(np.float16))
        counts = (host.op_count, host.sync_count, host.live_allocations)
        prefix = setup.pin_prefix(2, 3)
        setup.release([2])
        setup.release([0, 3])
        prefix.release()
        assert (host.op_count, host.sync_count, host.live_allocations) == counts
        assert setup.active.tolist() == [] and setup.kv_pages.free == 12


def test_a_refused_admission_from_a_prefix_leaves_its_slot_without_the_prefix_pages(device: str) -> None:
    """An admission from a prefix maps the prefix's pages into its slot's row before the pool turns out short;
    the CapacityError puts the row back, so a later sequence in that slot takes pages of its own and the
    prefix's pages stay counted (were the slot to keep them, the prefix's release would free pages slot 0
    still reads)."""
    cfg = small_pool_cfg(pool=4)
    truth = Truth(cfg)
    rng = np.random.default_rng(7)
    a, b, c = ([int(t) for t in rng.integers(0, 512, PAGE + 4)] for _ in range(3))  # two pages each
    with llm(cfg, device) as setup:
        setup.prefill(*emb([a]), slots=[0])
        prefix = setup.pin_prefix(0, len(a))
        setup.prefill(*emb([b]), slots=[1])
        assert setup.kv_pages.free == 0
        with pytest.raises(CapacityError, match="slot 2 needs 1 more KV page"):
            setup.prefill(*emb([[9, 9, 9]]), slots=[2], prefix=prefix)  # its copy of the shared last page
        table = setup._seqs.tables["llm"]
        assert setup.active.tolist() == [0, 1] and table.pages_of(2) == [] and (table.rows[2] == -1).all()
        setup.release([1])
        first = setup.prefill(*emb([c]), slots=[2]).to_numpy()
        assert set(table.pages_of(2)).isdisjoint(prefix.pages("llm")), "slot 2 holds pages of its own"
        prefix.release()
        assert setup.kv_pages.free == 0, "slot 0 still holds the pages the prefix held"
        logits = setup.decode(E[[5, 6]][:, None].astype(np.float16), slots=[0, 2]).to_numpy()
    assert_logits(first[0], truth.logits(c)[-1], "slot 2's prefill")
    assert_logits(logits[0], truth.logits(a + [5])[-1], "slot 0 after the prefix's release")
    assert_logits(logits[1], truth.logits(c + [6])[-1], "slot 2")


def test_a_call_from_another_thread_while_a_step_runs_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """One setup misused across threads: a release from thread B while thread A's prefill is inside its engine
    must raise a TrtioError (and change nothing), not interleave with the step. Without a guard the two
    interleave, and a 4-thread stress of prefill / release / decode / pin_prefix on one setup loses KV pages
    (after reset() the pool has fewer free pages than it holds) or fails with a bare ValueError."""
    with llm(small_pool_cfg()) as setup:
        setup.prefill(*emb([[1, 2, 3]]), slots=[1])
        seen = from_another_thread_inside(monkeypatch, lambda: setup.release([1]))
        setup.prefill(*emb([[4, 5]]), slots=[0])
        assert isinstance(seen[0], TrtioError), "the second thread's release was refused"
        assert "LLMSetup.release(): another thread is inside a call of this setup" in str(seen[0])
        assert setup.active.tolist() == [0, 1]


def test_a_speculative_setup_refuses_a_second_thread_mid_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard covers every step of SpecDecodeSetup: a base prefill from thread B while thread A's verify runs
    is refused with nothing changed, and the round goes on."""
    with spec_setup(small_pool_pair(), "host") as s:
        chains = Chains(s)
        chains.admit(0, [1, 2, 3])
        s.draft_propose(E[[4]][:, None].astype(np.float16))
        seen = from_another_thread_inside(monkeypatch, lambda: s.base_prefill(*emb([[7, 8]]), slots=[1]))
        s.verify(E[[[3, 4]]].astype(np.float16), [-1, 0])
        assert isinstance(seen[0], TrtioError) and "SpecDecodeSetup.base_prefill(): another thread" in str(seen[0])
        assert s.active.tolist() == [0]
        s.accept([[0]])  # the round goes on


def test_a_setup_is_usable_from_another_thread_after_a_step_failed() -> None:
    """The guard is per call: a step that raised leaves the setup to whichever thread calls next."""
    with llm(small_pool_cfg()) as setup:
        with pytest.raises(ShapeError):
            setup.prefill(*emb([[1]]), slots=[9])
        out: list[Any] = []

        def other() -> None:
            try:
                out.append(setup.prefill(*emb([[1, 2]]), slots=[0]).to_numpy().copy())
            except BaseException as exc:  # noqa: BLE001 - what the test looks at
                out.append(exc)
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert isinstance(out[0], np.ndarray), out[0]
        assert setup.active.tolist() == [0]


def test_the_batch_contract_refuses_slots_and_prefixes_naming_the_ragged_contract() -> None:
    from _configs import llm_config

    cfg = llm_config()
    with trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg) as setup:
        x, lens = emb([[1, 2]])
        setup.prefill(x, lens)
        for call in (lambda: setup.prefill(x, lens, slots=[0]),
                     lambda: setup.decode(E[[1]][:, None].astype(np.float16), slots=[0]),
                     lambda: setup.release([0]), lambda: setup.pin_prefix(0, 1), lambda: setup.kv_pages):
            with pytest.raises(TrtioError, match="ragged contract"):
                call()
        assert setup.active.tolist() == [0] and setup.lengths.tolist() == [2]


# -- the page pool and tables alone ----------------------------------------------------------------------


def test_pages_are_counted_by_reference() -> None:
    pool = PagePool(4)
    table = PageTable(pool, 2, 3, 8)
    plan = table.plan([0], [0], [17])  # tokens 0..16: three pages
    assert plan.needed == 3 and pool.free == 4, "planning takes nothing"
    plan.commit()
    assert pool.free == 1 and table.pages_of(0) == table.rows[0].tolist()
    pool.hold(table.pages_of(0)[:2])  # a prefix holds two of them
    assert pool.free == 1 and table.plan([1], [0], [8]).needed == 1
    with pytest.raises(CapacityError, match=r"slot 1 needs 2 more KV page\(s\) for tokens 0\.\.8, but the pool has "
                                            r"1 free of 4"):
        table.plan([1], [0], [9])
    pool.drop(table.release(0))
    assert pool.free == 2, "the two pages the prefix holds stay taken"
    undo = table.plan([1], [0], [9])
    undo.commit()
    assert pool.free == 0
    undo.undo()
    assert pool.free == 2 and (table.rows[1] == -1).all()



def test_a_step_of_the_same_slots_tuple_reads_the_table_anew_after_it_changed() -> None:
    """PageTable.step finds its last answer by the identity of the slots tuple, but only while the table's version
    stands: the same tuple after pages were mapped gets the new rows, limits and lowest limit."""
    table = PageTable(PagePool(8), 3, 4, 4, role="base")
    slots = (0, 2)
    rows, limits, lowest = table.step(slots)
    assert (rows == -1).all() and limits == [0, 0] and lowest == 0
    assert table.step(slots) is table.step(slots), "a repeated step of the same slots is answered from the cache"
    table.ensure(np.array(slots), np.array([0, 0]), 6).commit()  # two pages each
    rows, limits, lowest = table.step(slots)
    assert (rows[:, :, :2] >= 0).all() and (rows[:, :, 2:] == -1).all() and limits == [8, 8] and lowest == 8
    table.ensure(np.array(slots), np.array([6, 2]), 3).commit()  # slot 0 crosses into a third page
    rows, limits, lowest = table.step(slots)
    assert (rows[0, :, 2] >= 0).all() and (rows[1, :, 2] == -1).all() and limits == [12, 8] and lowest == 8


def test_a_verify_takes_a_page_for_a_short_sequence_at_its_page_end_beside_a_long_one_with_room() -> None:
    """A step takes no page at once where its furthest start ends below the lowest limit of its slots; else each
    slot is tested: here the longest sequence has room in its page while the shorter one crosses its own."""
    sd = spec_setup(small_pool_pair(), "host")
    x, lens = emb([list(range(1, PAGE + 2)), list(range(1, PAGE))])  # PAGE + 1 and PAGE - 1 tokens
    sd.base_prefill(x, lens)
    sd.draft_prefill(x, lens)
    free = sd.kv_pages.free
    table = sd._seqs.tables["base"]
    assert table.limit[:2].tolist() == [2 * PAGE, PAGE]
    sd.verify(E[np.zeros((2, 3), int)].astype(np.float16), [-1, 0, 0])  # each writes 3 entries after its own
    assert sd.kv_pages.free == free - 1, "the short sequence's verify nodes cross into a page of their own"
    assert table.limit[:2].tolist() == [2 * PAGE, 2 * PAGE]
    sd.close()


# -- speculative decoding over a changing batch -------------------------------------------------------------


def small_pool_pair(pool: int = 14) -> trtio.DeploymentConfig:
    """The ragged toy EAGLE3 pair with 16-token pages, 8 per sequence, pools of ``pool`` pages each."""
    d = EngineDir.open(ENGINES / "toy-eagle3-ragged").deployment(1, 2, 3)
    small = {"kv_page_size": PAGE, "max_kv_cache_capacity": 128, "kv_pool_pages": pool}
    return trtio.DeploymentConfig(dataclasses.replace(d.base, **small).validate(),
                                  dataclasses.replace(d.draft, **small).validate(), d.spec).validate()


def spec_setup(bundle: trtio.DeploymentConfig, device: str, *, graphs: bool = False) -> trtio.SpecDecodeSetup:
    bw = ToyWeights.generate(bundle.base, 0)
    dw = ToyWeights.generate_draft(bundle.draft, bw, 0)
    assert bundle.draft is not None
    return trtio.create_for_spec_decode(ReferenceEngine.from_config(bundle.base, device=device, weights=bw),
                                        ReferenceEngine.from_config(bundle.draft, device=device, weights=dw),
                                        bundle, graphs=graphs)


class Chains:
    """Greedy speculative rounds with chain drafting (one node per level, two levels) over a setup's active
    slots: what each sequence's tokens and verify logits become, round by round."""

    def __init__(self, setup: trtio.SpecDecodeSetup) -> None:
        self.setup = setup
        # slot -> {"tokens", "draft", "verify": [verify logits per round], "proposed": [level-0 draft logits]}
        self.seqs: dict[int, dict[str, Any]] = {}

    def admit(self, slot: int, prompt: list[int]) -> None:
        s = self.setup
        x, lens = emb([prompt])
        first = int(s.base_prefill(x, lens, slots=[slot]).to_numpy()[0].argmax())
        x, _ = emb([prompt[1:] + [first]])
        draft = s.draft_prefill(x, lens, slots=[slot]).to_numpy()[0]
        self.seqs[slot] = {"tokens": prompt + [first], "draft": draft, "verify": [], "proposed": []}

    def round(self) -> None:
        s = self.setup
        order = s.active.tolist()
        seqs = [self.seqs[slot] for slot in order]
        d0 = [int(q["draft"].argmax()) for q in seqs]
        level0 = s.draft_propose(E[d0][:, None].astype(np.float16)).to_numpy()
        d1 = level0.argmax(-1).tolist()
        s.draft_propose(E[d1][:, None].astype(np.float16))
        for q, p in zip(seqs, level0):
            q["proposed"].append(p)
        tree = [[q["tokens"][-1], a, b] for q, a, b in zip(seqs, d0, d1)]
        verify = s.verify(E[tree].astype(np.float16), [-1, 0, 1]).to_numpy().reshape(len(order), 3, -1)
        paths, emitted = [], []
        for q, v, t in zip(seqs, verify, tree):
            q["verify"].append(v)
            path = [0]
            while len(path) < 3 and int(v[path[-1]].argmax()) == t[len(path)]:
                path.append(len(path))
            paths.append(path)
            emitted.append([t[n] for n in path[1:]] + [int(v[path[-1]].argmax())])
        s.accept(paths)
        x, acc = emb(emitted)
        draft = s.draft_accept(x, acc).to_numpy()
        for q, e, d in zip(seqs, emitted, draft):
            q["tokens"] += e
            q["draft"] = d


@pytest.mark.parametrize("bad, match", [
    ({"slots": np.array(0)}, r"draft_prefill: slots must be a list of slot ids, got ndarray"),
    ({"slots": [1]}, r"draft_prefill: slots \[1\] differ from the base prefill's \[0\]"),
    ({"prefix": 3}, r"draft_prefill: prefix must be a Prefix \(from pin_prefix\) or one per sequence"),
])
def test_a_draft_prefill_of_other_slots_or_prefixes_than_the_base_prefills_is_refused(bad: dict[str, Any],
                                                                                     match: str) -> None:
    with spec_setup(small_pool_pair(), "host") as s:
        x, lens = emb([[1, 2, 3]])
        s.base_prefill(x, lens, slots=[0])
        shifted = emb([[2, 3, 4]])
        ops = s.io.backend.op_count
        with pytest.raises(ShapeError, match=match):
            s.draft_prefill(*shifted, **({"slots": [0]} | bad))
        assert s.io.backend.op_count == ops, "nothing was enqueued"
        s.draft_prefill(*shifted, slots=np.array([0]))  # the base prefill's slots, as an array: accepted
        assert s.draft_lengths.tolist() == [3]


# Per round: the requests admitted (request, slot) or released (its slot) before it.
_REUSED = {0: [("admit", 0, 2)], 2: [("admit", 1, 0)], 3: [("admit", 2, 3)], 5: [("release", 2, None),
                                                                            ("admit", 3, 2)]}
_RELEASED_ALONE = {0: [("admit", 0, 2), ("admit", 1, 0)], 1: [("admit", 2, 3)], 3: [("release", 2, None)]}


@pytest.mark.parametrize("plan", [_REUSED, _RELEASED_ALONE], ids=["slot-reused", "released-alone"])
@pytest.mark.parametrize("graphs", [False, True])
def test_a_changing_batch_of_speculative_sequences_gives_each_its_solo_verify_logits(
        device: str, graphs: bool, plan: dict[int, list[tuple[str, int, int | None]]]) -> None:
    """Sequences admitted between rounds, one released and its slot reused, or a middle one released alone (the
    next round's lengths are then not those the last catch-up left on the device: its first level stages them),
    each verify (and draft) exactly as alone; both pools are smaller than 4 slots x 8 pages."""
    bundle = small_pool_pair()
    rng = np.random.default_rng(7)
    prompts = {r: list(map(int, rng.integers(0, 512, n))) for r, n in enumerate((14, 5, 21, 9))}
    requests: dict[int, dict[str, Any]] = {}
    with spec_setup(bundle, device, graphs=graphs) as setup:
        run = Chains(setup)
        for step in range(8):
            for what, req, slot in plan.get(step, []):
                if what == "admit":
                    assert slot is not None
                    run.admit(slot, prompts[req])
                    requests[req] = run.seqs[slot]
                else:
                    setup.release([req])
                    del run.seqs[req]
            run.round()
            for table in setup._seqs.tables.values():  # no page lost, none held twice, none by a free slot
                held = [p for slot in setup.active.tolist() for p in table.pages_of(slot)]
                assert len(held) == len(set(held)) == table.pool.used
                assert all(not table.pages_of(slot) for slot in range(4) if slot not in setup.active)
    for req, q in requests.items():
        with spec_setup(bundle, device) as alone:
            solo = Chains(alone)
            solo.admit(0, prompts[req])
            for _ in q["verify"]:
                solo.round()
            assert solo.seqs[0]["tokens"] == q["tokens"], f"request {req}: the same tokens alone"
            for r, (got, want) in enumerate(zip(q["verify"], solo.seqs[0]["verify"])):
                assert_logits(got, want, f"request {req}, round {r}: verify logits")
            for r, (got, want) in enumerate(zip(q["proposed"], solo.seqs[0]["proposed"])):
                assert_logits(got, want, f"request {req}, round {r}: the draft's first level (its root's hidden)")


@pytest.mark.parametrize("graphs", [False, True])
def test_a_speculative_sequence_from_a_pinned_prefix_verifies_as_its_whole_prompt_alone(device: str,
                                                                                         graphs: bool) -> None:
    """base_prefill(prefix=P) then draft_prefill(prefix=P): the draft holds the prefix's entries too (its length
    is the prefix's, not 0, so its prefill continues after them), and the sequence drafts and verifies exactly
    as its whole prompt alone."""
    bundle = small_pool_pair(pool=16)
    rng = np.random.default_rng(3)
    shared = list(map(int, rng.integers(0, 512, 20)))
    first_prompt, prompt = shared + [7, 8], shared + [9, 10, 11]
    with spec_setup(bundle, device, graphs=graphs) as setup:
        run = Chains(setup)
        run.admit(0, first_prompt)
        run.round()
        prefix = setup.pin_prefix(0, len(shared))  # keeps len(shared) - 1 entries: the draft's last needs the next
        setup.release([0])
        k = prefix.tokens
        x, lens = emb([prompt[k:]])
        base = setup.base_prefill(x, lens, slots=[2], prefix=prefix).to_numpy()[0].copy()
        assert setup.draft_lengths.tolist() == [k], "the draft holds the prefix's entries"
        first = int(base.argmax())
        x, _ = emb([prompt[k + 1:] + [first]])
        draft = setup.draft_prefill(x, lens, slots=[2], prefix=prefix).to_numpy()[0].copy()
        assert setup.base_lengths.tolist() == setup.draft_lengths.tolist() == [len(prompt)]
        run.seqs = {2: {"tokens": prompt + [first], "draft": draft, "verify": [], "proposed": []}}
        for _ in range(3):
            run.round()
        prefix.release()
        got = run.seqs[2]
    with spec_setup(bundle, device) as alone:
        solo = Chains(alone)
        solo.admit(0, prompt)
        for _ in range(3):
            solo.round()
    want = solo.seqs[0]
    assert got["tokens"] == want["tokens"]
    for r, (g, w) in enumerate(zip(got["verify"], want["verify"])):
        assert_logits(g, w, f"round {r}: verify logits")
    for r, (g, w) in enumerate(zip(got["proposed"], want["proposed"])):
        assert_logits(g, w, f"round {r}: the draft's first level")


def test_a_speculative_sequence_that_pins_a_prefix_copies_the_shared_page_before_its_next_round_writes_there() -> None:
    """Pinning a prefix of an active speculative sequence between steady rounds (its steps' page rows and limits
    known) shares the page it writes into next: the next round's steps of both engines copy that page first, and
    the prefix keeps its own."""
    bundle = small_pool_pair(pool=16)
    prompt = [int(t) for t in np.random.default_rng(8).integers(0, 512, PAGE + 4)]
    with spec_setup(bundle, "host") as setup:
        run = Chains(setup)
        run.admit(0, prompt)
        for _ in range(2):
            run.round()
        tables = setup._seqs.tables
        lengths = {"base": int(setup.base_lengths[0]), "draft": int(setup.draft_lengths[0])}
        prefix = setup.pin_prefix(0, min(lengths.values()))
        for role in ("base", "draft"):
            pinned = prefix.pages(role)
            entry = lengths[role] // PAGE
            assert entry == len(pinned) - 1 and tables[role].rows[0, entry] == pinned[-1], \
                f"{role}: the next write goes into the prefix's last page"
        run.round()
        for role in ("base", "draft"):
            pinned = prefix.pages(role)
            assert tables[role].rows[0, len(pinned) - 1] != pinned[-1], f"{role}: the writer took a copy"
        prefix.release()


# -- random admissions, releases and prefixes against a model ----------------------------------------------

from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule  # noqa: E402

_CFG = small_pool_cfg(pool=10)
_TRUTH = Truth(_CFG)


class SlotsAndPages(RuleBasedStateMachine):
    """Random admit / decode / release / pin / unpin / reset against a pure-Python model of the slots (which
    sequence each holds, its tokens) and the pages (who holds which page): no page or slot is ever lost or
    held twice, a short pool changes nothing, and every step's logits are those of each sequence alone."""

    def __init__(self) -> None:
        super().__init__()
        self.setup = llm(_CFG, graphs=True)
        self.tokens: dict[int, list[int]] = {}  # slot -> its sequence's tokens (the model)
        self.prefixes: list[tuple[Any, list[int]]] = []  # live prefixes and their tokens
        self.refused = 0

    def teardown(self) -> None:
        try:
            if self.tokens:
                self.setup.release(sorted(self.tokens))
            for p, _ in self.prefixes:
                p.release()
            assert self.setup.kv_pages.free == self.setup.kv_pages.total, "every page came back"
        finally:
            self.setup.close()

    # -- what must always hold --
    @invariant()
    def slots_and_lengths_are_the_models(self) -> None:
        assert self.setup.active.tolist() == sorted(self.tokens)
        assert self.setup.lengths.tolist() == [len(self.tokens[s]) for s in sorted(self.tokens)]

    @invariant()
    def every_page_is_held_by_whoever_holds_it_and_no_one_else(self) -> None:
        table = self.setup._seqs.tables["llm"]
        pool = table.pool
        holders = np.zeros(pool.total, np.int64)
        for slot in range(_CFG.max_supported_batch_size):
            row = table.rows[slot]
            pages = row[row >= 0]
            assert slot in self.tokens or pages.size == 0, f"free slot {slot} holds pages"
            if slot in self.tokens:
                assert pages.size == -(-len(self.tokens[slot]) // PAGE), "a sequence holds the pages of its tokens"
                assert len(set(pages.tolist())) == pages.size, "no page twice in one row"
            holders[pages] += 1
        for p, _ in self.prefixes:
            holders[p.pages("llm")] += 1
        assert [pool.refs(i) for i in range(pool.total)] == holders.tolist()
        assert pool.free == int((holders == 0).sum()), "a page is free exactly when no one holds it"

    @invariant()
    def each_rows_pages_are_what_the_table_reports(self) -> None:
        table = self.setup._seqs.tables["llm"]
        for slot in range(_CFG.max_supported_batch_size):
            row = table.rows[slot]
            assert table.pages_of(slot) == row[row >= 0].tolist(), f"slot {slot}"

    # -- what a serving loop does --
    def _unchanged(self) -> Any:
        s = self.setup
        return (s.active.tolist(), s.lengths.tolist(), s.kv_pages, s._seqs.tables["llm"].rows.tolist())

    def _check(self, logits: np.ndarray, slots: list[int]) -> None:
        for row, slot in zip(logits, slots):
            want = _TRUTH.logits(self.tokens[slot])[-1]
            assert_logits(row, want, f"slot {slot} after {len(self.tokens[slot])} tokens")

    @initialize()
    def start(self) -> None:
        self.setup.prefill(*emb([[1, 2, 3]]), slots=[0])
        self.tokens[0] = [1, 2, 3]

    @rule(data=st.data(), n=st.integers(1, 30), from_prefix=st.booleans())
    def admit(self, data: st.DataObject, n: int, from_prefix: bool) -> None:
        free = [s for s in range(_CFG.max_supported_batch_size) if s not in self.tokens]
        if not free:
            return
        slot = data.draw(st.sampled_from(free))
        new = data.draw(st.lists(st.integers(0, 511), min_size=n, max_size=n))
        prefix, head = (None, [])
        if from_prefix and self.prefixes:
            prefix, head = data.draw(st.sampled_from(self.prefixes))
        if len(head) + n > _CFG.max_kv_cache_capacity:
            return
        before = self._unchanged()
        try:
            logits = self.setup.prefill(*emb([new]), slots=[slot], prefix=prefix).to_numpy()
        except CapacityError:
            assert self._unchanged() == before, "a refused admission changed nothing"
            self.refused += 1
            return
        self.tokens[slot] = head + new
        self._check(logits, [slot])

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        slots = data.draw(st.lists(st.sampled_from(sorted(self.tokens)), min_size=1, unique=True))
        if any(len(self.tokens[s]) >= _CFG.max_kv_cache_capacity for s in slots):
            return
        toks = data.draw(st.lists(st.integers(0, 511), min_size=len(slots), max_size=len(slots)))
        before = self._unchanged()
        try:
            logits = self.setup.decode(E[toks][:, None].astype(np.float16), slots=slots).to_numpy()
        except CapacityError:
            assert self._unchanged() == before, "a refused step changed nothing"
            self.refused += 1
            return
        for s, t in zip(slots, toks):
            self.tokens[s].append(t)
        self._check(logits, slots)

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(sorted(self.tokens)))
        self.setup.release([slot])
        del self.tokens[slot]

    @precondition(lambda self: bool(self.tokens) and len(self.prefixes) < 3)
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(sorted(self.tokens)))
        n = data.draw(st.integers(1, len(self.tokens[slot])))
        self.prefixes.append((self.setup.pin_prefix(slot, n), self.tokens[slot][:n]))

    @precondition(lambda self: bool(self.prefixes))
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.prefixes) - 1))
        self.prefixes.pop(i)[0].release()

    @rule()
    def reset(self) -> None:
        self.setup.reset()
        self.tokens.clear()


TestSlotsAndPages = SlotsAndPages.TestCase
TestSlotsAndPages.settings = settings(max_examples=10, stateful_step_count=30, deadline=None)


@pytest.mark.slow
class TestSlotsAndPagesAtFullCount(SlotsAndPages.TestCase):
    """The same machine, three times the runs (``-m slow``; .ci/run runs it)."""

    settings = settings(max_examples=30, stateful_step_count=30, deadline=None)


def _random_requests(setup: trtio.LLMSetup, count: int, seed: int) -> int:
    """``count`` requests of random lengths arriving, decoding for random budgets and leaving, through one
    setup; returns the steps run."""
    rng = np.random.default_rng(seed)
    left: dict[int, int] = {}  # slot -> tokens still to generate
    started = steps = 0
    slots = setup._seqs.max_batch
    while started < count or left:
        free = [s for s in range(slots) if s not in left]
        if free and started < count and rng.random() < 0.5:
            slot = int(rng.choice(free))
            n = int(rng.integers(1, 40))
            try:
                setup.prefill(*emb([list(map(int, rng.integers(0, 512, n)))]), slots=[slot])
            except CapacityError:
                pass
            else:
                left[slot] = int(rng.integers(1, 30))
                started += 1
        if left:
            active = sorted(left)
            try:
                setup.decode(E[rng.integers(0, 512, len(active))][:, None].astype(np.float16))
            except CapacityError:  # the pool is short: the longest sequence ends early
                lengths = setup.lengths.tolist()
                victim = max(active, key=lambda s: lengths[active.index(s)])
                setup.release([victim])
                del left[victim]
                continue
            steps += 1
            lengths = setup.lengths.tolist()
            for s in active:
                left[s] -= 1
                if left[s] == 0 or lengths[active.index(s)] >= setup.cfg.max_kv_cache_capacity:
                    setup.release([s])
                    del left[s]
    return steps


@pytest.mark.parametrize("count, device", [pytest.param(150, "host", id="host-150"),
                                           pytest.param(1000, "host", id="host-1000", marks=pytest.mark.slow),
                                           pytest.param(200, "gpu", id="gpu-200", marks=pytest.mark.gpu)])
def test_many_requests_leave_allocations_graphs_and_pages_at_their_baseline(count: int, device: str) -> None:
    if device == "gpu":
        pytest.importorskip("cupy")
    cfg = small_pool_cfg(pool=10)
    be = trtio.get_backend("host" if device == "host" else "cuda")
    trtio.Stream.default(be)
    import gc

    gc.collect()
    base = (be.live_allocations, be.live_graphs, be.live_events)
    with llm(cfg, device, graphs=True) as setup:
        steps = _random_requests(setup, count, seed=11)
        assert steps > count and setup.kv_pages.free == setup.kv_pages.total
        assert setup.graph_stats.captures <= 4 * setup._seqs.max_batch, "graphs per batch size, not per request"
    gc.collect()
    assert (be.live_allocations, be.live_graphs, be.live_events) == base


# -- prefixes dropped, or released from another thread ------------------------------------------------------


def test_a_prefix_dropped_without_release_gives_its_pages_back_when_collected() -> None:
    import gc

    cfg = small_pool_cfg(pool=8)
    with llm(cfg) as setup:
        x, lens = emb([list(range(2 * PAGE + 3))])
        setup.prefill(x, lens, slots=[0])
        prefix = setup.pin_prefix(0, 2 * PAGE + 3)
        setup.release([0])
        assert setup.kv_pages.free == 8 - 3, "the prefix holds its three pages"
        with pytest.warns(ResourceWarning, match="prefix of 35 tokens was never closed"):
            del prefix
            gc.collect()
        assert setup.kv_pages.free == 8, "its pages went back to the pool"
        setup.prefill(*emb([list(range(5))]), slots=[1])  # the pool works on
        assert setup.kv_pages.free == 7


def test_a_prefix_released_on_another_thread_while_steps_run_leaves_the_pool_consistent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One thread admits sequences from prefixes, decodes and releases them; another releases the prefixes the
    first hands it, at the same time. The release waits for the step in progress (the setup's page lock), so
    no step sees a pool changing under it: every step succeeds, and in the end every page is free. (Each drop of
    a page reference is made slow, read and write apart, so that two unlocked drops would interleave.)"""
    import queue
    import time

    def slow_drop(pool: PagePool, pages: Any) -> None:
        for p in pages:
            left = int(pool._refs[p]) - 1
            time.sleep(1e-4)
            pool._refs[p] = left
            if left == 0:
                pool._free.append(p)

    monkeypatch.setattr(PagePool, "drop", slow_drop)

    cfg = small_pool_cfg(pool=24)
    handed: queue.Queue[Any] = queue.Queue()
    errors: list[BaseException] = []

    def releaser() -> None:
        while True:
            p = handed.get()
            if p is None:
                return
            try:
                p.release()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

    import sys

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between almost any two bytecodes: races show
    with llm(cfg) as setup:
        thread = threading.Thread(target=releaser)
        thread.start()
        try:
            rng = np.random.default_rng(2)
            for i in range(60):
                system = list(map(int, rng.integers(0, 512, PAGE + 3)))
                setup.prefill(*emb([system]), slots=[0])
                prefix = setup.pin_prefix(0, len(system))
                setup.release([0])
                setup.prefill(*emb([[1, 2], [3, 4, 5]]), slots=[1, 2], prefix=prefix)
                handed.put(prefix)  # released over there, while this thread releases and decodes
                setup.release([1])
                for _ in range(2):
                    setup.decode(E[[int(rng.integers(0, 512))]][:, None].astype(np.float16))
                setup.release([2])
                if i % 7 == 0:
                    pool = setup._seqs.tables["llm"].pool
                    assert pool.free + pool.used == pool.total
        finally:
            handed.put(None)
            thread.join()
            sys.setswitchinterval(switch)
        assert errors == []
        assert setup.kv_pages.free == 24, "every page came back: none leaked, none given back twice"
