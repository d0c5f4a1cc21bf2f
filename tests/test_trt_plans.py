"""trtio on real TensorRT plans of the toy engines (``-m trt``: needs ``tensorrt`` and a GPU).

The plans are built from the engines/ configs with full TensorRT (``ToyEngines.build_plans``, what
scripts/build_toy_engines.py does), loaded with :func:`trtio.load_engine` and run through
``create_for_llm`` / ``create_for_spec_decode``: their contract must equal the ReferenceEngine's, their
logits must match a host ReferenceEngine with the same weights to fp16 tolerance (teacher-forced, so
one near-tie cannot derail the comparison), graph replay must not change a token, and speculative
decoding on the plans must give exactly the plans' greedy tokens.

Every test except the CLI ones also runs with ``engines="reference"``: the same checks against host
ReferenceEngines standing in for the plans, so CI without a GPU runs this file's logic too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trtio import create_for_llm, create_for_spec_decode
from trtio._engine import EngineIO
from trtio._tools.demo import demo_prompts
from trtio.testing.toy_build import contract_diff
from trtio.testing.toy_engines import ENGINE_NAMES, ToyEngines
from trtio.testing.toy_runtime import embed_batch, greedy_generate, spec_generate

# Logits are float32 from fp16 activations and an fp16 attention (docs/toy-model.md): a wrong
# binding moves them by O(1), rounding by about 1e-2.
ATOL = RTOL = 5e-2
MAX_NEW = 16


@dataclass
class Engines:
    kind: str  # "trt" or "reference"
    toys: ToyEngines
    engines: dict[str, Any]
    plans_dir: Path | None


@pytest.fixture(scope="module")
def toys() -> ToyEngines:
    return ToyEngines.load()


@pytest.fixture(scope="module")
def trt_plans(toys: ToyEngines, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("toy-plans")
    toys.build_plans(out, "tensorrt", progress=False)
    return out


@pytest.fixture(scope="module", params=[pytest.param("trt", marks=pytest.mark.trt), "reference"])
def engines(request: pytest.FixtureRequest, toys: ToyEngines) -> Engines:
    if request.param == "trt":
        from trtio import load_engine

        out = request.getfixturevalue("trt_plans")
        return Engines("trt", toys, {n: load_engine(out / n / "model.plan", "tensorrt") for n in ENGINE_NAMES}, out)
    return Engines("reference", toys, {n: toys.reference_engine(n, device="host") for n in ENGINE_NAMES}, None)


def reference(toys: ToyEngines, name: str) -> Any:
    return toys.reference_engine(name, device="host")


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_loaded_engine_declares_the_reference_contract(engines: Engines, name: str) -> None:
    got = EngineIO.from_engine(engines.engines[name]).to_dict()
    want = EngineIO.from_engine(engines.toys.reference_engine(name, device="host", null_compute=True)).to_dict()
    assert contract_diff(got, want, labels=(engines.kind, "ReferenceEngine")) == []


def test_llm_logits_match_the_reference_engine(engines: Engines) -> None:
    toys = engines.toys
    cfg = toys.llm_config
    embedding = toys.embedding()
    prompts = demo_prompts(cfg.vocab_size, toys.seed)
    emb, lens = embed_batch(embedding, prompts, np.float16)
    with create_for_llm(engines.engines["toy-llm"], cfg) as got, \
            create_for_llm(reference(toys, "toy-llm"), cfg) as want:
        a = got.prefill(emb, lens).to_numpy()
        b = want.prefill(emb, lens).to_numpy()
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg="prefill logits")
        for step in range(8):
            nxt = b.argmax(axis=-1)  # teacher forcing: both continue with the reference's tokens
            step_emb = embedding[nxt][:, None, :].astype(np.float16)
            a = got.decode(step_emb).to_numpy()
            b = want.decode(step_emb).to_numpy()
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"decode step {step}")
        assert np.array_equal(got.lengths, want.lengths)


def test_verify_logits_match_the_reference_engine(engines: Engines) -> None:
    toys = engines.toys
    bundle = toys.eagle
    embedding = toys.embedding()
    prompts = demo_prompts(bundle.base.vocab_size, toys.seed)
    emb, lens = embed_batch(embedding, prompts, np.float16)
    parents = [-1, 0, 0, 1, 3]
    tree_tokens = np.array([[7, 8, 9, 10, 11]] * len(prompts))
    ref_base, ref_draft = reference(toys, "toy-eagle/base"), reference(toys, "toy-eagle/draft")
    with create_for_spec_decode(engines.engines["toy-eagle/base"], engines.engines["toy-eagle/draft"], bundle) as got, \
            create_for_spec_decode(ref_base, ref_draft, bundle) as want:
        np.testing.assert_allclose(got.base_prefill(emb, lens).to_numpy(), want.base_prefill(emb, lens).to_numpy(),
                                   rtol=RTOL, atol=ATOL, err_msg="base prefill")
        tree_emb = embedding[tree_tokens].astype(np.float16)
        np.testing.assert_allclose(got.verify(tree_emb, parents).to_numpy(), want.verify(tree_emb, parents).to_numpy(),
                                   rtol=RTOL, atol=ATOL, err_msg="verify over a 5-node tree")


def test_spec_decode_tokens_equal_greedy_tokens(engines: Engines) -> None:
    toys = engines.toys
    embedding = toys.embedding()
    prompts = demo_prompts(toys.llm_config.vocab_size, toys.seed)
    spec = toys.eagle.spec
    assert spec is not None
    with create_for_llm(engines.engines["toy-llm"], toys.llm_config) as llm:
        vanilla = greedy_generate(llm, embedding, prompts, MAX_NEW)
    with create_for_spec_decode(engines.engines["toy-eagle/base"], engines.engines["toy-eagle/draft"],
                                toys.eagle) as sd:
        tokens, stats = spec_generate(sd, embedding, prompts, MAX_NEW, depth=spec.drafting_step,
                                      top_k=spec.drafting_top_k)
    assert tokens == vanilla
    assert 0.0 < stats.acceptance_rate < 1.0


def test_graph_replay_gives_the_same_tokens(engines: Engines) -> None:
    toys = engines.toys
    embedding = toys.embedding()
    prompts = demo_prompts(toys.llm_config.vocab_size, toys.seed)
    runs = {}
    for graphs in (False, True):
        with create_for_llm(engines.engines["toy-llm"], toys.llm_config, graphs=graphs) as llm:
            runs[graphs] = greedy_generate(llm, embedding, prompts, MAX_NEW)
            stats = llm.graph_stats
    assert runs[True] == runs[False]
    assert stats.captures >= 1 and stats.hits >= MAX_NEW - 1 - stats.captures


# -- the command line on the plans --------------------------------------------------------------------


@pytest.mark.trt
def test_demo_runs_on_the_plans(trt_plans: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtio._cli import main

    rc = main(["demo", "--engine", "trt", "--module", "tensorrt", "--plans", str(trt_plans), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"]
    assert out["engine"]["kind"] == "trt" and out["backend"] == "cuda"
    assert out["tokens_equal"] and out["streaming"]["identical"]
    assert 0.0 < out["spec_decode"]["acceptance_rate"] < 1.0
    for rows in out["bindings"].values():
        assert all(r["engine_address"] == r["address"] for r in rows if r["capacity"])


@pytest.mark.trt
@pytest.mark.parametrize("name", ["toy-llm", "toy-eagle"])
def test_inspect_reads_the_plans(trt_plans: Path, toys: ToyEngines, capsys: pytest.CaptureFixture[str],
                                 name: str) -> None:
    from trtio._cli import main

    assert main(["inspect", str(trt_plans / name), "--module", "tensorrt", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "plan"
    parts = ["toy-llm"] if name == "toy-llm" else ["toy-eagle/base", "toy-eagle/draft"]
    assert len(out["engines"]) == len(parts)
    for entry, part in zip(out["engines"], parts):
        want = [t["name"] for t in toys.reference_engine(part, null_compute=True, device="host").io_contract()]
        assert [t["name"] for t in entry["tensors"]] == want
        assert all(t["binding"] for t in entry["tensors"])
