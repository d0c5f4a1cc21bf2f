"""Gemma 4 (issue 34): the config, the bindings the exporter declares, the SWA cache mode and the bounded SWA pool."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _onnx_io import parse_onnx_io

from trtio import CapacityError, ConfigError, InvalidValueError, LLMEngineConfig, names
from trtio.contracts.ragged import registry_for
from trtio.gemma4 import BoundedSwaPages, choose_swa_mode
from trtio.gemma4_config import swa_private_pages
from trtio.rope import proportional_rope_parameters
from trtio.state import paged_state_specs
from trtio.testing import ReferenceEngine

FIXTURES = Path(__file__).parent / "fixtures"
ONNX = FIXTURES / "edgellm-0.11" / "gemma4-text-onnx"  # the exporter's graph and config
BUILDER = FIXTURES / "edgellm" / "gemma4-ple-tiny" / "config.json"  # the builder's config (no ONNX)
KEQV = FIXTURES / "edgellm" / "gemma4-keqv-tiny" / "config.json"


def _raw(path: Path = ONNX / "config.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


# -- config ------------------------------------------------------------------------------------------------

def test_the_exporters_config_reads_every_gemma4_fact() -> None:
    cfg = LLMEngineConfig.from_edgellm(ONNX / "config.json")
    g = cfg.gemma4
    assert g is not None
    assert g.kinds == ("sliding", "sliding", "full", "sliding", "sliding", "full")
    assert g.head_dims == (32, 32, 64, 32, 32, 64) and g.kv_heads == (1,) * 6
    assert g.donors == (-1, -1, -1, -1, 3, 2) and g.owners == (0, 1, 2, 3)
    assert [g.owner(i) for i in range(6)] == [0, 1, 2, 3, 3, 2]
    assert (g.ple_layers, g.ple_hidden) == (6, 16)
    assert (g.sliding_rope.rope_type, g.sliding_rope.theta, g.sliding_rope.width) == ("default", 1e4, 32)
    assert (g.full_rope.rope_type, g.full_rope.theta, g.full_rope.width) == ("proportional", 1e6, 64)
    assert g.sliding_window == 0, "this config writes no window"
    assert not {"global_head_dim", "kv_sharing_donors", "sliding_rope_config", "ple_enabled"} & set(cfg.extras)
    assert LLMEngineConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("path", [BUILDER, KEQV], ids=["builder-ple", "builder-keqv"])
def test_configs_the_builder_wrote_open_too(path: Path) -> None:
    cfg = LLMEngineConfig.from_edgellm(path)
    g = cfg.gemma4
    assert g is not None and g.kinds == ("sliding", "full", "sliding", "full")
    if path == KEQV:
        assert g.kv_heads == (2, 1, 2, 1) and not g.has_ple and g.owners == (0, 1, 2, 3)
    else:
        assert g.donors == (-1, -1, 0, 1) and g.ple_layers == 4


def test_the_window_is_read_from_where_the_config_writes_it() -> None:
    raw = _raw()
    raw["sliding_window_size"] = 64
    assert LLMEngineConfig.from_edgellm(raw, what="g.json").gemma4.sliding_window == 64  # type: ignore[union-attr]
    raw = _raw()
    for i in (0, 1, 3, 4):
        raw["kv_layer_configs"][i]["kv_cache_capacity"] = 64
    assert LLMEngineConfig.from_edgellm(raw, what="g.json").gemma4.sliding_window == 64  # type: ignore[union-attr]
    raw["sliding_window_size"] = 32
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_edgellm(raw, what="g.json")
    assert "the sliding window is ambiguous" in str(info.value)


@pytest.mark.parametrize("edit,key", [
    (lambda r: r["kv_sharing_donors"].__setitem__(4, 2), "g.json: kv_sharing_donors[4]"),  # sliding reads a full
    (lambda r: r["kv_sharing_donors"].__setitem__(4, 5), "g.json: kv_sharing_donors[4]"),  # a later layer
    (lambda r: r.update(kv_sharing_donors=[-1, -1, -1, -1, 3, 4]), "g.json: kv_sharing_donors[5]"),
    (lambda r: r.update(num_ple_inputs=5), "g.json: num_ple_inputs"),
    (lambda r: r.pop("full_rope_config"), "g.json: full_rope_config"),
    (lambda r: r["full_rope_config"]["rope_scaling"].update(beta_fast=4), "g.json: full_rope_config.rope_scaling"
                                                                          ".beta_fast"),
    (lambda r: r.update(rope_theta=5.0), "g.json: rope_theta"),
    (lambda r: r["kv_layer_configs"][1].update(head_dim=48), "g.json: kv_layer_configs[1].head_dim"),
    (lambda r: r.update(attention_k_eq_v=True), "g.json: attention_k_eq_v"),
    (lambda r: r.update(global_head_dim=32), "g.json: global_head_dim"),
    (lambda r: r.update(attention_layer_types=["sliding_attention"] * 5), "g.json: attention_layer_types"),
])
def test_gemma4_keys_that_do_not_fit_are_refused_naming_the_key(edit: Any, key: str) -> None:
    raw = copy.deepcopy(_raw())
    edit(raw)
    with pytest.raises(ConfigError) as info:
        LLMEngineConfig.from_edgellm(raw, what="g.json")
    assert info.value.field == key


def test_gemma4_markers_on_another_model_are_still_refused() -> None:
    raw = _raw()
    raw["model"] = "qwen3"
    with pytest.raises(ConfigError, match="does not support yet"):
        LLMEngineConfig.from_edgellm(raw, what="q.json")


def test_proportional_rope_rotates_the_first_quarter_over_the_whole_head() -> None:
    inv = proportional_rope_parameters(64, 1e6, 0.25)
    assert inv.shape == (32,)
    np.testing.assert_allclose(inv[:8], 1e6 ** (-np.arange(8) * 2 / 64))
    assert not inv[8:].any()
    cfg = LLMEngineConfig.from_edgellm(ONNX / "config.json")
    rows = cfg.gemma4.full_rope.rows(np.array([0, 5]))  # type: ignore[union-attr]
    assert rows.shape == (2, 64)
    np.testing.assert_allclose(rows[1, 8:32], 1.0)  # cos of the unrotated dims
    np.testing.assert_allclose(rows[1, 40:], 0.0)  # their sin


# -- bindings ----------------------------------------------------------------------------------------------

def test_the_registry_names_every_binding_the_exporter_wrote_for_gemma4() -> None:
    """Names, dtypes, ranks (which dims are dynamic) and direction of the exported graph, in its order."""
    graph = parse_onnx_io(ONNX / "onnx-io.txt")
    assert len(graph) == 27 + 7
    cfg = LLMEngineConfig.from_edgellm(ONNX / "config.json")
    specs = {s.name: s for s in [*registry_for(cfg), *paged_state_specs(cfg)]}
    assert {n for n in specs if n not in graph} == {names.kSkipSoftmaxScale}
    for name, (io, dtype, shape) in graph.items():
        s = specs[name]
        assert (s.io, s.dtype, s.engine_shape) == (io, dtype, shape), name
    engine = ReferenceEngine.from_config(cfg, device="host", null_compute=True)
    declared = [(d.name, "input" if d.is_input else "output", d.dtype, d.shape) for d in engine._decls]
    assert declared == [(n, io, dt, sh) for n, (io, dt, sh) in graph.items()], "in the exporter's order"


# -- the SWA cache mode ------------------------------------------------------------------------------------

def _windowed(window: int = 64, **builder: Any) -> LLMEngineConfig:
    raw = _raw()
    raw["sliding_window_size"] = window
    raw["builder_config"].update(max_kv_cache_capacity=1024, max_input_len=512, max_kv_pool_pages=16, **builder)
    return LLMEngineConfig.from_edgellm(raw, what="g.json")


def test_bounded_mode_where_the_engine_and_config_allow_it_and_the_reason_when_not() -> None:
    cfg = _windowed()
    assert swa_private_pages(64, 128) == 5
    mode = choose_swa_mode(cfg, 2, engine_mode_max=1, engine_swa_pages=(1, 16))
    assert mode.bounded and mode.pool_pages == 10 and mode.mode_length == 1
    for kwargs, why in [(dict(engine_mode_max=0), "built without a bounded SWA pool"),
                        (dict(prefix_reuse=True), "prefix reuse"), (dict(spec_decode=True), "speculative"),
                        (dict(engine_swa_pages=(12, 16)), "not the bounded budget")]:
        args: dict[str, Any] = dict(engine_mode_max=1, engine_swa_pages=(1, 16)) | kwargs
        mode = choose_swa_mode(cfg, 2, **args)
        assert not mode.bounded and mode.pool_pages == 16 and mode.mode_length == 0 and why in mode.reason
    unknown = LLMEngineConfig.from_edgellm(ONNX / "config.json")
    mode = choose_swa_mode(unknown, 2, engine_mode_max=1, engine_swa_pages=(1, 6))
    assert not mode.bounded and "writes no sliding window" in mode.describe()
    small = _windowed(window=384)  # 2 x 9 pages are not below the 16 of the full pool
    assert "is not below the full pool" in choose_swa_mode(small, 2, engine_mode_max=1,
                                                           engine_swa_pages=(1, 16)).reason


# -- the bounded SWA pool ----------------------------------------------------------------------------------

def test_a_windows_pages_rotate_and_retire_and_the_pool_never_grows() -> None:
    window, page = 200, 128
    private = swa_private_pages(window, page)
    pool = BoundedSwaPages(3 * private, 3, window=window, page_size=page, pages_per_sequence=16,
                           private_pages=private)
    pool.admit(0)
    pool.advance(0, 300)  # a prefill: pages 0..2, all inside [100, 300)
    assert sorted(pool.mapped(0)) == [0, 1, 2]
    for length in range(301, 1500):
        pool.advance(0, length)
        begin = max(0, length - window) // page
        assert sorted(pool.mapped(0)) == list(range(begin, -(-length // page)))
        assert pool.held(0) == private and pool.free == 2 * private
        row = pool.table[0]
        assert set(np.flatnonzero(row >= 0)) <= set(range(begin - 1, -(-length // page)))
    pool.complete(0)
    assert set(np.flatnonzero(pool.table[0] >= 0)) == set(pool.mapped(0))
    rows = pool.rows([0])
    k = rows[0, 0][rows[0, 0] >= 0]
    assert (rows[0, 1][rows[0, 1] >= 0] == k + 3 * private).all()
    pool.release(0)
    assert pool.free == 3 * private and (pool.table[0] == -1).all()


def test_a_pool_short_of_every_slots_pages_and_bad_admissions_are_refused() -> None:
    with pytest.raises(CapacityError, match="9 pages cannot reserve 2 sequences x 5 pages"):
        BoundedSwaPages(9, 2, window=64, page_size=128, pages_per_sequence=8, private_pages=5)
    pool = BoundedSwaPages(10, 2, window=64, page_size=128, pages_per_sequence=8, private_pages=5)
    pool.admit(0)
    with pytest.raises(InvalidValueError, match="slot 0 is already admitted"):
        pool.admit(0)
    with pytest.raises(InvalidValueError, match="slot 2 is outside"):
        pool.admit(2)
    pool.advance(0, 10)
    with pytest.raises(InvalidValueError, match="cannot move back from 10 to 5 tokens"):
        pool.advance(0, 5)
    with pytest.raises(CapacityError, match="past the 8 pages of a page-table row"):
        pool.advance(0, 8 * 128 + 1)
    assert pool.free == 5 and pool.held(0) == 5
