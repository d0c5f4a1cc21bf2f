"""trtio.testing.toy_runtime: the generation loops' parts, and what trtio.testing exports of them."""

from __future__ import annotations

import numpy as np
import pytest

import trtio.testing
from trtio.testing import toy_runtime
from trtio.testing.toy_runtime import CandidateTree, SpecStats, expand_level


def test_trtio_testing_exports_the_loops_and_their_parts() -> None:
    for name in ("greedy_generate", "spec_generate", "embed_batch", "expand_level", "CandidateTree", "SpecStats"):
        assert name in trtio.testing.__all__
        assert getattr(trtio.testing, name) is getattr(toy_runtime, name)
    assert not hasattr(toy_runtime, "DraftTree")  # one DraftTree in trtio (trtio._ops); this one is a candidate tree


def test_spec_stats_rates() -> None:
    """3 rounds of 2 sequences, 3 levels and top-2 trees (6 nodes a round): 9 tokens accepted."""
    stats = SpecStats(rounds=3, proposed=3 * 2 * 6, accepted=9, accepted_per_sequence=[5, 4], levels=3)
    assert stats.accepted_per_verify == pytest.approx(1.5)
    assert stats.acceptance_rate == pytest.approx(0.5)
    assert stats.node_acceptance_rate == pytest.approx(0.25)
    assert stats.tokens_per_verify == pytest.approx(2.5)
    assert SpecStats().acceptance_rate == SpecStats().node_acceptance_rate == 0.0


def test_candidate_tree_levels_and_the_verify_selection() -> None:
    """expand_level keeps the top_k children over the whole level by cumulative log-probability; select keeps
    the best nodes whose ancestors are all selected, in tree order."""
    trees = [CandidateTree()]
    logp = np.log(np.array([[[0.5, 0.3, 0.2]]]))
    level = expand_level(trees, [[-1]], logp, 2)
    assert level == [[0, 1]] and trees[0].tokens == [0, 1] and trees[0].parents == [-1, -1]
    children = np.log(np.array([[[0.1, 0.1, 0.8], [0.9, 0.05, 0.05]]]))
    level = expand_level(trees, level, children, 2, token_map=np.array([10, 11, 12]))
    # the best two over both parents: 0.5 x 0.8 = 0.4 (token 12 under node 0), 0.3 x 0.9 = 0.27 (token 10 under 1)
    assert level == [[2, 3]] and trees[0].tokens[2:] == [12, 10] and trees[0].parents[2:] == [0, 1]
    np.testing.assert_allclose(np.exp(trees[0].scores), [0.5, 0.3, 0.4, 0.27])
    assert trees[0].select(2) == [0, 2]  # 0.5, then 0.4 (its parent chosen); 0.3 is third
    assert trees[0].select(3) == [0, 1, 2]
    tree = CandidateTree()
    tree.add(5, -1, -2.0)
    tree.add(6, 0, -0.5)  # scores better than its parent: still needs the parent first
    assert tree.select(1) == [0]
