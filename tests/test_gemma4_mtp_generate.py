"""``trtio generate --speculative`` on a Gemma 4 MTP pair's engine directory (the export of
``tests/fixtures/parity/gemma4-mtp`` laid out by ``tests/_gemma4_mtp_dir.py``, NVIDIA's real graphs as its engines),
and the DDTree its top-K > 1 rounds verify (``trtio.families.gemma4_mtp.ddtree``, Edge-LLM's ``ddtreeKernels.h``).

The generated tokens are the base's greedy ones: they must be Hugging Face's greedy continuation of the fixture's
prompt. The random assistant rarely guesses a token, so a second run makes its rounds' trees carry Hugging Face's
next tokens (an oracle in place of the draft's choices): rounds then accept several tokens, and what is emitted
must still be Hugging Face's continuation, token for token.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._gemma4_mtp_dir import mtp_directory, onnx_loader
from tests._parity import Case

pytest.importorskip("onnx")

from trtio._setups import engine_dir  # noqa: E402
from trtio._tools import generate as gen  # noqa: E402
from trtio.families.gemma4_mtp.ddtree import ddtree  # noqa: E402

CASE = Case("gemma4-mtp")
NEW = 10  # tokens generated: within the references' continuation (12)


def _generate(root: Path, seq: Any, top_k: int | None, monkeypatch: pytest.MonkeyPatch,
              speculative: bool = True) -> tuple[list[int], dict[str, Any]]:
    """``trtio generate --speculative`` of ``seq``'s prompt in ``root``: the generated tokens and the statistics."""
    monkeypatch.setattr(engine_dir, "load_engine", onnx_loader(root, CASE))
    prompt = " ".join(f"t{int(t)}" for t in seq.prompt)
    out = io.StringIO()
    stats = gen.run_generate(gen.GenerateOptions(root, prompt, max_new_tokens=NEW, speculative=speculative,
                                                 backend="host", draft_top_k=top_k), out=out, err=io.StringIO())
    words = out.getvalue()[len(prompt):].split()
    return [int(w[1:]) for w in words], stats


def _oracle(seq: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round's draft nodes carry Hugging Face's next tokens after the committed ones (the first ``depth`` of
    them on the chain, or on the tree's first path), found from the verify's root token's place in the reference."""
    real = gen._assistant_tree
    truth = [int(t) for t in seq.tokens]
    seen = {"at": seq.prompt_length}  # the reference position of the round's root (the pending token)

    def tree(steps: np.ndarray, k: int, verify_size: int) -> tuple[list[int], list[int]]:
        nodes, up = real(steps, k, verify_size)
        at = seen["at"]
        node = 0
        for token in truth[at + 1:at + 1 + steps.shape[0]]:
            kids = [i for i, p in enumerate(up) if p == node]
            if not kids:
                break
            nodes[kids[0]] = token  # the first child of the path's last node: HF's next token
            node = kids[0] + 1
        return nodes, up

    real_accept = gen.SpecDecodeSetup.accept

    def accept(self: Any, paths: Any, *args: Any, **kwargs: Any) -> Any:
        seen["at"] += len(paths[0])
        return real_accept(self, paths, *args, **kwargs)
    monkeypatch.setattr(gen, "_assistant_tree", tree)
    monkeypatch.setattr(gen.SpecDecodeSetup, "accept", accept)


@pytest.mark.parametrize("top_k", [None, 2])
@pytest.mark.parametrize("index", [0, 1])
def test_generate_speculative_on_the_pair_emits_hugging_faces_greedy_tokens(
        index: int, top_k: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chains of the longest depth the verify takes (top-K 1: 6 steps, 7 nodes) or DDTrees of 7 nodes (top-K 2, 3
    steps): the emitted tokens are HF's greedy continuation; every round verified its draft nodes."""
    seq = CASE.seqs[index]
    tokens, stats = _generate(mtp_directory(tmp_path / "pair", CASE), seq, top_k, monkeypatch)
    assert tokens == [int(t) for t in seq.tokens[seq.prompt_length:seq.prompt_length + NEW]]
    assert stats["tokens"] == NEW and stats["rounds"] >= 1 and stats["drafted"] == 6 * stats["rounds"]


def test_generate_without_speculative_decodes_through_the_base_alone(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``--speculative`` the pair's base decodes greedily (verifies of one node, its PLE rows given)."""
    seq = CASE.seqs[1]
    tokens, stats = _generate(mtp_directory(tmp_path / "pair", CASE), seq, None, monkeypatch, speculative=False)
    assert tokens == [int(t) for t in seq.tokens[seq.prompt_length:seq.prompt_length + NEW]] and stats["drafted"] == 0


@pytest.mark.parametrize("top_k", [None, 2])
def test_rounds_that_accept_several_tokens_emit_them_in_order(top_k: int | None, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With HF's tokens in the draft (an oracle), a round accepts up to its depth and emits the accepted tokens then
    the base's next: still HF's continuation, in fewer verifies."""
    seq = CASE.seqs[0]
    _oracle(seq, monkeypatch)
    tokens, stats = _generate(mtp_directory(tmp_path / "pair", CASE), seq, top_k, monkeypatch)
    assert tokens == [int(t) for t in seq.tokens[seq.prompt_length:seq.prompt_length + NEW]]
    assert stats["accepted_per_verify"] > 1.5 and stats["rounds"] <= 4, stats


def test_ddtree_grows_the_best_scored_children_of_the_nodes_taken() -> None:
    """``ddtreeKernels.h``'s example (candidateTopK 2, verifySize 6): depths 0 1 1 2 2 3, parents -1 0 0 1 2 3,
    from step logits where depth 1's two candidates are near even (log-probs -0.69, -0.70), depth 2's first likely
    (-0.11) and its second not (-2.3), depth 3's first -0.31: best-first, both depth-1 nodes come before any depth-2
    node, the depth-2 child of each before the second child of either, and the deepest node extends the best path."""
    v = 8
    steps = np.full((3, v), -20.0)
    steps[0, [5, 6]] = [10.0, 9.99]
    steps[1, [1, 2]] = [2.2, 0.0]
    steps[2, [7, 3]] = [1.0, 0.0]
    tokens, parents = ddtree(steps, 2, 6)
    assert parents == [0, 0, 1, 2, 3] and tokens == [5, 6, 1, 1, 7]
    chain, up = ddtree(steps, 1, 10)
    assert chain == [5, 1, 7] and up == [0, 1, 2]
    assert ddtree(steps, 3, 1) == ([], [])


def test_generate_refuses_a_top_k_whose_tree_the_base_cannot_verify(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """top-K 7 needs a verify tree of 8 nodes at least; the base verifies 7: refused naming the flag, before any
    engine is loaded."""
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an engine was loaded")
    monkeypatch.setattr(engine_dir, "load_engine", never)
    root = mtp_directory(tmp_path / "pair", CASE)
    with pytest.raises(gen.ConfigError, match="--draft-top-k"):
        gen.run_generate(gen.GenerateOptions(root, "t1 t2", speculative=True, backend="host", draft_top_k=7),
                         out=io.StringIO(), err=io.StringIO())
