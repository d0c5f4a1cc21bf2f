"""MTP pairs (a base whose ``hidden_states`` is its last layer's stream ``[T, H]``; a one-layer draft with its own KV)
run through the EAGLE3 phases: speculative tokens equal the base's greedy tokens, chain and tree, over a changing
batch (admissions, releases, a reused slot), with CUDA graphs on and off.

The toy pair is ``toy-mtp-ragged``: a one-layer base and a draft whose layer is the base's (``ToyWeights.
generate_draft``), so its guesses are the base's next tokens but where the first token tips the choice.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _generate import accepted_percent, generate

import trtio
from trtio._pages import DEFAULT_MAX_PREFIXES
from trtio._rope import rope_cos_sin_table
from trtio.edgellm import EngineDir
from trtio.testing import AsyncHostBackend, ReferenceEngine, ToyWeights, reference_forward, toy_embedding
from trtio.testing.toy_engines import default_engines_dir

ENGINES = default_engines_dir()
MTP = ENGINES / "toy-mtp-ragged"
HYBRID = ENGINES / "toy-qwen35-mtp-ragged"  # a Gated-DeltaNet base (a recurrent and an attention layer)
E = toy_embedding(512, 64)


def mtp_setup(k: int, depth: int, device: str = "host", *, graphs: bool = False,
              directory: Path = MTP, tree_base: bool = False) -> trtio.SpecDecodeSetup:
    """The pair of ``directory`` drafting ``k`` chains ``depth`` deep; ``tree_base``: its base built as a tree base
    (``mtp_tree_base``: a hybrid base's recurrent layers run each verify node from its parent's states)."""
    bundle = EngineDir.open(directory).deployment(k, depth, 1 + k * depth)
    if tree_base:
        bundle = dataclasses.replace(bundle, base=dataclasses.replace(bundle.base, mtp_tree_base=True)).validate()
    assert bundle.draft is not None
    bw = ToyWeights.generate(bundle.base, 0)
    dw = ToyWeights.generate_draft(bundle.draft, bw, 0)
    return trtio.create_for_spec_decode(ReferenceEngine.from_config(bundle.base, device=device, weights=bw),
                                        ReferenceEngine.from_config(bundle.draft, device=device, weights=dw),
                                        bundle, graphs=graphs)


def emb(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings [batch, longest, H] (padded with token 0) and the lengths."""
    width = max(len(r) for r in rows)
    ids = np.array([r + [0] * (width - len(r)) for r in rows])
    return E[ids].astype(np.float16), np.array([len(r) for r in rows])


class Rounds:
    """Greedy speculative rounds over a setup's active slots: ``k`` chains drafted ``depth`` deep (one chain when
    ``k`` is 1), verified as one tree, the longest agreeing chain accepted with the base's next token."""

    def __init__(self, setup: trtio.SpecDecodeSetup, k: int, depth: int) -> None:
        self.setup, self.k, self.depth = setup, k, depth
        # verify node 0 is the pending token; drafted node j (level j // k, chain j % k) is node j + 1
        self.parents = np.array([-1] + [0 if j < k else j - k + 1 for j in range(k * depth)], np.int64)
        self.depth_of = np.array([0] + [j // k + 1 for j in range(k * depth)])
        self.seqs: dict[int, dict[str, Any]] = {}  # slot -> {"tokens", "draft": draft logits at the root}
        self.drafted = self.accepted = 0

    def admit(self, slot: int, prompt: list[int]) -> dict[str, Any]:
        s = self.setup
        x, lens = emb([prompt])
        first = int(s.base_prefill(x, lens, slots=[slot]).to_numpy()[0].argmax())
        draft = s.draft_prefill(emb([prompt[1:] + [first]])[0], lens, slots=[slot]).to_numpy()[0]
        self.seqs[slot] = q = {"tokens": prompt + [first], "draft": draft}
        return q

    def release(self, slot: int) -> None:
        self.setup.release([slot])
        del self.seqs[slot]

    def round(self) -> None:
        s, k = self.setup, self.k
        order = s.active.tolist()
        seqs = [self.seqs[slot] for slot in order]
        b = len(order)
        level = np.stack([np.argsort(-q["draft"], kind="stable")[:k] for q in seqs])  # [b, k]
        levels = [level]
        for n in range(1, self.depth):
            par = np.full(k, -1) if n == 1 else np.arange(k) + (n - 2) * k
            logits = s.draft_propose(E[level].astype(np.float16), parents=par).to_numpy().reshape(b, k, -1)
            level = logits.argmax(-1)
            levels.append(level)
        tokens = np.concatenate([np.array([[q["tokens"][-1]] for q in seqs]), *levels], axis=1)  # [b, N]
        n_nodes = tokens.shape[1]
        greedy = s.verify(E[tokens].astype(np.float16), self.parents).to_numpy().reshape(b, n_nodes, -1).argmax(-1)
        paths, emitted = [], []
        for t, g in zip(tokens, greedy):
            ok = np.zeros(n_nodes, bool)
            ok[0] = True
            for node in range(1, n_nodes):
                ok[node] = ok[self.parents[node]] and t[node] == g[self.parents[node]]
            best = int(np.argmax(np.where(ok, self.depth_of, -1)))
            path = [best]
            while path[-1] != 0:
                path.append(int(self.parents[path[-1]]))
            path.reverse()
            paths.append(path)
            emitted.append([int(t[n]) for n in path[1:]] + [int(g[best])])
            self.drafted += self.depth
            self.accepted += len(path) - 1
        s.accept(paths)
        x, lens = emb(emitted)
        draft = s.draft_accept(x, lens).to_numpy()
        for q, e, d in zip(seqs, emitted, draft):
            q["tokens"] += e
            q["draft"] = d

    @property
    def acceptance(self) -> float:
        """Accepted drafted levels over drafted levels (``depth`` per sequence and round)."""
        return self.accepted / self.drafted


def greedy(directory: Path, prompt: list[int], count: int) -> list[int]:
    """The numpy base's greedy tokens after ``prompt`` (``count`` of them), each over the whole sequence from zero
    states (no cache, no trtio step)."""
    base = EngineDir.open(directory).base_config
    weights = ToyWeights.generate(base, 0)
    rope = rope_cos_sin_table(base.max_kv_cache_capacity, base.rotary_dim, base.rope_theta)
    tokens = list(prompt)
    while len(tokens) < len(prompt) + count:
        tokens.append(int(reference_forward(weights, base, E[tokens].astype(np.float16), rope=rope)[1][-1].argmax()))
    return tokens


PROMPTS = [[int(t) for t in np.random.default_rng(r).integers(3, 512, n)] for r, n in enumerate((14, 5, 21, 9, 11))]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("directory, k, depth, tree_base", [(MTP, 1, 3, False), (MTP, 2, 3, False),
                                                             (HYBRID, 1, 3, False), (HYBRID, 2, 3, True)],
                         ids=["chain", "tree", "hybrid-chain", "hybrid-tree"])
def test_mtp_tokens_equal_the_bases_greedy_tokens_over_a_changing_batch(device: str, directory: Path, k: int,
                                                                         depth: int, tree_base: bool,
                                                                         graphs: bool) -> None:
    """Requests admitted between rounds into chosen slots, one released and its slot reused by a new request: each
    request's tokens are the base's greedy tokens after its prompt; no KV page is held after the last release. On
    the hybrid base every accept commits the accepted token's recurrent states into its slot ("snapshot"); a tree
    base (``mtp_tree_base``) verifies 2 chains as one tree, each node from its parent's states."""
    plan = {0: [("admit", 0, 2)], 1: [("admit", 1, 0)], 2: [("admit", 2, 3)],
            4: [("release", 3, None), ("admit", 3, 3)], 5: [("admit", 4, 1)]}
    requests: dict[int, dict[str, Any]] = {}
    with mtp_setup(k, depth, device, graphs=graphs, directory=directory, tree_base=tree_base) as setup:
        run = Rounds(setup, k, depth)
        free = setup.kv_pages.free
        for step in range(8):
            for what, req, slot in plan.get(step, []):
                if what == "admit":
                    requests[req] = run.admit(slot, PROMPTS[req])
                else:
                    run.release(req)
            run.round()
        assert sorted(setup.active.tolist()) == [0, 1, 2, 3]
        if graphs:
            stats = setup.graph_stats
            assert stats["base"].hits > 0 and stats["draft"].hits > 0, "rounds replay their graphs"
        for slot in list(run.seqs):
            run.release(slot)
        assert setup.kv_pages.free == free, "every page came back"
    for req, q in requests.items():
        n = len(q["tokens"]) - len(PROMPTS[req])
        assert q["tokens"] == greedy(directory, PROMPTS[req], n), f"request {req}: the base's greedy tokens"


def test_the_toy_mtp_draft_guesses_most_of_the_bases_tokens() -> None:
    """Chain drafting 3 deep on toy-mtp-ragged: at least 60% of drafted levels accepted."""
    with mtp_setup(1, 3) as setup:
        run = Rounds(setup, 1, 3)
        for slot, prompt in enumerate(PROMPTS[:4]):
            run.admit(slot, prompt)
        for _ in range(6):
            run.round()
    assert run.acceptance >= 0.6, f"{run.acceptance:.0%} of drafted levels accepted"


def test_the_mtp_draft_reads_the_bases_last_hidden_state_of_width_h() -> None:
    """The pair's spec section: the draft reads hidden_size features (MTP: the base's last layer), not 3 x."""
    bundle = EngineDir.open(MTP).deployment(1, 3, 4)
    assert bundle.spec is not None and bundle.draft is not None
    assert bundle.spec.base_output_hidden_dim == bundle.base.hidden_size == 64
    assert bundle.draft.num_attention_layers == 1 and bundle.base.eagle_hidden_state_layers == ()


def test_the_mtp_draft_reads_the_bases_last_layer_stream_as_hidden_states_input() -> None:
    """Draft prefill of the prompt shifted by one: its logits at the last row are the numpy draft's over those
    embeddings with ``hidden_states_input`` = the base's final stream [T, H] (a draft weighing it 100x the toy's,
    so that a wrong or missing feature shows)."""
    bundle = EngineDir.open(MTP).deployment(1, 3, 4)
    assert bundle.draft is not None
    bw = ToyWeights.generate(bundle.base, 0)
    dw = ToyWeights.generate_draft(bundle.draft, bw, 0)
    dw = dataclasses.replace(dw, wh=dw.wh * 100)
    prompt = PROMPTS[0]
    with trtio.create_for_spec_decode(ReferenceEngine.from_config(bundle.base, device="host", weights=bw),
                                      ReferenceEngine.from_config(bundle.draft, device="host", weights=dw),
                                      bundle) as s:
        x, lens = emb([prompt])
        first = int(s.base_prefill(x, lens, slots=[0]).to_numpy()[0].argmax())
        shifted = prompt[1:] + [first]
        got = s.draft_prefill(emb([shifted])[0], lens, slots=[0]).to_numpy()[0]
    rope = rope_cos_sin_table(bundle.base.max_kv_cache_capacity, bundle.base.rotary_dim, bundle.base.rope_theta)
    hidden, _ = reference_forward(bw, bundle.base, E[prompt].astype(np.float16), rope=rope)
    _, logits = reference_forward(dw, bundle.draft, E[shifted].astype(np.float16), rope=rope,
                                  hidden_input=hidden.astype(np.float16),
                                  hidden_from_draft=np.zeros_like(hidden, dtype=np.float16))
    want = logits[-1] - logits[-1].max()
    want -= np.log(np.exp(want).sum())  # the draft engine returns log-probabilities
    np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)
    assert np.abs(dw.wh).max() > 0.05, "the feature weighs enough to show"


def test_a_hybrid_base_verifies_chains_only_and_refuses_a_tree_before_any_work() -> None:
    """Its recurrent layers run a step's rows in order (not built with ``mtp_tree_base``): a verify tree that is not
    a chain is a ShapeError naming it, with nothing enqueued; the chain then verifies."""
    with mtp_setup(2, 1, directory=HYBRID) as s:
        x, lens = emb([PROMPTS[0]])
        s.base_prefill(x, lens, slots=[0])
        ops = s.io.backend.op_count
        with pytest.raises(trtio.ShapeError, match="a hybrid base verifies a chain"):
            s.verify(E[[[5, 6, 7]]].astype(np.float16), [-1, 0, 0])
        assert s.io.backend.op_count == ops, "nothing was enqueued"
        s.verify(E[[[5, 6, 7]]].astype(np.float16), [-1, 0, 1])


def test_a_hybrid_accept_commits_the_accepted_tokens_states_in_one_device_operation() -> None:
    """After a verify of 3 chained tokens, accepting 2 of them leaves the slot's states as a prefill of the prompt
    and those 2 tokens leaves them; the commit (KV and states) costs a fixed number of device operations."""
    prompt = PROMPTS[1]

    def accept_ops(s: trtio.SpecDecodeSetup) -> int:
        x, lens = emb([prompt])
        s.base_prefill(x, lens, slots=[1])
        s.verify(E[[[7, 8, 9]]].astype(np.float16), [-1, 0, 1])
        ops = s.io.backend.op_count
        s.accept([[0, 1]])
        return int(s.io.backend.op_count - ops)

    with mtp_setup(1, 2) as dense:
        kv_ops = accept_ops(dense)
    with mtp_setup(1, 2, directory=HYBRID) as s, mtp_setup(1, 2, directory=HYBRID) as alone:
        commit_ops = accept_ops(s) - kv_ops
        x, lens = emb([prompt + [7, 8]])
        alone.base_prefill(x, lens, slots=[1])
        for name in ("conv_state_0", "recurrent_state_0"):
            got, want = s.base.state.tensors[name].to_numpy()[1], alone.base.state.tensors[name].to_numpy()[1]
            np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-3, rtol=2e-3,
                                       err_msg=name)
    # the host backend runs a fused copy's parts one by one: one strided copy per kind (conv, recurrent) for the
    # sequence; on the cuda backend they are one launch
    assert commit_ops == 2, f"the states' commit: {commit_ops} device operations"


def two_recurrent_layers(tmp: Path) -> Path:
    """``toy-qwen35-mtp-ragged`` with a base of two recurrent layers before its attention layer (its base config
    written anew beside the rest of the directory)."""
    directory = tmp / "toy-qwen35-mtp-ragged-2"
    shutil.copytree(HYBRID, directory)
    path = directory / "base_config.json"
    cfg = json.loads(path.read_text())
    attention = cfg["kv_layer_configs"][cfg["layer_types"].index("attention")]
    cfg.update(layer_types=["mamba", "mamba", "attention"], num_hidden_layers=3, num_linear_attn_layers=2,
               kv_layer_configs=[None, None, attention])
    path.write_text(json.dumps(cfg))
    return directory


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_a_hybrid_base_of_two_recurrent_layers_accepts_for_several_sequences_at_once(tmp_path: Path, device: str,
                                                                                     graphs: bool) -> None:
    """Three sequences in scattered slots, rounds of chains 3 deep on a base of two recurrent layers: every accept
    commits each sequence's states of both layers into its slot in one fused copy (the sequences' rows interleave
    in the layers' evenly spaced pools), and each sequence's tokens are the base's greedy tokens."""
    directory = two_recurrent_layers(tmp_path)
    assert EngineDir.open(directory).base_config.num_recurrent_layers == 2
    slots = (2, 0, 3)
    with mtp_setup(1, 3, device, graphs=graphs, directory=directory) as setup:
        run = Rounds(setup, 1, 3)
        for i, slot in enumerate(slots):
            run.admit(slot, PROMPTS[i])
        for _ in range(5):
            run.round()
        assert run.accepted > 0, "the rounds accepted drafted tokens"
    for i, slot in enumerate(slots):
        tokens = run.seqs[slot]["tokens"]
        assert tokens == greedy(directory, PROMPTS[i], len(tokens) - len(PROMPTS[i])), f"slot {slot}"


@pytest.mark.parametrize("name", ["toy-mtp-ragged", "toy-qwen35-mtp-ragged"])
def test_trtio_generate_speculative_on_the_mtp_toys_prints_the_bases_greedy_text(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``trtio generate --speculative`` on an MTP toy prints what the base alone prints, and says how many drafted
    tokens it accepted (at least 60% on these toys); a tree on the hybrid base is refused naming the flag."""
    pytest.importorskip("tokenizers")
    def run(*flags: str) -> tuple[int, str, str]:
        return generate(capsys, ENGINES / name, *flags)

    rc, alone, err = run()
    assert rc == 0, err
    rc, out, err = run("--speculative", "--draft-step", "3")
    assert rc == 0, err
    assert out == alone
    rate = accepted_percent(err)
    assert rate >= 60
    if name == "toy-qwen35-mtp-ragged":
        rc, out, err = run("--speculative", "--draft-top-k", "2", "--draft-step", "3")
        assert rc != 0 and "--draft-top-k: is 2, but a hybrid base verifies one chain per round" in err


def test_a_hybrid_spec_setup_refuses_prefixes_whose_states_would_hold_one_token_more() -> None:
    """A speculative prefix keeps one token fewer than the slot (the draft's last entry waits for the next token),
    but the slot's recurrent states are those after its last token: pin_prefix is refused, nothing pinned."""
    with mtp_setup(1, 3, directory=HYBRID) as s:
        run = Rounds(s, 1, 3)
        run.admit(0, PROMPTS[0])
        run.round()
        with pytest.raises(trtio.TrtioError, match="prefixes of a hybrid spec-decode setup are not supported"):
            s.pin_prefix(0, int(s.base_lengths[0]))
        rec = s._features.attribute("recurrent")
        assert rec is not None and rec.rows.free == DEFAULT_MAX_PREFIXES, "no snapshot row taken"


def _hybrid_rounds(seed: int, mode: str, feed_kind: str) -> np.ndarray:
    """Two chain rounds on the hybrid MTP pair, on :class:`~trtio.testing.AsyncHostBackend` (``seed``: its streams'
    interleaving), each call on the runner's stream (``mode``: one stream, two streams or two threads), fed
    ``feed_kind`` inputs; every step's logits."""
    from test_stream_order import _Feed, _keep, _Runner  # noqa: PLC0415

    be = AsyncHostBackend(seed)
    run, feed = _Runner(be, mode), _Feed(be, feed_kind)
    bundle = EngineDir.open(HYBRID).deployment(1, 2, 3)
    assert bundle.draft is not None
    bw = ToyWeights.generate(bundle.base, 0)
    base = ReferenceEngine.from_config(bundle.base, backend=be, weights=bw)
    dw = ToyWeights.generate_draft(bundle.draft, bw, 0)
    draft = ReferenceEngine.from_config(bundle.draft, backend=be, weights=dw)
    rng = np.random.default_rng(11)

    def e(shape: tuple[int, ...]) -> np.ndarray:
        return E[rng.integers(3, 512, shape)].astype(np.float16)

    try:
        with trtio.create_for_spec_decode(base, draft, bundle, backend=be) as s_:
            outs = [run(lambda s: _keep(s_.base_prefill(feed(e((2, 5)), s), [5, 4], s), s, be)),
                    run(lambda s: _keep(s_.draft_prefill(feed(e((2, 5)), s), [5, 4], s), s, be))]
            for paths in ([[0, 1], [0, 1, 2]], [[0, 1, 2], [0]]):
                outs.append(run(lambda s: _keep(s_.draft_propose(feed(e((2, 1)), s), s), s, be)))
                outs.append(run(lambda s: _keep(s_.verify(feed(e((2, 3)), s), [-1, 0, 1], s), s, be)))
                run(lambda s, p=paths: s_.accept(p, s))
                lens = [len(p) for p in paths]
                outs.append(run(lambda s, n=lens: _keep(s_.draft_accept(feed(e((2, 3)), s), n, s), s, be)))
            gc.collect()
            return np.concatenate([o.to_numpy().reshape(-1) for o in outs])
    finally:
        run.close()


@pytest.mark.parametrize("mode, feed_kind", [("streams", "long-lived"), ("threads", "long-lived"),
                                             ("streams", "tensor view")])
def test_hybrid_rounds_on_two_streams_give_the_one_stream_logits(mode: str, feed_kind: str) -> None:
    """The states' commit is ordered with the verify that wrote the rows and the steps after it (the stream rule),
    whatever the device's interleaving of the streams; inputs dropped as each call returns are read intact."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        want = _hybrid_rounds(0, "one", "long-lived")
        assert np.isfinite(want).all()
        for seed in (1, 2, 3):
            np.testing.assert_array_equal(_hybrid_rounds(seed, mode, feed_kind), want, err_msg=f"seed {seed}")


def test_the_demos_mtp_pairs_decode_greedy_tokens_and_accept_most_drafts() -> None:
    """``trtio demo``'s MTP section (:mod:`trtio._tools.mtp_demo`): both toy pairs, chains of 3, their tokens the
    numpy base's greedy ones, at least 60% of drafted tokens accepted; the summary's line says so."""
    from trtio._cuda.backend import get_backend  # noqa: PLC0415
    from trtio._tools.mtp_demo import format_mtp, run_mtp  # noqa: PLC0415

    s = run_mtp(ENGINES, PROMPTS[:3], 8, get_backend("host"))
    assert set(s) == {"toy-mtp-ragged", "toy-qwen35-mtp-ragged"}
    for name, section in s.items():
        assert section["ok"], name
        assert section["acceptance"] >= 0.6, (name, section["acceptance"])
        assert all(len(t) == 8 for t in section["tokens"])
    line = format_mtp(s)[0]
    assert "toy-qwen35-mtp-ragged (hybrid: gated_deltanet, attention)" in line and "equal to greedy yes" in line


def test_the_demo_names_a_bases_recurrent_layers_by_their_kind() -> None:
    """Edge-LLM's ``layer_types`` call every recurrent layer "mamba": the demo's lines name each by the config's
    recurrent kind (Qwen3.5's Gated-DeltaNet, Nemotron-H's Mamba2), in layer order, and a dense base "dense"."""
    from trtio._tools.mtp_demo import base_kind  # noqa: PLC0415

    qwen = EngineDir.open(ENGINES / "toy-qwen35-ragged").config
    nemotron = EngineDir.open(ENGINES / "toy-nemotron-h-ragged").config
    assert qwen.layer_types == ("mamba", "mamba", "attention", "mamba", "mamba", "attention")  # as Edge-LLM writes
    assert base_kind(qwen) == "hybrid: gated_deltanet, gated_deltanet, attention, gated_deltanet, gated_deltanet, " \
                              "attention"
    assert base_kind(nemotron) == "hybrid: mamba2, mamba2, attention, mamba2"
    assert base_kind(EngineDir.open(ENGINES / "toy-llm-ragged").config) == "dense"
