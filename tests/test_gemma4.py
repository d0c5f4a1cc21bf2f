"""Gemma 4 (issue 34): the config, the bindings the exporter declares, the SWA cache mode and the bounded SWA pool."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _onnx_io import parse_onnx_io

import trtio
from trtio import CapacityError, ConfigError, InvalidValueError, LLMEngineConfig, names
from trtio._contracts.ragged import registry_for
from trtio._rope import proportional_rope_parameters
from trtio._state import paged_state_specs
from trtio.families.gemma4.gemma4_config import choose_swa_mode, swa_private_pages
from trtio.families.gemma4.swa import BoundedSwaPages
from trtio.testing import ReferenceEngine

FIXTURES = Path(__file__).parent / "fixtures"
ONNX = FIXTURES / "edgellm-0.11" / "gemma4-text-onnx"  # the exporter's graph and config
BUILDER = FIXTURES / "edgellm" / "gemma4-ple-tiny" / "config.json"  # the builder's config (no ONNX)
KEQV = FIXTURES / "edgellm" / "gemma4-keqv-tiny" / "config.json"
# The host backend, and the cuda backend on an H200 (-m gpu): the toy model computed by CuPy on the device.
BACKENDS = ["host", pytest.param("cuda", marks=pytest.mark.gpu)]
COMPUTES = ["host", pytest.param("gpu", marks=pytest.mark.gpu)]


def _device(backend: str) -> str:
    """The ReferenceEngine device of ``backend`` ("gpu" for cuda: skips where no CUDA device or CuPy answers)."""
    if backend in ("cuda", "gpu"):
        from trtio._cuda.backend import cuda_available

        if not cuda_available():
            pytest.skip("no CUDA device answers here")
        pytest.importorskip("cupy")
        return "gpu"
    return "host"


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
    (lambda r: r.update(engine_role="base", spec_decode_type="eagle3",
                        builder_config=dict(r["builder_config"], max_verify_tree_size=8, spec_base=True)),
     "g.json: engine_role"),
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

def _windowed(window: int = 64, capacity: int = 1024, **builder: Any) -> LLMEngineConfig:
    raw = _raw()
    raw["sliding_window_size"] = window
    raw["builder_config"].update(max_kv_cache_capacity=capacity, max_input_len=512,
                                 max_kv_pool_pages=2 * -(-capacity // 128), **builder)
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
    pool.advance(0, 1500 + 128)  # a step of 128 tokens: one page falls behind, retired once the step is done
    assert pool.held(0) == private and len(np.flatnonzero(pool.table[0] >= 0)) == len(pool.mapped(0)) + 1
    rows = pool.rows([0])
    k = rows[0, 0][rows[0, 0] >= 0]
    assert (rows[0, 1][rows[0, 1] >= 0] == k + 3 * private).all()
    pool.release(0)  # with a page still retiring
    assert pool.free == 3 * private and (pool.table[0] == -1).all()
    pool.admit(0)
    pool.advance(0, 10)
    pool.advance(0, 300)
    pool.complete(0)
    assert set(np.flatnonzero(pool.table[0] >= 0)) == set(pool.mapped(0)) == {0, 1, 2}


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


# -- the toy Gemma 4 model on the host: bounded mode against full mode against recomputing -------------------

class _Run:
    """A host runtime of the toy Gemma 4 engine (``reference_gemma4.gemma4_forward``): per-layer pools (a
    consumer bound to its donor's, or, with ``own_pools``, the planted bug of its own), a static ``kv_page_table``
    (slot b owns pages b*M ..), and the SWA table: ``kv_page_table`` itself (full mode) or
    :class:`BoundedSwaPages`' rows over a pool of ``max_batch x private`` pages (bounded mode). Tokens are embedded
    from fixed random tables (``inputs_embeds`` and the PLE rows). ``compute``: ``"host"`` (numpy, checked),
    ``"unchecked"`` (numpy through the GPU's path: no check, bad data gives NaN) or ``"gpu"`` (CuPy, the reference
    engine's kernels: the pools on the device)."""

    def __init__(self, cfg: LLMEngineConfig, *, bounded: bool, own_pools: bool = False, compute: str = "host") -> None:
        from trtio.testing.reference_gemma4 import Gemma4Weights

        g = cfg.gemma4
        assert g is not None
        self.cfg, self.g, self.bounded, self.compute = cfg, g, bounded, compute
        self.w = Gemma4Weights.generate(cfg, 0)
        self.xp: Any = np
        self.kernels: dict[str, Any] = {}
        if compute == "gpu":
            cupy = pytest.importorskip("cupy")
            from trtio.testing.reference_gpu import _GpuMatmul, _GpuScatterRows

            self.xp = cupy
            self.w = self.w.to(cupy.asarray)
            self.kernels = {"mm": _GpuMatmul(cupy), "scatter": _GpuScatterRows(cupy)}
        rng = np.random.default_rng(7)
        self.emb = rng.standard_normal((cfg.vocab_size, cfg.hidden_size)).astype(np.float16)
        self.ple = rng.standard_normal((cfg.vocab_size, g.ple_layers * g.ple_hidden)).astype(np.float16)
        b, m, page = cfg.max_supported_batch_size, cfg.pages_per_sequence, cfg.kv_page_size
        private = g.private_pages(page)
        swa_pages = b * private if bounded else cfg.kv_pool_pages
        self.swa = BoundedSwaPages(swa_pages, b, window=g.sliding_window, page_size=page, pages_per_sequence=m,
                                   private_pages=private) if bounded else None
        self.pools: dict[str, np.ndarray] = {}
        for layer in range(g.num_layers):
            pages = swa_pages if g.is_sliding(layer) else cfg.kv_pool_pages
            shape = (2, pages, page, g.kv_heads[layer], g.head_dims[layer])
            if g.donors[layer] < 0 or own_pools:
                self.pools[names.past_key_values(layer)] = self.xp.full(shape, np.nan, np.float16)
            else:
                self.pools[names.past_key_values(layer)] = self.pools[names.past_key_values(g.donors[layer])]
        ids = np.arange(b * m).reshape(b, m)
        self.kv_rows = np.stack([ids, ids + cfg.kv_pool_pages], axis=1).astype(np.int32)
        self.lengths = np.zeros(b, np.int64)

    def admit(self, slot: int) -> None:
        self.lengths[slot] = 0
        if self.swa is not None:
            self.swa.admit(slot)

    def release(self, slot: int) -> None:
        if self.swa is not None:
            self.swa.release(slot)

    def step(self, tokens: dict[int, list[int]]) -> dict[int, np.ndarray]:
        """One step: ``tokens[slot]`` appended to each slot's sequence; each slot's last-row logits."""
        from trtio.testing.reference_gemma4 import gemma4_forward

        cfg, g = self.cfg, self.g
        slots = sorted(tokens)
        n, width = len(slots), max(len(t) for t in tokens.values())
        past = self.lengths[slots]
        ql = np.array([len(tokens[s]) for s in slots])
        ids = np.zeros((n, width), np.int64)
        for i, s in enumerate(slots):
            ids[i, :ql[i]] = tokens[s]
        positions = (past[:, None] + np.arange(width)[None, :]).reshape(-1)
        if self.swa is not None:
            for i, s in enumerate(slots):
                self.swa.advance(s, int(past[i] + ql[i]))
            swa_rows = self.swa.rows(slots)
        io: dict[str, Any] = {}
        io.update({
            names.kInputsEmbeds: self.emb[ids.reshape(-1)],
            names.kQueryLengths: ql.astype(np.int32), names.kPastLengths: past.astype(np.int32),
            names.kAttentionSequenceLengths: (past + ql).astype(np.int32),
            names.kKVPageTable: self.kv_rows[slots],
            names.kSwaKVPageTable: swa_rows if self.swa is not None else self.kv_rows[slots],
            names.kSwaKVCacheMode: np.zeros(1 if self.bounded else 0, np.int8),
            names.kRopeCosSinSliding: g.sliding_rope.rows(positions),
            names.kRopeCosSinFull: g.full_rope.rows(positions),
            names.kLogitsIndices: (np.arange(n) * width + ql - 1).astype(np.int64),
            names.kLogits: np.zeros((n, cfg.vocab_size), np.float32),
        })
        ple = self.ple[ids.reshape(-1)]
        for layer in range(g.ple_layers):
            io[names.ple_token_embeds(layer)] = ple[:, layer * g.ple_hidden:(layer + 1) * g.ple_hidden]
        if self.compute == "gpu":
            io = {k: self.xp.asarray(np.ascontiguousarray(v)) for k, v in io.items()}
        io.update(self.pools)
        gemma4_forward(cfg, self.w, io, xp=self.xp, checked=self.compute == "host", **self.kernels)
        logits = self.xp.asnumpy(io[names.kLogits]) if self.compute == "gpu" else io[names.kLogits]
        self.lengths[slots] += ql
        return {s: logits[i] for i, s in enumerate(slots)}


def _toy_gemma4(window: int = 40) -> LLMEngineConfig:
    return _windowed(window, 768, max_batch_size=2)  # 6 pages per sequence, 5 of them in the bounded pool


def _generate(run: _Run, prompts: dict[int, list[int]], steps: int, *,
              admit_at: dict[int, tuple[int, list[list[int]]]], release_at: dict[int, int]) -> dict[str, list[int]]:
    """Greedy decoding of ``prompts`` (slot -> tokens); at step ``i`` of ``admit_at`` a new sequence takes its slot
    with its prompt in chunks (one step each: the later ones are prefills over a cached prefix), at step
    ``release_at[slot]`` the slot's sequence ends. Returns each sequence's tokens."""
    out: dict[str, list[int]] = {}
    current: dict[int, str] = {}
    chunks: dict[int, list[list[int]]] = {}

    def start(slot: int, parts: list[list[int]]) -> dict[int, list[int]]:
        run.admit(slot)
        current[slot] = key = f"{slot}@{len(out)}"
        out[key] = [t for part in parts for t in part]
        chunks[slot] = parts[1:]
        return {slot: parts[0]}

    step: dict[int, list[int]] = {}
    for slot, prompt in prompts.items():
        step |= start(slot, [prompt])
    for i in range(steps):
        logits = run.step(step)
        step = {}
        for slot, row in logits.items():
            if chunks[slot]:
                step[slot] = chunks[slot].pop(0)
                continue
            token = int(np.argmax(row))
            out[current[slot]].append(token)
            step[slot] = [token]
        for slot, at in release_at.items():
            if at == i and slot in current:
                run.release(slot)
                step.pop(slot, None)
                del current[slot]
        if i in admit_at:
            slot, parts = admit_at[i]
            step |= start(slot, parts)
        if run.swa is not None:
            held = sum(run.swa.held(s) for s in current)
            assert held + run.swa.free == run.swa.pool_pages, "the SWA pool never grows past its budget"
            assert all(run.swa.held(s) == run.swa.private_pages for s in current)
    return out


def _story(run: _Run) -> dict[str, list[int]]:
    """Window 40, pages of 128: slot 0 decodes across two page boundaries; slot 1 comes in with a prompt of 130
    then 120 tokens (the second chunk crosses a page and retires one in a multi-token step, and its first rows
    are never stored); slot 0's sequence ends and a new one takes its slot and pages."""
    rng = np.random.default_rng(3)
    p0, p1a, p1b, p2 = (rng.integers(2, 1000, n).tolist() for n in (120, 130, 120, 130))
    return _generate(run, {0: p0}, 150, admit_at={5: (1, [p1a, p1b]), 101: (0, [p2])}, release_at={0: 100})


@pytest.mark.parametrize("compute", ["host", pytest.param("unchecked", marks=pytest.mark.slow), *COMPUTES[1:]])
def test_bounded_mode_equals_full_mode_token_for_token_over_more_than_three_windows(compute: str) -> None:
    """The toy model on numpy (checked, and unchecked: the GPU's path; slow here, every step attends over every
    slot of a page-table row) and on CuPy (-m gpu)."""
    _device(compute)
    cfg = _toy_gemma4()
    assert choose_swa_mode(cfg, 2, engine_mode_max=1, engine_swa_pages=(1, 16)).bounded
    full, bounded = _story(_Run(cfg, bounded=False, compute=compute)), _story(_Run(cfg, bounded=True, compute=compute))
    assert len(full) == 3 and min(len(t) for t in full.values()) > 3 * 40
    assert full == bounded


@pytest.mark.parametrize("compute", COMPUTES)
def test_incremental_steps_equal_recomputing_each_sequence_and_a_consumer_bound_to_its_own_pool_fails(
        compute: str) -> None:
    """Decoding from the cache (full and bounded) gives the logits of a prefill of the whole sequence, which reads
    no cache: the KV-sharing consumers read their donors' entries."""
    _device(compute)
    cfg = _toy_gemma4()
    rng = np.random.default_rng(5)
    prompt = rng.integers(2, 1000, 100).tolist()
    for bounded, own_pools in ((False, False), (True, False), (False, True)):
        run = _Run(cfg, bounded=bounded, own_pools=own_pools, compute=compute)
        run.admit(0)
        seq = list(prompt)
        logits = run.step({0: prompt})[0]
        for _ in range(60):
            seq.append(int(np.argmax(logits)))
            logits = run.step({0: [seq[-1]]})[0]
        fresh = _Run(cfg, bounded=False, compute=compute)
        fresh.admit(0)
        want = fresh.step({0: seq})[0]
        if own_pools:
            assert not np.allclose(logits, want, atol=1e-2), "a consumer bound to its own pool reads no donor entry"
        else:
            np.testing.assert_allclose(logits, want, atol=1e-2, rtol=1e-2)


def test_the_gpus_unchecked_step_equals_the_checked_one_and_a_bad_page_gives_nan_and_writes_nothing() -> None:
    """The path the GPU runs (no host check: numpy here, CuPy there) gives the checked step's logits; a sequence whose
    page table leaves a page it reads unmapped computes NaN and writes no K/V, the other sequence is unchanged."""
    raw = _raw()
    raw["sliding_window_size"] = 40
    raw["builder_config"].update(max_kv_cache_capacity=256, max_input_len=256, max_kv_pool_pages=4, max_batch_size=2)
    cfg = LLMEngineConfig.from_edgellm(raw, what="g.json")  # 2 pages per sequence (full SWA mode)
    rng = np.random.default_rng(8)
    prompts = {0: rng.integers(2, 1000, 150).tolist(), 1: rng.integers(2, 1000, 30).tolist()}
    runs = [_Run(cfg, bounded=False), _Run(cfg, bounded=False, compute="unchecked")]
    for run in runs:
        for slot in prompts:
            run.admit(slot)
    first = [run.step(prompts) for run in runs]
    for slot in prompts:
        np.testing.assert_allclose(first[1][slot], first[0][slot], rtol=1e-4, atol=1e-4)
    run = runs[1]
    run.kv_rows[0, :, 0] = -1  # sequence 0's first page (it writes on its second): unmapped
    before = {k: v.copy() for k, v in run.pools.items()}
    logits = run.step({0: [5], 1: [6]})
    want = runs[0].step({0: [5], 1: [6]})
    assert np.isnan(logits[0]).all()
    np.testing.assert_allclose(logits[1], want[1], rtol=1e-4, atol=1e-4)
    page = int(run.kv_rows[1, 0, 0])
    for name, pool in run.pools.items():  # sequence 0 wrote nothing; sequence 1 its row (slot 30 of its first page)
        now, old = pool.copy(), before[name].copy()
        assert not np.isnan(now[0, page, 30]).any() and np.isnan(old[0, page, 30]).all()
        now[:, page, 30] = old[:, page, 30] = 0
        np.testing.assert_array_equal(now, old)
    runs[0].kv_rows[0, :, 0] = -1
    with pytest.raises(InvalidValueError, match="kv_page_table: layer 2 reads slot 0 of sequence 0"):
        runs[0].step({0: [5], 1: [6]})


def test_ple_rows_reach_their_layers() -> None:
    cfg = _toy_gemma4()
    run, other = _Run(cfg, bounded=False), _Run(cfg, bounded=False)
    other.ple = other.ple.copy()
    other.ple[5, 16:32] += 1  # layer 1's columns of token 5
    for r in (run, other):
        r.admit(0)
    assert not np.allclose(run.step({0: [5, 6]})[0], other.step({0: [5, 6]})[0])


# -- the setup on the host backend -------------------------------------------------------------------------

def _setup_tokens(cfg: LLMEngineConfig, graphs: bool, prompts: dict[int, list[int]], steps: int,
                  release_at: dict[int, int] | None = None, backend: str = "host") -> dict[int, list[int]]:
    """Greedy tokens of ``prompts`` (slot -> tokens) through the setup, ``steps`` decodes."""
    import trtio
    from trtio.testing import ReferenceEngine

    emb_run = _Run(cfg, bounded=False)  # its embedding tables
    engine = ReferenceEngine.from_config(cfg, device=_device(backend))
    out = {slot: list(p) for slot, p in prompts.items()}
    with trtio.create_for_llm(engine, cfg, backend=backend, graphs=graphs) as setup:
        for slot, p in prompts.items():
            ids = np.array([p])
            logits = setup.prefill(emb_run.emb[ids], [len(p)], slots=[slot], ple_embeds=emb_run.ple[ids])
            out[slot].append(int(np.argmax(logits.to_numpy()[0])))
        active = set(prompts)
        for i in range(steps):
            for slot, at in (release_at or {}).items():
                if at == i:
                    setup.release([slot])
                    active.discard(slot)
            slots = sorted(active)
            ids = np.array([[out[s][-1]] for s in slots])
            logits = setup.decode(emb_run.emb[ids], slots=slots, ple_embeds=emb_run.ple[ids]).to_numpy()
            for row, slot in enumerate(slots):
                out[slot].append(int(np.argmax(logits[row])))
    return out


def _setup_story(cfg: LLMEngineConfig, graphs: bool, backend: str = "host"
                 ) -> tuple[dict[str, list[int]], list[tuple[int, int]], int]:
    """The setup's greedy tokens for :func:`_story`'s requests (one prompt in one prefill each, a release and an
    admission on the way), the bounded SWA pool's (free, held) pages after every step (empty in full mode), and how
    many decodes ran the last checked decode's plan (every active sequence decodes: ``slots=None``)."""
    import trtio
    from trtio.testing import ReferenceEngine

    emb_run = _Run(cfg, bounded=False)
    rng = np.random.default_rng(3)
    p0, p1, p2 = (rng.integers(2, 1000, n).tolist() for n in (120, 250, 130))
    out: dict[str, list[int]] = {}
    live: dict[int, str] = {}
    pool: list[tuple[int, int]] = []
    planned = 0
    with trtio.create_for_llm(ReferenceEngine.from_config(cfg, device=_device(backend)), cfg, backend=backend,
                              graphs=graphs) as setup:
        checked = setup._decode_checked  # a decode that does not run the last plan checks in full

        def counted(*args: Any) -> Any:
            nonlocal planned
            planned -= 1
            return checked(*args)
        setup._decode_checked = counted  # type: ignore[method-assign]

        def admit(key: str, slot: int, prompt: list[int]) -> None:
            ids = np.array([prompt])
            logits = setup.prefill(emb_run.emb[ids], [len(prompt)], slots=[slot], ple_embeds=emb_run.ple[ids])
            out[key] = list(prompt) + [int(np.argmax(logits.to_numpy()[0]))]
            live[slot] = key

        admit("a", 0, p0)
        for i in range(150):
            if i == 5:
                admit("b", 1, p1)
            if i == 100:
                setup.release([0])
                del live[0]
            if i == 101:
                admit("c", 0, p2)
            slots = sorted(live)  # every active sequence, ascending: what decode() without slots= takes
            ids = np.array([[out[live[s]][-1]] for s in slots])
            planned += 1
            logits = setup.decode(emb_run.emb[ids], ple_embeds=emb_run.ple[ids]).to_numpy()
            for row, slot in enumerate(slots):
                out[live[slot]].append(int(np.argmax(logits[row])))
            pages = setup.state.kv_parts.get("swa_pages")
            if pages is not None:
                pool.append((pages.free, sum(pages.held(s) for s in live)))
    return out, pool, planned


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("graphs", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "graphs"])
def test_the_setup_in_bounded_swa_mode_equals_full_mode_token_for_token(graphs: bool, backend: str) -> None:
    """Window 40, pages of 128: sequences of 3 to 7 windows in a changing batch (an admission mid-way, a release
    and a new sequence in the freed slot) give the same tokens with the bounded SWA pool (10 pages: 2 x 5) as
    with full SWA storage; the bounded pool never holds more than its pages, each sequence its 5. (Graphs on: slow
    here, about 8 s of CPU on the host backend; -m gpu runs it on the device.)"""
    bounded_cfg = _toy_gemma4()
    full_cfg = _windowed(40, 768, max_batch_size=2, num_swa_pages=3)  # below 2 x 5 pages: full mode is forced
    bounded, pool, planned = _setup_story(bounded_cfg, graphs, backend)
    full, none, full_planned = _setup_story(full_cfg, graphs, backend)
    assert not none and pool
    assert min(len(t) for t in full.values()) > 3 * 40
    assert bounded == full
    # Steady decodes run their plan (no per-step check) in both modes; in bounded mode a plan lasts until a window
    # gains or retires a page (here every few steps: pages of 128 tokens, a window of 40).
    assert full_planned > 100 and planned > 50, (full_planned, planned)
    assert all(free + held == 10 and held == 5 * (held // 5) for free, held in pool)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_the_setup_binds_gemma4_and_decodes_as_the_toy_model(graphs: bool, backend: str) -> None:
    """create_for_llm on the toy Gemma 4 engine (full SWA mode: per-layer pools, consumers on their donors'
    pools, dual RoPE gathered per token, PLE staged per step) decodes what the toy model decodes."""
    cfg = _toy_gemma4()
    rng = np.random.default_rng(11)
    prompts = {0: rng.integers(2, 1000, 70).tolist(), 1: rng.integers(2, 1000, 30).tolist()}
    got = _setup_tokens(cfg, graphs, prompts, 40, backend=backend)
    run = _Run(cfg, bounded=False, compute=_device(backend))  # the same kernels: the same rounding
    want: dict[int, list[int]] = {}
    for slot, p in prompts.items():
        run.admit(slot)
        want[slot] = list(p) + [int(np.argmax(run.step({slot: p})[slot]))]
    for _ in range(40):
        logits = run.step({slot: [toks[-1]] for slot, toks in want.items()})
        for slot, row in logits.items():
            want[slot].append(int(np.argmax(row)))
    assert got == want


def test_ple_embeds_are_required_where_the_engine_has_ple_inputs_and_refused_elsewhere() -> None:
    import trtio
    from trtio.testing import ReferenceEngine

    cfg = _toy_gemma4()
    x = np.zeros((1, 4, cfg.hidden_size), np.float16)
    with trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg, backend="host") as setup:
        with pytest.raises(trtio.ShapeError, match=r"ple_embeds: required by the engine's ple_token_embeds_0 \.\. 5"):
            setup.prefill(x, [4])
        with pytest.raises(trtio.ShapeError, match=r"ple_embeds: expected \[batch, seq, 96\] = \[1, 4, 96\]"):
            setup.prefill(x, [4], ple_embeds=np.zeros((1, 4, 95), np.float16))
    keqv = LLMEngineConfig.from_edgellm(KEQV)
    with trtio.create_for_llm(ReferenceEngine.from_config(keqv, device="host", null_compute=True), keqv,
                              backend="host") as setup:
        with pytest.raises(trtio.ShapeError, match="ple_embeds: given, but the engine has no per-layer embedding"):
            setup.prefill(np.zeros((1, 4, keqv.hidden_size), np.float16), [4],
                          ple_embeds=np.zeros((1, 4, 8), np.float16))


# -- a toy Gemma 4 directory and its token embeddings on the device ---------------------------------------

def _toy_dir(tmp: Path) -> Path:
    """A Gemma 4 engine directory of the toy config: config.json, embedding.safetensors, ple_embedding.safetensors
    (the tables of :class:`_Run`)."""
    from _safetensors import write_safetensors

    raw = _raw()
    raw["sliding_window_size"] = 40
    raw["builder_config"].update(max_kv_cache_capacity=768, max_input_len=512, max_kv_pool_pages=12)
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(raw))
    run = _Run(LLMEngineConfig.from_edgellm(tmp / "config.json"), bounded=False)
    write_safetensors(tmp / "embedding.safetensors", {"embedding": run.emb})
    write_safetensors(tmp / "ple_embedding.safetensors", {"weight": run.ple})
    return tmp


@pytest.mark.parametrize("backend", BACKENDS)
def test_ple_rows_gathered_on_the_device_equal_the_table_rows(tmp_path: Path, backend: str) -> None:
    from trtio.edgellm import EngineDir
    from trtio.testing import AsyncHostBackend

    directory = EngineDir.open(_toy_dir(tmp_path / "toy-gemma4"))
    table, ple = directory.embedding_table(), directory.ple_embedding_table()
    assert ple is not None and ple.shape == (1000, 96)
    _device(backend)
    for be in ((backend, AsyncHostBackend(seed=1)) if backend == "host" else (backend,)):
        with directory.embeddings(be) as emb:
            ids = np.array([[5, 999, 0], [7, 7, 3]])
            got = emb.embed(ids)
            assert isinstance(got, tuple)
            x, p = got
            np.testing.assert_array_equal(x.to_numpy(), table[ids])
            np.testing.assert_array_equal(p.to_numpy(), ple[ids])
            with pytest.raises(trtio.ShapeError, match="id 1000 is outside the 1000 rows"):
                emb.embed(np.array([[1, 1000]]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_token_ids_on_the_device_gather_the_table_rows_without_a_host_read(tmp_path: Path, backend: str) -> None:
    """EngineDir.embeddings() (default bound: max batch x max input) takes int32 ids already on the device (a
    greedy loop's argmax) and gathers the same rows as host ids; other device dtypes and too many ids are refused
    before anything is enqueued, and an id outside the table raises from the enqueued gather on the host backend."""
    from trtio._tensor import Tensor
    from trtio.edgellm import EngineDir

    directory = EngineDir.open(_toy_dir(tmp_path / "toy-gemma4"))
    table, ple = directory.embedding_table(), directory.ple_embedding_table()
    assert ple is not None
    cfg = directory.config
    ids = np.array([[5, 999, 0], [7, 7, 3]])
    _device(backend)
    with directory.embeddings(backend) as emb:
        assert emb.max_tokens == cfg.max_supported_batch_size * cfg.max_supported_input_length
        on_device = Tensor.from_numpy(ids.astype(np.int32), backend=backend)
        x, p = emb.embed(on_device)  # type: ignore[misc]
        np.testing.assert_array_equal(x.to_numpy(), table[ids])
        np.testing.assert_array_equal(p.to_numpy(), ple[ids])
        with pytest.raises(trtio.ShapeError, match=r"token_ids: ids on the device must be int32 \[batch, seq\], got "
                                                   r"int64 \[2, 3\]"):
            emb.embed(Tensor.from_numpy(ids, backend=backend))
        with pytest.raises(trtio.ShapeError, match="more than max_tokens"):
            emb.embed(Tensor.from_numpy(np.zeros((1, emb.max_tokens + 1), np.int32), backend=backend))
        if backend == "host":  # the cuda backend gathers no row for it (checking would synchronise the host)
            with pytest.raises(InvalidValueError, match="source row 1000 at index 1 is outside the 1000 rows"):
                emb.embed(Tensor.from_numpy(np.array([[1, 1000]], np.int32), backend=backend))


def test_a_ple_table_of_the_wrong_width_is_refused_naming_the_file(tmp_path: Path) -> None:
    from _safetensors import write_safetensors

    from trtio.edgellm import EngineDir

    d = _toy_dir(tmp_path / "toy-gemma4")
    write_safetensors(d / "ple_embedding.safetensors", {"weight": np.zeros((1000, 95), np.float16)})
    with pytest.raises(ConfigError, match=r"ple_embedding.safetensors: weight: expected \[vocab, 96\]"):
        EngineDir.open(d).ple_embedding_table()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_a_toy_gemma4_directory_runs_from_token_ids_on_the_device(tmp_path: Path, graphs: bool, backend: str) -> None:
    """The directory's tables gathered by TokenEmbeddings feed the setup's steps (inputs_embeds and ple_embeds as
    device tensors; the steady decodes run their plan, the PLE split inside it); the tokens are the toy model's,
    with a release and an admission on the way."""
    from trtio.edgellm import EngineDir
    from trtio.testing import ReferenceEngine

    directory = EngineDir.open(_toy_dir(tmp_path / "toy-gemma4"))
    cfg = directory.config
    rng = np.random.default_rng(2)
    prompts = [rng.integers(2, 1000, n).tolist() for n in (60, 25, 45)]
    got: dict[str, list[int]] = {}
    with directory.embeddings(backend) as emb, \
            trtio.create_for_llm(ReferenceEngine.from_config(cfg, device=_device(backend)), cfg, backend=backend,
                                 graphs=graphs) as setup:
        def admit(key: str, slot: int, prompt: list[int]) -> None:
            x, p = emb.embed(np.array([prompt]))  # type: ignore[misc]
            got[key] = list(prompt) + [int(np.argmax(setup.prefill(x, [len(prompt)], slots=[slot],
                                                                    ple_embeds=p).to_numpy()[0]))]

        admit("a", 0, prompts[0])
        admit("b", 1, prompts[1])
        live = {0: "a", 1: "b"}
        for i in range(30):
            if i == 12:
                setup.release([0])
                admit("c", 0, prompts[2])
                live[0] = "c"
            slots = sorted(live)
            x, p = emb.embed(np.array([[got[live[s]][-1]] for s in slots]))  # type: ignore[misc]
            logits = setup.decode(x, ple_embeds=p).to_numpy()  # every active sequence: a steady one runs its plan
            for row, slot in enumerate(slots):
                got[live[slot]].append(int(np.argmax(logits[row])))
    run = _Run(cfg, bounded=False, compute=_device(backend))  # the same kernels: the same rounding
    want: dict[str, list[int]] = {}
    for key, slot, prompt, steps in (("a", 0, prompts[0], 12), ("b", 1, prompts[1], 30), ("c", 0, prompts[2], 18)):
        run.admit(slot)
        seq = list(prompt)
        logits = run.step({slot: prompt})[slot]
        for _ in range(steps):
            seq.append(int(np.argmax(logits)))
            logits = run.step({slot: [seq[-1]]})[slot]
        want[key] = seq + [int(np.argmax(logits))]
    assert got == want


def test_plan_shows_each_layers_pool_the_shared_ones_and_the_swa_mode_with_its_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtio._cli import main

    assert main(["plan", str(_toy_dir(tmp_path / "toy-gemma4"))]) == 0
    out = capsys.readouterr().out
    assert "past_key_values_2: full, [2,12,128,1,64] float16" in out
    assert "past_key_values_4: sliding, [2,10,128,1,32] = past_key_values_3's pool (KV sharing)" in out
    assert "SWA mode: bounded SWA pool (10 pages, 5 per sequence): window 40 tokens" in out
    assert "864.00 KiB in all" in out  # 4 pools allocated, not 6; the sliding ones of 10 pages
    # kv_page_table's pages are the full layers' pool's (12), not the first (sliding, bounded) layer's 10
    assert "the pool's 12 pages hold 2 such sequences, with 2 slots: 2 fit" in out
    fixture = tmp_path / "fixture"
    fixture.mkdir()
    (fixture / "config.json").write_text((ONNX / "config.json").read_text())
    assert main(["plan", str(fixture)]) == 0
    assert "the config writes no sliding window" in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["host", "kernels", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_steps_ple_and_dual_rope_inputs_hold_each_tokens_rows(tmp_path: Path, backend: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """What the engine reads (a null-compute engine: trtio's side only, on either backend, and with trtio's CUDA
    kernels built for the CPU: tests/_host_kernels.py): after a prefill and a decode fed by TokenEmbeddings on the
    device, ple_token_embeds_i holds columns i * 16 .. of each token's PLE row, and the sliding / full RoPE inputs
    each token's row of its own table at its position."""
    from _host_kernels import kernels_on_host

    from trtio.edgellm import EngineDir
    from trtio.testing import ReferenceEngine

    if backend == "cuda":
        from trtio._cuda.backend import cuda_available

        if not cuda_available():
            pytest.skip("no CUDA device answers here")
    on: Any = kernels_on_host(monkeypatch) if backend == "kernels" else backend
    directory = EngineDir.open(_toy_dir(tmp_path / "toy-gemma4"))
    cfg, ple = directory.config, directory.ple_embedding_table()
    g = cfg.gemma4
    assert g is not None and ple is not None
    engine = ReferenceEngine.from_config(cfg, device="gpu" if backend == "cuda" else "host", null_compute=True)
    ids = np.array([[11, 12, 13, 14, 15]])
    with directory.embeddings(on) as emb, \
            trtio.create_for_llm(engine, cfg, backend=on) as setup:
        for step, (tokens, positions) in enumerate(((ids, np.arange(5)), (np.array([[42]]), np.array([5])))):
            x, p = emb.embed(tokens)  # type: ignore[misc]
            if step == 0:
                setup.prefill(x, [5], ple_embeds=p)
            else:
                setup.decode(x, ple_embeds=p)
            n = tokens.size
            for i in range(g.ple_layers):
                got = setup.io.member(names.ple_token_embeds(i)).to_numpy().reshape(-1, 16)[:n]
                np.testing.assert_array_equal(got, ple[tokens.reshape(-1), i * 16:(i + 1) * 16])
            sliding = setup.io.member("ragged_rope_cos_sin").to_numpy().reshape(-1, 32)[:n]
            full = setup.io.member("ragged_rope_cos_sin_full").to_numpy().reshape(-1, 64)[:n]
            np.testing.assert_allclose(sliding, g.sliding_rope.rows(positions), rtol=1e-6)
            np.testing.assert_allclose(full, g.full_rope.rows(positions), rtol=1e-6)


def test_pin_prefix_is_refused_in_bounded_swa_mode() -> None:
    from trtio.testing import ReferenceEngine

    cfg = _toy_gemma4()
    run = _Run(cfg, bounded=False)
    with trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg, backend="host") as setup:
        mode = setup.state.kv_parts.get("swa_mode")
        assert mode is not None and mode.bounded
        ids = np.array([[3, 4, 5]])
        setup.prefill(run.emb[ids], [3], slots=[0], ple_embeds=run.ple[ids])
        with pytest.raises(InvalidValueError, match="pin_prefix: engine 'llm' keeps only a sliding window"):
            setup.pin_prefix(0, 3)


def test_a_step_over_cached_tokens_is_refused_where_the_export_gives_kv_sharing_layers_q_only() -> None:
    """Edge-LLM 0.11's AttentionPlugin rotates a Q-only KV-sharing layer's queries with RoPE row past + i of the
    step's table (launchApplyRopeQOnly with kvCacheEndLens; tests/test_parity_gemma4.py shows it on the real
    graph): chunked prefill and a prefix continued are refused, naming the layers; a first prefill runs."""
    from trtio.families.gemma4.gemma4_config import q_only_consumers
    from trtio.testing import ReferenceEngine

    cfg = _toy_gemma4()
    g = cfg.gemma4
    assert g is not None and g.donors == (-1, -1, -1, -1, 3, 2)
    assert q_only_consumers(g, swa_inputs=True) == (5,) and q_only_consumers(g, swa_inputs=False) == (4, 5)
    run = _Run(cfg, bounded=False)
    with trtio.create_for_llm(ReferenceEngine.from_config(cfg, device="host"), cfg, backend="host") as setup:
        ids = np.array([[3, 4, 5]])
        setup.prefill(run.emb[ids], [3], slots=[0], ple_embeds=run.ple[ids])
        with pytest.raises(InvalidValueError, match=r"KV-sharing layers \[5\] \(Q only\) with RoPE row past \+ i"):
            setup.prefill(run.emb[ids], [3], slots=[0], past_lengths=[3], ple_embeds=run.ple[ids])
        setup.decode(run.emb[ids[:, :1]], ple_embeds=run.ple[ids[:, :1]])  # the sequence goes on


def test_generate_runs_a_gemma4_directory_with_its_ple_table(tmp_path: Path) -> None:
    """``trtio generate`` gathers a Gemma 4 directory's embedding and PLE rows on the device for every step (the
    steps refuse a missing ple_embeds, so the run reaching its token limit shows they are passed)."""
    import io
    import shutil

    from trtio._tools.generate import GenerateOptions, run_generate
    from trtio.testing.toy_dirs import ASSETS_DIR, default_engines_dir

    d = _toy_dir(tmp_path / "toy-gemma4")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_engines_dir() / ASSETS_DIR / name, d / name)
    stats = run_generate(GenerateOptions(path=d, prompt="hello world", max_new_tokens=12, backend="host"),
                         out=io.StringIO(), err=io.StringIO())
    assert stats["tokens"] == 12


def test_the_bench_config_is_a_gemma4_model_of_the_dense_ones_size() -> None:
    from trtio._tools.bench import configs, gemma4_config

    llm, _ = configs("ragged", 1024)
    cfg = gemma4_config(llm)
    g = cfg.gemma4
    assert g is not None and g.num_layers == 36 and g.kinds.count("full") == 6
    assert len(g.owners) == 24 and all(g.kinds[g.owner(i)] == g.kinds[i] for i in range(36))
    assert cfg.hidden_size == llm.hidden_size and g.head_dims[5] == 2 * llm.head_dim



# -- the shipped toy directory ------------------------------------------------------------------------------

@pytest.mark.parametrize("backend,array", [("host", "numpy"), pytest.param("cuda", "torch", marks=pytest.mark.gpu),
                                           pytest.param("cuda", "cupy", marks=pytest.mark.gpu)])
def test_the_shipped_toy_gemma4_directory_runs_in_the_examples_as_the_toy_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str, array: str) -> None:
    """engines/toy-gemma4-ragged has all five features (sliding 1 x 16 and full 1 x 32 pools, a bounded SWA pool,
    two RoPE tables, layers 4 and 5 on their donors' pools, PLE) and, run by examples/generate.py (its tables
    gathered by EngineDir.embeddings on the device, PLE rows included; on the GPU from the argmax's ids on the
    device), gives the greedy tokens of the runtime of the toy model in full SWA mode fed the directory's tables."""
    import os
    import re
    import subprocess
    import sys

    from trtio._cli import main
    from trtio.edgellm import EngineDir
    from trtio.testing.toy_dirs import toy_engine_dir

    device = _device(backend)
    if array == "torch":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("torch has no CUDA here")
    path = toy_engine_dir("toy-gemma4-ragged")
    d = EngineDir.open(path)
    cfg, g = d.config, d.config.gemma4
    assert g is not None and g.has_ple and g.sliding_window == 16
    assert set(g.kinds) == {"sliding", "full"} and len(set(g.head_dims)) == 2 and any(x >= 0 for x in g.donors)
    assert g.sliding_rope != g.full_rope
    assert main(["plan", str(path)]) == 0
    assert "SWA mode: bounded SWA pool (20 pages, 5 per sequence)" in capsys.readouterr().out
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "examples" / "generate.py"), str(path), "--max-new-tokens", "12",
                           "--backend", backend, "--array", array], capture_output=True, text=True, cwd=tmp_path,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    got = [[int(t) for t in m.group(1).split(", ")] for m in re.finditer(r"^tokens \d+: \[([\d, ]+)\]$",
                                                                          proc.stdout, re.M)]
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    prompts = [tok.encode(p).ids for p in ("Once upon a time", "The quick brown fox jumps over the lazy dog.")]
    run = _Run(cfg, bounded=False, compute=device)  # on the GPU: the same kernels, the same rounding
    run.emb, run.ple = np.asarray(d.embedding_table()), np.asarray(d.ple_embedding_table())
    want = []
    for slot, prompt in enumerate(prompts):
        run.admit(slot)
        logits = run.step({slot: prompt})[slot]
        row = []
        for _ in range(12):
            row.append(int(np.argmax(logits)))
            logits = run.step({slot: [row[-1]]})[slot]
        want.append(row)
    assert got == want


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_the_demo_decodes_the_toy_gemma4_directory_alike_in_bounded_and_full_swa_mode(graphs: bool,
                                                                                    backend: str) -> None:
    """trtio demo's Gemma 4 section: two of the demo's prompts, 160 new tokens each (ten windows and past a page: the
    bounded windows rotate and retire pages), the same tokens in bounded and in full SWA mode."""
    from trtio._cuda.backend import get_backend
    from trtio._tools.demo import demo_prompts
    from trtio._tools.gemma4_demo import GEMMA4_DIR, format_gemma4, run_gemma4
    from trtio.testing.toy_dirs import default_engines_dir

    _device(backend)
    out = run_gemma4(default_engines_dir(), demo_prompts(512, 0)[:2], 160, get_backend(backend),
                     graphs=graphs)[GEMMA4_DIR]
    assert out["swa_mode"].startswith("bounded SWA pool (20 pages") and out["full_mode"].startswith("full SWA")
    assert out["new_tokens"] == 160 and len(out["tokens"]) == 2 and all(len(t) == 160 for t in out["tokens"])
    assert out["ok"], out
    assert "bounded SWA equals full SWA over 160 tokens: yes" in format_gemma4({GEMMA4_DIR: out})[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_a_steady_decode_splits_its_device_ple_rows_inside_its_plan_and_another_source_is_checked(
        graphs: bool, backend: str) -> None:
    """A decode fed device PLE rows makes their split into the layers' inputs part of its plan's work (replayed in
    the decode's graph): the steady decodes after it, fed the same tensor with new rows each step, run the plan
    (no check) and the engine reads each step's rows; a decode fed another tensor, or host rows, is checked and
    reads its own rows."""
    from trtio._tensor import Tensor
    from trtio.testing import ReferenceEngine

    cfg = _windowed(40, 768, max_batch_size=2, num_swa_pages=3)  # full SWA mode: no window moves a page
    g = cfg.gemma4
    assert g is not None
    rng = np.random.default_rng(4)
    width = g.ple_layers * g.ple_hidden
    engine = ReferenceEngine.from_config(cfg, device=_device(backend), null_compute=True)
    with trtio.create_for_llm(engine, cfg, backend=backend, graphs=graphs) as setup:
        checked = setup._decode_checked
        count = 0

        def counted(*args: Any) -> Any:
            nonlocal count
            count += 1
            return checked(*args)
        setup._decode_checked = counted  # type: ignore[method-assign]
        prompt = np.zeros((2, 5, cfg.hidden_size), np.float16)
        setup.prefill(prompt, [5, 3], ple_embeds=np.zeros((2, 5, width), np.float16))
        x = Tensor.from_numpy(np.zeros((2, 1, cfg.hidden_size), np.float16), backend=backend)
        a = Tensor.from_numpy(np.zeros((2, 1, width), np.float16), backend=backend)
        b = Tensor.from_numpy(np.zeros((2, 1, width), np.float16), backend=backend)
        sources = [a, a, a, b, b, a, "host", "host", a]
        for source in sources:
            rows = rng.standard_normal((2, 1, width)).astype(np.float16)
            if isinstance(source, Tensor):
                source.copy_from(rows)
                setup.decode(x, ple_embeds=source)
            else:
                setup.decode(x, ple_embeds=rows)
            for i in range(g.ple_layers):
                got = setup.io.member(names.ple_token_embeds(i)).to_numpy().reshape(-1, g.ple_hidden)[:2]
                np.testing.assert_array_equal(got, rows.reshape(2, width)[:, i * g.ple_hidden:(i + 1) * g.ple_hidden])
        # checked: the first decode, b, a again, the first host rows, a again; the others ran their plan
        assert count == 5, count
        for t in (x, a, b):
            t.close()
