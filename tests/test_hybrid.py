"""Hybrid models (Gated DeltaNet: Qwen3.5; Mamba2: Nemotron-H): configs, the engine I/O they imply, and sequences
whose recurrent state lives in one row per slot.

The ground truth is the numpy toy model (``toy_model.reference_forward``) over each sequence's own tokens from zero
states: every sequence of a changing batch (admitted into a slot another sequence used, started from a pinned
prefix's state snapshot, released) must give the logits it gives alone.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_contracts import parse_onnx_io

import trtio
from trtio import BindingError, CapacityError, ConfigError, DType, LLMEngineConfig, ShapeError, names
from trtio._contracts import build_registry
from trtio._rope import RopeScaling, rope_cos_sin_table, rope_parameters
from trtio._state import paged_state_specs
from trtio.edgellm import EngineDir
from trtio.families.hybrid.hybrid_config import recurrent_state_specs
from trtio.testing import ReferenceEngine, reference_forward
from trtio.testing.toy_engines import HYBRID_DIRS, HybridToyEngine, default_engines_dir
from trtio.testing.toy_model import no_rope_table

FIXTURES = Path(__file__).parent / "fixtures"
QWEN35 = FIXTURES / "edgellm-0.11" / "qwen35-hybrid"  # written by Edge-LLM 0.11's exporter and config writer
NEMOTRON = FIXTURES / "edgellm" / "nemotron-h-hublayout-tiny" / "config.json"  # written by its config writer
ENGINES = default_engines_dir()


# -- configs ---------------------------------------------------------------------------------------------


def test_the_exporters_qwen35_config_maps_onto_the_hybrid_fields() -> None:
    cfg = LLMEngineConfig.from_edgellm(QWEN35 / "config.json")
    assert cfg.layer_types == ("mamba",) * 3 + ("attention",) + ("mamba",) * 3 + ("attention",)
    assert (cfg.recurrent_kind, cfg.num_attention_layers, cfg.num_recurrent_layers) == ("gated_deltanet", 2, 6)
    assert cfg.recurrent_layers == (0, 1, 2, 4, 5, 6)
    assert cfg.conv_state_shape == (256, 4) and cfg.recurrent_state_shape == (8, 16, 16)
    assert (cfg.recurrent_state_dtype, cfg.conv_state_dtype) == ("float32", "float16")
    assert cfg.recurrent_spec_verify_mode == "snapshot" and cfg.use_rope
    assert [e is None for e in cfg.kv_layer_configs] == [t == "mamba" for t in cfg.layer_types]
    for key in ("layer_types", "conv_dim", "recurrent_state_num_heads", "num_linear_attn_layers", "use_rope"):
        assert key not in cfg.extras, f"{key} is read, not left in extras"
    assert LLMEngineConfig.from_dict(cfg.to_dict()) == cfg
    assert json.loads(json.dumps(cfg.to_dict()))["kv_layer_configs"][3] == {"num_kv_heads": 2, "head_dim": 32}


def test_the_nemotron_h_config_is_mamba2_without_rope_and_its_mlp_blocks_absent() -> None:
    cfg = LLMEngineConfig.from_edgellm(NEMOTRON)
    raw = json.loads(NEMOTRON.read_text())
    assert raw["num_hidden_layers"] == 4 and cfg.layer_types == ("mamba", "attention", "mamba")  # "M-*M": no MLP
    assert (cfg.recurrent_kind, cfg.recurrent_state_dtype, cfg.use_rope) == ("mamba2", "float16", False)
    assert cfg.recurrent_state_num_groups == 2 and cfg.recurrent_state_shape == (4, 16, 16)
    assert cfg.num_layers == 3 and cfg.num_attention_layers == 1


def _edit(path: Path, **changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    return raw


@pytest.mark.parametrize("changes,kind", [
    ({"recurrent_spec_verify_mode": None}, "gated_deltanet"),  # the FP32 state alone tells GDN
    ({"recurrent_spec_verify_mode": None, "recurrent_state_dtype": "fp16"}, "mamba2"),
])
def test_the_recurrent_kind_is_told_from_the_keys(changes: dict[str, Any], kind: str) -> None:
    assert LLMEngineConfig.from_edgellm(_edit(QWEN35 / "config.json", **changes)).recurrent_kind == kind


@pytest.mark.parametrize("source,changes,key,needle", [
    (QWEN35 / "config.json", {"recurrent_state_num_groups": 2}, "recurrent_state_num_groups",
     "marks a mamba2 layer but recurrent_spec_verify_mode marks gated_deltanet"),
    (QWEN35 / "config.json", {"recurrent_state_dtype": "fp16"}, "recurrent_state_dtype", "ambiguous"),
    (QWEN35 / "config.json", {"layer_types": ["mamba", "linear_attention"] * 4}, "layer_types",
     "'linear_attention'"),
    (QWEN35 / "config.json", {"num_linear_attn_layers": 5}, "num_linear_attn_layers", "lists 6 recurrent"),
    (QWEN35 / "config.json", {"num_attention_layers": 3}, "num_attention_layers", "lists 2 attention layers"),
    (QWEN35 / "config.json", {"conv_dim": None}, "conv_dim", "is required"),
    (QWEN35 / "config.json", {"recurrent_state_dtype": "fp8"}, "recurrent_state_dtype", "'fp32'"),
    (QWEN35 / "config.json", {"engine_role": "draft", "spec_decode_type": "mtp", "draft_vocab_size": 1000,
                              "base_model_hidden_size": 128}, "engine_role", "drafts of attention layers only"),
    (NEMOTRON, {"conv_dim": 96}, "conv_dim", "convolves 128 channels"),
])
def test_hybrid_keys_that_do_not_fit_are_refused_naming_the_key(source: Path, changes: dict[str, Any], key: str,
                                                                 needle: str) -> None:
    raw = _edit(source, **changes)
    if changes.get("engine_role") == "draft":
        raw["builder_config"].update(spec_draft=True, max_draft_tree_size=8)
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_edgellm(raw, what="cfg.json")
    assert info.value.field == f"cfg.json: {key}"
    assert needle in str(info.value)


def test_hybrid_fields_are_validated_together() -> None:
    cfg = LLMEngineConfig.from_edgellm(QWEN35 / "config.json")
    with pytest.raises(ConfigError, match=r"kv_layer_configs\[3\]: attention layer 3 must have the model's KV"):
        dataclasses.replace(cfg, kv_layer_configs=cfg.kv_layer_configs[:3] + (None,) + cfg.kv_layer_configs[4:]
                            ).validate()
    with pytest.raises(ConfigError, match=r"kv_layer_configs\[0\]: layer 0 is recurrent"):
        dataclasses.replace(cfg, kv_layer_configs=(cfg.kv_layer_configs[3],) + cfg.kv_layer_configs[1:]).validate()
    with pytest.raises(ConfigError, match="recurrent_kind: must be one of"):
        dataclasses.replace(cfg, recurrent_kind=None).validate()
    dense = dataclasses.replace(cfg, layer_types=(), kv_layer_configs=(), recurrent_kind=None)
    with pytest.raises(ConfigError, match="conv_dim: is set but layer_types has no recurrent"):
        dense.validate()


# -- the engine I/O a hybrid config implies ----------------------------------------------------------------


def _declared(cfg: LLMEngineConfig) -> dict[str, Any]:
    specs = [*build_registry(cfg), *paged_state_specs(cfg), *recurrent_state_specs(cfg)]
    return {s.name: s for s in specs}


def test_the_registry_names_every_binding_the_exporter_wrote_for_qwen35() -> None:
    """Every input and output of the exported Gated-DeltaNet graph, with its dtype, rank (which dims are dynamic)
    and direction, and nothing else but optional inputs a graph may lack."""
    graph = parse_onnx_io(QWEN35 / "onnx-io.txt")
    cfg = LLMEngineConfig.from_edgellm(QWEN35 / "config.json")
    specs = _declared(cfg)
    assert len(graph) == 26 + 15
    extra = {n for n, s in specs.items() if n not in graph}
    assert extra == {names.kSkipSoftmaxScale} and specs[names.kSkipSoftmaxScale].optional
    for name, (io, dtype, shape) in graph.items():
        s = specs[name]
        assert (s.io, s.dtype, s.engine_shape) == (io, dtype, shape), name
    assert not specs[names.kStateIndices].optional, "a hybrid graph reads state_indices"
    engine = ReferenceEngine.from_config(cfg, device="host", null_compute=True)
    declared = [(d.name, "input" if d.is_input else "output", d.dtype, d.shape) for d in engine._decls]
    assert declared == [(n, io, dt, sh) for n, (io, dt, sh) in graph.items()], "in the exporter's order"
    aliases = {d.name: d.alias for d in engine._decls if d.alias}
    assert aliases[names.present_conv_state(5)] == names.conv_state(5)
    assert aliases[names.present_recurrent_state(0)] == names.recurrent_state(0)


def test_the_registry_names_every_binding_the_exporter_wrote_for_nemotron_h() -> None:
    """The same for the Mamba2 graph the exporter wrote for the checkpoint of NEMOTRON's config."""
    graph = parse_onnx_io(FIXTURES / "edgellm-0.11" / "nemotron-h-mamba2" / "onnx-io.txt")
    specs = _declared(LLMEngineConfig.from_edgellm(NEMOTRON))
    assert len(graph) == 17 + 6
    assert {n for n in specs if n not in graph} == {names.kSkipSoftmaxScale}
    for name, (io, dtype, shape) in graph.items():
        s = specs[name]
        assert (s.io, s.dtype, s.engine_shape) == (io, dtype, shape), name


def test_a_mamba2_config_implies_the_bindings_edge_llm_declares_for_it() -> None:
    """Nemotron-H (written by Edge-LLM's config writer; its graph I/O from the facts: conv_state_j FP16 [rows,
    conv_dim, k], recurrent_state_j FP16 [rows, heads, head_dim, ssm_state] with present aliases, KV pools numbered
    over attention layers only, state_indices read, the RoPE input still bound without RoPE)."""
    cfg = LLMEngineConfig.from_edgellm(NEMOTRON)
    specs = _declared(cfg)
    f16, f32, i32, i64 = DType.FLOAT16, DType.FLOAT32, DType.INT32, DType.INT64
    want = {
        "inputs_embeds": ("input", f16, (-1, 64)), "past_key_values_0": ("input", f16, (2, -1, 128, 2, 16)),
        "rope_rotary_cos_sin": ("input", f32, (-1, 16)), "positions": ("input", i32, (-1,)),
        "query_start_offsets": ("input", i32, (-1,)), "query_lengths": ("input", i32, (-1,)),
        "past_lengths": ("input", i32, (-1,)), "attention_sequence_lengths": ("input", i32, (-1,)),
        "state_indices": ("input", i32, (-1,)), "execution_phase_marker": ("input", i32, (-1,)),
        "context_sequence_count_carrier": ("input", i32, (-1,)), "kv_page_table": ("input", i32, (-1, 2, -1)),
        "logits_indices": ("input", i64, (-1,)),
        "conv_state_0": ("input", f16, (-1, 128, 4)), "conv_state_1": ("input", f16, (-1, 128, 4)),
        "recurrent_state_0": ("input", f16, (-1, 4, 16, 16)), "recurrent_state_1": ("input", f16, (-1, 4, 16, 16)),
        "logits": ("output", f32, (-1, 512)), "present_key_values_0": ("output", f16, (2, -1, 128, 2, 16)),
        "present_conv_state_0": ("output", f16, (-1, 128, 4)), "present_conv_state_1": ("output", f16, (-1, 128, 4)),
        "present_recurrent_state_0": ("output", f16, (-1, 4, 16, 16)),
        "present_recurrent_state_1": ("output", f16, (-1, 4, 16, 16)),
    }
    assert {n for n in specs if not specs[n].optional or n in want} == set(want)
    for name, (io, dtype, shape) in want.items():
        s = specs[name]
        assert (s.io, s.dtype, s.engine_shape) == (io, dtype, shape), name
    pool = specs["recurrent_state_1"]
    assert pool.profiles == ((((2, 4, 16, 16),) * 3,) * 2), "both profiles pinned to max_batch_size rows"


def test_binding_refuses_an_engine_whose_state_disagrees_with_the_config() -> None:
    cfg = HybridToyEngine.load("toy-qwen35-ragged").config
    other = dataclasses.replace(cfg, recurrent_state_dtype="float16", conv_kernel=3).validate()
    engine = ReferenceEngine.from_config(other, device="host", null_compute=True)
    with pytest.raises(BindingError) as info:
        trtio.create_for_llm(engine, cfg)
    msg = str(info.value)
    assert "recurrent_state_0: the engine's state is float16 but the config's recurrent_state_dtype is float32" in msg
    assert "conv_state_3: dim 2 is 3 in the engine but 4 in the config" in msg
    fewer = dataclasses.replace(cfg, layer_types=cfg.layer_types[1:], kv_layer_configs=cfg.kv_layer_configs[1:])
    with pytest.raises(BindingError, match="conv_state_3: the engine declares this recurrent state but the config has "
                                           "3 recurrent layers"):
        trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="host", null_compute=True), fewer.validate())


# -- RoPE keys that change the math --------------------------------------------------------------------------

HUNYUAN_SCALING = {"alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "type": "dynamic"}  # HunYuan-7B's hub config


def test_hunyuans_alpha_rescales_the_base() -> None:
    scaling = RopeScaling.from_hf(HUNYUAN_SCALING)
    assert scaling is not None and scaling.alpha == 1000.0
    inv, attention = rope_parameters(128, 10000.0, scaling, max_position_embeddings=32768)
    base = 10000.0 * 1000.0 ** (128 / 126)
    np.testing.assert_allclose(inv, base ** (-np.arange(64) * 2 / 128), rtol=1e-12)
    assert attention == 1.0
    plain, _ = rope_parameters(128, 10000.0)
    assert inv[-1] < plain[-1] / 900, "alpha moves the lowest frequency by about alpha"
    table = rope_cos_sin_table(64, 128, 10000.0, scaling=scaling, max_position_embeddings=32768)[0]
    np.testing.assert_allclose(table[5, :64], np.cos(5 * inv), atol=1e-6)


def test_hunyuans_rope_equals_transformers_dynamic_ntk_alpha() -> None:
    """The frequencies transformers' HunYuan model computes for a config like the real HunYuan-7B's."""
    pytest.importorskip("torch")
    hunyuan = pytest.importorskip("transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense")
    from transformers import HunYuanDenseV1Config

    hf = HunYuanDenseV1Config(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                              num_hidden_layers=1, intermediate_size=64, vocab_size=32, max_position_embeddings=32768,
                              rope_theta=10000.0, rope_scaling=dict(HUNYUAN_SCALING))
    rotary = hunyuan.HunYuanDenseV1RotaryEmbedding(hf)
    assert rotary.rope_type == "ntk_alpha"
    scaling = RopeScaling.from_hf(HUNYUAN_SCALING)
    ours, attention = rope_parameters(128, 10000.0, scaling, max_position_embeddings=32768)
    np.testing.assert_allclose(ours, rotary.inv_freq.double().numpy(), rtol=2e-6)
    assert attention == rotary.attention_scaling


@pytest.mark.parametrize("scaling,key,needle", [
    ({"rope_type": "turbo", "factor": 2.0}, "rope_scaling.rope_type", "expected one of"),
    ({"type": "dynamic", "factor": 2.0, "gamma": 3.0}, "rope_scaling.gamma",
     "is not a RoPE scaling parameter trtio knows"),
    ({"type": "default", "beta": 0.5}, "rope_scaling.beta", "refused rather than its RoPE table computed without it"),
])
def test_unknown_rope_types_and_parameters_are_refused_naming_the_key(scaling: dict[str, Any], key: str,
                                                                      needle: str) -> None:
    raw = _edit(QWEN35 / "config.json", rope_scaling=scaling)
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_edgellm(raw, what="cfg.json")
    assert info.value.field == f"cfg.json: {key}" and needle in str(info.value)


def test_a_rope_theta_copy_that_disagrees_is_refused() -> None:
    raw = _edit(QWEN35 / "config.json")
    raw["rope_scaling"]["rope_theta"] = 1e6
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_edgellm(raw, what="cfg.json")
    assert info.value.field == "cfg.json: rope_scaling.rope_theta" and "1e+07" in str(info.value)


# -- sequences on hybrid models --------------------------------------------------------------------------


class Truth:
    """The numpy model's logits after every token of one sequence, from zero states. A model without RoPE
    (``use_rope`` false: Nemotron-H) rotates by the identity, as Hugging Face's applies no rotation."""

    def __init__(self, toy: HybridToyEngine) -> None:
        self.cfg, self.w, self.table = toy.config, toy.weights, toy.embedding()
        cfg = self.cfg
        self.rope = rope_cos_sin_table(cfg.max_kv_cache_capacity, cfg.rotary_dim, cfg.rope_theta) if cfg.use_rope \
            else no_rope_table(cfg.max_kv_cache_capacity, cfg.rotary_dim)

    def logits(self, tokens: list[int]) -> np.ndarray:
        return reference_forward(self.w, self.cfg, self.table[tokens].astype(np.float16), rope=self.rope)[1]


def assert_logits(got: np.ndarray, truth: np.ndarray, what: str, tol: float = 3e-3) -> None:
    np.testing.assert_allclose(got, truth, atol=tol, rtol=tol, err_msg=what)


def setup_for(toy: HybridToyEngine, device: str = "host", *, graphs: bool = False, **kw: Any) -> trtio.LLMSetup:
    return trtio.create_for_llm(toy.reference_engine(device=device), toy.config, graphs=graphs, **kw)


class Story:
    """Drives a hybrid setup through admissions, decodes, pins and releases, keeping each request's fed tokens and
    the logits it got, to compare with :class:`Truth`."""

    def __init__(self, setup: trtio.LLMSetup, toy: HybridToyEngine) -> None:
        self.setup, self.table = setup, toy.embedding()
        self.tokens: dict[int, list[int]] = {}  # request -> tokens fed so far
        self.seen: dict[int, list[tuple[int, np.ndarray]]] = {}  # request -> (tokens fed, logits then)
        self.where: dict[int, int] = {}  # slot -> request

    def x(self, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
        return self.table[tokens][None].astype(np.float16), np.array([len(tokens)])

    def admit(self, req: int, slot: int, prompt: list[int], prefix: Any = None, head: list[int] | None = None) -> None:
        x, lens = self.x(prompt)
        logits = self.setup.prefill(x, lens, slots=[slot], prefix=prefix).to_numpy()
        self.tokens[req] = list(head or []) + list(prompt)
        self.seen[req] = [(len(self.tokens[req]), logits[0])]
        self.where[slot] = req

    def decode(self) -> None:
        active = self.setup.active.tolist()
        assert active == sorted(self.where)
        nxt = [int(self.seen[self.where[s]][-1][1].argmax()) for s in active]
        logits = self.setup.decode(self.table[nxt][:, None].astype(np.float16)).to_numpy()
        for i, s in enumerate(active):
            req = self.where[s]
            self.tokens[req].append(nxt[i])
            self.seen[req].append((len(self.tokens[req]), logits[i]))

    def release(self, slot: int) -> None:
        self.setup.release([slot])
        del self.where[slot]

    def check(self, truth: Truth) -> None:
        # An FP16 state (Mamba2's) is rounded after every token, so a matrix product's last bit, which differs
        # between a batch and one sequence, moves a state element by an FP16 step now and then: a looser bound.
        tol = 3e-3 if truth.cfg.recurrent_state_dtype == "float32" else 2e-2
        for req, rows in self.seen.items():
            full = truth.logits(self.tokens[req])
            for n, got in rows:
                assert_logits(got, full[n - 1], f"request {req} after {n} tokens", tol)


def run_story(setup: trtio.LLMSetup, toy: HybridToyEngine, steps: int = 14) -> Story:
    """Five requests on four slots: admitted at different steps into chosen slots, one pinned and two started from
    its snapshot in other slots, one released and its slot reused by a fresh request."""
    rng = np.random.default_rng(1)
    vocab = toy.config.vocab_size
    prompts = [list(map(int, rng.integers(0, vocab, n))) for n in (20, 7, 5, 9, 3)]
    story = Story(setup, toy)
    prefix = None
    story.admit(0, 2, prompts[0])
    for step in range(steps):
        if step == 2:
            story.admit(1, 0, prompts[1])
        if step == 4:
            held = len(story.tokens[1])
            prefix = setup.pin_prefix(0, held)
            head = story.tokens[1][:held]
        if step == 5:
            story.admit(2, 3, prompts[2], prefix=prefix, head=head)
        if step == 7:
            story.release(2)
            story.admit(3, 2, prompts[3])  # the slot request 0 used: its state rows must start at zero
        if step == 9:
            story.release(0)  # the prefix outlives the sequence it was pinned from
            story.admit(4, 1, prompts[4], prefix=prefix, head=head)
        story.decode()
    assert prefix is not None
    prefix.release()
    return story


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("name", HYBRID_DIRS)
def test_hybrid_sequences_in_a_changing_batch_give_their_solo_logits(device: str, name: str, graphs: bool) -> None:
    toy = HybridToyEngine.load(name)
    with setup_for(toy, device, graphs=graphs) as setup:
        story = run_story(setup, toy)
        assert setup.active.tolist() == [1, 2, 3] and setup.kv_pages.used == 3
        if graphs:
            stats = setup.graph_stats["llm"]
            assert stats.hits > stats.captures > 0, "decode graphs replay across admissions and releases"
    story.check(Truth(toy))


def test_admission_zeroes_a_reused_slots_state_on_the_device() -> None:
    """A request admitted into the slot another request used starts from zero states: its rows of every pool read
    back as what a fresh setup leaves there, and its logits are its solo ones."""
    toy = HybridToyEngine.load("toy-qwen35-ragged")
    rng = np.random.default_rng(3)
    first, second = [list(map(int, rng.integers(0, 512, n))) for n in (30, 6)]
    with setup_for(toy) as setup, setup_for(toy) as fresh:
        story = Story(setup, toy)
        story.admit(0, 1, first)
        for _ in range(3):
            story.decode()
        story.release(1)
        story.admit(1, 1, second)
        alone = Story(fresh, toy)
        alone.admit(1, 1, second)
        for past, _ in setup.state.pairs:
            if past.startswith(("conv_state", "recurrent_state")):
                got, want = setup.state.tensors[past].to_numpy()[1], fresh.state.tensors[past].to_numpy()[1]
                np.testing.assert_array_equal(got, want, err_msg=past)
    story.check(Truth(toy))


def test_a_model_without_rope_is_fed_the_identity_table_and_rotates_nothing() -> None:
    """Nemotron-H (``use_rope`` false): the RoPE rows its steps gather are cos 1, sin 0 (Edge-LLM's runtime fills
    its table so: ``initializeNopeCosSinCache``), and its logits are those of attention without rotation (Hugging
    Face's). The toy's attention rotates by whatever table it is fed, so a real table would show here."""
    toy = HybridToyEngine.load("toy-nemotron-h-ragged")
    cfg = toy.config
    assert not cfg.use_rope
    rng = np.random.default_rng(6)
    with setup_for(toy) as setup:
        story = Story(setup, toy)
        story.admit(0, 2, list(map(int, rng.integers(0, 512, 9))))
        story.admit(1, 0, list(map(int, rng.integers(0, 512, 5))))
        for _ in range(3):
            story.decode()
        rows = setup.tensor_map[names.kRopeCosSin].to_numpy().reshape(-1, cfg.rotary_dim)
        half = cfg.rotary_dim // 2
        assert rows.shape[0] >= 2
        np.testing.assert_array_equal(rows[:, :half], 1.0)
        np.testing.assert_array_equal(rows[:, half:], 0.0)
    truth = Truth(toy)
    story.check(truth)
    tokens = story.tokens[0]
    rotated = reference_forward(toy.weights, cfg, truth.table[tokens].astype(np.float16),
                                rope=rope_cos_sin_table(cfg.max_kv_cache_capacity, cfg.rotary_dim, cfg.rope_theta))[1]
    assert np.abs(rotated - truth.logits(tokens)).max() > 0.1, "a rotated table changes the logits: the test can tell"


def test_state_indices_carry_each_step_sequences_slot() -> None:
    """A decode of slots [3, 1] (not the batch's order, not compacted) stages state_indices = [3, 1]."""
    toy = HybridToyEngine.load("toy-nemotron-h-ragged")
    with setup_for(toy) as setup:
        story = Story(setup, toy)
        rng = np.random.default_rng(4)
        story.admit(0, 1, list(map(int, rng.integers(0, 512, 4))))
        story.admit(1, 3, list(map(int, rng.integers(0, 512, 6))))
        nxt = [int(story.seen[r][-1][1].argmax()) for r in (1, 0)]
        logits = setup.decode(story.table[nxt][:, None].astype(np.float16), slots=[3, 1]).to_numpy()
        assert setup.io.member("state_indices").to_numpy().tolist()[:2] == [3, 1]
        for i, req in enumerate((1, 0)):
            story.tokens[req].append(nxt[i])
            story.seen[req].append((len(story.tokens[req]), logits[i]))
    story.check(Truth(toy))


def test_a_hybrid_prefix_pins_the_whole_sequence_and_its_snapshot_rows_are_counted() -> None:
    toy = HybridToyEngine.load("toy-qwen35-ragged")
    with setup_for(toy, max_prefixes=2) as setup:
        story = Story(setup, toy)
        story.admit(0, 0, [5, 6, 7, 8, 9])
        with pytest.raises(ShapeError, match=r"pin_prefix: tokens = 3, but slot 0's sequence holds 5 tokens: on a "
                                             r"hybrid model a prefix keeps the slot's recurrent states"):
            setup.pin_prefix(0, 3)
        first, second = setup.pin_prefix(0, 5), setup.pin_prefix(0, 5)
        pages = setup.kv_pages.used
        with pytest.raises(CapacityError, match=r"max_prefixes=2"):
            setup.pin_prefix(0, 5)
        assert setup.kv_pages.used == pages, "a refused pin holds no page"
        first.release()
        third = setup.pin_prefix(0, 5)  # the released row is free again
        for p in (second, third):
            p.release()
        assert setup.kv_pages.used == 1


def test_memory_report_lists_the_state_pools_and_the_snapshot_pool() -> None:
    toy = HybridToyEngine.load("toy-qwen35-ragged")
    cfg = toy.config
    with setup_for(toy, max_prefixes=3) as setup:
        entries = {e.name: e for e in setup.memory_report().entries}
    for j in range(cfg.num_recurrent_layers):
        conv, rec = entries[names.conv_state(j)], entries[names.recurrent_state(j)]
        assert conv.shape == (4, 128, 4) and conv.dtype == "float16" and conv.nbytes == 4 * 128 * 4 * 2
        assert rec.shape == (4, 4, 16, 16) and rec.dtype == "float32" and rec.nbytes == 4 * 4 * 16 * 16 * 4
    assert entries["recurrent_state_snapshots"].shape == (4, 3, 4, 16, 16), "[recurrent layers, max_prefixes, ...]"
    assert entries["conv_state_snapshots"].shape == (4, 3, 128, 4)


def _churn(toy: HybridToyEngine, requests: int) -> None:
    """``requests`` requests through a hybrid setup, a few at a time, every fourth one from a pinned prefix that is
    re-pinned now and then: afterwards no slot, page or snapshot row is held."""
    rng = np.random.default_rng(5)
    table = toy.embedding()
    with setup_for(toy, max_prefixes=2) as setup:
        seqs = setup._seqs
        rec = setup.recurrent
        assert rec is not None
        pages, rows = setup.kv_pages.total, rec.rows.total
        prefix = None
        for r in range(requests):
            free = [s for s in range(4) if not seqs.is_active(s)]
            if not free:
                setup.release([int(rng.choice(setup.active))])
                free = [s for s in range(4) if not seqs.is_active(s)]
            slot = int(rng.choice(free))
            tokens = list(map(int, rng.integers(0, 512, int(rng.integers(1, 9)))))
            use = prefix if r % 4 == 3 and prefix is not None else None
            setup.prefill(table[tokens][None].astype(np.float16), np.array([len(tokens)]), slots=[slot], prefix=use)
            setup.decode(table[[1] * len(setup.active)][:, None].astype(np.float16))
            if r % 50 == 0:
                if prefix is not None:
                    prefix.release()
                prefix = setup.pin_prefix(slot, int(setup.lengths[setup.active.tolist().index(slot)]))
        if prefix is not None:
            prefix.release()
        setup.release(setup.active.tolist())
        assert (setup.active.size, setup.kv_pages.free, rec.rows.free) == (0, pages, rows)


def test_requests_through_a_hybrid_setup_leak_no_slot_page_or_state_row() -> None:
    _churn(HybridToyEngine.load("toy-nemotron-h-ragged"), 120)


@pytest.mark.slow
def test_a_thousand_requests_leak_no_slot_page_or_state_row() -> None:
    _churn(HybridToyEngine.load("toy-nemotron-h-ragged"), 1000)


# -- the toy directories ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HYBRID_DIRS)
def test_the_hybrid_toy_directories_open_as_edge_llm_directories(name: str) -> None:
    d = EngineDir.open(ENGINES / name)
    assert d.kind == "llm" and d.config.is_hybrid and not d.has_engines
    assert d.embedding_table().shape == (512, 64)


# -- on a GPU --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", HYBRID_DIRS)
def test_on_the_gpu_admissions_zero_restore_and_replay_graphs(name: str) -> None:
    """The cuda backend, CuPy reference engines, graphs on: the changing batch of run_story, each request's solo
    logits, and its decode graphs replayed across admissions."""
    pytest.importorskip("cupy")
    from trtio._cuda.backend import cuda_available

    if not cuda_available():
        pytest.skip("no CUDA device answers here")
    toy = HybridToyEngine.load(name)
    with setup_for(toy, "gpu", graphs=True) as setup:
        assert setup.io.inputs_embeds.backend.name == "cuda"
        story = run_story(setup, toy, steps=16)
        stats = setup.graph_stats["llm"]
        assert stats.hits > stats.captures > 0
    story.check(Truth(toy))


# -- trtio plan / inspect --------------------------------------------------------------------------------


def test_plan_and_inspect_show_the_state_pools_and_their_bytes() -> None:
    from trtio._tools.engine_dirs import format_kv_state, inspect_engine_dir, plan_engine_dir

    plan = plan_engine_dir(ENGINES / "toy-qwen35-ragged")
    (row,) = plan["kv_state"]
    assert row["tensors"] == 2 and row["names"] == ["past_key_values_0", "past_key_values_1"], "KV pools only"
    rec = row["recurrent"]
    assert (rec["kind"], rec["layers"], rec["rows"], rec["snapshot_rows"]) == ("gated_deltanet", 4, 4, 4)
    assert rec["conv"]["shape"] == [4, 128, 4] and rec["conv"]["bytes"] == 4 * (4 * 128 * 4 * 2)
    assert rec["state"]["dtype"] == "float32" and rec["state"]["bytes"] == 4 * (4 * 4 * 16 * 16 * 4)
    assert rec["snapshot_bytes"] == rec["conv"]["bytes"] + rec["state"]["bytes"]  # 4 rows of each of 4 slots' pools
    assert "recurrent_state_snapshots" in plan["text"] and "conv_state_0 " in plan["text"]  # the memory report
    (line,) = [x for x in format_kv_state(plan["kv_state"]) if "recurrent" in x]
    assert "4 recurrent layers (gated_deltanet)" in line and "80.00 KiB in all" in line and "4 rows per pool" in line
    inspected = inspect_engine_dir(ENGINES / "toy-nemotron-h-ragged")
    rows = {t["name"]: t for t in inspected["engines"][0]["tensors"]}
    for name in ("conv_state_2", "recurrent_state_2", "present_recurrent_state_2"):
        assert name in rows, name
    assert rows["recurrent_state_0"]["dtype"] == "float16"


# -- trtio demo and trtio generate -------------------------------------------------------------------------


def test_the_demo_runs_the_hybrid_directories_and_their_admission_story() -> None:
    from trtio._cuda.backend import get_backend
    from trtio._tools.hybrid_demo import format_hybrid, run_hybrid

    prompts = [[3, 14, 15], [92, 65, 35, 89, 79], [32, 38], [46, 26, 43, 38]]  # the story needs four
    out = run_hybrid(ENGINES, prompts, 6, get_backend("host"))
    assert list(out) == list(HYBRID_DIRS)
    for name, s in out.items():
        toy = HybridToyEngine.load(name)
        assert s["ok"] and s["admissions"]["equal"], name
        assert any(e["event"] == "pin" for e in s["admissions"]["events"])
        assert any(r["from_prefix"] and r["equal"] for r in s["admissions"]["requests"]), "a request from the prefix"
        with setup_for(toy) as setup:
            from trtio.testing.toy_runtime import greedy_generate

            assert s["tokens"] == greedy_generate(setup, toy.embedding(), prompts, 6)
    text = "\n".join(format_hybrid(out, verbose=True))
    assert "== hybrid model: toy-nemotron-h-ragged (mamba2; layers mamba, mamba, attention, mamba; RoPE off" in text


def test_generate_runs_a_hybrid_directory() -> None:
    pytest.importorskip("tokenizers")
    import io

    from trtio._tools.generate import GenerateOptions, run_generate

    out, err = io.StringIO(), io.StringIO()
    stats = run_generate(GenerateOptions(ENGINES / "toy-qwen35-ragged", "The quick brown fox", 8, backend="host"),
                         out, err)
    assert stats["tokens"] >= 1 and out.getvalue().startswith("The quick brown fox")
    assert "has no engine files: running" in err.getvalue()
