"""Tests for trtio._trees: packed tree masks and their companion inputs.

The packing is checked against a slow pure-Python reference written straight from Edge-LLM's
kernel (``mask |= 1 << (i % 32)`` over explicit loops), not against a second numpy version.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trtio._trees import (
    CAUSAL_MASK_TRAILING_DIMS,
    EDGE_LLM_MAX_TREE_SIZE,
    ancestor_mask,
    causal_mask_shape,
    chain_mask,
    pack_tree_mask,
    tree_context_lengths,
    tree_last_token_ids,
    tree_position_ids,
    unpack_tree_mask,
    validate_tree_mask,
)
from trtio.errors import ShapeError

EXPLICIT_SIZES = [1, 31, 32, 33, 128]


# -- slow references ---------------------------------------------------------------------------


def reference_pack(mask: np.ndarray) -> np.ndarray:
    batch, num_nodes, _ = mask.shape
    words = (num_nodes + 31) // 32
    out = []
    for b in range(batch):
        rows = []
        for t in range(num_nodes):
            row = [0] * words
            for i in range(num_nodes):
                if mask[b, t, i] != 0:
                    row[i // 32] |= 1 << (i % 32)
            # Two's complement: a word with bit 31 set reads negative as int32.
            rows.append([w - (1 << 32) if w >= (1 << 31) else w for w in row])
        out.append(rows)
    return np.array(out, dtype=np.int32).reshape(batch, num_nodes, words)


def reference_unpack(packed: np.ndarray, num_nodes: int) -> np.ndarray:
    batch = packed.shape[0]
    out = np.zeros((batch, num_nodes, num_nodes), dtype=bool)
    for b in range(batch):
        for t in range(num_nodes):
            for i in range(num_nodes):
                word = int(packed[b, t, i // 32]) & 0xFFFFFFFF
                out[b, t, i] = bool((word >> (i % 32)) & 1)
    return out


def reference_ancestors(parents: list[int]) -> np.ndarray:
    num_nodes = len(parents)
    out = np.zeros((num_nodes, num_nodes), dtype=bool)
    for t in range(num_nodes):
        node = t
        while node != -1:
            out[t, node] = True
            node = parents[node]
    return out


def reference_depth(parents: list[int], node: int) -> int:
    depth = 0
    while parents[node] != -1:
        node = parents[node]
        depth += 1
    return depth


def random_mask(rng: np.random.Generator, batch: int, num_nodes: int, density: float) -> np.ndarray:
    return rng.random((batch, num_nodes, num_nodes)) < density


def random_parents(rng: np.random.Generator, num_nodes: int) -> list[int]:
    # Mostly single-root trees; now and then an extra root.
    parents = [-1]
    for i in range(1, num_nodes):
        parents.append(-1 if rng.random() < 0.05 else int(rng.integers(0, i)))
    return parents


def padded_tree_batch(trees: list[list[int]], padded_size: int) -> np.ndarray:
    mask = np.zeros((len(trees), padded_size, padded_size), dtype=bool)
    for b, parents in enumerate(trees):
        n = len(parents)
        mask[b, :n, :n] = ancestor_mask(parents)
    return mask


# -- pack / unpack -----------------------------------------------------------------------------


@pytest.mark.parametrize("num_nodes", EXPLICIT_SIZES)
@pytest.mark.parametrize("density", [0.0, 0.3, 0.7, 1.0])
def test_pack_matches_reference_at_word_boundaries(num_nodes: int, density: float) -> None:
    rng = np.random.default_rng(num_nodes * 1000 + int(density * 10))
    mask = random_mask(rng, 2, num_nodes, density)
    packed = pack_tree_mask(mask)
    assert packed.dtype == np.int32
    assert packed.shape == (2, num_nodes, (num_nodes + 31) // 32)
    assert packed.flags.c_contiguous
    np.testing.assert_array_equal(packed, reference_pack(mask))


@settings(max_examples=60, deadline=None)
@given(
    num_nodes=st.integers(1, 160),
    batch=st.integers(1, 3),
    density=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_pack_matches_reference_for_random_masks(
    num_nodes: int, batch: int, density: float, seed: int
) -> None:
    mask = random_mask(np.random.default_rng(seed), batch, num_nodes, density)
    np.testing.assert_array_equal(pack_tree_mask(mask), reference_pack(mask))


@settings(max_examples=60, deadline=None)
@given(
    num_nodes=st.integers(1, 160),
    batch=st.integers(1, 3),
    density=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_unpack_inverts_pack(num_nodes: int, batch: int, density: float, seed: int) -> None:
    mask = random_mask(np.random.default_rng(seed), batch, num_nodes, density)
    unpacked = unpack_tree_mask(pack_tree_mask(mask), num_nodes)
    assert unpacked.dtype == np.bool_
    np.testing.assert_array_equal(unpacked, mask)


@settings(max_examples=40, deadline=None)
@given(num_nodes=st.integers(1, 160), seed=st.integers(0, 2**32 - 1))
def test_pack_inverts_unpack_for_random_words(num_nodes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    words = (num_nodes + 31) // 32
    raw = rng.integers(0, 2**32, size=(2, num_nodes, words), dtype=np.uint64)
    # Clear the bits of nodes >= num_nodes in the last word: they are not part of the layout.
    tail = num_nodes - 32 * (words - 1)
    raw[:, :, -1] &= (1 << tail) - 1
    packed = raw.astype(np.uint32).view(np.int32)
    unpacked = unpack_tree_mask(packed, num_nodes)
    np.testing.assert_array_equal(unpacked, reference_unpack(packed, num_nodes))
    np.testing.assert_array_equal(pack_tree_mask(unpacked), packed)


def test_pack_of_a_chain_has_the_causal_words() -> None:
    packed = pack_tree_mask(chain_mask(3)[np.newaxis])
    np.testing.assert_array_equal(packed[0, :, 0], [0b1, 0b11, 0b111])


@pytest.mark.parametrize("bit", [31, 63, 95, 127, 159])
def test_bit_31_of_a_word_reads_negative_and_round_trips(bit: int) -> None:
    num_nodes = bit + 1
    mask = np.zeros((1, num_nodes, num_nodes), dtype=bool)
    mask[0, bit, bit] = True
    packed = pack_tree_mask(mask)
    assert packed[0, bit, bit // 32] == -(2**31)
    others = np.ones(packed.shape, dtype=bool)
    others[0, bit, bit // 32] = False
    assert not packed[others].any()
    np.testing.assert_array_equal(unpack_tree_mask(packed, num_nodes), mask)


def test_full_rows_pack_to_minus_one() -> None:
    packed = pack_tree_mask(np.ones((1, 64, 64), dtype=bool))
    np.testing.assert_array_equal(packed, np.full((1, 64, 2), -1, dtype=np.int32))


def test_pack_treats_any_nonzero_integer_as_set() -> None:
    mask = np.array([[[5, 0], [-1, 1]]], dtype=np.int8)
    np.testing.assert_array_equal(pack_tree_mask(mask)[0, :, 0], [0b01, 0b11])


def test_pack_accepts_nested_lists() -> None:
    np.testing.assert_array_equal(pack_tree_mask([[[1, 0], [1, 1]]]), [[[1], [3]]])


def test_pack_goes_beyond_edge_llm_limit() -> None:
    num_nodes = EDGE_LLM_MAX_TREE_SIZE + 1
    mask = chain_mask(num_nodes)[np.newaxis]
    packed = pack_tree_mask(mask)
    assert packed.shape == (1, num_nodes, 5)
    # The last row sees every node: four full words and bit 0 of the fifth.
    np.testing.assert_array_equal(packed[0, -1], [-1, -1, -1, -1, 1])


def test_unpack_accepts_uint32_words_as_well_as_int32() -> None:
    mask = random_mask(np.random.default_rng(7), 2, 40, 0.5)
    packed = pack_tree_mask(mask)
    np.testing.assert_array_equal(unpack_tree_mask(packed.view(np.uint32), 40), mask)
    np.testing.assert_array_equal(unpack_tree_mask(packed.astype(np.int64), 40), mask)


# -- ancestor and chain masks ------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(num_nodes=st.integers(1, 160), seed=st.integers(0, 2**32 - 1))
def test_ancestor_mask_matches_parent_walk(num_nodes: int, seed: int) -> None:
    parents = random_parents(np.random.default_rng(seed), num_nodes)
    mask = ancestor_mask(parents)
    assert mask.dtype == np.bool_
    np.testing.assert_array_equal(mask, reference_ancestors(parents))
    validate_tree_mask(mask[np.newaxis])


def test_ancestor_mask_of_a_small_tree() -> None:
    #      0
    #     / \
    #    1   2
    #    |
    #    3
    expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=bool)
    np.testing.assert_array_equal(ancestor_mask([-1, 0, 0, 1]), expected)


@pytest.mark.parametrize("n", [1, 2, 33])
def test_chain_mask_is_lower_triangular_and_equals_a_chain_tree(n: int) -> None:
    mask = chain_mask(n)
    np.testing.assert_array_equal(mask, np.tril(np.ones((n, n), dtype=bool)))
    np.testing.assert_array_equal(mask, ancestor_mask([-1, *range(n - 1)]))


# -- position ids, context lengths, last token ids ---------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    padded_size=st.integers(1, 160),
    batch=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_position_ids_are_kv_length_plus_depth(padded_size: int, batch: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(1, padded_size + 1)) for _ in range(batch)]
    trees = [random_parents(rng, n) for n in sizes]
    kv = rng.integers(0, 10_000, size=batch)
    positions = tree_position_ids(padded_tree_batch(trees, padded_size), kv)
    assert positions.dtype == np.int32
    assert positions.shape == (batch, padded_size)
    for b, parents in enumerate(trees):
        for t in range(padded_size):
            expected = kv[b] + reference_depth(parents, t) if t < len(parents) else 0
            assert positions[b, t] == expected, (b, t)


def test_position_ids_of_a_chain_count_up_from_kv_length() -> None:
    mask = np.stack([chain_mask(5), chain_mask(5)])
    np.testing.assert_array_equal(
        tree_position_ids(mask, [0, 12]), [[0, 1, 2, 3, 4], [12, 13, 14, 15, 16]]
    )


def test_padding_rows_get_position_zero() -> None:
    mask = np.zeros((1, 4, 4), dtype=bool)
    mask[0, :2, :2] = chain_mask(2)
    np.testing.assert_array_equal(tree_position_ids(mask, [30]), [[30, 31, 0, 0]])


def test_context_lengths_add_the_padded_tree_size() -> None:
    lengths = tree_context_lengths(np.array([0, 7, 100]), 16)
    assert lengths.dtype == np.int32
    np.testing.assert_array_equal(lengths, [16, 23, 116])


def test_last_token_ids_select_the_last_nodes_of_each_tree() -> None:
    ids = tree_last_token_ids([10, 4], 3)
    assert ids.dtype == np.int64
    np.testing.assert_array_equal(ids, [[7, 8, 9], [1, 2, 3]])


def test_last_token_ids_with_select_len_equal_to_tree_size_select_every_node() -> None:
    np.testing.assert_array_equal(tree_last_token_ids([5, 5], 5), [list(range(5))] * 2)


def test_causal_mask_shape_is_batch_by_one_by_one() -> None:
    assert causal_mask_shape(4) == (4, 1, 1)
    assert CAUSAL_MASK_TRAILING_DIMS == (1, 1)


# -- validate_tree_mask ------------------------------------------------------------------------


def test_validate_accepts_padded_trees() -> None:
    validate_tree_mask(padded_tree_batch([[-1, 0, 0], [-1]], 4))


def test_validate_names_the_first_row_that_sees_a_later_node() -> None:
    mask = np.stack([chain_mask(4), chain_mask(4)])
    mask[1, 2, 3] = True
    mask[1, 3, 0] = False
    with pytest.raises(ShapeError, match=r"unpacked: row \(b=1, t=2\) sees later node i=3"):
        validate_tree_mask(mask)


def test_validate_names_a_real_row_that_does_not_see_itself() -> None:
    mask = np.stack([chain_mask(4)])
    mask[0, 2, 2] = False
    with pytest.raises(ShapeError, match=r"unpacked: row \(b=0, t=2\) does not see itself"):
        validate_tree_mask(mask)


def test_validate_rejects_a_bad_shape() -> None:
    with pytest.raises(ShapeError, match="unpacked"):
        validate_tree_mask(np.ones((3, 3), dtype=bool))


# -- error paths -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 4), (1, 1, 4, 4), (4,)])
def test_pack_rejects_a_wrong_rank(shape: tuple[int, ...]) -> None:
    with pytest.raises(ShapeError, match=r"unpacked: expected a \[B, N, N\] mask"):
        pack_tree_mask(np.ones(shape, dtype=bool))


def test_pack_rejects_a_non_square_mask() -> None:
    with pytest.raises(ShapeError, match="unpacked: expected a square"):
        pack_tree_mask(np.ones((1, 4, 5), dtype=bool))


def test_pack_rejects_zero_nodes() -> None:
    with pytest.raises(ShapeError, match=r"unpacked: expected at least one node"):
        pack_tree_mask(np.ones((1, 0, 0), dtype=bool))


def test_pack_rejects_a_float_mask() -> None:
    with pytest.raises(ShapeError, match="unpacked: expected a bool or integer mask"):
        pack_tree_mask(np.ones((1, 2, 2), dtype=np.float32))


def test_unpack_rejects_a_wrong_rank() -> None:
    with pytest.raises(ShapeError, match=r"packed: expected a \[B, N, W\] array"):
        unpack_tree_mask(np.zeros((4, 1), dtype=np.int32), 4)


@pytest.mark.parametrize("num_nodes, words", [(32, 2), (33, 1), (128, 5)])
def test_unpack_rejects_a_word_count_mismatch(num_nodes: int, words: int) -> None:
    packed = np.zeros((1, num_nodes, words), dtype=np.int32)
    with pytest.raises(ShapeError, match=rf"packed: expected shape \[B, {num_nodes}, "):
        unpack_tree_mask(packed, num_nodes)


def test_unpack_rejects_a_row_count_mismatch() -> None:
    with pytest.raises(ShapeError, match=r"packed: expected shape \[B, 5, 1\]"):
        unpack_tree_mask(np.zeros((1, 4, 1), dtype=np.int32), 5)


@pytest.mark.parametrize("num_nodes", [0, -3, 2.0, True])
def test_unpack_rejects_a_bad_num_nodes(num_nodes: object) -> None:
    with pytest.raises(ShapeError, match="num_nodes: expected an integer >= 1"):
        unpack_tree_mask(np.zeros((1, 1, 1), dtype=np.int32), num_nodes)  # type: ignore[arg-type]


def test_unpack_rejects_bits_beyond_num_nodes() -> None:
    packed = np.zeros((1, 3, 1), dtype=np.int32)
    packed[0, 1, 0] = 1 << 3
    with pytest.raises(ShapeError, match=r"packed: row \(b=0, t=1\) has bit 3 set"):
        unpack_tree_mask(packed, 3)


def test_unpack_rejects_values_wider_than_32_bits() -> None:
    with pytest.raises(ShapeError, match="packed: values must fit 32 bits"):
        unpack_tree_mask(np.full((1, 1, 1), 2**32, dtype=np.int64), 1)


def test_unpack_rejects_float_words() -> None:
    with pytest.raises(ShapeError, match="packed: expected an integer array"):
        unpack_tree_mask(np.zeros((1, 1, 1), dtype=np.float32), 1)


def test_position_ids_reject_negative_kv_lengths() -> None:
    message = r"kv_lengths: expected values >= 0, got kv_lengths\[1\] = -2"
    with pytest.raises(ShapeError, match=message):
        tree_position_ids(np.stack([chain_mask(2)] * 2), [0, -2])


def test_position_ids_reject_a_kv_lengths_batch_mismatch() -> None:
    with pytest.raises(ShapeError, match="kv_lengths: expected 2 entries"):
        tree_position_ids(np.stack([chain_mask(2)] * 2), [0, 1, 2])


def test_position_ids_reject_kv_lengths_of_the_wrong_rank() -> None:
    with pytest.raises(ShapeError, match=r"kv_lengths: expected a \[B\] array"):
        tree_position_ids(chain_mask(2)[np.newaxis], [[0]])


def test_position_ids_reject_a_wrong_mask_rank() -> None:
    with pytest.raises(ShapeError, match="unpacked"):
        tree_position_ids(chain_mask(2), [0, 0])


def test_position_ids_reject_positions_beyond_int32() -> None:
    with pytest.raises(ShapeError, match="kv_lengths.*does not fit int32"):
        tree_position_ids(chain_mask(2)[np.newaxis], [2**31 - 1])


def test_context_lengths_reject_negative_kv_lengths() -> None:
    message = r"kv_lengths: expected values >= 0, got kv_lengths\[0\] = -1"
    with pytest.raises(ShapeError, match=message):
        tree_context_lengths([-1, 3], 8)


@pytest.mark.parametrize("padded", [0, -1, 4.0])
def test_context_lengths_reject_a_bad_padded_tree_size(padded: object) -> None:
    with pytest.raises(ShapeError, match="padded_tree_size: expected an integer >= 1"):
        tree_context_lengths([1], padded)  # type: ignore[arg-type]


def test_context_lengths_reject_float_kv_lengths() -> None:
    with pytest.raises(ShapeError, match="kv_lengths: expected an integer array"):
        tree_context_lengths(np.array([1.0]), 4)


def test_last_token_ids_reject_select_len_larger_than_a_tree() -> None:
    with pytest.raises(ShapeError, match=r"select_len: 4 is larger than tree_sizes\[1\] = 3"):
        tree_last_token_ids([8, 3], 4)


def test_last_token_ids_reject_a_bad_select_len() -> None:
    with pytest.raises(ShapeError, match="select_len: expected an integer >= 1"):
        tree_last_token_ids([8], 0)


def test_last_token_ids_reject_negative_tree_sizes() -> None:
    with pytest.raises(ShapeError, match=r"tree_sizes: expected values >= 0"):
        tree_last_token_ids([4, -1], 1)


@pytest.mark.parametrize("parents", [[-1, 1], [-1, 0, 3, 1]])
def test_ancestor_mask_rejects_a_parent_that_is_not_earlier(parents: list[int]) -> None:
    message = r"parents: parents\[\d\] = \d, but a parent must come before"
    with pytest.raises(ShapeError, match=message):
        ancestor_mask(parents)


def test_ancestor_mask_rejects_a_root_that_is_its_own_parent() -> None:
    with pytest.raises(ShapeError, match=r"parents: parents\[0\] = 0"):
        ancestor_mask([0])


def test_ancestor_mask_rejects_a_parent_below_minus_one() -> None:
    with pytest.raises(ShapeError, match=r"parents: parents\[2\] = -2; use -1 for a root"):
        ancestor_mask([-1, 0, -2])


@pytest.mark.parametrize("parents", [[], [[-1, 0]]])
def test_ancestor_mask_rejects_a_bad_shape(parents: list) -> None:
    with pytest.raises(ShapeError, match="parents: expected"):
        ancestor_mask(np.asarray(parents, dtype=np.int64))


def test_ancestor_mask_rejects_float_parents() -> None:
    with pytest.raises(ShapeError, match="parents: expected an integer array"):
        ancestor_mask([-1.0, 0.0])


@pytest.mark.parametrize("batch", [0, -1, True, 2.5])
def test_causal_mask_shape_rejects_a_bad_batch(batch: object) -> None:
    with pytest.raises(ShapeError, match="batch: expected an integer >= 1"):
        causal_mask_shape(batch)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [0, -4])
def test_chain_mask_rejects_a_bad_size(n: int) -> None:
    with pytest.raises(ShapeError, match="n: expected an integer >= 1"):
        chain_mask(n)


def test_shape_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        chain_mask(0)


# -- the device-writing path ------------------------------------------------------------------

def test_write_tree_inputs_stages_everything_into_pipeline_io():
    from _configs import bundle

    from trtio._pipeline_io import PipelineIO
    from trtio._trees import ancestor_mask, write_tree_inputs

    b = bundle()
    io = PipelineIO.create_for_spec_decode(b, backend="host")
    tree = ancestor_mask([-1, 0, 0, 1, 1])  # a root with two children, the first with two children
    unpacked = np.stack([tree, tree])
    staged = write_tree_inputs(io, unpacked, [10, 3])
    assert io.packed_attention_mask.shape == (2, 5, 1)
    np.testing.assert_array_equal(io.packed_attention_mask.to_numpy(), pack_tree_mask(unpacked))
    assert io.spec_decode_position_ids.to_numpy().tolist() == [[10, 11, 11, 12, 12], [3, 4, 4, 5, 5]]
    assert io.context_lengths.to_numpy().tolist() == [15, 8]
    assert io.select_token_indices.to_numpy().tolist() == [[0, 1, 2, 3, 4]] * 2
    assert staged.last_token_ids.dtype == np.int64
    write_tree_inputs(io, unpacked, [10, 3], select_len=2)
    assert io.select_token_indices.to_numpy().tolist() == [[3, 4]] * 2
    with pytest.raises(ShapeError, match="kv_lengths"):
        write_tree_inputs(io, unpacked, [1, 2, 3])
    io.close()
