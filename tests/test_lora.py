"""LoRA adapters on Edge-LLM engines (issue 37): the engine's LoRA inputs, LoraAdapter, LLMSetup.set_lora.

The engines are ReferenceEngines of ``engines/toy-lora-ragged`` (the ragged toy with ``max_lora_rank`` 8), whose
linears add ``x @ A @ B``; the ground truth is ``toy_model.reference_forward`` on the toy's weights merged with the
adapter's (``W + A @ B``: ``reference_lora.merged_weights``), recomputed from scratch. Tests taking ``device`` also
run on the cuda backend with GPU ReferenceEngines where a GPU answers (``-m gpu``).

Tolerance: as ``tests/test_setups_ragged.py`` (2e-3), relative too, since an adapter makes the logits larger.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _onnx_io import parse_onnx_io
from safetensors.numpy import save_file

import trtio
from trtio import BindingError, ConfigError, InvalidTypeError, InvalidValueError
from trtio._cuda.backend import Location
from trtio._engine import EngineIO, TensorInfo
from trtio.edgellm import EngineDir
from trtio.families.lora.adapters import LoraAdapter, LoraInputs
from trtio.testing import ReferenceEngine, reference_forward, toy_embedding
from trtio.testing.reference_lora import lora_modules, merged_weights, toy_adapter
from trtio.testing.toy_dirs import toy_engine_dir
from trtio.testing.toy_runtime import embed_batch

FIXTURES = Path(__file__).parent / "fixtures"
TOY_LORA = toy_engine_dir("toy-lora-ragged")
QWEN3_LORA = FIXTURES / "edgellm-0.11" / "qwen3-lora"
E = toy_embedding(512, 64)
PROMPTS = [[1, 5, 9, 200, 17, 3], [7, 8]]
TOL = 2e-3


def lora_cfg(**over: Any) -> trtio.LLMEngineConfig:
    cfg = EngineDir.open(TOY_LORA).config
    return dataclasses.replace(cfg, **over).validate() if over else cfg


def adapters() -> tuple[LoraAdapter, LoraAdapter]:
    return LoraAdapter.load(TOY_LORA / "adapters" / "chat"), LoraAdapter.load(TOY_LORA / "adapters" / "terse")


def _engine(cfg: trtio.LLMEngineConfig, device: str, **kw: Any) -> ReferenceEngine:
    return ReferenceEngine.from_config(cfg, device=device, **kw)


def _run(setup: trtio.LLMSetup, steps: int, *, switch: dict[int, LoraAdapter | None] | None = None,
         prompts: list[list[int]] = PROMPTS) -> tuple[list[np.ndarray], list[list[int]]]:
    """Prefill + greedy decode; ``switch``: step -> the adapter set before that decode step (1 = the first)."""
    emb, lens = embed_batch(E, prompts, np.float16)
    out = [setup.prefill(emb, lens).to_numpy()]
    toks = [list(p) for p in prompts]
    for step in range(1, steps + 1):
        if switch and step in switch:
            setup.set_lora(switch[step])
        nxt = out[-1].argmax(-1)
        for b, t in enumerate(nxt):
            toks[b].append(int(t))
        out.append(setup.decode(E[nxt][:, None, :].astype(np.float16)).to_numpy())
    return out, toks


def _check_against_merged(eng: ReferenceEngine, cfg: trtio.LLMEngineConfig, adapter: LoraAdapter | None,
                          out: list[np.ndarray], toks: list[list[int]]) -> None:
    weights = merged_weights(eng.weights, cfg, adapter)
    for b, p in enumerate(PROMPTS):
        _, ref = reference_forward(weights, cfg, E[toks[b]].astype(np.float16))
        for step, logits in enumerate(out):
            np.testing.assert_allclose(logits[b], ref[len(p) - 1 + step], atol=TOL, rtol=TOL)


# -- configs and directories --------------------------------------------------------------------------


def test_max_lora_rank_is_read_from_the_builder_config() -> None:
    assert trtio.LLMEngineConfig.from_edgellm(QWEN3_LORA / "config.json").max_lora_rank == 8
    assert lora_cfg().max_lora_rank == 8
    assert EngineDir.open(FIXTURES / "edgellm-0.11" / "qwen3-tiny-llm").config.max_lora_rank == 0


def test_a_bad_max_lora_rank_is_refused_naming_the_key() -> None:
    raw = EngineDir.open(TOY_LORA).raw()
    raw["builder_config"]["max_lora_rank"] = -1
    with pytest.raises(ConfigError, match=r"toy: builder_config.max_lora_rank.*got -1"):
        trtio.LLMEngineConfig.from_edgellm(raw, what="toy")
    with pytest.raises(ConfigError, match="max_lora_rank"):
        lora_cfg(max_lora_rank=-2)


def test_the_toy_directorys_adapters_are_the_toy_adapters() -> None:
    cfg = lora_cfg()
    chat, terse = adapters()
    for got, want in ((chat, toy_adapter(cfg, 8, seed=1)), (terse, toy_adapter(cfg, 4, seed=2,
                                                                               modules=("q_proj", "v_proj")))):
        assert sorted(got.modules) == sorted(want.modules)  # the file's keys, as safetensors lists them
        for m in got.modules:
            for a, b in zip(got.weights[m], want.weights[m]):
                assert a.dtype == np.float16
                np.testing.assert_array_equal(a, b)
    assert (chat.name, set(chat.ranks.values()), len(chat.modules)) == ("chat", {8}, 24)
    assert (terse.name, set(terse.ranks.values()), len(terse.modules)) == ("terse", {4}, 8)


# -- the engine's LoRA inputs ---------------------------------------------------------------------------


def test_the_engines_lora_inputs_are_every_linear_of_every_layer() -> None:
    cfg = lora_cfg()
    inputs = LoraInputs.from_engine(EngineIO.from_engine(_engine(cfg, "host")), cfg.max_lora_rank)
    assert inputs is not None and inputs.max_rank == 8
    assert [(m.name, m.in_features, m.out_features) for m in inputs.modules] == \
        [(m, i, o) for m, _layer, _key, i, o in lora_modules(cfg)]
    # the worst case: every module's A and B at rank 8, FP16
    assert inputs.worst_case_bytes() == sum(2 * 8 * (i + o) for _m, _l, _k, i, o in lora_modules(cfg))
    assert LoraInputs.from_engine(EngineIO.from_engine(_engine(lora_cfg(max_lora_rank=0), "host")), 0) is None


def _fixture_engine_io(rank_max: int = 8) -> EngineIO:
    """The I/O of the real graph insert-lora wrote (tests/fixtures/edgellm-0.11/qwen3-lora), its rank dims 0..max."""
    tensors = []
    for i, (name, (io, dtype, shape)) in enumerate(parse_onnx_io(QWEN3_LORA / "onnx-io.txt").items()):
        profiles: tuple[Any, ...] = ()
        if io == "input" and name.endswith(".weight"):
            lo = tuple(0 if d < 0 else d for d in shape)
            hi = tuple(rank_max if d < 0 else d for d in shape)
            profiles = ((lo, hi, hi), (lo, hi, hi))
        tensors.append(TensorInfo(i, name, io, dtype, shape, Location.DEVICE, False, profiles))
    return EngineIO("qwen3-lora", tuple(tensors), 2)


def test_lora_inputs_named_after_graph_nodes_bind_at_rank_0_and_take_no_adapter() -> None:
    """The real insert-lora output on the 0.11 dynamo export: its inputs bind (rank 0: no adapter), and an
    adapter is refused saying why none can be matched (tests/test_parity_lora.py runs such a graph against HF)."""
    eio = _fixture_engine_io()
    assert sum(n.endswith(".lora_A.weight") for n in eio.names()) == 30  # what the real export declares
    inputs = LoraInputs.from_engine(eio, 8)
    assert inputs is not None and len(inputs.modules) == len(inputs.node_named) == 30
    assert not inputs.takes_adapters and inputs.node_named[:2] == ("ode_linear", "ode_linear_1")
    assert inputs.worst_case_bytes() == 0  # rank 0 for good
    assert {r.shape for r in inputs.requests()} == {r.shape for r in inputs.requests({"ode_linear": 8})}
    assert all(0 in r.shape for r in inputs.requests())
    adapter = LoraAdapter.from_arrays({"ode_linear": (np.ones((96, 2), np.float16), np.ones((2, 320), np.float16))},
                                      name="by-node")
    with pytest.raises(ConfigError) as info:
        inputs.check(adapter, "set_lora")
    msg = str(info.value)
    assert msg.startswith("ode_linear.lora_A.weight: set_lora: engine 'qwen3-lora' takes no LoRA adapter: 30 of its "
                          "30 LoRA modules are named after ONNX graph nodes (ode_linear, ode_linear_1, ode_linear_2, "
                          "...)")
    assert "no adapter's weights can be matched to them" in msg and "insert-lora" in msg and "/<module>/MatMul" in msg
    assert "It runs without an adapter (set_lora(None))" in msg


def test_a_reference_engine_with_node_named_lora_inputs_runs_its_base_model_and_refuses_set_lora() -> None:
    cfg = lora_cfg()
    chat, _ = adapters()
    plain = lora_cfg(max_lora_rank=0)
    with trtio.create_for_llm(_engine(plain, "host"), plain) as setup:
        base, base_toks = _run(setup, 3)
    with trtio.create_for_llm(_engine(cfg, "host", lora_naming="nodes"), cfg) as setup:
        assert setup.lora is None
        out, toks = _run(setup, 3)  # bound at rank 0: the base model
        with pytest.raises(ConfigError, match=r"ode_linear\.lora_A\.weight: set_lora: engine 'toy-llm' takes no LoRA "
                                              r"adapter: 24 of its 24 LoRA modules are named after ONNX graph nodes"):
            setup.set_lora(chat)
        setup.set_lora(None)  # nothing to set: allowed
        again, again_toks = _run(setup, 3)
        assert setup.lora is None and setup.memory_report().notes  # no adapter copy was made
    assert base_toks == toks == again_toks
    for x, y, z in zip(base, out, again):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)


@pytest.mark.parametrize("engine_rank,config_rank,needle", [
    (8, 0, "declares 48 LoRA inputs but the config's max_lora_rank is 0"),
    (0, 8, "max_lora_rank is 8 but the engine declares no LoRA input"),
    (4, 8, "profile 0 takes ranks 0 .. 4, the config needs 0 (no adapter) .. 8"),
])
def test_an_engine_and_config_that_disagree_on_lora_are_refused(engine_rank: int, config_rank: int,
                                                                 needle: str) -> None:
    eng = _engine(lora_cfg(max_lora_rank=engine_rank), "host")
    with pytest.raises(BindingError) as info:
        trtio.create_for_llm(eng, lora_cfg(max_lora_rank=config_rank))
    assert needle in str(info.value)


def test_a_spec_decode_pair_with_lora_inputs_is_refused_in_one_line() -> None:
    d = EngineDir.open(FIXTURES.parent.parent / "engines" / "toy-eagle3-ragged")
    pair = d.deployment(2, 3, 8)
    base = dataclasses.replace(pair.base, max_lora_rank=8)
    with pytest.raises(BindingError) as info:
        trtio.create_for_spec_decode(_engine(base, "host"), _engine(pair.draft, "host"),
                                     dataclasses.replace(pair, base=base))
    assert str(info.value).count("\n  - ") == 1, str(info.value)
    assert "model.layers.0.self_attn.q_proj.lora_A.weight: the engine takes LoRA adapters (48 LoRA inputs" in \
        str(info.value) and "create_for_llm binds them (LLMSetup.set_lora), this setup does not" in str(info.value)


# -- LoraAdapter ---------------------------------------------------------------------------------------


def test_load_reads_a_file_or_its_directory_and_drops_pefts_prefix(tmp_path: Path) -> None:
    a, b = np.ones((64, 2), np.float16), np.full((2, 64), 0.5, np.float16)
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": a,
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": b}, tmp_path / "x.safetensors")
    adapter = LoraAdapter.load(tmp_path / "x.safetensors")
    assert adapter.name == "x" and adapter.modules == ("model.layers.0.self_attn.q_proj",)
    np.testing.assert_array_equal(adapter.weights["model.layers.0.self_attn.q_proj"][1], b)
    by_dir = LoraAdapter.load(tmp_path)  # the directory's one file (process-lora's output folder holds one)
    assert by_dir.modules == adapter.modules and by_dir.name == tmp_path.name


@pytest.mark.parametrize("tensors,match", [
    ({"m.lora_A.weight": np.ones((4, 2), np.float16), "m.bias": np.ones(4, np.float16)}, r"m\.bias: is not a LoRA"),
    ({"m.lora_A.weight": np.ones((4, 2), np.float16)}, r"m\.lora_B\.weight: is missing"),
    ({"m.lora_A.weight": np.ones((4, 2), np.float16), "m.lora_B.weight": np.ones((3, 4), np.float16)},
     r"m: A is \[4, 2\] \(\[in, r\]\) but B is \[3, 4\]"),
])
def test_a_bad_adapter_file_is_refused_naming_the_module(tmp_path: Path, tensors: dict[str, Any],
                                                         match: str) -> None:
    save_file(tensors, tmp_path / "bad.safetensors")
    with pytest.raises((ConfigError, InvalidValueError), match=match):
        LoraAdapter.load(tmp_path / "bad.safetensors")


def test_load_refuses_what_safetensors_cannot_read_and_a_dtype_other_than_f16_naming_the_file(
        tmp_path: Path) -> None:
    import ml_dtypes

    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(ConfigError, match=r"junk\.safetensors: is not a safetensors file safetensors can read"):
        LoraAdapter.load(tmp_path / "junk.safetensors")
    with pytest.raises(ConfigError, match=r"nothing\.safetensors: does not exist"):
        LoraAdapter.load(tmp_path / "nothing.safetensors")
    bf16 = np.ones((4, 2), ml_dtypes.bfloat16)
    save_file({"m.lora_A.weight": bf16, "m.lora_B.weight": bf16.T.copy()}, tmp_path / "bf16.safetensors")
    with pytest.raises(ConfigError, match=r"bf16\.safetensors: m\.lora_[AB]\.weight: is BF16: an adapter for an "
                                          r"Edge-LLM engine is F16"):
        LoraAdapter.load(tmp_path / "bf16.safetensors")
    half, full = np.ones((4, 2), np.float16), np.ones((2, 4), np.float32)
    save_file({"m.lora_A.weight": half, "m.lora_B.weight": full}, tmp_path / "mixed.safetensors")
    with pytest.raises(ConfigError, match=r"mixed\.safetensors: m: A is F16 and B F32"):
        LoraAdapter.load(tmp_path / "mixed.safetensors")


def test_load_reads_with_the_safetensors_package_and_says_so_where_it_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    save_file({"m.lora_A.weight": np.ones((4, 2), np.float16), "m.lora_B.weight": np.ones((2, 4), np.float16)},
              tmp_path / "a.safetensors", metadata={"format": "np"})
    assert LoraAdapter.load(tmp_path / "a.safetensors").ranks == {"m": 2}
    monkeypatch.setitem(sys.modules, "safetensors", None)  # an install without it: import fails
    with pytest.raises(ConfigError, match=r"a\.safetensors: LoraAdapter.load reads adapters with the safetensors "
                                          r"package, which is not installed.*pip install safetensors"):
        LoraAdapter.load(tmp_path / "a.safetensors")


def test_an_adapter_scaled_other_than_by_alpha_over_r_is_refused_naming_the_key(tmp_path: Path) -> None:
    """``process-lora`` folds one ``lora_alpha / r`` into every module's B and copies the adapter's PEFT config beside
    the weights as ``config.json``: an adapter trained with ``use_rslora``, or whose ``rank_pattern`` /
    ``alpha_pattern`` give a module another rank or alpha, is refused naming the config file, the key and its value
    (``adapter_config.json`` is read too). Patterns that repeat r and lora_alpha load, and an engine's
    ``config.json`` beside an adapter file is not taken for the adapter's."""
    weights = (TOY_LORA / "adapters" / "terse" / "adapter_model.safetensors").read_bytes()
    peft = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "use_rslora": False,
            "rank_pattern": {}, "alpha_pattern": {}}

    def folder(name: str, config_name: str, config: dict[str, Any]) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "processed_adapter_model.safetensors").write_bytes(weights)  # process-lora's names
        (path / config_name).write_text(json.dumps(config))
        return path

    refused = {
        "rslora": ("config.json", {"use_rslora": True}, r"use_rslora: is True, expected false: .*rank-stabilized"),
        "ranks": ("adapter_config.json", {"rank_pattern": {"q_proj": 8}},
                  r"rank_pattern: is \{'q_proj': 8\}, expected no module of another rank: it gives 'q_proj' rank 8, "
                  r"not the adapter's 4"),
        "alphas": ("config.json", {"alpha_pattern": {"v_proj": 4, "q_proj": 8}},
                   r"alpha_pattern: .* it gives 'v_proj' lora_alpha 4, not the adapter's 8, but Edge-LLM's "
                   r"process-lora scales every module's B by lora_alpha / r \(8 / 4\)"),
    }
    for name, (config_name, change, match) in refused.items():
        path = folder(name, config_name, {**peft, **change})
        with pytest.raises(ConfigError, match=match) as info:
            LoraAdapter.load(path)
        assert info.value.field.startswith(str(path / config_name)), name
    _, terse = adapters()
    same = {**peft, "rank_pattern": {"q_proj": 4}, "alpha_pattern": {"v_proj": 8}, "use_rslora": None}
    for path in (folder("same", "config.json", same), folder("engine", "config.json", json.loads(
            (TOY_LORA / "config.json").read_text()))):
        loaded = LoraAdapter.load(path)
        assert loaded.ranks == terse.ranks
        for module, (a, b) in terse.weights.items():
            np.testing.assert_array_equal(loaded.weights[module][0], a)
            np.testing.assert_array_equal(loaded.weights[module][1], b)


def test_an_adapter_in_pefts_layout_is_refused_saying_so() -> None:
    a, b = np.ones((64, 8), np.float16), np.ones((8, 32), np.float16)
    with pytest.raises(InvalidValueError, match=r"LoraAdapter 'peft': m: A is \[8, 64\] \(\[in, r\]\) but B is "
                                                r"\[32, 8\].*PEFT's layout.*process-lora"):
        LoraAdapter.from_arrays({"m": (a.T, b.T)}, name="peft")


def test_adapter_arrays_are_read_only_copies_and_adapters_compare_by_identity() -> None:
    a = np.ones((64, 2), np.float16)
    weights = {"model.layers.0.self_attn.q_proj": (a, np.ones((2, 64), np.float16))}
    adapter = LoraAdapter.from_arrays(weights)
    a[:] = 7
    held = adapter.weights["model.layers.0.self_attn.q_proj"][0]
    assert (held == 1).all() and not held.flags.writeable
    with pytest.raises(TypeError):
        adapter.weights["x"] = (a, a)  # type: ignore[index]
    twin = LoraAdapter.from_arrays(weights)
    assert adapter == adapter and adapter != twin and len({adapter, twin}) == 2


# -- set_lora on the host backend (and on the GPU with -m gpu) -------------------------------------------


@pytest.mark.parametrize("graphs", [False, True])
def test_logits_with_an_adapter_equal_the_merged_weights_model(device: str, graphs: bool) -> None:
    cfg = lora_cfg()
    eng = _engine(cfg, device)
    chat, terse = adapters()
    with trtio.create_for_llm(eng, cfg, graphs=graphs) as setup:
        for adapter in (chat, terse, None, chat):
            setup.set_lora(adapter)
            assert setup.lora is adapter
            out, toks = _run(setup, 3)
            _check_against_merged(eng, cfg, adapter, out, toks)
        if graphs:
            assert setup.graph_stats.hits > 0


def test_set_lora_none_equals_an_engine_without_lora(device: str) -> None:
    chat, _ = adapters()
    plain_cfg = lora_cfg(max_lora_rank=0)
    with trtio.create_for_llm(_engine(plain_cfg, device), plain_cfg) as setup:
        base, base_toks = _run(setup, 3)
    cfg = lora_cfg()
    with trtio.create_for_llm(_engine(cfg, device), cfg) as setup:
        none, none_toks = _run(setup, 3)  # no adapter set yet: rank 0
        setup.set_lora(chat)
        with_chat, _ = _run(setup, 3)
        setup.set_lora(None)
        again, again_toks = _run(setup, 3)
    assert base_toks == none_toks == again_toks
    for x, y, z in zip(base, none, again):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
    assert np.abs(with_chat[0] - base[0]).max() > 0.5  # the adapter does change the model


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("to", ["terse", "same ranks"])
def test_switching_mid_sequence_changes_only_later_steps(device: str, graphs: bool, to: str) -> None:
    cfg = lora_cfg()
    chat, terse = adapters()
    other = terse if to == "terse" else toy_adapter(cfg, 8, seed=9, name="other")  # chat's ranks: its plan holds
    with trtio.create_for_llm(_engine(cfg, device), cfg, graphs=graphs) as setup:
        setup.set_lora(other)
        setup.set_lora(chat)
        steady, steady_toks = _run(setup, 4)
        switched, switched_toks = _run(setup, 4, switch={3: other})
    for step in range(3):  # the prefill and decode steps 1, 2 ran with chat in both runs
        np.testing.assert_array_equal(steady[step], switched[step])
    assert steady_toks[0][:len(PROMPTS[0]) + 3] == switched_toks[0][:len(PROMPTS[0]) + 3]
    for step in (3, 4):
        assert np.abs(steady[step] - switched[step]).max() > 0.1, step


def test_switching_adapters_binds_their_own_copies_with_no_device_work_and_replays_their_graphs(device: str) -> None:
    cfg = lora_cfg()
    chat, terse = adapters()
    other = toy_adapter(cfg, 8, seed=9, name="other")  # chat's ranks: graphs of its own all the same
    with trtio.create_for_llm(_engine(cfg, device), cfg, graphs=True) as setup:
        be = setup.io.backend
        for adapter in (chat, terse, other, None):  # uploaded (allocated) the first time each, its graph captured
            setup.set_lora(adapter)
            _run(setup, 2)
        # one decode graph (of this batch) per adapter and one without: other's is not chat's
        assert setup.graph_stats.captures == setup.graph_stats.graphs == 4
        emb, lens = embed_batch(E, PROMPTS, np.float16)
        setup.prefill(emb, lens)
        x = trtio.Tensor.from_numpy(E[[3, 4]][:, None, :].astype(np.float16), trtio.Location.DEVICE, backend=be)
        setup.decode(x)
        graphs, hits = setup.graph_stats.graphs, setup.graph_stats.hits
        lora = setup._features.part("lora")._slots
        assert lora is not None
        for adapter in (chat, terse, other, None, chat, other):
            allocs, syncs, ops = be.alloc_count, be.sync_count, getattr(be, "op_count", 0)
            setup.set_lora(adapter)
            assert (be.alloc_count, be.sync_count, getattr(be, "op_count", 0)) == (allocs, syncs, ops), adapter
            assert all(setup.tensor_map[n] is t for n, t in lora._bound.tensors.items())  # its own copy, bound
            setup.decode(x)
            assert (be.alloc_count, be.sync_count) == (allocs, syncs), adapter
        x.close()
        assert setup.graph_stats.graphs == graphs == 4 and setup.graph_stats.hits == hits + 6  # replays alone
        # an adapter's copy keeps its view for good: refused a reshape, in no plan's views (none set at a switch)
        q = lora._bound.tensors["model.layers.0.self_attn.q_proj.lora_A.weight"]
        with pytest.raises(trtio.FrozenError, match=r"q_proj.lora_A.weight': its view \[64, 8\] is fixed"):
            q.reshape((64, 4))
        assert not any(v[0] is q for p in setup.executor._plans.values() for v in p.all_views)
        report = setup.memory_report()
        # each adapter's copy at its own ranks: chat's q_proj A [64, 8], terse's [64, 4]; terse has no o_proj
        entries = {(e.group, e.name): e.nbytes for e in report.entries}
        q, o = "model.layers.0.self_attn.q_proj.lora_A.weight", "model.layers.0.self_attn.o_proj.lora_A.weight"
        assert entries[("lora chat", q)] == 2 * 64 * 8 and entries[("lora terse", q)] == 2 * 64 * 4
        assert entries[("lora terse", o)] == 0


@pytest.mark.parametrize("graphs", [False, True])
def test_two_adapters_of_the_same_ranks_each_give_their_own_logits(device: str, graphs: bool) -> None:
    """Graphs are kept per adapter (per binding set), not per rank pattern: a graph captured with one adapter's
    copy bound would compute the other's steps with the first one's weights."""
    cfg = lora_cfg()
    eng = _engine(cfg, device)
    chat, _ = adapters()
    twin = toy_adapter(cfg, 8, seed=9, name="twin")
    assert twin.ranks == chat.ranks
    with trtio.create_for_llm(eng, cfg, graphs=graphs) as setup:
        for adapter in (chat, twin, chat, twin):
            setup.set_lora(adapter)
            out, toks = _run(setup, 3)
            _check_against_merged(eng, cfg, adapter, out, toks)
        if graphs:
            assert setup.graph_stats.hits > 0


def test_past_the_cache_limit_an_evicted_adapters_graphs_go_first_and_it_is_captured_again(
        device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import trtio._cache
    import trtio.families.lora.adapters
    from trtio._lifetime import open_binders

    monkeypatch.setattr(trtio.families.lora.adapters, "CACHE_LIMIT", 2)
    monkeypatch.setattr(trtio._cache, "CACHE_LIMIT", 2)
    cfg = lora_cfg()
    eng = _engine(cfg, device)
    chat, terse = adapters()
    third = toy_adapter(cfg, 8, seed=5, name="third")  # chat's ranks
    with trtio.create_for_llm(eng, cfg, graphs=True) as setup:
        lora, ex = setup._features.part("lora")._slots, setup.executor
        assert lora is not None
        setup.set_lora(chat)
        _run(setup, 3)
        chat_copy = lora._uploads[id(chat)]
        chat_addresses = {t.data_ptr for t in chat_copy.tensors.values() if t.capacity}
        bound_with_chat = [k for k in ex._graphs if any(a in chat_addresses for _n, a, _s in k[0][1:])]
        assert bound_with_chat and all(ex._graphs[k] for k in bound_with_chat)
        setup.set_lora(terse)
        _run(setup, 3)
        graphs = setup.graph_stats.graphs
        setup.set_lora(third)  # evicts chat (the oldest; terse is set): its plans and graphs go, then its memory
        assert not lora.knows(chat) and lora.knows(terse) and lora.knows(third) and lora.resident == 2
        assert chat_copy.is_closed and not open_binders(chat_copy.arena)
        assert setup.graph_stats.graphs == len(ex._graphs) == graphs - len(bound_with_chat)
        assert not any(id(t) in {id(u) for u in chat_copy.tensors.values()}
                       for p in ex._plans.values() for t, _s, _n in p.all_views)
        out, toks = _run(setup, 3)
        _check_against_merged(eng, cfg, third, out, toks)
        captures = setup.graph_stats.captures
        setup.set_lora(chat)  # uploaded again (evicting terse, not third: set), its graphs captured again
        assert lora.knows(chat) and lora.knows(third) and not lora.knows(terse)
        out, toks = _run(setup, 3)
        _check_against_merged(eng, cfg, chat, out, toks)
        assert setup.graph_stats.captures > captures and setup.graph_stats.hits > 0


# -- refusals: before any work, the setup left as it was -------------------------------------------------


def _bad(cfg: trtio.LLMEngineConfig, what: str) -> LoraAdapter:
    chat = toy_adapter(cfg, 8, seed=1, name=what)
    m = "model.layers.1.self_attn.v_proj"
    weights = dict(chat.weights)
    a, b = weights[m]
    if what == "module":
        weights["model.layers.9.mlp.gate_proj"] = (a, b)
    elif what == "rank":
        weights[m] = (np.ones((64, 9), np.float16), np.ones((9, 32), np.float16))
    elif what == "dtype":
        weights[m] = (a.astype(np.float32), b)
    elif what == "shape":
        weights[m] = (np.ones((32, 8), np.float16), np.ones((8, 32), np.float16))
    return LoraAdapter.from_arrays(weights, name=what)


@pytest.mark.parametrize("what,needle", [
    ("module", "model.layers.9.mlp.gate_proj: the engine 'toy-llm' has no LoRA input for this module"),
    ("rank", "model.layers.1.self_attn.v_proj: rank 9 is above the engine's max_lora_rank 8"),
    ("dtype", "model.layers.1.self_attn.v_proj: A is float32, the engine's A input is float16"),
    ("shape", "model.layers.1.self_attn.v_proj: A [32, 8] and B [8, 32], the engine takes [64, r] and [r, 32]"),
])
def test_an_adapter_that_does_not_fit_is_refused_naming_the_module(what: str, needle: str) -> None:
    cfg = lora_cfg()
    chat, _ = adapters()
    with trtio.create_for_llm(_engine(cfg, "host"), cfg) as setup:
        setup.set_lora(chat)
        before, _ = _run(setup, 2)
        be = setup.io.backend
        allocs = be.alloc_count
        with pytest.raises(InvalidValueError) as info:
            setup.set_lora(_bad(cfg, what))
        assert needle in str(info.value) and f"set_lora: adapter {what!r}" in str(info.value)
        assert be.alloc_count == allocs and setup.lora is chat
        after, _ = _run(setup, 2)  # still chat
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)


def test_set_lora_refuses_what_is_not_an_adapter_and_an_engine_without_lora() -> None:
    cfg = lora_cfg()
    with trtio.create_for_llm(_engine(cfg, "host"), cfg) as setup:
        with pytest.raises(InvalidTypeError, match="set_lora: expected a trtio.LoraAdapter or None, got dict"):
            setup.set_lora({})  # type: ignore[arg-type]
    chat, _ = adapters()
    plain = lora_cfg(max_lora_rank=0)
    with trtio.create_for_llm(_engine(plain, "host"), plain) as setup:
        setup.set_lora(None)  # nothing to do
        with pytest.raises(ConfigError, match="set_lora: engine 'toy-llm' takes no LoRA adapter"):
            setup.set_lora(chat)


# -- trtio plan: the adapter buffers' worst case ----------------------------------------------------------


def test_plan_shows_the_adapter_buffers_worst_case() -> None:
    from trtio._tools.inspection import plan_config

    result = plan_config(QWEN3_LORA)
    entries = [e for e in result["memory"]["entries"] if e["group"] == "lora"]
    # the real graph's widths (onnx-io.txt): per layer qkv 96->320, o 192->96, gate and up 96->256, down 256->96
    per_layer = (96 + 320) + (192 + 96) + 2 * (96 + 256) + (256 + 96)
    assert len(entries) == 2 * 5 * 6
    assert sum(e["nbytes"] for e in entries) == 6 * per_layer * 8 * 2 == 168960
    assert "LoRA: 30 modules at max_lora_rank 8: one adapter's device copy holds at most 168960 bytes (every module " \
        "at the max rank" in result["text"]
    assert result["memory"]["allocated"]["device"] > 168960  # the copy's arena, planned beside the setup's


# -- trtio generate --lora --------------------------------------------------------------------------------


def test_generate_takes_an_adapter_for_a_lora_directory(capsys: pytest.CaptureFixture[str]) -> None:
    from trtio._cli import main

    texts = []
    for extra in ([], ["--lora", str(TOY_LORA / "adapters" / "chat")]):
        assert main(["generate", str(TOY_LORA), "--prompt", "hello world", "--max-new-tokens", "8",
                     "--backend", "host", *extra]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0].startswith("hello world") and texts[1].startswith("hello world")
    assert texts[0] != texts[1]  # the adapter reaches the engine


def test_generate_refuses_an_adapter_for_a_directory_without_lora() -> None:
    from trtio._tools.generate import GenerateOptions, run_generate
    from trtio.testing.toy_dirs import toy_engine_dir

    opts = GenerateOptions(path=toy_engine_dir("toy-llm-ragged"), prompt="hello", backend="host",
                           lora=TOY_LORA / "adapters" / "chat")
    with pytest.raises(ConfigError, match="set_lora: engine 'toy-llm' takes no LoRA adapter"):
        run_generate(opts)


# -- stream order (docs/architecture.md: every call in call order, whatever its stream) -----------------------


def _script(backend: Any, streams: list[Any]) -> np.ndarray:
    """set_lora calls and steps on alternating streams (a first set uploads; later ones copy on the device); every
    step's logits, copied on its own stream."""
    cfg = lora_cfg()
    setup = trtio.create_for_llm(ReferenceEngine.from_config(cfg, backend=backend), cfg, backend=backend)
    outs: list[trtio.Tensor] = []

    def keep(t: trtio.Tensor, s: Any) -> None:
        out = trtio.Tensor.empty(t.shape, t.dtype, backend=backend)
        outs.append(out.copy_from(t, s))

    emb, lens = embed_batch(E, PROMPTS, np.float16)
    plan = [("lora", "chat"), ("prefill", None), ("decode", 3), ("lora", "terse"), ("decode", 4), ("lora", None),
            ("decode", 5), ("lora", "chat"), ("decode", 6), ("lora", "terse"), ("decode", 7)]
    for i, (what, arg) in enumerate(plan):
        s = streams[i % len(streams)]
        if what == "lora":  # a fresh adapter object each time it is first set: the setup keeps what it needs
            setup.set_lora(None if arg is None else LoraAdapter.load(TOY_LORA / "adapters" / str(arg)), s)
        elif what == "prefill":
            keep(setup.prefill(emb, lens, s), s)
        else:
            keep(setup.decode(E[[int(arg), int(arg) + 1]][:, None, :].astype(np.float16), s), s)
    got = np.concatenate([o.to_numpy() for o in outs])
    setup.close()
    return got


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_set_lora_is_ordered_with_the_steps_on_other_streams(seed: int) -> None:
    from trtio._cuda.backend import get_backend
    from trtio.testing import AsyncHostBackend

    host = get_backend("host")
    want = _script(host, [trtio.Stream.default(host)])
    be = AsyncHostBackend(seed=seed)
    streams = [trtio.Stream.create(be), trtio.Stream.create(be), trtio.Stream.create(be)]
    try:
        got = _script(be, streams)
    finally:
        for s in streams:
            s.close()
    np.testing.assert_array_equal(got, want)


def test_generate_takes_one_of_the_directorys_adapters_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    from trtio._cli import main

    texts = []
    for lora in ("chat", str(TOY_LORA / "adapters" / "chat")):
        assert main(["generate", "toy-lora-ragged", "--prompt", "hello world", "--max-new-tokens", "8",
                     "--backend", "host", "--lora", lora]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1]


# -- trtio demo ---------------------------------------------------------------------------------------------


def test_the_demo_runs_the_lora_toy_and_its_adapters_switch_cleanly() -> None:
    from trtio._cuda.backend import get_backend
    from trtio._tools.lora_demo import format_lora, run_lora
    from trtio.testing.toy_dirs import default_engines_dir

    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    out = run_lora(default_engines_dir(), prompts, 6, get_backend("host"))["toy-lora-ragged"]
    assert out["ok"] and out["merged"] and out["changed"] and out["again"]
    assert out["adapters"] == {"chat": [8], "terse": [4]} and out["max_rank"] == 8
    assert out["tokens"]["chat again"] == out["tokens"]["chat"] != out["tokens"]["none"]
    assert out["graph_stats"]["hits"] > 0
    line = format_lora({"toy-lora-ragged": out})[0]
    assert "each adapter's tokens are the merged-weights model's: yes; the adapters change the tokens: yes; chat " \
        "set again after terse gives its tokens again: yes" in line


def test_a_tensor_maps_variant_takes_back_its_generation_until_something_else_is_rebound() -> None:
    """The rebinding set_lora uses (TensorMap.use_variant): a variant bound again finds its generation (the
    executor's plans of it), unless another rebinding came between; every variant binds the same, bound names."""
    from trtio._tensor_map import TensorMap
    from trtio.errors import TrtioError, UnknownNameError

    made: list[trtio.Tensor] = []

    def t(name: str) -> trtio.Tensor:
        made.append(trtio.Tensor.empty((2,), "float16", backend="host", name=name))
        return made[-1]

    tm = TensorMap("m")
    tm.set("a", t("a0"))
    tm.set("b", t("b0"))
    x, y = {"a": t("ax")}, {"a": t("ay")}
    tm.use_variant(x, "x")
    gx = tm.generation
    assert tm["a"] is x["a"]
    tm.use_variant(y, "y")
    assert tm.generation != gx and tm.get("a") is y["a"]
    tm.use_variant(x, "x")
    assert tm.generation == gx and tm["a"] is x["a"]  # nothing else rebound: x's plans hold
    tm.set("b", t("b1"))  # another rebinding: x's generation then is void ...
    moved = tm.generation
    tm.use_variant(y, "y")
    tm.use_variant(x, "x")
    assert tm.generation == moved != gx  # ... but x, bound then, keeps the new one
    tm.forget_variant("y")
    tm.use_variant(y, "y")
    assert tm.generation not in (gx, moved)
    with pytest.raises(TrtioError, match="variant 'y' is bound"):
        tm.forget_variant("y")
    with pytest.raises(TrtioError, match="variant 'z' binds other names than the variants before it"):
        tm.use_variant({"a": t("az"), "b": t("bz")}, "z")
    with pytest.raises(UnknownNameError, match="variant 'w' binds 'c', which the map does not hold"):
        TensorMap("n").use_variant({"c": t("c")}, "w")
    for tensor in made:
        tensor.close()
