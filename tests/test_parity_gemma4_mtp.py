"""Real-graph parity of a Gemma 4 MTP pair (DESIGN §17): NVIDIA's exported Gemma 4 target and KV-less assistant
(``tests/fixtures/parity/gemma4-mtp``, ``scripts/parity_cases/gemma4_mtp.py``) bound by
:func:`trtio.create_for_spec_decode`, held to Hugging Face.

A round (``trtio.families.gemma4_mtp.assistant``): the assistant's step 0 (``draft_prefill`` after the prompt,
``draft_accept`` after an accept; seeded from the target's hidden row of the last committed token) then
``DEPTH - 1`` chain steps (``draft_propose``, fed the chosen token's target embedding and the last step's output
hidden state), every step's logits held to ``Gemma4AssistantForCausalLM`` on the same inputs (its chain tokens fed);
``verify`` of the pending token and a chain (or a tree of each level's top 2) through the target, every node on
Hugging Face's greedy continuation held to its logits; the longest greedy path accepted, its tokens held to Hugging
Face's. The verified chains take the true tokens up to a level (``KEEP``) and the draft's after, so that rounds
accept 1 to 4 tokens (a random assistant rarely guesses).

The assistant's graph masks the logits outside its centroids with -65504 (float16's lowest), Hugging Face with
its row minimum - 1: the masks must be equal, the other logits within the tolerance. Tolerance 0.1 (the Gemma 4
case's: Hugging Face's own float16 forward is 0.06-0.10 from its float32 logits on this architecture).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._gemma4_mtp_dir import built_config, mtp_directory, onnx_loader
from tests._parity import Case, Compare, ParityMismatch

pytest.importorskip("onnx")

import trtio  # noqa: E402
from trtio import names  # noqa: E402
from trtio._setups import engine_dir  # noqa: E402
from trtio.families.gemma4_mtp import assistant as assistant_module  # noqa: E402

CASE = Case("gemma4-mtp")
DEPTH = int(CASE.meta["spec"]["draft_step"])
TREE = 2 * DEPTH + 1  # a tree of each level's top 2: the builder's max_verify_tree_size
# Per sequence and round, how many of the verified chain's levels are the true greedy tokens (then the draft's).
KEEP = ((0, 3, 1, 2), (2, 0, 3, 1))
MASKED = -6.0e4  # below this, a graph logit is the centroid mask (float16's lowest)

Hook = Callable[[dict[str, np.ndarray]], None]


@contextlib.contextmanager
def pair(hooks: dict[str, Hook] | None = None, draft_changes: dict[str, Any] | None = None,
         verify_size: int = DEPTH + 1, backend: str = "host", graphs: bool = False, top_k: int = 1) -> Iterator[Any]:
    """The pair bound with :func:`trtio.create_for_spec_decode`, its bundle read from an engine directory holding
    the two configs (``draft_changes`` applied to the draft's) for rounds of ``top_k`` candidates a level."""
    base, draft = CASE.engine("base", backend), CASE.engine("draft", backend)
    base.input_hook = (hooks or {}).get("base")
    draft.input_hook = (hooks or {}).get("draft")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "base_config.json").write_text(json.dumps(built_config(base.config)))
        (root / "draft_config.json").write_text(json.dumps({**built_config(draft.config), **(draft_changes or {})}))
        bundle = trtio.EngineDir.open(root).deployment(top_k, DEPTH, verify_size)
    with trtio.create_for_spec_decode(base, draft, bundle, backend=backend, graphs=graphs) as setup:
        yield setup


class Tables:
    """The export's token tables: the target's embedding (the assistant's too) and per-layer embeddings."""

    def __init__(self) -> None:
        from safetensors.numpy import load_file

        self.embedding = CASE.table("base")
        (ple,) = load_file(CASE.root / "base" / "ple_embedding.safetensors").values()
        self.ple = ple.astype(np.float16)


def draft_values(cmp: Compare, want: np.ndarray, got: np.ndarray, what: str) -> None:
    """The assistant's logits: the same centroid mask, the rest within the tolerance."""
    masked, hf_masked = got < MASKED, want <= want.min() + 0.5
    if not np.array_equal(masked, hf_masked):
        raise ParityMismatch(f"{what}: the centroid masks differ in {int((masked != hf_masked).sum())} columns")
    cmp.values(want[~masked], got[~masked], what)


class Run:
    """One scenario's state: the sequences (in slot order), what each has committed, the comparisons."""

    def __init__(self, setup: Any, tree: bool = False) -> None:
        self.setup, self.tree, self.t = setup, tree, Tables()
        self.seqs = list(CASE.seqs)
        self.committed = [s.prompt_length for s in self.seqs]
        self.rounds = [0] * len(self.seqs)
        self.base, self.draft = Compare(), Compare()
        self.accepted: list[int] = []
        self.last: list[np.ndarray] = []  # each sequence's last draft step logits

    def chain(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        s, c = self.seqs[i], self.committed[i]
        return (CASE.arrays[f"draft_logits_{s.index}"][c - s.prompt_length],
                CASE.arrays[f"draft_tokens_{s.index}"][c - s.prompt_length])

    def prefill(self, which: list[int] | None = None) -> None:
        """The base prefill (compared), then the assistant's step 0 of the prompts' pending tokens."""
        which = list(range(len(self.seqs))) if which is None else which
        seqs = [self.seqs[i] for i in which]
        w = max(s.prompt_length for s in seqs)
        ids = np.zeros((len(seqs), w), np.int64)
        for j, s in enumerate(seqs):
            ids[j, :s.prompt_length] = s.prompt
        lens = np.array([s.prompt_length for s in seqs], np.int32)
        slots = None if len(which) == len(self.seqs) else which
        logits = self.setup.base_prefill(self.t.embedding[ids], lens, slots=slots,
                                         ple_embeds=self.t.ple[ids]).to_numpy()
        for j, s in enumerate(seqs):
            self.base.row(s, s.prompt_length - 1, logits[j], "base prefill")
            self.base.token(s, s.prompt_length - 1, int(logits[j].argmax()), "base prefill")
        roots = np.array([s.tokens[s.prompt_length] for s in seqs])
        step0 = self.setup.draft_prefill(self.t.embedding[roots][:, None], lens, slots=slots).to_numpy()
        for j, i in enumerate(which):
            self.committed[i], self.rounds[i] = self.seqs[i].prompt_length, 0
            draft_values(self.draft, self.chain(i)[0][0], step0[j], f"sequence {i} draft step 0 (prefill)")

    def propose(self) -> list[np.ndarray]:
        """Steps 1 .. DEPTH - 1 of the chain, each fed Hugging Face's chain token; every step's logits compared.
        Returns each sequence's logits of every step ([DEPTH, V])."""
        b = len(self.seqs)
        steps = [[self.chain(i)[0][0]] for i in range(b)]
        for k in range(1, DEPTH):
            tokens = np.array([self.chain(i)[1][k - 1] for i in range(b)])
            got = self.setup.draft_propose(self.t.embedding[tokens][:, None]).to_numpy()
            for i in range(b):
                draft_values(self.draft, self.chain(i)[0][k], got[i], f"sequence {i} round {self.rounds[i]} draft "
                                                                      f"step {k} (committed {self.committed[i]})")
                steps[i].append(self.chain(i)[0][k])
        return [np.array(x) for x in steps]

    def verify_tree(self, i: int, steps: np.ndarray) -> tuple[list[int], list[int]]:
        """Sequence ``i``'s verify tree: the pending token, then per level either the chain (``KEEP`` true tokens,
        then Hugging Face's chain tokens) or, in a tree round, the level's top 2 of the draft step's logits with the
        true token in the second place where the parent is on the true path (so that the accepted node is not the
        chain's)."""
        s, c = self.seqs[i], self.committed[i]
        keep = KEEP[s.index][self.rounds[i] % len(KEEP[s.index])]
        chain_tokens = self.chain(i)[1]
        truth = [int(x) for x in s.tokens[c + 1:c + 1 + DEPTH]]
        tokens, parents = [int(s.tokens[c])], [-1]
        if not self.tree:
            for level in range(DEPTH):
                tokens.append(truth[level] if level < keep else int(chain_tokens[level]))
                parents.append(level)
            return tokens, parents
        parent = 0
        for level in range(DEPTH):
            top = [int(t) for t in np.argsort(-steps[level], kind="stable")[:3]]
            want = truth[level] if level < keep else top[0]
            other = next(t for t in top if t != want)
            tokens += [other, want]
            parents += [parent, parent]
            parent = len(tokens) - 1
        return tokens, parents

    def round(self) -> None:
        """One round (module docstring), the catch-up (the assistant's step 0 after the accept) compared."""
        setup, b = self.setup, len(self.seqs)
        steps = self.propose()
        trees = [self.verify_tree(i, steps[i]) for i in range(b)]
        tokens = np.array([t for t, _ in trees])
        n = tokens.shape[1]
        logits = setup.verify(self.t.embedding[tokens], [p for _, p in trees],
                              ple_embeds=self.t.ple[tokens]).to_numpy().reshape(b, n, -1)
        paths = []
        for i, (toks, par) in enumerate(trees):
            s, c = self.seqs[i], self.committed[i]
            greedy = logits[i].argmax(axis=1)
            path = [0]
            while True:  # the child of the path's last node that is its greedy token
                kids = [k for k in range(n) if par[k] == path[-1] and toks[k] == int(greedy[path[-1]])]
                if not kids:
                    break
                path.append(kids[0])
            for d, node in enumerate(path):
                self.base.row(s, c + d, logits[i, node], f"round {self.rounds[i]} verify node {node}")
                self.base.token(s, c + d, int(greedy[node]), f"round {self.rounds[i]} verify node {node}")
            paths.append(path)
        setup.accept(paths)
        lens = [len(p) for p in paths]
        self.accepted += lens
        self.committed = [c + m for c, m in zip(self.committed, lens)]
        self.rounds = [r + 1 for r in self.rounds]
        roots = np.array([s.tokens[c] for s, c in zip(self.seqs, self.committed)])
        step0 = setup.draft_accept(self.t.embedding[roots][:, None], lens).to_numpy()
        for i in range(b):
            draft_values(self.draft, self.chain(i)[0][0], step0[i], f"sequence {i} round {self.rounds[i]} draft "
                                                                    f"step 0 (committed {self.committed[i]})")

    def room(self) -> bool:
        """Whether every sequence's next round stays inside its references."""
        return all(c + 2 * DEPTH + 1 < len(s.tokens) for s, c in zip(self.seqs, self.committed))


def chain_rounds(setup: Any) -> Run:
    run = Run(setup)
    run.prefill()
    while run.room():
        run.round()
    return run


def tree_rounds(setup: Any) -> Run:
    run = Run(setup, tree=True)
    run.prefill()
    while run.room():
        run.round()
    return run


def admission(setup: Any) -> Run:
    """A round, then the second sequence ends and its prompt is admitted again into its slot (the first goes on
    from where it is: its feedback row kept while the admitted prompt's step writes the step rows)."""
    run = Run(setup)
    run.prefill()
    run.round()
    setup.release([1])
    run.prefill([1])
    while run.room():
        run.round()
    return run


SCENARIOS = {"chain": chain_rounds, "tree": tree_rounds, "admission": admission}


def run(scenario: str, **kwargs: Any) -> Run:
    """``scenario`` on the pair (``kwargs``: :func:`pair`'s)."""
    tree = scenario == "tree"  # a bundle of top-K 2 (draft_rows: the assistant's steps take one row whatever K)
    with pair(verify_size=TREE if tree else DEPTH + 1, top_k=2 if tree else 1, **kwargs) as setup:
        return SCENARIOS[scenario](setup)


# -- the bindings -----------------------------------------------------------------------------------------------------


def test_trtio_binds_every_binding_of_both_exported_graphs() -> None:
    """Base and assistant: every input and output of the real graph bound, with the graph's dtype, rank and fixed
    dims in trtio's registry; the assistant's pools are the target's (layers 3 and 2, zero-copy) read through the
    target's page-table rows, and it has no present outputs; the target has no SWA page table in spec mode."""
    with pair() as setup:
        for e in setup.engines():
            specs = {s.name: s for s in (*e.registry, *e.state.specs())}
            for t in e.io.tensors:
                assert t.name in e.tensor_map, f"{e.role}: {t.name} unbound"
                spec = specs.get(t.name)
                if spec is None:  # the assistant's pools: the target's tensors, bound as they are
                    assert e.role == "draft" and t.name.startswith("past_key_values_"), (e.role, t.name)
                    continue
                assert (spec.io, spec.dtype, len(spec.shape)) == (t.mode, t.dtype, len(t.shape)), (e.role, t.name)
                fixed = [(d, g) for d, g in zip(spec.shape, t.shape) if isinstance(d, int) and g >= 0]
                assert all(d == g for d, g in fixed), (e.role, t.name, spec.shape, t.shape)
            assert {s.name for s in e.registry if not s.optional} <= {t.name for t in e.io.tensors}, e.role
        draft = setup.draft
        graph = {t.name for t in draft.io.tensors}
        assert not any(n.startswith("present_") for n in graph)
        assert {"logits_indices", "hidden_states_from_draft", names.kSwaKVPageTable} & graph == set()
        pools = setup.base.state.tensors
        assert draft.tensor_map["past_key_values_0"] is pools["past_key_values_3"]
        assert draft.tensor_map["past_key_values_1"] is pools["past_key_values_2"]
        assert draft.state.specs() and draft.state.pool_pages == 0  # the assistant owns no page
        assert names.kSwaKVPageTable not in {t.name for t in setup.base.io.tensors}


def test_a_strict_double_of_the_graphs_io_binds_and_steps() -> None:
    """trtio's declaration of both engines (``ReferenceEngine.from_config``, null compute: the strict TensorRT double
    CI binds) is the real graphs' I/O, name for name, with their dtypes, shapes and the builder's profiles; bound as a
    pair it steps a round (step 0, a chain step, a verify, an accept, the next step 0)."""
    from trtio.testing import ReferenceEngine

    real = {"base": CASE.engine("base"), "draft": CASE.engine("draft")}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for role, engine in real.items():
            (root / f"{role}_config.json").write_text(json.dumps(built_config(engine.config)))
        directory = trtio.EngineDir.open(root)
        bundle = directory.deployment(1, DEPTH, DEPTH + 1)
    doubles = {}
    for role, cfg in (("base", directory.base_config), ("draft", directory.draft_config)):
        double = ReferenceEngine.from_config(cfg, device="host", null_compute=True)
        want = {t.name: (t.mode, t.dtype, t.shape) for t in trtio._engine.EngineIO.from_engine(real[role]).tensors}
        got = {t.name: (t.mode, t.dtype, t.shape) for t in trtio._engine.EngineIO.from_engine(double).tensors}
        assert got == want, role
        profiles = {t.name: t.profiles for t in trtio._engine.EngineIO.from_engine(real[role]).tensors if t.profiles}
        mine = {t.name: t.profiles for t in trtio._engine.EngineIO.from_engine(double).tensors if t.profiles}
        assert {n: mine[n] for n in profiles} == profiles, role
        doubles[role] = double
    with trtio.create_for_spec_decode(doubles["base"], doubles["draft"], bundle, backend="host") as setup:
        t = Tables()
        ids = np.ones((2, 5), np.int64)
        lens = np.array([5, 3], np.int32)
        setup.base_prefill(t.embedding[ids], lens, ple_embeds=t.ple[ids])
        assert setup.draft_prefill(t.embedding[ids[:, :1]], lens).shape == (2, 512)
        assert setup.draft_propose(t.embedding[ids[:, :1]]).shape == (2, 512)
        chain = np.ones((2, 3), np.int64)
        setup.verify(t.embedding[chain], [[-1, 0, 1]] * 2, ple_embeds=t.ple[chain])
        setup.accept([[0, 1], [0]])
        assert setup.draft_accept(t.embedding[ids[:, :1]], [2, 1]).shape == (2, 512)
        assert setup.base_lengths.tolist() == [7, 4] == setup.draft_lengths.tolist()


def test_a_pair_whose_map_names_a_layer_of_another_geometry_is_refused(tmp_path: Path) -> None:
    """``kv_sharing_map`` naming a full layer (head dim 64) for the sliding assistant layer (32), or a KV-sharing
    consumer of the target, is refused when the directory is read, naming the entry."""
    base, draft = CASE.engine("base"), CASE.engine("draft")
    for target, why in ((2, "cannot read the pool"), (4, "reads layer 3's pool")):
        entries = [dict(e) for e in draft.config["kv_sharing_map"]]
        entries[0]["target_attention_layer"] = entries[0]["target_layer"] = target
        root = tmp_path / str(target)
        root.mkdir()
        (root / "base_config.json").write_text(json.dumps(built_config(base.config)))
        (root / "draft_config.json").write_text(json.dumps({**built_config(draft.config), "kv_sharing_map": entries}))
        with pytest.raises(trtio.ConfigError, match=rf"kv_sharing_map\[0\].*{why}"):
            trtio.EngineDir.open(root)


def test_an_assistant_of_another_full_rope_is_refused(tmp_path: Path) -> None:
    """Both engines' full layers read one RoPE table: an assistant whose ``full_rope_config`` differs is refused."""
    base, draft = CASE.engine("base"), CASE.engine("draft")
    rope = json.loads(json.dumps(draft.config["full_rope_config"]))
    rope["rope_theta"] = rope["rope_scaling"]["rope_theta"] = 10000.0
    (tmp_path / "base_config.json").write_text(json.dumps(built_config(base.config)))
    (tmp_path / "draft_config.json").write_text(json.dumps({**built_config(draft.config), "full_rope_config": rope}))
    with pytest.raises(trtio.ConfigError, match="full_rope_config"):
        trtio.EngineDir.open(tmp_path)


@pytest.mark.parametrize("key, value", [("has_own_kv_cache", True), ("constant_draft_positions", False),
                                        ("returns_feedback_hidden", False), ("sparse_logits_enabled", True)])
def test_an_assistant_protocol_trtio_does_not_run_is_refused_naming_the_key(key: str, value: bool) -> None:
    draft = CASE.engine("draft")
    with pytest.raises(trtio.ConfigError, match=key):
        trtio.LLMEngineConfig.from_edgellm({**built_config(draft.config), key: value})


def test_a_deployment_of_top_k_above_one_sizes_the_assistants_steps_by_its_family(tmp_path: Path) -> None:
    """``draft_top_k x draft_step`` (2 x 3 = 6) past the assistant's ``max_draft_tree_size`` (4) is a deployment:
    its steps take one row whatever K (``Gemma4MtpConfig.draft_rows``); the verify tree is bounded by the target's
    ``max_verify_tree_size`` (7) alone. The JSON round trip of the bundle holds it too."""
    base, draft = CASE.engine("base"), CASE.engine("draft")
    (tmp_path / "base_config.json").write_text(json.dumps(built_config(base.config)))
    (tmp_path / "draft_config.json").write_text(json.dumps(built_config(draft.config)))
    directory = trtio.EngineDir.open(tmp_path)
    assert directory.draft_config.max_draft_tree_size == 4 and directory.draft_config.draft_rows(2, 3) == 1
    bundle = directory.deployment(2, DEPTH, TREE)
    assert (bundle.spec.drafting_top_k, bundle.spec.drafting_step, bundle.spec.verify_size) == (2, DEPTH, TREE)
    assert trtio.DeploymentConfig.from_dict(bundle.to_dict()) == bundle
    with pytest.raises(trtio.ConfigError, match=r"verify_size: 8 exceeds builder_config.max_verify_tree_size \(7\)"):
        directory.deployment(2, DEPTH, TREE + 1)


@pytest.mark.parametrize("top_k", [1, 2])
def test_create_from_engine_dir_opens_the_pair_and_its_rounds_equal_hugging_face(
        top_k: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The export laid out as an engine directory (``spec_base.engine`` / ``spec_draft.engine`` and their configs),
    opened by :func:`trtio.create_from_engine_dir` with the real graphs as its engines: a SpecDecodeSetup whose
    rounds (chains, or top-2 trees) accept Hugging Face's greedy tokens, the logits within the tolerance."""
    root = mtp_directory(tmp_path / "pair", CASE)
    loaded: list[str] = []
    monkeypatch.setattr(engine_dir, "load_engine", onnx_loader(root, CASE, loaded))
    size = TREE if top_k > 1 else DEPTH + 1
    with trtio.create_from_engine_dir(root, draft_top_k=top_k, draft_step=DEPTH, verify_size=size,
                                      backend="host") as setup:
        assert isinstance(setup, trtio.SpecDecodeSetup) and loaded == ["base", "draft"]
        assert (setup.bundle.spec.drafting_top_k, setup.bundle.spec.verify_size) == (top_k, size)
        done = Run(setup, tree=top_k > 1)
        done.prefill()
        while done.room():
            done.round()
    assert done.base.worst <= 0.1 and done.draft.worst <= 0.1 and done.base.rows >= 8
    assert sum(done.accepted) >= 8 and max(done.accepted) == DEPTH + 1, done.accepted


def test_a_tree_drafted_in_one_step_is_refused() -> None:
    with pair() as setup:
        run_ = Run(setup)
        run_.prefill()
        x = run_.t.embedding[np.zeros((2, 1), np.int64)]
        with pytest.raises(trtio.errors.ShapeError, match="parents"):
            setup.draft_propose(x, parents=[-1])
        for _ in range(DEPTH - 1):
            setup.draft_propose(x)
        with pytest.raises(trtio.TrtioError, match="drafting_step"):
            setup.draft_propose(x)


def test_a_prefix_on_the_pair_is_refused_naming_why() -> None:
    """``pin_prefix`` on a Gemma 4 MTP pair: refused naming the pair and why (its assistant owns no KV pages, a prefix
    pins each engine's own), before any bookkeeping: the pair's lengths unchanged, its next round runs."""
    with pair() as setup:
        run_ = Run(setup)
        run_.prefill()
        before = setup.base_lengths.tolist()
        with pytest.raises(trtio.errors.InvalidValueError,
                           match=r"pin_prefix\(\): a Gemma 4 MTP pair keeps no prefix: its assistant owns no KV pages"):
            setup.pin_prefix(0, 5)
        assert setup.base_lengths.tolist() == before == setup.draft_lengths.tolist()
        run_.round()
        assert run_.draft.worst <= 0.1 and run_.base.worst <= 0.1


# -- parity -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario, graphs", [(s, False) for s in SCENARIOS] + [("chain", True)])
def test_gemma4_mtp_rounds_equal_hugging_face(scenario: str, graphs: bool) -> None:
    """Accepted tokens equal Hugging Face's greedy tokens; the target's verify logits equal its logits; every
    assistant step equals ``Gemma4AssistantForCausalLM`` on the same inputs (also replayed from graphs)."""
    done = run(scenario, graphs=graphs)
    assert done.base.worst <= 0.1 and done.draft.worst <= 0.1
    assert done.draft.rows >= 12 and done.base.rows >= 8
    assert max(done.accepted) == DEPTH + 1 and min(done.accepted) == 1, done.accepted


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_gemma4_mtp_rounds_equal_hugging_face_on_the_cuda_backend(scenario: str, graphs: bool) -> None:
    """The same on device memory, also replayed from CUDA graphs."""
    done = run(scenario, backend="cuda", graphs=graphs)
    assert done.base.worst <= 0.1 and done.draft.worst <= 0.1 and done.draft.rows >= 12


def _shifted_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each assistant step at ``committed_len`` (Hugging Face's candidate generator) instead of Edge-LLM's
    ``committed_len - 1``."""
    real = assistant_module.StepLayout

    def layout(**kw: Any) -> Any:
        return real(**{**kw, "positions": kw["positions"] + 1})
    monkeypatch.setattr(assistant_module, "StepLayout", layout)


def _wrong_seed_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 0 seeded from the row before the last committed token's."""
    real = assistant_module.AssistantDraft._run

    def run_(self: Any, r: Any, x: Any, committed: Any, slots: Any, key: Any, source: Any, src: Any, s: Any) -> Any:
        if src is r.io.base_hidden_states:
            source = np.maximum(source - 1, 0)
        return real(self, r, x, committed, slots, key, source, src, s)
    monkeypatch.setattr(assistant_module.AssistantDraft, "_run", run_)


def _chain_seed_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """After an accept, the seed from the verify row of the path's depth (the node a chain would have there), not
    from the accepted node's: the same on a chain, another node's row on a tree."""
    monkeypatch.setattr(assistant_module, "seed_rows", lambda rows, acc: rows[:, 0] + acc - 1)


def _no_feedback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain step fed the step's hidden-state input again instead of the last step's output."""
    real = assistant_module.AssistantDraft._run

    def run_(self: Any, r: Any, x: Any, committed: Any, slots: Any, key: Any, source: Any, src: Any, s: Any) -> Any:
        if src is r.io.draft_hidden_states_out:
            src, source = r.io.draft_hidden_states_in, np.arange(len(source))
        return real(self, r, x, committed, slots, key, source, src, s)
    monkeypatch.setattr(assistant_module.AssistantDraft, "_run", run_)


def _no_park(monkeypatch: pytest.MonkeyPatch) -> None:
    """An admitted prompt's step 0 writes over the other sequence's feedback row, which is not kept first."""
    monkeypatch.setattr(assistant_module.AssistantDraft, "_park", lambda self, r, admitted, s: None)


def _one_key_more(monkeypatch: pytest.MonkeyPatch) -> dict[str, Hook]:
    """The assistant's ``attention_sequence_lengths`` one past ``committed_len`` (a decode's: the query's own key
    after the committed ones), as an EAGLE-style draft step would stage it."""
    def hook(inputs: dict[str, np.ndarray]) -> None:
        inputs["attention_sequence_lengths"][:] += 1
    return {"draft": hook}


PLANTED: dict[str, tuple[str, Callable[[pytest.MonkeyPatch], dict[str, Hook] | None]]] = {
    "draft position committed_len": ("chain", _shifted_positions),
    "seed from the row before": ("chain", _wrong_seed_row),
    "seed from the chain's row of a tree": ("tree", _chain_seed_row),
    "feedback not fed": ("chain", _no_feedback),
    "feedback row lost at an admission": ("admission", _no_park),
    "one key more": ("chain", _one_key_more),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_planted_assistant_bugs_fail(bug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario, plant = PLANTED[bug]
    hooks = plant(monkeypatch)
    with pytest.raises(ParityMismatch):
        run(scenario, hooks=hooks)


def test_an_assistant_bound_to_the_wrong_donor_layer_fails() -> None:
    """Assistant layer 0 (sliding) reading target layer 1's pool (the same geometry) instead of layer 3's."""
    entries = [dict(e) for e in CASE.engine("draft").config["kv_sharing_map"]]
    entries[0]["target_attention_layer"] = entries[0]["target_layer"] = 1
    with pytest.raises(ParityMismatch):
        run("chain", draft_changes={"kv_sharing_map": entries})
