"""Real-graph parity of Phi-4-multimodal's LLM (DESIGN §17): NVIDIA's exported graph of a tiny ``phi4_multimodal``
checkpoint (LongRoPE, partial rotary 0.75: 24 of a 32-wide head rotated), driven by trtio, equals Hugging Face's fp32
forward scenario by scenario; the long factors in place of the short ones, or the rotary frequencies of the whole
head, fail the check.

The case's KV capacity is its ``original_max_position_embeddings`` (256): the largest capacity trtio accepts for
LongRoPE, where Edge-LLM's static table (``cpp/runtime/state/ropeCache.cpp``: short factors) and HF's per-forward
switch (short up to ``original``) are the same model (``docs/edgellm-assumptions.md`` 5.2). A capacity past it is
refused: there Edge-LLM's runtime rotates every position with the long factors and HF a short sequence with the
short ones. The case ``phi4mm-switch`` (the switch at 64 tokens, inside the capacity) shows it on the real graph with
the refusal lifted: Edge-LLM's table equals HF past the switch (worst 0.051) and misses it within (1.26).

The case ``phi4mm-image`` holds HF's whole model on a prompt with one image to the graph fed trtio's splice
(:func:`trtio.components.visual.phi4mm.splice`'s parts) of the encoder's rows, HF's own tower standing in for the
visual graph (which cannot be exported on a CPU).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import trtio
from tests._parity import TEXT_SCENARIOS, Case, Compare, ParityMismatch, llm_setup, planted, run
from trtio._rope import RopeScaling, rope_cos_sin_table
from trtio.components.visual import phi4mm as P
from trtio.errors import ConfigError

NAME = "phi4mm"
Hook = Callable[[dict[str, np.ndarray]], None]

RUNS = [pytest.param("host", False, id="host"),
        pytest.param("cuda", False, marks=pytest.mark.gpu, id="cuda"),
        pytest.param("cuda", True, marks=pytest.mark.gpu, id="cuda-graphs")]


@pytest.mark.parametrize(("backend", "graphs"), RUNS)
@pytest.mark.parametrize("scenario", list(TEXT_SCENARIOS))
def test_equals_hugging_face(scenario: str, backend: str, graphs: bool) -> None:
    cmp = run(Case(NAME), scenario, backend=backend, graphs=graphs)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


def _raw() -> dict[str, Any]:
    return dict(Case(NAME).engine().config)


def _config(raw: dict[str, Any] | None = None) -> trtio.LLMEngineConfig:
    return trtio.LLMEngineConfig.from_edgellm(raw if raw is not None else _raw(), what=f"{NAME}/llm/config.json")


def _table(cfg: trtio.LLMEngineConfig, scaling: RopeScaling | None, rotary_dim: int | None = None) -> np.ndarray:
    return rope_cos_sin_table(cfg.max_kv_cache_capacity, rotary_dim or cfg.rotary_dim, cfg.rope_theta,
                              scaling=scaling, max_position_embeddings=cfg.max_position_embeddings)[0]


def test_the_config_is_read_as_hugging_face_reads_it() -> None:
    """Rotary 24 of 32 (partial 0.75), 12 factors each, the switch at 256 = the KV capacity, and HF's attention factor
    sqrt(1 + ln(1024 / 256) / ln 256) on every row of trtio's table."""
    cfg = _config()
    s = cfg.rope_scaling
    assert s is not None and s.rope_type == "longrope"
    assert cfg.rotary_dim == 24 and len(s.short_factor or ()) == 12 and len(s.long_factor or ()) == 12
    assert s.original_max_position_embeddings == cfg.max_kv_cache_capacity == 256
    table = _table(cfg, s)
    norms = np.hypot(table[:, :12], table[:, 12:])
    assert np.allclose(norms, math.sqrt(1 + math.log(4) / math.log(256)), atol=1e-6)


def test_the_short_and_long_tables_differ_where_the_scenarios_run() -> None:
    """The planted swap below must change the rows the scenarios use (positions 0-157) by far more than the
    tolerance could hide."""
    cfg = _config()
    s = cfg.rope_scaling
    assert s is not None
    swapped = RopeScaling(rope_type="longrope", short_factor=s.long_factor, long_factor=s.short_factor,
                          original_max_position_embeddings=s.original_max_position_embeddings)
    assert np.abs(_table(cfg, s)[:24] - _table(cfg, swapped)[:24]).max() > 0.5


@pytest.mark.parametrize("capacity", [257, 4096])
def test_a_capacity_past_the_switch_is_refused(capacity: int) -> None:
    """Edge-LLM's runtime then takes its long table for every position (``ropeCache.cpp``), HF the short factors for a
    sequence within 256 tokens: trtio cannot be both, so it refuses, naming the key."""
    raw = _raw()
    raw["builder_config"] = {**raw["builder_config"], "max_kv_cache_capacity": capacity}
    with pytest.raises(ConfigError, match="max_kv_cache_capacity.*original_max_position_embeddings"):
        _config(raw)


@pytest.mark.parametrize(("key", "value", "field"), [
    ("attention_factor", 1.0, "rope_scaling.attention_factor"),
    ("factor", 16.0, "rope_scaling.factor"),
])
def test_an_attention_factor_edge_llm_does_not_read_is_refused(key: str, value: float, field: str) -> None:
    """Edge-LLM's runtime reads neither key and scales by max / original; HF would use them: refused, naming it."""
    raw = _raw()
    raw["rope_scaling"] = {**raw["rope_scaling"], key: value}
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        _config(raw)
    raw["rope_scaling"][key] = 4.0 if key == "factor" else math.sqrt(1 + math.log(4) / math.log(256))
    _config(raw)  # the value Edge-LLM computes itself is accepted


def test_a_top_level_original_length_other_than_rope_scaling_s_is_refused() -> None:
    """Edge-LLM switches at the top-level ``original_max_position_embeddings``, HF at ``rope_scaling``'s."""
    raw = _raw()
    raw["original_max_position_embeddings"] = 128
    with pytest.raises(ConfigError, match="original_max_position_embeddings"):
        _config(raw)


def _rows_from(table: np.ndarray, other: np.ndarray) -> Hook:
    """Replaces each RoPE row (``table``'s row of position p) by ``other``'s row of p."""
    def hook(inputs: dict[str, np.ndarray]) -> None:
        rows = np.asarray(inputs["rope_rotary_cos_sin"], np.float32)
        positions = np.argmin(((rows[:, None, :] - table[None, :, :]) ** 2).sum(-1), axis=1)
        inputs["rope_rotary_cos_sin"] = np.ascontiguousarray(other[positions])
    return hook


def _swapped() -> Hook:
    cfg = _config()
    s = cfg.rope_scaling
    assert s is not None
    swapped = RopeScaling(rope_type="longrope", short_factor=s.long_factor, long_factor=s.short_factor,
                          original_max_position_embeddings=s.original_max_position_embeddings)
    return _rows_from(_table(cfg, s), _table(cfg, swapped))


def _whole_head() -> Hook:
    """The frequencies of a fully rotated head (rotary_dim 32: theta^(-2i/32)) cut to the 24 columns the graph takes:
    partial_rotary_factor read as 1."""
    cfg = _config()
    s = cfg.rope_scaling
    assert s is not None
    full = RopeScaling(rope_type="longrope", short_factor=s.short_factor + (1.0,) * 4,
                       long_factor=s.long_factor + (1.0,) * 4,
                       original_max_position_embeddings=s.original_max_position_embeddings)
    wide = _table(cfg, full, rotary_dim=32)
    other = np.concatenate([wide[:, :12], wide[:, 16:28]], axis=1)
    return _rows_from(_table(cfg, s), other)


def _no_attention_factor() -> Hook:
    factor = np.float32(math.sqrt(1 + math.log(4) / math.log(256)))

    def hook(inputs: dict[str, np.ndarray]) -> None:
        inputs["rope_rotary_cos_sin"] = np.asarray(inputs["rope_rotary_cos_sin"], np.float32) / factor
    return hook


BUGS: dict[str, tuple[str, Callable[[], Hook]]] = {
    "short and long factors swapped": ("batch", _swapped),
    "short and long factors swapped (chunked, across a page)": ("chunked", _swapped),
    "partial rotary read as 1 (frequencies of the whole head)": ("batch", _whole_head),
    "LongRoPE's attention factor dropped": ("batch", _no_attention_factor),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_input_bug_fails_parity(bug: str) -> None:
    scenario, make = BUGS[bug]
    how = planted(Case(NAME), scenario, make())
    assert how.startswith(("mismatch", "refused"))


# -- the switch inside the capacity: what the refusal avoids ---------------------------------------------------------

SWITCH = "phi4mm-switch"


def test_a_capacity_past_the_switch_refuses_the_switch_case() -> None:
    """The same model with its switch at 64 tokens in a KV capacity of 256: trtio refuses it."""
    with pytest.raises(ConfigError, match="max_kv_cache_capacity"):
        trtio.LLMEngineConfig.from_edgellm(Case(SWITCH).engine().config, what=f"{SWITCH}/llm/config.json")


@pytest.fixture
def refusal_lifted(monkeypatch: pytest.MonkeyPatch) -> None:
    """trtio's LongRoPE checks switched off: it then writes Edge-LLM's table, the long factors at every row."""
    monkeypatch.setattr(trtio.LLMEngineConfig, "_validate_longrope", lambda self, scaling: None)


@pytest.mark.parametrize("scenario", ["chunked", "prefix"])
@pytest.mark.usefixtures("refusal_lifted")
def test_past_the_switch_edge_llm_s_long_table_is_hugging_face_s(scenario: str) -> None:
    """Sequences longer than 64 tokens: HF's one forward rotates every position with the long factors, as
    Edge-LLM's table does, so the real graph fed that table equals HF."""
    cmp = run(Case(SWITCH), scenario)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


@pytest.mark.parametrize("scenario", ["batch", "admission"])
@pytest.mark.usefixtures("refusal_lifted")
def test_within_the_switch_edge_llm_s_long_table_is_not_hugging_face_s(scenario: str) -> None:
    """Prompts within 64 tokens: HF rotates them with the short factors, Edge-LLM's table with the long ones; the
    logits differ, which is why trtio refuses such a capacity."""
    with pytest.raises(ParityMismatch):
        run(Case(SWITCH), scenario)


# -- a prompt holding an image: the layout and splice against HF's whole model -----------------------------------------

IMAGE = "phi4mm-image"


def _image_config(case: Case) -> P.Phi4mmVisualConfig:
    a = case.arrays
    return P.Phi4mmVisualConfig(crop_size=448, patch_size=14, hidden_size=32, out_hidden_size=64, vocab_size=512,
                                image_token_id=500, min_image_tokens=256, max_image_tokens=768,
                                max_image_tokens_per_image=768, glb_gn=a["glb_GN"], sub_gn=a["sub_GN"])


def _image_prompt(case: Case, rows: Callable[..., np.ndarray] = P.image_rows) -> tuple[np.ndarray, np.ndarray]:
    cfg = _image_config(case)
    layout = np.array([[1, 2, 16, 32]])  # 448 x 896: a 1 x 2 grid, nothing padded
    table = case.table()
    ids = P.expand_image_pads(case.arrays["prompt"], layout, cfg)
    embeds = table[ids].copy()
    embeds[ids == cfg.image_token_id] = rows(case.arrays["encoded"], layout, cfg)
    return ids, embeds


def _run_image(case: Case, embeds: np.ndarray, backend: str = "host", graphs: bool = False) -> Compare:
    a, cmp = case.arrays, Compare()
    rows = {int(r): a["logits"][i] for i, r in enumerate(a["rows"].tolist())}
    n, table, tokens = embeds.shape[0], case.table(), a["tokens"]
    with llm_setup(case, backend, graphs) as setup:
        logits = setup.prefill(embeds[None], np.array([n], np.int32)).to_numpy()[0]
        for step in range(case.meta["continuation"]):
            at = n - 1 + step
            cmp.values(rows[at], logits, f"row {at}")
            if int(logits.argmax()) != int(tokens[at + 1]):
                raise ParityMismatch(f"token after row {at}: trtio {int(logits.argmax())}, HF {int(tokens[at + 1])}")
            logits = setup.decode(table[tokens[at + 1]][None, None, :]).to_numpy()[0]
    return cmp


@pytest.mark.parametrize(("backend", "graphs"), RUNS)
def test_a_prompt_with_an_image_equals_hugging_face(backend: str, graphs: bool) -> None:
    """HF's whole model on a prompt with one 448 x 896 image (801 image tokens) against the real LLM graph fed
    trtio's splice of the encoder's rows (HF's own tower and projection per block: the visual export fails on a
    CPU): the expansion, the sub_GN / glb_GN places and the prompt's logits and greedy tokens are HF's."""
    case = Case(IMAGE)
    ids, embeds = P.splice(case.arrays["prompt"], np.array([[1, 2, 16, 32]]), _image_config(case), case.table(),
                           case.arrays["encoded"])
    assert ids.tolist() == case.arrays["tokens"][:ids.shape[0]].tolist()
    assert np.array_equal(embeds, _image_prompt(case)[1])
    cmp = _run_image(case, embeds, backend, graphs)
    assert cmp.rows == case.meta["continuation"] and cmp.worst <= 0.1


def _glb_first(encoded: np.ndarray, layout: np.ndarray, cfg: P.Phi4mmVisualConfig) -> np.ndarray:
    rows = P.image_rows(encoded, layout, cfg)
    glb = 16 * 17 + 1
    return np.concatenate([rows[-glb + 1:], rows[-glb:-glb + 1], rows[:-glb]])


def _no_separators(encoded: np.ndarray, layout: np.ndarray, cfg: P.Phi4mmVisualConfig) -> np.ndarray:
    zero = dataclasses.replace(cfg, glb_gn=np.zeros(64, np.float16), sub_gn=np.zeros(64, np.float16))
    return P.image_rows(encoded, layout, zero)


def _blocks_swapped(encoded: np.ndarray, layout: np.ndarray, cfg: P.Phi4mmVisualConfig) -> np.ndarray:
    x = np.asarray(encoded).reshape(3, 256, 64)
    return P.image_rows(x[[0, 2, 1]].reshape(-1, 64), layout, cfg)


IMAGE_BUGS = {"the global block first (glb_GN and the global rows before the sub grid)": _glb_first,
              "zero separator rows (the sidecar unread)": _no_separators,
              "the two sub blocks swapped": _blocks_swapped}


@pytest.mark.parametrize("bug", list(IMAGE_BUGS))
def test_a_planted_layout_bug_fails_the_image_prompt(bug: str) -> None:
    case = Case(IMAGE)
    _, embeds = _image_prompt(case, IMAGE_BUGS[bug])
    with pytest.raises(ParityMismatch):
        _run_image(case, embeds)
