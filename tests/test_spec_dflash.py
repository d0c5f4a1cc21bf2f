"""DFlash pairs (a base whose ``hidden_states`` is its target layers' streams side by side ``[T, 3H]``; a block draft
reading the newly committed tokens' features through ``dflash_target_hidden_concat`` / ``dflash_delta_*``) run
through the existing phases (``trtio.families.spec.dflash``): speculative tokens equal the base's greedy tokens, on a
dense and on a hybrid (snapshot) base, over a changing batch (admissions, releases, a reused slot), graphs on and off.

The toy pairs are ``toy-dflash-ragged`` (a three-layer base) and ``toy-qwen35-dflash-ragged`` (a Gated-DeltaNet
layer and two attention layers); their drafts copy the base's attention layers and unroll their block
(``docs/toy-model.md``, "DFlash drafts").
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _generate import accepted_percent, generate
from test_spec_mtp import emb, greedy  # the toys' embeddings and the numpy base's greedy tokens

import trtio
from trtio.edgellm import EngineDir
from trtio.testing import ReferenceEngine, ToyWeights, reference_forward, toy_embedding
from trtio.testing.toy_engines import default_engines_dir

ENGINES = default_engines_dir()
DENSE = ENGINES / "toy-dflash-ragged"
HYBRID = ENGINES / "toy-qwen35-dflash-ragged"
E = toy_embedding(512, 64)
BLOCK = 4
MASK = 511


@functools.cache
def toy_weights(directory: Path) -> tuple[ToyWeights, ToyWeights]:
    """The base's and the block draft's weights of a DFlash toy (its projection fitted to its base)."""
    bundle = EngineDir.open(directory).deployment(1, BLOCK - 1, BLOCK)
    assert bundle.draft is not None
    bw = ToyWeights.generate(bundle.base, 0)
    return bw, ToyWeights.generate_dflash_draft(bundle.draft, bw, E, MASK, base_cfg=bundle.base)


def dflash_setup(device: str = "host", *, graphs: bool = False, directory: Path = DENSE,
                 block: int = BLOCK) -> trtio.SpecDecodeSetup:
    bundle = EngineDir.open(directory).deployment(1, block - 1, block)
    assert bundle.draft is not None
    bw, dw = toy_weights(directory)
    return trtio.create_for_spec_decode(ReferenceEngine.from_config(bundle.base, device=device, weights=bw),
                                        ReferenceEngine.from_config(bundle.draft, device=device, weights=dw),
                                        bundle, graphs=graphs)


def block_of(roots: list[int], block: int = BLOCK) -> np.ndarray:
    """The blocks [batch, block, H]: each root's token, then mask tokens."""
    return E[np.array([[r] + [MASK] * (block - 1) for r in roots])].astype(np.float16)


class Rounds:
    """Greedy DFlash rounds over a setup's active slots: the root and the block's guesses verified as one chain, the
    longest agreeing prefix accepted with the base's next token, the next block drafted over the accepted path."""

    def __init__(self, setup: trtio.SpecDecodeSetup, block: int = BLOCK) -> None:
        self.setup, self.block = setup, block
        self.seqs: dict[int, dict[str, Any]] = {}  # slot -> {"tokens", "guesses": the block's guesses}
        self.drafted = self.accepted = 0

    def _guesses(self, logits: Any, b: int) -> np.ndarray:
        return logits.to_numpy().reshape(b, self.block, -1).argmax(-1)[:, 1:]  # row j guesses its position

    def admit(self, slot: int, prompt: list[int]) -> dict[str, Any]:
        s = self.setup
        x, lens = emb([prompt])
        first = int(s.base_prefill(x, lens, slots=[slot]).to_numpy()[0].argmax())
        guesses = self._guesses(s.draft_prefill(block_of([first], self.block), lens, slots=[slot]), 1)[0]
        self.seqs[slot] = q = {"tokens": prompt + [first], "guesses": guesses}
        return q

    def release(self, slot: int) -> None:
        self.setup.release([slot])
        del self.seqs[slot]

    def round(self) -> None:
        s, n = self.setup, self.block
        seqs = [self.seqs[slot] for slot in s.active.tolist()]
        b = len(seqs)
        tokens = np.array([[q["tokens"][-1], *q["guesses"]] for q in seqs])  # [b, n]: root, then the guesses
        greedy = s.verify(E[tokens].astype(np.float16), list(range(-1, n - 1))).to_numpy().reshape(b, n, -1)
        greedy = greedy.argmax(-1)
        paths, emitted = [], []
        for t, g in zip(tokens, greedy):
            k = 1
            while k < n and t[k] == g[k - 1]:
                k += 1
            paths.append(list(range(k)))
            emitted.append([int(v) for v in t[1:k]] + [int(g[k - 1])])
            self.drafted += n - 1
            self.accepted += k - 1
        s.accept(paths)
        guesses = self._guesses(s.draft_accept(block_of([e[-1] for e in emitted], n), [len(p) for p in paths]), b)
        for q, e, gs in zip(seqs, emitted, guesses):
            q["tokens"] += e
            q["guesses"] = gs

    @property
    def acceptance(self) -> float:
        """Accepted drafted tokens over drafted tokens (``block - 1`` per sequence and round)."""
        return self.accepted / self.drafted


PROMPTS = [[int(t) for t in np.random.default_rng(r).integers(3, 500, n)] for r, n in enumerate((14, 5, 21, 9, 11))]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("directory", [DENSE, HYBRID], ids=["dense", "hybrid"])
def test_dflash_tokens_equal_the_bases_greedy_tokens_over_a_changing_batch(device: str, directory: Path,
                                                                           graphs: bool) -> None:
    """Requests admitted between rounds into chosen slots, one released and its slot reused: each request's tokens
    are the base's greedy tokens after its prompt; no KV page is held after the last release."""
    plan = {0: [("admit", 0, 2)], 1: [("admit", 1, 0)], 2: [("release", None, 2), ("admit", 2, 2)],
            3: [("admit", 3, 3)]}
    requests: dict[int, dict[str, Any]] = {}
    with dflash_setup(device, graphs=graphs, directory=directory) as setup:
        run = Rounds(setup)
        free = setup.kv_pages.free
        for step in range(5):
            for what, req, slot in plan.get(step, []):
                if what == "admit":
                    requests[req] = run.admit(slot, PROMPTS[req])
                else:
                    run.release(slot)
            run.round()
        assert sorted(setup.active.tolist()) == [0, 2, 3]
        if graphs:
            stats = setup.graph_stats
            assert stats["base"].hits > 0 and stats["draft"].hits > 0, "rounds replay their graphs"
        for slot in list(run.seqs):
            run.release(slot)
        assert setup.kv_pages.free == free, "every page came back"
    for req, q in requests.items():
        n = len(q["tokens"]) - len(PROMPTS[req])
        assert q["tokens"] == greedy(directory, PROMPTS[req], n), f"request {req}: the base's greedy tokens"


@pytest.mark.parametrize("directory", [DENSE, HYBRID], ids=["dense", "hybrid"])
def test_the_toy_dflash_draft_guesses_most_of_the_bases_tokens(directory: Path) -> None:
    """Blocks of 4 on each toy pair: at least 60% of the drafted tokens accepted."""
    with dflash_setup(directory=directory) as setup:
        run = Rounds(setup)
        for slot, prompt in enumerate(PROMPTS[:4]):
            run.admit(slot, prompt)
        for _ in range(6):
            run.round()
    assert run.acceptance >= 0.6, f"{run.acceptance:.0%} of drafted tokens accepted"


@pytest.mark.parametrize("sets", [2, pytest.param(8, marks=pytest.mark.slow)])
def test_the_toy_drafts_guess_most_tokens_over_many_prompts(sets: int) -> None:
    """Both toy pairs through the demo's rounds (``trtio._tools.dflash_demo``), seeded sets of four prompts (two in
    the quick suite, eight at full count), 24 new tokens each: every set's tokens are the base's greedy ones, and at
    least 60% of its drafted tokens are accepted, on each pair. (The hybrid pair's draft lacks the base's recurrent
    layer: its fitted projection is what carries the base's features into its attention.)"""
    from trtio._cuda.backend import get_backend  # noqa: PLC0415
    from trtio._tools.dflash_demo import run_dflash  # noqa: PLC0415

    rates: dict[str, list[float]] = {}
    for seed in range(sets):
        rng = np.random.default_rng(100 + seed)
        prompts = [[int(t) for t in rng.integers(3, 500, n)] for n in (5, 12, 3, 8)]
        for name, section in run_dflash(ENGINES, prompts, 24, get_backend("host"), graphs=False).items():
            assert section["ok"], (name, seed)
            rates.setdefault(name, []).append(section["acceptance"])
    assert set(rates) == {"toy-dflash-ragged", "toy-qwen35-dflash-ragged"}
    for name, got in rates.items():
        assert min(got) >= 0.6, (name, [f"{r:.0%}" for r in got])


def test_the_hybrid_bases_features_are_the_streams_after_its_target_layers_recurrent_layers_counted() -> None:
    """The hybrid DFlash base's ``hidden_states`` (target layers 0, 1, 2: the Gated-DeltaNet layer and both
    attention layers) are ``reference_forward``'s streams after those layers; layer 0's is the embedding plus the
    recurrent layer's output."""
    bundle = EngineDir.open(HYBRID).deployment(1, BLOCK - 1, BLOCK)
    bw, _ = toy_weights(HYBRID)
    prompt = PROMPTS[1]
    x, lens = emb([prompt])
    with dflash_setup(directory=HYBRID) as s:
        s.base_prefill(x, lens)
        got = np.asarray(s.io.base_hidden_states.to_numpy(), np.float32)[:len(prompt)]
    want, _ = reference_forward(bw, bundle.base, E[prompt].astype(np.float16),
                                hidden_after=bundle.base.eagle_hidden_state_layers)
    assert bundle.base.eagle_hidden_state_layers == (0, 1, 2)
    h = bundle.base.hidden_size
    np.testing.assert_allclose(got[:, :h], want[:, :h], atol=1e-2)  # the recurrent layer's stream
    np.testing.assert_allclose(got, want, atol=0.1)  # FP16 activations and caches through three layers
    assert np.abs(want[:, :h] - want[:, h:2 * h]).max() > 1.0, "layer 0's stream is not attention layer 0's"


def test_a_block_after_a_round_is_the_block_after_a_prefill_of_the_same_tokens() -> None:
    """The delta a round feeds the draft (the accepted path's base rows put in order, their positions, RoPE rows and
    sequences) writes the draft's KV as a prefill of the whole sequence does: the next block's logits agree, for two
    sequences accepting paths of different lengths."""
    prompts = [PROMPTS[0], PROMPTS[1]]
    with dflash_setup() as s:
        run = Rounds(s)
        for slot, prompt in enumerate(prompts):
            run.admit(slot, prompt)
        run.round()
        run.round()
        seqs = [run.seqs[0], run.seqs[1]]
        got = s.io.output_logits.to_numpy().reshape(2, BLOCK, -1)
    assert {len(q["tokens"]) - len(p) for q, p in zip(seqs, prompts)} != {2}, "the rounds accepted drafted tokens"
    with dflash_setup() as fresh:
        for slot, q in enumerate(seqs):
            x, lens = emb([q["tokens"][:-1]])
            fresh.base_prefill(x, lens, slots=[slot])
            want = fresh.draft_prefill(block_of([q["tokens"][-1]]), lens, slots=[slot]).to_numpy()
            np.testing.assert_allclose(got[slot], want.reshape(BLOCK, -1), atol=3e-2, rtol=3e-2,
                                       err_msg=f"slot {slot}")


def test_a_dflash_pair_refuses_draft_propose_and_a_block_of_another_shape_before_any_work() -> None:
    """draft_propose is no step of a block draft; a block wider than the draft's, or of another batch, is a
    ShapeError naming inputs_embeds; nothing is enqueued and the round goes on."""
    with dflash_setup() as s:
        x, lens = emb([PROMPTS[0], PROMPTS[1]])
        s.base_prefill(x, lens)
        ops = s.io.backend.op_count
        for bad in (block_of([5, 6], BLOCK + 1), block_of([5], BLOCK)):
            with pytest.raises(trtio.ShapeError, match="inputs_embeds: a DFlash block"):
                s.draft_prefill(bad, lens)
        assert s.io.backend.op_count == ops, "nothing was enqueued"
        s.draft_prefill(block_of([5, 6]), lens)
        with pytest.raises(trtio.TrtioError, match="a DFlash draft proposes a whole block"):
            s.draft_propose(E[[[5], [6]]].astype(np.float16))
        assert s.io.backend.op_count > ops


def test_a_delta_taken_from_a_tree_path_is_put_in_order_first() -> None:
    """A verify tree whose accepted path skips a node (root, node 2, node 3 of parents [-1, 0, 0, 2]): the path's base
    rows are put in order before the draft reads them, so the next block is the one a prefill of those tokens
    gives."""
    prompt = PROMPTS[2]
    want_tokens = greedy(DENSE, prompt, 4)[len(prompt):]  # root, then the base's next three
    root, t2, t3, after = want_tokens
    with dflash_setup() as s:
        x, lens = emb([prompt])
        s.base_prefill(x, lens)
        s.draft_prefill(block_of([root]), lens)
        tree = E[[[root, 7, t2, t3]]].astype(np.float16)
        greedy_rows = s.verify(tree, [-1, 0, 0, 2]).to_numpy().argmax(-1)
        assert greedy_rows[3] == after
        s.accept([[0, 2, 3]])
        got = s.draft_accept(block_of([after]), [3]).to_numpy()
    with dflash_setup() as fresh:
        x, lens = emb([prompt + [root, t2, t3]])
        fresh.base_prefill(x, lens)
        want = fresh.draft_prefill(block_of([after]), lens).to_numpy()
    np.testing.assert_allclose(got, want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("name", ["toy-dflash-ragged", "toy-qwen35-dflash-ragged"])
def test_trtio_generate_speculative_on_the_dflash_toys_prints_the_bases_greedy_text(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``trtio generate --speculative`` on a DFlash toy prints what the base alone prints and says how many drafted
    tokens it accepted (at least 60% on the dense toy); more than one chain is refused naming --draft-top-k."""
    pytest.importorskip("tokenizers")
    def run(*flags: str) -> tuple[int, str, str]:
        return generate(capsys, ENGINES / name, *flags)

    rc, alone, err = run()
    assert rc == 0, err
    rc, out, err = run("--speculative")
    assert rc == 0, err
    assert out == alone
    rate = accepted_percent(err)
    assert rate >= 60 or name != "toy-dflash-ragged"
    rc, out, err = run("--speculative", "--draft-top-k", "2")
    assert rc != 0 and "--draft-top-k: is 2, but a block draft (DFlash, JetSpec) guesses one block" in err


def test_the_demos_dflash_pairs_decode_greedy_tokens_and_accept_most_drafts() -> None:
    """``trtio demo``'s DFlash section (:mod:`trtio._tools.dflash_demo`): both toy pairs, blocks of 4, their tokens
    the numpy base's greedy ones, at least 60% of drafted tokens accepted; the summary's line says so."""
    from trtio._cuda.backend import get_backend  # noqa: PLC0415
    from trtio._tools.dflash_demo import format_dflash, run_dflash  # noqa: PLC0415

    s = run_dflash(ENGINES, PROMPTS[:3], 8, get_backend("host"))
    assert set(s) == {"toy-dflash-ragged", "toy-qwen35-dflash-ragged"}
    for name, section in s.items():
        assert section["ok"], name
        assert all(len(t) == 8 for t in section["tokens"])
        assert section["acceptance"] >= 0.6, (name, section["acceptance"])
    line = format_dflash(s)[0]
    assert line.startswith("DFlash pairs (blocks of 4)") and "equal to greedy yes" in line
    assert "toy-qwen35-dflash-ragged (hybrid: gated_deltanet, attention, attention)" in line


def test_a_dflash_sequence_from_a_pinned_prefix_decodes_greedy_tokens_and_its_draft_reads_the_prefix() -> None:
    """A prefix pinned after a round, its slot released, a new request started from it in another slot: the tokens
    are the base's greedy ones after the prefix's tokens and the new prompt, and the draft, whose KV holds the
    prefix's delta entries, still guesses most of them."""
    with dflash_setup() as s:
        run = Rounds(s)
        run.admit(0, PROMPTS[0])
        run.round()
        with s.pin_prefix(0, len(PROMPTS[0])) as prefix:
            run.release(0)
            start = PROMPTS[0][:prefix.tokens]
            tail = [7, 8, 9]
            x, lens = emb([tail])
            first = int(s.base_prefill(x, lens, slots=[1], prefix=prefix).to_numpy()[0].argmax())
            block = s.draft_prefill(block_of([first]), lens, slots=[1], prefix=prefix)
            run.seqs[1] = {"tokens": start + tail + [first], "guesses": run._guesses(block, 1)[0]}
            run.drafted = run.accepted = 0
            for _ in range(3):
                run.round()
        tokens = run.seqs[1]["tokens"]
    assert tokens == greedy(DENSE, start + tail, len(tokens) - len(start) - len(tail))
    assert run.acceptance >= 0.6, f"{run.acceptance:.0%}"


def _rounds_on(seed: int, mode: str, feed_kind: str, directory: Path) -> np.ndarray:
    """Two DFlash rounds on :class:`~trtio.testing.AsyncHostBackend` (``seed``: its streams' interleaving), each
    call on the runner's stream (``mode``: one stream, two streams or two threads), fed ``feed_kind`` inputs; every
    step's logits."""
    import gc  # noqa: PLC0415

    from test_stream_order import _Feed, _keep, _Runner  # noqa: PLC0415

    from trtio.testing import AsyncHostBackend  # noqa: PLC0415

    be = AsyncHostBackend(seed)
    run, feed = _Runner(be, mode), _Feed(be, feed_kind)
    bundle = EngineDir.open(directory).deployment(1, BLOCK - 1, BLOCK)
    bw, dw = toy_weights(directory)
    base = ReferenceEngine.from_config(bundle.base, backend=be, weights=bw)
    draft = ReferenceEngine.from_config(bundle.draft, backend=be, weights=dw)
    rng = np.random.default_rng(11)

    def e(shape: tuple[int, ...]) -> np.ndarray:
        return E[rng.integers(3, 500, shape)].astype(np.float16)

    try:
        with trtio.create_for_spec_decode(base, draft, bundle, backend=be) as s_:
            outs = [run(lambda s: _keep(s_.base_prefill(feed(e((2, 5)), s), [5, 4], s), s, be)),
                    run(lambda s: _keep(s_.draft_prefill(feed(e((2, BLOCK)), s), [5, 4], s), s, be))]
            for paths in ([[0, 1], [0, 1, 2]], [[0, 1, 2, 3], [0]]):
                outs.append(run(lambda s: _keep(s_.verify(feed(e((2, BLOCK)), s), list(range(-1, BLOCK - 1)), s),
                                                s, be)))
                run(lambda s, p=paths: s_.accept(p, s))
                lens = [len(p) for p in paths]
                outs.append(run(lambda s, n=lens: _keep(s_.draft_accept(feed(e((2, BLOCK)), s), n, s), s, be)))
            gc.collect()
            return np.concatenate([o.to_numpy().reshape(-1) for o in outs])
    finally:
        run.close()


@pytest.mark.parametrize("mode, feed_kind", [("streams", "long-lived"), ("threads", "tensor view")])
def test_dflash_rounds_on_two_streams_give_the_one_stream_logits(mode: str, feed_kind: str) -> None:
    """The delta's upload, its RoPE rows' gather and the accepted rows' moves are ordered with the steps around them
    (the stream rule), whatever the device's interleaving of the streams; inputs dropped as each call returns are
    read intact. On the hybrid base, whose accept also commits its states."""
    import warnings  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        want = _rounds_on(0, "one", "long-lived", HYBRID)
        assert np.isfinite(want).all()
        for seed in (1, 2):
            np.testing.assert_array_equal(_rounds_on(seed, mode, feed_kind, HYBRID), want, err_msg=f"seed {seed}")


@pytest.mark.parametrize("change, field", [({"version": 2}, "dflash_config.version"),
                                           ({"mask_token_id": None}, "dflash_config.mask_token_id"),
                                           ({"block_size": 16}, "dflash_config.block_size")],
                         ids=["dflash2", "no-mask-token", "block-past-the-profile"])
def test_a_dflash_draft_trtio_cannot_run_is_refused_at_setup_naming_the_key(tmp_path: Path, change: dict[str, Any],
                                                                           field: str) -> None:
    """DFlash2 (a candidate selector picks the block's tokens), a draft without its mask token and a block wider than
    the draft's profile takes (cutting it short would change what the draft computes) are refused by
    create_for_spec_decode, naming the key, before anything is allocated."""
    import json  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    d = tmp_path / "pair"
    shutil.copytree(DENSE, d)
    for role in ("base", "draft"):
        cfg = json.loads((d / f"{role}_config.json").read_text())
        cfg["dflash_config"].update(change)
        (d / f"{role}_config.json").write_text(json.dumps(cfg))
    bundle = EngineDir.open(d).deployment(1, BLOCK - 1, BLOCK)
    assert bundle.draft is not None
    engines = [ReferenceEngine.from_config(c, device="host", null_compute=True) for c in (bundle.base, bundle.draft)]
    with pytest.raises(trtio.ConfigError) as info:
        trtio.create_for_spec_decode(*engines, bundle)
    assert info.value.field == field


def test_trtio_inspect_names_the_pairs_family(capsys: pytest.CaptureFixture[str]) -> None:
    """``trtio inspect`` on a DFlash toy says it is a DFlash pair and lists the block draft's delta inputs."""
    from trtio._cli import main  # noqa: PLC0415

    assert main(["inspect", str(DENSE)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(": a DFlash speculative pair, ragged contract (token-major, paged KV cache)")
    assert "dflash_delta_token_to_sequence" in out and "PipelineIO.base_hidden_states" in out


def test_a_deltas_base_rows_are_moved_where_a_path_leaves_them_out_of_order_and_only_there() -> None:
    """The delta's base rows are read at row ``i * a + j`` (``a``: the block's width here): a path that skips a node
    (root, 2, 3 of parents [-1, 0, 0, 2]) has its rows put there first, whichever lengths the batch's other paths
    have; paths of new lengths down a chain lie there already and cost no device operation more than whole blocks
    (the moves cost some)."""
    prompts = [PROMPTS[0], PROMPTS[1]]
    with dflash_setup() as s:
        x, lens = emb(prompts)
        s.base_prefill(x, lens)
        s.draft_prefill(block_of([5, 6]), lens)
        hidden = s.io.base_hidden_states
        ops: dict[str, int] = {}
        for paths in ([[0, 2, 3], [0, 1]], [[0, 1], [0, 2, 3]], [[0, 2], [0]]):
            s.verify(E[[[5, 7, 8, 9], [6, 7, 8, 9]]].astype(np.float16), [-1, 0, 0, 2])
            verified = hidden.to_numpy().reshape(2 * BLOCK, -1).copy()
            s.accept(paths)
            before = s.io.backend.op_count
            s.draft_accept(block_of([5, 6]), [len(p) for p in paths])
            ops["moved"] = s.io.backend.op_count - before
            got = hidden.to_numpy().reshape(2 * BLOCK, -1)
            for i, path in enumerate(paths):
                at = i * BLOCK
                np.testing.assert_array_equal(got[at:at + len(path)], verified[at + np.array(path)],
                                              err_msg=f"paths {paths}, sequence {i}")
        chain = [-1, 0, 1, 2]
        for name, paths in (("whole", [[0, 1, 2, 3]] * 2), ("whole", [[0, 1, 2, 3]] * 2), ("new", [[0, 1, 2], [0]]),
                            ("new", [[0], [0, 1]]), ("new", [[0, 1, 2, 3], [0, 1, 2]])):
            s.verify(E[[[5, 7, 8, 9], [6, 7, 8, 9]]].astype(np.float16), chain)
            s.accept(paths)
            before = s.io.backend.op_count
            s.draft_accept(block_of([5, 6]), [len(p) for p in paths])
            ops[name] = max(ops.get(name, 0), s.io.backend.op_count - before)
        assert ops["new"] <= ops["whole"] < ops["moved"], ops
