"""trtio.testing.toy_model: the numpy ground truth of the toy engines (docs/toy-model.md)."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trtio.errors import ConfigError
from trtio.testing.toy_model import (
    DRAFT_MIX_SCALE,
    ToyWeights,
    apply_rope,
    config_role,
    no_rope_table,
    reference_forward,
    reference_logits,
    rope_table,
    toy_embedding,
)


def make_cfg(**overrides: object) -> types.SimpleNamespace:
    fields: dict[str, object] = dict(
        hidden_size=32,
        vocab_size=64,
        output_vocab_size=64,
        max_supported_batch_size=2,
        max_supported_input_length=16,
        max_kv_cache_capacity=32,
        num_attention_layers=2,
        num_attention_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rotary_dim=8,
        activation_dtype="float16",
        kv_cache_dtype="float16",
        num_deepstack_features=0,
        rope_type="rope",
        is_spec_decode_base=False,
        base_model_hidden_size=0,
        max_verify_tree_size=4,
        max_draft_tree_size=4,
    )
    fields.update(overrides)
    return types.SimpleNamespace(**fields)


def draft_cfg(**overrides: object) -> types.SimpleNamespace:
    return make_cfg(**{"num_attention_layers": 1, "base_model_hidden_size": 48, **overrides})


def embeds_for(cfg: types.SimpleNamespace, tokens: list[int], seed: int = 0) -> np.ndarray:
    return toy_embedding(cfg.vocab_size, cfg.hidden_size, seed)[tokens]


def all_arrays(w: ToyWeights) -> list[np.ndarray]:
    arrays = [a for name in ("wq", "wk", "wv", "wo", "w1", "w2") for a in getattr(w, name)]
    arrays += [a for a in (w.we, w.wh, w.wd) if a is not None]
    return arrays + [w.w_lm]


# -- roles and weights --------------------------------------------------------------------------


def test_config_role() -> None:
    assert config_role(make_cfg()) == "llm"
    assert config_role(make_cfg(is_spec_decode_base=True)) == "base"
    assert config_role(draft_cfg()) == "draft"


def test_weights_are_deterministic_per_seed() -> None:
    cfg = make_cfg()
    a, b = ToyWeights.generate(cfg, seed=3), ToyWeights.generate(cfg, seed=3)
    for x, y in zip(all_arrays(a), all_arrays(b)):
        np.testing.assert_array_equal(x, y)


def test_weights_differ_across_seeds() -> None:
    cfg = make_cfg()
    a, b = ToyWeights.generate(cfg, seed=0), ToyWeights.generate(cfg, seed=1)
    for x, y in zip(all_arrays(a), all_arrays(b)):
        assert not np.array_equal(x, y)


def test_weight_shapes_llm() -> None:
    cfg = make_cfg(output_vocab_size=40)
    w = ToyWeights.generate(cfg)
    h, hq, hkv, d = 32, 4, 2, 8
    assert w.num_layers == 2 and not w.is_draft
    assert w.we is None and w.wh is None and w.wd is None
    for layer in range(2):
        assert w.wq[layer].shape == (h, hq * d)
        assert w.wk[layer].shape == (h, hkv * d)
        assert w.wv[layer].shape == (h, hkv * d)
        assert w.wo[layer].shape == (hq * d, h)
        assert w.w1[layer].shape == (h, 2 * h)
        assert w.w2[layer].shape == (2 * h, h)
    assert w.w_lm.shape == (h, 40)
    assert all(a.dtype == np.float32 for a in all_arrays(w))


def test_weight_shapes_draft() -> None:
    w = ToyWeights.generate(draft_cfg())
    assert w.num_layers == 1 and w.is_draft
    assert w.we is not None and w.we.shape == (32, 32)
    assert w.wh is not None and w.wh.shape == (48, 32)
    assert w.wd is not None and w.wd.shape == (32, 32)


def test_output_vocab_defaults_to_vocab() -> None:
    w = ToyWeights.generate(make_cfg(output_vocab_size=None))
    assert w.w_lm.shape == (32, 64)


@pytest.mark.parametrize("cfg", [make_cfg(), draft_cfg()], ids=["llm", "draft"])
def test_weights_follow_the_documented_draw_order_and_scales(cfg: types.SimpleNamespace) -> None:
    """Pins the contract every implementation repeats: per layer wq wk wv wo w1 w2, then we wh wd, then w_lm."""
    rng = np.random.default_rng(11)
    h, hq, hkv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_kv_heads, cfg.head_dim

    def draw(shape: tuple[int, int], scale: float) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)

    expected: list[np.ndarray] = []
    per_layer: dict[str, list[np.ndarray]] = {k: [] for k in ("wq", "wk", "wv", "wo", "w1", "w2")}
    for _ in range(cfg.num_attention_layers):
        per_layer["wq"].append(draw((h, hq * d), 1 / math.sqrt(h)))
        per_layer["wk"].append(draw((h, hkv * d), 1 / math.sqrt(h)))
        per_layer["wv"].append(draw((h, hkv * d), 1 / math.sqrt(h)))
        per_layer["wo"].append(draw((hq * d, h), 0.5 / math.sqrt(hq * d)))
        per_layer["w1"].append(draw((h, 2 * h), 1 / math.sqrt(h)))
        per_layer["w2"].append(draw((2 * h, h), 0.5 / math.sqrt(2 * h)))
    for name in per_layer:
        expected += per_layer[name]
    if cfg.base_model_hidden_size:
        hb = cfg.base_model_hidden_size
        expected += [draw((h, h), 1 / math.sqrt(h)), draw((hb, h), 1 / math.sqrt(hb)), draw((h, h), 1 / math.sqrt(h))]
    expected.append(draw((h, cfg.output_vocab_size), 1 / math.sqrt(h)))

    got = all_arrays(ToyWeights.generate(cfg, seed=11))
    assert len(got) == len(expected)
    for x, y in zip(got, expected):
        np.testing.assert_array_equal(x, y)


def _cut(w: ToyWeights, layers: int) -> ToyWeights:
    return ToyWeights(wq=w.wq[:layers], wk=w.wk[:layers], wv=w.wv[:layers], wo=w.wo[:layers], w1=w.w1[:layers],
                      w2=w.w2[:layers], we=None, wh=None, wd=None, w_lm=w.w_lm)


@pytest.mark.parametrize("layers", [1, 2])
def test_the_draft_is_the_base_cut_after_its_layers(layers: int) -> None:
    """generate_draft: the base's first layers and LM head, the next token's embedding as it is (we = I): fed
    zero hidden states, the draft computes exactly what the base cut after those layers computes."""
    base_cfg = make_cfg(num_attention_layers=3)
    base = ToyWeights.generate(base_cfg, seed=2)
    cfg = draft_cfg(num_attention_layers=layers)
    draft = ToyWeights.generate_draft(cfg, base, seed=2)
    assert draft.num_layers == layers and draft.is_draft and draft.w_lm is base.w_lm
    assert draft.we is not None and (draft.we == np.eye(32, dtype=np.float32)).all()
    x = embeds_for(cfg, [5, 9, 1, 30, 7])
    zeros = dict(hidden_input=np.zeros((5, 48)), hidden_from_draft=np.zeros((5, 32)))
    got_hidden, got = reference_forward(draft, cfg, x, **zeros)
    want_hidden, want = reference_forward(_cut(base, layers), base_cfg, x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_hidden, want_hidden)


def test_the_draft_keeps_its_hidden_inputs_in_play() -> None:
    """wh and wd are the documented draws (wh, then wd, scaled by DRAFT_MIX_SCALE): small, so the copy rules,
    but every hidden input still moves the draft's logits."""
    cfg = draft_cfg(num_attention_layers=2)
    base = ToyWeights.generate(make_cfg(), seed=0)
    draft = ToyWeights.generate_draft(cfg, base, seed=4)
    rng = np.random.default_rng(4)
    wh = rng.standard_normal((48, 32), dtype=np.float32) * np.float32(DRAFT_MIX_SCALE / math.sqrt(48))
    wd = rng.standard_normal((32, 32), dtype=np.float32) * np.float32(DRAFT_MIX_SCALE / math.sqrt(32))
    assert draft.wh is not None and draft.wd is not None
    np.testing.assert_array_equal(draft.wh, wh)
    np.testing.assert_array_equal(draft.wd, wd)
    x = embeds_for(cfg, [3, 4, 5])
    hin = np.random.default_rng(1).standard_normal((3, 48)).astype(np.float32)
    hfd = np.random.default_rng(2).standard_normal((3, 32)).astype(np.float32)
    _, plain = reference_forward(draft, cfg, x, hidden_input=np.zeros_like(hin), hidden_from_draft=np.zeros_like(hfd))
    for kw in (dict(hidden_input=hin, hidden_from_draft=np.zeros_like(hfd)),
               dict(hidden_input=np.zeros_like(hin), hidden_from_draft=hfd)):
        _, moved = reference_forward(draft, cfg, x, **kw)
        change = np.abs(moved - plain).max()
        assert 1e-3 < change < 0.2 * np.abs(plain).max(), change


@pytest.mark.parametrize("field, cfg, match", [
    ("base_model_hidden_size", make_cfg(), "needs an EAGLE draft config"),
    ("num_attention_layers", draft_cfg(num_attention_layers=3), r"3 must be in 1..2"),
    ("hidden_size", draft_cfg(num_kv_heads=1), r"the base's wk is \[32, 16\] where this draft .* needs \[32, 8\]"),
    ("output_vocab_size", draft_cfg(output_vocab_size=40), r"shares the base's LM head \[32, 64\]"),
])
def test_generate_draft_refuses_a_draft_that_cannot_copy_its_base(field: str, cfg: types.SimpleNamespace,
                                                                  match: str) -> None:
    base = ToyWeights.generate(make_cfg())
    with pytest.raises(ConfigError, match=match) as info:
        ToyWeights.generate_draft(cfg, base)
    assert info.value.field == field


def test_embedding_table() -> None:
    e = toy_embedding(64, 32, seed=5)
    assert e.shape == (64, 32) and e.dtype == np.float32
    np.testing.assert_array_equal(e, toy_embedding(64, 32, seed=5))
    assert not np.array_equal(e, toy_embedding(64, 32, seed=6))
    expected = np.random.default_rng(5 + 7919).standard_normal((64, 32), dtype=np.float32)
    np.testing.assert_array_equal(e, expected)


# -- RoPE -----------------------------------------------------------------------------------------


def test_rope_table_values() -> None:
    t = rope_table(10, 8)
    assert t.shape == (1, 10, 8) and t.dtype == np.float32
    np.testing.assert_array_equal(t[0, 0], [1, 1, 1, 1, 0, 0, 0, 0])
    for p in (1, 7):
        for i in range(4):
            angle = p * 10000.0 ** (-2 * i / 8)
            assert t[0, p, i] == pytest.approx(math.cos(angle), abs=1e-6)
            assert t[0, p, 4 + i] == pytest.approx(math.sin(angle), abs=1e-6)
    np.testing.assert_allclose(t[0, :, :4] ** 2 + t[0, :, 4:] ** 2, 1.0, atol=1e-6)


def test_rope_table_theta_and_bad_dim() -> None:
    assert rope_table(4, 2, theta=2.0)[0, 3, 0] == pytest.approx(math.cos(3.0), abs=1e-6)
    with pytest.raises(ValueError, match="rotary_dim"):
        rope_table(4, 3)


def test_apply_rope_position_zero_is_identity_and_tail_is_untouched() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    table = rope_table(16, 4)[0]
    np.testing.assert_array_equal(apply_rope(x, table, np.zeros(3, int)), x)
    y = apply_rope(x, table, np.array([1, 5, 9]))
    np.testing.assert_array_equal(y[..., 4:], x[..., 4:])
    assert not np.allclose(y[..., :4], x[..., :4])
    # rotate-half: each (i, i + R/2) pair keeps its length
    np.testing.assert_allclose(y[..., :2] ** 2 + y[..., 2:4] ** 2, x[..., :2] ** 2 + x[..., 2:4] ** 2, rtol=1e-5)


def test_apply_rope_matches_the_documented_formula() -> None:
    x = np.arange(8, dtype=np.float32).reshape(1, 1, 8)
    table = rope_table(8, 8)[0]
    p = 3
    c, s = table[p, :4], table[p, 4:]
    t1, t2 = x[0, 0, :4], x[0, 0, 4:]
    expected = np.concatenate([t1 * c - t2 * s, t2 * c + t1 * s])
    np.testing.assert_allclose(apply_rope(x, table, np.array([p]))[0, 0], expected, rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(p=st.integers(0, 40), q=st.integers(0, 40), shift=st.integers(0, 20))
def test_apply_rope_dot_products_depend_on_relative_position(p: int, q: int, shift: int) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 1, 1, 8)).astype(np.float32)
    table = rope_table(64, 8)[0]
    d0 = float(np.sum(apply_rope(a, table, np.array([p])) * apply_rope(b, table, np.array([q]))))
    d1 = float(np.sum(apply_rope(a, table, np.array([p + shift])) * apply_rope(b, table, np.array([q + shift]))))
    assert d0 == pytest.approx(d1, abs=1e-4)


def test_apply_rope_rejects_positions_outside_the_table() -> None:
    x = np.zeros((2, 1, 8), np.float32)
    with pytest.raises(ValueError, match="RoPE table has 4 rows"):
        apply_rope(x, rope_table(4, 8)[0], np.array([0, 4]))


# -- reference_forward ----------------------------------------------------------------------------


def test_forward_shapes_and_dtypes() -> None:
    cfg = make_cfg(output_vocab_size=40)
    w = ToyWeights.generate(cfg)
    hidden, logits = reference_forward(w, cfg, embeds_for(cfg, [1, 2, 3, 4, 5]))
    assert hidden.shape == (5, 32) and hidden.dtype == np.float32
    assert logits.shape == (5, 40) and logits.dtype == np.float32
    assert np.all(np.isfinite(logits))
    np.testing.assert_array_equal(reference_logits(w, cfg, embeds_for(cfg, [1, 2, 3, 4, 5])), logits)


def test_forward_is_deterministic_and_accepts_fp16_inputs() -> None:
    cfg = make_cfg()
    w = ToyWeights.generate(cfg)
    x = embeds_for(cfg, [3, 1, 4, 1, 5]).astype(np.float16)
    a = reference_forward(w, cfg, x)[1]
    b = reference_forward(w, cfg, x.astype(np.float32))[1]
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("t", [0, 2, 5])
def test_forward_is_causal(t: int) -> None:
    cfg = make_cfg()
    w = ToyWeights.generate(cfg)
    tokens = [7, 3, 9, 12, 5, 30, 2]
    base = reference_forward(w, cfg, embeds_for(cfg, tokens))
    later = tokens[: t + 1] + [60 - x for x in tokens[t + 1 :]]
    changed_later = reference_forward(w, cfg, embeds_for(cfg, later))
    np.testing.assert_array_equal(changed_later[1][: t + 1], base[1][: t + 1])
    np.testing.assert_array_equal(changed_later[0][: t + 1], base[0][: t + 1])
    assert not np.allclose(changed_later[1][t + 1 :], base[1][t + 1 :])


@pytest.mark.parametrize("earlier", [0, 3])
def test_forward_sees_earlier_tokens(earlier: int) -> None:
    cfg = make_cfg()
    w = ToyWeights.generate(cfg)
    tokens = [7, 3, 9, 12, 5, 30, 2]
    base = reference_forward(w, cfg, embeds_for(cfg, tokens))[1]
    other = list(tokens)
    other[earlier] = 50
    changed = reference_forward(w, cfg, embeds_for(cfg, other))[1]
    np.testing.assert_array_equal(changed[:earlier], base[:earlier])
    for t in range(earlier, len(tokens)):
        assert not np.allclose(changed[t], base[t]), f"token {t} ignores token {earlier}"


@settings(max_examples=15, deadline=None)
@given(tokens=st.lists(st.integers(0, 63), min_size=2, max_size=10), data=st.data())
def test_forward_prefix_property(tokens: list[int], data: st.DataObject) -> None:
    """Running a prefix alone gives the prefix rows of the full run (what a KV cache relies on)."""
    cfg = make_cfg()
    w = ToyWeights.generate(cfg)
    cut = data.draw(st.integers(1, len(tokens)))
    full = reference_forward(w, cfg, embeds_for(cfg, tokens))
    prefix = reference_forward(w, cfg, embeds_for(cfg, tokens[:cut]))
    # Both runs add the same terms, but BLAS blocks a product differently for another row count, so
    # each float32 reduction (H = 32, F = 64 terms, over 2 layers and a softmax) may round its sum
    # differently: a few hundred ulps of the largest logit bound that (seen: under 50).
    atol = 256 * np.finfo(np.float32).eps * float(np.abs(full[1]).max())
    np.testing.assert_allclose(prefix[1], full[1][:cut], rtol=0, atol=atol)


def test_positions_default_to_arange_and_matter() -> None:
    cfg = make_cfg()
    w = ToyWeights.generate(cfg)
    x = embeds_for(cfg, [1, 2, 3, 4])
    base = reference_forward(w, cfg, x)[1]
    np.testing.assert_array_equal(reference_forward(w, cfg, x, positions=np.arange(4))[1], base)
    assert not np.allclose(reference_forward(w, cfg, x, positions=[0, 2, 4, 6])[1], base)


def test_uniform_position_shift_only_moves_rounding() -> None:
    """RoPE attention depends on relative positions: with a float32 cache a shift changes ~nothing."""
    cfg = make_cfg(kv_cache_dtype="float32")
    w = ToyWeights.generate(cfg)
    x = embeds_for(cfg, [9, 8, 7, 6, 5])
    base = reference_forward(w, cfg, x)[1]
    shifted = reference_forward(w, cfg, x, positions=np.arange(5) + 11)[1]
    np.testing.assert_allclose(shifted, base, rtol=1e-4, atol=1e-4)


def test_explicit_rope_table_is_used() -> None:
    cfg = make_cfg()
    w = ToyWeights.generate(cfg)
    x = embeds_for(cfg, [1, 2, 3])
    base = reference_forward(w, cfg, x)[1]
    np.testing.assert_array_equal(reference_forward(w, cfg, x, rope=rope_table(32, 8))[1], base)
    np.testing.assert_array_equal(reference_forward(w, cfg, x, rope=rope_table(32, 8)[0])[1], base)
    assert not np.allclose(reference_forward(w, cfg, x, rope=rope_table(32, 8, theta=7.0))[1], base)
    with pytest.raises(ValueError, match="rotary_dim"):
        reference_forward(w, cfg, x, rope=rope_table(32, 4))


def test_a_model_without_rope_rotates_by_the_table_it_is_given() -> None:
    """``use_rope`` false changes the default table (the identity: cos 1, sin 0), never the rotation: attention
    rotates by whatever table it is given, as Edge-LLM's plugin does, so a real table changes the logits."""
    cfg = make_cfg(use_rope=False)
    w = ToyWeights.generate(cfg)
    x = embeds_for(cfg, [1, 2, 3, 4])
    plain = reference_forward(w, cfg, x)[1]
    identity = no_rope_table(32, 8)
    assert identity.shape == (1, 32, 8) and (identity[..., :4] == 1).all() and (identity[..., 4:] == 0).all()
    np.testing.assert_array_equal(reference_forward(w, cfg, x, rope=identity)[1], plain)
    np.testing.assert_array_equal(plain, reference_forward(w, make_cfg(), x, rope=identity)[1])
    assert not np.allclose(reference_forward(w, cfg, x, rope=rope_table(32, 8))[1], plain)


def test_kv_rounding_through_the_cache_dtype_matters() -> None:
    x16 = make_cfg(kv_cache_dtype="float16")
    x32 = make_cfg(kv_cache_dtype="float32")
    xbf = make_cfg(kv_cache_dtype="bfloat16")
    w = ToyWeights.generate(x16)
    x = embeds_for(x16, [5, 4, 3, 2, 1, 0])
    l16 = reference_forward(w, x16, x)[1]
    l32 = reference_forward(w, x32, x)[1]
    lbf = reference_forward(w, xbf, x)[1]
    d16 = np.abs(l16 - l32).max()
    dbf = np.abs(lbf - l32).max()
    assert 0 < d16 < 1e-2
    assert d16 < dbf < 1e-1
    # the first token attends only to itself, whose v is rounded too
    assert not np.array_equal(l16[0], l32[0])


def test_deepstack_is_added_after_the_first_layers() -> None:
    plain = make_cfg()
    ds_cfg = make_cfg(num_deepstack_features=1)
    w = ToyWeights.generate(plain)
    x = embeds_for(plain, [1, 2, 3, 4])
    base = reference_forward(w, plain, x)[1]
    zeros = [np.zeros((4, 32), np.float32)]
    np.testing.assert_array_equal(reference_forward(w, ds_cfg, x, deepstack=zeros)[1], base)
    feature = [np.random.default_rng(2).standard_normal((4, 32)).astype(np.float16)]
    changed = reference_forward(w, ds_cfg, x, deepstack=feature)[1]
    assert not np.allclose(changed, base)
    # a feature enters its own token's stream after layer 0; causality keeps it from earlier tokens
    only_last = [np.zeros((4, 32), np.float32)]
    only_last[0][3] = 1.0
    moved = reference_forward(w, ds_cfg, x, deepstack=only_last)[1]
    np.testing.assert_array_equal(moved[:3], base[:3])
    assert not np.allclose(moved[3], base[3])


def test_deepstack_count_is_checked() -> None:
    cfg = make_cfg(num_deepstack_features=2)
    w = ToyWeights.generate(cfg)
    x = embeds_for(cfg, [1, 2])
    with pytest.raises(ValueError, match="num_deepstack_features=2"):
        reference_forward(w, cfg, x)
    with pytest.raises(ValueError, match="num_deepstack_features=2"):
        reference_forward(w, cfg, x, deepstack=[np.zeros((2, 32))])
    with pytest.raises(ValueError, match="num_deepstack_features is 0"):
        reference_forward(w, make_cfg(), x, deepstack=[np.zeros((2, 32))])


def test_draft_inputs_change_outputs() -> None:
    cfg = draft_cfg()
    w = ToyWeights.generate(cfg)
    rng = np.random.default_rng(4)
    x = embeds_for(cfg, [1, 2, 3])
    hin = rng.standard_normal((3, 48)).astype(np.float32)
    hfd = rng.standard_normal((3, 32)).astype(np.float32)
    base = reference_forward(w, cfg, x, hidden_input=hin, hidden_from_draft=hfd)
    assert base[0].shape == (3, 32) and base[1].shape == (3, 64)
    for changed in (
        reference_forward(w, cfg, x, hidden_input=hin + 1, hidden_from_draft=hfd),
        reference_forward(w, cfg, x, hidden_input=hin, hidden_from_draft=hfd + 1),
        reference_forward(w, cfg, embeds_for(cfg, [4, 5, 6]), hidden_input=hin, hidden_from_draft=hfd),
    ):
        assert not np.allclose(changed[1], base[1])
    # x0 = embeds @ we + hidden_input @ wh + hidden_from_draft @ wd: zero inputs make a zero stream
    zero = reference_forward(w, cfg, np.zeros((3, 32)), hidden_input=np.zeros((3, 48)),
                             hidden_from_draft=np.zeros((3, 32)))
    np.testing.assert_array_equal(zero[0], 0.0)


def test_draft_inputs_are_required_and_only_for_drafts() -> None:
    cfg = draft_cfg()
    w = ToyWeights.generate(cfg)
    x = embeds_for(cfg, [1, 2])
    with pytest.raises(ValueError, match="hidden_input and hidden_from_draft"):
        reference_forward(w, cfg, x, hidden_input=np.zeros((2, 48)))
    with pytest.raises(ValueError, match="hidden_input has shape"):
        reference_forward(w, cfg, x, hidden_input=np.zeros((2, 32)), hidden_from_draft=np.zeros((2, 32)))
    llm = make_cfg()
    with pytest.raises(ValueError, match="draft models only"):
        reference_forward(ToyWeights.generate(llm), llm, x, hidden_input=np.zeros((2, 48)))


def test_tree_visibility_matches_linear_paths() -> None:
    """A verify tree computed with ``visible`` equals each root-to-node path run linearly."""
    cfg = make_cfg()
    w = ToyWeights.generate(cfg)
    prefix = [10, 11, 12]
    # tree nodes after the prefix: a (root), b (sibling of a), c (child of a)
    a, b, c = 20, 21, 22
    tokens = prefix + [a, b, c]
    n = len(prefix)
    visible = np.zeros((6, 6), dtype=bool)
    visible[:n, :n] = np.tril(np.ones((n, n), dtype=bool))
    visible[n:, :n] = True
    visible[n, n] = True  # a sees a
    visible[n + 1, n + 1] = True  # b sees b
    visible[n + 2, [n, n + 2]] = True  # c sees a and c
    positions = [0, 1, 2, 3, 3, 4]
    tree = reference_forward(w, cfg, embeds_for(cfg, tokens), positions=positions, visible=visible)[1]
    path_ac = reference_forward(w, cfg, embeds_for(cfg, prefix + [a, c]))[1]
    path_b = reference_forward(w, cfg, embeds_for(cfg, prefix + [b]))[1]
    np.testing.assert_allclose(tree[n], path_ac[n], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tree[n + 2], path_ac[n + 1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tree[n + 1], path_b[n], rtol=1e-5, atol=1e-5)


def test_a_token_that_sees_nothing_gets_zero_attention() -> None:
    cfg = make_cfg(num_attention_layers=1)
    w = ToyWeights.generate(cfg)
    x = embeds_for(cfg, [1, 2, 3])
    visible = np.tril(np.ones((3, 3), dtype=bool))
    visible[1] = False
    hidden = reference_forward(w, cfg, x, visible=visible)[0]
    x1 = x[1]
    expected = x1 + np.maximum(x1 @ w.w1[0], 0) @ w.w2[0]
    np.testing.assert_allclose(hidden[1], expected, rtol=1e-6, atol=1e-6)
    assert np.all(np.isfinite(hidden))


def test_forward_checks_shapes() -> None:
    cfg = make_cfg()
    w = ToyWeights.generate(cfg)
    with pytest.raises(ValueError, match="embeds"):
        reference_forward(w, cfg, np.zeros((3, 31)))
    with pytest.raises(ValueError, match="embeds must be"):
        reference_forward(w, cfg, np.zeros((1, 3, 32)))
    with pytest.raises(ValueError, match="positions"):
        reference_forward(w, cfg, np.zeros((3, 32)), positions=[0, 1])
    with pytest.raises(ValueError, match="visible"):
        reference_forward(w, cfg, np.zeros((3, 32)), visible=np.ones((2, 2), bool))
