"""MTP pairs (a base whose ``hidden_states`` is its last layer's stream ``[T, H]``; a one-layer draft with its own KV)
run through the EAGLE3 phases: speculative tokens equal the base's greedy tokens, chain and tree, over a changing
batch (admissions, releases, a reused slot), with CUDA graphs on and off.

The toy pair is ``toy-mtp-ragged``: a one-layer base and a draft whose layer is the base's (``ToyWeights.
generate_draft``), so its guesses are the base's next tokens but where the first token tips the choice.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

import trtio
from trtio.edgellm import EngineDir
from trtio.rope import rope_cos_sin_table
from trtio.testing import ReferenceEngine, ToyWeights, reference_forward, toy_embedding
from trtio.testing.toy_engines import default_engines_dir

ENGINES = default_engines_dir()
MTP = ENGINES / "toy-mtp-ragged"
E = toy_embedding(512, 64)


@pytest.fixture(params=["host", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> str:
    if request.param == "gpu":
        pytest.importorskip("cupy")
    return str(request.param)


def mtp_setup(k: int, depth: int, device: str = "host", *, graphs: bool = False) -> trtio.SpecDecodeSetup:
    bundle = EngineDir.open(MTP).deployment(k, depth, 1 + k * depth)
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


def greedy(prompt: list[int], count: int, device: str = "host") -> list[int]:
    """The base's own greedy tokens after ``prompt`` (``count`` of them), one verify node at a time."""
    with mtp_setup(1, 1, device) as s:
        x, lens = emb([prompt])
        out = [int(s.base_prefill(x, lens, slots=[0]).to_numpy()[0].argmax())]
        while len(out) < count:
            out.append(int(s.verify(E[[[out[-1]]]].astype(np.float16), [-1]).to_numpy()[0].argmax()))
            s.accept([[0]])
        return prompt + out


PROMPTS = [[int(t) for t in np.random.default_rng(r).integers(3, 512, n)] for r, n in enumerate((14, 5, 21, 9, 11))]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("k, depth", [(1, 3), (2, 3)], ids=["chain", "tree"])
def test_mtp_tokens_equal_the_bases_greedy_tokens_over_a_changing_batch(device: str, k: int, depth: int,
                                                                         graphs: bool) -> None:
    """Requests admitted between rounds into chosen slots, one released and its slot reused by a new request: each
    request's tokens are the base's greedy tokens after its prompt; no KV page is held after the last release."""
    plan = {0: [("admit", 0, 2)], 1: [("admit", 1, 0)], 2: [("admit", 2, 3)],
            4: [("release", 3, None), ("admit", 3, 3)], 5: [("admit", 4, 1)]}
    requests: dict[int, dict[str, Any]] = {}
    with mtp_setup(k, depth, device, graphs=graphs) as setup:
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
        assert q["tokens"] == greedy(PROMPTS[req], n, device), f"request {req}: the base's greedy tokens"


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
