"""trtio.testing.reference_engine on Edge-LLM 0.11's token-major ("ragged") contract with a paged KV cache.

The specification is docs/toy-model.md, "The token-major (ragged) contract". Everything here drives the
raw engine API (set_input_shape / set_tensor_address / execute_async_v3 on a USER_MANAGED context) on
buffers from trtio.Tensor, with each step laid out as Edge-LLM's runtime lays it out (entry padding,
phases, lengths, RoPE rows, page table, logits rows), and compares with toy_model.reference_forward,
which recomputes each sequence from scratch. Tests marked gpu run the CuPy device and skip where no
GPU answers.

Tolerances: the engine and the reference both compute in float32 from the same rounded inputs, in a
different order (cached K/V, padded rows, masked slots), so outputs differ by float32 reassociation
(~1e-6 relative per operation, a few layers deep); with 16-bit or 8-bit K/V a float32 difference can
also move a K/V element across a rounding boundary of the cache dtype. 1e-4 for float32 caches and
2e-3 otherwise cover both with margin while still catching a wrong binding, which changes outputs by
O(0.1). Where the two sides do the same operations on the same shapes (page-table permutations), results
are compared bit for bit.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import trtio
from trtio import names
from trtio._config import LLMEngineConfig
from trtio._cuda.backend import Backend
from trtio._trees import ancestor_mask, pack_tree_mask
from trtio.testing import reference_engine as re_mod
from trtio.testing import reference_math
from trtio.testing.reference_engine import (
    RAGGED_OMITTABLE,
    DataType,
    ExecutionContextAllocationStrategy,
    ReferenceEngine,
    TensorIOMode,
)
from trtio.testing.toy_model import ToyWeights, log_softmax, reference_forward, rope_table, toy_embedding

LOGGER = "trtio.testing.reference_engine"
USER_MANAGED = ExecutionContextAllocationStrategy.USER_MANAGED
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "edgellm-0.11"


# -- configs ----------------------------------------------------------------------------------------------


def fixture_cfg(role: str) -> LLMEngineConfig:
    """The tiny Qwen3 LLM / EAGLE3 base / draft of the fixtures (config.json, base_/draft_config.json),
    written out by hand: 8 layers (draft 1), hidden 64, 4 heads, 2 KV heads, head_dim 16, batch 4,
    input 64, KV 128, a pool of 4 pages of 128."""
    fields: dict[str, Any] = dict(
        hidden_size=64, vocab_size=512, max_supported_batch_size=4, max_supported_input_length=64,
        max_kv_cache_capacity=128, num_attention_layers=8, num_attention_heads=4, num_kv_heads=2, head_dim=16,
        kv_pool_pages=4, activation_dtype="float16", kv_cache_dtype="float16", contract="ragged")
    if role == "base":
        fields.update(is_spec_decode_base=True, max_verify_tree_size=8, eagle_hidden_state_layers=(2, 4, 5))
    elif role == "draft":
        fields.update(num_attention_layers=1, output_vocab_size=256, base_model_hidden_size=192,
                      max_draft_tree_size=8)
    return LLMEngineConfig(**fields).validate()


def small_cfg(role: str = "llm", **kw: Any) -> LLMEngineConfig:
    """A small ragged config: pages of 16 slots, 3 pages per sequence (capacity 48)."""
    fields: dict[str, Any] = dict(
        hidden_size=32, vocab_size=64, max_supported_batch_size=3, max_supported_input_length=12,
        max_kv_cache_capacity=48, num_attention_layers=2, num_attention_heads=4, num_kv_heads=2,
        head_dim=8, rotary_dim=4, kv_page_size=16, contract="ragged")
    if role == "base":
        # layers listed out of order: hidden_states concatenates them in the order given
        fields.update(num_attention_layers=3, is_spec_decode_base=True, max_verify_tree_size=8,
                      eagle_hidden_state_layers=(1, 0, 2))
    elif role == "draft":
        fields.update(num_attention_layers=1, base_model_hidden_size=96, max_draft_tree_size=6,
                      output_vocab_size=40)
    fields.update(kw)
    return LLMEngineConfig(**fields).validate()


# -- the declared I/O equals the real exporter's -----------------------------------------------------------


_ONNX_DTYPES = {"FLOAT16": "float16", "FLOAT": "float32", "INT32": "int32", "INT64": "int64"}
_FIXTURE_FILES = {"llm": "qwen3-tiny-llm", "base": "qwen3-tiny-eagle3-base", "draft": "qwen3-tiny-eagle3-draft"}


def exporter_io(role: str) -> list[tuple[str, str, str, tuple[int, ...]]]:
    """(name, mode, dtype, shape with -1 for symbolic dims) of every graph I/O, in the file's order."""
    out = []
    mode = ""
    for line in (FIXTURES / "onnx-io" / f"{_FIXTURE_FILES[role]}.txt").read_text().splitlines():
        if line.strip() in ("inputs:", "outputs:"):
            mode = line.strip()[:-2]
            continue
        if not line.startswith("  "):
            mode = ""  # a header or the custom-op summary
        if not mode:
            continue
        name, dtype, dims = line.split(maxsplit=2)
        shape = tuple(int(d) if d.strip().isdigit() else -1 for d in dims.strip("[]").split(","))
        out.append((name, mode, _ONNX_DTYPES[dtype], shape))
    return out


@pytest.mark.parametrize("role", ["llm", "base", "draft"])
def test_declared_io_equals_the_exporters(role: str) -> None:
    cfg = fixture_cfg(role)
    engine = ReferenceEngine.from_config(cfg, device="host")
    want = exporter_io(role)
    assert [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)] == [w[0] for w in want]
    profiles = json.loads((FIXTURES / "profiles.json").read_text())[role]
    assert engine.num_optimization_profiles == 2
    for name, mode, dtype, shape in want:
        assert engine.get_tensor_mode(name) is TensorIOMode[mode.upper()], name
        assert trtio.DType.from_trt(engine.get_tensor_dtype(name)) == trtio.DType.coerce(dtype), name
        assert engine.get_tensor_shape(name) == shape, name
        if mode == "input":
            for p in range(2):
                got = engine.get_tensor_profile_shape(name, p)
                assert [list(s) for s in got] == profiles[name][f"profile{p}"], (name, p)
            assert engine.get_aliased_input_tensor(name) is None
        else:
            alias = name.replace("present_", "past_") if name.startswith("present_key_values_") else None
            assert engine.get_aliased_input_tensor(name) == alias
    assert set(profiles) == {w[0] for w in want if w[1] == "input"}
    assert engine.contract == "ragged" and "ragged" in repr(engine)
    # null compute declares the same
    null = ReferenceEngine.from_config(cfg, device="host", null_compute=True)
    assert null.io_contract() == engine.io_contract()


def test_omit_drops_the_optional_inputs() -> None:
    cfg = fixture_cfg("base")
    full = [d["name"] for d in ReferenceEngine.from_config(cfg, device="host").io_contract()]
    engine = ReferenceEngine.from_config(cfg, device="host", omit=RAGGED_OMITTABLE)
    got = [d["name"] for d in engine.io_contract()]
    assert got == [n for n in full if n not in RAGGED_OMITTABLE]
    assert names.kSkipSoftmaxScale not in full
    only = ReferenceEngine.from_config(cfg, device="host", omit=[names.kPositions])
    assert [d["name"] for d in only.io_contract()] == [n for n in full if n != names.kPositions]
    with pytest.raises(ValueError, match="can only lack"):
        ReferenceEngine.from_config(cfg, device="host", omit=[names.kPackedAttentionMask])  # required
    with pytest.raises(ValueError, match="can only lack"):
        ReferenceEngine.from_config(fixture_cfg("llm"), device="host", omit=[names.kTreeDepths])  # not declared
    with pytest.raises(ValueError, match="ragged contract"):
        ReferenceEngine.from_config(small_cfg(contract=None), device="host", omit=[names.kPositions])
    with pytest.raises(ValueError, match="fixed_cache_batch"):
        ReferenceEngine.from_config(cfg, device="host", fixed_cache_batch=True)


def test_fp8_pools_and_device_memory() -> None:
    cfg = small_cfg("base", kv_cache_dtype="fp8")
    engine = ReferenceEngine.from_config(cfg, device="host")
    assert engine.get_tensor_dtype(names.past_key_values(0)) is DataType.FP8
    assert engine.get_tensor_dtype(names.present_key_values(2)) is DataType.FP8
    sizes = [engine.get_device_memory_size_for_profile_v2(p) for p in range(2)]
    assert all(s >= 512 and s % 256 == 0 for s in sizes)
    assert engine.device_memory_size_v2 == max(sizes)
    assert sizes[0] > sizes[1]  # 36 prefill rows against 24 verify rows
    assert ReferenceEngine.from_config(cfg, device="host", null_compute=True).device_memory_size_v2 == 512
    with pytest.raises(ValueError, match="ragged contract only"):
        ReferenceEngine.from_config(small_cfg(contract=None, kv_cache_dtype="fp8"), device="host")


# -- the harness: an engine driven as Edge-LLM's runtime drives it --------------------------------------------


_OPEN: list[Any] = []


@pytest.fixture(autouse=True)
def _close_what_the_test_opened() -> Any:
    yield
    while _OPEN:
        _OPEN.pop().close()


class Rig:
    """One USER_MANAGED context with every binding in a trtio Tensor at its largest shape, bound once.

    ``table`` is the page table of every sequence slot (Edge-LLM's default: identity, slot b owns
    pages b*M .. b*M+M-1, V ids = K ids + P); a step binds rows ``slots`` of it.
    """

    def __init__(self, engine: ReferenceEngine, backend: str = "host", table: np.ndarray | None = None) -> None:
        _OPEN.append(self)
        self.engine = engine
        self.cfg: LLMEngineConfig = engine.config
        self.backend = backend
        self.stream = trtio.Stream.create(backend)
        self.tensors: dict[str, trtio.Tensor] = {}
        self.ctx = engine.create_execution_context(USER_MANAGED)
        size = engine.device_memory_size_v2
        self.memory = self._new("context_memory", (size,), trtio.DType.UINT8)
        self.ctx.set_device_memory(self.memory.data_ptr, size)
        for i in range(engine.num_io_tensors):
            name = engine[i]
            if engine.get_aliased_input_tensor(name):
                continue
            dtype = trtio.DType.from_trt(engine.get_tensor_dtype(name))
            if engine.get_tensor_mode(name) is TensorIOMode.INPUT:
                rank = len(engine.get_tensor_shape(name))
                shape = tuple(max(max(engine.get_tensor_profile_shape(name, p)[2][a] for p in range(2)), 1)
                              for a in range(rank))
            else:
                rows = max(engine.get_tensor_profile_shape(names.kInputsEmbeds, p)[2][0] for p in range(2))
                shape = (rows, engine.get_tensor_shape(name)[1])
            t = self._new(name, shape, dtype)
            assert self.ctx.set_tensor_address(name, t.data_ptr)
        for layer in range(self.cfg.num_attention_layers):
            pool = self.tensors[names.past_key_values(layer)]
            pool.zero_(self.stream)
            assert self.ctx.set_tensor_address(names.present_key_values(layer), pool.data_ptr)
        m, p = self.cfg.pages_per_sequence, self.cfg.kv_pool_pages
        if table is None:
            k_ids = np.arange(self.cfg.max_supported_batch_size * m, dtype=np.int32).reshape(-1, m)
            table = np.stack([k_ids, k_ids + p], axis=1)
        self.table = np.asarray(table, np.int32)
        self.rope = rope_table(self.cfg.max_kv_cache_capacity, self.cfg.rotary_dim)[0]

    def _new(self, name: str, shape: tuple[int, ...], dtype: Any) -> trtio.Tensor:
        t = trtio.Tensor.empty(shape, dtype, name=name, backend=self.backend)
        self.tensors[name] = t
        return t

    def close(self) -> None:
        self.stream.synchronize()
        for t in self.tensors.values():
            t.close()
        self.stream.close()

    def pools(self) -> dict[str, np.ndarray]:
        return {names.past_key_values(i): self.tensors[names.past_key_values(i)].to_numpy(self.stream)
                for i in range(self.cfg.num_attention_layers)}

    def fill_pools(self, pools: dict[str, np.ndarray]) -> None:
        for name, array in pools.items():
            self.tensors[name].copy_from(array, self.stream)

    def stage(self, inputs: dict[str, np.ndarray], phase: int, contexts: int) -> None:
        """Select the phase's profile, copy the inputs and set every shape (the shape-only carriers too)."""
        ctx = self.ctx
        profile = 0 if phase <= 2 else 1
        if ctx.active_optimization_profile != profile:
            assert ctx.set_optimization_profile_async(profile, self.stream.handle)
        for name, array in inputs.items():
            if name not in self.tensors:
                continue  # an input this engine was built without
            self.tensors[name].reshape(array.shape).copy_from(np.ascontiguousarray(array), self.stream)
            assert ctx.set_input_shape(name, array.shape), (name, array.shape)
        assert ctx.set_input_shape(names.kExecutionPhaseMarker, (phase,))
        assert ctx.set_input_shape(names.kContextSequenceCountCarrier, (contexts,))
        for layer in range(self.cfg.num_attention_layers):
            pool = names.past_key_values(layer)
            assert ctx.set_input_shape(pool, self.tensors[pool].shape)

    def outputs(self) -> tuple[np.ndarray, np.ndarray | None]:
        logits = self.tensors[names.kLogits].reshape(self.ctx.get_tensor_shape(names.kLogits)).to_numpy(self.stream)
        hidden = None
        if names.kOutputHiddenStates in self.tensors:
            shape = self.ctx.get_tensor_shape(names.kOutputHiddenStates)
            hidden = self.tensors[names.kOutputHiddenStates].reshape(shape).to_numpy(self.stream)
            hidden = hidden.astype(np.float32)
        return logits, hidden

    def run(self, step: Step) -> tuple[np.ndarray, np.ndarray | None]:
        self.stage(step.inputs, step.phase, step.contexts)
        assert self.ctx.execute_async_v3(self.stream.handle)
        return self.outputs()


class Tokens:
    """Per-token inputs (embedding rows of random token ids, draft features, deepstack), as the runtime
    feeds them, rounded to the activation dtype; and each sequence's history for the reference."""

    def __init__(self, cfg: LLMEngineConfig, seed: int = 1) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)
        act = cfg.activation.numpy
        assert act is not None
        self.act = act
        self.embedding = toy_embedding(cfg.vocab_size, cfg.hidden_size)
        self.weights = ToyWeights.generate(cfg, 0)  # what ReferenceEngine.from_config(cfg) computes with
        self.history: dict[int, list[dict[str, Any]]] = {}

    def draw(self) -> dict[str, Any]:
        cfg = self.cfg
        tok: dict[str, Any] = {"e": self.embedding[self.rng.integers(1, cfg.vocab_size)].astype(self.act)}
        if cfg.role == "draft":
            tok["hin"] = self.rng.standard_normal(cfg.base_model_hidden_size, np.float32).astype(self.act)
            tok["hdraft"] = self.rng.standard_normal(cfg.hidden_size, np.float32).astype(self.act)
        tok["ds"] = [(0.3 * self.rng.standard_normal(cfg.hidden_size, np.float32)).astype(self.act)
                     for _ in range(cfg.num_deepstack_features)]
        return tok

    def draws(self, n: int) -> list[dict[str, Any]]:
        return [self.draw() for _ in range(n)]

    def commit(self, seq: int, toks: Sequence[dict[str, Any]]) -> None:
        self.history.setdefault(seq, []).extend(toks)

    def reference(self, seq: int, extra: Sequence[dict[str, Any]] = (), *, positions: Any = None,
                  visible: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """reference_forward of sequence ``seq``'s history plus ``extra``: (hidden, logits) of every token;
        a base's hidden is the residual streams after its EAGLE3 layers."""
        cfg = self.cfg
        toks = self.history.get(seq, []) + list(extra)
        kw: dict[str, Any] = {}
        if cfg.role == "draft":
            kw["hidden_input"] = np.stack([t["hin"] for t in toks])
            kw["hidden_from_draft"] = np.stack([t["hdraft"] for t in toks])
        if cfg.num_deepstack_features:
            kw["deepstack"] = [np.stack([t["ds"][i] for t in toks]) for i in range(cfg.num_deepstack_features)]
        if cfg.role == "base" and cfg.eagle_hidden_state_layers:
            kw["hidden_after"] = cfg.eagle_hidden_state_layers
        return reference_forward(self.weights, cfg, np.stack([t["e"] for t in toks]), positions=positions,
                                 visible=visible, **kw)


class Step:
    """One step laid out as Edge-LLM 0.11's runtime lays it out (``docs/edgellm-assumptions.md`` §3).

    ``rows[s]`` are sequence s's valid rows (token inputs), ``positions[s]`` their RoPE positions;
    each sequence gets ``width`` rows (entry padding: padding rows carry token 0's embedding, RoPE
    row ``pad_rope``, position -1). ``masks[s]`` (phases 4-5) is the in-flight rows' visibility
    ``[len(rows[s])]^2``. ``picks`` are the logits rows (absolute).
    """

    def __init__(self, rig: Rig, tokens: Tokens, rows: Sequence[Sequence[dict[str, Any]]],
                 positions: Sequence[Sequence[int]], *, width: int, past: Sequence[int], phase: int,
                 picks: Sequence[int], masks: Sequence[np.ndarray] | None = None, slots: Sequence[int] | None = None,
                 asl: Sequence[int] | None = None, pad_rope: float = 0.0) -> None:
        cfg = rig.cfg
        n = len(rows)
        t = n * width
        self.phase = phase
        self.contexts = n if phase <= 2 else 0
        pad = {"e": tokens.embedding[0].astype(tokens.act), "hin": np.zeros(cfg.base_model_hidden_size),
               "hdraft": np.zeros(cfg.hidden_size), "ds": [np.zeros(cfg.hidden_size)] * cfg.num_deepstack_features}
        lengths = np.array([len(r) for r in rows], np.int32)
        flat = [rows[s][j] if j < lengths[s] else pad for s in range(n) for j in range(width)]
        pos = np.full(t, -1, np.int32)
        for s in range(n):
            pos[s * width:s * width + lengths[s]] = positions[s]
        rope = np.full((t, int(cfg.rotary_dim or 0)), pad_rope, np.float32)
        rope[pos >= 0] = rig.rope[pos[pos >= 0]]
        past_a = np.asarray(past, np.int32)
        asl_a = past_a + (lengths if phase <= 3 else width) if asl is None else np.asarray(asl, np.int32)
        words = math.ceil(width / 32) if phase >= 4 else 1
        unpacked = np.zeros((n, width, width), bool)
        for s, m in enumerate(masks or ()):
            unpacked[s, :len(m), :len(m)] = m
        packed = pack_tree_mask(unpacked).reshape(t, -1)[:, :words] if phase >= 4 else np.zeros((t, 1), np.int32)
        slots = list(range(n)) if slots is None else list(slots)
        act = tokens.act
        self.inputs: dict[str, np.ndarray] = {
            names.kInputsEmbeds: np.stack([r["e"] for r in flat]).astype(act),
            names.kRopeCosSin: rope,
            names.kPositions: pos,
            names.kQueryStartOffsets: (np.arange(n + 1) * width).astype(np.int32),
            names.kQueryLengths: lengths,
            names.kPastLengths: past_a,
            names.kAttentionSequenceLengths: asl_a.astype(np.int32),
            names.kStateIndices: np.asarray(slots, np.int32),
            names.kKVPageTable: rig.table[slots],
            names.kLogitsIndices: np.asarray(picks, np.int64),
        }
        if cfg.role == "draft":
            self.inputs[names.kBaseModelHiddenStates] = np.stack([r["hin"] for r in flat]).astype(act)
            self.inputs[names.kDraftModelHiddenStates] = np.stack([r["hdraft"] for r in flat]).astype(act)
        if cfg.role != "llm":
            self.inputs[names.kAttentionPositionIds] = np.where(pos >= 0, pos, 0).astype(np.int32)
            self.inputs[names.kPackedAttentionMask] = packed
            self.inputs[names.kTreeParentIds] = np.full(t, -1, np.int32)
            self.inputs[names.kTreeDepths] = np.zeros(t, np.int32)
            self.inputs[names.kValidTreeCounts] = lengths
        for i in range(cfg.num_deepstack_features):
            self.inputs[names.deepstack_embeds(i)] = np.stack([r["ds"][i] for r in flat]).astype(act)


def prefill(rig: Rig, tokens: Tokens, lengths: Sequence[int], *, past: Sequence[int] | None = None,
            seqs: Sequence[int] | None = None, pad_rope: float = 0.0) -> tuple[np.ndarray, np.ndarray | None]:
    """Phase 1 (phase 2 when some sequence has a past): prompts entry-padded to the longest; logits at
    each sequence's last row. Commits the prompts to ``tokens``' histories."""
    seqs = list(range(len(lengths))) if seqs is None else list(seqs)
    past = [0] * len(lengths) if past is None else list(past)
    width = max(lengths)
    rows = [tokens.draws(n) for n in lengths]
    step = Step(rig, tokens, rows, [list(range(p, p + n)) for p, n in zip(past, lengths)], width=width, past=past,
                phase=2 if any(past) else 1, picks=[s * width + n - 1 for s, n in enumerate(lengths)], slots=seqs,
                pad_rope=pad_rope)
    out = rig.run(step)
    for s, r in zip(seqs, rows):
        tokens.commit(s, r)
    return out


def decode(rig: Rig, tokens: Tokens, past: list[int], seqs: Sequence[int] | None = None) -> np.ndarray:
    """Phase 3: one row per sequence at slot past[s]; advances ``past``."""
    seqs = list(range(len(past))) if seqs is None else list(seqs)
    rows = [[tokens.draw()] for _ in past]
    step = Step(rig, tokens, rows, [[p] for p in past], width=1, past=past, phase=3,
                picks=list(range(len(past))), slots=seqs)
    logits, _ = rig.run(step)
    for i, (s, r) in enumerate(zip(seqs, rows)):
        tokens.commit(s, r)
        past[i] += 1
    return logits


def assert_close(got: np.ndarray, want: np.ndarray, cfg: LLMEngineConfig) -> None:
    tol = 1e-4 if cfg.kv_dtype is trtio.DType.FLOAT32 else 2e-3
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def assert_hidden_close(got: np.ndarray, want: np.ndarray, cfg: LLMEngineConfig) -> None:
    """hidden_states are stored in the activation dtype: compare with the reference rounded the same way,
    within one storage ulp of the stream's magnitude (2e-2 for bf16 / fp16 streams of size ~1-10)."""
    act = cfg.activation.numpy
    assert act is not None
    tol = 1e-4 if cfg.activation is trtio.DType.FLOAT32 else 2e-2
    np.testing.assert_allclose(got, want.astype(act).astype(np.float32), rtol=tol, atol=tol)


# -- numerics ---------------------------------------------------------------------------------------------


VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llm-f16": ("llm", {}),
    "llm-bf16": ("llm", dict(activation_dtype="bfloat16", kv_cache_dtype="bfloat16")),
    "llm-f32": ("llm", dict(activation_dtype="float32", kv_cache_dtype="float32")),
    "llm-fp8": ("llm", dict(kv_cache_dtype="fp8")),
    "llm-deepstack-gqa1": ("llm", dict(num_deepstack_features=2, num_kv_heads=1, rotary_dim=8)),
    "base": ("base", {}),
    "base-no-eagle-layers": ("base", dict(eagle_hidden_state_layers=())),
    "draft": ("draft", {}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_then_decode_match_the_reference(variant: str) -> None:
    """Prompts of different lengths (phase 1, entry padded), then decode steps (phase 3)."""
    role, kw = VARIANTS[variant]
    cfg = small_cfg(role, **kw)
    rig = Rig(ReferenceEngine.from_config(cfg, device="host"))
    tokens = Tokens(cfg)
    lengths = [7, 3, 12]
    logits, hidden = prefill(rig, tokens, lengths)
    assert logits.shape == (3, cfg.output_vocab_size)
    for s, n in enumerate(lengths):
        ref_hidden, ref_logits = tokens.reference(s)
        if role == "draft":
            assert_close(logits[s], log_softmax(ref_logits[-1]), cfg)
            assert hidden is not None and hidden.shape == (3, cfg.hidden_size)
            assert_hidden_close(hidden[s], ref_hidden[-1], cfg)
        else:
            assert_close(logits[s], ref_logits[-1], cfg)
        if role == "base":
            width = max(1, len(cfg.eagle_hidden_state_layers)) * cfg.hidden_size
            assert hidden is not None and hidden.shape == (3 * 12, width)
            assert_hidden_close(hidden[s * 12:s * 12 + n], ref_hidden, cfg)
        if role == "llm":
            assert hidden is None
    past = list(lengths)
    for _ in range(3):
        logits = decode(rig, tokens, past)
        for s in range(3):
            want = tokens.reference(s)[1][-1]
            assert_close(logits[s], log_softmax(want) if role == "draft" else want, cfg)
    assert past == [10, 6, 15]


def test_attention_sequence_lengths_bound_the_keys_in_phases_1_to_3() -> None:
    """Keys are the slots up to the row's own and below attention_sequence_lengths: a decode whose
    length stops 2 slots short of its past sees neither those 2 prefix tokens nor itself."""
    cfg = small_cfg()
    rig = Rig(ReferenceEngine.from_config(cfg, device="host"))
    tokens = Tokens(cfg)
    past = [6, 8]
    prefill(rig, tokens, past)
    rows = [[tokens.draw()], [tokens.draw()]]
    step = Step(rig, tokens, rows, [[6], [8]], width=1, past=past, phase=3, picks=[0, 1], asl=[4, 9])
    logits, _ = rig.run(step)
    visible = np.tril(np.ones((7, 7), bool))
    visible[6] = np.arange(7) < 4
    assert_close(logits[0], tokens.reference(0, rows[0], visible=visible)[1][-1], cfg)
    assert_close(logits[1], tokens.reference(1, rows[1])[1][-1], cfg)
    assert np.abs(logits[0] - tokens.reference(0, rows[0])[1][-1]).max() > 0.05  # the bound matters


def test_base_hidden_states_are_the_eagle_layers_streams() -> None:
    """The base's hidden_states are the residual streams after layers (1, 0, 2), side by side in that
    order: each block equals the reference's final stream of a model cut after that layer."""
    cfg = small_cfg("base")
    rig = Rig(ReferenceEngine.from_config(cfg, device="host"))
    tokens = Tokens(cfg)
    _, hidden = prefill(rig, tokens, [5])
    assert hidden is not None
    h = cfg.hidden_size
    emb = np.stack([t["e"] for t in tokens.history[0]])
    full = tokens.weights
    for block, layer in enumerate(cfg.eagle_hidden_state_layers):
        cut = ToyWeights(wq=full.wq[:layer + 1], wk=full.wk[:layer + 1], wv=full.wv[:layer + 1],
                         wo=full.wo[:layer + 1], w1=full.w1[:layer + 1], w2=full.w2[:layer + 1], we=None, wh=None,
                         wd=None, w_lm=full.w_lm)
        want, _ = reference_forward(cut, cfg, emb)
        assert_hidden_close(hidden[:5, block * h:(block + 1) * h], want, cfg)
        # reference_forward(hidden_after=...) is the same ground truth
        np.testing.assert_array_equal(tokens.reference(0)[0][:, block * h:(block + 1) * h], want)


def tree_step(rig: Rig, tokens: Tokens, parents: Sequence[Sequence[int]], past: Sequence[int], width: int,
              phase: int, picks: Sequence[int] | None = None, slots: Sequence[int] | None = None
              ) -> tuple[Step, list[list[dict[str, Any]]]]:
    """A verify (phase 5) or draft-proposal (phase 4) step: tree nodes at slots past + i, RoPE position
    past + depth, each node seeing the prefix, itself and its ancestors; step row i is sequence slot
    ``slots[i]`` (default i)."""
    nodes = [tokens.draws(len(p)) for p in parents]
    masks = [ancestor_mask(np.array(p)) for p in parents]
    positions = [list(past[s] + m.sum(axis=1) - 1) for s, m in enumerate(masks)]
    if picks is None:
        picks = list(range(len(parents) * width))
    step = Step(rig, tokens, nodes, positions, width=width, past=past, phase=phase, picks=picks, masks=masks,
                slots=slots)
    return step, nodes


def tree_reference(tokens: Tokens, seq: int, nodes: list[dict[str, Any]], parents: Sequence[int]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """reference_forward over the history plus the tree, with the tree's visibility and positions."""
    p = len(tokens.history[seq])
    mask = ancestor_mask(np.array(parents))
    n = len(nodes)
    visible = np.zeros((p + n, p + n), bool)
    visible[:p, :p] = np.tril(np.ones((p, p), bool))
    visible[p:, :p] = True
    visible[p:, p:] = mask
    positions = np.concatenate([np.arange(p), p + mask.sum(axis=1) - 1])
    hidden, logits = tokens.reference(seq, nodes, positions=positions, visible=visible)
    return hidden[p:], logits[p:]


@pytest.mark.parametrize("kv", ["float16", "fp8"])
def test_verify_over_a_tree_matches_the_reference(kv: str) -> None:
    """Phase 5: each node's logits (and the base's hidden states) are those of reference_forward with the
    tree's visible mask; one sequence has a full tree, the other a smaller one plus padding rows."""
    cfg = small_cfg("base", kv_cache_dtype=kv)
    rig = Rig(ReferenceEngine.from_config(cfg, device="host"))
    tokens = Tokens(cfg)
    past = [5, 9]
    prefill(rig, tokens, past)
    parents = [[-1, 0, 0, 1, 1, 2, 5, 3], [-1, 0, 1, 0, 3]]
    width = 8
    step, nodes = tree_step(rig, tokens, parents, past, width, phase=5)
    logits, hidden = rig.run(step)
    assert hidden is not None
    assert logits.shape == (16, cfg.output_vocab_size) and hidden.shape == (16, 3 * cfg.hidden_size)
    for s in range(2):
        ref_hidden, ref_logits = tree_reference(tokens, s, nodes[s], parents[s])
        n = len(parents[s])
        assert_close(logits[s * width:s * width + n], ref_logits, cfg)
        assert_hidden_close(hidden[s * width:s * width + n], ref_hidden, cfg)


def test_draft_catch_up_and_proposal() -> None:
    """Draft phase 4: a catch-up over accepted tokens (W = drafting_step + 1, query length = accept length,
    logits at s*W + accept - 1), then a proposal over a tree (logits at its last nodes): log-softmaxed
    logits and hidden_states at the logits rows equal the reference."""
    cfg = small_cfg("draft")
    rig = Rig(ReferenceEngine.from_config(cfg, device="host"))
    tokens = Tokens(cfg)
    past = [6, 4]
    prefill(rig, tokens, past)
    accepted = [3, 1]
    width = 4
    rows = [tokens.draws(a) for a in accepted]
    chains = [np.tril(np.ones((a, a), bool)) for a in accepted]
    step = Step(rig, tokens, rows, [list(range(p, p + a)) for p, a in zip(past, accepted)], width=width, past=past,
                phase=4, picks=[s * width + a - 1 for s, a in enumerate(accepted)], masks=chains)
    logits, hidden = rig.run(step)
    assert hidden is not None and logits.shape == (2, cfg.output_vocab_size) and hidden.shape == (2, cfg.hidden_size)
    for s in range(2):
        tokens.commit(s, rows[s])
        ref_hidden, ref_logits = tokens.reference(s)
        assert_close(logits[s], log_softmax(ref_logits[-1]), cfg)
        assert_hidden_close(hidden[s], ref_hidden[-1], cfg)
        np.testing.assert_allclose(np.exp(logits[s]).sum(), 1.0, rtol=1e-5)  # log-probabilities
    past = [p + a for p, a in zip(past, accepted)]

    parents = [[-1, 0, 0, 1, 2, 2], [-1, 0, 1, 1]]
    width = 6
    top = 2  # the last two nodes of each tree
    picks = [s * width + len(p) - k for s, p in enumerate(parents) for k in (2, 1)]
    step, nodes = tree_step(rig, tokens, parents, past, width, phase=4, picks=picks)
    logits, hidden = rig.run(step)
    assert hidden is not None and logits.shape == (2 * top, cfg.output_vocab_size)
    for s in range(2):
        ref_hidden, ref_logits = tree_reference(tokens, s, nodes[s], parents[s])
        assert_close(logits[s * top:(s + 1) * top], log_softmax(ref_logits[-top:]), cfg)
        assert_hidden_close(hidden[s * top:(s + 1) * top], ref_hidden[-top:], cfg)


def test_prefill_after_a_restored_prefix_equals_one_long_prefill() -> None:
    """Phase 2: a prefix already in the pool (an earlier prefill), the rest of the prompt with past > 0,
    beside a fresh sequence: equals one phase-1 prefill of the whole prompts."""
    cfg = small_cfg()
    split = Rig(ReferenceEngine.from_config(cfg, device="host"))
    tokens = Tokens(cfg, seed=3)
    prefill(split, tokens, [5], seqs=[1])
    logits, _ = prefill(split, tokens, [4, 6], past=[0, 5], seqs=[0, 1])
    assert split.ctx.get_tensor_shape(names.kExecutionPhaseMarker) == (2,)

    whole = Rig(ReferenceEngine.from_config(cfg, device="host"))
    again = Tokens(cfg)
    again.history = {}
    rows = [tokens.history[0], tokens.history[1]]
    step = Step(whole, again, rows, [list(range(4)), list(range(11))], width=11, past=[0, 0], phase=1,
                picks=[3, 11 + 10])
    want, _ = whole.run(step)
    assert_close(logits, want, cfg)
    for s in range(2):
        assert_close(logits[s], tokens.reference(s)[1][-1], cfg)
    for name, pool in split.pools().items():  # and the same K/V in the pool
        np.testing.assert_allclose(pool.astype(np.float32), whole.pools()[name].astype(np.float32),
                                   rtol=2e-3, atol=2e-3)


def test_scattered_page_tables_give_the_same_results() -> None:
    """Pages of each sequence scattered over a larger pool (V ids = K ids + P, unused entries -1): the same
    outputs bit for bit, and every K/V row lands on the page its table names."""
    cfg = small_cfg("base", kv_pool_pages=16)
    m, p, page = cfg.pages_per_sequence, cfg.kv_pool_pages, cfg.kv_page_size
    rng = np.random.default_rng(7)
    k_ids = rng.permutation(p)[:3 * m].reshape(3, m).astype(np.int32)
    scattered = np.stack([k_ids, k_ids + p], axis=1)
    scattered[2, :, 1:] = -1  # sequence 2 never reaches its second page
    rigs = [Rig(ReferenceEngine.from_config(cfg, device="host")),
            Rig(ReferenceEngine.from_config(cfg, device="host"), table=scattered)]
    results = []
    for rig in rigs:
        tokens = Tokens(cfg, seed=11)
        past = [12, 9, 4]
        out = [prefill(rig, tokens, past)]
        for _ in range(6):  # sequence 0 crosses into its second page
            decode(rig, tokens, past)
        parents = [[-1, 0, 0], [-1, 0, 1, 2], [-1, 0]]
        step, _ = tree_step(rig, tokens, parents, past, 4, phase=5)
        out.append(rig.run(step))
        results.append(out)
    for (la, ha), (lb, hb) in zip(*results):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(ha, hb)
    ident, scat = rigs[0].pools(), rigs[1].pools()
    for name in ident:
        flat_i = ident[name].reshape(2 * p, page, -1)
        flat_s = scat[name].reshape(2 * p, page, -1)
        for s in range(3):
            for col in range(m):
                for kind in range(2):
                    page_s = scattered[s, kind, col]
                    if page_s >= 0:
                        np.testing.assert_array_equal(flat_s[page_s], flat_i[rigs[0].table[s, kind, col]])
        unused = np.setdiff1d(np.arange(2 * p), scattered[scattered >= 0])
        assert not flat_s[unused].any()  # pages no sequence owns were never written


DEVICES = ["host", pytest.param("gpu", marks=pytest.mark.gpu)]


def device_rig(cfg: LLMEngineConfig, device: str, table: np.ndarray | None = None) -> Rig:
    """A Rig on the host device, or on the GPU (CuPy, cuda backend)."""
    if device == "gpu":
        return Rig(_gpu_engine(cfg), backend="cuda", table=table)
    return Rig(ReferenceEngine.from_config(cfg, device="host"), table=table)


def paired_table(k_ids: Any, pool_pages: int) -> np.ndarray:
    """A page table [slots, 2, M] from K page ids [slots, M]: V ids are K ids + P, unmapped (-1) stays -1."""
    k_ids = np.asarray(k_ids, np.int32)
    return np.stack([k_ids, np.where(k_ids >= 0, k_ids + pool_pages, -1)], axis=1).astype(np.int32)


@pytest.mark.parametrize("device", DEVICES)
def test_arbitrary_page_tables_give_the_identity_tables_logits(device: str) -> None:
    """Each sequence's pages scattered anywhere in a pool larger than needed, sequences in slots other than
    their step row, and -1 for every page past what they reach: prefill, decodes and a verify give exactly
    the outputs of the identity table with slot = step row, and the logits of reference_forward."""
    cfg = small_cfg("base", kv_pool_pages=20)
    m, p = cfg.pages_per_sequence, cfg.kv_pool_pages
    rng = np.random.default_rng(3)
    slots = [2, 0, 1]  # step row i is sequence slot slots[i]
    k_ids = np.full((3, m), -1)
    reach = [2, 2, 1]  # pages each step row's sequence reaches (12 + 10 slots, 9 + 10, 4 + 10; pages of 16)
    picked = iter(rng.permutation(p)[:sum(reach)])
    for row, slot in enumerate(slots):
        k_ids[slot, :reach[row]] = [next(picked) for _ in range(reach[row])]
    table = paired_table(k_ids, p)
    assert (table[slots[0], 0] != np.arange(m)).any() and p > 3 * m
    results = []
    for rig, seqs in ((device_rig(cfg, device), None), (device_rig(cfg, device, table), slots)):
        tokens = Tokens(cfg, seed=11)
        past = [12, 9, 4]
        out = [prefill(rig, tokens, past, seqs=seqs)]
        for _ in range(6):  # step row 0 crosses into its second page
            decode(rig, tokens, past, seqs=seqs)
            out.append(rig.outputs())
        parents = [[-1, 0, 0], [-1, 0, 1, 2], [-1, 0]]
        step, nodes = tree_step(rig, tokens, parents, past, 4, phase=5, slots=seqs)
        out.append(rig.run(step))
        results.append(out)
        logits = out[-1][0]
        for row in range(3):
            slot = row if seqs is None else seqs[row]
            _, want = tree_reference(tokens, slot, nodes[row], parents[row])
            assert_close(logits[row * 4:row * 4 + len(parents[row])], want, cfg)
    for (la, ha), (lb, hb) in zip(*results):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(ha, hb)


@pytest.mark.parametrize("device", DEVICES)
def test_sequences_sharing_the_full_pages_of_a_prefix(device: str) -> None:
    """Two sequences whose tables share the two full pages of a 32-token prefix (read-only: they write only
    their own third page) give the logits of their own solo run, bit for bit the same as with private copies
    of the prefix, and leave the shared pages as the prefix's prefill wrote them."""
    cfg = small_cfg(max_supported_input_length=32, kv_pool_pages=12)
    p, page = cfg.kv_pool_pages, cfg.kv_page_size
    tokens = Tokens(cfg, seed=6)
    prefix = tokens.draws(32)
    suffixes = [tokens.draws(5), tokens.draws(9)]
    steps = [tokens.draws(1), tokens.draws(1)]
    layouts = {"shared": ([[5, 9, 2], [5, 9, 7], [5, 9, 11]], [0]),  # slot 0 prefills the prefix once
               "private": ([[5, 9, 2], [0, 1, 7], [3, 4, 11]], [1, 2])}  # slots 1 and 2 each prefill a copy
    results = {}
    for name, (k_ids, prefilled) in layouts.items():
        rig = device_rig(cfg, device, paired_table(k_ids, p))
        for slot in prefilled:
            rig.run(Step(rig, tokens, [prefix], [list(range(32))], width=32, past=[0], phase=1, picks=[31],
                         slots=[slot]))
        shared = {n: pool.reshape(2 * p, page, -1)[[5, 9, 5 + p, 9 + p]].copy() for n, pool in rig.pools().items()}
        out = [rig.run(Step(rig, tokens, suffixes, [list(range(32, 37)), list(range(32, 41))], width=9,
                            past=[32, 32], phase=2, picks=[4, 9 + 8], slots=[1, 2]))[0]]
        out.append(rig.run(Step(rig, tokens, steps, [[37], [41]], width=1, past=[37, 41], phase=3, picks=[0, 1],
                                slots=[1, 2]))[0])
        results[name] = out
        if name == "shared":
            for n, pool in rig.pools().items():
                np.testing.assert_array_equal(pool.reshape(2 * p, page, -1)[[5, 9, 5 + p, 9 + p]], shared[n])
    for a, b in zip(results["shared"], results["private"]):
        np.testing.assert_array_equal(a, b)
    for row in range(2):
        history = prefix + suffixes[row]
        tokens.history = {0: history}
        assert_close(results["shared"][0][row], tokens.reference(0)[1][-1], cfg)
        tokens.history = {0: history + steps[row]}
        assert_close(results["shared"][1][row], tokens.reference(0)[1][-1], cfg)
    assert np.abs(results["shared"][0][0] - results["shared"][0][1]).max() > 0.05  # two different sequences


BAD_PAGES: dict[str, tuple[tuple[int, int, int], int]] = {
    "k-unmapped": ((1, 0, 0), -1),
    "v-unmapped": ((1, 1, 0), -1),
    "k-past-the-pool": ((1, 0, 0), 18),  # 2P = 18
    "v-negative": ((1, 1, 0), -7),
}


def _bad_page_step(device: str, case: str) -> tuple[Rig, Step, tuple[Any, ...], dict[str, dict[str, np.ndarray]]]:
    """A base rig after a prefill, a verify step whose sequence 1 touches a bad page, what the same step gives
    with the good table (outputs), and the pools before it and after it; the rig's pools are left as before."""
    cfg = small_cfg("base")
    rig = device_rig(cfg, device)
    tokens = Tokens(cfg)
    past = [3, 5]
    prefill(rig, tokens, past)
    step, _ = tree_step(rig, tokens, [[-1, 0, 1, 1], [-1, 0]], past, 4, phase=5)
    before = rig.pools()
    good = rig.run(step)
    pools = {"before": before, "good": rig.pools()}
    rig.fill_pools(before)
    index, value = BAD_PAGES[case]
    bad = copy.copy(step)
    bad.inputs = dict(step.inputs)
    table = bad.inputs[names.kKVPageTable].copy()
    table[index] = value
    bad.inputs[names.kKVPageTable] = table
    return rig, bad, good, pools


def _assert_sequence_1_is_nan(rig: Rig, got: tuple[np.ndarray, np.ndarray | None], good: tuple[Any, ...],
                              pools: dict[str, dict[str, np.ndarray]]) -> None:
    (logits, hidden), (good_logits, good_hidden) = got, good
    assert hidden is not None
    assert np.isnan(logits[4:8]).all() and np.isnan(hidden[4:8]).all()  # every row of sequence 1
    np.testing.assert_array_equal(logits[:4], good_logits[:4])  # sequence 0 as with the good table
    np.testing.assert_array_equal(hidden[:4], good_hidden[:4])
    page, p, m = rig.cfg.kv_page_size, rig.cfg.kv_pool_pages, rig.cfg.pages_per_sequence
    for name, pool in rig.pools().items():
        rows = pool.reshape(2 * p, page, -1).view(np.uint8)
        before = pools["before"][name].reshape(2 * p, page, -1).view(np.uint8)
        written = pools["good"][name].reshape(2 * p, page, -1).view(np.uint8)
        for k_page in (m, m + p):  # sequence 1's K and V pages: nothing written
            np.testing.assert_array_equal(rows[k_page], before[k_page])
        for k_page in (0, p):  # sequence 0's: written as with the good table
            np.testing.assert_array_equal(rows[k_page], written[k_page])


@pytest.mark.parametrize("case", list(BAD_PAGES))
def test_unchecked_steps_make_a_sequence_with_a_bad_page_nan(case: str) -> None:
    """The GPU's handling of a touched page id that is unmapped or outside the pool (reference_math on numpy,
    unchecked as the GPU runs it): every output row of that sequence is NaN, it writes no K/V, and the other
    sequence's outputs and pages are exactly those of the good table. (The host device refuses the step.)"""
    rig, bad, good, pools = _bad_page_step("host", case)
    rig.stage(bad.inputs, bad.phase, bad.contexts)
    plan = rig.ctx._validate()
    assert plan is not None
    engine = rig.engine
    with np.errstate(all="ignore"):
        reference_math._forward_ragged(np, np.matmul, reference_math._scatter_rows_host, engine._geo,
                                       reference_math._Weights.of(engine.weights, np.asarray), plan.views, plan.phase,
                                       reference_math._NoScratch(), checked=False)
    _assert_sequence_1_is_nan(rig, rig.outputs(), good, pools)
    with pytest.raises(trtio.InvalidValueError, match=r"kv_page_table\[1, "):
        rig.ctx.execute_async_v3(rig.stream.handle)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(BAD_PAGES))
def test_gpu_sequence_with_a_bad_page_is_nan(case: str) -> None:
    """On the GPU (no host sync inside execute) the step runs; the sequence with the bad page is NaN."""
    rig, bad, good, pools = _bad_page_step("gpu", case)
    _assert_sequence_1_is_nan(rig, rig.run(bad), good, pools)


def test_fp8_pools_hold_e4m3_k_and_v_at_their_pages() -> None:
    """FP8 pools store e4m3fn bits: the V rows of a prefill are x @ wv rounded by ml_dtypes."""
    cfg = small_cfg(num_attention_layers=1, kv_cache_dtype="fp8")
    rig = Rig(ReferenceEngine.from_config(cfg, device="host"))
    tokens = Tokens(cfg)
    prefill(rig, tokens, [3, 5])
    pool = rig.pools()[names.past_key_values(0)]  # [2, P, page, Hkv, D]
    assert pool.dtype == ml_dtypes.float8_e4m3fn
    pool = pool.view(np.uint8)
    m = cfg.pages_per_sequence
    x = np.stack([t["e"] for t in tokens.history[1]]).astype(np.float32)
    want = (x @ tokens.weights.wv[0]).reshape(5, 2, 8).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(pool[1, m, :5], want)  # sequence 1's V page is P + m
    assert not pool[1, m, 5:].any()


def test_padding_rows_write_nothing_and_garbage_stays_unseen() -> None:
    """Pools full of random bytes (NaN and inf patterns included), NaN RoPE rows on padding: only the
    valid rows' slots change, and the outputs of valid rows are finite and right."""
    cfg = small_cfg("base")
    rig = Rig(ReferenceEngine.from_config(cfg, device="host"))
    rng = np.random.default_rng(5)
    garbage = {name: rng.integers(0, 256, a.nbytes, dtype=np.uint8).view(a.dtype).reshape(a.shape)
               for name, a in rig.pools().items()}
    rig.fill_pools(garbage)
    tokens = Tokens(cfg)
    lengths = [2, 7, 4]
    logits, hidden = prefill(rig, tokens, lengths, pad_rope=np.nan)
    for s in range(3):
        assert_close(logits[s], tokens.reference(s)[1][-1], cfg)
    assert hidden is not None and np.isfinite(hidden[7:14]).all()
    page, p = cfg.kv_page_size, cfg.kv_pool_pages
    written = np.zeros(2 * p * page, bool)
    for s, n in enumerate(lengths):
        for kind in range(2):
            for slot in range(n):
                written[rig.table[s, kind, slot // page] * page + slot % page] = True
    for name, pool in rig.pools().items():
        before = garbage[name].reshape(2 * p * page, -1).view(np.uint8)
        after = pool.reshape(2 * p * page, -1).view(np.uint8)
        np.testing.assert_array_equal(after[~written], before[~written])
        assert (after[written] != before[written]).any(axis=1).all()


def _replay_on_new_data_equals_direct(rig: Rig, backend: Backend, graph: int, snap: dict[str, np.ndarray],
                                      tokens: Tokens, past: list[int]) -> None:
    """Stage another verify tree in the captured step's buffers and replay ``graph``: its outputs and pools
    equal a direct execute of that step from the pools ``snap`` held at capture. Destroys ``graph``."""
    new, _ = tree_step(rig, tokens, [[-1, 0, 1], [-1, 0, 0]], past, 3, phase=5)
    for name, array in new.inputs.items():
        rig.tensors[name].reshape(array.shape).copy_from(array, rig.stream)
    backend.launch_graph(graph, rig.stream.handle)
    replay = rig.outputs()
    replay_pools = rig.pools()
    rig.fill_pools(snap)
    direct = rig.run(new)
    for a, b in zip(replay, direct):
        assert a is not None and b is not None
        np.testing.assert_array_equal(a, b)
    for name, pool in rig.pools().items():
        np.testing.assert_array_equal(replay_pools[name], pool)
    backend.destroy_graph(graph)


def test_host_graph_replay_recomputes_a_ragged_step() -> None:
    """A captured verify step replays on new data in the same buffers as a direct execute would."""
    cfg = small_cfg("base", activation_dtype="bfloat16")
    rig = Rig(ReferenceEngine.from_config(cfg, device="host"))
    backend = trtio.get_backend("host")
    tokens = Tokens(cfg)
    past = [4, 6]
    prefill(rig, tokens, past)
    step, _ = tree_step(rig, tokens, [[-1, 0, 0], [-1, 0, 1]], past, 3, phase=5)
    rig.stage(step.inputs, 5, 0)
    snap = rig.pools()
    backend.begin_capture(rig.stream.handle)
    try:
        assert rig.ctx.execute_async_v3(rig.stream.handle)
    finally:
        graph = backend.end_capture(rig.stream.handle)
    _replay_on_new_data_equals_direct(rig, backend, graph, snap, tokens, past)


def test_an_engine_without_the_optional_inputs_computes_the_same() -> None:
    cfg = small_cfg("base")
    outs = []
    for omit in ((), RAGGED_OMITTABLE):
        rig = Rig(ReferenceEngine.from_config(cfg, device="host", omit=omit))
        tokens = Tokens(cfg)
        past = [3, 5]
        prefill(rig, tokens, past)
        step, _ = tree_step(rig, tokens, [[-1, 0], [-1, 0, 0]], past, 3, phase=5)
        outs.append(rig.run(step))
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


# -- refusals -------------------------------------------------------------------------------------------------


def base_rig() -> tuple[Rig, Step]:
    """A base rig and a valid verify step of 2 sequences of width 4 (after a prefill)."""
    cfg = small_cfg("base")
    rig = Rig(ReferenceEngine.from_config(cfg, device="host"))
    tokens = Tokens(cfg)
    past = [3, 5]
    prefill(rig, tokens, past)
    step, _ = tree_step(rig, tokens, [[-1, 0, 1, 1], [-1, 0]], past, 4, phase=5)
    return rig, step


def refused(rig: Rig, caplog: pytest.LogCaptureFixture, why: str) -> None:
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert rig.ctx.execute_async_v3(rig.stream.handle) is False
    assert why in caplog.text, caplog.text


SHAPE_REFUSALS: dict[str, tuple[dict[str, tuple[int, ...]], str]] = {
    "rows-not-divisible": ({names.kInputsEmbeds: (7, 32)}, "not a multiple of the 2 sequences"),
    "past-lengths": ({names.kPastLengths: (3,)}, "'past_lengths' has shape (3,)"),
    "asl": ({names.kAttentionSequenceLengths: (1,)}, "'attention_sequence_lengths' has shape (1,)"),
    "valid-tree-counts": ({names.kValidTreeCounts: (3,)}, "'valid_tree_counts' has shape (3,)"),
    "page-table-rows": ({names.kKVPageTable: (3, 2, 3)}, "'kv_page_table' has shape (3, 2, 3)"),
    "offsets": ({names.kQueryStartOffsets: (2,)}, "'query_start_offsets' has shape (2,)"),
    "rope-rows": ({names.kRopeCosSin: (6, 4)}, "'rope_rotary_cos_sin' has shape (6, 4)"),
    "positions": ({names.kPositions: (6,)}, "'positions' has shape (6,)"),
    "tree-depths": ({names.kTreeDepths: (4,)}, "'tree_depths' has shape (4,)"),
    "position-ids": ({names.kAttentionPositionIds: (4,)}, "'attention_position_ids' has shape (4,)"),
    "mask-rows": ({names.kPackedAttentionMask: (6, 1)}, "'packed_attention_mask' has shape (6, 1)"),
    "phase-6": ({names.kExecutionPhaseMarker: (6,)}, "has extent 6"),
    "phase-1-in-generation": ({names.kExecutionPhaseMarker: (1,)}, "phase 1 (prefill) needs one per sequence"),
}


@pytest.mark.parametrize("case", list(SHAPE_REFUSALS))
def test_shape_rules_refuse_the_step(case: str, caplog: pytest.LogCaptureFixture) -> None:
    rig, step = base_rig()
    rig.stage(step.inputs, 5, 0)
    assert rig.ctx.execute_async_v3(rig.stream.handle)
    shapes, why = SHAPE_REFUSALS[case]
    for name, shape in shapes.items():
        assert rig.ctx.set_input_shape(name, shape), (name, shape)
    refused(rig, caplog, why)
    with pytest.raises(trtio.EngineError, match="infer_shapes"):
        rig.ctx.infer_shapes()


def test_phase_and_carrier_rules(caplog: pytest.LogCaptureFixture) -> None:
    cfg = small_cfg()
    rig = Rig(ReferenceEngine.from_config(cfg, device="host"))
    tokens = Tokens(cfg)
    prefill(rig, tokens, [4, 2, 3])
    step = Step(rig, tokens, [tokens.draws(2)] * 3, [[4, 5], [2, 3], [3, 4]], width=2, past=[4, 2, 3], phase=2,
                picks=[1, 3, 5])
    rig.stage(step.inputs, 2, 3)
    assert rig.ctx.execute_async_v3(rig.stream.handle)
    assert rig.ctx.set_input_shape(names.kContextSequenceCountCarrier, (2,))
    refused(rig, caplog, "'context_sequence_count_carrier' has extent 2, but phase 2 (prefill) needs one per "
                         "sequence (3)")
    assert rig.ctx.set_input_shape(names.kContextSequenceCountCarrier, (3,))
    assert rig.ctx.set_input_shape(names.kExecutionPhaseMarker, (3,))  # a decode with context sequences
    refused(rig, caplog, "phase 3 (generation) needs 0")
    assert rig.ctx.set_input_shape(names.kExecutionPhaseMarker, (5,))
    refused(rig, caplog, "a plain LLM engine has no packed_attention_mask")
    # profile 1 pins the carrier to [0]
    assert rig.ctx.set_optimization_profile_async(1, rig.stream.handle)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert not rig.ctx.set_input_shape(names.kContextSequenceCountCarrier, (1,))


def test_mask_words_must_cover_the_step(caplog: pytest.LogCaptureFixture) -> None:
    cfg = small_cfg("base", max_verify_tree_size=40, max_kv_cache_capacity=64)
    rig = Rig(ReferenceEngine.from_config(cfg, device="host"))
    tokens = Tokens(cfg)
    prefill(rig, tokens, [3])
    step, _ = tree_step(rig, tokens, [[-1] + list(range(38))], [3], 40, phase=5)
    assert step.inputs[names.kPackedAttentionMask].shape == (40, 2)
    rig.stage(step.inputs, 5, 0)
    assert rig.ctx.execute_async_v3(rig.stream.handle)
    assert rig.ctx.set_input_shape(names.kPackedAttentionMask, (40, 1))
    refused(rig, caplog, "fewer than the 40 in-flight rows")


def test_binding_refusals(caplog: pytest.LogCaptureFixture) -> None:
    rig, step = base_rig()
    rig.stage(step.inputs, 5, 0)
    spare = trtio.Tensor.empty(rig.tensors[names.past_key_values(1)].shape, "float16", backend="host")
    _OPEN.append(spare)
    assert rig.ctx.set_tensor_address(names.present_key_values(1), spare.data_ptr)
    refused(rig, caplog, "'present_key_values_1' is bound to")
    assert rig.ctx.set_tensor_address(names.present_key_values(1), rig.tensors[names.past_key_values(1)].data_ptr)
    assert rig.ctx.execute_async_v3(rig.stream.handle)
    assert rig.ctx.set_optimization_profile_async(0, rig.stream.handle)  # forgets every shape
    refused(rig, caplog, "input 'inputs_embeds' has no shape")
    engine = rig.engine
    ctx = engine.create_execution_context(USER_MANAGED)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert ctx.execute_async_v3(rig.stream.handle) is False
    assert "'kv_page_table' has no address" in caplog.text and "no context memory" in caplog.text


DATA_REFUSALS: dict[str, tuple[str, Callable[[np.ndarray], None], str]] = {
    "offset-not-i-times-w": (names.kQueryStartOffsets, lambda a: a.__setitem__(1, 3), "query_start_offsets[1] = 3"),
    "query-length-over-w": (names.kQueryLengths, lambda a: a.__setitem__(1, 5), "0 <= query length <= W (4)"),
    "page-id-out-of-range": (names.kKVPageTable, lambda a: a.__setitem__((1, 1, 0), 18), "0 <= page id < 2 * "),
    "page-id-unset": (names.kKVPageTable, lambda a: a.__setitem__((0, 0, 0), -1), "kv_page_table[0, 0, 0] = -1"),
    "v-page-id-unset": (names.kKVPageTable, lambda a: a.__setitem__((1, 1, 0), -1), "kv_page_table[1, 1, 0] = -1"),
    "page-id-negative": (names.kKVPageTable, lambda a: a.__setitem__((0, 0, 0), -3), "kv_page_table[0, 0, 0] = -3"),
    "slot-past-the-pages": (names.kPastLengths, lambda a: a.__setitem__(0, 46), "0 <= slot < the 3 pages x 16"),
    "logits-row": (names.kLogitsIndices, lambda a: a.__setitem__(0, 8), "0 <= row < T (8)"),
    "length-below-w": (names.kAttentionSequenceLengths, lambda a: a.__setitem__(0, 3), "W (4) <= length <= 48"),
}


@pytest.mark.parametrize("case", list(DATA_REFUSALS))
def test_bad_data_raises_on_the_host(case: str) -> None:
    rig, step = base_rig()
    name, mutate, why = DATA_REFUSALS[case]
    array = step.inputs[name].copy()
    mutate(array)
    step.inputs[name] = array
    rig.stage(step.inputs, 5, 0)
    with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
                       .replace("*", r"\*")):
        rig.ctx.execute_async_v3(rig.stream.handle)


def test_unused_page_ids_may_be_anything() -> None:
    """Entries for pages a step never touches (-1, or out of range) are not read: the step's outputs and pools
    are exactly those of the identity table's."""
    rig, step = base_rig()
    want = rig.run(step)
    want_pools = rig.pools()
    rig, step = base_rig()
    table = step.inputs[names.kKVPageTable].copy()
    assert (step.inputs[names.kPastLengths] + 4 <= rig.cfg.kv_page_size).all()  # the step touches page 0 only
    table[:, :, 1:] = -1
    table[0, 1, 2] = 999
    step.inputs[names.kKVPageTable] = table
    got = rig.run(step)
    for a, b in zip(got, want):
        assert a is not None and b is not None
        np.testing.assert_array_equal(a, b)
    for name, pool in rig.pools().items():
        np.testing.assert_array_equal(pool, want_pools[name])


# -- fp8 conversions ----------------------------------------------------------------------------------------


def test_e4m3fn_decoding_of_every_code_matches_ml_dtypes() -> None:
    codes = np.arange(256, dtype=np.uint8)
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    got = re_mod.e4m3fn_bits_to_float32(np, codes)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # NaN bits and -0 included


def _e4m3_edge_floats() -> np.ndarray:
    finite = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    finite = np.unique(finite[np.isfinite(finite)])
    mids = (finite[:-1] + finite[1:]) / 2  # exact ties: round half to even
    edges = np.concatenate([finite, mids, [464.0, 480.0, 500.0, 1e30, 2.0 ** -10, 2.0 ** -7 * 0.75]])
    edges = edges.astype(np.float32)
    near = np.concatenate([np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, np.float32(-np.inf))])
    special = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1e-45, -1e-45, 1e-38, 3.4e38], np.float32)
    return np.concatenate([edges, near, -edges, special]).astype(np.float32)


def test_e4m3fn_encoding_matches_ml_dtypes() -> None:
    """Every finite code round-trips; ties, neighbours of every code and midpoint, the max (448) and what
    rounds past it, subnormals, NaN and inf; and 400k random floats and random bit patterns."""
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    finite = np.isfinite(values)
    np.testing.assert_array_equal(re_mod.float32_to_e4m3fn_bits(np, values[finite]), codes[finite])
    rng = np.random.default_rng(0)
    scales = np.exp2(rng.integers(-24, 12, 200_000)).astype(np.float32)
    scaled = rng.standard_normal(200_000).astype(np.float32) * scales
    bits = rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for x in (_e4m3_edge_floats(), scaled, bits):
        got = re_mod.float32_to_e4m3fn_bits(np, x)
        assert got.dtype == np.uint8
        with np.errstate(invalid="ignore"):  # ml_dtypes warns casting NaN
            want = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        np.testing.assert_array_equal(got, want)


# -- GPU ------------------------------------------------------------------------------------------------------


def _gpu_engine(cfg: LLMEngineConfig) -> ReferenceEngine:
    pytest.importorskip("cupy")
    return ReferenceEngine.from_config(cfg, device="gpu")


def _scenario(rig: Rig, tokens: Tokens) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Prefill (garbage in the pad rows' RoPE), decodes, and a tree step for spec roles: every output."""
    past = [5, 2, 9]
    out = [prefill(rig, tokens, past, pad_rope=np.nan)]
    for _ in range(2):
        decode(rig, tokens, past)
        out.append(rig.outputs())
    if rig.cfg.role != "llm":
        phase = 5 if rig.cfg.role == "base" else 4
        step, _ = tree_step(rig, tokens, [[-1, 0, 0, 1], [-1, 0, 1], [-1, 0, 0, 0]], past, 4, phase=phase)
        out.append(rig.run(step))
    return out


GPU_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llm-f16": ("llm", {}),
    "llm-fp8-deepstack": ("llm", dict(kv_cache_dtype="fp8", num_deepstack_features=1)),
    "base-bf16": ("base", dict(activation_dtype="bfloat16", kv_cache_dtype="bfloat16", kv_pool_pages=16)),
    "draft": ("draft", {}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(GPU_VARIANTS))
def test_gpu_matches_host(variant: str) -> None:
    role, kw = GPU_VARIANTS[variant]
    cfg = small_cfg(role, **kw)
    m, p = cfg.pages_per_sequence, cfg.kv_pool_pages
    table = None
    if p > cfg.max_supported_batch_size * m:  # scattered pages
        k_ids = np.random.default_rng(2).permutation(p)[:3 * m].reshape(3, m).astype(np.int32)
        table = np.stack([k_ids, k_ids + p], axis=1)
    gpu = Rig(_gpu_engine(cfg), backend="cuda", table=table)
    host = Rig(ReferenceEngine.from_config(cfg, device="host"), table=table)
    got = _scenario(gpu, Tokens(cfg, seed=4))
    want = _scenario(host, Tokens(cfg, seed=4))
    for (gl, gh), (hl, hh) in zip(got, want):
        np.testing.assert_allclose(gl, hl, rtol=2e-3, atol=2e-3)
        if gh is not None and hh is not None:
            finite = np.isfinite(hh)  # padding rows of a base's hidden_states hold NaN from their RoPE rows
            np.testing.assert_allclose(gh[finite], hh[finite], rtol=2e-2, atol=2e-2)
    gp, hp = gpu.pools(), host.pools()
    for name in gp:
        a, b = gp[name], hp[name]
        if cfg.kv_dtype is trtio.DType.FP8:
            a, b = a.view(ml_dtypes.float8_e4m3fn), b.view(ml_dtypes.float8_e4m3fn)
        elif cfg.kv_dtype is trtio.DType.BFLOAT16:
            a, b = a.view(ml_dtypes.bfloat16), b.view(ml_dtypes.bfloat16)
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=7e-2, atol=7e-2)
    assert 0 < gpu.ctx.scratch_peak_bytes <= gpu.engine.device_memory_size_v2


@pytest.mark.gpu
def test_gpu_fp8_bits_equal_the_host_functions() -> None:
    cupy = pytest.importorskip("cupy")
    codes = np.arange(256, dtype=np.uint8)
    decoded = cupy.asnumpy(re_mod.e4m3fn_bits_to_float32(cupy, cupy.asarray(codes)))
    np.testing.assert_array_equal(decoded.view(np.uint32), re_mod.e4m3fn_bits_to_float32(np, codes).view(np.uint32))
    rng = np.random.default_rng(1)
    x = np.concatenate([_e4m3_edge_floats(),
                        rng.integers(0, 2 ** 32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    np.testing.assert_array_equal(cupy.asnumpy(re_mod.float32_to_e4m3fn_bits(cupy, cupy.asarray(x))),
                                  re_mod.float32_to_e4m3fn_bits(np, x))


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["float16", "fp8"])
def test_gpu_graph_replay_equals_direct_execution(kv: str) -> None:
    import cupy

    cfg = small_cfg("base", activation_dtype="bfloat16", kv_cache_dtype=kv)
    rig = Rig(_gpu_engine(cfg), backend="cuda")
    backend = trtio.get_backend("cuda")
    tokens = Tokens(cfg)
    past = [4, 7]
    prefill(rig, tokens, past)
    step, _ = tree_step(rig, tokens, [[-1, 0, 0], [-1, 0, 1]], past, 3, phase=5)
    snap = rig.pools()
    rig.run(step)  # the warm-up execute: compiles CuPy's kernels for these shapes
    rig.fill_pools(snap)
    pool = cupy.get_default_memory_pool()
    used, total = pool.used_bytes(), pool.total_bytes()
    allocs = backend.alloc_count
    backend.begin_capture(rig.stream.handle)
    try:
        assert rig.ctx.execute_async_v3(rig.stream.handle)
    except BaseException:
        backend.abort_capture(rig.stream.handle)
        raise
    graph = backend.end_capture(rig.stream.handle)
    assert (pool.used_bytes(), pool.total_bytes(), backend.alloc_count) == (used, total, allocs)
    _replay_on_new_data_equals_direct(rig, backend, graph, snap, tokens, past)


@pytest.mark.gpu
@pytest.mark.parametrize("role", ["llm", "base", "draft"])
def test_gpu_scratch_fits_the_worst_case_steps(role: str) -> None:
    """The largest step of each profile (every row valid, all logits rows for spec roles) stays within
    the context memory the engine reports."""
    cfg = small_cfg(role, kv_cache_dtype="fp8")
    rig = Rig(_gpu_engine(cfg), backend="cuda")
    tokens = Tokens(cfg)
    b, L, q = cfg.max_supported_batch_size, cfg.max_supported_input_length, cfg.max_step_tokens
    picks = list(range(b * L)) if role != "llm" else [s * L + L - 1 for s in range(b)]
    step = Step(rig, tokens, [tokens.draws(L) for _ in range(b)], [list(range(L))] * b, width=L, past=[0] * b,
                phase=1, picks=picks)
    rig.run(step)
    assert rig.ctx.scratch_peak_bytes <= rig.engine.get_device_memory_size_for_profile_v2(0)
    if role != "llm":
        step, _ = tree_step(rig, tokens, [[-1] + list(range(q - 1))] * b, [L] * b, q, phase=5 if role == "base" else 4)
    else:
        step = Step(rig, tokens, [tokens.draws(1) for _ in range(b)], [[L]] * b, width=1, past=[L] * b, phase=3,
                    picks=list(range(b)))
    rig.run(step)
    assert rig.ctx.scratch_peak_bytes <= rig.engine.device_memory_size_v2
