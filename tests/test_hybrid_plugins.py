"""The numpy models of Edge-LLM's hybrid plugins (``causal_conv1d``, ``gated_delta_net``, ``update_ssm_state``) on
their own: a prompt run whole, in chunks or token by token leaves the same outputs and state row; each sequence
touches only its ``state_indices`` row, and no other; padding rows output zero and leave the state; and the inputs the
C++ refuses or its kernels would mishandle are refused. Their agreement with Hugging Face is
``tests/test_parity_hybrid.py``'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from trtio.testing.edgellm_plugins._common import PluginInputError
from trtio.testing.edgellm_plugins.conv1d import causal_conv1d
from trtio.testing.edgellm_plugins.gdn import gated_delta_net
from trtio.testing.edgellm_plugins.mamba import update_ssm_state

RNG = np.random.default_rng(7)
ROWS = 3


def _h(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (scale * RNG.standard_normal(shape)).astype(np.float16)


def _ragged(lengths: list[int], width: int, rows: list[int], phase: int) -> tuple[np.ndarray, ...]:
    n = len(lengths)
    return (np.array(lengths, np.int32), np.arange(n + 1, dtype=np.int32) * width, np.array(rows, np.int32),
            np.zeros(phase, np.int32), np.zeros(n if phase in (1, 2) else 0, np.int32))


class Conv:
    dim, k = 16, 4
    weight, bias = _h(16, 1, 4), _h(16)

    def pool(self) -> np.ndarray:
        return np.zeros((ROWS, self.dim, self.k), np.float16)

    def tokens(self, n: int) -> dict[str, np.ndarray]:
        return {"x": _h(n, self.dim)}

    def raw(self, pool: np.ndarray, t: dict[str, np.ndarray], lengths: list[int], rows: list[int], phase: int,
            **attrs: Any) -> tuple[np.ndarray, ...]:
        inputs = (t["x"], self.weight, self.bias, pool, *_ragged(lengths, t["x"].shape[0] // len(lengths), rows,
                                                                 phase))
        return causal_conv1d("n", inputs, {"padding": self.k - 1, "groups": self.dim, **attrs})

    def run(self, pool: np.ndarray, t: dict[str, np.ndarray], lengths: list[int], rows: list[int], phase: int,
            **attrs: Any) -> np.ndarray:
        out, present = self.raw(pool, t, lengths, rows, phase, **attrs)
        assert present is pool
        return out


class GDN:
    h, hv, d = 1, 2, 128

    def pool(self) -> np.ndarray:
        return np.zeros((ROWS, self.hv, self.d, self.d), np.float32)

    def tokens(self, n: int) -> dict[str, np.ndarray]:
        return {"q": _h(n, self.h, self.d), "k": _h(n, self.h, self.d), "v": _h(n, self.hv, self.d),
                "a": _h(n, self.hv), "b": _h(n, self.hv)}

    def raw(self, pool: np.ndarray, t: dict[str, np.ndarray], lengths: list[int], rows: list[int], phase: int,
            **attrs: Any) -> tuple[np.ndarray, ...]:
        a_log, dt_bias = np.log(np.array([0.1, 0.3], np.float32)), np.array([-1.0, 0.5], np.float16)
        inputs = (t["q"], t["k"], t["v"], t["a"], t["b"], a_log, dt_bias, pool,
                  *_ragged(lengths, t["q"].shape[0] // len(lengths), rows, phase))
        return gated_delta_net("n", inputs, {"k_dim": self.d, "v_dim": self.d, **attrs})

    def run(self, pool: np.ndarray, t: dict[str, np.ndarray], lengths: list[int], rows: list[int], phase: int,
            **attrs: Any) -> np.ndarray:
        out, present = self.raw(pool, t, lengths, rows, phase, **attrs)
        assert present is pool
        return out


class Mamba:
    heads, groups, d, n = 2, 1, 64, 64
    dt_bias = _h(2)

    def pool(self) -> np.ndarray:
        return np.zeros((ROWS, self.heads, self.d, self.n), np.float16)

    def tokens(self, n: int) -> dict[str, np.ndarray]:
        return {"x": _h(n, self.heads, self.d), "b": _h(n, self.groups, self.n, scale=0.3),
                "c": _h(n, self.groups, self.n, scale=0.3), "dt": _h(n, self.heads)}

    def run(self, pool: np.ndarray, t: dict[str, np.ndarray], lengths: list[int], rows: list[int], phase: int,
            **attrs: Any) -> np.ndarray:
        a, d = np.array([-0.2, -0.05], np.float32), np.array([1.0, 0.5], np.float16)
        inputs = (t["x"], a, t["b"], t["c"], d, t["dt"], self.dt_bias, pool,
                  *_ragged(lengths, t["x"].shape[0] // len(lengths), rows, phase))
        out, present = update_ssm_state("n", inputs, {"dt_softplus": 1, "ngroups": self.groups, **attrs})
        assert present is pool
        return out


MODELS: list[Callable[[], Any]] = [Conv, GDN, Mamba]


def _slice(t: dict[str, np.ndarray], lo: int, hi: int) -> dict[str, np.ndarray]:
    return {k: v[lo:hi] for k, v in t.items()}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_whole_chunked_and_token_by_token_agree(model: Callable[[], Any]) -> None:
    m = model()
    t = m.tokens(10)
    whole, chunked, steps = m.pool(), m.pool(), m.pool()
    out_whole = m.run(whole, t, [10], [1], 1)
    out_chunks = np.concatenate([m.run(chunked, _slice(t, 0, 4), [4], [1], 1),
                                 m.run(chunked, _slice(t, 4, 10), [6], [1], 2)])
    out_steps = np.concatenate([m.run(steps, _slice(t, 0, 1), [1], [1], 1)]
                               + [m.run(steps, _slice(t, i, i + 1), [1], [1], 3) for i in range(1, 10)])
    # One fp16 rounding of the state a token (decode) against one a chunk: agree to fp16 resolution.
    np.testing.assert_allclose(out_chunks.astype(np.float32), out_whole.astype(np.float32), atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(out_steps.astype(np.float32), out_whole.astype(np.float32), atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(chunked[1].astype(np.float32), whole[1].astype(np.float32), atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(steps[1].astype(np.float32), whole[1].astype(np.float32), atol=2e-3, rtol=2e-3)
    assert not whole[[0, 2]].any() and whole[1].any()


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_each_sequence_reads_and_writes_its_row_only(model: Callable[[], Any]) -> None:
    """Two sequences in rows 2 and 0 give what each gives alone in its own row; row 1 keeps its bytes; a state
    already in a row is read as it is (nothing zeroes it)."""
    m = model()
    t = m.tokens(12)
    pool = m.pool()
    pool[1] = RNG.standard_normal(pool.shape[1:]).astype(pool.dtype)
    pool[2] = RNG.standard_normal(pool.shape[1:]).astype(pool.dtype)
    keep = pool.copy()
    together = m.run(pool, t, [6, 4], [2, 0], 1)
    alone_a, alone_b = keep.copy(), keep.copy()
    first = m.run(alone_a, _slice(t, 0, 6), [6], [2], 1)
    second = m.run(alone_b, _slice(t, 6, 12), [4], [0], 1)
    np.testing.assert_array_equal(together[:6], first)
    np.testing.assert_array_equal(together[6:], second)
    np.testing.assert_array_equal(pool[2], alone_a[2])
    np.testing.assert_array_equal(pool[0], alone_b[0])
    np.testing.assert_array_equal(pool[1], keep[1])
    fresh = m.pool()
    assert not np.array_equal(m.run(fresh, _slice(t, 0, 6), [6], [2], 1), first)  # the state in row 2 was read
    assert not together[10:].any()  # the second sequence's padding rows are zero


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@pytest.mark.parametrize(("bad", "rows", "phase"), [
    ("a row past the pool", [0, ROWS], 1), ("a negative row", [-1, 1], 1), ("one row twice", [1, 1], 1),
    ("verify without the engine's flag", [0, 1], 5), ("a diffusion phase", [0, 1], 6),
    ("decode of two rows a sequence", [0, 1], 3)])
def test_refuses(model: Callable[[], Any], bad: str, rows: list[int], phase: int) -> None:
    m = model()
    with pytest.raises(PluginInputError):
        m.run(m.pool(), m.tokens(4), [2, 2], rows, phase)


@pytest.mark.parametrize("model", [Conv, GDN], ids=lambda m: m.__name__)
def test_a_linear_verify_is_a_decode_from_a_copy_of_each_row(model: Callable[[], Any]) -> None:
    """The MTP verify (phase 5 on a node built with ``use_mtp``) of two sequences of W = 4 rows in pool rows 2 and 0:
    row t of sequence s outputs what decoding its rows one by one from its pool row gives, and the third output's
    row ``s * W + t`` holds the state after it; all W rows run whatever ``query_lengths`` says (the kernels read
    none); the pool is left as it was. The intermediate output is not written in other phases (NaN here)."""
    m = model()
    t = m.tokens(8)
    pool = m.pool()
    pool[[0, 2]] = RNG.standard_normal((2, *pool.shape[1:])).astype(pool.dtype)
    keep = pool.copy()
    out, present, states = m.raw(pool, t, [4, 2], [2, 0], 5, use_mtp=1)
    assert present is pool
    np.testing.assert_array_equal(pool, keep)
    for s, row in enumerate((2, 0)):
        steps = keep.copy()
        for i in range(4):
            j = s * 4 + i
            want = m.run(steps, _slice(t, j, j + 1), [1], [row], 3)
            np.testing.assert_allclose(out[j].astype(np.float32), want[0].astype(np.float32), atol=2e-3, rtol=2e-3)
            np.testing.assert_allclose(states[j].astype(np.float32), steps[row].astype(np.float32), atol=2e-3,
                                       rtol=2e-3)
    assert np.isnan(m.raw(m.pool(), t, [4, 4], [2, 0], 1, use_mtp=1)[2]).all()
    with pytest.raises(PluginInputError, match="seq_len"):
        m.raw(m.pool(), m.tokens(34), [17, 17], [2, 0], 5, use_mtp=1)


TREE = [-1, 0, 1, 0, 3, -1]  # a tree of W = 6: two branches 0-1-2 and 0-3-4, then a padding node
DEPTHS = [0, 1, 2, 1, 2, -1]


def _tree(m: Any, pool: np.ndarray, t: dict[str, np.ndarray], parents: list[int], depths: list[int],
          rows: list[int]) -> tuple[np.ndarray, ...]:
    """A DDTree verify (phase 5, ``use_ddtree``) of ``len(rows)`` sequences, each the tree ``parents``."""
    n = len(rows)
    extra = (np.array(parents * n, np.int32), np.array(depths * n, np.int32))
    if isinstance(m, Conv):
        inputs = (t["x"], m.weight, m.bias, pool, *_ragged([len(parents)] * n, len(parents), rows, 5), *extra)
        return causal_conv1d("n", inputs, {"padding": m.k - 1, "groups": m.dim, "use_ddtree": 1})
    a_log, dt_bias = np.log(np.array([0.1, 0.3], np.float32)), np.array([-1.0, 0.5], np.float16)
    inputs = (t["q"], t["k"], t["v"], t["a"], t["b"], a_log, dt_bias, pool,
              *_ragged([len(parents)] * n, len(parents), rows, 5), *extra)
    return gated_delta_net("n", inputs, {"k_dim": m.d, "v_dim": m.d, "use_ddtree": 1})


@pytest.mark.parametrize("model", [Conv, GDN], ids=lambda m: m.__name__)
def test_a_tree_verify_runs_each_node_along_its_root_path(model: Callable[[], Any]) -> None:
    """The DDTree verify (``use_ddtree``): each node outputs what the linear verify of its root path gives at its
    last row; a padding node outputs zero; the pool is left as it was; a parent that is not an earlier node is
    refused (the kernels would take the node for padding)."""
    m = model()
    t = m.tokens(12)
    pool = m.pool()
    pool[[0, 2]] = RNG.standard_normal((2, *pool.shape[1:])).astype(pool.dtype)
    keep = pool.copy()
    out, present, _third = _tree(m, pool, t, TREE, DEPTHS, [2, 0])
    assert present is pool
    np.testing.assert_array_equal(pool, keep)
    for s, row in enumerate((2, 0)):
        for node, path in ((1, [0, 1]), (2, [0, 1, 2]), (3, [0, 3]), (4, [0, 3, 4])):
            rows = [s * 6 + p for p in path]
            chain = m.raw(keep.copy(), {k: v[rows] for k, v in t.items()}, [len(rows)], [row], 5, use_mtp=1)[0]
            np.testing.assert_allclose(out[s * 6 + node].astype(np.float32), chain[-1].astype(np.float32),
                                       atol=2e-3, rtol=2e-3)
        assert not out[s * 6 + 5].any()
    with pytest.raises(PluginInputError, match="parent"):
        _tree(m, m.pool(), t, [-1, 0, 3, 0, 3, -1], DEPTHS, [2, 0])


def test_the_tree_verify_of_the_gdn_writes_a_replay_stash_not_states() -> None:
    """``gdnTreeChunkKernels.h``: the GDN's tree verify writes no per-node state; each sequence's intermediate row
    holds at its head a stash cell per node (L2-normalised k, the gate, beta, v), from which the runtime's commit
    advances the slot's state along the accepted path. Replaying the cells of path 0-3-4 from the pool row gives the
    state the linear verify of that path ends with."""
    g = GDN()
    t = g.tokens(6)
    pool = g.pool()
    pool[1] = RNG.standard_normal(pool.shape[1:]).astype(pool.dtype)
    _out, _pool, stash = _tree(g, pool, t, TREE, DEPTHS, [1])
    cells = stash.view(np.uint8).reshape(-1)
    from trtio.testing.edgellm_plugins.gdn import stash_layout

    g_at, beta_at, v_at, size = stash_layout(g.h, g.hv)
    state = pool[1].copy()
    for node in (0, 3, 4):
        cell = cells[node * size:(node + 1) * size]
        k = cell[:g_at].view(np.float32).reshape(g.h, g.d).repeat(g.hv // g.h, axis=0)
        gate, beta = cell[g_at:beta_at].view(np.float32), cell[beta_at:v_at].view(np.float32)
        v = cell[v_at:].view(np.float16).reshape(g.hv, g.d).astype(np.float32)
        state *= gate[:, None, None]
        new = (v - np.einsum("hkv,hk->hv", state, k)) * beta[:, None]
        state += k[:, :, None] * new[:, None, :]
    rows = [0, 3, 4]
    _o, _p, linear = g.raw(pool.copy(), {k: v[rows] for k, v in t.items()}, [3], [1], 5, use_mtp=1)
    np.testing.assert_allclose(state, linear[2], atol=1e-4, rtol=1e-4)
    assert np.isnan(stash[3:]).all()  # past the stash cells: the kernel's scratch (unspecified)


def test_unbuildable_sizes_are_refused() -> None:
    """The real plugins build the GDN only for heads of 128 and Mamba2 for head / state sizes 64, 80, 128, 256."""
    g = GDN()
    t = g.tokens(2)
    small = {k: (v[..., :64] if k in ("q", "k", "v") else v) for k, v in t.items()}
    with pytest.raises(PluginInputError, match="k_dim"):
        gated_delta_net("n", (small["q"], small["k"], small["v"], small["a"], small["b"], np.zeros(2, np.float32),
                              np.zeros(2, np.float16), np.zeros((ROWS, 2, 64, 64), np.float32),
                              *_ragged([2], 2, [0], 1)), {"k_dim": 64, "v_dim": 64})
    m = Mamba()
    t = m.tokens(2)
    with pytest.raises(PluginInputError, match="no kernel"):
        update_ssm_state("n", (t["x"][..., :32], np.zeros(2, np.float32), t["b"], t["c"], np.zeros(2, np.float16),
                               t["dt"], np.zeros(2, np.float16), np.zeros((ROWS, 2, 32, 64), np.float16),
                               *_ragged([2], 2, [0], 1)), {})
