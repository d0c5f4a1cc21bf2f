import ctypes

import numpy as np
import pytest
from _configs import bundle, llm_config

import trtio
from trtio import CapacityError, ClosedError, DType, FrozenError, Location, ShapeError, Tensor, TrtioError, names
from trtio._cuda.host import HostBackend
from trtio._memory import align_up
from trtio._pipeline_io import MEMBERS, STAGING_SLOTS, PipelineIO
from trtio._staging import RING_SLOTS

F16, BF16, F32, I32, I64 = DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.INT32, DType.INT64
D, P = "device", "pinned"
R = STAGING_SLOTS  # a staged member's private ring holds this many slots
EMPTY = None


class GarbageBackend(HostBackend):
    """Fresh allocations hold 0xAB bytes, so "zeroed at creation" is really checked."""

    def alloc(self, nbytes, location):
        ptr = super().alloc(nbytes, location)
        ctypes.memset(ptr, 0xAB, nbytes)
        return ptr


def _llm_table(b, s, h, v, act):
    return {
        "inputs_embeds": ((b, s, h), act, D), "output_logits": ((b, v), F32, D),
        "select_token_indices": ((b, 1), I64, D), "context_lengths": ((b,), I32, D),
        "host_context_lengths": ((b,), I32, P), "host_select_token_indices": ((b, 1), I64, P),
        "mrope_cos_sin": EMPTY, "base_hidden_states": EMPTY, "draft_hidden_states_in": EMPTY,
        "draft_hidden_states_out": EMPTY, "output_hidden_states": ((b, s, h), act, D),
        "packed_attention_mask": EMPTY, "spec_decode_position_ids": EMPTY,
    }


# name -> (config factory, expected members, expected deepstack list)
LLM_CASES = {
    "plain": (lambda: llm_config(), _llm_table(4, 64, 64, 512, F16), []),
    "deepstack3": (lambda: llm_config(num_attention_layers=3, num_deepstack_features=3),
                   _llm_table(4, 64, 64, 512, F16), [((4, 64, 64), F16, D)] * 3),
    "mrope": (lambda: llm_config(rope_type="mrope"),
              {**_llm_table(4, 64, 64, 512, F16), "mrope_cos_sin": ((4, 128, 16), F32, D)}, []),
    "bf16": (lambda: llm_config(activation_dtype="bfloat16", output_vocab_size=300),
             _llm_table(4, 64, 64, 300, BF16), []),
}


def _check(io, table, deepstack):
    for member, want in table.items():
        t = getattr(io, member)
        if want is EMPTY:
            assert t.capacity == 0 and t.data_ptr == 0, f"{member} should be absent"
        else:
            shape, dtype, loc = want
            assert (t.shape, t.dtype, str(t.location)) == (shape, dtype, loc), member
            assert t.capacity == dtype.nbytes(int(np.prod(shape))), member
            assert t.data_ptr % 256 == 0, member
    assert [(t.shape, t.dtype, str(t.location)) for t in io.deepstack_embeds] == deepstack


def _no_overlap(io):
    spans = sorted((t.data_ptr, t.data_ptr + t.capacity, t.name) for t in io._member_tensors() if t.capacity)
    for (_a0, a1, an), (b0, _b1, bn) in zip(spans, spans[1:]):
        assert a1 <= b0, f"{an} overlaps {bn}"


@pytest.mark.parametrize("case", sorted(LLM_CASES))
def test_create_for_llm_members(case, host):
    make, table, deepstack = LLM_CASES[case]
    before = host.alloc_count
    io = PipelineIO.create_for_llm(make(), backend=host)
    _check(io, table, deepstack)
    _no_overlap(io)
    assert host.alloc_count - before == 2, "one allocation per location (device, pinned)"
    io.close()


def _spec_table(b, seq, h, logits_rows, vocab, p, hb, hd):
    w = -(-p // 32)
    return {
        "inputs_embeds": ((b, seq, h), F16, D), "output_logits": ((logits_rows, vocab), F32, D),
        "select_token_indices": ((b, p), I64, D), "context_lengths": ((b,), I32, D),
        "host_context_lengths": ((b,), I32, P), "host_select_token_indices": ((b, 1), I64, P),
        "mrope_cos_sin": EMPTY, "base_hidden_states": ((b, seq, hb), F16, D),
        "draft_hidden_states_in": ((b, seq, hd), F16, D), "draft_hidden_states_out": ((b, seq, hd), F16, D),
        "output_hidden_states": EMPTY, "packed_attention_mask": ((b, p, w), I32, D),
        "spec_decode_position_ids": ((b, p), I32, D), "host_packed_attention_mask": ((b, p, w), I32, P),
        "host_spec_decode_position_ids": ((b, p), I32, P), "host_spec_select_token_indices": ((b, p), I64, P),
    }


SPEC_CASES = {
    # proposal (8) above verify (6): P = 8; inputs are the longer axis (64)
    "proposal_above_verify": (lambda: bundle(verify_size=6, max_verify=8, max_proposal=8, top_k=2, step=3),
                              None, _spec_table(4, 64, 64, 4 * 8, 600, 8, 64, 64)),
    # verify (40) above proposal (8): P = 40 > input lengths (32, 16); batch = min(4, 3)
    "proposal_below_verify": (lambda: bundle(verify_size=40, max_verify=40, max_proposal=8, top_k=2, step=3,
                                             base_input=32, draft_input=16, draft_batch=3),
                              None, _spec_table(3, 40, 64, 3 * 40, 600, 40, 64, 64)),
    "explicit_runtime_batch": (lambda: bundle(), 2, _spec_table(2, 64, 64, 2 * 8, 600, 8, 64, 64)),
}


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_create_for_spec_decode_members(case):
    be = GarbageBackend()
    make, runtime_batch, table = SPEC_CASES[case]
    io = PipelineIO.create_for_spec_decode(make(), runtime_batch, backend=be)
    _check(io, table, [])
    _no_overlap(io)
    for name in ("select_token_indices", "base_hidden_states", "draft_hidden_states_in",
                 "draft_hidden_states_out", "packed_attention_mask", "spec_decode_position_ids"):
        raw = getattr(io, name).view(DType.UINT8).to_numpy()
        assert not raw.any(), f"{name} must be zeroed at creation"
    assert be.alloc_count == 2
    io.close()
    assert be.live_allocations == 0


def test_spec_decode_runtime_batch_checked():
    with pytest.raises(ShapeError, match=r"max_runtime_batch_size must be an int in 1..4"):
        PipelineIO.create_for_spec_decode(bundle(), 5, backend="host")
    with pytest.raises(TrtioError, match="needs a DeploymentConfig with a draft"):
        PipelineIO.create_for_spec_decode(trtio._config.DeploymentConfig(llm_config()), backend="host")


def test_absent_features_allocate_nothing(host):
    io = PipelineIO.create_for_llm(llm_config(), backend=host)
    rep = io.memory_report()
    absent = [e for e in rep.entries if e.nbytes == 0]
    assert {e.name for e in absent} >= {"mrope_cos_sin", "base_hidden_states", "packed_attention_mask",
                                        "spec_decode_position_ids", "deepstack_zero"}
    assert sum(e.nbytes for e in rep.entries) == rep.total_required
    io.close()


def test_8b_class_config_wastes_at_most_one_percent(host):
    """hidden 4096, vocab 151936, batch 8, input 4096, 36 layers: alignment is the only overhead."""
    cfg = llm_config(hidden_size=4096, vocab_size=151936, max_supported_batch_size=8,
                     max_supported_input_length=4096, max_kv_cache_capacity=4096, num_attention_layers=36,
                     num_attention_heads=32, num_kv_heads=8, head_dim=128, rotary_dim=128)
    io = PipelineIO.create_for_llm(cfg, backend=host)
    rep = io.memory_report()
    # The decode step's device lengths: 8 int32 on the device, their pinned twin and a ring of upload slots.
    step_block = 8 * 4 + 8 * 4 + RING_SLOTS * align_up(8 * 4)
    # The embeddings and logits; then the token selection and the context lengths, each with its pinned twin (the
    # seed's host_* member) and its private ring of pinned staging slots.
    assert rep.total_required == (2 * 8 * 4096 * 4096 * 2) + 8 * 151936 * 4 + (2 + R) * 8 * 8 + (2 + R) * 8 * 4 + \
        step_block
    assert 1.0 <= rep.ratio <= 1.01
    io.close()


def test_bf16_activations_flow_through(host):
    ml = pytest.importorskip("ml_dtypes")
    io = PipelineIO.create_for_llm(llm_config(activation_dtype="bfloat16"), backend=host)
    x = np.linspace(-2, 2, 2 * 3 * 64).reshape(2, 3, 64).astype(ml.bfloat16)
    io.inputs_embeds.reshape((2, 3, 64)).copy_from(x)
    np.testing.assert_array_equal(io.inputs_embeds.to_numpy(), x)
    io.close()


# -- tensor maps -----------------------------------------------------------------------------

def test_llm_tensor_map(host):
    cfg = llm_config(num_attention_layers=3, num_deepstack_features=2, rope_type="mrope")
    io = PipelineIO.create_for_llm(cfg, backend=host)
    tm = io.build_tensor_map(cfg)
    assert tm[names.kInputsEmbeds] is io.inputs_embeds
    assert tm[names.kLogits] is io.output_logits
    assert tm[names.kLastTokenIds] is io.select_token_indices
    assert tm[names.kOutputHiddenStates] is io.output_hidden_states
    assert tm[names.kRopeCosSin] is io.mrope_cos_sin
    assert tm[names.deepstack_embeds(1)] is io.deepstack_zero, "deepstack starts on the zero buffer"
    assert names.kAttentionMask not in tm
    assert io.deepstack_zero.to_numpy().view(np.uint16).sum() == 0
    io.close()


def test_spec_decode_maps_share_buffers(host):
    b = bundle()
    io = PipelineIO.create_for_spec_decode(b, backend=host)
    base = io.build_tensor_map(b.base)
    draft = io.build_tensor_map_for_spec_decode_draft(b.draft)
    assert base[names.kOutputHiddenStates] is io.base_hidden_states
    assert draft[names.kBaseModelHiddenStates] is io.base_hidden_states, "draft reads base output, no copy"
    assert draft[names.kBaseModelHiddenStates].data_ptr == base[names.kOutputHiddenStates].data_ptr
    assert draft[names.kDraftModelHiddenStates] is io.draft_hidden_states_in
    assert draft[names.kOutputHiddenStates] is io.draft_hidden_states_out
    for n in (names.kInputsEmbeds, names.kLogits, names.kContextLengths, names.kLastTokenIds,
              names.kAttentionMask, names.kAttentionPosId):
        assert base[n] is draft[n]
    io.close()


def test_map_role_mismatches(host):
    b = bundle()
    io = PipelineIO.create_for_spec_decode(b, backend=host)
    with pytest.raises(TrtioError, match="is a draft"):
        io.build_tensor_map(b.draft)
    with pytest.raises(TrtioError, match="not a draft"):
        io.build_tensor_map_for_spec_decode_draft(b.base)
    with pytest.raises(TrtioError, match="is_spec_decode_base=False"):
        io.build_tensor_map(llm_config())
    io.close()
    llm = PipelineIO.create_for_llm(llm_config(), backend=host)
    with pytest.raises(TrtioError, match="created for a plain LLM"):
        llm.build_tensor_map_for_spec_decode_draft(b.draft)
    llm.close()


# -- the pointer-stability invariant ------------------------------------------------------------

@pytest.fixture
def frozen(host):
    cfg = llm_config(num_attention_layers=3, num_deepstack_features=2)
    io = PipelineIO.create_for_llm(cfg, backend=host)
    tm = io.build_tensor_map(cfg)
    yield io, tm
    io.close()


@pytest.mark.parametrize("member", [m for m in MEMBERS] + ["deepstack_zero"])
def test_reassigning_a_member_after_freeze(frozen, member):
    io, _ = frozen
    with pytest.raises(FrozenError, match=f"PipelineIO.{member} cannot be reassigned"):
        setattr(io, member, None)
    with pytest.raises(FrozenError):
        delattr(io, member)


@pytest.mark.parametrize("op", [
    lambda lst: lst.append(None), lambda lst: lst.extend([None]), lambda lst: lst.insert(0, None),
    lambda lst: lst.pop(),
    lambda lst: lst.remove(lst[0]), lambda lst: lst.clear(), lambda lst: lst.__setitem__(0, None),
    lambda lst: lst.__delitem__(0), lambda lst: lst.__iadd__([None]), lambda lst: lst.__imul__(2),
    lambda lst: lst.sort(key=id), lambda lst: lst.reverse(),
], ids=["append", "extend", "insert", "pop", "remove", "clear", "setitem", "delitem", "iadd", "imul",
        "sort", "reverse"])
def test_resizing_deepstack_after_freeze(frozen, op):
    io, _ = frozen
    before = list(io.deepstack_embeds)
    with pytest.raises(FrozenError, match="deepstack_embeds cannot change"):
        op(io.deepstack_embeds)
    assert list(io.deepstack_embeds) == before


def test_reallocating_after_freeze(frozen):
    io, _ = frozen
    with pytest.raises(FrozenError, match="inputs_embeds cannot be reallocated"):
        io.reallocate("inputs_embeds", (8, 64, 64))


def test_reallocate_before_freeze_moves_the_pointer(host):
    cfg = llm_config()
    io = PipelineIO.create_for_llm(cfg, backend=host)
    old = io.inputs_embeds.data_ptr
    new = io.reallocate("inputs_embeds", (8, 128, 64))
    assert new.data_ptr != old and io.inputs_embeds is new and new.shape == (8, 128, 64)
    assert any(e.name == "inputs_embeds" and e.nbytes == new.capacity for e in io.memory_report().entries)
    with pytest.raises(TrtioError, match="no tensor member 'nope'"):
        io.reallocate("nope", (1,))
    io.close()
    assert new.is_closed


def test_closing_a_bound_tensor_after_freeze(frozen):
    io, tm = frozen
    for t in (io.inputs_embeds, io.deepstack_embeds[0], io.deepstack_zero, tm[names.kLogits]):
        with pytest.raises(FrozenError, match="bound in a frozen tensor map"):
            t.close()
        assert not t.is_closed


def test_rebinding_a_frozen_map(frozen, host):
    io, tm = frozen
    other = Tensor.empty((1,), "int32", backend=host)
    with pytest.raises(FrozenError, match="rebinding 'logits'"):
        tm[names.kLogits] = other
    with pytest.raises(FrozenError, match="cannot be removed"):
        del tm[names.kLogits]
    tm.add("extra_binding", other)  # new names may still be added (the KV state does this)
    assert tm["extra_binding"] is other and other.is_frozen
    with pytest.raises(TrtioError, match="already bound"):
        tm.add("extra_binding", other)
    io.close()
    other._unfreeze()
    other.close()


def test_reshape_within_capacity_stays_allowed(frozen):
    io, _ = frozen
    ptr = io.inputs_embeds.data_ptr
    io.inputs_embeds.reshape((1, 5, 64))
    assert io.inputs_embeds.data_ptr == ptr
    with pytest.raises(CapacityError):
        io.inputs_embeds.reshape((5, 64, 64))


def test_deepstack_swap_is_the_sanctioned_rebinding(frozen):
    io, tm = frozen
    name = names.deepstack_embeds(1)
    g = tm.generation
    tm.use_deepstack_features()
    assert tm[name] is io.deepstack_embeds[1] and tm.uses_deepstack_features and tm.generation == g + 1
    tm.use_deepstack_features()  # no change, no new generation
    assert tm.generation == g + 1
    tm.use_deepstack_zero()
    assert tm[name] is io.deepstack_zero and tm.generation == g + 2


def test_close_frees_everything(host):
    live = host.live_allocations
    b = bundle()
    io = PipelineIO.create_for_spec_decode(b, backend=host)
    io.build_tensor_map(b.base)
    io.streaming_prefill.populate_from_prefill(io.inputs_embeds.reshape((1, 2, 64)),
                                               io.base_hidden_states.reshape((1, 2, 64)), 1, 2, 64, 2, 8)
    t = io.inputs_embeds
    io.close()
    io.close()
    assert host.live_allocations == live
    with pytest.raises(ClosedError):
        t.data_ptr
    with pytest.raises(ClosedError):
        io.build_tensor_map(b.base)


# -- host staging --------------------------------------------------------------------------------

class SlowEventBackend(HostBackend):
    """Events report "not ready" until synchronised, like an upload still in flight."""

    def __init__(self):
        super().__init__()
        self.done = set()
        self.event_syncs = 0
        self.all_done = False  # True: the device has run everything enqueued

    def record_event(self, event, stream):
        super().record_event(event, stream)
        self.done.discard(event)

    def query_event(self, event):
        super().query_event(event)
        return self.all_done or event in self.done

    def synchronize_event(self, event):
        super().synchronize_event(event)
        self.event_syncs += 1
        self.done.add(event)


def test_staging_uploads_values(host):
    io = PipelineIO.create_for_llm(llm_config(), backend=host)
    io.upload_context_lengths(np.array([3, 5, 7]))
    assert io.context_lengths.shape == (3,) and io.context_lengths.to_numpy().tolist() == [3, 5, 7]
    io.upload_select_token_indices(np.array([[2], [4], [6]]))
    assert io.select_token_indices.to_numpy().tolist() == [[2], [4], [6]]
    with pytest.raises(CapacityError, match="'context_lengths'"):
        io.upload_context_lengths(np.arange(5))
    io.close()


def test_restaging_waits_only_for_the_slot_it_reuses():
    """The staged members upload through a private ring of pinned slots: while the device has run none of the
    copies, R uploads go without a wait; the next one reuses the first slot and waits for its fence, once."""
    be = SlowEventBackend()
    io = PipelineIO.create_for_llm(llm_config(), backend=be)
    for i in range(R):
        io.upload_context_lengths(np.array([i, i + 1]))
    assert be.event_syncs == 0 and io.staging_fence_waits == 0, "a ring ahead of the device: no upload waits"
    io.upload_context_lengths(np.array([3, 4]))
    assert be.event_syncs == 1 and io.staging_fence_waits == 1, "pinned memory rewritten only after its upload"
    be.all_done = True  # uploads finished: restaging must not synchronise
    for _ in range(R):
        io.upload_context_lengths(np.array([5, 6]))
    assert be.event_syncs == 1
    assert io.context_lengths.to_numpy().tolist() == [5, 6]
    io.close()


def test_spec_tree_upload(host):
    b = bundle()
    io = PipelineIO.create_for_spec_decode(b, backend=host)
    mask = np.arange(2 * 5 * 1, dtype=np.int32).reshape(2, 5, 1)
    pos = np.arange(10, dtype=np.int32).reshape(2, 5)
    io.upload_tree(mask, pos)
    assert io.packed_attention_mask.shape == (2, 5, 1)
    np.testing.assert_array_equal(io.packed_attention_mask.to_numpy(), mask)
    np.testing.assert_array_equal(io.spec_decode_position_ids.to_numpy(), pos)
    io.upload_select_token_indices(np.array([[0, 1, 2], [1, 2, 3]]))
    assert io.select_token_indices.to_numpy().tolist() == [[0, 1, 2], [1, 2, 3]]
    io.close()
    llm = PipelineIO.create_for_llm(llm_config(), backend=host)
    with pytest.raises(TrtioError, match="no tree buffers"):
        llm.upload_tree(mask, pos)
    llm.close()


# -- streaming prefill ---------------------------------------------------------------------------

def test_streaming_prefill_lazy_allocation_and_copies(host):
    cfg = llm_config(activation_dtype="bfloat16")
    io = PipelineIO.create_for_llm(cfg, backend=host)
    sp = io.streaming_prefill
    assert not sp.is_allocated and sp.input_embeds.is_empty
    with pytest.raises(TrtioError, match="has not been called"):
        sp.ready_event
    live_in = io.inputs_embeds.reshape((2, 5, 64))
    live_h = io.output_hidden_states.reshape((2, 5, 64))
    live_in.view(DType.UINT8).copy_from(np.arange(2 * 5 * 128, dtype=np.uint8).reshape(2, 5, 128))
    live_h.fill_(0.5)
    before = host.alloc_count
    sp.populate_from_prefill(live_in, live_h, 2, 5, 64, 4, 64)
    assert host.alloc_count == before + 1, "allocated once, at the worst case"
    assert sp.input_embeds.capacity == 4 * 64 * 64 * 2 and sp.input_embeds.dtype is DType.BFLOAT16
    assert sp.input_embeds.shape == (2, 5, 64)
    np.testing.assert_array_equal(sp.input_embeds.view(DType.UINT8).to_numpy(), live_in.view(DType.UINT8).to_numpy())
    live_h.fill_(1.0)  # the decode loop overwrites the live buffer; the snapshot keeps prefill's bytes
    assert (sp.engine_hidden_states.to_numpy().astype(np.float32) == 0.5).all()
    ptr = sp.input_embeds.data_ptr
    sp.populate_from_prefill(io.inputs_embeds.reshape((1, 3, 64)), io.output_hidden_states.reshape((1, 3, 64)),
                             1, 3, 64, 4, 64)
    assert host.alloc_count == before + 1 and sp.input_embeds.data_ptr == ptr and sp.input_embeds.shape == (1, 3, 64)
    assert "streaming.input_embeds" in {e.name for e in io.memory_report().entries}
    io.close()


def test_streaming_prefill_errors(host):
    io = PipelineIO.create_for_llm(llm_config(), backend=host)
    sp = io.streaming_prefill
    live_in = io.inputs_embeds.reshape((2, 5, 64))
    live_h = io.output_hidden_states.reshape((2, 4, 64))
    with pytest.raises(ShapeError,
                       match=r"live_engine_hidden_states .* has shape \(2, 4, 64\), expected .* \(2, 5, 64\)"):
        sp.populate_from_prefill(live_in, live_h, 2, 5, 64, 4, 64)
    live_h.reshape((2, 5, 64))
    sp.populate_from_prefill(live_in, live_h, 2, 5, 64, 2, 8)
    big_in = io.inputs_embeds.reshape((3, 5, 64))
    big_h = io.output_hidden_states.reshape((3, 5, 64))
    with pytest.raises(CapacityError, match="exceeds the allocation made on the first call"):
        sp.populate_from_prefill(big_in, big_h, 3, 5, 64, 4, 64)
    io.close()
    io2 = PipelineIO.create_for_llm(llm_config(), backend=host)
    with pytest.raises(CapacityError, match="exceeds the worst case"):
        io2.streaming_prefill.populate_from_prefill(io2.inputs_embeds.reshape((2, 5, 64)),
                                                    io2.output_hidden_states.reshape((2, 5, 64)), 2, 5, 64, 1, 64)
    io2.close()


# -- streaming prefill across streams, on a GPU -----------------------------------------------------

def _streaming_run(cuda, iterations, consumer_waits):
    """Producer: a long kernel writes value i into the live buffers, the snapshot is taken, and
    a second long kernel overwrites the live buffers (the decode loop). Consumer, on another
    stream: reads the snapshot. Returns the number of corrupted snapshots seen."""
    torch = pytest.importorskip("torch")
    from trtio import Stream

    cfg = llm_config(hidden_size=1024, max_supported_input_length=256, max_kv_cache_capacity=256)
    io = PipelineIO.create_for_llm(cfg, backend=cuda)
    producer, consumer = Stream.create(cuda), Stream.create(cuda)
    shape = (4, 256, 1024)
    live_in = io.inputs_embeds.reshape(shape)
    live_h = io.output_hidden_states.reshape(shape)
    out = Tensor.empty(shape, "float16", Location.PINNED, backend=cuda)
    sp = io.streaming_prefill
    torch_producer = torch.cuda.ExternalStream(producer.handle)
    corrupted = 0
    for i in range(iterations):
        value = float(i % 1000)
        with torch.cuda.stream(torch_producer):
            torch.cuda._sleep(5_000_000)  # a long kernel (~2.5 ms) before the prefill results exist
        live_in.fill_(value, producer)
        live_h.fill_(value, producer)
        sp.populate_from_prefill(live_in, live_h, *shape, 4, 256, producer)
        with torch.cuda.stream(torch_producer):
            torch.cuda._sleep(5_000_000)  # the decode loop: long, and then it overwrites the live buffers
        live_in.fill_(-1.0, producer)
        live_h.fill_(-1.0, producer)
        if consumer_waits:
            sp.ready_event.wait(consumer)
        # The consumer reads the raw pointer, as a foreign library (torch, a Talker kernel) would:
        # nothing but ready_event orders it after the snapshot copies.
        snap = sp.engine_hidden_states
        cuda.memcpy(out.data_ptr, snap.data_ptr, snap.nbytes, consumer.handle)
        sp.release(consumer)
        consumer.synchronize()
        got = np.asarray(out).view(np.float16)
        if not (got == value).all():
            corrupted += 1
        producer.synchronize()
    out.close()
    io.close()
    producer.close()
    consumer.close()
    return corrupted


@pytest.mark.gpu
def test_streaming_snapshot_consumer_never_sees_corruption(cuda):
    assert _streaming_run(cuda, 200, consumer_waits=True) == 0


@pytest.mark.gpu
def test_streaming_snapshot_without_the_wait_can_fail(cuda):
    """The same run without waiting on ready_event does see corrupted snapshots: the test has teeth."""
    assert _streaming_run(cuda, 20, consumer_waits=False) > 0


# -- the seed's members keep the seed's meaning -----------------------------------------------------------


def test_the_seeds_host_members_are_pinned_twins_of_max_batch_and_keep_what_was_staged(host):
    """``host_context_lengths`` is a pinned [maxBatch] int32 tensor and ``host_select_token_indices`` a pinned
    [maxBatch, 1] int64 one, as in the seed; each holds the values last staged into its device member (the ring
    they are staged through is private)."""
    io = PipelineIO.create_for_llm(llm_config(), backend=host)
    b = io.max_batch
    assert (io.host_context_lengths.shape, io.host_context_lengths.dtype, io.host_context_lengths.location) == \
        ((b,), I32, trtio.Location.PINNED)
    assert (io.host_select_token_indices.shape, io.host_select_token_indices.dtype,
            io.host_select_token_indices.location) == ((b, 1), I64, trtio.Location.PINNED)
    io.upload_context_lengths(np.array([3, 5, 7]))
    io.upload_select_token_indices(np.array([[2], [4], [6]]))
    assert io.host_context_lengths.to_numpy()[:3].tolist() == [3, 5, 7]
    assert io.host_select_token_indices.to_numpy()[:3, 0].tolist() == [2, 4, 6]
    assert io.host_context_lengths.shape == (b,), "the seed's shape stays: staging reshapes the device member only"
    assert not any(name.startswith("ring_") for name in io.members), "the rings are private"
    io.close()


def test_members_the_ragged_contract_does_not_use_say_so(host):
    io = PipelineIO.create_for_llm(llm_config(contract="ragged", kv_page_size=16, kv_pool_pages=0), backend=host)
    for name in ("context_lengths", "host_context_lengths", "select_token_indices", "host_select_token_indices"):
        with pytest.raises(trtio.NotAvailableError, match=f"PipelineIO.{name} is not used by the ragged contract"):
            getattr(io, name)
        assert not hasattr(io, name)
    with pytest.raises(trtio.NotAvailableError, match="no attribute 'no_such_member'"):
        io.no_such_member  # noqa: B018
    assert io.inputs_embeds.shape[0] > 0, "the members it uses are there"
    io.close()
