"""Whole setups on trtio's CUDA kernels, built for the CPU (tests/_host_kernels.py): every step the cuda backend
enqueues as a kernel (the row copies, the KV commit, the draft levels, the tree steps, the catch-up laid out on the
device, the decode's advance) runs the kernel's own source, launched with the arguments trtio packs for a GPU, and
the tokens are the base's greedy tokens, as on the host backend's numpy ops. The kernels' own tests (tests/
test_device_layouts.py, test_ops.py, test_state.py, test_hybrid_replay.py) compare each with its numpy op; these
check that the setups drive them as those tests do. Without graphs: the reference engine computes on the backend its
name says (a backend named cuda would be the GPU's), so its work joins no capture made on this one (the kernels'
captured launches are tested in those files)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _configs import bundle, llm_config
from _host_kernels import KernelsOnHost, kernels_on_host

from trtio import DeploymentConfig, create_for_llm, create_for_spec_decode
from trtio.testing import ReferenceEngine, ToyWeights, toy_embedding
from trtio.testing.toy_runtime import greedy_generate, spec_generate

E = toy_embedding(512, 64, 0)


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> KernelsOnHost:
    return kernels_on_host(monkeypatch)


def _prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(map(int, rng.integers(0, 512, n))) for n in lengths]


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_spec_decode_on_the_kernels_gives_the_bases_greedy_tokens(kernels: KernelsOnHost, contract: str) -> None:
    """EAGLE tree rounds (top-2, 3 levels) whose accepted paths change from round to round, so every catch-up is laid
    out on the device from the paths accept left there: the tokens equal the base's greedy decode, which runs on
    the host backend's numpy ops."""
    b = bundle(draft_vocab=512, verify_size=6, max_verify=8, max_proposal=8, top_k=2, step=3)
    if contract == "ragged":
        base, draft = (dataclasses.replace(c, contract="ragged", kv_page_size=16, kv_pool_pages=0).validate()
                       for c in (b.base, b.draft))
        b = DeploymentConfig(base, draft, b.spec).validate()
    bw = ToyWeights.generate(b.base, 0)
    dw = ToyWeights.generate_draft(b.draft, bw, 0)
    prompts = _prompts(3, (5, 12, 3, 8))
    llm_cfg = dataclasses.replace(b.base, is_spec_decode_base=False, max_verify_tree_size=0)
    with create_for_llm(ReferenceEngine.from_config(llm_cfg, weights=bw), llm_cfg, backend="host") as llm:
        greedy = greedy_generate(llm, E, prompts, 14)
    runs = []
    for backend in ("host", kernels):
        base = ReferenceEngine.from_config(b.base, weights=bw)
        draft = ReferenceEngine.from_config(b.draft, weights=dw)
        with create_for_spec_decode(base, draft, b, backend=backend) as sd:
            runs.append(spec_generate(sd, E, prompts, 14, depth=3, top_k=2))
    (on_host, host_stats), (tokens, stats) = runs
    assert tokens == on_host == greedy
    # the draft's side too (a wrong catch-up changes what it proposes, not the tokens): the same proposals accepted
    assert 0.0 < stats.acceptance_rate < 1.0, "a weak draft: paths of several lengths"
    assert (stats.rounds, stats.proposed, stats.accepted) == (host_stats.rounds, host_stats.proposed,
                                                             host_stats.accepted)


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_decode_on_the_kernels_gives_the_host_backends_tokens(kernels: KernelsOnHost, contract: str) -> None:
    """Greedy decoding: the decode's row copies and its device-side lengths run as kernels."""
    cfg = llm_config(**({"contract": "ragged", "kv_page_size": 16, "kv_pool_pages": 0} if contract == "ragged" else {}))
    w = ToyWeights.generate(cfg, 1)
    prompts = _prompts(4, (6, 2, 9))
    runs = []
    for backend in ("host", kernels):
        with create_for_llm(ReferenceEngine.from_config(cfg, weights=w), cfg, backend=backend) as llm:
            runs.append(greedy_generate(llm, E, prompts, 10))
    assert runs[1] == runs[0]
