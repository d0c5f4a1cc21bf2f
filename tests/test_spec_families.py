"""Speculative families beyond EAGLE3 (``trtio.families.spec.spec_config``): the MTP and DFlash pairs Edge-LLM 0.11
exported (``tests/fixtures/edgellm-0.11/qwen35-mtp`` and ``qwen3-dflash``: configs and graph I/O as its tools wrote
them) are read, every binding of both graphs is declared with its dtype and shape, and the pairs trtio cannot run are
refused before anything is allocated, naming the key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_contracts import parse_onnx_io

import trtio
from trtio import ConfigError, LLMEngineConfig, names
from trtio._contracts import build_registry
from trtio._state import paged_state_specs
from trtio.edgellm import EngineDir
from trtio.families.hybrid.hybrid_config import recurrent_state_specs
from trtio.testing import ReferenceEngine

FIXTURES = Path(__file__).parent / "fixtures" / "edgellm-0.11"
MTP, DFLASH, JETSPEC = FIXTURES / "qwen35-mtp", FIXTURES / "qwen3-dflash", FIXTURES / "qwen3-jetspec"
DSPARK = FIXTURES / "qwen3-dspark"
GRAPHS = {MTP: ("qwen35-mtp/llm/model.onnx", "mtp_draft/model.onnx"),
          DFLASH: ("base/llm/model.onnx", "dflash_draft/model.onnx"),
          JETSPEC: ("base/llm/model.onnx", "jetspec_draft/model.onnx"),
          DSPARK: ("base/llm/model.onnx", "dspark_draft/model.onnx")}
# Inputs trtio declares optional (a graph may lack them): what the exported graphs may leave out.
OPTIONAL = {names.kSkipSoftmaxScale, names.kTreeParentIds, names.kTreeDepths, names.kValidTreeCounts}


def pair_dir(tmp_path: Path, fixture: Path, **changes: dict[str, Any]) -> Path:
    """The fixture's two configs in an engine directory of Edge-LLM's layout, with ``changes`` per role."""
    out = tmp_path / fixture.name
    out.mkdir()
    for role in ("base", "draft"):
        data = json.loads((fixture / f"{role}_config.json").read_text())
        data.update(changes.get(role, {}))
        (out / f"{role}_config.json").write_text(json.dumps(data))
    return out


def declared(cfg: LLMEngineConfig) -> dict[str, Any]:
    specs = [*build_registry(cfg, "ragged"), *paged_state_specs(cfg), *recurrent_state_specs(cfg)]
    return {s.name: s for s in specs}


@pytest.mark.parametrize("fixture", [MTP, DFLASH, JETSPEC, DSPARK], ids=["mtp", "dflash", "jetspec", "dspark"])
def test_the_registries_name_every_binding_of_both_exported_graphs(tmp_path: Path, fixture: Path) -> None:
    """Base and draft: every input and output of the exported graph with its direction, dtype and shape (dynamic
    dims -1), and nothing else but optional inputs."""
    directory = EngineDir.open(pair_dir(tmp_path, fixture))
    for cfg, graph_name in zip((directory.base_config, directory.draft_config), GRAPHS[fixture]):
        graph = parse_onnx_io(fixture / "onnx-io.txt", graph_name)
        specs = declared(cfg)
        assert {n for n in graph if n not in specs} == set(), f"{cfg.role}: every exported binding is declared"
        extra = {n for n in specs if n not in graph}
        assert extra <= OPTIONAL and all(specs[n].optional for n in extra), f"{cfg.role}: {extra}"
        for name, (io, dtype, shape) in graph.items():
            s = specs[name]
            assert (s.io, s.dtype, s.engine_shape) == (io, dtype, shape), f"{cfg.role}: {name}"
        # the ReferenceEngine of the config (trtio plan / inspect on a directory without engines) declares them too
        engine = ReferenceEngine.from_config(cfg, device="host", null_compute=True)
        declared_io = {d.name: ("input" if d.is_input else "output", d.dtype, d.shape) for d in engine._decls}
        assert {n: v for n, v in declared_io.items() if n not in OPTIONAL} == \
            {n: v for n, v in graph.items() if n not in OPTIONAL}, cfg.role


def test_the_mtp_base_keeps_per_token_states_and_feeds_its_last_layer(tmp_path: Path) -> None:
    directory = EngineDir.open(pair_dir(tmp_path, MTP))
    base, draft = directory.base_config, directory.draft_config
    specs = declared(base)
    assert specs["hidden_states"].engine_shape == (-1, base.hidden_size), "MTP: the last layer only, not 3 x H"
    assert specs["intermediate_recurrent_state_5"].engine_shape == (-1, 8, 16, 16)
    assert "intermediate_conv_state_0" not in declared(draft)
    assert draft.base_model_hidden_size == base.hidden_size and draft.num_attention_layers == 1


def test_a_dflash_base_concatenates_the_drafts_target_layers(tmp_path: Path) -> None:
    directory = EngineDir.open(pair_dir(tmp_path, DFLASH))
    assert directory.base_config.eagle_hidden_state_layers == (1, 3, 4)
    reference = ReferenceEngine.from_config(directory.base_config, device="host", null_compute=True)
    assert reference.get_tensor_shape("hidden_states")[-1] == 3 * 96


@pytest.mark.parametrize("fixture, changes, field", [
    (MTP, {"draft": {"base_model_hidden_size": 384}}, "base_model_hidden_size"),
    (DFLASH, {"draft": {"dflash_config": {"target_layer_ids": [1, 3, 9]}}}, "dflash_config.target_layer_ids"),
    (DFLASH, {"draft": {"dflash_config": {"block_size": 8}}}, "dflash_config.target_layer_ids"),
    (MTP, {"base": {"spec_decode_type": "medusa"}, "draft": {"spec_decode_type": "medusa"}},
     "spec_decode_type"),
    (MTP, {"draft": {"spec_decode_type": "eagle3"}}, "spec_decode_type"),
    (DSPARK, {"draft": {"dspark_config": {"block_size": 4}}}, "dspark_config.target_layer_ids"),
], ids=["mtp-width", "dflash-layer", "dflash-no-layers", "unread-type", "mixed", "dspark-no-layers"])
def test_a_pair_that_does_not_fit_is_refused_naming_the_key(tmp_path: Path, fixture: Path,
                                                           changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        EngineDir.open(pair_dir(tmp_path, fixture, **changes))
    assert field in str(info.value)


def _create(directory: EngineDir) -> None:
    bundle = directory.deployment(1, 2, 3)
    assert bundle.draft is not None
    engines = [ReferenceEngine.from_config(c, device="host", null_compute=True) for c in (bundle.base, bundle.draft)]
    trtio.create_for_spec_decode(*engines, bundle)


@pytest.mark.parametrize("fixture, changes, field, words", [
    (MTP, {"base": {"recurrent_spec_verify_mode": "replay", "recurrent_state_dtype": "fp16"}},
     "recurrent_spec_verify_mode", "'replay'"),
    # a Mamba2 DDTree base leaves a dA/u/B/dt stash trtio does not replay
    (MTP, {"base": {"recurrent_spec_verify_mode": None, "recurrent_state_dtype": "fp16", "mtp_tree_base": True}},
     "mtp_tree_base", "mamba2"),
    # a Gated DeltaNet DDTree base's stash holds its key heads, which conv_dim gives (2 x 4 x 16 + 8 x 16 = 256)
    (MTP, {"base": {"mtp_tree_base": True, "conv_dim": 250}}, "conv_dim", "key heads"),
], ids=["hybrid-replay", "mamba2-tree-base", "gdn-tree-base-conv-dim"])
def test_pairs_trtio_cannot_run_are_refused_at_setup(tmp_path: Path, fixture: Path, changes: dict[str, Any],
                                                     field: str, words: str) -> None:
    directory = EngineDir.open(pair_dir(tmp_path, fixture, **changes))
    with pytest.raises(ConfigError) as info:
        _create(directory)
    assert info.value.field == field and words in str(info.value)


def test_the_toy_mtp_directory_is_complete(tmp_path: Path) -> None:
    """toy-mtp-ragged opens as an MTP pair wherever the toy directories are laid out."""
    from trtio.testing.toy_dirs import toy_engine_dir  # noqa: PLC0415

    path = toy_engine_dir("toy-mtp-ragged")
    copy = tmp_path / "toy"
    shutil.copytree(path, copy, symlinks=False)
    directory = EngineDir.open(copy)
    assert directory.kind == "spec_decode" and directory.base_config.extras["spec_decode_type"] == "mtp"


def test_the_exported_mtp_pair_on_its_hybrid_base_binds(tmp_path: Path) -> None:
    """qwen35-mtp's pair ("snapshot" mode) binds: the base's intermediate states are allocated for its longest step
    and listed in the memory report."""
    directory = EngineDir.open(pair_dir(tmp_path, MTP))
    bundle = directory.deployment(1, 3, 4)
    assert bundle.draft is not None
    engines = [ReferenceEngine.from_config(c, device="host", null_compute=True) for c in (bundle.base, bundle.draft)]
    with trtio.create_for_spec_decode(*engines, bundle) as setup:
        text = str(setup.memory_report())
    assert "intermediate_recurrent_state_5" in text and "192x8x16x16" in text  # 2 sequences x 96 prompt tokens


@pytest.mark.parametrize("value", [False, True])
def test_mtp_tree_base_is_read_onto_the_base_config(tmp_path: Path, value: bool) -> None:
    """``mtp_tree_base`` (a hybrid base whose verify runs each node from its parent's states) becomes the config's
    ``mtp_tree_base``, not an extra: the setup lets such a base verify trees (tests/test_spec_mtp.py)."""
    directory = EngineDir.open(pair_dir(tmp_path, MTP, base={"mtp_tree_base": value}))
    assert directory.base_config.mtp_tree_base is value
    assert "mtp_tree_base" not in directory.base_config.extras


def test_an_mtp_tree_base_that_is_not_a_bool_is_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mtp_tree_base.*expected true or false"):
        EngineDir.open(pair_dir(tmp_path, MTP, base={"mtp_tree_base": "yes"})).base_config


# -- JetSpec (a causal DFlash) and DSpark -------------------------------------------------------------------------


def test_a_jetspec_pair_is_read_as_a_causal_block_draft_on_a_dflash_base(tmp_path: Path) -> None:
    """qwen3-jetspec as Edge-LLM's tools wrote it: the base concatenates ``jetspec_config.target_layer_ids``, the
    draft is a block draft of ``jetspec_config.block_size`` rows whose block is causal."""
    from trtio.families.spec.dflash_bindings import block_size, mask_token  # noqa: PLC0415
    from trtio.families.spec.spec_config import SpecConfig  # noqa: PLC0415

    directory = EngineDir.open(pair_dir(tmp_path, JETSPEC))
    base, draft = directory.base_config, directory.draft_config
    assert base.eagle_hidden_state_layers == (1, 3, 4) and declared(base)["hidden_states"].engine_shape == (-1, 288)
    spec = draft.feature(SpecConfig)
    assert spec is not None and spec.is_block_draft and not spec.is_dflash_draft
    assert spec.block_family is not None and spec.block_family.causal
    assert (block_size(draft.extras, 8), mask_token(draft.extras)) == (8, 999)
    assert base.jetspec_tree_base is False and "jetspec_tree_base" not in base.extras


def test_a_jetspec_draft_reads_the_checkpoints_dflash_config_where_it_has_no_jetspec_config(tmp_path: Path) -> None:
    """Edge-LLM's exporter and runtime read a JetSpec checkpoint's ``dflash_config`` (the public checkpoint's)."""
    raw = json.loads((JETSPEC / "draft_config.json").read_text())
    section = dict(raw["jetspec_config"], target_layer_ids=[0, 2, 5])
    directory = EngineDir.open(pair_dir(tmp_path, JETSPEC, draft={"jetspec_config": None,
                                                                  "dflash_config": section}))
    assert directory.base_config.eagle_hidden_state_layers == (0, 2, 5)


@pytest.mark.parametrize("role", ["base", "draft"])
@pytest.mark.parametrize("value", [False, None])
def test_a_jetspec_pair_without_causal_head_in_both_configs_is_refused_naming_the_key(tmp_path: Path, role: str,
                                                                                     value: bool | None) -> None:
    """``makeCachedBlockDraftRuntimeConfig``: "JetSpec requires causal proposal attention in both base and draft
    configs"; a bidirectional block is DFlash's, not what the draft was trained for."""
    raw = json.loads((JETSPEC / f"{role}_config.json").read_text())
    section = dict(raw["jetspec_config"], causal_head=value)
    with pytest.raises(ConfigError) as info:
        EngineDir.open(pair_dir(tmp_path, JETSPEC, **{role: {"jetspec_config": section}}))
    assert info.value.field == f"{role}_config.json: jetspec_config.causal_head"


def test_a_dspark_pair_is_read_and_refused_at_setup_naming_the_heads_trtio_does_not_apply(tmp_path: Path) -> None:
    """DSpark's runtime biases each draft step with the Markov head and sizes the verify with the confidence head
    (sidecar files); trtio has no step for them: the pair (whose graphs' bindings are declared, above) is refused at
    create_for_spec_decode, before anything is allocated, rather than drafted from unbiased logits."""
    directory = EngineDir.open(pair_dir(tmp_path, DSPARK))
    assert directory.base_config.eagle_hidden_state_layers == (1, 3, 4)
    assert declared(directory.draft_config)["dspark_hidden_states"].engine_shape == (-1, 64)
    with pytest.raises(ConfigError) as info:
        _create(directory)
    assert info.value.field == "spec_decode_type"
    assert "'dspark' pairs" in str(info.value) and "Markov head" in str(info.value)
    assert "dspark_heads.safetensors" in str(info.value)


def test_the_jetspec_pair_on_doubles_of_its_exported_io_binds_and_steps(tmp_path: Path) -> None:
    """A strict double of each exported graph (its declared I/O equals the graph's: the registry test above) binds
    through create_for_spec_decode and runs a JetSpec round: base prefill, the draft's block over the prompt's delta,
    a verify of the root and the block's guesses, accept, the draft's block over the accepted path."""
    import numpy as np  # noqa: PLC0415

    directory = EngineDir.open(pair_dir(tmp_path, JETSPEC))
    bundle = directory.deployment(1, 7, 8)
    assert bundle.draft is not None
    engines = [ReferenceEngine.from_config(c, device="host", null_compute=True) for c in (bundle.base, bundle.draft)]
    for engine, graph_name in zip(engines, GRAPHS[JETSPEC]):
        graph = parse_onnx_io(JETSPEC / "onnx-io.txt", graph_name)
        io = {d.name: ("input" if d.is_input else "output", d.dtype, d.shape) for d in engine._decls}
        assert io == graph, graph_name
    h = bundle.base.hidden_size
    x = np.zeros((2, 5, h), np.float16)
    block = np.zeros((2, 8, h), np.float16)
    with trtio.create_for_spec_decode(*engines, bundle) as setup:
        setup.base_prefill(x, [5, 3])
        assert setup.draft_prefill(block, [5, 3]).shape == (2 * 8, 1000)
        setup.verify(np.zeros((2, 8, h), np.float16), list(range(-1, 7)))
        setup.accept([[0, 1, 2], [0]])
        assert setup.draft_accept(block, [3, 1]).shape == (2 * 8, 1000)
