"""create_for_llm / create_for_spec_decode end to end, against the plain numpy toy model.

Tests taking the ``device`` fixture run with host ReferenceEngines here and again with GPU
ReferenceEngines (CuPy, cuda backend) where a GPU answers.
"""

import dataclasses
import gc

import numpy as np
import pytest
from _configs import bundle, llm_config

import trtio
from trtio import BindingError, InvalidValueError, Location, ShapeError, Stream, Tensor, TrtioError, names
from trtio._pipeline_io import PipelineIO
from trtio._setups import create_for_llm, create_for_spec_decode
from trtio._trees import ancestor_mask
from trtio.testing import ReferenceEngine, ToyWeights, reference_forward, toy_embedding
from trtio.testing.toy_runtime import embed_batch, greedy_generate, spec_generate


@pytest.fixture(params=["host", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request):
    if request.param == "gpu":
        pytest.importorskip("cupy")
    return request.param


def _tol(cfg):
    return 2e-2 if cfg.activation_dtype == "bfloat16" else 2e-3


def _prompts(rng, lengths, vocab=512):
    return [list(map(int, rng.integers(0, vocab, n))) for n in lengths]


def _run_llm(cfg, device, *, graphs=False, steps=4, lengths=(5, 11, 3, 8), deepstack=False, seed=0):
    """Prefill + greedy decode through create_for_llm; returns (tokens, logits per step, setup)."""
    eng = ReferenceEngine.from_config(cfg, seed=seed, device=device)
    setup = create_for_llm(eng, cfg, graphs=graphs)
    E = toy_embedding(cfg.vocab_size, cfg.hidden_size, seed)
    rng = np.random.default_rng(seed + 1)
    prompts = _prompts(rng, lengths, cfg.vocab_size)
    act = cfg.activation.numpy
    emb, lens = embed_batch(E, prompts, act)
    feats = None
    if deepstack:
        feats = [rng.standard_normal(emb.shape).astype(act) * 0.1 for _ in range(cfg.num_deepstack_features)]
    out = [setup.prefill(emb, lens, deepstack_embeds=feats).to_numpy()]
    toks = [list(p) for p in prompts]
    for _ in range(steps):
        nxt = out[-1].argmax(-1)
        for b, t in enumerate(nxt):
            toks[b].append(int(t))
        out.append(setup.decode(E[nxt][:, None, :].astype(act)).to_numpy())
    return eng, setup, E, toks, out, feats, lens


@pytest.mark.parametrize("variant", ["plain", "bf16", "deepstack", "mrope_cfg", "f32_cache"])
def test_llm_matches_numpy_model(device, variant):
    kw = {"plain": {}, "bf16": {"activation_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"},
          "deepstack": {"num_deepstack_features": 2}, "mrope_cfg": {"rope_type": "mrope"},
          "f32_cache": {"kv_cache_dtype": "float32", "rotary_dim": 8}}[variant]
    cfg = llm_config(**kw)
    eng, setup, E, toks, out, feats, lens = _run_llm(cfg, device, deepstack=variant == "deepstack")
    for b, seq in enumerate(toks):
        n = int(lens[b])
        ds = None
        if feats is not None:
            # prefill carries the features; decode steps bind the zero buffer
            ds = [np.concatenate([f[b, :n].astype(np.float32), np.zeros((len(seq) - n, cfg.hidden_size), np.float32)])
                  for f in feats]
        _, ref = reference_forward(eng.weights, cfg, E[seq].astype(cfg.activation.numpy), deepstack=ds)
        np.testing.assert_allclose(out[0][b], ref[n - 1], atol=_tol(cfg), rtol=_tol(cfg))
        for step in range(1, len(out)):
            np.testing.assert_allclose(out[step][b], ref[n - 1 + step], atol=_tol(cfg), rtol=_tol(cfg))
    assert setup.lengths.tolist() == [int(n) + 4 for n in lens]
    setup.close()


def test_graphs_on_equal_graphs_off_bit_for_bit(device):
    cfg = llm_config()
    *_, plain, _, _ = _run_llm(cfg, device, graphs=False, steps=6)
    eng, setup, *_, graphed, _, _ = _run_llm(cfg, device, graphs=True, steps=6)
    for a, b in zip(plain, graphed):
        np.testing.assert_array_equal(a, b)
    stats = setup.graph_stats
    assert stats.captures == 1 and stats.hits == 5 and stats.misses == 1
    setup.close()


def test_graph_miss_reason_names_the_changed_binding():
    cfg = llm_config()
    eng = ReferenceEngine.from_config(cfg, device="host")
    setup = create_for_llm(eng, cfg, graphs=True)
    E = toy_embedding(512, 64)
    for batch in (2, 3):
        emb, lens = embed_batch(E, [[1, 2, 3]] * batch, np.float16)
        setup.prefill(emb, lens)
        setup.decode(E[[4] * batch][:, None, :].astype(np.float16))
        setup.decode(E[[5] * batch][:, None, :].astype(np.float16))
    stats = setup.graph_stats
    assert stats.captures == 2 and stats.hits == 2
    assert stats.last_miss_reason == "inputs_embeds: shape [2, 1, 64] -> [3, 1, 64]"
    setup.close()


@pytest.mark.parametrize("graphs", [False, True])
def test_steady_decode_makes_no_tensorrt_set_calls_no_allocation_no_sync(device, graphs):
    cfg = llm_config()
    eng = ReferenceEngine.from_config(cfg, device=device)
    setup = create_for_llm(eng, cfg, graphs=graphs)
    be = setup.io.backend
    E = toy_embedding(512, 64)
    emb, lens = embed_batch(E, [[1, 2, 3], [4, 5]], np.float16)
    logits = setup.prefill(emb, lens).to_numpy()
    logits = setup.decode(E[logits.argmax(-1)][:, None, :].astype(np.float16)).to_numpy()  # profile 1, capture
    ctx = setup.executor.context
    calls = dict(ctx.calls)
    for _ in range(8):
        nxt = E[logits.argmax(-1)][:, None, :].astype(np.float16)
        allocs, syncs = be.alloc_count, be.sync_count
        out = setup.decode(nxt)
        assert be.alloc_count == allocs, "a decode step never allocates"
        assert be.sync_count == syncs, "a decode step never synchronises the host"
        logits = out.to_numpy()  # the runtime reads the logits: this syncs, outside the step
    assert ctx.calls["set_tensor_address"] == calls["set_tensor_address"]
    assert ctx.calls["set_input_shape"] == calls["set_input_shape"]
    assert ctx.calls["set_optimization_profile_async"] == calls["set_optimization_profile_async"]
    assert ctx.calls["execute_async_v3"] == calls["execute_async_v3"] + (0 if graphs else 8)
    if graphs:
        assert setup.graph_stats.hits == 8
    setup.close()


def test_llm_setup_bad_calls():
    cfg = llm_config()
    setup = create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg)
    E = toy_embedding(512, 64)
    one = E[[1]][:, None, :].astype(np.float16)
    with pytest.raises(TrtioError, match=r"decode\(\) before prefill\(\)"):
        setup.decode(one)
    emb, lens = embed_batch(E, [[1, 2, 3], [4, 5]], np.float16)
    with pytest.raises(ShapeError, match=r"context_lengths\[1\] = 7 is outside 1..3"):
        setup.prefill(emb, np.array([3, 7]))
    with pytest.raises(ShapeError, match="expected 2 integer lengths"):
        setup.prefill(emb, np.array([3]))
    with pytest.raises(ShapeError, match=r"expected shape \[batch, seq, 64\]"):
        setup.prefill(emb[..., :32], lens)
    with pytest.raises(ShapeError, match=r"batch 5 is outside 1..4"):
        e5, l5 = embed_batch(E, [[1]] * 5, np.float16)
        setup.prefill(e5, l5)
    setup.prefill(emb, lens)
    with pytest.raises(ShapeError, match=r"decode takes \[batch=2, 1, 64\], got \[1, 1"):
        setup.decode(one)
    setup.close()
    with pytest.raises(TrtioError, match="closed"):
        setup.decode(one)


def test_kv_cache_full_is_a_clear_error():
    cfg = llm_config(max_kv_cache_capacity=66, max_supported_input_length=64)
    setup = create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg)
    E = toy_embedding(512, 64)
    emb, lens = embed_batch(E, [list(range(64))], np.float16)
    setup.prefill(emb, lens)
    setup.decode(E[[1]][:, None, :].astype(np.float16))
    setup.decode(E[[1]][:, None, :].astype(np.float16))
    with pytest.raises(ShapeError, match="KV cache full: sequence 0 holds 66 tokens"):
        setup.decode(E[[1]][:, None, :].astype(np.float16))
    setup.close()


@pytest.mark.parametrize("engine_kw,cfg_kw,needle", [
    ({}, {"num_deepstack_features": 1},
     "deepstack_embeds_0: the config implies this input but the engine does not declare it"),
    ({"num_deepstack_features": 1}, {},
     "deepstack_embeds_0: the engine declares this input but a llm engine of the batch contract has no such "
     "binding"),
    ({}, {"kv_cache_dtype": "bfloat16"},
     "k_cache_0: the engine's KV cache is float16 but the config's kv_cache_dtype is bfloat16"),
    ({}, {"hidden_size": 128}, "inputs_embeds: dim 2 is 64 in the engine but 128 in the config"),
])
def test_config_that_disagrees_with_the_engine(engine_kw, cfg_kw, needle):
    eng = ReferenceEngine.from_config(llm_config(**engine_kw), device="host")
    with pytest.raises(BindingError) as info:
        create_for_llm(eng, llm_config(**cfg_kw))
    assert needle in str(info.value)


def test_config_promising_more_than_the_engine_profiles_is_refused_at_setup():
    eng = ReferenceEngine.from_config(llm_config(max_supported_input_length=16, max_supported_batch_size=2),
                                      device="host")
    with pytest.raises(BindingError) as info:
        create_for_llm(eng, llm_config(max_supported_input_length=32, max_kv_cache_capacity=256))
    msg = str(info.value)
    assert ("inputs_embeds: the prefill profile takes up to 16 tokens, the config's max_supported_input_length is 32"
            in msg)
    assert "inputs_embeds: the engine takes batches up to 2, the config's max_supported_batch_size is 4" in msg
    assert "k_cache_0: dim 2 is 128 in the engine but 256 in the config (max_kv_cache_capacity)" in msg


def test_create_for_llm_refuses_spec_configs():
    b = bundle()
    with pytest.raises(TrtioError, match="use create_for_spec_decode"):
        create_for_llm(ReferenceEngine.from_config(b.base, device="host"), b.base)


def test_failed_setup_frees_what_it_allocated(host):
    gc.collect()  # what earlier tests left to the collector is freed now, not mid-test (it would read as a free)
    live = host.live_allocations
    eng = ReferenceEngine.from_config(llm_config(), device="host")
    with pytest.raises(BindingError):
        create_for_llm(eng, llm_config(kv_cache_dtype="bfloat16"), backend=host)
    assert host.live_allocations == live


def test_streaming_snapshot_through_the_setup(host):
    cfg = llm_config()
    setup = create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg)
    E = toy_embedding(512, 64)
    emb, lens = embed_batch(E, [[1, 2, 3, 4], [5, 6]], np.float16)
    setup.prefill(emb, lens)
    live_hidden = setup.io.output_hidden_states.to_numpy()
    setup.populate_streaming()
    setup.decode(E[[7, 8]][:, None, :].astype(np.float16))  # overwrites the live buffers
    sp = setup.io.streaming_prefill
    consumer = Stream.create(host)
    sp.ready_event.wait(consumer)
    np.testing.assert_array_equal(sp.engine_hidden_states.to_numpy(consumer), live_hidden)
    np.testing.assert_array_equal(sp.input_embeds.to_numpy(consumer), emb)
    assert setup.io.output_hidden_states.shape == (2, 1, 64)
    consumer.close()
    setup.close()


def test_memory_report_covers_every_part():
    cfg = llm_config()
    setup = create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg)
    rep = setup.memory_report()
    names_ = {e.name for e in rep.entries}
    assert {"inputs_embeds", names.k_cache(1), "kv_lengths", names.kRopeCosSin, "context_memory"} <= names_
    assert rep.total_required >= 4 * 4 * 2 * 128 * 16 * 2
    setup.close()


# -- speculative decoding ---------------------------------------------------------------------------

def _spec_pair(device, **kw):
    b = bundle(draft_vocab=512, verify_size=6, max_verify=8, max_proposal=8, top_k=2, step=3, **kw)
    bw = ToyWeights.generate(b.base, 0)
    dw = ToyWeights.generate_draft(b.draft, bw, 0)
    base = ReferenceEngine.from_config(b.base, weights=bw, device=device)
    draft = ReferenceEngine.from_config(b.draft, weights=dw, device=device)
    return b, bw, base, draft


def test_a_spec_steps_dims_follow_the_shape_asked_for_after_the_last_one_repeated() -> None:
    """A step's dims are found again by its shape while the shape repeats (one object per shape, which the
    executor tests by identity), and a step of another shape, or of another kind or engine, gets its own."""
    b, _bw, base, draft = _spec_pair("host")
    with create_for_spec_decode(base, draft, b) as sd:
        four = sd._dims(sd.base, "verify", 2, 4)
        assert sd._dims(sd.base, "verify", 2, 4) is four and four == b.base.spec_verify_dims(2, 4)
        three = sd._dims(sd.base, "verify", 2, 3)
        assert three == b.base.spec_verify_dims(2, 3) and three != four
        assert sd._dims(sd.base, "verify", 2, 4) is four
        assert sd._dims(sd.draft, "accept", 2, 3) == b.draft.accept_dims(2, 3)
        assert sd._dims(sd.draft, "proposal", 2, 3, 1) == b.draft.proposal_dims(2, 3, 1)


@pytest.mark.parametrize("top_k,depth", [(1, 3), (2, 3), (2, 1)])
def test_spec_decode_gives_exactly_the_greedy_tokens(device, top_k, depth):
    b, bw, base, draft = _spec_pair(device)
    llm_cfg = dataclasses.replace(b.base, is_spec_decode_base=False, max_verify_tree_size=0)
    E = toy_embedding(512, 64, 0)
    prompts = _prompts(np.random.default_rng(3), (5, 12, 3, 8))
    llm = create_for_llm(ReferenceEngine.from_config(llm_cfg, weights=bw, device=device), llm_cfg)
    vanilla = greedy_generate(llm, E, prompts, 16)
    sd = create_for_spec_decode(base, draft, b)
    tokens, stats = spec_generate(sd, E, prompts, 16, depth=depth, top_k=top_k)
    assert tokens == vanilla
    assert 0.0 < stats.acceptance_rate < 1.0, "a weak draft: some, not all, proposals accepted"
    llm.close()
    sd.close()


def test_tree_verify_equals_decoding_each_path(device):
    """Each node's verify logits equal the logits of decoding its root-to-node path one token at a time."""
    b, bw, base, draft = _spec_pair(device)
    E = toy_embedding(512, 64, 0)
    prompts = _prompts(np.random.default_rng(5), (6, 9))
    parents = [-1, 0, 0, 1, 1, 2, 4]
    rng = np.random.default_rng(6)
    tree_tokens = rng.integers(0, 512, (2, len(parents)))
    sd = create_for_spec_decode(base, draft, b)
    emb, lens = embed_batch(E, prompts, np.float16)
    sd.base_prefill(emb, lens)
    verify = sd.verify(E[tree_tokens].astype(np.float16), parents).to_numpy().reshape(2, len(parents), -1)
    sd.close()
    mask = ancestor_mask(parents)
    for bi in range(2):
        for node in range(len(parents)):
            path = [int(tree_tokens[bi, i]) for i in range(len(parents)) if mask[node, i]]
            # decode prompt + path sequentially through a fresh setup (same base engine weights)
            sd2 = create_for_spec_decode(*_spec_pair(device)[2:], b)
            e1, l1 = embed_batch(E, [prompts[bi]], np.float16)
            sd2.base_prefill(e1, l1)
            last = None
            for tok in path:
                last = sd2.verify(E[[[tok]]].astype(np.float16), [-1]).to_numpy()[0]
                sd2.accept([[0]])
            np.testing.assert_allclose(verify[bi, node], last, atol=2e-3, rtol=2e-3)
            sd2.close()


def test_draft_reads_base_hidden_states_at_the_address_the_base_wrote(device):
    b, bw, base, draft = _spec_pair(device)
    sd = create_for_spec_decode(base, draft, b)
    E = toy_embedding(512, 64, 0)
    emb, lens = embed_batch(E, [[1, 2, 3], [4, 5, 6, 7]], np.float16)
    sd.base_prefill(emb, lens)
    sd.draft_prefill(emb, lens)
    base_out = sd.base.executor.context.get_tensor_address(names.kOutputHiddenStates)
    draft_in = sd.draft.executor.context.get_tensor_address(names.kBaseModelHiddenStates)
    assert base_out == draft_in == sd.io.base_hidden_states.data_ptr
    base_tm, draft_tm = sd.base.tensor_map, sd.draft.tensor_map
    shared = [n for n in base_tm.names() if n in draft_tm and base_tm[n] is draft_tm[n]]
    assert {names.kInputsEmbeds, names.kLogits, names.kAttentionMask, names.kAttentionPosId} <= set(shared)
    assert sd.base.state.tensors[names.k_cache(0)].data_ptr != sd.draft.state.tensors[names.k_cache(0)].data_ptr
    sd.close()


def test_spec_decode_graphs_on_equal_off(device):
    b, bw, base, draft = _spec_pair(device)
    E = toy_embedding(512, 64, 0)
    prompts = _prompts(np.random.default_rng(8), (4, 7, 2, 9))
    sd = create_for_spec_decode(base, draft, b)
    plain, _ = spec_generate(sd, E, prompts, 12)
    sd.close()
    b, bw, base, draft = _spec_pair(device)
    sd = create_for_spec_decode(base, draft, b, graphs=True)
    graphed, _ = spec_generate(sd, E, prompts, 12)
    assert graphed == plain
    stats = sd.graph_stats
    assert stats["base"].hits > 0 and stats["draft"].hits > 0
    sd.close()


def test_spec_setup_bad_calls():
    b, bw, base, draft = _spec_pair("host")
    sd = create_for_spec_decode(base, draft, b)
    E = toy_embedding(512, 64, 0)
    with pytest.raises(TrtioError, match=r"verify\(\) is out of order: no prompt has run: base_prefill\(\)"):
        sd.verify(E[[[1, 2]]].astype(np.float16), [-1, 0])
    emb, lens = embed_batch(E, [[1, 2, 3]], np.float16)
    sd.base_prefill(emb, lens)
    with pytest.raises(TrtioError, match=r"accept\(\) is out of order"):
        sd.accept([[0]])
    sd.verify(E[[[1, 2, 3]]].astype(np.float16), [-1, 0, 1])
    with pytest.raises(ShapeError, match=r"paths\[0\] = \[1, 2\]: a path starts at the root, node 0"):
        sd.accept([[1, 2]])
    with pytest.raises(ShapeError, match=r"verify_size must be an int in 1..8"):
        sd.verify(E[np.zeros((1, 9), int)].astype(np.float16), list(range(-1, 8)))
    sd.close()
    with pytest.raises(TrtioError, match="needs a DeploymentConfig with a draft"):
        create_for_spec_decode(base, draft, trtio.DeploymentConfig(llm_config()))



@pytest.mark.parametrize("tree", [[-1, 0.0, 1], [-1, 0, np.float64(1)], [[-1, 0, 1.0]]])
def test_a_verify_tree_equal_to_the_last_but_not_of_ints_is_refused_as_the_first_one_would_be(tree):
    """A parent list equal in value to the last verify's (a float equal to its int) is not a list of ints:
    it is refused by its dtype, as a first verify given it is, not taken for the last one's tree."""
    b, bw, base, draft = _spec_pair("host")
    E = toy_embedding(512, 64, 0)
    with create_for_spec_decode(base, draft, b) as sd:
        emb, lens = embed_batch(E, [[1, 2, 3]], np.float16)
        sd.base_prefill(emb, lens)
        x = E[[[1, 2, 3]]].astype(np.float16)
        with pytest.raises(ShapeError, match="got dtype"):
            sd.verify(x, tree)  # refused on its own
        ints = [[-1, 0, 1]] if type(tree[0]) is list else [-1, 0, 1]
        sd.verify(x, ints)
        with pytest.raises(ShapeError, match="got dtype"):
            sd.verify(x, tree)  # equal in value to the list just verified

def test_spec_base_prefill_carries_deepstack_features_like_create_for_llm():
    b = bundle(draft_vocab=512, num_deepstack_features=1)
    bw = ToyWeights.generate(b.base, 0)
    llm_cfg = dataclasses.replace(b.base, is_spec_decode_base=False, max_verify_tree_size=0)
    E = toy_embedding(512, 64, 0)
    emb, lens = embed_batch(E, [[1, 2, 3, 4], [5, 6]], np.float16)
    feats = [np.random.default_rng(2).standard_normal(emb.shape).astype(np.float16) * 0.5]
    llm = create_for_llm(ReferenceEngine.from_config(llm_cfg, weights=bw, device="host"), llm_cfg)
    want = llm.prefill(emb, lens, deepstack_embeds=feats).to_numpy()
    without = llm.prefill(emb, lens).to_numpy()
    sd = create_for_spec_decode(ReferenceEngine.from_config(b.base, weights=bw, device="host"),
                                ReferenceEngine.from_config(b.draft, device="host"), b)
    got = sd.base_prefill(emb, lens, deepstack_embeds=feats).to_numpy()
    np.testing.assert_array_equal(got, want)
    assert not np.allclose(want, without), "the features change the logits"
    llm.close()
    sd.close()


def test_deepstack_features_partly_over_their_own_buffer_are_refused_before_any_work(host, monkeypatch):
    """A deepstack feature whose bytes overlap its io.deepstack_embeds buffer without starting there would be
    copied onto itself in part: refused, naming it, with nothing enqueued; at the buffer's own address it is read
    in place (no copy) and gives the logits of the same values given as numpy."""
    b = bundle(draft_vocab=512, num_deepstack_features=1)
    cfg = dataclasses.replace(b.base, is_spec_decode_base=False, max_verify_tree_size=0)
    bw = ToyWeights.generate(cfg, 0)
    emb, lens = embed_batch(toy_embedding(512, 64, 0), [[1, 2, 3, 4], [5, 6]], np.float16)
    feats = np.random.default_rng(2).standard_normal(emb.shape).astype(np.float16) * 0.5  # [2, 4, 64]: 1024 bytes
    with create_for_llm(ReferenceEngine.from_config(cfg, weights=bw, device="host"), cfg) as setup:
        want = setup.prefill(emb, lens, deepstack_embeds=[feats]).to_numpy()
        buffer = setup.io.deepstack_embeds[0]
        over = Tensor.wrap(buffer.data_ptr + 256, feats.shape, "float16", Location.DEVICE, buffer, name="over",
                           backend=host)
        ops = host.op_count
        with pytest.raises(InvalidValueError, match=r"deepstack_embeds\[0\]: its 1024 bytes at 0x[0-9a-f]+ overlap "
                                                    r"io.deepstack_embeds\[0\]"):
            setup.prefill(emb, lens, deepstack_embeds=[over])
        assert host.op_count == ops, "nothing enqueued"
        own = Tensor.wrap(buffer.data_ptr, feats.shape, "float16", Location.DEVICE, buffer, name="own", backend=host)
        own.copy_from(feats)
        copies = []
        real = host.memcpy

        def memcpy(dst, src, nbytes, stream):
            copies.append((dst, src))
            real(dst, src, nbytes, stream)

        monkeypatch.setattr(host, "memcpy", memcpy)
        got = setup.prefill(emb, lens, deepstack_embeds=[own]).to_numpy()
        monkeypatch.undo()
        assert (buffer.data_ptr, buffer.data_ptr) not in copies, "read in place, not copied onto itself"
        np.testing.assert_array_equal(got, want)
        own.close()
        over.close()


# -- the engine state owns its bindings' specs ------------------------------------------------------

def test_fixed_batch_cache_binds_at_its_declared_shape_and_gives_the_same_tokens(device):
    """An engine whose caches fix the batch dim (rows are sequence slots) serves a smaller step batch:
    the caches are bound at the declared [Bmax, ...] shape, and the tokens equal the dynamic engine's."""
    cfg = llm_config()
    E = toy_embedding(cfg.vocab_size, cfg.hidden_size)
    prompts = _prompts(np.random.default_rng(3), (4, 9))
    tokens = {}
    for fixed in (False, True):
        eng = ReferenceEngine.from_config(cfg, device=device, fixed_cache_batch=fixed)
        with create_for_llm(eng, cfg, graphs=True) as setup:
            tokens[fixed] = greedy_generate(setup, E, prompts, 6)
            bound = setup.executor.context.get_tensor_shape(names.k_cache(0))
            assert tuple(bound) == ((4, 2, 128, 16) if fixed else (2, 2, 128, 16))
    assert tokens[True] == tokens[False]


class _WithRecurrentState(ReferenceEngine):
    """A toy engine that also declares a state pair no registry names (a recurrent state)."""

    __module__ = ReferenceEngine.__module__

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from trtio.testing.reference_engine import TensorIOMode, _Decl

        g, n = self._geo, len(self._decls)
        rows = ((1, 3), (g.bmax, 3), (g.bmax, 3))
        self._decls += [
            _Decl(n, names.recurrent_state(0), TensorIOMode.INPUT, trtio.DType.FLOAT32, (-1, 3), (rows, rows)),
            _Decl(n + 1, names.present_recurrent_state(0), TensorIOMode.OUTPUT, trtio.DType.FLOAT32, (-1, 3), (),
                  names.recurrent_state(0)),
        ]
        self._by_name = {d.name: d for d in self._decls}


def test_a_recurrent_state_the_config_does_not_describe_is_refused():
    """A recurrent state pair on a config without recurrent layers: no registry names it, and the engine state
    binds recurrent pools whole, one row per slot (trtio/families/hybrid/recurrent.py), only where the config's
    layer_types say which layers they belong to; otherwise binding is refused, naming the binding."""
    cfg = llm_config()
    eng = _WithRecurrentState.from_config(cfg, device="host")
    with pytest.raises(trtio.BindingError, match=r"recurrent_state_0: the engine declares this recurrent state but "
                                                 r"the config has no recurrent layer \(layer_types\)"):
        create_for_llm(eng, cfg, graphs=True)


# -- lifetimes --------------------------------------------------------------------------------------

def test_closing_the_pipeline_io_or_state_under_a_live_setup_is_refused(host):
    cfg = llm_config()
    setup = create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg, graphs=True)
    E = toy_embedding(cfg.vocab_size, cfg.hidden_size)
    greedy_generate(setup, E, [[1, 2, 3]], 3)
    with pytest.raises(trtio.FrozenError, match=r"PipelineIO is bound by open executor\(s\) \['llm'\]"):
        setup.io.close()
    with pytest.raises(trtio.FrozenError, match=r"engine state 'llm' is bound by open executor\(s\) \['llm'\]"):
        setup.state.close()
    # Nothing was freed: the setup still steps (the tokens of a fresh setup), and its own close frees everything.
    fresh = create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg)
    assert greedy_generate(setup, E, [[1, 2, 3]], 3) == greedy_generate(fresh, E, [[1, 2, 3]], 3)
    fresh.close()
    live = host.live_allocations
    setup.close()
    assert host.live_allocations < live and setup.io.is_closed and setup.state.is_closed


def test_a_dropped_executor_frees_its_graphs(host):
    import gc
    import warnings

    cfg = llm_config()
    E = toy_embedding(cfg.vocab_size, cfg.hidden_size)
    base = host.live_graphs
    setup = create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg, graphs=True)
    greedy_generate(setup, E, [[1, 2, 3]], 4)
    assert host.live_graphs > base
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        del setup
        gc.collect()
    assert host.live_graphs == base
    assert any("was never closed" in str(w.message) and issubclass(w.category, ResourceWarning) for w in seen)


@pytest.mark.parametrize("kind", ["llm", "spec", "pipeline_io"])
def test_with_on_a_closed_setup_or_pipeline_io_raises(host, kind):
    """The close protocol everywhere: ``is_closed``, close twice is harmless, ``with`` on a closed object and
    any step after close raise ClosedError naming the object."""
    cfg = llm_config()
    if kind == "llm":
        obj = create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg)
        step = lambda: obj.decode(np.zeros((1, 1, 64), np.float16))  # noqa: E731
    elif kind == "spec":
        b, _bw, base, draft = _spec_pair("host")
        obj = create_for_spec_decode(base, draft, b)
        step = lambda: obj.verify(np.zeros((1, 1, 64), np.float16), [-1])  # noqa: E731
    else:
        obj = PipelineIO.create_for_llm(cfg, backend=host)
        step = lambda: obj.upload_context_lengths(np.ones(1, np.int32))  # noqa: E731
    with obj as entered:
        assert entered is obj and not obj.is_closed
    assert obj.is_closed
    obj.close()  # harmless
    name = {"llm": "LLMSetup", "spec": "SpecDecodeSetup", "pipeline_io": "PipelineIO"}[kind]
    with pytest.raises(trtio.ClosedError, match=f"{name} is closed"):
        with obj:
            pass
    with pytest.raises(trtio.ClosedError, match=f"{name} is closed"):
        step()


def test_stream_none_is_the_threads_default_stream_in_a_setup_too(host):
    """A setup created on a stream of its own still steps on the thread's default stream when given none
    (one meaning of ``stream=None`` everywhere), and on the stream given when one is."""
    cfg = llm_config()
    mine = Stream.create(host)
    setup = create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg, stream=mine)
    E = toy_embedding(cfg.vocab_size, cfg.hidden_size)
    emb, lens = embed_batch(E, [[1, 2, 3]], np.float16)
    logits = setup.prefill(emb, lens)
    assert logits._last_stream is trtio._stream.as_stream(None, host)
    setup.decode(E[[4]][:, None, :].astype(np.float16), mine)
    assert logits._last_stream is mine
    setup.close()
    mine.close()


def test_graph_stats_read_alike_on_both_setups(host):
    """One type on both setups: per engine by role, and the sums as attributes."""
    cfg = llm_config()
    llm = create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg, graphs=True)
    E = toy_embedding(cfg.vocab_size, cfg.hidden_size)
    greedy_generate(llm, E, [[1, 2, 3]], 4)
    b, _bw, base, draft = _spec_pair("host")
    sd = create_for_spec_decode(base, draft, b, graphs=True)
    spec_generate(sd, E, [[1, 2, 3]], 6, depth=2, top_k=2)
    assert type(llm.graph_stats) is type(sd.graph_stats)
    assert list(llm.graph_stats) == ["llm"] and list(sd.graph_stats) == ["base", "draft"]
    assert llm.graph_stats.hits == llm.executor.graph_stats.hits > 0
    for field in ("hits", "captures", "misses", "graphs"):
        assert getattr(sd.graph_stats, field) == sum(getattr(g, field) for g in sd.graph_stats.values())
    assert sd.graph_stats.captures > 0
    llm.close()
    sd.close()


def test_base_prefill_continues_with_past_lengths_like_create_for_llm(host):
    """A prompt prefilled in two chunks (``past_lengths`` on the second, base and draft) gives the logits of
    one prefill of the whole prompt, and the same speculative round after it."""
    b, bw, base, draft = _spec_pair("host")
    E = toy_embedding(512, 64, 0)
    prompt = [7, 3, 99, 41, 5, 18, 260, 77]
    whole = create_for_spec_decode(base, draft, b)
    e, lens = embed_batch(E, [prompt], np.float16)
    want_base = whole.base_prefill(e, lens).to_numpy()
    shifted, _ = embed_batch(E, [prompt[1:] + [int(want_base.argmax(-1)[0])]], np.float16)
    want_draft = whole.draft_prefill(shifted, lens).to_numpy()
    chunked = create_for_spec_decode(*_spec_pair("host")[2:], b)
    first, rest = prompt[:5], prompt[5:]
    e1, l1 = embed_batch(E, [first], np.float16)
    chunked.base_prefill(e1, l1)
    chunked.draft_prefill(embed_batch(E, [prompt[1:6]], np.float16)[0], l1)
    e2, l2 = embed_batch(E, [rest], np.float16)
    got_base = chunked.base_prefill(e2, l2, past_lengths=[5]).to_numpy()
    np.testing.assert_allclose(got_base, want_base, atol=2e-3, rtol=2e-3)
    shifted2, _ = embed_batch(E, [prompt[6:] + [int(want_base.argmax(-1)[0])]], np.float16)
    got_draft = chunked.draft_prefill(shifted2, l2).to_numpy()
    np.testing.assert_allclose(got_draft, want_draft, atol=2e-3, rtol=2e-3)
    assert chunked.base_lengths.tolist() == chunked.draft_lengths.tolist() == [len(prompt)]
    with pytest.raises(ShapeError, match=r"past_lengths\[0\] = 9, but the cache of slot 0 holds 8 tokens"):
        chunked.base_prefill(e2, l2, past_lengths=[9])
    whole.close()
    chunked.close()
