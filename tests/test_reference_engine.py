"""trtio.testing.reference_engine: TensorRT's engine/context API over the toy model (docs/toy-model.md).

Everything drives the raw engine API (set_input_shape / set_tensor_address / execute_async_v3) on
buffers from trtio.Tensor, as TensorRT would be driven; nothing here uses trtio's executor. Tests
marked gpu run the CuPy device on the cuda backend and skip where no GPU answers.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from _contract import expected_contract

import trtio
from trtio import names
from trtio._config import LLMEngineConfig
from trtio._trees import ancestor_mask, pack_tree_mask, tree_position_ids
from trtio.testing import reference_engine as re_mod
from trtio.testing import reference_math
from trtio.testing.reference_engine import (
    DataType,
    ExecutionContextAllocationStrategy,
    ReferenceEngine,
    TensorIOMode,
    TensorLocation,
)
from trtio.testing.toy_model import ToyWeights, reference_forward, rope_table, toy_embedding

LOGGER = "trtio.testing.reference_engine"
STATIC = ExecutionContextAllocationStrategy.STATIC
USER_MANAGED = ExecutionContextAllocationStrategy.USER_MANAGED


def make_cfg(role: str = "llm", **kw: Any) -> LLMEngineConfig:
    fields: dict[str, Any] = dict(
        hidden_size=32, vocab_size=64, max_supported_batch_size=3, max_supported_input_length=12,
        max_kv_cache_capacity=48, num_attention_layers=2, num_attention_heads=4, num_kv_heads=2,
        head_dim=8, rotary_dim=4,
    )
    if role == "base":
        fields.update(is_spec_decode_base=True, max_verify_tree_size=8)
    elif role == "draft":
        fields.update(num_attention_layers=1, base_model_hidden_size=24, max_draft_tree_size=6)
    fields.update(kw)
    return LLMEngineConfig(**fields).validate()


_OPEN: list[Any] = []  # harnesses and tensors a test made; closed after it


@pytest.fixture(autouse=True)
def _close_what_the_test_opened() -> Any:
    yield
    while _OPEN:
        _OPEN.pop().close()


def new_tensor(shape: tuple[int, ...], dtype: Any, backend: str = "host") -> trtio.Tensor:
    t = trtio.Tensor.empty(shape, dtype, backend=backend)
    _OPEN.append(t)
    return t


def np_act(dtype: trtio.DType) -> np.dtype:
    assert dtype.numpy is not None
    return dtype.numpy


# -- the I/O contract, written out from docs/toy-model.md independently of the module -------------


VARIANTS = {
    "llm": ("llm", {}),
    "base": ("base", {}),
    "draft": ("draft", {}),
    "llm-deepstack": ("llm", dict(num_deepstack_features=2)),
    "llm-mrope": ("llm", dict(rope_type="mrope")),
    "llm-bf16": ("llm", dict(activation_dtype="bfloat16", kv_cache_dtype="bfloat16")),
    "base-vocab-bf16": ("base", dict(output_vocab_size=40, kv_cache_dtype="bfloat16", num_deepstack_features=1)),
    "draft-mrope-f32": ("draft", dict(rope_type="mrope", activation_dtype="float32", kv_cache_dtype="float32")),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_io_contract_matches_the_doc(variant: str) -> None:
    role, kw = VARIANTS[variant]
    cfg = make_cfg(role, **kw)
    engine = ReferenceEngine.from_config(cfg, device="host")
    want = expected_contract(cfg)
    got = engine.io_contract()
    assert [(e["name"], e["mode"]) for e in got] == [(e["name"], e["mode"]) for e in want]
    for g, w in zip(got, want):
        assert g == w, f"{w['name']}: got {g}, want {w}"

    # The same contract through the TensorRT API.
    assert engine.num_io_tensors == len(want) == len(engine)
    assert engine.num_optimization_profiles == 2
    assert engine.name == f"toy-{role}"
    for i, w in enumerate(want):
        name = w["name"]
        assert engine.get_tensor_name(i) == name == engine[i]
        mode = engine.get_tensor_mode(name)
        assert isinstance(mode, TensorIOMode) and mode.name == w["mode"].upper()
        dtype = engine.get_tensor_dtype(name)
        assert isinstance(dtype, DataType)
        assert trtio.DType.from_trt(dtype) == trtio.DType.coerce(w["dtype"])
        assert trtio.DType.from_trt(dtype.name) == trtio.DType.coerce(w["dtype"])
        assert engine.get_tensor_shape(name) == w["shape"]
        assert engine.get_tensor_location(name) is TensorLocation.DEVICE
        assert engine.is_shape_inference_io(name) is False
        assert engine.get_aliased_input_tensor(name) == w["aliased_input"]
        if w["mode"] == "input":
            for p in range(2):
                assert engine.get_tensor_profile_shape(name, p) == list(w["profiles"][p])
        else:
            with pytest.raises(trtio.InvalidValueError, match="not an input"):
                engine.get_tensor_profile_shape(name, 0)
    with pytest.raises(IndexError):
        engine[len(want)]
    assert list(engine) == [w["name"] for w in want]  # __getitem__ iteration stops at IndexError


SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build_toy_engines.py"


@pytest.mark.rtx
@pytest.mark.parametrize("variant", ["llm", "base", "draft", "llm-deepstack", "llm-mrope", "llm-bf16"])
def test_io_contract_equals_the_built_network(variant: str) -> None:
    """The CI check of the toy build: a TensorRT-RTX network of the same config declares the same I/O."""
    trt = pytest.importorskip("tensorrt_rtx", exc_type=ImportError)
    if not SCRIPT.exists():
        pytest.skip("scripts/build_toy_engines.py is not there")
    spec = importlib.util.spec_from_file_location("build_toy_engines_for_re", SCRIPT)
    assert spec is not None and spec.loader is not None
    bte = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bte
    spec.loader.exec_module(bte)
    role, kw = VARIANTS[variant]
    cfg = make_cfg(role, **kw)
    engine = ReferenceEngine.from_config(cfg, device="host")
    _, network, profiles = bte.build_network(trt, cfg, engine.weights)
    assert bte.network_contract(network, profiles) == engine.io_contract()


def test_enums_mirror_tensorrt() -> None:
    assert {m.name: m.value for m in DataType} == dict(
        FLOAT=0, HALF=1, INT8=2, INT32=3, BOOL=4, UINT8=5, FP8=6, BF16=7, INT64=8, INT4=9, FP4=10, E8M0=11)
    assert {m.name: m.value for m in TensorIOMode} == dict(NONE=0, INPUT=1, OUTPUT=2)
    assert {m.name: m.value for m in TensorLocation} == dict(DEVICE=0, HOST=1)
    assert {m.name: m.value for m in ExecutionContextAllocationStrategy} == dict(
        STATIC=0, ON_PROFILE_CHANGE=1, USER_MANAGED=2)
    engine = ReferenceEngine.from_config(make_cfg(), device="host")
    module = sys.modules[type(engine).__module__]
    for enum_name in ("DataType", "TensorIOMode", "TensorLocation", "ExecutionContextAllocationStrategy"):
        assert getattr(module, enum_name) is getattr(re_mod, enum_name)
    # every DType trtio knows maps onto a DataType member of the same value
    for dt in trtio.DType:
        assert DataType[dt.trt_name] == dt.value.trt_value


def test_unknown_names_log_and_return_sentinels(caplog: pytest.LogCaptureFixture) -> None:
    engine = ReferenceEngine.from_config(make_cfg(), device="host")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert engine.get_tensor_mode("nope") is TensorIOMode.NONE
        assert engine.get_tensor_dtype("nope") is DataType.FLOAT
        assert engine.get_tensor_shape("nope") == ()
        assert engine.get_tensor_location("nope") is TensorLocation.DEVICE
        assert engine.is_shape_inference_io("nope") is False
        assert engine.get_aliased_input_tensor("nope") is None
        assert engine.get_tensor_name(99) is None
        assert engine.get_device_memory_size_for_profile_v2(2) == 0
    assert sum("'nope'" in r.getMessage() for r in caplog.records) == 6
    assert all(r.levelno == logging.ERROR for r in caplog.records)
    with pytest.raises(trtio.UnknownNameError, match="not an I/O tensor"):
        engine.get_tensor_profile_shape("nope", 0)
    with pytest.raises(trtio.InvalidValueError, match="profile index"):
        engine.get_tensor_profile_shape(names.kInputsEmbeds, 2)


def test_device_memory_sizes() -> None:
    cfg = make_cfg("base")
    engine = ReferenceEngine.from_config(cfg, device="host")
    sizes = [engine.get_device_memory_size_for_profile_v2(p) for p in range(2)]
    assert all(s >= 512 and s % 256 == 0 for s in sizes)
    assert engine.device_memory_size_v2 == max(sizes)
    assert sizes[0] > sizes[1]  # prefill (12 tokens) needs more scratch than a verify of 8
    null = ReferenceEngine.from_config(cfg, device="host", null_compute=True)
    assert null.device_memory_size_v2 == 512
    bigger = ReferenceEngine.from_config(make_cfg("base", max_kv_cache_capacity=96), device="host")
    assert bigger.device_memory_size_v2 > engine.device_memory_size_v2


def test_from_config_arguments() -> None:
    cfg = make_cfg()
    w = ToyWeights.generate(cfg, seed=5)
    engine = ReferenceEngine.from_config(cfg, weights=w, device="host", name="mine")
    assert engine.weights is w and engine.name == "mine" and engine.device == "host"
    assert engine.trtio_backend == "host" and engine.null_compute is False
    assert engine.config is cfg
    np.testing.assert_array_equal(ReferenceEngine.from_config(cfg, seed=5, device="host").weights.w_lm, w.w_lm)
    assert ReferenceEngine.from_config(cfg).device in ("host", "gpu")
    with pytest.raises(ValueError, match="device"):
        ReferenceEngine.from_config(cfg, device="tpu")
    with pytest.raises(ValueError, match="do not fit"):
        ReferenceEngine.from_config(make_cfg("draft"), weights=w, device="host")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        ReferenceEngine.from_config(make_cfg(kv_cache_dtype="fp8"), device="host")
    # an fp8 cache is fine for an engine that only checks its I/O
    fp8 = ReferenceEngine.from_config(make_cfg(kv_cache_dtype="fp8"), device="host", null_compute=True)
    assert fp8.get_tensor_dtype("k_cache_0") is DataType.FP8
    assert "mine" in repr(engine) and "host" in repr(engine)


# -- a harness that binds trtio Tensors to a context --------------------------------------------------


class Harness:
    """Every binding of one context in a trtio Tensor at its largest shape, bound once.

    Caches are allocated [Bmax, Hkv, C, D] and bound with the step's batch (row-major keeps each
    sequence's slot at the same address), as trtio binds engine state.
    """

    def __init__(self, engine: ReferenceEngine, backend: str = "host",
                 strategy: ExecutionContextAllocationStrategy = STATIC) -> None:
        self.engine = engine
        self.cfg: LLMEngineConfig = engine.config
        self.backend = backend
        _OPEN.append(self)
        self.stream = trtio.Stream.create(backend)
        self.ctx = engine.create_execution_context(strategy)
        self.tensors: dict[str, trtio.Tensor] = {}
        self.memory: trtio.Tensor | None = None
        if strategy is USER_MANAGED:
            size = engine.device_memory_size_v2
            self.memory = new_tensor((size,), "uint8", backend=backend)
            self.ctx.set_device_memory(self.memory.data_ptr, size)
        cfg = self.cfg
        bm = cfg.max_supported_batch_size
        steps = max(cfg.max_supported_input_length, cfg.max_step_tokens)
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            if engine.get_aliased_input_tensor(name):
                continue
            if engine.get_tensor_mode(name) is TensorIOMode.INPUT:
                shape = tuple(max(engine.get_tensor_profile_shape(name, p)[2][a] for p in range(2))
                              for a in range(len(engine.get_tensor_shape(name))))
            elif name == names.kLogits:
                shape = (bm * max(cfg.max_step_tokens, 1), cfg.output_vocab_size)
            else:
                shape = (bm, steps, cfg.hidden_size)
            t = trtio.Tensor.empty(shape, trtio.DType.from_trt(engine.get_tensor_dtype(name)),
                                   name=name, backend=backend)
            self.tensors[name] = t
            assert self.ctx.set_tensor_address(name, t.data_ptr)
        for i in range(cfg.num_attention_layers):
            for cache in (names.k_cache(i), names.v_cache(i)):
                self.tensors[cache].zero_(self.stream)
                assert self.ctx.set_tensor_address("present_" + cache, self.tensors[cache].data_ptr)
        if cfg.rope_type != "mrope":
            table = rope_table(cfg.max_kv_cache_capacity, cfg.rotary_dim)
            self.tensors[names.kRopeCosSin].copy_from(table, self.stream)

    def close(self) -> None:
        self.stream.synchronize()
        for t in self.tensors.values():
            t.close()
        self.stream.close()

    def caches(self) -> list[str]:
        return [n for i in range(self.cfg.num_attention_layers) for n in (names.k_cache(i), names.v_cache(i))]

    def snapshot(self) -> dict[str, np.ndarray]:
        return {n: self.tensors[n].to_numpy(self.stream) for n in self.caches()}

    def restore(self, snap: dict[str, np.ndarray]) -> None:
        for n, a in snap.items():
            self.tensors[n].copy_from(a, self.stream)

    def stage(self, profile: int, inputs: dict[str, np.ndarray]) -> None:
        ctx = self.ctx
        if ctx.active_optimization_profile != profile:
            assert ctx.set_optimization_profile_async(profile, self.stream.handle)
        for name, array in inputs.items():
            t = self.tensors[name]
            t.reshape(array.shape).copy_from(np.ascontiguousarray(array), self.stream)
            assert ctx.set_input_shape(name, array.shape), name
        batch = inputs[names.kInputsEmbeds].shape[0]
        for cache in self.caches():
            assert ctx.set_input_shape(cache, (batch, *self.tensors[cache].shape[1:]))

    def outputs(self) -> tuple[np.ndarray, np.ndarray]:
        logits = self.tensors[names.kLogits].reshape(self.ctx.get_tensor_shape(names.kLogits))
        hidden = self.tensors[names.kOutputHiddenStates].reshape(self.ctx.get_tensor_shape(names.kOutputHiddenStates))
        return logits.to_numpy(self.stream), hidden.to_numpy(self.stream)

    def run(self, profile: int, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        self.stage(profile, inputs)
        assert self.ctx.execute_async_v3(self.stream.handle)
        return self.outputs()


class Seqs:
    """Per-sequence inputs of a batch (token embeddings and the extra per-token inputs), for the reference."""

    def __init__(self, cfg: LLMEngineConfig, batch: int, seed: int = 1) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)
        self.act = np_act(cfg.activation)
        self.table = toy_embedding(cfg.vocab_size, cfg.hidden_size)
        self.weights = ToyWeights.generate(cfg, 0)  # what ReferenceEngine.from_config(cfg) computes with
        self.emb: list[list[np.ndarray]] = [[] for _ in range(batch)]
        self.hin: list[list[np.ndarray]] = [[] for _ in range(batch)]
        self.hdraft: list[list[np.ndarray]] = [[] for _ in range(batch)]
        self.ds: list[list[list[np.ndarray]]] = [[[] for _ in range(cfg.num_deepstack_features)] for _ in range(batch)]
        # MRoPE: a different table per sequence, so a wrong row of it shows.
        self.rope = np.concatenate([rope_table(cfg.max_kv_cache_capacity, cfg.rotary_dim, theta=10000.0 * (b + 1))
                                    for b in range(batch)])

    def token(self, b: int) -> dict[str, np.ndarray]:
        """Draw one token's inputs for sequence b (already rounded to the activation dtype)."""
        cfg = self.cfg
        tok = {"e": self.table[self.rng.integers(cfg.vocab_size)].astype(self.act)}
        if cfg.role == "draft":
            tok["hin"] = self.rng.standard_normal(cfg.base_model_hidden_size, np.float32).astype(self.act)
            tok["hdraft"] = self.rng.standard_normal(cfg.hidden_size, np.float32).astype(self.act)
        tok["ds"] = [(0.3 * self.rng.standard_normal(cfg.hidden_size, np.float32)).astype(self.act)
                     for _ in range(cfg.num_deepstack_features)]
        return tok

    def push(self, b: int, tok: dict[str, Any]) -> None:
        self.emb[b].append(tok["e"])
        if "hin" in tok:
            self.hin[b].append(tok["hin"])
            self.hdraft[b].append(tok["hdraft"])
        for i, a in enumerate(tok["ds"]):
            self.ds[b][i].append(a)

    def batch_inputs(self, toks: list[list[dict[str, Any]]]) -> dict[str, np.ndarray]:
        """The engine's per-token inputs for ``toks[b]`` (a step of S tokens; shorter lists are zero-padded)."""
        cfg = self.cfg
        batch, seq = len(toks), max(len(t) for t in toks)
        out: dict[str, np.ndarray] = {}

        def fill(key: str, width: int, get: Any) -> np.ndarray:
            arr = np.zeros((batch, seq, width), self.act)
            for b, ts in enumerate(toks):
                for s, tok in enumerate(ts):
                    arr[b, s] = get(tok)
            return arr

        out[names.kInputsEmbeds] = fill("e", cfg.hidden_size, lambda t: t["e"])
        if cfg.role == "draft":
            out[names.kBaseModelHiddenStates] = fill("hin", cfg.base_model_hidden_size, lambda t: t["hin"])
            out[names.kDraftModelHiddenStates] = fill("hdraft", cfg.hidden_size, lambda t: t["hdraft"])
        for i in range(cfg.num_deepstack_features):
            out[names.deepstack_embeds(i)] = fill("ds", cfg.hidden_size, lambda t, i=i: t["ds"][i])
        if cfg.is_mrope:
            out[names.kRopeCosSin] = self.rope[:batch]
        return out

    def reference(self, b: int, extra: list[dict[str, Any]] = ()) -> tuple[np.ndarray, np.ndarray]:
        """reference_forward of sequence b's tokens (plus ``extra`` ones): (hidden, logits) of every token."""
        emb = np.stack(self.emb[b] + [t["e"] for t in extra])
        kw: dict[str, Any] = {}
        if self.cfg.role == "draft":
            kw["hidden_input"] = np.stack(self.hin[b] + [t["hin"] for t in extra])
            kw["hidden_from_draft"] = np.stack(self.hdraft[b] + [t["hdraft"] for t in extra])
        if self.cfg.num_deepstack_features:
            kw["deepstack"] = [np.stack(self.ds[b][i] + [t["ds"][i] for t in extra])
                               for i in range(self.cfg.num_deepstack_features)]
        if self.cfg.is_mrope:
            kw["rope"] = self.rope[b]
        return reference_forward(self.weights, self.cfg, emb, **kw)


def spec_causal(batch: int, seq: int) -> dict[str, np.ndarray]:
    """attention_mask [B,1,1] (causal sentinel; bytes ignored) and attention_pos_id [B,1]."""
    return {names.kAttentionMask: np.full((batch, 1, 1), -1, np.int32),
            names.kAttentionPosId: np.full((batch, 1), 7, np.int32)}


def prefill(h: Harness, seqs: Seqs, lengths: list[int]) -> np.ndarray:
    toks = [[seqs.token(b) for _ in range(n)] for b, n in enumerate(lengths)]
    for b, ts in enumerate(toks):
        for t in ts:
            seqs.push(b, t)
    batch = len(lengths)
    inputs = seqs.batch_inputs(toks)
    inputs[names.kContextLengths] = np.array(lengths, np.int32)
    inputs[names.kKVCacheStartIndex] = np.zeros(batch, np.int32)
    inputs[names.kLastTokenIds] = np.array(lengths, np.int64).reshape(batch, 1) - 1
    if h.cfg.role != "llm":
        inputs.update(spec_causal(batch, max(lengths)))
    logits, _ = h.run(0, inputs)
    return logits


def decode(h: Harness, seqs: Seqs, lengths: list[int]) -> np.ndarray:
    batch = len(lengths)
    toks = [[seqs.token(b)] for b in range(batch)]
    for b in range(batch):
        seqs.push(b, toks[b][0])
    inputs = seqs.batch_inputs(toks)
    inputs[names.kContextLengths] = np.array(lengths, np.int32) + 1
    inputs[names.kKVCacheStartIndex] = np.array(lengths, np.int32)
    inputs[names.kLastTokenIds] = np.zeros((batch, 1), np.int64)
    if h.cfg.role != "llm":
        inputs.update(spec_causal(batch, 1))
    logits, _ = h.run(1, inputs)
    for b in range(batch):
        lengths[b] += 1
    return logits


def assert_close(got: np.ndarray, want: np.ndarray, cfg: LLMEngineConfig) -> None:
    tol = 1e-4 if cfg.kv_dtype is trtio.DType.FLOAT32 else 2e-3
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# -- failure behaviour -----------------------------------------------------------------------------------


def fresh_context(role: str = "llm", strategy: ExecutionContextAllocationStrategy = STATIC, **kw: Any) -> Harness:
    return Harness(ReferenceEngine.from_config(make_cfg(role, **kw), device="host"), strategy=strategy)


def test_set_input_shape_refusals(caplog: pytest.LogCaptureFixture) -> None:
    h = fresh_context("base")
    ctx = h.ctx
    cases = [
        ("nope", (1, 1, 32), "not an I/O tensor"),
        (names.kLogits, (1, 64), "an output"),
        (names.kInputsEmbeds, (1, 1), "rank"),
        (names.kInputsEmbeds, (1, 1, 31), "fixes it to 32"),
        (names.kInputsEmbeds, (4, 1, 32), "outside profile 0"),  # Bmax = 3
        (names.kInputsEmbeds, (1, 13, 32), "outside profile 0"),  # Smax = 12
        (names.kInputsEmbeds, (1, 0, 32), "outside profile 0"),
        (names.kRopeCosSin, (1, 47, 4), "fixes it to 48"),
        (names.kAttentionMask, (1, 2, 1), "outside profile 0"),  # prefill masks are [B,1,1]
        ("k_cache_0", (1, 2, 47, 8), "fixes it to 48"),
        (names.kLastTokenIds, "xy", "not a sequence of ints"),
    ]
    for name, shape, why in cases:
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            assert ctx.set_input_shape(name, shape) is False, (name, shape)
        assert any(why in r.getMessage() for r in caplog.records), (name, shape, caplog.text)
    assert ctx.calls["set_input_shape"] == len(cases)
    assert ctx.set_input_shape(names.kInputsEmbeds, [3, 12, 32]) is True
    assert ctx.set_input_shape(names.kRopeCosSin, (1, 48, 4)) is True  # a static input may be set to itself
    assert ctx.get_tensor_shape(names.kInputsEmbeds) == (3, 12, 32)
    # profile 1 takes up to max_verify_tree_size tokens
    assert ctx.set_optimization_profile_async(1, h.stream.handle)
    assert ctx.set_input_shape(names.kInputsEmbeds, (3, 8, 32))
    assert not ctx.set_input_shape(names.kInputsEmbeds, (3, 9, 32))
    assert ctx.set_input_shape(names.kAttentionMask, (3, 8, 1))
    assert ctx.set_input_shape(names.kLastTokenIds, (3, 8))


def test_set_tensor_address_refusals(caplog: pytest.LogCaptureFixture) -> None:
    h = fresh_context()
    ctx = h.ctx
    before = ctx.calls["set_tensor_address"]
    ptr = h.tensors[names.kInputsEmbeds].data_ptr
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert ctx.set_tensor_address("nope", ptr) is False
        assert ctx.set_tensor_address(names.kInputsEmbeds, 0) is False
        assert ctx.set_tensor_address(names.kInputsEmbeds, ptr + 128) is False
    assert "not an I/O tensor" in caplog.text and "null" in caplog.text and "256-byte aligned" in caplog.text
    assert ctx.get_tensor_address(names.kInputsEmbeds) == ptr  # refusals change nothing
    assert ctx.get_tensor_address("present_k_cache_0") == h.tensors["k_cache_0"].data_ptr
    assert ctx.calls["set_tensor_address"] == before + 3
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert ctx.get_tensor_address("nope") == 0


def test_profiles_switch_and_forget_input_shapes() -> None:
    h = fresh_context()
    ctx = h.ctx
    assert ctx.active_optimization_profile == 0
    with pytest.raises(trtio.InvalidValueError, match="out of range"):
        ctx.set_optimization_profile_async(2, h.stream.handle)
    with pytest.raises(trtio.InvalidValueError, match="out of range"):
        ctx.set_optimization_profile_async(-1, h.stream.handle)
    assert ctx.set_optimization_profile_async(np.int64(0), h.stream.handle) is True
    assert ctx.set_input_shape(names.kInputsEmbeds, (2, 5, 32))
    assert ctx.set_optimization_profile_async(0, h.stream.handle)  # same profile: shapes kept
    assert ctx.get_tensor_shape(names.kInputsEmbeds) == (2, 5, 32)
    assert ctx.set_optimization_profile_async(1, h.stream.handle)
    assert ctx.active_optimization_profile == 1
    assert ctx.get_tensor_shape(names.kInputsEmbeds) == (-1, -1, 32)
    assert ctx.calls["set_optimization_profile_async"] == 5


def test_output_shapes_and_infer_shapes() -> None:
    h = fresh_context("base")
    ctx = h.ctx
    assert ctx.get_tensor_shape(names.kLogits) == (-1, 64)
    assert ctx.get_tensor_shape(names.kOutputHiddenStates) == (-1, -1, 32)
    assert ctx.get_tensor_shape("present_k_cache_1") == (-1, 2, 48, 8)
    assert ctx.get_tensor_shape(names.kRopeCosSin) == (1, 48, 4)  # static: known without set_input_shape
    missing = ctx.infer_shapes()
    assert names.kInputsEmbeds in missing and names.kRopeCosSin not in missing and names.kLogits not in missing
    ctx.set_optimization_profile_async(1, h.stream.handle)
    shapes = {names.kInputsEmbeds: (2, 6, 32), names.kContextLengths: (2,), names.kKVCacheStartIndex: (2,),
              names.kLastTokenIds: (2, 3), names.kAttentionMask: (2, 6, 1), names.kAttentionPosId: (2, 6)}
    for n, s in shapes.items():
        assert ctx.set_input_shape(n, s)
    for c in h.caches():
        assert ctx.set_input_shape(c, (2, 2, 48, 8))
    assert ctx.infer_shapes() == []
    assert ctx.get_tensor_shape(names.kLogits) == (6, 64)
    assert ctx.get_tensor_shape(names.kOutputHiddenStates) == (2, 6, 32)
    assert ctx.get_tensor_shape("present_v_cache_0") == (2, 2, 48, 8)
    assert ctx.set_input_shape(names.kAttentionPosId, (2, 5))  # neither 1 nor the step length
    with pytest.raises(trtio.EngineError, match="attention_pos_id"):
        ctx.infer_shapes()
    assert ctx.get_tensor_shape("nope") == ()


def llm_step_inputs(batch: int = 2, seq: int = 3) -> dict[str, np.ndarray]:
    return {
        names.kInputsEmbeds: np.zeros((batch, seq, 32), np.float16),
        names.kContextLengths: np.full(batch, seq, np.int32),
        names.kKVCacheStartIndex: np.zeros(batch, np.int32),
        names.kLastTokenIds: np.full((batch, 1), seq - 1, np.int64),
    }


def test_execute_refusals_name_the_binding(caplog: pytest.LogCaptureFixture) -> None:
    engine = ReferenceEngine.from_config(make_cfg(), device="host")
    ctx = engine.create_execution_context()
    stream = trtio.Stream.default("host")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert ctx.execute_async_v3(stream.handle) is False
    assert "'inputs_embeds' has no shape" in caplog.text or "input 'inputs_embeds' has no shape" in caplog.text
    assert "'present_k_cache_0' has no address" in caplog.text

    def check(mutate: Any, why: str) -> None:
        h = Harness(engine)
        h.stage(0, llm_step_inputs())
        assert h.ctx.execute_async_v3(h.stream.handle)
        mutate(h)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            assert h.ctx.execute_async_v3(h.stream.handle) is False
        assert why in caplog.text, caplog.text

    spare = new_tensor((2, 2, 48, 8), "float16")
    check(lambda h: h.ctx.set_tensor_address("present_k_cache_1", spare.data_ptr),
          "'present_k_cache_1' is bound to")
    check(lambda h: h.ctx.set_tensor_address("k_cache_1", spare.data_ptr), "'present_k_cache_1' is bound to")
    check(lambda h: h.ctx.set_input_shape("v_cache_0", (3, 2, 48, 8)), "'v_cache_0' has batch 3")
    check(lambda h: h.ctx.set_input_shape(names.kContextLengths, (3,)), "'context_lengths' has shape (3,)")
    check(lambda h: h.ctx.set_input_shape(names.kLastTokenIds, (1, 1)), "'last_token_ids' has shape (1, 1)")
    check(lambda h: h.ctx.set_optimization_profile_async(1, h.stream.handle), "has no shape")


def test_static_context_needs_no_memory_but_refuses_user_memory() -> None:
    h = fresh_context()
    with pytest.raises(trtio.EngineError, match="USER_MANAGED"):
        h.ctx.set_device_memory(h.tensors[names.kInputsEmbeds].data_ptr, 1024)


def test_user_managed_context_memory(caplog: pytest.LogCaptureFixture) -> None:
    engine = ReferenceEngine.from_config(make_cfg(), device="host")
    h = Harness(engine)  # addresses bound by a static context; reuse its tensors
    ctx = engine.create_execution_context(USER_MANAGED)
    for name, t in h.tensors.items():
        assert ctx.set_tensor_address(name, t.data_ptr)
    for c in h.caches():
        assert ctx.set_tensor_address("present_" + c, h.tensors[c].data_ptr)
    h.ctx = ctx
    h.stage(0, llm_step_inputs())
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert ctx.execute_async_v3(h.stream.handle) is False
    assert "set_device_memory" in caplog.text
    need = engine.get_device_memory_size_for_profile_v2(0)
    assert ctx.update_device_memory_size_for_shapes() == need
    mem = new_tensor((need,), "uint8")
    with pytest.raises(trtio.InvalidValueError, match="aligned"):
        ctx.set_device_memory(mem.data_ptr + 64, need - 256)
    with pytest.raises(trtio.InvalidValueError, match="aligned"):
        ctx.set_device_memory(0, 0)
    ctx.set_device_memory(mem.data_ptr, need - 256)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert ctx.execute_async_v3(h.stream.handle) is False
    assert f"{need - 256} bytes is smaller than the {need} bytes profile 0 needs" in caplog.text
    ctx.set_device_memory(mem.data_ptr, need)
    assert ctx.execute_async_v3(h.stream.handle) is True
    assert ctx.calls["set_device_memory"] == 4


def bound_context(h: Harness, strategy: Any) -> Any:
    """A new context of ``strategy`` on ``h``'s engine, bound to ``h``'s tensors; ``h`` now drives it."""
    ctx = h.engine.create_execution_context(strategy)
    for name, t in h.tensors.items():
        assert ctx.set_tensor_address(name, t.data_ptr)
    for c in h.caches():
        assert ctx.set_tensor_address("present_" + c, h.tensors[c].data_ptr)
    h.ctx = ctx
    return ctx


def test_create_execution_context_strategies(caplog: pytest.LogCaptureFixture) -> None:
    """TensorRT's allocation strategies (enum members or their ints): STATIC and ON_PROFILE_CHANGE contexts
    bring their own context memory, enough for every profile, so they execute in both profiles without
    set_device_memory, which they refuse; a USER_MANAGED context has none until set_device_memory hands it at
    least what the active profile needs (get_device_memory_size_for_profile_v2)."""
    engine = ReferenceEngine.from_config(make_cfg(), device="host")
    h = Harness(engine)
    steps = ((0, llm_step_inputs(seq=3)), (1, llm_step_inputs(seq=1)))
    need = [engine.get_device_memory_size_for_profile_v2(p) for p in range(2)]
    assert need[0] > need[1] and engine.device_memory_size_v2 == need[0]
    memory = new_tensor((need[0],), "uint8")
    names_seen = set()
    for strategy, kind in ((STATIC, "STATIC"), (0, "STATIC"), (ExecutionContextAllocationStrategy.ON_PROFILE_CHANGE,
                           "ON_PROFILE_CHANGE"), (1, "ON_PROFILE_CHANGE")):
        ctx = bound_context(h, strategy)
        assert ctx.engine is engine and ctx.active_optimization_profile == 0 and f"strategy={kind}" in repr(ctx)
        for profile, inputs in steps:
            h.stage(profile, inputs)
            assert ctx.execute_async_v3(h.stream.handle), (kind, profile)
        with pytest.raises(trtio.EngineError, match=f"needs a context created with .*USER_MANAGED, this one is {kind}"):
            ctx.set_device_memory(memory.data_ptr, need[0])
        names_seen.add(ctx.name)
    for strategy in (USER_MANAGED, 2):
        ctx = bound_context(h, strategy)
        assert "strategy=USER_MANAGED" in repr(ctx)
        h.stage(0, steps[0][1])
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            assert ctx.execute_async_v3(h.stream.handle) is False
        assert f"no context memory (USER_MANAGED: call set_device_memory with {need[0]} bytes)" in caplog.text
        ctx.set_device_memory(memory.data_ptr, need[1])  # enough for profile 1 only
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            assert ctx.execute_async_v3(h.stream.handle) is False
        assert f"context memory of {need[1]} bytes is smaller than the {need[0]} bytes profile 0 needs" in caplog.text
        h.stage(1, steps[1][1])
        assert ctx.update_device_memory_size_for_shapes() == need[1]
        assert ctx.execute_async_v3(h.stream.handle)
        ctx.set_device_memory(memory.data_ptr, need[0])
        h.stage(0, steps[0][1])
        assert ctx.execute_async_v3(h.stream.handle)
        names_seen.add(ctx.name)
    assert len(names_seen) == 6  # each context has a name of its own
    with pytest.raises(trtio.InvalidValueError, match="unknown allocation strategy 7"):
        engine.create_execution_context(7)


@pytest.mark.gpu
def test_gpu_context_memory_by_strategy() -> None:
    """On the GPU a STATIC context allocates device_memory_size_v2 bytes of its own and computes its scratch
    there; a USER_MANAGED one computes in the memory it is handed, within the active profile's need."""
    pytest.importorskip("cupy")
    engine = ReferenceEngine.from_config(make_cfg(), device="gpu")
    h = Harness(engine, backend="cuda")
    h.run(0, llm_step_inputs())
    assert 0 < h.ctx.scratch_peak_bytes <= engine.device_memory_size_v2
    ctx = bound_context(h, USER_MANAGED)
    need = engine.get_device_memory_size_for_profile_v2(0)
    memory = new_tensor((need,), "uint8", backend="cuda")
    ctx.set_device_memory(memory.data_ptr, need)
    h.run(0, llm_step_inputs())
    assert 0 < ctx.scratch_peak_bytes <= need


def test_validation_is_cached_and_counters_count(monkeypatch: pytest.MonkeyPatch) -> None:
    h = fresh_context()
    ctx = h.ctx
    h.stage(0, llm_step_inputs())
    validations = []
    real = type(ctx)._validate

    def spy(self: Any) -> Any:
        validations.append(1)
        return real(self)

    monkeypatch.setattr(type(ctx), "_validate", spy)
    for _ in range(3):
        assert ctx.execute_async_v3(h.stream.handle)
    assert len(validations) == 1
    before = dict(ctx.calls)
    # setting what is already set changes nothing, so nothing is validated again
    assert ctx.set_input_shape(names.kInputsEmbeds, (2, 3, 32))
    assert ctx.set_tensor_address(names.kLogits, h.tensors[names.kLogits].data_ptr)
    assert ctx.set_optimization_profile_async(0, h.stream.handle)
    assert ctx.execute_async_v3(h.stream.handle)
    assert len(validations) == 1
    h.tensors[names.kInputsEmbeds].reshape((2, 4, 32)).zero_(h.stream)
    assert ctx.set_input_shape(names.kInputsEmbeds, (2, 4, 32))  # a change: validated again
    assert ctx.execute_async_v3(h.stream.handle)
    assert len(validations) == 2
    assert ctx.calls == {**before, "set_input_shape": before["set_input_shape"] + 2,
                         "set_tensor_address": before["set_tensor_address"] + 1,
                         "set_optimization_profile_async": before["set_optimization_profile_async"] + 1,
                         "execute_async_v3": before["execute_async_v3"] + 2}


def test_steady_decode_makes_no_set_calls() -> None:
    """What trtio's executor aims for: with unchanged bindings a step is just execute_async_v3."""
    cfg = make_cfg()
    h = Harness(ReferenceEngine.from_config(cfg, device="host"))
    seqs = Seqs(cfg, 2)
    lengths = [4, 2]
    prefill(h, seqs, lengths)
    decode(h, seqs, lengths)
    before = dict(h.ctx.calls)
    for _ in range(3):
        # new data in the same buffers, and the lengths as device data: no binding changes
        toks = [[seqs.token(b)] for b in range(2)]
        for b in range(2):
            seqs.push(b, toks[b][0])
        h.tensors[names.kInputsEmbeds].copy_from(seqs.batch_inputs(toks)[names.kInputsEmbeds], h.stream)
        h.tensors[names.kContextLengths].copy_from(np.array(lengths, np.int32) + 1, h.stream)
        h.tensors[names.kKVCacheStartIndex].copy_from(np.array(lengths, np.int32), h.stream)
        assert h.ctx.execute_async_v3(h.stream.handle)
        lengths = [n + 1 for n in lengths]
        logits, _ = h.outputs()
        for b in range(2):
            assert_close(logits[b], seqs.reference(b)[1][-1], cfg)
    after = h.ctx.calls
    assert {k: after[k] - before[k] for k in after} == {
        "set_input_shape": 0, "set_tensor_address": 0, "set_optimization_profile_async": 0,
        "set_device_memory": 0, "execute_async_v3": 3}


# -- numerics ---------------------------------------------------------------------------------------------


NUMERIC_VARIANTS = {
    "f16": ("llm", {}),
    "bf16": ("llm", dict(activation_dtype="bfloat16", kv_cache_dtype="bfloat16")),
    "f32": ("llm", dict(activation_dtype="float32", kv_cache_dtype="float32")),
    "deepstack-mrope": ("llm", dict(num_deepstack_features=2, rope_type="mrope")),
    "gqa1-rope-full": ("llm", dict(num_kv_heads=1, rotary_dim=8, output_vocab_size=40)),
    "base": ("base", {}),
    "draft": ("draft", {}),
}


@pytest.mark.parametrize("variant", list(NUMERIC_VARIANTS))
def test_prefill_and_decode_match_the_reference(variant: str) -> None:
    """A batch of prompts of different lengths (padded), then decode steps with the KV cache."""
    role, kw = NUMERIC_VARIANTS[variant]
    cfg = make_cfg(role, **kw)
    h = Harness(ReferenceEngine.from_config(cfg, device="host"))
    seqs = Seqs(cfg, 3)
    lengths = [7, 3, 12]
    logits = prefill(h, seqs, lengths)
    assert logits.shape == (3, cfg.output_vocab_size)
    for b in range(3):
        assert_close(logits[b], seqs.reference(b)[1][-1], cfg)
    _, hidden = h.outputs()
    ref_hidden = seqs.reference(0)[0]
    got_hidden = hidden[0, :7].astype(np.float32)
    np.testing.assert_allclose(got_hidden, ref_hidden.astype(np_act(cfg.activation)).astype(np.float32),
                               rtol=2e-2, atol=2e-2)
    for _ in range(4):
        logits = decode(h, seqs, lengths)
        for b in range(3):
            assert_close(logits[b], seqs.reference(b)[1][-1], cfg)
    assert lengths == [11, 7, 16]


def test_decode_with_a_smaller_batch_reuses_the_cache_rows() -> None:
    """Cache batch follows the step batch: sequence b keeps its rows at the same address."""
    cfg = make_cfg()
    h = Harness(ReferenceEngine.from_config(cfg, device="host"))
    seqs = Seqs(cfg, 3)
    lengths = [5, 9, 2]
    prefill(h, seqs, lengths)
    two = lengths[:2]
    seqs2 = seqs
    logits = decode(h, seqs2, two)  # batch 2 now: sequences 0 and 1
    for b in range(2):
        assert_close(logits[b], seqs.reference(b)[1][-1], cfg)


def test_kv_cache_holds_rounded_k_and_v_at_their_slots() -> None:
    cfg = make_cfg(num_attention_layers=1)
    h = Harness(ReferenceEngine.from_config(cfg, device="host"))
    seqs = Seqs(cfg, 2)
    prefill(h, seqs, [4, 2])
    k = h.tensors["k_cache_0"].to_numpy(h.stream)
    v = h.tensors["v_cache_0"].to_numpy(h.stream)
    w = h.engine.weights
    x = np.stack(seqs.emb[1]).astype(np.float32)
    want_v = (x @ w.wv[0]).reshape(2, 2, 8).astype(np.float16)
    np.testing.assert_allclose(v[1, :, :2, :].transpose(1, 0, 2), want_v, rtol=1e-3, atol=1e-3)
    assert not v[1, :, 2:].any() and not k[1, :, 2:4].any()  # the padded prompt slots hold padding rows
    assert k[2:].sum() == 0 and v[2:].sum() == 0  # rows of sequences not in the batch are untouched


def tree_inputs(parents: list[list[int]], kv: list[int], n: int) -> dict[str, np.ndarray]:
    """Verify-step inputs for trees given by parent lists, padded to n nodes."""
    batch = len(parents)
    mask = np.zeros((batch, n, n), bool)
    for b, par in enumerate(parents):
        mask[b, :len(par), :len(par)] = ancestor_mask(np.array(par))
    return {
        names.kAttentionMask: pack_tree_mask(mask),
        names.kAttentionPosId: tree_position_ids(mask, np.array(kv)),
        names.kContextLengths: (np.array(kv) + n).astype(np.int32),
        names.kKVCacheStartIndex: np.array(kv, np.int32),
        names.kLastTokenIds: np.tile(np.arange(n, dtype=np.int64), (batch, 1)),
    }


def path_to(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("big", [False, True], ids=["8-nodes", "40-nodes"])
def test_tree_verify_equals_decoding_each_path(big: bool) -> None:
    """Tree verification: a verify step's logits for node i are those of decoding root..i in order."""
    if big:
        cfg = make_cfg("base", max_verify_tree_size=40, max_kv_cache_capacity=64)
        trees = [[-1] + [i // 2 for i in range(39)], [-1, 0, 0, 1] + list(range(3, 33))]
        n = 40
    else:
        cfg = make_cfg("base")
        trees = [[-1, 0, 0, 1, 1, 2, 5, 3], [-1, 0, 1, 0, 3]]
        n = 8
    engine = ReferenceEngine.from_config(cfg, device="host")
    h = Harness(engine)
    seqs = Seqs(cfg, 2)
    lengths = [5, 9]
    prefill(h, seqs, lengths)
    after_prefill = h.snapshot()
    nodes = [[seqs.token(b) for _ in trees[b]] for b in range(2)]
    inputs = seqs.batch_inputs(nodes)
    inputs.update(tree_inputs(trees, lengths, n))
    logits, _ = h.run(1, inputs)
    assert logits.shape == (2 * n, cfg.output_vocab_size)
    # ground truth: the whole path recomputed from scratch
    for b in range(2):
        for node in range(len(trees[b])):
            path = [nodes[b][i] for i in path_to(trees[b], node)]
            assert_close(logits[b * n + node], seqs.reference(b, path)[1][-1], cfg)
    # and the engine itself decoding each path token by token from the state after the prefill
    for b in range(2):
        for node in range(len(trees[b])):
            path = path_to(trees[b], node)
            if big and node % 7:
                continue  # enough paths of the big tree
            h.restore(after_prefill)
            kv = lengths[b]
            for i in path:
                step = seqs.batch_inputs([[nodes[b][i]]])
                step.update({names.kContextLengths: np.array([kv + 1], np.int32),
                             names.kKVCacheStartIndex: np.array([kv], np.int32),
                             names.kLastTokenIds: np.zeros((1, 1), np.int64), **spec_causal(1, 1)})
                if b == 1:  # sequence 1 lives in cache row 1: decode it as a batch of 2, row 0 idle
                    step = {k: np.concatenate([v, v]) for k, v in step.items()}
                    step[names.kContextLengths][0] = 1
                    step[names.kKVCacheStartIndex][0] = 0
                seq_logits, _ = h.run(1, step)
                kv += 1
            assert_close(logits[b * n + node], seq_logits[b], cfg)


def test_tree_nodes_are_written_to_consecutive_slots() -> None:
    cfg = make_cfg("base", num_attention_layers=1)
    h = Harness(ReferenceEngine.from_config(cfg, device="host"))
    seqs = Seqs(cfg, 1)
    prefill(h, seqs, [3])
    nodes = [[seqs.token(0) for _ in range(4)]]
    inputs = seqs.batch_inputs(nodes)
    inputs.update(tree_inputs([[-1, 0, 0, 1]], [3], 4))
    h.run(1, inputs)
    v = h.tensors["v_cache_0"].to_numpy(h.stream)[0]  # [Hkv, C, D]
    w = h.engine.weights
    x = np.stack([t["e"] for t in nodes[0]]).astype(np.float32)
    want = (x @ w.wv[0]).reshape(4, 2, 8).transpose(1, 0, 2).astype(np.float16)
    np.testing.assert_allclose(v[:, 3:7], want, rtol=1e-3, atol=1e-3)
    assert not v[:, 7:].any()


def test_draft_proposal_step_with_top_k_rows() -> None:
    """Draft: hidden_states_input / hidden_states_from_draft feed x; last_token_ids picks K rows per sequence."""
    cfg = make_cfg("draft")
    h = Harness(ReferenceEngine.from_config(cfg, device="host"))
    seqs = Seqs(cfg, 2)
    lengths = [6, 4]
    logits = prefill(h, seqs, lengths)
    for b in range(2):
        assert_close(logits[b], seqs.reference(b)[1][-1], cfg)
    trees = [[-1, 0, 0, 1, 2], [-1, 0, 1, 2, 2]]
    nodes = [[seqs.token(b) for _ in range(5)] for b in range(2)]
    inputs = seqs.batch_inputs(nodes)
    inputs.update(tree_inputs(trees, lengths, 5))
    inputs[names.kLastTokenIds] = np.array([[3, 4], [3, 4]], np.int64)
    logits, hidden = h.run(1, inputs)
    assert logits.shape == (4, cfg.output_vocab_size) and hidden.shape == (2, 5, 32)
    for b in range(2):
        for k, node in enumerate((3, 4)):
            path = [nodes[b][i] for i in path_to(trees[b], node)]
            assert_close(logits[b * 2 + k], seqs.reference(b, path)[1][-1], cfg)


def test_padding_rows_and_unseen_queries_give_finite_outputs() -> None:
    cfg = make_cfg("base")
    h = Harness(ReferenceEngine.from_config(cfg, device="host"))
    seqs = Seqs(cfg, 1)
    prefill(h, seqs, [1])
    nodes = [[seqs.token(0) for _ in range(3)]]
    inputs = seqs.batch_inputs(nodes)
    inputs.update(tree_inputs([[-1]], [0], 3))  # no past; rows 1 and 2 see nothing at all
    logits, hidden = h.run(1, inputs)
    assert np.isfinite(logits).all() and np.isfinite(hidden.astype(np.float32)).all()


def test_bad_data_raises_on_the_host() -> None:
    cfg = make_cfg()
    h = Harness(ReferenceEngine.from_config(cfg, device="host"))
    inputs = llm_step_inputs(1, 3)
    inputs[names.kKVCacheStartIndex] = np.array([46], np.int32)  # 46 + 3 > C = 48
    h.stage(0, inputs)
    with pytest.raises(ValueError, match="max_kv_cache_capacity"):
        h.ctx.execute_async_v3(h.stream.handle)
    inputs = llm_step_inputs(1, 3)
    inputs[names.kLastTokenIds] = np.array([[3]], np.int64)
    h.stage(0, inputs)
    with pytest.raises(ValueError, match="last_token_ids"):
        h.ctx.execute_async_v3(h.stream.handle)


def test_bf16_conversions_match_ml_dtypes() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.standard_normal(4000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 4000),
        np.array([0.0, -0.0, np.inf, -np.inf, 3.3895314e38, 1e-40, -1e-45], np.float32),
        # exact ties: the lower 16 bits are 0x8000, with even and odd upper halves
        np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x7F7F8000], np.uint32).view(np.float32),
    ]).astype(np.float32)
    bits = reference_math._store(np, x, trtio.DType.BFLOAT16)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(bits, x.astype(ml_dtypes.bfloat16).view(np.uint16))
    back = reference_math._load(np, bits, trtio.DType.BFLOAT16)
    np.testing.assert_array_equal(back, x.astype(ml_dtypes.bfloat16).astype(np.float32))
    nan = reference_math._store(np, np.array([np.nan, -np.nan], np.float32), trtio.DType.BFLOAT16)
    assert np.isnan(reference_math._load(np, nan, trtio.DType.BFLOAT16)).all()


# -- host "graphs" and null compute ------------------------------------------------------------------------


def test_host_graph_replay_recomputes_on_new_data_bit_for_bit() -> None:
    cfg = make_cfg("base", activation_dtype="bfloat16")
    h = Harness(ReferenceEngine.from_config(cfg, device="host"))
    backend = trtio.get_backend("host")
    seqs = Seqs(cfg, 2)
    lengths = [4, 6]
    prefill(h, seqs, lengths)
    first = [[seqs.token(b) for _ in range(3)] for b in range(2)]
    inputs = seqs.batch_inputs(first)
    inputs.update(tree_inputs([[-1, 0, 0], [-1, 0, 1]], lengths, 3))
    h.stage(1, inputs)
    snap = h.snapshot()
    logits_before = h.tensors[names.kLogits].to_numpy(h.stream).copy()
    backend.begin_capture(h.stream.handle)
    try:
        assert h.ctx.execute_async_v3(h.stream.handle)
    finally:
        graph = backend.end_capture(h.stream.handle)
    np.testing.assert_array_equal(h.tensors[names.kLogits].to_numpy(h.stream), logits_before)  # only recorded
    assert h.snapshot().keys() == snap.keys() and all(np.array_equal(h.snapshot()[k], snap[k]) for k in snap)

    # new data in the same buffers, then replay
    second = [[seqs.token(b) for _ in range(3)] for b in range(2)]
    new = seqs.batch_inputs(second)
    new.update(tree_inputs([[-1, 0, 1], [-1, 0, 0]], lengths, 3))
    for name, array in new.items():
        h.tensors[name].reshape(array.shape).copy_from(array, h.stream)
    backend.launch_graph(graph, h.stream.handle)
    replay_logits, replay_hidden = h.outputs()
    replay_caches = h.snapshot()

    h.restore(snap)
    direct_logits, direct_hidden = h.run(1, new)
    np.testing.assert_array_equal(replay_logits, direct_logits)
    np.testing.assert_array_equal(replay_hidden, direct_hidden)
    direct_caches = h.snapshot()
    for k in snap:
        np.testing.assert_array_equal(replay_caches[k], direct_caches[k])
    backend.destroy_graph(graph)


def test_host_graph_keeps_the_bindings_of_capture_time() -> None:
    cfg = make_cfg()
    h = Harness(ReferenceEngine.from_config(cfg, device="host"))
    backend = trtio.get_backend("host")
    h.stage(0, llm_step_inputs(2, 3))
    backend.begin_capture(h.stream.handle)
    assert h.ctx.execute_async_v3(h.stream.handle)
    graph = backend.end_capture(h.stream.handle)
    other = new_tensor((3, 64), "float32")
    other.fill_(7.0)
    assert h.ctx.set_tensor_address(names.kLogits, other.data_ptr)  # after capture: the graph ignores it
    h.tensors[names.kLogits].fill_(-1.0)
    backend.launch_graph(graph, h.stream.handle)
    assert (other.to_numpy() == 7.0).all()
    assert not (h.tensors[names.kLogits].reshape((2, 64)).to_numpy() == -1.0).any()
    backend.destroy_graph(graph)


def test_null_compute_validates_but_touches_nothing(caplog: pytest.LogCaptureFixture) -> None:
    cfg = make_cfg("base")
    engine = ReferenceEngine.from_config(cfg, device="host", null_compute=True)
    assert engine.io_contract() == expected_contract(cfg)
    h = Harness(engine)
    h.tensors[names.kLogits].fill_(3.0)
    h.tensors[names.kOutputHiddenStates].fill_(2.0)
    inputs = llm_step_inputs(2, 3)
    inputs[names.kInputsEmbeds][:] = 1.0
    inputs.update(spec_causal(2, 3))
    h.stage(0, inputs)
    snap = h.snapshot()
    assert h.ctx.execute_async_v3(h.stream.handle)
    assert (h.tensors[names.kLogits].to_numpy() == 3.0).all()
    assert (h.tensors[names.kOutputHiddenStates].to_numpy() == 2.0).all()
    assert all(np.array_equal(h.snapshot()[k], snap[k]) for k in snap)
    h.ctx.set_input_shape("k_cache_0", (1, 2, 48, 8))
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert h.ctx.execute_async_v3(h.stream.handle) is False
    assert "KVCacheUpdate" in caplog.text


def test_null_compute_36_layers_is_cheap_to_build() -> None:
    cfg = make_cfg(num_attention_layers=36, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                   head_dim=128, rotary_dim=128, vocab_size=128256, max_kv_cache_capacity=4096,
                   max_supported_input_length=2048, max_supported_batch_size=8)
    engine = ReferenceEngine.from_config(cfg, device="host", null_compute=True)
    assert engine.num_io_tensors == 4 + 1 + 36 * 2 + 2 + 36 * 2
    assert engine.get_tensor_name(engine.num_io_tensors - 1) == "present_v_cache_35"
    ctx = engine.create_execution_context(USER_MANAGED)
    assert engine.device_memory_size_v2 == 512
    assert ctx.update_device_memory_size_for_shapes() == 512


# -- GPU ------------------------------------------------------------------------------------------------------


def _gpu_engine(cfg: LLMEngineConfig) -> ReferenceEngine:
    pytest.importorskip("cupy")
    return ReferenceEngine.from_config(cfg, device="gpu")


def _run_scenario(h: Harness, seqs: Seqs) -> list[np.ndarray]:
    """Prefill, two decodes and a tree verify (base) or three decodes: every step's logits."""
    lengths = [5, 2, 9]
    out = [prefill(h, seqs, lengths)]
    for _ in range(2):
        out.append(decode(h, seqs, lengths))
    if h.cfg.role == "base":
        nodes = [[seqs.token(b) for _ in range(4)] for b in range(3)]
        inputs = seqs.batch_inputs(nodes)
        inputs.update(tree_inputs([[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 0, 0]], lengths, 4))
        out.append(h.run(1, inputs)[0])
    return out


GPU_VARIANTS = {
    "f16": ("llm", {}),
    "bf16-deepstack-mrope": ("llm", dict(activation_dtype="bfloat16", kv_cache_dtype="bfloat16",
                                         num_deepstack_features=1, rope_type="mrope")),
    "base": ("base", {}),
    "draft": ("draft", {}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(GPU_VARIANTS))
def test_gpu_matches_host(variant: str) -> None:
    role, kw = GPU_VARIANTS[variant]
    cfg = make_cfg(role, **kw)
    gpu = Harness(_gpu_engine(cfg), backend="cuda")
    host = Harness(ReferenceEngine.from_config(cfg, device="host"), backend="host")
    got = _run_scenario(gpu, Seqs(cfg, 3, seed=4))
    want = _run_scenario(host, Seqs(cfg, 3, seed=4))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-3)
    gc, hc = gpu.snapshot(), host.snapshot()
    for k in gc:
        np.testing.assert_allclose(gc[k].astype(np.float32), hc[k].astype(np.float32), rtol=2e-2, atol=2e-2)
    assert 0 < gpu.ctx.scratch_peak_bytes <= gpu.engine.device_memory_size_v2


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", [STATIC, USER_MANAGED], ids=["static", "user-managed"])
def test_gpu_graph_replay_equals_direct_execution(strategy: ExecutionContextAllocationStrategy) -> None:
    import cupy

    cfg = make_cfg("base", activation_dtype="bfloat16")
    h = Harness(_gpu_engine(cfg), backend="cuda", strategy=strategy)
    backend = trtio.get_backend("cuda")
    seqs = Seqs(cfg, 2)
    lengths = [4, 7]
    prefill(h, seqs, lengths)
    inputs = seqs.batch_inputs([[seqs.token(b) for _ in range(3)] for b in range(2)])
    inputs.update(tree_inputs([[-1, 0, 0], [-1, 0, 1]], lengths, 3))
    snap = h.snapshot()
    h.run(1, inputs)  # the warm-up execute: compiles CuPy's kernels for these shapes
    h.restore(snap)
    pool = cupy.get_default_memory_pool()
    used, total = pool.used_bytes(), pool.total_bytes()
    allocs = backend.alloc_count
    backend.begin_capture(h.stream.handle)  # thread-local mode: a cudaMalloc here would fail the capture
    try:
        assert h.ctx.execute_async_v3(h.stream.handle)
    except BaseException:
        backend.abort_capture(h.stream.handle)
        raise
    graph = backend.end_capture(h.stream.handle)
    assert (pool.used_bytes(), pool.total_bytes(), backend.alloc_count) == (used, total, allocs)

    new = seqs.batch_inputs([[seqs.token(b) for _ in range(3)] for b in range(2)])
    new.update(tree_inputs([[-1, 0, 1], [-1, 0, 0]], lengths, 3))
    for name, array in new.items():
        h.tensors[name].reshape(array.shape).copy_from(array, h.stream)
    backend.launch_graph(graph, h.stream.handle)
    replay = h.outputs()
    replay_caches = h.snapshot()
    h.restore(snap)
    direct = h.run(1, new)
    for a, b in zip(replay, direct):
        np.testing.assert_array_equal(a, b)
    for k, v in h.snapshot().items():
        np.testing.assert_array_equal(replay_caches[k], v)
    backend.destroy_graph(graph)


@pytest.mark.gpu
def test_gpu_scratch_fits_the_worst_case_shapes() -> None:
    cfg = make_cfg("base", max_supported_batch_size=2, max_supported_input_length=24, max_kv_cache_capacity=64,
                   max_verify_tree_size=16)
    h = Harness(_gpu_engine(cfg), backend="cuda")
    bm, smax = 2, 24
    inputs = {names.kInputsEmbeds: np.zeros((bm, smax, 32), np.float16),
              names.kContextLengths: np.full(bm, smax, np.int32),
              names.kKVCacheStartIndex: np.zeros(bm, np.int32),
              names.kLastTokenIds: np.full((bm, 1), smax - 1, np.int64), **spec_causal(bm, smax)}
    h.run(0, inputs)
    assert h.ctx.scratch_peak_bytes <= h.engine.get_device_memory_size_for_profile_v2(0)
    inputs = seqs_free_tree(bm, 16)
    h.run(1, inputs)
    assert h.ctx.scratch_peak_bytes <= h.engine.device_memory_size_v2


def seqs_free_tree(batch: int, n: int) -> dict[str, np.ndarray]:
    inputs = tree_inputs([[-1] + list(range(n - 1))] * batch, [10] * batch, n)
    inputs[names.kInputsEmbeds] = np.ones((batch, n, 32), np.float16)
    return inputs
