"""EngineIO, ContextMemory and EngineExecutor against the ReferenceEngine (host backend)."""

import numpy as np
import pytest
from _configs import bundle, llm_config

from trtio import BindingError, ClosedError, DType, EngineError, Location, Stream, Tensor, names
from trtio._contracts import build_registry
from trtio._engine import ContextMemory, EngineExecutor, EngineIO
from trtio._pipeline_io import PipelineIO
from trtio._state import EngineState
from trtio._tensor_map import TensorMap
from trtio.testing import ReferenceEngine
from trtio.testing.reference_engine import TensorLocation


def _engine(cfg=None, **kw):
    return ReferenceEngine.from_config(cfg or llm_config(), device="host", **kw)


class HostLocatedContextLengths(ReferenceEngine):
    """An engine that wants context_lengths on the host (a shape-tensor-like input)."""

    __module__ = ReferenceEngine.__module__  # trtio finds TensorRT's enums through the engine's module

    def get_tensor_location(self, name):
        if name == names.kContextLengths:
            return TensorLocation.HOST
        return super().get_tensor_location(name)


class NoAliasApi(ReferenceEngine):
    """An engine without get_aliased_input_tensor (TensorRT before 10.15)."""

    __module__ = ReferenceEngine.__module__

    def __getattribute__(self, name):
        if name == "get_aliased_input_tensor":
            raise AttributeError(name)
        return super().__getattribute__(name)


class FalseExecute(ReferenceEngine):
    __module__ = ReferenceEngine.__module__

    def create_execution_context(self, *a, **k):
        ctx = super().create_execution_context(*a, **k)
        ctx.execute_async_v3 = lambda stream: False
        return ctx


# -- EngineIO ---------------------------------------------------------------------------------------

def test_engine_io_describes_every_tensor():
    cfg = llm_config()
    eio = EngineIO.from_engine(_engine(cfg))
    assert [t.index for t in eio.tensors] == list(range(len(eio.tensors)))
    emb = eio[names.kInputsEmbeds]
    assert emb.mode == "input" and emb.dtype is DType.FLOAT16 and emb.shape == (-1, -1, 64)
    assert emb.location is Location.DEVICE and not emb.is_shape_tensor
    assert emb.profiles[0] == ((1, 1, 64), (4, 32, 64), (4, 64, 64))
    assert emb.profiles[1] == ((1, 1, 64), (4, 1, 64), (4, 1, 64))
    logits = eio[names.kLogits]
    assert logits.mode == "output" and logits.dtype is DType.FLOAT32 and logits.profiles == ()
    assert eio[names.present_k_cache(1)].aliased_input == names.k_cache(1)
    assert eio.state_pairs() == [
        (names.k_cache(0), names.present_k_cache(0)), (names.v_cache(0), names.present_v_cache(0)),
        (names.k_cache(1), names.present_k_cache(1)), (names.v_cache(1), names.present_v_cache(1))]
    assert eio[names.k_cache(0)].max_shape() == (4, 2, 128, 16)
    assert eio[names.k_cache(0)].max_bytes() == 4 * 2 * 128 * 16 * 2
    d = eio.to_dict()
    assert d["num_profiles"] == 2 and d["tensors"][0]["name"] == names.kInputsEmbeds
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        eio["nope"]


def test_alias_falls_back_to_the_present_naming_convention():
    eio = EngineIO.from_engine(NoAliasApi.from_config(llm_config(), device="host"))
    assert eio[names.present_v_cache(0)].aliased_input == names.v_cache(0)
    assert eio[names.kLogits].aliased_input is None


# -- context memory ------------------------------------------------------------------------------------

def test_context_memory_is_sized_for_every_engine_and_profile():
    b = bundle()
    base, draft = _engine(b.base), _engine(b.draft)
    mem = ContextMemory.for_engines([base, draft], backend="host")
    need = max(ContextMemory.required_bytes(base), ContextMemory.required_bytes(draft))
    assert mem.nbytes == need and mem.ptr % 512 == 0
    ex_base = EngineExecutor(base, context_memory=mem, backend="host")
    ex_draft = EngineExecutor(draft, context_memory=mem, backend="host")
    assert ex_base.context.calls["set_device_memory"] == 1 and ex_draft.context_memory is mem
    ex_base.close()
    ex_draft.close()
    mem.close()


def test_context_memory_too_small_names_engine_and_sizes():
    eng = _engine()
    small = ContextMemory(1024, backend="host")
    with pytest.raises(EngineError,
                       match=r"context memory of 1024 bytes is too small for engine 'toy-llm', which needs \d+ bytes"):
        EngineExecutor(eng, context_memory=small, backend="host")
    small.close()


# -- the executor ------------------------------------------------------------------------------------

@pytest.fixture
def llm():
    cfg = llm_config()
    eng = _engine(cfg)
    io = PipelineIO.create_for_llm(cfg, backend="host")
    tm = io.build_tensor_map(cfg)
    state = EngineState(EngineIO.from_engine(eng), max_batch=4, backend="host")
    state.bind(tm)
    rope = Tensor.from_numpy(np.zeros((1, 128, 16), np.float32), backend="host")
    tm.add(names.kRopeCosSin, rope)
    ex = EngineExecutor(eng, registry=build_registry(cfg).merged(state.specs()), stable=state.stable_names(),
                        backend="host")
    yield cfg, io, tm, state, ex
    ex.close()
    io.close()
    state.close()
    rope._unfreeze()
    rope.close()


def test_prepare_binds_views_from_the_dims(llm):
    cfg, io, tm, state, ex = llm
    s = Stream.create("host")
    state.upload_start_index(np.zeros(3, np.int32), s)
    io.upload_context_lengths(np.array([4, 4, 4]), s)
    ex.prepare(0, tm, cfg.prefill_dims(3, 4, kv_cache_empty=False), s)
    assert io.inputs_embeds.shape == (3, 4, 64) and io.output_logits.shape == (3, 512)
    assert ex.context.get_tensor_address(names.kInputsEmbeds) == io.inputs_embeds.data_ptr
    assert tuple(ex.context.get_tensor_shape(names.kLogits)) == (3, 512)
    assert ex.context.get_tensor_address(names.present_k_cache(0)) == ex.context.get_tensor_address(names.k_cache(0))
    s.close()


def test_one_binding_error_lists_every_problem(llm):
    cfg, io, tm, state, ex = llm
    broken = TensorMap("broken")
    for n in tm.names():
        if n not in (names.kContextLengths, names.kLogits, names.kLastTokenIds, names.k_cache(1)):
            broken.set(n, tm[n])
    wrong_dtype = Tensor.empty((4, 1), "int32", name="ids32", backend="host")
    broken.set(names.kLastTokenIds, wrong_dtype)
    small = Tensor.empty((2, 10), "float32", name="tiny_logits", backend="host")
    broken.set(names.kLogits, small)
    other_cache = Tensor.empty((4, 2, 128, 16), "float16", name="other_cache", backend="host")
    broken.set(names.k_cache(1), other_cache)
    with pytest.raises(BindingError) as info:
        ex.prepare(0, broken, cfg.prefill_dims(4, 64), None)
    msg = str(info.value)
    problems = info.value.problems
    assert "context_lengths: unbound engine input (int32 [-1]); tensor map 'broken' has no such entry" in msg
    assert any("last_token_ids: dtype int32 (tensor 'ids32') but the engine input is int64" in p for p in problems)
    assert any(p.startswith("logits: shape [4, 512] needs 8192 bytes but tensor 'tiny_logits' holds 80 bytes")
               for p in problems)
    assert any("present_k_cache_1: updates k_cache_1 in place, so both must be bound to one address" in p
               for p in problems)
    assert len(problems) >= 4, "every problem is reported, not just the first"
    for t in (wrong_dtype, small, other_cache):
        t.close()


def test_out_of_profile_shape_names_the_range(llm):
    cfg, io, tm, state, ex = llm
    with pytest.raises(BindingError) as info:
        ex.prepare(1, tm, cfg.prefill_dims(2, 5), None)  # a 5-token step on the decode profile
    msg = str(info.value)
    assert "inputs_embeds: shape [2, 5, 64] is outside profile 1's range min [1, 1, 64] .. max [4, 1, 64]" in msg
    with pytest.raises(BindingError, match="profile 7 does not exist"):
        ex.prepare(7, tm, cfg.decode_dims(1), None)


def test_location_mismatch():
    cfg = llm_config()
    eng = HostLocatedContextLengths.from_config(cfg, device="host")
    io = PipelineIO.create_for_llm(cfg, backend="host")
    tm = io.build_tensor_map(cfg)
    ex = EngineExecutor(eng, registry=build_registry(cfg), backend="host")
    want = r"context_lengths: location device \(tensor 'context_lengths'\) but the engine input lives on the host"
    with pytest.raises(BindingError, match=want):
        ex.prepare(0, tm, cfg.prefill_dims(1, 1), None)
    ex.close()
    io.close()


def test_unused_reports_map_entries_the_engine_lacks(llm):
    cfg, io, tm, state, ex = llm
    extra = Tensor.empty((4,), "int32", backend="host")
    tm.add("vision_block_ids", extra)
    assert ex.unused(tm) == ["vision_block_ids"]


def test_profile_switch_and_set_calls_only_on_change(llm):
    cfg, io, tm, state, ex = llm
    s = Stream.create("host")
    ctx = ex.context
    state.upload_start_index(np.zeros(2, np.int32), s)
    ex.prepare(0, tm, cfg.prefill_dims(2, 3, kv_cache_empty=False), s)
    assert ctx.calls["set_optimization_profile_async"] == 1
    state.upload_start_index(np.array([3, 3], np.int32), s)
    decode = cfg.decode_dims(2)
    ex.prepare(1, tm, decode, s)
    assert ctx.calls["set_optimization_profile_async"] == 2
    before = dict(ctx.calls)
    for _ in range(5):
        ex.prepare(1, tm, decode, s)
    assert ctx.calls == before, "an unchanged step makes no TensorRT call"
    ex.prepare(1, tm, cfg.decode_dims(3), s)  # batch change: only shapes change, addresses stay
    assert ctx.calls["set_optimization_profile_async"] == 2
    assert ctx.calls["set_tensor_address"] == before["set_tensor_address"]
    assert ctx.calls["set_input_shape"] > before["set_input_shape"]
    s.close()


def test_execute_errors(llm):
    cfg, io, tm, state, ex = llm
    with pytest.raises(EngineError, match="execute\\(\\) before a successful prepare"):
        ex.execute()
    eng = FalseExecute.from_config(cfg, device="host")
    bad = EngineExecutor(eng, registry=build_registry(cfg).merged(state.specs()), backend="host")
    state.upload_start_index(np.zeros(1, np.int32))
    bad.prepare(0, tm, cfg.prefill_dims(1, 1, kv_cache_empty=False))
    with pytest.raises(EngineError, match="execute_async_v3 returned False"):
        bad.execute()
    bad.close()
    ex.close()
    with pytest.raises(ClosedError, match=rf"^executor {ex.name!r} is closed$"):
        ex.prepare(0, tm, cfg.prefill_dims(1, 1))


def test_graphs_are_destroyed_on_close(llm, host):
    cfg, io, tm, state, ex = llm
    live = host.live_graphs
    ex.graphs_enabled = True
    s = Stream.create("host")
    state.upload_start_index(np.zeros(1, np.int32), s)
    io.upload_context_lengths(np.array([1]), s)
    io.upload_select_token_indices(np.zeros((1, 1)), s)
    ex.prepare(1, tm, cfg.decode_dims(1), s)
    ex.execute(s)
    ex.execute(s)
    assert ex.graph_stats.captures == 1 and ex.graph_stats.hits == 1 and host.live_graphs == live + 1
    assert ex.graph_stats.last_miss_reason == "first capture"
    ex.close()
    assert host.live_graphs == live
    s.close()


class NotCapturable(ReferenceEngine):
    """A context that reports its stream is not capturable (TensorRT-RTX without user allocation)."""

    __module__ = ReferenceEngine.__module__

    def create_execution_context(self, *a, **k):
        ctx = super().create_execution_context(*a, **k)
        ctx.is_stream_capturable = lambda stream: False
        return ctx


def test_an_uncapturable_context_runs_plainly_and_says_why(host):
    from trtio._setups import create_for_llm
    from trtio.testing import toy_embedding
    from trtio.testing.toy_runtime import greedy_generate

    cfg = llm_config()
    E = toy_embedding(cfg.vocab_size, cfg.hidden_size)
    graphs_before = host.live_graphs
    with create_for_llm(NotCapturable.from_config(cfg, device="host"), cfg, graphs=True) as setup:
        got = greedy_generate(setup, E, [[1, 2, 3], [4, 5]], 5)
        stats = setup.graph_stats
        assert stats.captures == 0 and stats.graphs == 0 and host.live_graphs == graphs_before
        assert stats.misses == 1, "one decode snapshot: refused once, then plain execution without retrying"
        assert "not captured: the execution context reports the stream is not capturable" in stats.last_miss_reason
    with create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg, graphs=True) as plain:
        assert greedy_generate(plain, E, [[1, 2, 3], [4, 5]], 5) == got


def test_a_plan_switch_sets_every_view_the_step_needs(llm):
    """Switching back to a plan sets the views that differ from the plan held before; where a view was changed
    by hand since (the executor's view log moved on), also those the two plans share."""
    cfg, io, tm, state, ex = llm
    s = Stream.create("host")
    state.upload_start_index(np.zeros(2, np.int32), s)
    io.upload_context_lengths(np.array([4, 4]), s)
    prefill, decode = cfg.prefill_dims(2, 3, kv_cache_empty=False), cfg.decode_dims(2)
    for dims in (prefill, decode, prefill, decode):
        ex.prepare(1 if dims is decode else 0, tm, dims, s)
    ctx_shape = io.context_lengths.shape  # alike in both plans
    assert io.inputs_embeds.shape == (2, 1, 64)
    ex.prepare(0, tm, prefill, s)  # nothing changed by hand since the decode plan set its views
    assert io.inputs_embeds.shape == (2, 3, 64) and io.context_lengths.shape == ctx_shape
    ex.prepare(1, tm, decode, s)
    io.context_lengths.reshape((1,))  # by hand, between two steps
    ex.prepare(0, tm, prefill, s)
    assert io.inputs_embeds.shape == (2, 3, 64) and io.context_lengths.shape == ctx_shape
    s.close()


def test_every_view_is_the_plan_s_after_each_switch_between_plans(llm):
    """Switching between three plans in every order, with views changed by hand in between: after each prepare,
    every binding's tensor has the view (shape and bytes) its registry spec resolves to for the step's dims."""
    import math

    cfg, io, tm, state, ex = llm
    s = Stream.create("host")
    state.upload_start_index(np.zeros(3, np.int32), s)
    io.upload_context_lengths(np.array([4, 4, 4]), s)
    plans = [(0, cfg.prefill_dims(2, 3, kv_cache_empty=False)), (1, cfg.decode_dims(2)), (1, cfg.decode_dims(3)),
             (0, cfg.prefill_dims(3, 5, kv_cache_empty=False))]
    order = [0, 1, 2, 3, 1, 0, 2, 1, 3, 0, 0, 2, 3, 2, 1]
    checked = 0
    for n, i in enumerate(order * 2):
        profile, dims = plans[i]
        if n >= len(order) and n % 3 == 0:  # the second time round: views changed by hand between the steps
            io.inputs_embeds.reshape((1, 1, 64))
            io.context_lengths.reshape((1,))
        ex.prepare(profile, tm, dims, s)
        for name in ex.io.names():
            spec = ex.registry.get(name)
            if spec is None:
                continue
            t, want = tm[name], spec.resolve(dims)
            assert (t.shape, t.nbytes) == (want, t.dtype.nbytes(math.prod(want))), (n, name)
            checked += 1
    assert checked > 10 * len(order)
    s.close()


def test_the_step_switched_to_last_is_found_again_only_for_its_tensor_map_and_while_it_is_kept(llm):
    """A round alternates steps: the plan the last switch from the held plan went to is found again without the
    key's look-up, but only for the same tensor map generation (a rebinding makes a new plan, bound to the new
    tensor) and while the executor keeps that plan (one forgotten as the oldest is checked and made again)."""
    cfg, io, tm, state, ex = llm
    s = Stream.create("host")
    state.upload_start_index(np.zeros(4, np.int32), s)
    io.upload_context_lengths(np.array([4, 4, 4, 4]), s)
    io.upload_select_token_indices(np.zeros((2, 1)), s)
    prefill, decode = cfg.prefill_dims(2, 3, kv_cache_empty=False), cfg.decode_dims(2)
    for dims in (prefill, decode, prefill, decode, prefill):
        ex.prepare(1 if dims is decode else 0, tm, dims, s)
    first_decode = ex._plans[(1, decode, id(tm), tm.generation)]
    rope, plain = Tensor.from_numpy(np.zeros((1, 128, 16), np.float32), backend="host"), tm[names.kRopeCosSin]
    tm._unfreeze()
    tm.set(names.kRopeCosSin, rope)  # a rebinding: the tensor map's generation moves on
    ex.prepare(1, tm, decode, s)
    ex.execute(s)
    assert ex.context.get_tensor_address(names.kRopeCosSin) == rope.data_ptr
    for dims in (prefill, decode, prefill):
        ex.prepare(1 if dims is decode else 0, tm, dims, s)
    kept = ex._plans[(1, decode, id(tm), tm.generation)]
    assert kept is not first_decode
    for b in range(1, 5):  # 32 other steps: the decode plan, older than the prefill's, is forgotten
        for seq in range(1, 9):
            ex.prepare(0, tm, cfg.prefill_dims(b, seq, kv_cache_empty=False), s)
    ex.prepare(0, tm, prefill, s)
    assert kept.dropped and not ex._plan.dropped
    ex.prepare(1, tm, decode, s)
    assert ex._plan is not kept and ex._plan is ex._plans[(1, decode, id(tm), tm.generation)]
    assert io.inputs_embeds.shape == (2, 1, 64)
    s.synchronize()
    s.close()
    tm.set(names.kRopeCosSin, plain)
    tm.freeze()
    ex.close()  # it bound `rope`
    rope.close()


def test_equal_work_before_a_step_replays_its_graph(llm):
    """The graph of a step and the device work before it is found again for the same work (by identity) and
    for equal work made afresh (by value): no second capture."""
    from trtio._ops import Zero

    cfg, io, tm, state, ex = llm
    s = Stream.create("host")
    state.upload_start_index(np.zeros(2, np.int32), s)
    io.upload_context_lengths(np.array([4, 4]), s)
    io.upload_select_token_indices(np.zeros((2, 1)), s)
    ex.graphs_enabled = True
    scratch = Tensor.empty((16,), "int32", backend="host")
    decode = cfg.decode_dims(2)
    works = [(Zero(scratch, 16),), (Zero(scratch, 32),)]
    for work in works * 2:
        ex.prepare(1, tm, decode, s)
        ex.execute(s, before=work)
    assert ex.graph_stats.captures == 2
    for work in works + [(Zero(scratch, 16),), (Zero(scratch, 32),)]:  # equal work, new objects
        ex.prepare(1, tm, decode, s)
        ex.execute(s, before=work)
    assert (ex.graph_stats.captures, ex.graph_stats.hits) == (2, 6)
    s.synchronize()
    scratch.close()
    s.close()
