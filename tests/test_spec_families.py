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
from trtio.contracts import build_registry
from trtio.edgellm import EngineDir
from trtio.families.hybrid.hybrid_config import recurrent_state_specs
from trtio.state import paged_state_specs
from trtio.testing import ReferenceEngine

FIXTURES = Path(__file__).parent / "fixtures" / "edgellm-0.11"
MTP, DFLASH = FIXTURES / "qwen35-mtp", FIXTURES / "qwen3-dflash"
GRAPHS = {MTP: ("qwen35-mtp/llm/model.onnx", "mtp_draft/model.onnx"),
          DFLASH: ("base/llm/model.onnx", "dflash_draft/model.onnx")}
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


@pytest.mark.parametrize("fixture", [MTP, DFLASH], ids=["mtp", "dflash"])
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
    (MTP, {"base": {"spec_decode_type": "jetspec"}, "draft": {"spec_decode_type": "jetspec"}}, "spec_decode_type"),
    (MTP, {"draft": {"spec_decode_type": "eagle3"}}, "spec_decode_type"),
], ids=["mtp-width", "dflash-layer", "dflash-no-layers", "jetspec", "mixed"])
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
