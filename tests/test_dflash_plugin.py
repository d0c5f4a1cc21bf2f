"""The numpy model of Edge-LLM's ``DFlashTargetKVCacheUpdate`` on its own: each real delta row lands, K rotated by its
own RoPE row and V as given, at its position through its sequence's page-table row; padding rows (-1 in both) write
nothing; and what the kernel would skip silently (a row half padding, a column past the table, a page id outside its
plane, a sequence past the batch) is refused. Its agreement with Hugging Face is ``tests/test_parity_dflash.py``'s."""

from __future__ import annotations

import numpy as np
import pytest

from trtio.testing.edgellm_plugins._common import PluginInputError
from trtio.testing.edgellm_plugins.dflash import dflash_target_kv_cache_update

RNG = np.random.default_rng(3)
PAGES, HEADS, D, ROT = 4, 2, 16, 8


def _inputs(positions: list[int], owners: list[int], table: np.ndarray) -> tuple[np.ndarray, ...]:
    n = len(positions)
    k = RNG.standard_normal((n, HEADS, D)).astype(np.float16)
    v = RNG.standard_normal((n, HEADS, D)).astype(np.float16)
    angle = np.array(positions, np.float64)[:, None] * (1.0 / 10000 ** (np.arange(0, ROT, 2) / ROT))[None]
    rope = np.concatenate([np.cos(angle), np.sin(angle)], axis=1).astype(np.float32)
    pool = np.zeros((2, PAGES, 128, HEADS, D), np.float16)
    return (k, v, pool, rope, np.array(positions, np.int32), np.array(owners, np.int32), table)


TABLE = np.array([[[2, 0], [6, 4]], [[1, 3], [5, 7]]], np.int32)  # [B=2, 2, M=2]: K ids in [0, 4), V in [4, 8)


def test_real_rows_land_rotated_at_their_positions_and_padding_rows_nowhere() -> None:
    inputs = _inputs([5, 130, -1, 0, 129, -1], [0, 0, -1, 1, 1, -1], TABLE)
    k, v, pool, rope = inputs[:4]
    (present,) = dflash_target_kv_cache_update("n", inputs, {})
    assert present is pool
    flat = pool.reshape(2 * PAGES * 128, HEADS, D)
    half = ROT // 2
    for row, (pos, b) in enumerate([(5, 0), (130, 0), (0, 1), (129, 1)]):
        k_page, v_page = TABLE[b, 0, pos // 128], TABLE[b, 1, pos // 128]
        got_k, got_v = flat[k_page * 128 + pos % 128], flat[v_page * 128 + pos % 128]
        src = [0, 1, 3, 4][row]
        kf, cos, sin = k[src].astype(np.float32), rope[src, :half], rope[src, half:]
        want = kf.copy()
        want[:, :half] = kf[:, :half] * cos - kf[:, half:ROT] * sin
        want[:, half:ROT] = kf[:, :half] * sin + kf[:, half:ROT] * cos
        np.testing.assert_array_equal(got_k, want.astype(np.float16))
        np.testing.assert_array_equal(got_v, v[src])
    assert np.count_nonzero(np.abs(flat).sum(axis=(1, 2))) == 8  # four K and four V rows, nothing for padding


@pytest.mark.parametrize(("what", "positions", "owners", "table"), [
    ("a row padding in one of the two", [3, -1], [0, 0], TABLE),
    ("a sequence past the batch", [3, 4], [0, 2], TABLE),
    ("a position on a column past the table", [3, 300], [0, 1], TABLE),
    ("a K page id outside its plane", [3, 4], [0, 1], np.where(TABLE == 1, 4, TABLE).astype(np.int32)),
    ("a V page id outside its plane", [3, 4], [0, 1], np.where(TABLE == 5, 3, TABLE).astype(np.int32)),
])
def test_refuses_what_the_kernel_would_skip(what: str, positions: list[int], owners: list[int],
                                            table: np.ndarray) -> None:
    with pytest.raises(PluginInputError):
        dflash_target_kv_cache_update("n", _inputs(positions, owners, table), {})


def test_refuses_a_table_wider_than_the_pool() -> None:
    table = np.zeros((1, 2, PAGES + 1), np.int32)
    with pytest.raises(PluginInputError, match="M <="):
        dflash_target_kv_cache_update("n", _inputs([0], [0], table), {})
