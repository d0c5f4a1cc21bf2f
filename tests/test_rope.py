"""trtio._rope against Hugging Face transformers' numbers (tests/fixtures/rope/hf_rope.json).

The fixture was computed once with real transformers by scripts/make_rope_fixture.py; these tests
read only the JSON, so transformers is not a test dependency.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trtio._rope import RopeScaling, mrope_cos_sin_rows, rope_cos_sin_table, rope_parameters
from trtio.errors import ConfigError, ShapeError

FIXTURE = Path(__file__).parent / "fixtures" / "rope" / "hf_rope.json"
DATA: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = DATA["cases"]
EPS32 = float(np.finfo(np.float32).eps)

# HF computes inv_freq in float32 (theta ** x, a reciprocal, and for llama3 / yarn / longrope a blend or
# a division: a few roundings, measured at most 2.7 eps32 = 3.2e-7 relative in this fixture). 1e-6
# relative bounds that with room, and trtio's float64 values are exact by comparison.
INV_FREQ_RTOL = 1e-6


def _case_ids() -> list[str]:
    return [c["name"] for c in CASES]


def _hf_rows(case: dict[str, Any]) -> np.ndarray:
    """HF's [cos | sin] rows at the case's positions, float32 [N, rotary_dim]."""
    half = case["rotary_dim"] // 2
    cos = np.frombuffer(base64.b64decode(case["cos"]), dtype="<f4").reshape(-1, half)
    sin = np.frombuffer(base64.b64decode(case["sin"]), dtype="<f4").reshape(-1, half)
    return np.concatenate([cos, sin], axis=1)


def _table_atol(largest_position: np.ndarray, inv_freq: np.ndarray, attention_factor: float) -> np.ndarray:
    """Per-element tolerance for comparing trtio's rows with HF's float32 ones.

    HF's angle is fl32(fl32(inv_freq) * p): its inv_freq carries up to ~3 eps32 relative error (see
    INV_FREQ_RTOL) and the product adds 0.5 eps32, so the angle is off by up to ~3.5 eps32 * |angle|
    (4 used); cos and sin pass that error on unamplified, times the attention factor. The 1e-6 floor
    covers float32 cos/sin evaluation and the float32 rounding of each side's output (~1e-7 each).
    ``largest_position`` bounds |p| per row (for MRoPE, the largest of the three axes).
    """
    angle = np.abs(largest_position)[:, None].astype(np.float64) * inv_freq[None, :]
    per_freq = 1e-6 + 4 * EPS32 * angle * attention_factor
    return np.concatenate([per_freq, per_freq], axis=1)


def _scaling(case: dict[str, Any]) -> RopeScaling:
    scaling = RopeScaling.from_hf(case["hf_rope_parameters"])
    assert scaling is not None
    return scaling


@pytest.mark.parametrize("case", CASES, ids=_case_ids())
def test_inv_freq_and_attention_factor_match_hf(case: dict[str, Any]) -> None:
    inv_freq, attention_factor = rope_parameters(
        case["rotary_dim"], case["rope_theta"], _scaling(case),
        max_position_embeddings=case["max_position_embeddings"], seq_len=case["seq_len"])
    assert inv_freq.dtype == np.float64 and inv_freq.shape == (case["rotary_dim"] // 2,)
    np.testing.assert_allclose(inv_freq, np.array(case["inv_freq"]), rtol=INV_FREQ_RTOL, atol=0)
    # HF's attention factor is a Python float computed in float64 like trtio's.
    assert math.isclose(attention_factor, case["attention_factor"], rel_tol=1e-6)


@pytest.mark.parametrize("case", [c for c in CASES if c["positions"] is not None],
                         ids=[c["name"] for c in CASES if c["positions"] is not None])
def test_table_matches_hf(case: dict[str, Any]) -> None:
    scaling = _scaling(case)
    # The table is defined as HF's result for a sequence of the table's length; the fixture's sequence
    # is max(positions) + 1 long, so a table of exactly that length is comparable for every type.
    table = rope_cos_sin_table(case["seq_len"], case["rotary_dim"], case["rope_theta"], scaling=scaling,
                               max_position_embeddings=case["max_position_embeddings"])
    assert table.dtype == np.float32 and table.shape == (1, case["seq_len"], case["rotary_dim"])
    positions = np.array(case["positions"])
    rows = table[0, positions]
    inv_freq = np.array(case["inv_freq"])
    atol = _table_atol(positions, inv_freq, case["attention_factor"])
    expected = _hf_rows(case)
    bad = np.abs(rows.astype(np.float64) - expected) > atol
    assert not bad.any(), f"{bad.sum()} elements outside tolerance, first at {np.argwhere(bad)[0]}"


@pytest.mark.parametrize("case", [c for c in CASES if c["mrope_positions"] is not None],
                         ids=[c["name"] for c in CASES if c["mrope_positions"] is not None])
def test_mrope_rows_match_hf(case: dict[str, Any]) -> None:
    scaling = _scaling(case)
    assert scaling.mrope_section is not None
    position_ids = np.array(case["mrope_positions"], dtype=np.int64)
    rows = mrope_cos_sin_rows(position_ids, case["rotary_dim"], case["rope_theta"], scaling.mrope_section,
                              interleaved=scaling.mrope_interleaved, scaling=scaling)
    assert rows.dtype == np.float32 and rows.shape == (position_ids.shape[1], case["rotary_dim"])
    atol = _table_atol(position_ids.max(axis=0), np.array(case["inv_freq"]), case["attention_factor"])
    bad = np.abs(rows.astype(np.float64) - _hf_rows(case)) > atol
    assert not bad.any(), f"{bad.sum()} elements outside tolerance, first at {np.argwhere(bad)[0]}"


def test_fixture_records_versions_and_inputs() -> None:
    assert DATA["transformers_version"] and DATA["torch_version"]
    types = {c["hf_rope_parameters"]["rope_type"] for c in CASES}
    assert types == {"default", "linear", "dynamic", "llama3", "yarn", "longrope"}
    assert any(c["rotary_dim"] < c["head_dim"] for c in CASES)  # partial rotary is covered


@pytest.mark.parametrize("case", CASES, ids=_case_ids())
def test_to_dict_round_trips(case: dict[str, Any]) -> None:
    scaling = _scaling(case)
    again = RopeScaling.from_hf(scaling.to_dict())
    assert again == scaling
    assert json.loads(json.dumps(scaling.to_dict())) == scaling.to_dict()


# --- behaviour beyond the fixture ---------------------------------------------------------------


def _old_table(max_positions: int, rotary_dim: int, theta: float, batch: int = 1) -> np.ndarray:
    """The unscaled table as trtio computed it before rope scaling existed."""
    half = rotary_dim // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rotary_dim)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    table = np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    return np.broadcast_to(table, (batch, max_positions, rotary_dim))


def test_unscaled_table_is_unchanged() -> None:
    for args in [(64, 32, 10000.0), (300, 128, 500000.0), (0, 8, 10000.0)]:
        np.testing.assert_array_equal(rope_cos_sin_table(*args), _old_table(*args))
    table = rope_cos_sin_table(16, 8, 10000.0, 3)
    assert table.shape == (3, 16, 8) and table.flags.c_contiguous
    np.testing.assert_array_equal(table, _old_table(16, 8, 10000.0, 3))
    default = RopeScaling.from_hf({"rope_type": "default", "rope_theta": 10000.0})
    np.testing.assert_array_equal(rope_cos_sin_table(64, 32, 10000.0, scaling=default), _old_table(64, 32, 10000.0))


def test_from_hf_normalises_and_keeps_extras() -> None:
    assert RopeScaling.from_hf(None) is None
    assert RopeScaling.from_hf({}) is None
    legacy = RopeScaling.from_hf({"type": "linear", "factor": 2, "rope_theta": 1e4, "partial_rotary_factor": 0.5})
    assert legacy is not None
    assert legacy.rope_type == "linear" and legacy.factor == 2.0 and isinstance(legacy.factor, float)
    assert dict(legacy.extras) == {"rope_theta": 1e4, "partial_rotary_factor": 0.5}
    # HF rewrites Qwen2-VL's legacy "mrope" to rope_type "default" and keeps "type": rope_type wins.
    qwen = RopeScaling.from_hf({"type": "mrope", "rope_type": "default", "mrope_section": [16, 24, 24]})
    assert qwen is not None and qwen.rope_type == "default" and qwen.mrope_section == (16, 24, 24)
    assert dict(qwen.extras) == {"type": "mrope"}
    mrope = RopeScaling.from_hf({"type": "mrope", "mrope_section": [16, 24, 24]})
    assert mrope is not None and mrope.rope_type == "mrope" and not mrope.mrope_interleaved
    # Another type's key is not read, only kept.
    llama3 = RopeScaling.from_hf({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                                  "beta_fast": 32})
    assert llama3 is not None and llama3.beta_fast is None and dict(llama3.extras) == {"beta_fast": 32}
    yarn = RopeScaling.from_hf({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert yarn is not None and (yarn.beta_fast, yarn.beta_slow, yarn.truncate) == (32.0, 1.0, True)
    with pytest.raises(AttributeError, match="cannot assign to field 'factor'"):
        yarn.factor = 2.0  # type: ignore[misc]


def test_static_table_uses_its_own_length_as_the_sequence_length() -> None:
    half = 48
    longrope = RopeScaling(rope_type="longrope", short_factor=(1.0,) * half, long_factor=(4.0,) * half,
                           original_max_position_embeddings=4096, factor=32.0)
    short = rope_cos_sin_table(4096, 96, 10000.0, scaling=longrope)
    long = rope_cos_sin_table(4097, 96, 10000.0, scaling=longrope)
    inv_short, att = rope_parameters(96, 10000.0, longrope, seq_len=4096)
    inv_long, _ = rope_parameters(96, 10000.0, longrope, seq_len=4097)
    np.testing.assert_allclose(inv_long, inv_short / 4.0, rtol=1e-15)
    # float32 rounding of the rows: |value| <= att, half an ulp at most.
    np.testing.assert_allclose(short[0, 1, :half], np.cos(inv_short) * att, atol=att * EPS32)
    np.testing.assert_allclose(long[0, 1, :half], np.cos(inv_long) * att, atol=att * EPS32)

    dynamic = RopeScaling(rope_type="dynamic", factor=2.0)
    within = rope_cos_sin_table(4096, 64, 10000.0, scaling=dynamic, max_position_embeddings=4096)
    np.testing.assert_array_equal(within, _old_table(4096, 64, 10000.0))
    beyond = rope_cos_sin_table(8192, 64, 10000.0, scaling=dynamic, max_position_embeddings=4096)
    inv_beyond, _ = rope_parameters(64, 10000.0, dynamic, max_position_embeddings=4096, seq_len=8192)
    # NTK: base * (2 * 8192 / 4096 - 1) ** (64 / 62), so every frequency but the first is lower.
    assert inv_beyond[0] == 1.0 and (inv_beyond[1:] < _old_inv(64, 10000.0)[1:]).all()
    np.testing.assert_allclose(beyond[0, 5000, 32:], np.sin(5000 * inv_beyond), atol=EPS32)


def _old_inv(rotary_dim: int, theta: float) -> np.ndarray:
    inv: np.ndarray = theta ** (-np.arange(rotary_dim // 2, dtype=np.float64) * 2.0 / rotary_dim)
    return inv


def _axes_seen(rows: np.ndarray, half: int) -> np.ndarray:
    """Frequencies whose angle is non-zero (sin != 0) in a row."""
    return np.flatnonzero(rows[half:] != 0)


def test_the_hubs_interleaved_key_is_mrope_interleaved() -> None:
    """Qwen3-ASR's and Qwen3-Omni's hub configs spell ``mrope_interleaved`` as ``interleaved`` (the exported LLM
    config carries both); the two spellings must agree."""
    both = RopeScaling.from_hf({"rope_type": "default", "mrope_section": [6, 5, 5], "interleaved": True,
                                "mrope_interleaved": True})
    alone = RopeScaling.from_hf({"rope_type": "default", "mrope_section": [6, 5, 5], "interleaved": True})
    assert both == alone and alone is not None and alone.mrope_interleaved
    assert "interleaved" not in alone.extras
    with pytest.raises(ConfigError, match="rope_scaling.interleaved: is False but mrope_interleaved is True"):
        RopeScaling.from_hf({"rope_type": "default", "mrope_section": [6, 5, 5], "interleaved": False,
                             "mrope_interleaved": True})
    with pytest.raises(ConfigError, match="mrope_section: is required when mrope_interleaved is true"):
        RopeScaling.from_hf({"rope_type": "default", "interleaved": True})


def test_mrope_layouts_follow_hf() -> None:
    half = 64
    one_axis = np.zeros((3, 3), dtype=np.int64)
    one_axis[0, 0] = one_axis[1, 1] = one_axis[2, 2] = 7  # row r moves only along axis r
    sectioned = mrope_cos_sin_rows(one_axis, 128, 1e6, [16, 24, 24])
    assert list(_axes_seen(sectioned[0], half)) == list(range(16))
    assert list(_axes_seen(sectioned[1], half)) == list(range(16, 40))
    assert list(_axes_seen(sectioned[2], half)) == list(range(40, 64))
    interleaved = mrope_cos_sin_rows(one_axis, 128, 5e6, [24, 20, 20], interleaved=True)
    height, width = list(range(1, 60, 3)), list(range(2, 60, 3))
    assert list(_axes_seen(interleaved[1], half)) == height
    assert list(_axes_seen(interleaved[2], half)) == width
    assert list(_axes_seen(interleaved[0], half)) == sorted(set(range(64)) - set(height) - set(width))
    assert len(height) == 20 and len(width) == 20 and half - 40 == 24
    # Height and width counts that differ: HF strides each over 3 * its own count.
    uneven = mrope_cos_sin_rows(one_axis, 128, 5e6, [26, 20, 18], interleaved=True)
    assert list(_axes_seen(uneven[1], half)) == list(range(1, 60, 3))
    assert list(_axes_seen(uneven[2], half)) == list(range(2, 54, 3))

    # Text-only positions (t == h == w) give the plain table's rows, whatever the layout.
    text = np.tile(np.arange(50, dtype=np.int64), (3, 1))
    plain = rope_cos_sin_table(50, 128, 1e6)[0]
    np.testing.assert_array_equal(mrope_cos_sin_rows(text, 128, 1e6, [16, 24, 24]), plain)
    np.testing.assert_array_equal(mrope_cos_sin_rows(text, 128, 1e6, [24, 20, 20], interleaved=True), plain)


# --- bad input --------------------------------------------------------------------------------------

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("data,key,needle", [
    ({"rope_type": "ntk-by-parts", "factor": 2.0}, "rope_scaling.rope_type", "expected one of"),
    ({"type": "su", "factor": 2.0}, "rope_scaling.type", "'su'"),
    ({k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"},
     "rope_scaling.original_max_position_embeddings", "required"),
    ({"rope_type": "linear"}, "rope_scaling.factor", "required"),
    ({"rope_type": "linear", "factor": float("nan")}, "rope_scaling.factor", "finite"),
    ({"rope_type": "dynamic", "factor": float("inf")}, "rope_scaling.factor", "finite"),
    ({"rope_type": "linear", "factor": "2"}, "rope_scaling.factor", "'2'"),
    ({"rope_type": "linear", "factor": True}, "rope_scaling.factor", "True"),
    ({"rope_type": "linear", "factor": 0.5}, "rope_scaling.factor", ">= 1"),
    ({**LLAMA3, "high_freq_factor": 1.0}, "rope_scaling.high_freq_factor", "low_freq_factor"),
    ({**LLAMA3, "original_max_position_embeddings": 8192.5}, "rope_scaling.original_max_position_embeddings",
     "int"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 1, "beta_slow": 32},
     "rope_scaling.beta_fast", "beta_slow"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "truncate": "no"},
     "rope_scaling.truncate", "true or false"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "mscale": -1.0},
     "rope_scaling.mscale", "> 0"),
    ({"rope_type": "longrope", "short_factor": [1.0, 2.0], "long_factor": [1.0],
      "original_max_position_embeddings": 4096}, "rope_scaling.long_factor", "short_factor"),
    ({"rope_type": "longrope", "short_factor": [1.0, float("nan")], "long_factor": [1.0, 2.0],
      "original_max_position_embeddings": 4096}, "rope_scaling.short_factor", "index 1"),
    ({"rope_type": "longrope", "short_factor": 1.0, "long_factor": [1.0],
      "original_max_position_embeddings": 4096}, "rope_scaling.short_factor", "list"),
    ({"type": "mrope"}, "rope_scaling.mrope_section", "required"),
    ({"type": "mrope", "mrope_section": [16, 48]}, "rope_scaling.mrope_section", "3 ints"),
    ({"rope_type": "default", "mrope_interleaved": True}, "rope_scaling.mrope_section", "mrope_interleaved"),
])
def test_from_hf_rejects(data: dict[str, Any], key: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        RopeScaling.from_hf(data)
    assert info.value.field == key
    assert key in str(info.value) and needle in str(info.value)


def test_from_hf_names_the_config_path() -> None:
    with pytest.raises(ConfigError, match=r"^text_config\.rope_scaling\.factor: "):
        RopeScaling.from_hf({"rope_type": "linear", "factor": -1}, what="text_config.rope_scaling")
    with pytest.raises(ConfigError, match="^rope_scaling: expected a mapping"):
        RopeScaling.from_hf([("rope_type", "linear")])  # type: ignore[arg-type]


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"rope_scaling\.low_freq_factor: is not used by rope_type 'linear'"):
        RopeScaling(rope_type="linear", factor=2.0, low_freq_factor=1.0)
    with pytest.raises(ConfigError, match=r"rope_scaling\.factor: is read by rope_type 'linear'"):
        RopeScaling(rope_type="linear", factor=2.0, extras={"factor": 3.0})


def test_computation_rejects_inputs_that_do_not_fit() -> None:
    longrope = RopeScaling.from_hf({"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32,
                                    "original_max_position_embeddings": 4096, "factor": 8.0})
    with pytest.raises(ConfigError, match=r"^rope_scaling\.short_factor: expected 48 numbers \(rotary_dim 96 / 2\)"):
        rope_parameters(96, 10000.0, longrope)
    mrope = RopeScaling.from_hf({"type": "mrope", "mrope_section": [16, 24, 24]})
    with pytest.raises(ConfigError, match=r"^rope_scaling\.mrope_section: expected counts summing to .* = 32"):
        rope_cos_sin_table(16, 64, 1e6, scaling=mrope)
    with pytest.raises(ConfigError, match=r"^mrope_section: expected counts summing to rotary_dim / 2 = 32"):
        mrope_cos_sin_rows(np.zeros((3, 4), dtype=np.int64), 64, 1e6, [16, 24, 24])
    with pytest.raises(ConfigError, match=r"^rope_scaling\.mrope_section: is \[16, 24, 24\]"):
        mrope_cos_sin_rows(np.zeros((3, 4), dtype=np.int64), 128, 1e6, [24, 20, 20], scaling=mrope)
    with pytest.raises(ShapeError, match=r"position_ids: expected integer positions of shape \[3, N\]"):
        mrope_cos_sin_rows(np.zeros((2, 4), dtype=np.int64), 128, 1e6, [16, 24, 24])
    with pytest.raises(ShapeError, match="position_ids"):
        mrope_cos_sin_rows(np.zeros((3, 4)), 128, 1e6, [16, 24, 24])
    dynamic = RopeScaling.from_hf({"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ConfigError, match=r"^max_position_embeddings: is required for rope_type 'dynamic'"):
        rope_cos_sin_table(16, 64, 10000.0, scaling=dynamic)
    yarn = RopeScaling.from_hf({"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096})
    with pytest.raises(ConfigError, match=r"^max_position_embeddings: is required for rope_type 'yarn'"):
        rope_parameters(64, 10000.0, yarn)
    _, att = rope_parameters(64, 10000.0, yarn, max_position_embeddings=4096 * 40)
    assert att == pytest.approx(0.1 * math.log(40) + 1, rel=1e-12)  # factor derived as 163840 / 4096
    with pytest.raises(ValueError, match="rotary_dim: expected a positive even int, got 15"):
        rope_cos_sin_table(16, 15, 10000.0)
    with pytest.raises(ConfigError, match="theta: expected a finite number > 0"):
        rope_cos_sin_table(16, 16, float("nan"))
