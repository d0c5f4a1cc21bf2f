"""The ragged contract's registries against files NVIDIA's Edge-LLM 0.11 exporter wrote.

``tests/fixtures/edgellm-0.11/onnx-io/*.txt`` lists each graph's inputs and outputs (name, dtype, shape,
with symbolic dims as quoted names) and ``profiles.json`` the builder's two optimization profiles for a
tiny Qwen3 LLM, an EAGLE3 base and its draft (batch 4, input 64, KV 128, trees of 8). trtio's registry
(every binding but the KV state) and the paged KV state's declaration together must equal them: every
name, dtype, rank, which dims are dynamic, and each profile's min / opt / max.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from _onnx_io import parse_onnx_io

import trtio
from trtio import ConfigError, DType, InvalidTypeError, LLMEngineConfig, names
from trtio._contracts import build_registry, contract_of
from trtio._state import paged_state_specs

FIXTURES = Path(__file__).parent / "fixtures" / "edgellm-0.11"
GRAPHS = {  # role -> (onnx-io file, config file)
    "llm": ("qwen3-tiny-llm.txt", "qwen3-tiny-llm/config.json"),
    "base": ("qwen3-tiny-eagle3-base.txt", "qwen3-tiny-eagle3/base_config.json"),
    "draft": ("qwen3-tiny-eagle3-draft.txt", "qwen3-tiny-eagle3/draft_config.json"),
}
def declared(role: str):
    cfg = LLMEngineConfig.from_edgellm(FIXTURES / GRAPHS[role][1])
    specs = [s for s in build_registry(cfg)] + paged_state_specs(cfg)
    return cfg, {s.name: s for s in specs}


@pytest.mark.parametrize("role", sorted(GRAPHS))
def test_registry_and_state_equal_the_exporters_graph_io(role: str) -> None:
    graph = parse_onnx_io(FIXTURES / "onnx-io" / GRAPHS[role][0])
    cfg, specs = declared(role)
    assert cfg.role == role and cfg.contract == "ragged"
    optional_extras = {n for n, s in specs.items() if s.optional and n not in graph}
    assert optional_extras <= {names.kSkipSoftmaxScale}, "only inputs real engines may lack are left out"
    assert set(specs) - optional_extras == set(graph)
    for name, (io, dtype, shape) in graph.items():
        s = specs[name]
        assert (s.io, s.dtype, s.engine_shape) == (io, dtype, shape), name


@pytest.mark.parametrize("role", sorted(GRAPHS))
def test_registry_profiles_equal_the_builders(role: str) -> None:
    profiles = json.loads((FIXTURES / "profiles.json").read_text())[role]
    _, specs = declared(role)
    for name, want in profiles.items():
        got = specs[name].profiles
        assert len(got) == 2, name
        for p in (0, 1):
            assert [list(x) for x in got[p]] == want[f"profile{p}"], f"{name} profile {p}"
    inputs = {n for n, s in specs.items() if s.is_input and not s.optional}
    assert inputs <= set(profiles), "every required input has profiles in the fixture"


def test_the_fixture_parser_reads_every_line() -> None:
    graph = parse_onnx_io(FIXTURES / "onnx-io" / "qwen3-tiny-eagle3-base.txt")
    assert len(graph) == 25 + 10
    assert graph["kv_page_table"] == ("input", DType.INT32, (-1, 2, -1))
    assert graph["hidden_states"] == ("output", DType.FLOAT16, (-1, 192))


def test_contract_of_tells_the_contracts_apart() -> None:
    from _configs import llm_config

    from trtio.testing import ReferenceEngine

    assert contract_of(ReferenceEngine.from_config(llm_config(), device="host", null_compute=True)) == "batch"


def test_contract_of_checks_the_type_instead_of_guessing() -> None:
    """An object that happens to have ``names`` and ``tensors`` attributes is not read as an EngineIO."""

    class Lookalike:
        names = ("query_start_offsets",)
        tensors = ()

    with pytest.raises(InvalidTypeError, match="contract_of: expected a TensorRT engine .* got Lookalike"):
        contract_of(Lookalike())


def test_contracts_are_objects_chosen_by_name() -> None:
    from trtio._contracts import CONTRACTS, contract_named

    assert CONTRACTS == ("batch", "ragged")
    assert [contract_named(n).name for n in CONTRACTS] == list(CONTRACTS)
    assert contract_named(None) is contract_named("batch")
    assert contract_named("ragged").kv_layout == "paged" and contract_named("batch").kv_layout == "contiguous"
    with pytest.raises(ConfigError, match=r"contract: must be one of \('batch', 'ragged'\), got 'paged'"):
        contract_named("paged")


SETUP_CODE = [Path(trtio.__file__).parent / "_pipeline_io.py", *sorted((Path(trtio.__file__).parent / "_setups")
                                                                      .glob("*.py"))]


@pytest.mark.parametrize("path", SETUP_CODE, ids=lambda p: p.name)
def test_setups_and_pipeline_io_never_compare_contract_names(path: Path) -> None:
    """What differs between contracts is the contract object's to do: no comparison with a contract's name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(isinstance(side, ast.Constant) and side.value in ("batch", "ragged", "paged", "contiguous")
                        for side in sides)
            if named and any("contract" in ast.unparse(side) or "layout" in ast.unparse(side) for side in sides):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, f"contract names compared at {found}"
