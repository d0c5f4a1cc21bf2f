"""Reliability (issue 12): lifetimes, bad input and leaks, on both contracts and both setups.

Most of the issue's cases have their test beside the module they concern (test_tensor, test_stream,
test_config, test_lifetime, test_setups, test_setups_ragged, test_threads); this file holds the rest,
their siblings, and the leak tests: many create / step / close cycles, and setups dropped without
``close()``, must leave the backend's live allocations, graphs, events and streams at their baseline.

Every refusal of a step is checked to happen before any work is enqueued (the host backend counts
device operations).
"""

from __future__ import annotations

import contextlib
import gc
import math
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _configs import TINY, bundle, llm_config, tiny_bundle, tiny_llm

import trtio
from trtio import (
    ClosedError,
    ConfigError,
    CudaError,
    DeploymentConfig,
    FrozenError,
    InvalidValueError,
    LLMEngineConfig,
    Location,
    ShapeError,
    Stream,
    Tensor,
    TrtioError,
    names,
)
from trtio._cuda.backend import Backend
from trtio._cuda.host import HostBackend
from trtio._engine import ContextMemory, EngineExecutor, EngineIO
from trtio._memory import Arena, TensorRequest
from trtio._pipeline_io import PipelineIO
from trtio._setups import LLMSetup
from trtio._state import EngineState
from trtio._tensor_map import TensorMap
from trtio._trees import ancestor_mask
from trtio.edgellm import EngineDir
from trtio.testing import ReferenceEngine, toy_embedding
from trtio.testing.toy_runtime import embed_batch, greedy_generate, spec_generate

CONTRACTS = ["batch", "ragged"]
SETUPS = ["llm-batch", "llm-ragged", "spec-batch", "spec-ragged"]
PROMPTS = [[1, 2, 3], [4, 5, 6, 7]]
E = toy_embedding(32, 16)


class Factory:
    """Setups of one kind ("llm-batch", "spec-ragged", ...) over engines made once (as with TensorRT: one
    engine, an execution context per setup), and a few steps that capture graphs."""

    def __init__(self, kind: str, device: str = "host") -> None:
        self.kind = kind
        role, contract = kind.split("-")
        self.spec = role == "spec"
        if self.spec:
            self.bundle = tiny_bundle(contract)
            self.engines = (ReferenceEngine.from_config(self.bundle.base, device=device),
                            ReferenceEngine.from_config(self.bundle.draft, device=device))
        else:
            self.cfg = tiny_llm(contract)
            self.engine = ReferenceEngine.from_config(self.cfg, device=device)

    def create(self, backend: Backend, *, graphs: bool = True) -> Any:
        if self.spec:
            return trtio.create_for_spec_decode(*self.engines, self.bundle, graphs=graphs, backend=backend)
        return trtio.create_for_llm(self.engine, self.cfg, graphs=graphs, backend=backend)

    def step(self, setup: Any) -> list[list[int]]:
        """A prefill and decode steps (LLM), or a spec-decode round and a half (spec)."""
        if self.spec:
            return spec_generate(setup, E, PROMPTS, 3)[0]
        return greedy_generate(setup, E, PROMPTS, 2)  # prefill + one decode step (captured)


def _refused(host: Backend, error: type[Exception], match: str, fn: Callable[..., Any], *args: Any,
             **kwargs: Any) -> None:
    """``fn(*args, **kwargs)`` raises ``error`` matching ``match`` before enqueueing any device work."""
    ops = host.op_count  # type: ignore[attr-defined]
    with pytest.raises(error, match=match):
        fn(*args, **kwargs)
    assert host.op_count == ops, "nothing may be enqueued before the error"  # type: ignore[attr-defined]


# -- lifetimes: nothing a live setup binds can be freed under it ---------------------------------------


@pytest.mark.parametrize("kind", SETUPS)
def test_the_parts_of_a_live_setup_refuse_to_close_even_before_its_first_step(host: Backend,
                                                                            kind: str) -> None:
    """Its PipelineIO, each engine's state and the context memory are bound from creation on: closing one
    under the setup would leave the engine (or a graph captured later) writing to freed memory."""
    factory = Factory(kind)
    live = host.live_allocations
    setup = factory.create(host)
    roles = [e.role for e in setup.engines()]
    with pytest.raises(FrozenError, match=rf"PipelineIO is bound by open executor\(s\) {re.escape(str(roles))}"):
        setup.io.close()
    for e in setup.engines():
        with pytest.raises(FrozenError, match=rf"engine state '{e.role}' is bound by open executor\(s\) "
                                              rf"\['{e.role}'\]"):
            e.state.close()
        with pytest.raises(FrozenError, match=rf"context memory 'context_memory' is used by open executor\(s\) "
                                              rf"{re.escape(str(sorted(roles)))}.*close the executors \(or the "
                                              rf"setup\) first"):
            e.executor.context_memory.close()
    assert not setup.io.is_closed and not any(e.state.is_closed or e.executor.context_memory.is_closed
                                              for e in setup.engines())
    fresh = factory.create(host)
    assert factory.step(setup) == factory.step(fresh), "nothing was freed: the setup still gives the same tokens"
    fresh.close()
    setup.close()
    assert setup.io.is_closed and all(e.state.is_closed and e.executor.context_memory.is_closed
                                      for e in setup.engines())
    assert host.live_allocations == live


def test_context_memory_refuses_to_close_under_an_open_executor(host: Backend) -> None:
    eng = ReferenceEngine.from_config(llm_config(), device="host")
    mem = ContextMemory.for_engines([eng], backend=host)
    a = EngineExecutor(eng, context_memory=mem, name="a", backend=host)
    b = EngineExecutor(eng, context_memory=mem, name="b", backend=host)
    with pytest.raises(FrozenError, match=r"context memory 'context_memory' is used by open executor\(s\) "
                                          r"\['a', 'b'\]"):
        mem.close()
    a.close()
    del b  # an executor dropped without close() no longer uses it
    gc.collect()
    mem.close()
    mem.close()  # idempotent
    assert mem.is_closed and "closed" in repr(mem)
    with pytest.raises(ClosedError, match="context memory 'context_memory' is closed"):
        EngineExecutor(eng, context_memory=mem, backend=host)
    with pytest.raises(ClosedError, match="context memory 'context_memory' is closed"):
        mem.report()


def test_memory_an_executor_bound_through_a_map_of_its_own_is_not_freed_under_it(host: Backend) -> None:
    """A user's own (unfrozen) tensor map over a PipelineIO, a state, an arena of their own, a tensor of
    their own and a view: closing any of them while the executor that bound the map is open would leave
    it (and its captured graph) using freed memory, so it is refused, and nothing is half closed."""
    cfg = llm_config()
    eng = ReferenceEngine.from_config(cfg, device="host")
    io = PipelineIO.create_for_llm(cfg, backend=host)
    io_map = io.build_tensor_map(cfg)
    state = EngineState(EngineIO.from_engine(eng), cfg, max_batch=4, backend=host, name="kv")
    state.bind(io_map)
    rope_owner = Tensor.empty((2, 128, 16), "float32", name="rope_owner", backend=host)
    rope = Tensor.wrap(rope_owner.data_ptr, (1, 128, 16), "float32", owner=rope_owner, name="rope", backend=host)
    rope.copy_from(trtio._rope.rope_cos_sin_table(128, 16, cfg.rope_theta, 1))
    arena = Arena([TensorRequest.of("select", (4, 1), "int64")], backend=host, title="mine")
    mine = TensorMap("mine")  # not frozen: its tensors are not frozen either
    for n in io_map.names():
        mine.set(n, io_map[n])
    mine.set(names.kRopeCosSin, rope)
    mine.set(names.kLastTokenIds, arena["select"])
    ex = EngineExecutor(eng, registry=trtio._contracts.build_registry(cfg).merged(state.specs()),
                        stable=state.stable_names(), graphs=True, name="mine", backend=host)
    s = Stream.create(host)
    state.upload_start_index(np.zeros(1, np.int32), s)
    io.upload_context_lengths(np.array([1]), s)
    arena["select"].reshape((1, 1)).zero_(s)
    for _ in range(2):
        ex.prepare(1, mine, cfg.decode_dims(1), s)
        ex.execute(s)
    assert ex.graph_stats.captures == 1
    live = host.live_allocations
    for close, what in [(io.close, "PipelineIO"), (state.close, "engine state 'kv'"), (arena.close, "arena 'mine'"),
                        (rope_owner.close, "tensor 'rope_owner'")]:
        with pytest.raises(FrozenError, match=rf"{what} is bound by open executor\(s\) \['mine'\]"):
            close()
    assert host.live_allocations == live and not (io.is_closed or state.is_closed or arena.is_closed)
    ex.prepare(1, mine, cfg.decode_dims(1), s)  # nothing was freed: the graph replays as before
    ex.execute(s)
    assert ex.graph_stats.hits == 2
    rope.close()  # a view frees nothing, so it may close; the next step says so
    _refused(host, ClosedError, "tensor 'rope' is closed", ex.prepare, 1, mine, cfg.decode_dims(1), s)
    ex.close()
    for x in (arena, rope_owner, io, state, s):
        x.close()
    assert io.is_closed and state.is_closed and arena.is_closed and rope_owner.is_closed


def test_a_closed_pipeline_io_names_itself_not_one_of_its_tensors(host: Backend) -> None:
    b = bundle()
    io = PipelineIO.create_for_spec_decode(b, backend=host)
    streaming = io.streaming_prefill
    io.close()
    for call in (lambda: io.upload_context_lengths(np.array([1])),
                 lambda: io.upload_select_token_indices(np.zeros((1, 1), np.int64)),
                 lambda: io.upload_tree(np.zeros((1, 2, 1), np.int32), np.zeros((1, 2), np.int32)),
                 io.memory_report,
                 lambda: io.build_tensor_map(b.base),
                 lambda: io.build_tensor_map_for_spec_decode_draft(b.draft),
                 lambda: io.reallocate("inputs_embeds", (1,))):
        _refused(host, ClosedError, r"^PipelineIO is closed$", call)
    emb = Tensor.empty((1, 2, 64), "float16", backend=host)
    for call in (lambda: streaming.ready_event, lambda: streaming.release(None),
                 lambda: streaming.order_before(None), streaming.memory_report,
                 lambda: streaming.populate_from_prefill(emb, emb, 1, 2, 64, 4, 64)):
        _refused(host, ClosedError, r"^streaming_prefill is closed$", call)
    emb.close()


def test_a_closed_step_block_never_copies_into_freed_memory(host: Backend) -> None:
    """Values written into a ragged PipelineIO's step block, then the PipelineIO closed: the upload that
    would have copied them into the freed device block is refused."""
    io = PipelineIO.create_for_llm(tiny_llm("ragged"), backend=host)
    step = io.step
    assert step is not None
    step.write("positions", np.arange(4, dtype=np.int32))
    io.close()
    assert step.is_closed
    _refused(host, ClosedError, r"per-step inputs is closed", step.upload, Stream.default(host))
    _refused(host, ClosedError, r"per-step inputs is closed", step.write, "positions", np.arange(4, dtype=np.int32))


def test_a_closed_engine_state_names_itself(host: Backend) -> None:
    cfg = llm_config()
    eio = EngineIO.from_engine(ReferenceEngine.from_config(cfg, device="host", null_compute=True))
    state = EngineState(eio, cfg, max_batch=4, backend=host, name="kv")
    state.close()
    for call in (state.reset, lambda: state.upload_start_index(np.zeros(2, np.int32)),
                 lambda: state.commit_paths([0], [[0, 1]]), lambda: state.bind(TensorMap("m")),
                 state.memory_report):
        _refused(host, ClosedError, r"^engine state 'kv' is closed$", call)
    # The same through a closed setup: reset() used to "succeed" on the freed state.
    setup = Factory("llm-batch").create(host)
    setup.close()
    with pytest.raises(ClosedError, match="engine state 'llm' is closed"):
        setup.state.reset()
    with pytest.raises(ClosedError, match="this LLMSetup is closed"):
        setup.reset()


class _FreesThenFails(HostBackend):
    """Frees as asked, then reports the first device free as failed (a driver error after the fact)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def free(self, ptr: int, location: Location) -> None:
        super().free(ptr, location)
        if location is Location.DEVICE and not self.failed:
            self.failed = True
            raise CudaError("cudaFree", "cudaErrorIllegalAddress", "an illegal memory access was encountered")


def test_a_failed_free_while_closing_a_setup_raises_and_the_rest_is_still_freed() -> None:
    be = _FreesThenFails()
    cfg = llm_config()
    setup = trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg, backend=be)
    greedy_generate(setup, toy_embedding(cfg.vocab_size, cfg.hidden_size), [[1, 2, 3]], 2)
    with pytest.raises(CudaError, match="cudaFree: cudaErrorIllegalAddress"):
        setup.close()
    assert be.failed and be.live_allocations == 0 and be.live_events == 0, "every other part was freed"
    assert setup.io.is_closed and setup.state.is_closed and setup.executor.is_closed
    setup.close()  # closed anyway: nothing is raised, or freed, twice
    with pytest.raises(ClosedError):
        setup.decode(np.zeros((1, 1, cfg.hidden_size), np.float16))


# -- bad input: the cases without a test elsewhere, and their siblings ---------------------------


@pytest.mark.parametrize("location", ["device", "pinned", "host"])
@pytest.mark.parametrize("ptr", [0x100, 0xF00])
def test_wrap_refuses_addresses_in_the_null_page(backend: Backend, location: str, ptr: int) -> None:
    """Small ints are no pointers (``to_numpy`` of such a view would read address 0x100 and crash)."""
    with pytest.raises(InvalidValueError, match=rf"tensor 'w': pointer 0x{ptr:x} lies in the null page"):
        Tensor.wrap(ptr, (4,), "float32", location, name="w", backend=backend)


def test_stream_wait_takes_an_event(host: Backend) -> None:
    s = Stream.create(host)
    for bad in (0xBEEF, None, s):
        with pytest.raises(TypeError, match=rf"stream 0x{s.handle:x}: wait\(\) takes a trtio.Event, got"):
            s.wait(bad)  # type: ignore[arg-type]
    s.close()


@pytest.mark.parametrize("path", [0, 3, None, 1.5])
def test_config_paths_must_be_paths(path: Any) -> None:
    """``open(0)`` would read the process's stdin as a config (an int is a file descriptor to ``open``)."""
    for read in (LLMEngineConfig.from_json, DeploymentConfig.from_json):
        with pytest.raises(TypeError, match=r"a config path must be a str or os.PathLike, got"):
            read(path)


def test_edgellm_configs_that_hold_no_object_are_config_errors(tmp_path: Path) -> None:
    for value, kind in (([1, 2], "a list"), (None, "a null"), (3, "a number")):
        with pytest.raises(ConfigError, match=rf"Edge-LLM config: must hold a JSON object .*got {kind}"):
            LLMEngineConfig.from_edgellm(value)  # type: ignore[arg-type]
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError) as info:
        EngineDir.open(tmp_path)
    assert info.value.field == str(tmp_path / "config.json") and "got a list" in str(info.value)


@pytest.mark.parametrize("field,value", [
    ("hidden_size", math.nan), ("max_kv_cache_capacity", math.inf), ("kv_page_size", math.nan),
    ("num_attention_layers", -math.inf), ("max_position_embeddings", math.nan),
])
def test_int_fields_refuse_nan_and_infinity(field: str, value: float) -> None:
    with pytest.raises(ConfigError) as info:
        llm_config(**{field: value})
    assert info.value.field == field and str(value) in str(info.value)


@pytest.mark.parametrize("scaling,key", [
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": math.nan, "high_freq_factor": 4.0}, "low_freq_factor"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": math.inf},
     "high_freq_factor"),
    ({"rope_type": "yarn", "factor": 2.0, "beta_fast": math.nan}, "beta_fast"),
    ({"rope_type": "yarn", "factor": 2.0, "beta_slow": -math.inf}, "beta_slow"),
    ({"rope_type": "yarn", "factor": 2.0, "mscale": math.nan}, "mscale"),
    ({"rope_type": "yarn", "factor": 2.0, "attention_factor": math.inf}, "attention_factor"),
    ({"rope_type": "longrope", "factor": 2.0, "short_factor": [1.0] * 8, "long_factor": [math.nan] + [1.0] * 7},
     "long_factor"),
    ({"rope_type": "dynamic", "factor": math.inf}, "factor"),
])
def test_every_rope_scaling_number_must_be_finite(scaling: dict[str, Any], key: str) -> None:
    """Each would put NaN or infinity into the RoPE table, silently."""
    full = {"original_max_position_embeddings": 64, **scaling}
    with pytest.raises(ConfigError) as info:
        llm_config(rope_scaling=full, max_position_embeddings=128)
    assert info.value.field == f"rope_scaling.{key}" and "finite" in str(info.value)


def test_a_config_too_big_to_allocate_is_a_cuda_error_naming_the_tensor_and_bytes(host: Backend) -> None:
    eng = ReferenceEngine.from_config(llm_config(), device="host")
    live = host.live_allocations
    with pytest.raises(CudaError, match=r"cudaMalloc: cudaErrorMemoryAllocation: arena 'PipelineIO\(llm\)': a device "
                                        r"block of \d+ bytes for 6 tensor\(s\) asked \(the largest: tensor "
                                        r"'inputs_embeds', shape \(4, 64, 1073741824\) of float16, 549755813888 "
                                        r"bytes\)"):
        trtio.create_for_llm(eng, llm_config(hidden_size=2**30), backend=host)
    assert host.live_allocations == live, "nothing is left allocated"


class _Hides(ReferenceEngine):
    """An engine that declares another output in place of ``hidden`` (no alias for it either)."""

    __module__ = ReferenceEngine.__module__
    hidden = ""

    def get_aliased_input_tensor(self, name: str) -> str | None:
        return None if name == self.hidden else super().get_aliased_input_tensor(name)

    def get_tensor_name(self, index: int) -> str:
        name = super().get_tensor_name(index)
        return "unrelated_output" if name == self.hidden else name


@pytest.mark.parametrize("contract,hidden,needle", [
    ("batch", names.present_k_cache(0), r"k_cache_0: the engine declares this state input but no output updates it "
                                        r"in place \(expected present_k_cache_0\)"),
    ("batch", names.kLogits, "logits: the config implies this output but the engine does not declare it"),
    ("ragged", names.present_key_values(0), r"past_key_values_0: the engine declares this state input but no output "
                                            r"updates it in place \(expected present_key_values_0\)"),
    ("ragged", names.kLogits, "logits: the config implies this output but the engine does not declare it"),
])
def test_an_engine_missing_an_output_is_refused_when_the_setup_is_created(contract: str, hidden: str,
                                                                          needle: str) -> None:
    """Not at the first step, naming another binding."""
    cfg = tiny_llm(contract)
    hides = type("Hides", (_Hides,), {"hidden": hidden, "__module__": ReferenceEngine.__module__})
    engine = hides.from_config(cfg, device="host", null_compute=True)
    with pytest.raises(trtio.BindingError, match=needle):
        trtio.create_for_llm(engine, cfg)


# -- embeddings: a conversion to the activation dtype never makes inf or NaN silently --------------------


@pytest.mark.parametrize("contract", CONTRACTS)
def test_llm_embeddings_that_the_activation_dtype_cannot_hold_are_refused(host: Backend,
                                                                         contract: str) -> None:
    with Factory(f"llm-{contract}").create(host, graphs=False) as setup:
        big = np.zeros((1, 3, 16))
        big[0, 1, 2] = 1e6  # float16's largest is 65504: this would be inf, and every logit NaN
        _refused(host, InvalidValueError, r"inputs_embeds\[0, 1, 2\] = .*1000000\.0.* is not a finite float16 value "
                                          r"\(\|x\| <= 65504\); converting float64 to float16 would make it inf",
                 setup.prefill, big, [3])
        _refused(host, InvalidValueError, r"inputs_embeds\[0, 0, 0\] = .*nan.* is not a finite float16",
                 setup.prefill, np.full((1, 3, 16), np.nan, np.float32), [3])
        setup.prefill(np.zeros((1, 3, 16)), [3])  # float64 that float16 holds is converted
        _refused(host, InvalidValueError, r"inputs_embeds\[0, 0, 5\] = .*-inf", setup.decode,
                 np.where(np.arange(16) == 5, -np.inf, 0.0).reshape(1, 1, 16))
        # A device tensor of the activation dtype is taken as it is: no host read, no synchronisation.
        x = Tensor.from_numpy(np.zeros((1, 1, 16), np.float16), backend=host)
        syncs = host.sync_count
        setup.decode(x)
        assert host.sync_count == syncs
        x.close()


def test_deepstack_and_bf16_embeddings_are_checked_too(host: Backend) -> None:
    cfg = tiny_llm("batch", num_deepstack_features=1)
    with trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg, backend=host) as setup:
        feats = np.zeros((1, 3, 16))
        feats[0, 2, 0] = -1e9
        _refused(host, InvalidValueError, r"deepstack_embeds\[0\]\[0, 2, 0\] = .*-1000000000\.0.* is not a finite "
                                          r"float16", setup.prefill, np.zeros((1, 3, 16)), [3],
                 deepstack_embeds=[feats])
    cfg = tiny_llm("batch", activation_dtype="bfloat16")
    with trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg, backend=host) as setup:
        _refused(host, InvalidValueError, r"inputs_embeds\[0, 0, 0\] = .*1e\+39.* is not a finite bfloat16 value",
                 setup.prefill, np.full((1, 3, 16), 1e39), [3])
        setup.prefill(np.full((1, 3, 16), 1e38), [3])  # within bfloat16's range


@pytest.mark.parametrize("contract", CONTRACTS)
def test_spec_decode_embeddings_that_the_activation_dtype_cannot_hold_are_refused(host: Backend,
                                                                                 contract: str) -> None:
    def big(n: int) -> np.ndarray:
        x = np.zeros((2, n, 16))
        x[1, n - 1, 3] = 7e4
        return x

    def needle() -> str:
        return r"inputs_embeds\[1, \d, 3\] = .*70000\.0.* is not a finite float16 value"

    with Factory(f"spec-{contract}").create(host, graphs=False) as sd:
        emb, lens = embed_batch(E, PROMPTS, np.float16)
        _refused(host, InvalidValueError, needle(), sd.base_prefill, big(4), lens)
        sd.base_prefill(emb, lens)
        _refused(host, InvalidValueError, needle(), sd.draft_prefill, big(4), lens)
        sd.draft_prefill(emb, lens)
        _refused(host, InvalidValueError, needle(), sd.draft_propose, big(2), parents=[-1, -1])
        _refused(host, InvalidValueError, needle(), sd.verify, big(3), [-1, 0, 1])
        sd.verify(np.zeros((2, 3, 16)), [-1, 0, 1])
        sd.accept([[0, 1], [0]])
        _refused(host, InvalidValueError, needle(), sd.draft_accept, big(2), [2, 1])
        sd.draft_accept(np.zeros((2, 2, 16)), [2, 1])


@pytest.mark.parametrize("contract", CONTRACTS)
def test_accepted_paths_as_lists_or_as_a_padded_array_commit_the_same(host: Backend, contract: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Lists of ints (what a runtime passes: walked once in Python) and an int array padded with -1 (the
    general checks) commit the same entries, lengths and catch-up rows, paths of unequal lengths included."""
    import trtio._setups.verify as verify_module

    walked: list[bool] = []
    list_paths = verify_module.AcceptedPaths.walk

    def spy(self: Any, paths: Any, b: int, tree: Any, starts: list[int]) -> Any:
        found = list_paths(self, paths, b, tree, starts)
        walked.append(found is not None)
        return found

    monkeypatch.setattr(verify_module.AcceptedPaths, "walk", spy)
    rng = np.random.default_rng(3)
    x, catch_up = rng.standard_normal((2, 4, 16)), rng.standard_normal((2, 3, 16))
    results = []
    for paths in ([[0, 1, 3], [0, 2]], np.array([[0, 1, 3], [0, 2, -1]])):
        with Factory(f"spec-{contract}").create(host, graphs=False) as sd:
            sd.base.state.reset(None, clear=True)  # slots no step writes read alike in both runs
            emb, lens = embed_batch(E, PROMPTS, np.float16)
            sd.base_prefill(emb, lens)
            sd.draft_prefill(emb, lens)
            sd.verify(x, [-1, 0, 0, 1])
            sd.accept(paths)
            logits = sd.draft_accept(catch_up, [3, 2]).to_numpy()
            state = sd.base.state
            caches = {n: state.tensors[n].to_numpy() for n in state._kv_caches}
            caches["features"] = sd.io.base_hidden_states.to_numpy()  # the catch-up's rows: zeros past a path
            results.append((state.lengths.copy(), caches, logits))
    assert walked == [True, False], "the lists took the Python walk, the array the general checks"
    (lengths, caches, logits), (lengths2, caches2, logits2) = results
    np.testing.assert_array_equal(lengths, lengths2)
    np.testing.assert_array_equal(lengths, np.array([3, 4]) + [3, 2])
    for name in caches:
        np.testing.assert_array_equal(caches[name], caches2[name], err_msg=name)
    np.testing.assert_array_equal(logits, logits2)


# -- spec decode: out-of-order and inconsistent calls, refused before any work --------------------------


@pytest.mark.parametrize("contract", CONTRACTS)
@pytest.mark.parametrize("walk", ["python", "numpy"])
def test_spec_decode_calls_out_of_order_or_inconsistent_are_refused_before_any_work(
        host: Backend, contract: str, walk: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call out of order or with inconsistent input is refused before any work is enqueued; accepted
    paths are checked alike whether they are walked in Python (a few) or with numpy (many)."""
    import trtio._setups.verify as verify_module

    monkeypatch.setattr(verify_module, "_PYTHON_PATH_NODES", 512 if walk == "python" else 0)
    cap = TINY["max_kv_cache_capacity"]

    def z(n: int) -> np.ndarray:
        return np.zeros((2, n, 16), np.float16)

    with Factory(f"spec-{contract}").create(host, graphs=True) as sd:
        emb, lens = embed_batch(E, PROMPTS, np.float16)  # lengths [3, 4]
        first = r"is out of order: no prompt has run: base_prefill\(\) comes next"
        _refused(host, TrtioError, first, sd.draft_prefill, emb, lens)
        _refused(host, TrtioError, first, sd.draft_propose, z(1))
        _refused(host, TrtioError, first, sd.verify, z(2), [-1, 0])
        _refused(host, TrtioError, first, sd.accept, [[0], [0]])
        _refused(host, TrtioError, first, sd.draft_accept, z(1), [1, 1])
        sd.base_prefill(emb, lens)
        behind = r"draft_propose\(\) is out of order"
        _refused(host, TrtioError, behind, sd.draft_propose, z(1))
        _refused(host, TrtioError, r"draft_accept\(\) is out of order", sd.draft_accept, z(1), [1, 1])
        _refused(host, TrtioError, r"accept\(\) is out of order", sd.accept, [[0], [0]])
        _refused(host, ShapeError, r"context_lengths \[3, 3\] differ from the base prefill's \[3, 4\]",
                 sd.draft_prefill, emb, [3, 3])
        _refused(host, ShapeError, r"the draft prefill takes the base prefill's shape \[batch=2, seq=4, hidden\], "
                                   r"got \[2, 3, 16\]", sd.draft_prefill, emb[:, :3], [3, 3])
        sd.draft_prefill(emb, lens)
        _refused(host, TrtioError, r"draft_prefill\(\) is out of order: between rounds", sd.draft_prefill, emb, lens)
        # Verify trees: a node that sees a later node, a node that does not see itself, a parent after its node.
        later = np.broadcast_to(np.tril(np.ones((3, 3), bool)), (2, 3, 3)).copy()
        later[0, 1, 2] = True
        _refused(host, ShapeError, r"row \(b=0, t=1\) sees later node i=2", sd.verify, z(3), later)
        blind = np.broadcast_to(ancestor_mask([-1, 0, 0]), (2, 3, 3)).copy()
        blind[1, 2, 2] = False
        _refused(host, ShapeError, r"row \(b=1, t=2\) does not see itself", sd.verify, z(3), blind)
        _refused(host, ShapeError, r"parents\[1\] = 2, but a parent must come before its node", sd.verify, z(3),
                 [-1, 2, 1])
        sd.verify(z(4), [-1, 0, 0, 1])  # node 3's parent is node 1
        _refused(host, TrtioError, behind, sd.draft_propose, z(1))
        # Accepted paths follow the verified tree and are node indices.
        _refused(host, ShapeError, r"paths\[0\] = \[0, 2, 3\]: node 3 is not a child of node 2 in the verified tree",
                 sd.accept, [[0, 2, 3], [0]])
        _refused(host, ShapeError, r"paths\[1\] = \[1\]: a path starts at the root", sd.accept, [[0], [1]])
        # a last node counted from the end (node 3's path is [0, 1, 3]) or past the tree's is no node of it
        _refused(host, ShapeError, r"paths\[0\] = \[0, 1, -1\]: node -1 is not a child of node 1", sd.accept,
                 [[0, 1, -1], [0]])
        _refused(host, ShapeError, r"paths\[1\] = \[0, 4\]: node 4 is not a child of node 0", sd.accept, [[0], [0, 4]])
        _refused(host, ShapeError, r"paths\[0\]: node 1\.5 is not an int node index", sd.accept, [[0, 1.5], [0]])
        _refused(host, ShapeError, r"paths\[1\]: node True is not an int node index", sd.accept, [[0], [0, True]])
        # Paths of equal lengths (numpy reads them at once) are checked alike.
        _refused(host, ShapeError, r"paths\[1\]: node True is not an int node index", sd.accept, [[0, 1], [0, True]])
        _refused(host, ShapeError, r"paths\[0\]: node 1\.5 is not an int node index", sd.accept, [[0, 1.5], [0, 1]])
        _refused(host, ShapeError, r"paths: expected one path \(a list of node indices\) per sequence, got str",
                 sd.accept, "01")
        _refused(host, ShapeError, r"paths: expected one path per sequence \(2\), got 1", sd.accept, [[0, 1]])
        sd.accept([[0, 1, 3], [0, 2]])
        _refused(host, TrtioError, r"accept\(\) is out of order", sd.accept, [[0], [0]])
        _refused(host, TrtioError, behind, sd.draft_propose, z(1))
        _refused(host, ShapeError, r"accept_lengths \[3, 1\] differ from the path lengths accept\(\) committed "
                                   r"\[3, 2\]", sd.draft_accept, z(3), [3, 1])
        _refused(host, ShapeError, r"accept_lengths\[0\] = 3 is outside 1\.\.2", sd.draft_accept, z(2), [3, 2])
        _refused(host, ShapeError, r"accept_lengths: expected 2 integer lengths", sd.draft_accept, z(3), [3.0, 2.0])
        sd.draft_accept(z(3), [3, 2])
        assert sd.base_lengths.tolist() == sd.draft_lengths.tolist() == [6, 6]
        # Capacity: the errors give the numbers.
        with _lengths(sd.draft.state, [cap - 2, 6]):
            _refused(host, ShapeError, rf"draft KV cache full: sequence 0 holds {cap - 2} tokens and a proposal "
                                       rf"round writes 4 more, past max_kv_cache_capacity \({cap}\)", sd.draft_propose,
                     z(1))
        with _lengths(sd.base.state, [6, cap - 3]):
            _refused(host, ShapeError, rf"verify: 4 nodes do not fit after the {cap - 3} tokens sequence 1 has cached "
                                       rf"\(max_kv_cache_capacity {cap}\)", sd.verify, z(4), [-1, 0, 1, 2])
        sd.verify(z(3), [-1, 0, 1])
        sd.accept([[0, 1, 2], [0]])
        with _lengths(sd.draft.state, [cap - 1, 6]):
            _refused(host, ShapeError, rf"draft KV cache full: sequence 0 holds {cap - 1} tokens and the catch-up "
                                       rf"writes 3 more, past max_kv_cache_capacity \({cap}\)", sd.draft_accept,
                     z(3), [3, 1])
        sd.draft_accept(z(3), [3, 1])
        assert sd.base_lengths.tolist() == sd.draft_lengths.tolist() == [9, 7]


@contextlib.contextmanager
def _lengths(state: EngineState, lengths: list[int]) -> Iterator[None]:
    """As if the state's caches held ``lengths`` tokens (they fill up after many rounds)."""
    saved = state.lengths.copy()
    state.lengths[:len(lengths)] = lengths
    try:
        yield
    finally:
        state.lengths[:] = saved


# -- leaks: many create / step / close cycles, and setups dropped unclosed ------------------------------


def _live(be: Backend, *, collect: bool = True) -> dict[str, int]:
    if collect:
        gc.collect()
    return {"allocations": be.live_allocations, "graphs": be.live_graphs, "events": be.live_events,
            "streams": be.live_streams}


def _leak_check(be: Backend, factory: Factory, cycles: int, dropped: int) -> None:
    """``cycles`` create / step / close cycles, then ``dropped`` setups stepped and dropped without close():
    the backend's live counters end where they began."""
    Stream.default(be)  # this thread's default stream lives on: part of the baseline
    with factory.create(be) as warm:
        factory.step(warm)  # one-time work (kernels, caches) before the baseline
    base = _live(be)
    for _ in range(cycles):
        with factory.create(be) as setup:
            factory.step(setup)
            grown = _live(be, collect=False)
        assert all(e.executor.graph_stats.captures >= 1 for e in setup.engines()), "steps ran as captured graphs"
    assert grown["graphs"] > base["graphs"] and grown["allocations"] > base["allocations"]
    assert _live(be) == base, f"after {cycles} closed setups"
    if not dropped:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = []
        for _ in range(dropped):
            kept.append(factory.create(be))
            factory.step(kept[-1])
        held = _live(be)
        del kept
        after = _live(be)
    engines = 2 if factory.spec else 1
    assert held["graphs"] >= base["graphs"] + dropped * engines, "every dropped setup held graphs"
    assert after == base, f"after {dropped} setups dropped without close()"
    assert any(w.category is ResourceWarning and "was never closed" in str(w.message) for w in caught)


# Each kind at a quick count, and at full count under the slow marker (.ci/run runs both).
HOST_CYCLES = [("llm-batch", 100, 20), ("llm-ragged", 40, 10), ("spec-batch", 10, 5), ("spec-ragged", 10, 5)] + [
    pytest.param(*case, marks=pytest.mark.slow) for case in
    [("llm-batch", 1000, 200), ("llm-ragged", 200, 50), ("spec-batch", 40, 20), ("spec-ragged", 40, 20)]]


@pytest.mark.parametrize("kind,cycles,dropped", HOST_CYCLES)
def test_cycles_and_dropped_setups_leave_the_host_backend_at_its_baseline(host: Backend, kind: str,
                                                                         cycles: int, dropped: int) -> None:
    _leak_check(host, Factory(kind), cycles, dropped)


@pytest.mark.gpu
@pytest.mark.parametrize("kind,cycles,dropped", [
    ("llm-batch", 1000, 200), ("llm-ragged", 200, 50), ("spec-batch", 40, 20), ("spec-ragged", 40, 20),
])
def test_cycles_and_dropped_setups_leave_the_cuda_backend_at_its_baseline(cuda: Backend, kind: str,
                                                                         cycles: int, dropped: int) -> None:
    pytest.importorskip("cupy")
    _leak_check(cuda, Factory(kind, device="gpu"), cycles, dropped)


def test_the_leak_check_sees_a_leak(host: Backend) -> None:
    """The check above can fail: setups whose close() forgets their graphs leave them live."""
    forgotten: list[int] = []

    class Leaky(LLMSetup):
        def close(self) -> None:
            forgotten.extend(g for g in self.executor._graphs.values() if g)
            self.executor._graphs.clear()  # forgotten, not destroyed
            super().close()

    class LeakyFactory(Factory):
        def create(self, backend: Backend, *, graphs: bool = True) -> Any:
            return Leaky(self.engine, self.cfg, graphs=graphs, backend=backend)

    try:
        with pytest.raises(AssertionError, match="after 3 closed setups"):
            _leak_check(host, LeakyFactory("llm-batch"), 3, 0)
    finally:
        for g in forgotten:
            host.destroy_graph(g)



def test_the_factories_refuse_what_is_not_an_engine_or_a_config() -> None:
    b = tiny_bundle("batch")
    base, draft = (ReferenceEngine.from_config(c, device="host", null_compute=True) for c in (b.base, b.draft))
    for args, needle in [((None, draft, b), r"create_for_spec_decode \(base\): expected a TensorRT engine .* got "
                                            r"NoneType"),
                         ((base, {}, b), r"create_for_spec_decode \(draft\): expected a TensorRT engine .* got dict"),
                         ((base, draft, {"base": {}}), "bundle must be a DeploymentConfig, got dict"),
                         ((base, draft, b.base), "bundle must be a DeploymentConfig, got LLMEngineConfig"),
                         ((base, draft, None), "bundle must be a DeploymentConfig, got NoneType")]:
        with pytest.raises(TypeError, match=needle):
            trtio.create_for_spec_decode(*args)
    for batch in (0, 3, True, 1.0):
        with pytest.raises(ShapeError, match=r"max_runtime_batch_size must be an int in 1..2"):
            trtio.create_for_spec_decode(base, draft, b, batch)
    for path in (None, 3):
        with pytest.raises(TypeError, match="EngineDir.open: expected the path of an engine directory"):
            trtio.create_from_engine_dir(path)  # type: ignore[arg-type]
