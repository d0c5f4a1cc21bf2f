"""create_for_llm / create_for_spec_decode on Edge-LLM 0.11's token-major ("ragged") contract, end to end.

The engines are ReferenceEngines of the ragged toy engines in ``engines/`` (Edge-LLM's directory layout,
real-format configs read with ``EngineDir``); the ground truth is ``toy_model.reference_forward``, which
recomputes every sequence from scratch. Tests taking ``device`` also run with GPU ReferenceEngines (CuPy,
cuda backend) where a GPU answers.

Tolerances: engine and reference compute in float32 from the same fp16 inputs in a different order (cached,
rounded K/V; padded rows), so logits differ by float32 reassociation plus, rarely, a K/V element rounded to
the neighbouring fp16 value: 2e-3 (fp8 caches: 5e-2, one e4m3 step is 1/8 relative) covers that while a
wrong binding moves logits by O(0.1) or more.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import trtio
from trtio import BindingError, ConfigError, ShapeError, TrtioError, names
from trtio._contracts.ragged import causal_step, tree_step
from trtio._cuda.backend import Backend
from trtio._rope import rope_cos_sin_table
from trtio._trees import ancestor_mask
from trtio.edgellm import EngineDir
from trtio.testing import ReferenceEngine, ToyWeights, reference_forward, toy_embedding
from trtio.testing.toy_engines import default_engines_dir
from trtio.testing.toy_runtime import embed_batch, greedy_generate, spec_generate

ENGINES = default_engines_dir()
LLM_DIR = ENGINES / "toy-llm-ragged"
EAGLE_DIR = ENGINES / "toy-eagle3-ragged"
E = toy_embedding(512, 64)


def llm_cfg(**over: object) -> trtio.LLMEngineConfig:
    cfg = EngineDir.open(LLM_DIR).config
    return dataclasses.replace(cfg, **over).validate() if over else cfg


def pair(top_k: int = 2, step: int = 3, verify: int = 8) -> trtio.DeploymentConfig:
    return EngineDir.open(EAGLE_DIR).deployment(top_k, step, verify)


def _prompts(lengths: tuple[int, ...], seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, 512, n)] for n in lengths]


def _tol(cfg: trtio.LLMEngineConfig) -> float:
    return 5e-2 if cfg.kv_cache_dtype == "fp8" else 2e-3


def run_llm(cfg: trtio.LLMEngineConfig, device: str, prompts: list[list[int]], steps: int, *, graphs: bool = False,
            weights: ToyWeights | None = None) -> tuple[list[np.ndarray], list[list[int]], ReferenceEngine]:
    """Prefill + greedy decode; returns the logits of every step, the token rows, and the engine."""
    eng = ReferenceEngine.from_config(cfg, device=device, weights=weights)
    act = cfg.activation.numpy
    with trtio.create_for_llm(eng, cfg, graphs=graphs) as setup:
        emb, lens = embed_batch(E, prompts, act)
        out = [setup.prefill(emb, lens).to_numpy()]
        toks = [list(p) for p in prompts]
        for _ in range(steps):
            nxt = out[-1].argmax(-1)
            for b, t in enumerate(nxt):
                toks[b].append(int(t))
            out.append(setup.decode(E[nxt][:, None, :].astype(act)).to_numpy())
    return out, toks, eng


# -- greedy against the numpy model ------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["plain", "fp8_kv", "deepstack_cfg", "mrope", "llama3_rope", "partial_rotary"])
def test_greedy_logits_equal_the_numpy_model(device: str, variant: str) -> None:
    over: dict[str, object] = {
        "plain": {}, "fp8_kv": {"kv_cache_dtype": "fp8"}, "deepstack_cfg": {"num_deepstack_features": 2},
        "mrope": {"rope_type": "mrope"},
        "llama3_rope": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
        "partial_rotary": {"rotary_dim": 8},
    }[variant]
    cfg = llm_cfg(**over)
    prompts = _prompts((1, 64, 9, 30))  # one token, max_input_len and others in one batch
    out, toks, eng = run_llm(cfg, device, prompts, 4)
    table = rope_cos_sin_table(cfg.max_kv_cache_capacity, cfg.rotary_dim, cfg.rope_theta, scaling=cfg.rope_scaling,
                               max_position_embeddings=cfg.max_position_embeddings or None)
    for b, p in enumerate(prompts):
        n = len(p)
        ds = [np.zeros((len(toks[b]), 64), np.float32)] * cfg.num_deepstack_features or None
        _, ref = reference_forward(eng.weights, cfg, E[toks[b]].astype(np.float16), rope=table, deepstack=ds)
        for step, logits in enumerate(out):
            np.testing.assert_allclose(logits[b], ref[n - 1 + step], atol=_tol(cfg), rtol=_tol(cfg))


def test_graph_replay_is_bit_identical_to_plain_execution(device: str) -> None:
    prompts = _prompts((5, 11, 3, 8))
    plain, toks_plain, _ = run_llm(llm_cfg(), device, prompts, 6, graphs=False)
    graphed, toks_graphed, _ = run_llm(llm_cfg(), device, prompts, 6, graphs=True)
    assert toks_plain == toks_graphed
    for a, b in zip(plain, graphed):
        np.testing.assert_array_equal(a, b)


def test_steady_decode_makes_no_trt_call_allocation_or_sync(device: str) -> None:
    cfg = llm_cfg()
    for graphs in (False, True):
        eng = ReferenceEngine.from_config(cfg, device=device)
        with trtio.create_for_llm(eng, cfg, graphs=graphs) as setup:
            be = setup.io.backend
            emb, lens = embed_batch(E, _prompts((4, 7)), np.float16)
            logits = setup.prefill(emb, lens)
            for _ in range(2):  # warm up the decode shape (and capture its graph)
                logits = setup.decode(E[logits.to_numpy().argmax(-1)][:, None, :].astype(np.float16))
            # A GPU runtime looks its embeddings up on the device: the step stages only its small inputs
            # (through StepStaging's ring), so it never waits for the device, however far ahead the host runs.
            nxt = trtio.Tensor.from_numpy(E[logits.to_numpy().argmax(-1)][:, None, :].astype(np.float16),
                                          trtio.Location.DEVICE, backend=be)
            calls = dict(setup.executor.context.calls)
            for _ in range(5):
                allocs, syncs = be.alloc_count, be.sync_count
                setup.decode(nxt)
                assert (be.alloc_count, be.sync_count) == (allocs, syncs), "a decode step allocated or synced"
            nxt.close()
            set_calls = {k: v - calls.get(k, 0) for k, v in setup.executor.context.calls.items() if k.startswith("set")}
            assert not any(set_calls.values()), set_calls
            if graphs:
                assert setup.graph_stats.hits >= 5


def test_a_prefill_after_a_restored_prefix_equals_one_prefill() -> None:
    """Phase 2: the second chunk of a prompt continues the cache the first chunk filled."""
    cfg = llm_cfg()
    eng = ReferenceEngine.from_config(cfg, device="host")
    prompts = _prompts((20, 13))
    with trtio.create_for_llm(eng, cfg) as setup:
        emb, lens = embed_batch(E, prompts, np.float16)
        whole = setup.prefill(emb, lens).to_numpy()
        first = [p[:8] for p in prompts]
        rest = [p[8:] for p in prompts]
        emb1, lens1 = embed_batch(E, first, np.float16)
        setup.prefill(emb1, lens1)
        emb2, lens2 = embed_batch(E, rest, np.float16)
        chunked = setup.prefill(emb2, lens2, past_lengths=setup.lengths).to_numpy()
        assert setup.lengths.tolist() == [20, 13]
        assert int(np.asarray(setup.io.execution_phase_marker.shape)[0]) == 2, "phase 2: a restored prefix"
    np.testing.assert_allclose(chunked, whole, atol=1e-4, rtol=1e-4)
    assert (chunked.argmax(-1) == whole.argmax(-1)).all()


# -- the step layout, as Edge-LLM's runtime writes it ---------------------------------------------------


def test_prefill_and_decode_layouts_are_entry_padded() -> None:
    pre = causal_step(np.array([0, 0, 0]), np.array([3, 1, 4]), 4, phase=1)
    assert pre.query_start_offsets.tolist() == [0, 4, 8, 12]
    assert pre.positions.tolist() == [0, 1, 2, -1, 0, -1, -1, -1, 0, 1, 2, 3]
    assert pre.logits_indices.tolist() == [2, 4, 11]
    assert pre.attention_sequence_lengths.tolist() == [3, 1, 4]
    dec = causal_step(np.array([7, 5]), np.array([1, 1]), 1, phase=3)
    assert dec.query_start_offsets.tolist() == [0, 1, 2] and dec.positions.tolist() == [7, 5]
    assert dec.attention_sequence_lengths.tolist() == [8, 6] and dec.logits_indices.tolist() == [0, 1]


def test_tree_layout_lengths_positions_and_mask() -> None:
    vis = np.stack([ancestor_mask(np.array([-1, 0, 0, 1])),
                    np.pad(ancestor_mask(np.array([-1, 0])), ((0, 2), (0, 2)))])
    t = tree_step(np.array([5, 7]), vis, 4, phase=5, logits_rows=np.arange(8), parents=np.array([[-1, 0, 0, 1],
                                                                                                 [-1, 0, -1, -1]]))
    assert t.query_lengths.tolist() == [4, 2]
    assert t.attention_sequence_lengths.tolist() == [9, 11], "phases 4-5: past + W"
    assert t.positions.tolist() == [5, 6, 6, 7, 7, 8, -1, -1]
    assert t.packed_mask.reshape(-1).tolist() == [0b1, 0b11, 0b101, 0b1011, 0b1, 0b11, 0, 0]
    assert t.tree_depths.tolist() == [0, 1, 1, 2, 0, 1, 0, 0]


def test_a_decode_step_uploads_its_inputs_with_one_copy(host: Backend) -> None:
    cfg = llm_cfg()
    with trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg) as setup:
        emb, lens = embed_batch(E, _prompts((3, 6)), np.float16)
        setup.prefill(emb, lens)
        setup.decode(E[[1, 2]][:, None, :].astype(np.float16))
        io = setup.io
        assert io.query_start_offsets.to_numpy().tolist() == [0, 1, 2]
        assert io.positions.to_numpy().tolist() == [3, 6]
        assert io.past_lengths.to_numpy().tolist() == [3, 6]
        assert io.attention_sequence_lengths.to_numpy().tolist() == [4, 7]
        assert io.logits_indices.to_numpy().tolist() == [0, 1]
        table = rope_cos_sin_table(cfg.max_kv_cache_capacity, cfg.rotary_dim, cfg.rope_theta)[0]
        np.testing.assert_array_equal(io.ragged_rope_cos_sin.to_numpy(), table[[3, 6]])


# -- speculative decoding ------------------------------------------------------------------------------


def _batch_pair(top_k: int, step: int, verify: int) -> tuple[trtio.DeploymentConfig, ToyWeights, ToyWeights]:
    from trtio.testing.toy_engines import ToyEngines

    toys = ToyEngines.load()
    spec = dataclasses.replace(toys.eagle.spec, drafting_top_k=top_k, drafting_step=step, verify_size=verify)
    bundle = dataclasses.replace(toys.eagle, spec=spec).validate()
    return bundle, toys.weights("toy-eagle/base"), toys.weights("toy-eagle/draft")


@pytest.mark.parametrize("contract", ["batch", "ragged"])
@pytest.mark.parametrize("drafting", ["chain", "tree"])
def test_speculative_tokens_equal_greedy_tokens(device: str, contract: str, drafting: str) -> None:
    """Chain drafting (top_k 1) and EAGLE tree drafting (top_k 2 at every level, 3 levels)."""
    top_k, step = (1, 4) if drafting == "chain" else (2, 3)
    if contract == "ragged":
        bundle = pair(top_k, step, 8)
        bw = ToyWeights.generate(bundle.base, 0)
        dw = ToyWeights.generate_draft(bundle.draft, bw, 0)
        llm = llm_cfg()
    else:
        bundle, bw, dw = _batch_pair(top_k, step, 8)
        llm = dataclasses.replace(bundle.base, is_spec_decode_base=False, max_verify_tree_size=0)
    prompts = _prompts((5, 12, 1, 8), seed=4)
    with trtio.create_for_llm(ReferenceEngine.from_config(llm, weights=bw, device=device), llm) as s:
        greedy = greedy_generate(s, E, prompts, 14)
    for graphs in (False, True):
        base = ReferenceEngine.from_config(bundle.base, weights=bw, device=device)
        draft = ReferenceEngine.from_config(bundle.draft, weights=dw, device=device)
        with trtio.create_for_spec_decode(base, draft, bundle, graphs=graphs) as sd:
            assert sd.contract == contract
            tokens, stats = spec_generate(sd, E, prompts, 14)
            assert tokens == greedy
            assert stats.rounds >= 1 and stats.proposed == stats.rounds * len(prompts) * top_k * step
            if graphs:
                assert sd.graph_stats["base"].hits > 0 and sd.graph_stats["draft"].hits > 0


def test_the_ragged_draft_reads_its_tree_and_the_bases_features_row_for_row() -> None:
    """The draft's logits after its prefill and after one proposal level equal the numpy draft model fed
    the base's EAGLE3 features (hidden states after layers 0, 1, 3) and its own root hidden state."""
    bundle = pair(2, 3, 8)
    bc, dc = bundle.base, bundle.draft
    bw = ToyWeights.generate(bc, 0)
    dw = ToyWeights.generate_draft(dc, bw, 0)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    with trtio.create_for_spec_decode(ReferenceEngine.from_config(bc, weights=bw, device="host"),
                                      ReferenceEngine.from_config(dc, weights=dw, device="host"), bundle) as sd:
        emb, lens = embed_batch(E, prompts, np.float16)
        pending = sd.base_prefill(emb, lens).to_numpy().argmax(-1)
        shifted = [p[1:] + [int(t)] for p, t in zip(prompts, pending)]
        root = sd.draft_prefill(embed_batch(E, shifted, np.float16)[0], lens).to_numpy()
        tops = np.argsort(-root, -1)[:, :2]
        level = sd.draft_propose(E[tops].astype(np.float16), parents=[-1, -1]).to_numpy().reshape(2, 2, -1)
    for b, p in enumerate(prompts):
        n = len(p)
        feats, _ = reference_forward(bw, bc, E[p].astype(np.float16), hidden_after=bc.eagle_hidden_state_layers)
        feats = feats.astype(np.float16).astype(np.float32)
        xs = E[shifted[b]].astype(np.float16)
        hidden, logits = reference_forward(dw, dc, xs, hidden_input=feats, hidden_from_draft=np.zeros((n, 64)))
        np.testing.assert_allclose(root[b], _log_softmax(logits[n - 1]), atol=2e-3)
        for i in range(2):
            x2 = np.concatenate([xs, E[[tops[b, i]]].astype(np.float16)])
            h_in = np.concatenate([feats, np.zeros((1, feats.shape[1]))])
            h_draft = np.concatenate([np.zeros((n, 64)), hidden[n - 1:n].astype(np.float16)])
            _, lg = reference_forward(dw, dc, x2, hidden_input=h_in, hidden_from_draft=h_draft)
            np.testing.assert_allclose(level[b, i], _log_softmax(lg[n]), atol=2e-3)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return (x - x.max() - np.log(np.exp(x - x.max()).sum())).astype(np.float32)


# -- bad input: one clear error, before any work is enqueued -------------------------------------------


class _Omits(ReferenceEngine):
    """A ragged toy engine that does not declare one binding (a required one: the setup must refuse it)."""

    __module__ = ReferenceEngine.__module__
    hidden_name = names.kKVPageTable

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._decls = [d for d in self._decls if d.name != self.hidden_name]
        self._decls = [dataclasses.replace(d, index=i) for i, d in enumerate(self._decls)]
        self._by_name = {d.name: d for d in self._decls}


def _refused(host: Backend, error: type[Exception], match: str, fn: object, *args: object,
             **kwargs: object) -> None:
    ops = host.op_count  # type: ignore[attr-defined]
    with pytest.raises(error, match=match):
        fn(*args, **kwargs)  # type: ignore[operator]
    assert host.op_count == ops, "nothing may be enqueued before the error"  # type: ignore[attr-defined]


def test_bad_setups_are_refused_naming_the_binding_and_numbers() -> None:
    cfg = llm_cfg()
    eng = ReferenceEngine.from_config(cfg, device="host", null_compute=True)
    with pytest.raises(ConfigError, match=r"contract: the config says 'batch' but the engine declares the 'ragged'"):
        trtio.create_for_llm(eng, dataclasses.replace(cfg, contract="batch"))
    with pytest.raises(BindingError, match=r"past_key_values_0: the engine's KV cache is float16 but the config's "
                                           r"kv_cache_dtype is fp8"):
        trtio.create_for_llm(eng, dataclasses.replace(cfg, kv_cache_dtype="fp8"))
    with pytest.raises(BindingError, match=r"kv_page_table: the engine has paged KV caches .* but declares no page "
                                           r"table"):
        trtio.create_for_llm(_Omits.from_config(cfg, device="host", null_compute=True), cfg)
    # A pool smaller than every slot's pages is what pages on demand are for: accepted, and reported.
    small = dataclasses.replace(cfg, kv_pool_pages=3).validate()
    with trtio.create_for_llm(ReferenceEngine.from_config(small, device="host", null_compute=True), small) as setup:
        assert (setup.kv_pages.total, setup.kv_pages.free) == (3, 3)
    with pytest.raises(BindingError, match=r"past_key_values_0: the engine's pool holds 3 pages but the config's "
                                           r"kv_pool_pages is 8"):
        trtio.create_for_llm(ReferenceEngine.from_config(small, device="host", null_compute=True), cfg)
    short = dataclasses.replace(cfg, max_kv_cache_capacity=128, kv_pool_pages=0).validate()
    with pytest.raises(BindingError, match=r"kv_page_table: the engine takes 1 pages per sequence but "
                                           r"max_kv_cache_capacity 256 needs 2 pages of 128"):
        trtio.create_for_llm(ReferenceEngine.from_config(short, device="host", null_compute=True), cfg)
    with pytest.raises(TypeError, match=r"create_for_llm: expected a TensorRT engine .* got NoneType"):
        trtio.create_for_llm(None, cfg)
    with pytest.raises(TypeError, match=r"cfg must be an LLMEngineConfig, got dict"):
        trtio.create_for_llm(eng, {"hidden_size": 64})


def test_bad_steps_are_refused_before_any_work(host: Backend) -> None:
    cfg = llm_cfg()
    with trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg) as setup:
        too_long = np.zeros((1, 65, 64), np.float16)
        _refused(host, ShapeError, r"seq_len must be an int in 1..64 \(max_supported_input_length\)",
                 setup.prefill, too_long, [65])
        _refused(host, ShapeError, r"inputs_embeds: batch 5 is outside 1..4", setup.prefill,
                 np.zeros((5, 3, 64), np.float16), [3] * 5)
        _refused(host, ShapeError, r"context_lengths\[1\] = 9 is outside 1..4", setup.prefill,
                 np.zeros((2, 4, 64), np.float16), [4, 9])
        _refused(host, TrtioError, r"decode\(\) before prefill\(\)", setup.decode, np.zeros((1, 1, 64), np.float16))
        emb, lens = embed_batch(E, _prompts((3,)), np.float16)
        setup.prefill(emb, lens)
        _refused(host, ShapeError, r"past_lengths\[0\] = 5, but the cache of slot 0 holds 3 tokens", setup.prefill,
                 emb, lens, past_lengths=[5])
        _refused(host, ShapeError, r"inputs_embeds: decode takes \[batch=1, 1, 64\], got \[2, 1, ...\]",
                 setup.decode, np.zeros((2, 1, 64), np.float16))
        setup.state.lengths[0] = cfg.max_kv_cache_capacity  # as if the cache had filled up
        _refused(host, ShapeError, r"KV cache full: sequence 0 holds 256 tokens, the capacity "
                                   r"\(max_kv_cache_capacity\) is 256", setup.decode, np.zeros((1, 1, 64), np.float16))


def test_bad_spec_decode_calls_are_refused_before_any_work(host: Backend) -> None:
    bundle = pair(2, 3, 8)
    with trtio.create_for_spec_decode(ReferenceEngine.from_config(bundle.base, device="host"),
                                      ReferenceEngine.from_config(bundle.draft, device="host"), bundle) as sd:
        emb, lens = embed_batch(E, _prompts((4, 6)), np.float16)
        two = np.zeros((2, 2, 64), np.float16)
        _refused(host, TrtioError, r"draft_propose\(\) is out of order: no prompt has run", sd.draft_propose, two)
        sd.base_prefill(emb, lens)
        _refused(host, TrtioError, r"draft_propose\(\) is out of order: a base prefill awaits", sd.draft_propose, two,
                 parents=[-1, -1])
        _refused(host, ShapeError, r"context_lengths \[4, 5\] differ from the base prefill's \[4, 6\]",
                 sd.draft_prefill, emb, [4, 5])
        sd.draft_prefill(emb, lens)
        _refused(host, ShapeError, r"parents\[0, 0\] = 0: a new node's parent must be -1", sd.draft_propose, two,
                 parents=[0, -1])
        _refused(host, ShapeError, r"2 nodes per sequence need their parents", sd.draft_propose, two)
        sd.draft_propose(two, parents=[-1, -1])
        _refused(host, ShapeError, r"a node of the previous level \(0..1\)", sd.draft_propose, two, parents=[1, 3])
        sd.draft_propose(two, parents=[0, 1])
        sd.draft_propose(two, parents=[2, 2])
        _refused(host, ShapeError, r"6 more nodes make 12, more than the 6 a round's draft tree holds",
                 sd.draft_propose, np.zeros((2, 6, 64), np.float16), parents=[4] * 6)
        _refused(host, TrtioError, r"accept\(\) is out of order", sd.accept, [[0], [0]])
        later = np.zeros((2, 3, 3), bool)
        later[:, 0, 0] = later[:, 1, :2] = later[:, 2, 1:] = True
        _refused(host, ShapeError, r"row \(b=0, t=0\) sees later node|row \(b=0, t=1\)|sees later node",
                 sd.verify, np.zeros((2, 3, 64), np.float16), np.triu(np.ones((2, 3, 3), bool)))
        _refused(host, ShapeError, r"verify_size must be an int in 1..8", sd.verify, np.zeros((2, 9, 64), np.float16),
                 list(range(-1, 8)))
        sd.verify(np.zeros((2, 4, 64), np.float16), [-1, 0, 0, 1])
        _refused(host, ShapeError, r"paths\[1\] = \[0, 3\]: node 3 is not a child of node 0", sd.accept,
                 [[0, 1], [0, 3]])
        _refused(host, TrtioError, r"draft_accept\(\) is out of order", sd.draft_accept, two, [1, 1])
        sd.accept([[0, 1, 3], [0, 2]])
        _refused(host, ShapeError, r"accept_lengths \[3, 1\] differ from the path lengths accept\(\) committed "
                                   r"\[3, 2\]", sd.draft_accept, np.zeros((2, 3, 64), np.float16), [3, 1])
        sd.draft_accept(np.zeros((2, 3, 64), np.float16), [3, 2])
        assert sd.base_lengths.tolist() == sd.draft_lengths.tolist() == [7, 8]


def test_parents_that_repeat_are_checked_again_where_the_previous_level_differs(host: Backend) -> None:
    """A level's parents are nodes of the level before: the same values at the same node count, valid last round
    (previous level: nodes 1..3), are refused where this round's previous level holds nodes 2..3 only."""
    bundle = pair(2, 3, 8)  # a round's tree holds 6 nodes
    with trtio.create_for_spec_decode(ReferenceEngine.from_config(bundle.base, device="host"),
                                      ReferenceEngine.from_config(bundle.draft, device="host"), bundle) as sd:
        emb, lens = embed_batch(E, _prompts((4, 6)), np.float16)
        sd.base_prefill(emb, lens)
        sd.draft_prefill(emb, lens)

        def level(k: int, parents: list[int]) -> None:
            sd.draft_propose(np.zeros((2, k, 64), np.float16), parents=parents)

        def finish_round() -> None:
            sd.verify(np.zeros((2, 2, 64), np.float16), [-1, 0])
            sd.accept([[0], [0]])
            sd.draft_accept(np.zeros((2, 1, 64), np.float16), [1, 1])

        level(1, [-1])
        level(3, [0, 0, 0])  # nodes 1..3
        level(2, [1, 1])  # 4 nodes so far; parents 1, 1
        finish_round()
        level(2, [-1, -1])
        level(2, [0, 1])  # nodes 2..3: 4 nodes so far again
        _refused(host, ShapeError, r"parents\[0, 0\] = 1: a new node's parent must be a node of the previous level "
                                   r"\(2..3\)", sd.draft_propose, np.zeros((2, 2, 64), np.float16), parents=[1, 1])
        level(2, [2, 3])


# -- real engine directories ---------------------------------------------------------------------------


def test_create_from_engine_dir_binds_a_directorys_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The path a real directory takes: EngineDir, deployment() checks, load_engine per role (here returning
    ReferenceEngines of the configs beside the engine files), create_for_spec_decode."""
    import shutil

    import trtio._setups.engine_dir as engine_dir

    d = tmp_path / "eagle"
    shutil.copytree(EAGLE_DIR, d)
    loaded = []

    def fake_load(path: object, module: object = "auto", *, plugins: object = ()) -> ReferenceEngine:
        role = "base" if Path(str(path)).name == "spec_base.engine" else "draft"
        loaded.append((Path(str(path)).name, plugins))
        return ReferenceEngine.from_config(getattr(EngineDir.open(d), f"{role}_config"), device="host")

    monkeypatch.setattr(engine_dir, "load_engine", fake_load)
    with pytest.raises(ConfigError, match="verify_size: 9 exceeds builder_config.max_verify_tree_size"):
        trtio.create_from_engine_dir(d, draft_top_k=2, draft_step=3, verify_size=9)
    assert loaded == [], "the tree caps are checked before any engine is loaded"
    with trtio.create_from_engine_dir(d, draft_top_k=2, draft_step=3, verify_size=8, plugins=["p.so"]) as sd:
        assert isinstance(sd, trtio.SpecDecodeSetup) and sd.contract == "ragged"
        assert [n for n, _ in loaded] == ["spec_base.engine", "spec_draft.engine"]
        tokens, _ = spec_generate(sd, E, _prompts((3, 5)), 6)
    assert len(tokens) == 2 and all(len(t) == 6 for t in tokens)


def test_the_ragged_catch_up_and_the_next_level_equal_the_numpy_draft_round_after_round() -> None:
    """The draft's catch-up binds tree inputs of its own (its levels rewrite the shared ones on the device every
    round): its logits at each sequence's last accepted row, and those of the next round's first level, equal
    the numpy draft model over the committed tokens, round after round, also while the accept lengths repeat
    (the step block then keeps the catch-up's tree from the round before)."""
    bundle = pair(2, 3, 8)
    bc, dc = bundle.base, bundle.draft
    bw = ToyWeights.generate(bc, 0)
    dw = ToyWeights.generate_draft(dc, bw, 0)
    rng = np.random.default_rng(5)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    tree = [-1, 0, 0, 1]
    rounds = [([0, 1, 3], [0, 2]), ([0, 2], [0, 1, 3]), ([0, 2], [0, 1, 3]), ([0, 1], [0, 1, 3]), ([0, 1], [0, 1, 3])]
    f16, dh = np.float16, dc.hidden_size

    def draft_model(base_rows: np.ndarray, draft_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        feats, _ = reference_forward(bw, bc, base_rows, hidden_after=bc.eagle_hidden_state_layers)
        feats = feats.astype(f16).astype(np.float32)
        hidden, logits = reference_forward(dw, dc, draft_rows, hidden_input=feats,
                                           hidden_from_draft=np.zeros((len(draft_rows), dh)))
        return feats, hidden

    with trtio.create_for_spec_decode(ReferenceEngine.from_config(bc, weights=bw, device="host"),
                                      ReferenceEngine.from_config(dc, weights=dw, device="host"), bundle,
                                      graphs=True) as sd:
        emb, lens = embed_batch(E, prompts, f16)
        pending = sd.base_prefill(emb, lens).to_numpy().argmax(-1)
        shifted = [p[1:] + [int(t)] for p, t in zip(prompts, pending)]
        sd.draft_prefill(embed_batch(E, shifted, f16)[0], lens)
        base_rows = [E[p].astype(f16) for p in prompts]
        draft_rows = [E[s].astype(f16) for s in shifted]
        for r, paths in enumerate(rounds):
            x = E[rng.integers(0, 512, (2, 2))].astype(f16)
            level = sd.draft_propose(x, parents=[-1, -1]).to_numpy().reshape(2, 2, -1)
            for b in range(2):
                n = len(draft_rows[b])
                feats, hidden = draft_model(base_rows[b], draft_rows[b])
                for i in range(2):
                    _, lg = reference_forward(dw, dc, np.concatenate([draft_rows[b], x[b, i:i + 1]]),
                                              hidden_input=np.concatenate([feats, np.zeros((1, feats.shape[1]))]),
                                              hidden_from_draft=np.concatenate([np.zeros((n, dh)),
                                                                                hidden[n - 1:n].astype(f16)]))
                    np.testing.assert_allclose(level[b, i], _log_softmax(lg[n]), atol=2e-3, err_msg=f"round {r}")
            v = E[rng.integers(0, 512, (2, len(tree)))].astype(f16)
            sd.verify(v, tree)
            sd.accept([list(p) for p in paths])
            c = E[rng.integers(0, 512, (2, 3))].astype(f16)
            out = sd.draft_accept(c, np.array([len(p) for p in paths])).to_numpy()
            for b, p in enumerate(paths):
                base_rows[b] = np.concatenate([base_rows[b], v[b, p]])
                draft_rows[b] = np.concatenate([draft_rows[b], c[b, :len(p)]])
                _, lg = reference_forward(dw, dc, draft_rows[b],
                                          hidden_input=draft_model(base_rows[b], draft_rows[b])[0],
                                          hidden_from_draft=np.zeros((len(draft_rows[b]), dh)))
                np.testing.assert_allclose(out[b], _log_softmax(lg[-1]), atol=2e-3, err_msg=f"round {r}")
