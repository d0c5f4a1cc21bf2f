"""The ``trtio`` command (trtio._cli) and what it is made of: demo, inspect, plan, dry runs, binding tables.

Commands run in-process through ``trtio._cli.main`` (stdout / stderr captured); one smoke test runs
``python -m trtio demo`` as a user would. Bad input must end in one clear line on stderr and a
non-zero status, with a traceback only under ``--debug``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import trtio
from trtio import DeploymentConfig, LLMEngineConfig, create_for_llm, create_for_spec_decode
from trtio._cli import main
from trtio._cuda.backend import cuda_available
from trtio._engine import EngineIO
from trtio._tools.binding_table import binding_labels, binding_rows
from trtio._tools.dry_run import DryRunBackend, dry_run_setup, planned_memory
from trtio._trt import import_trt as REAL_IMPORT_TRT
from trtio.testing.reference_engine import ReferenceEngine
from trtio.testing.toy_build import resolve_module  # noqa: F401 - imported before any test patches trtio._trt
from trtio.testing.toy_engines import ENGINE_NAMES, RaggedToyEngines, ToyEngines, default_engines_dir

ENGINES = default_engines_dir()
LLM_JSON = ENGINES / "toy-llm" / "config.json"
EAGLE_JSON = ENGINES / "toy-eagle" / "config.json"
BASE_JSON = ENGINES / "toy-eagle" / "base" / "config.json"
DRAFT_JSON = ENGINES / "toy-eagle" / "draft" / "config.json"

HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, command: str, *needles: str) -> str:
    assert rc != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"trtio {command}: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def reference_names(name: str) -> list[str]:
    return [row["name"] for row in ToyEngines.load().reference_engine(name, device="host", null_compute=True)
            .io_contract()]


# -- info and usage -------------------------------------------------------------------------------------


def test_info_still_works(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "info", "--json")
    assert rc == 0
    assert json.loads(out)["trtio"] == trtio.__version__


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys)
    assert rc == 0 and "demo" in out and "inspect" in out and "plan" in out


@pytest.mark.parametrize("command", ["inspect", "plan", "generate"])
def test_the_commands_taking_a_toy_by_name_list_every_toy_directory(capsys: pytest.CaptureFixture[str],
                                                                     command: str) -> None:
    """Each command whose argument may be a toy engine directory by name lists, in its help, every one it takes."""
    from trtio.testing.toy_dirs import TOY_DIRECTORIES  # noqa: PLC0415

    rc, out, _ = run(capsys, command, "--help")
    out = re.sub(r"-\s+", "-", " ".join(out.split()))  # argparse wraps the help, also after a name's hyphens
    assert rc == 0
    assert [n for n in TOY_DIRECTORIES if not re.search(rf"\b{n}(,| or |\))", out)] == []


@pytest.mark.parametrize("argv", [["demo", "--frobnicate"], ["inspect"], ["plan", "a", "b"], ["launch"],
                                  ["demo", "--max-new-tokens", "many"]])
def test_usage_errors_are_one_line_with_status_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    rc, _, err = run(capsys, *argv)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "error:" in err and "Traceback" not in err


# -- demo -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_json() -> dict[str, Any]:
    from trtio._tools.demo import DemoOptions, run_demo

    summary = run_demo(DemoOptions(backend="host"))
    json.dumps(summary)  # JSON-able as it is
    return summary


def test_demo_tokens_acceptance_and_snapshot(demo_json: dict[str, Any]) -> None:
    assert demo_json["ok"] and demo_json["contract"] == "both"
    assert list(demo_json["contracts"]) == ["batch", "ragged"]
    s = demo_json["contracts"]["batch"]
    assert s["ok"] and s["tokens_equal"] and s["contract"] == "batch"
    assert s["engine"] == {"kind": "reference", "device": "host"} and s["backend"] == "host"
    assert [len(p) for p in s["prompts"]] == [5, 12, 3, 8]
    assert s["vanilla_tokens"] == s["spec_tokens"]
    assert all(len(t) == 20 for t in s["vanilla_tokens"])
    sd = s["spec_decode"]
    assert 0.0 < sd["acceptance_rate"] < 1.0
    assert sd["tree"] == {"top_k": 2, "depth": 3, "draft_nodes": 6, "verify_size": 7}  # every drafted node verified
    assert sd["proposed"] == sd["rounds"] * 4 * 3 * 2, "4 sequences, 3 levels of top-2 draft nodes"
    st = s["streaming"]
    assert st["identical"] and st["input_embeds_identical"] and st["hidden_states_identical"]
    assert st["shape"] == [4, 12, 64] and st["bytes"] == 2 * 4 * 12 * 64 * 2
    assert st["live_overwritten_by_decode"]  # the snapshot survived the decode loop's writes


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_demo_draft_agrees_with_its_base(demo_json: dict[str, Any], contract: str) -> None:
    """The toy drafts are derived from their bases (ToyWeights.generate_draft): the base accepts at least 60 % of
    the draft levels of each verify, and the demo reports the mean accepted tokens per verify."""
    from trtio._tools.demo import format_demo

    sd = demo_json["contracts"][contract]["spec_decode"]
    per_verify = sd["accepted"] / (sd["rounds"] * 4)  # 4 sequences
    assert sd["accepted_per_verify"] == pytest.approx(per_verify)
    assert sd["acceptance_rate"] == pytest.approx(per_verify / sd["tree"]["depth"])
    assert sd["node_acceptance_rate"] == pytest.approx(sd["accepted"] / sd["proposed"])
    assert sd["tokens_per_verify"] == pytest.approx(1 + per_verify)
    assert sd["acceptance_rate"] >= 0.6, sd
    text = format_demo(demo_json, verbose=True).split("== ragged contract")[contract == "ragged"]
    assert f"mean accepted tokens per verify: {per_verify:.2f}" in text
    assert f"acceptance rate: {sd['acceptance_rate']:.3f} of the 3 draft levels per verify" in text


def test_demo_bindings_cover_every_engine_tensor(demo_json: dict[str, Any]) -> None:
    bindings = demo_json["contracts"]["batch"]["bindings"]
    for role, name in (("llm", "toy-llm"), ("base", "toy-eagle/base"), ("draft", "toy-eagle/draft")):
        rows = bindings[role]
        assert [r["engine_tensor"] for r in rows] == reference_names(name)
        for r in rows:
            assert r["binding"] and r["address"]
            assert r["engine_address"] == r["address"]  # what the context holds is trtio's pointer
    by = {role: {r["engine_tensor"]: r for r in rows} for role, rows in bindings.items()}
    assert by["llm"]["logits"]["binding"] == "PipelineIO.output_logits"
    assert by["llm"]["present_k_cache_1"]["address"] == by["llm"]["k_cache_1"]["address"]
    assert by["llm"]["kvcache_start_index"]["binding"] == "state[llm].kv_lengths"
    # Spec decode: the draft reads the base's hidden states in place, and both share the RoPE table.
    assert by["draft"]["hidden_states_input"]["address"] == by["base"]["hidden_states"]["address"]
    assert by["draft"]["rope_rotary_cos_sin"]["address"] == by["base"]["rope_rotary_cos_sin"]["address"]
    assert by["base"]["k_cache_0"]["address"] != by["draft"]["k_cache_0"]["address"]
    assert by["base"]["inputs_embeds"]["shape"] == [4, 7, 64]  # its last verify: a 7-node tree


def test_demo_memory_and_graph_stats(demo_json: dict[str, Any]) -> None:
    mem = demo_json["contracts"]["batch"]["memory"]
    assert set(mem) == {"llm", "spec_decode"}
    names = {e["name"] for e in mem["llm"]["entries"]}
    assert {"inputs_embeds", "k_cache_0", "streaming.input_embeds", "context_memory"} <= names
    assert mem["spec_decode"]["total_allocated"] >= mem["spec_decode"]["total_required"] > 0
    g = demo_json["contracts"]["batch"]["graph_stats"]
    assert set(g) == {"llm", "base", "draft"}
    assert g["llm"]["captures"] == 1 and g["llm"]["hits"] == 18  # 19 decode steps: one capture, then replays
    assert g["base"]["hits"] > 0 and g["draft"]["hits"] > 0


def test_demo_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "demo", "--backend", "host", "--max-new-tokens", "8", "--verbose")
    assert rc == 0, err
    assert "spec-decode tokens equal vanilla tokens: yes" in out
    assert "snapshot identical to the prefill-time buffers: yes" in out
    for needle in ("bindings of toy-llm", "bindings of toy-eagle base", "bindings of toy-eagle draft",
                   "memory: create_for_llm", "memory: create_for_spec_decode",
                   "graphs (the host backend's recorded steps):",
                   "PipelineIO.base_hidden_states", "acceptance rate:"):
        assert needle in out
    assert out.rstrip().splitlines()[-1].endswith("-> OK")


def test_demo_ragged_contract(demo_json: dict[str, Any]) -> None:
    s = demo_json["contracts"]["ragged"]
    assert s["ok"] and s["tokens_equal"] and s["contract"] == "ragged"
    assert s["engine"] == {"kind": "reference", "device": "host"} and s["backend"] == "host"
    assert s["engines"] == {"llm": "toy-llm-ragged", "base": "toy-eagle3-ragged/base",
                            "draft": "toy-eagle3-ragged/draft"}
    assert s["directories"] == {"llm": str(ENGINES / "toy-llm-ragged"),
                                "spec_decode": str(ENGINES / "toy-eagle3-ragged")}
    assert s["vanilla_tokens"] == s["spec_tokens"] and all(len(t) == 20 for t in s["vanilla_tokens"])
    assert s["prompts"] == demo_json["contracts"]["batch"]["prompts"]
    sd = s["spec_decode"]
    assert sd["tree"] == {"top_k": 2, "depth": 3, "draft_nodes": 6, "verify_size": 8}  # Edge-LLM's run-time values
    assert sd["proposed"] == sd["rounds"] * 4 * 3 * 2 and 0.0 < sd["acceptance_rate"] < 1.0
    assert s["streaming"] == {"checked": False, "why": "toy-llm-ragged declares no hidden_states output (nor do "
                              "Edge-LLM's plain LLM engines), so there is no prefill snapshot to stream"}
    by = {role: {r["engine_tensor"]: r for r in rows} for role, rows in s["bindings"].items()}
    toys = RaggedToyEngines.load()
    for role, name in (("llm", "toy-llm-ragged"), ("base", "toy-eagle3-ragged/base"),
                       ("draft", "toy-eagle3-ragged/draft")):
        want = [row["name"] for row in toys.reference_engine(name, device="host", null_compute=True).io_contract()]
        assert list(by[role]) == want
        assert all(r["binding"] and r["engine_address"] == r["address"] for r in by[role].values())
        assert by[role]["kv_page_table"]["binding"] == f"state[{role}].kv_page_table"
        assert by[role]["present_key_values_0"]["address"] == by[role]["past_key_values_0"]["address"]
    assert by["llm"]["past_key_values_0"]["shape"] == [2, 8, 128, 2, 16]  # a paged pool
    assert by["draft"]["hidden_states_input"]["address"] == by["base"]["hidden_states"]["address"]
    assert by["base"]["past_key_values_0"]["address"] != by["draft"]["past_key_values_0"]["address"]
    mem = {k: {(e["group"], e["name"]) for e in v["entries"]} for k, v in s["memory"].items()}
    assert ("llm state", "past_key_values_3") in mem["llm"]
    assert ("PipelineIO(spec_decode, ragged)", "draft_kv_page_table") in mem["spec_decode"]  # staged per step
    g = s["graph_stats"]
    assert g["llm"]["captures"] == 1 and g["llm"]["hits"] == 18
    assert g["base"]["hits"] > 0 and g["draft"]["hits"] > 0


def test_demo_ragged_requests_arrive_and_leave(demo_json: dict[str, Any]) -> None:
    """The ragged section's admission story: five requests for four slots, admitted at different steps while
    the others decode, one finishing early and its slot reused by a request that starts from a pinned prefix;
    every request's tokens are its solo greedy tokens, and the pages in use follow the events."""
    s = demo_json["contracts"]["ragged"]
    a = s["admissions"]
    assert a["equal"] and s["ok"] and "admissions" not in demo_json["contracts"]["batch"]
    assert (a["slots"], a["pool_pages"], a["page_size"]) == (4, 8, 128)
    reqs = a["requests"]
    assert [r["arrive"] for r in reqs] == [0, 2, 3, 3, 4] and [r["budget"] for r in reqs] == [20, 20, 5, 20, 20]
    for r in reqs:
        assert r["tokens"] == r["solo_tokens"] and len(r["tokens"]) == r["budget"] and r["equal"]
        assert r["admitted"] >= r["arrive"] and r["finished"] >= r["admitted"]
    assert reqs[0]["tokens"] == s["vanilla_tokens"][0], "request 0 is the demo's first prompt, alone in its slot"
    assert reqs[2]["finished"] < min(reqs[i]["finished"] for i in (0, 1, 3)), "request 2 finishes early"
    assert reqs[4]["admitted"] > reqs[4]["arrive"], "request 4 waits: every slot is busy when it arrives"
    assert reqs[4]["slot"] == reqs[2]["slot"] and reqs[4]["admitted"] == reqs[2]["finished"] + 1
    assert reqs[4]["from_prefix"] and reqs[4]["prompt"][:40] == reqs[1]["prompt"][:40]
    assert len({r["admitted"] for r in reqs}) >= 4, "admitted at different steps"

    events = a["events"]
    kinds = [(e["event"], e["request"]) for e in events]
    assert kinds[:5] == [("admit", 0), ("admit", 1), ("pin", 1), ("admit", 2), ("admit", 3)]
    assert kinds[-1] == ("unpin", -1) and kinds.count(("release", 2)) == 1
    admit4 = next(e for e in events if e["event"] == "admit" and e["request"] == 4)
    assert admit4["reused"] and admit4["prefix"] == 40 and admit4["prompt"] == 46
    pin = events[2]
    assert pin["tokens"] == 40 and pin["pages_used"] == events[1]["pages_used"], "pinning takes no page"
    for e in events:
        assert e["pages_total"] == 8 and 0 <= e["pages_used"] <= 8
        if e["event"] == "admit" and not e["prefix"]:
            assert e["pages_used"] >= len(e["active"]), "every active sequence holds a page"
    last_release = [e for e in events if e["event"] == "release"][-1]
    assert last_release["active"] == [] and last_release["pages_used"] == 1, "the prefix's page alone"
    assert events[-1]["pages_used"] == 0, "every page back once the prefix is released"
    assert a["graph_stats"]["hits"] > 0, "decode graphs replay across admissions and releases"


def test_demo_ragged_admission_text(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "demo", "--backend", "host", "--contract", "ragged", "--verbose")
    assert rc == 0, err
    story = out.split("requests arriving and leaving (toy-llm-ragged, create_for_llm: 4 slots, a KV pool of 8 pages "
                      "of 128 tokens;")[1]
    for needle in ("step 0: request 0 (5 tokens, budget 20) admitted into slot 0; active [0]; pages in use 1 of 8",
                   "step 2: pinned the first 40 tokens of slot 1 (request 1's system prompt) as a prefix",
                   "request 2 finished (5 tokens, its budget); slot 2 released",
                   "request 4 (6 tokens after the pinned 40-token prefix, budget 20) admitted into slot 2 (reused)",
                   "end: the prefix of 40 tokens released; pages in use 0 of 8",
                   "each request's tokens equal its solo greedy run: yes"):
        assert needle in story, needle
    assert out.rstrip().splitlines()[-1].endswith("snapshot not checked (no hidden_states), admissions equal yes; "
                                                  "toy-mtp-ragged: speculative equal yes; toy-qwen35-mtp-ragged: "
                                                  "speculative equal yes; toy-dflash-ragged: speculative equal yes; "
                                                  "toy-qwen35-dflash-ragged: speculative equal yes; "
                                                  "toy-qwen35-ragged: admissions equal yes; toy-nemotron-h-ragged: "
                                                  "admissions equal yes; toy-lora-ragged: adapters switch cleanly "
                                                  "yes; toy-gemma4-ragged: bounded SWA equal yes -> OK")


# The demo run in full once more, with a fault planted: slow (about 2 s of CPU each); -m slow runs it in .ci/run.
@pytest.mark.slow
def test_demo_fails_when_a_story_request_differs_from_its_solo_run(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from trtio.testing.toy_runtime import greedy_generate as real

    def off_by_one(setup: Any, embedding: Any, prompts: Any, count: int, stream: Any = None) -> list[list[int]]:
        out = real(setup, embedding, prompts, count, stream)
        if len(prompts[0]) == 46:  # the request from the prefix
            out[0][-1] = (out[0][-1] + 1) % 512
        return out

    monkeypatch.setattr("trtio._tools.admissions.greedy_generate", off_by_one)
    rc, out, _ = run(capsys, "demo", "--backend", "host", "--contract", "ragged", "--max-new-tokens", "6")
    assert rc == 1
    assert "each request's tokens equal its solo greedy run: NO" in out
    assert out.rstrip().splitlines()[-1].endswith("admissions equal NO; toy-lora-ragged: adapters switch cleanly yes; "
                                                  "toy-gemma4-ragged: bounded SWA equal yes -> FAILED")
    rc, out, _ = run(capsys, "demo", "--backend", "host", "--contract", "ragged", "--max-new-tokens", "6", "--json")
    s = json.loads(out)
    assert rc == 1 and not s["ok"] and not s["contracts"]["ragged"]["admissions"]["equal"]
    assert [r["equal"] for r in s["contracts"]["ragged"]["admissions"]["requests"]] == [True] * 4 + [False]


def test_demo_text_report_of_both_contracts(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "demo", "--backend", "host", "--max-new-tokens", "6", "--verbose")
    assert rc == 0, err
    batch, ragged = out.split("== ragged contract: ")
    assert "== batch contract: toy-llm and toy-eagle" in batch
    assert "snapshot identical to the prefill-time buffers: yes" in batch
    assert ragged.startswith("toy-llm-ragged and toy-eagle3-ragged (Edge-LLM 0.11 engine directories")
    for needle in ("spec-decode tokens equal vanilla tokens: yes", "streaming prefill snapshot: not checked: "
                   "toy-llm-ragged declares no hidden_states output", "bindings of toy-llm-ragged",
                   "bindings of toy-eagle3-ragged base", "bindings of toy-eagle3-ragged draft",
                   "state[base].kv_page_table", "memory: create_for_llm", "memory: create_for_spec_decode",
                   "EAGLE tree drafting: top_k=2 per level, 3 levels, 6 draft nodes, verify trees of 8",
                   "graphs (the host backend's recorded steps):",
                   "always ReferenceEngines: plans of this contract come from Edge-LLM's builder"):
        assert needle in ragged, needle
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("result: batch: tokens equal yes") and "; ragged: tokens equal yes" in last
    assert "snapshot not checked (no hidden_states)" in last and last.endswith("-> OK")


@pytest.mark.parametrize("contract", ["batch", "ragged"])
def test_demo_one_contract(capsys: pytest.CaptureFixture[str], contract: str) -> None:
    rc, out, err = run(capsys, "demo", "--backend", "host", "--contract", contract, "--json", "--max-new-tokens", "5")
    assert rc == 0, err
    s = json.loads(out)
    assert s["contract"] == contract and list(s["contracts"]) == [contract] and s["ok"]
    rc, out, _ = run(capsys, "demo", "--backend", "host", "--contract", contract, "--max-new-tokens", "3")
    other = {"batch": "ragged", "ragged": "batch"}[contract]
    assert rc == 0 and f"\n{contract} contract: " in out and f"\n{other} contract: " not in out


def test_demo_ragged_runs_without_the_batch_toys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    RaggedToyEngines.load().write_configs(tmp_path)
    rc, out, _ = run(capsys, "demo", "--backend", "host", "--contract", "ragged", "--engines", str(tmp_path),
                     "--json", "--max-new-tokens", "3")
    assert rc == 0 and json.loads(out)["ok"]
    rc, _, err = run(capsys, "demo", "--backend", "host", "--engines", str(tmp_path))
    assert_one_line_error(rc, err, "demo", "toy-llm/config.json")


def test_demo_batch_only_folder_says_to_pick_the_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ToyEngines.load().write_configs(tmp_path)
    rc, _, err = run(capsys, "demo", "--backend", "host", "--engines", str(tmp_path))
    assert_one_line_error(rc, err, "demo", str(tmp_path / "toy-llm-ragged"), "no such engine directory",
                          "--contract batch")
    rc, out, _ = run(capsys, "demo", "--backend", "host", "--engines", str(tmp_path), "--contract", "batch",
                     "--max-new-tokens", "3")
    assert rc == 0 and out.rstrip().endswith("-> OK")


# The demo run in full once more, with a fault planted: slow (about 2 s of CPU each); -m slow runs it in .ci/run.
@pytest.mark.slow
def test_demo_fails_when_one_contracts_tokens_differ(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from trtio.testing.toy_runtime import spec_generate as real

    def wrong_on_ragged(setup: Any, *args: Any, **kwargs: Any) -> Any:
        tokens, stats = real(setup, *args, **kwargs)
        if setup.contract == "ragged":
            tokens[1][-1] = (tokens[1][-1] + 1) % 512
        return tokens, stats

    monkeypatch.setattr("trtio._tools.demo.spec_generate", wrong_on_ragged)
    rc, out, _ = run(capsys, "demo", "--backend", "host", "--max-new-tokens", "4", "--verbose")
    assert rc == 1
    assert "spec-decode tokens equal vanilla tokens: NO" in out.split("== ragged contract")[1]
    assert out.rstrip().splitlines()[-1].endswith("-> FAILED")
    rc, out, _ = run(capsys, "demo", "--backend", "host", "--max-new-tokens", "4", "--json")
    s = json.loads(out)
    assert rc == 1 and not s["ok"] and s["contracts"]["batch"]["ok"] and not s["contracts"]["ragged"]["ok"]
    rc, _, _ = run(capsys, "demo", "--backend", "host", "--max-new-tokens", "4", "--contract", "batch")
    assert rc == 0


def test_ragged_toys_must_be_one_model(tmp_path: Path) -> None:
    RaggedToyEngines.load().write_configs(tmp_path)
    path = tmp_path / "toy-eagle3-ragged" / "base_config.json"
    data = json.loads(path.read_text())
    data["rope_theta"] = 5e5
    path.write_text(json.dumps(data))
    with pytest.raises(trtio.ConfigError, match=r"base_config.json: is not toy-llm-ragged's model \(rope_theta"):
        RaggedToyEngines.load(tmp_path)
    toys = RaggedToyEngines.load()
    assert toys.weights("toy-llm-ragged") is toys.weights("toy-eagle3-ragged/base")
    spec = toys.deployment().spec
    assert spec is not None and (spec.drafting_top_k, spec.drafting_step, spec.verify_size) == (2, 3, 8)


def test_demo_without_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "demo", "--backend", "host", "--no-graphs", "--json", "--max-new-tokens", "6")
    s = json.loads(out)
    assert rc == 0 and s["ok"] and not s["graphs"]
    for section in s["contracts"].values():
        assert all(g["captures"] == 0 and g["hits"] == 0 for g in section["graph_stats"].values())


def test_demo_from_a_copied_engines_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ToyEngines.load().write_configs(tmp_path)
    RaggedToyEngines.load().write_configs(tmp_path)
    rc, out, _ = run(capsys, "demo", "--backend", "host", "--engines", str(tmp_path), "--json",
                     "--max-new-tokens", "4")
    s = json.loads(out)
    assert rc == 0 and s["ok"] and s["engines_dir"] == str(tmp_path)
    assert s["contracts"]["ragged"]["directories"] == {"llm": str(tmp_path / "toy-llm-ragged"),
                                                       "spec_decode": str(tmp_path / "toy-eagle3-ragged")}


def test_python_m_trtio_demo(tmp_path: Path) -> None:
    """From another folder, as a user would run it (trtio found wherever this test found it): at most 40 lines,
    each contract's tokens, acceptance and checks, the sequences, the result last; no claim about CUDA graphs or
    devices that is not true here."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(trtio.__file__).parent.parent)]
                                                      + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "trtio", "demo"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.rstrip("\n").splitlines()
    assert len(lines) <= 40, f"{len(lines)} lines by default"
    assert proc.stdout.count("equal the greedy ones: yes") == 2  # both contracts
    assert "\nbatch contract: " in proc.stdout and "\nragged contract: " in proc.stdout
    assert proc.stdout.count("    [3] ") == 2, "each contract's greedy tokens, one line per prompt"
    assert "identical to the prefill-time buffers: yes" in proc.stdout
    assert re.search(r"sequences: 5 requests admitted into 4 slots .*solo greedy run: yes", proc.stdout)
    rates = [float(r) for r in re.findall(r"; acceptance rate ([0-9.]+) \(", proc.stdout)]
    assert len(rates) == 2 and all(0.0 < r < 1.0 for r in rates), proc.stdout
    assert lines[-1].startswith("result: ") and lines[-1].endswith("-> OK")
    assert "0x" not in proc.stdout, "no binding table (host addresses) by default"
    if not cuda_available():
        assert "CUDA graph" not in proc.stdout and "cuda backend" not in proc.stdout
        assert "graphs of the host backend" in lines[1]
    assert seconds < 60, f"the demo took {seconds:.1f} s"
    assert "Traceback" not in proc.stderr


# The whole demo again, verbose: slow (about 2 s of CPU); -m slow runs it in .ci/run.
@pytest.mark.slow
def test_demo_verbose_adds_the_tables(capsys: pytest.CaptureFixture[str]) -> None:
    rc, brief, _ = run(capsys, "demo", "--backend", "host", "--max-new-tokens", "4")
    rc2, full, _ = run(capsys, "demo", "--backend", "host", "--max-new-tokens", "4", "-v")
    assert rc == rc2 == 0
    assert len(brief.splitlines()) <= 40 < len(full.splitlines())
    for needle in ("bindings of toy-llm", "memory: create_for_llm", "graphs (the host backend's recorded steps):",
                   "requests arriving and leaving"):
        assert needle in full and needle not in brief, needle
    assert brief.splitlines()[-1] == full.splitlines()[-1], "the same result line"


def _engines_with(tmp_path: Path, part: str, **fields: Any) -> Path:
    ToyEngines.load().write_configs(tmp_path)
    path = tmp_path / "toy-eagle" / "config.json"
    data = json.loads(path.read_text())
    if part == "top":
        data.update(fields)
    else:
        data[part].update(fields)
    path.write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize("part, fields, needles", [
    ("base", dict(hidden_size=96, base_model_hidden_size=0), ["toy-eagle/config.json", "hidden_size 96 vs 64"]),
    ("top", dict(seed=5), ["seed", "differs from toy-llm"]),
    ("spec", dict(verify_size=9), ["verify_size"]),
])
def test_demo_refuses_mismatching_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str], part: str,
                                          fields: dict[str, Any], needles: list[str]) -> None:
    root = _engines_with(tmp_path, part, **fields)
    (root / "toy-eagle" / "base" / "config.json").unlink()
    rc, _, err = run(capsys, "demo", "--backend", "host", "--engines", str(root))
    assert_one_line_error(rc, err, "demo", *needles)


def test_demo_refuses_a_per_engine_config_that_disagrees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ToyEngines.load().write_configs(tmp_path)
    edited = LLMEngineConfig(**{**json.loads(DRAFT_JSON.read_text()), "max_draft_tree_size": 7})
    edited.to_json(tmp_path / "toy-eagle" / "draft" / "config.json")
    rc, _, err = run(capsys, "demo", "--backend", "host", "--engines", str(tmp_path))
    assert_one_line_error(rc, err, "demo", "draft/config.json", "max_draft_tree_size 7 vs 8")


@pytest.mark.parametrize("argv, needles", [
    (["--backend", "gpu"], ["--backend", "'gpu'"]),
    (["--engine", "onnx"], ["--engine", "'onnx'"]),
    (["--module", "tensorrt_llm"], ["--module", "'tensorrt_llm'"]),
    (["--max-new-tokens", "0"], ["--max-new-tokens"]),
    (["--engine", "trt", "--backend", "host"], ["cuda backend"]),
    (["--engines", "/nonexistent/engines"], ["no such config file"]),
    (["--contract", "all"], ["--contract", "'all'", "'batch', 'ragged', 'both'"]),
    (["--contract", "ragged", "--engine", "trt"], ["--engine", "ragged toy engines run as ReferenceEngines"]),
    (["--contract", "ragged", "--plans", "/somewhere"], ["--plans", "--contract batch or both"]),
])
def test_demo_bad_options_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needles: list[str]) -> None:
    rc, _, err = run(capsys, "demo", *argv)
    assert_one_line_error(rc, err, "demo", *needles)


@pytest.mark.skipif(cuda_available(), reason="a CUDA device answers here")
def test_demo_on_cuda_without_a_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "demo", "--backend", "cuda")
    assert_one_line_error(rc, err, "demo", "no CUDA device")


@pytest.mark.skipif(cuda_available(), reason="a CUDA device answers here")
def test_demo_with_plans_needs_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "demo", "--engine", "trt", "--plans", str(tmp_path))
    assert_one_line_error(rc, err, "demo")


def test_demo_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "demo", "--engines", "/nonexistent/engines", "--debug")
    assert rc == 1
    assert "Traceback (most recent call last)" in err and "ConfigError" in err
    assert err.strip().splitlines()[-1].startswith("trtio demo: error: /nonexistent/engines")


@pytest.fixture
def plans_run_on_the_host(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Make ``demo --engine trt`` run here: the cuda backend is the host one, and a "plan" loads as the
    computing ReferenceEngine of the config beside it. Everything else (finding, building and checking
    plans, the runs) is the real code path. Returns the loads made, by path."""
    import trtio._tools.demo
    import trtio._trt

    loads: dict[str, Any] = {}

    def choose(opts: Any) -> tuple[str, Any, str]:
        return "trt", trtio.get_backend("host"), "test: plans on the host"

    def load(path: Any, module: Any = "auto") -> Any:
        path = Path(path)
        name = path.parent.relative_to(path.parent.parent.parent if path.parent.name in ("base", "draft")
                                        else path.parent.parent).as_posix()
        cfg = LLMEngineConfig.from_json(path.parent / "config.json") if name != "toy-llm" else \
            DeploymentConfig.from_json(path.parent / "config.json").base
        loads[str(path)] = ReferenceEngine.from_config(cfg, device="host", weights=ToyEngines.load().weights(name))
        return loads[str(path)]

    monkeypatch.setattr(trtio._tools.demo, "_choose", choose)
    monkeypatch.setattr(trtio._trt, "load_engine", load)
    monkeypatch.setattr(trtio._trt, "import_trt", lambda module="auto": type(sys)("fake_tensorrt"))
    return loads


def _fake_plans(root: Path) -> Path:
    ToyEngines.load().write_configs(root)
    RaggedToyEngines.load().write_configs(root)
    for name in ENGINE_NAMES:
        (root / name / "model.plan").write_bytes(b"plan")
    return root


def test_demo_on_plans_from_a_folder(tmp_path: Path, plans_run_on_the_host: dict[str, Any],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    plans = _fake_plans(tmp_path / "plans")
    rc, out, err = run(capsys, "demo", "--engine", "trt", "--plans", str(plans), "--json", "--max-new-tokens", "6")
    assert rc == 0, err
    s = json.loads(out)
    assert s["ok"] and s["contracts"]["batch"]["engine"]["kind"] == "trt"
    assert s["contracts"]["batch"]["engine"]["plans_dir"] == str(plans)
    assert s["contracts"]["ragged"]["engine"] == {"kind": "reference", "device": "host"}  # no plans of that contract
    assert sorted(plans_run_on_the_host) == sorted(str(plans / n / "model.plan") for n in ENGINE_NAMES)


def test_demo_finds_plans_beside_the_configs(tmp_path: Path, plans_run_on_the_host: dict[str, Any],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    root = _fake_plans(tmp_path / "engines")
    rc, out, _ = run(capsys, "demo", "--engines", str(root), "--json", "--max-new-tokens", "4")
    assert rc == 0 and json.loads(out)["contracts"]["batch"]["engine"]["plans_dir"] == str(root)


def test_demo_refuses_plans_built_from_other_configs(tmp_path: Path, plans_run_on_the_host: dict[str, Any],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    plans = _fake_plans(tmp_path / "plans")
    for path in (plans / "toy-llm" / "config.json", plans / "toy-eagle" / "config.json"):
        data = json.loads(path.read_text())
        data["seed"] = 9
        path.write_text(json.dumps(data))
    rc, _, err = run(capsys, "demo", "--engine", "trt", "--plans", str(plans))
    assert_one_line_error(rc, err, "demo", "plans were built from other configs", "seed 9 vs 0")
    rc, _, err = run(capsys, "demo", "--engine", "trt", "--plans", str(tmp_path / "empty"))
    assert_one_line_error(rc, err, "demo", "holds no toy plans")


def test_demo_refuses_a_plan_that_does_not_fit_its_config(tmp_path: Path, plans_run_on_the_host: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import trtio._trt

    plans = _fake_plans(tmp_path / "plans")
    toys = ToyEngines.load()
    other = dataclasses.replace(toys.llm_config, max_kv_cache_capacity=96)
    monkeypatch.setattr(trtio._trt, "load_engine", lambda path, module="auto": ReferenceEngine.from_config(
        other if "toy-llm" in str(path) else toys.config(Path(path).parent.relative_to(plans).as_posix()),
        device="host", null_compute=True))
    rc, _, err = run(capsys, "demo", "--engine", "trt", "--plans", str(plans))
    assert_one_line_error(rc, err, "demo", "does not fit plan", "toy-llm/model.plan", "128")


@pytest.mark.rtx
def test_demo_builds_missing_plans_into_the_cache(tmp_path: Path, plans_run_on_the_host: dict[str, Any],
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import trtio._trt

    monkeypatch.setattr(trtio._trt, "import_trt", REAL_IMPORT_TRT)  # these plans are really built, with RTX
    monkeypatch.setenv("TRTIO_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "engines"
    ToyEngines.load().write_configs(root)
    RaggedToyEngines.load().write_configs(root)
    for _ in range(2):  # built the first time, found the second
        rc, out, err = run(capsys, "demo", "--engines", str(root), "--module", "tensorrt_rtx", "--json",
                           "--max-new-tokens", "4")
        assert rc == 0, err
        s = json.loads(out)
        plans_dir = s["contracts"]["batch"]["engine"]["plans_dir"]
        assert s["ok"] and plans_dir.startswith(str(tmp_path / "cache" / "toy-engines"))
    plans = sorted((tmp_path / "cache").rglob("model.plan"))
    assert len(plans) == 3 and all(p.stat().st_size > 1000 for p in plans)
    assert err.count("built ") == 0  # the second run built nothing


# -- inspect ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target, parts", [
    (LLM_JSON, ["toy-llm"]),
    (EAGLE_JSON, ["toy-eagle/base", "toy-eagle/draft"]),
    (BASE_JSON, ["toy-eagle/base"]),
    (DRAFT_JSON, ["toy-eagle/draft"]),
    (ENGINES / "toy-llm", ["toy-llm"]),
])
def test_inspect_configs_json(capsys: pytest.CaptureFixture[str], target: Path, parts: list[str]) -> None:
    rc, out, err = run(capsys, "inspect", str(target), "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["kind"] == "config"
    assert len(result["engines"]) == len(parts)
    toys = ToyEngines.load()
    for entry, part in zip(result["engines"], parts):
        want = EngineIO.from_engine(toys.reference_engine(part, device="host", null_compute=True)).to_dict()
        assert entry["role"] == toys.config(part).role
        assert entry["num_profiles"] == 2
        assert [t["name"] for t in entry["tensors"]] == [t["name"] for t in want["tensors"]]
        for got, exp in zip(entry["tensors"], want["tensors"]):
            assert {k: got[k] for k in exp} == exp  # every field EngineIO reports, unchanged
            assert got["binding"], f"{got['name']} has no trtio binding"
            assert got["max_bytes"] > 0
    by = {t["name"]: t for t in result["engines"][0]["tensors"]}
    assert by["inputs_embeds"]["binding"] == "PipelineIO.inputs_embeds"
    assert by["inputs_embeds"]["max_bytes"] == 4 * 64 * 64 * 2
    assert by["present_k_cache_0"]["max_bytes"] == 4 * 2 * 128 * 16 * 2  # from the cache it aliases


def test_inspect_labels_follow_the_role(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(EAGLE_JSON), "--json")
    base, draft = (({t["name"]: t["binding"] for t in e["tensors"]}) for e in json.loads(out)["engines"])
    assert base["hidden_states"] == draft["hidden_states_input"] == "PipelineIO.base_hidden_states"
    assert draft["hidden_states"] == "PipelineIO.draft_hidden_states_out"
    assert draft["hidden_states_from_draft"] == "PipelineIO.draft_hidden_states_in"
    assert base["attention_mask"] == "PipelineIO.packed_attention_mask"
    assert base["k_cache_1"] == "state[base].k_cache_1" and draft["k_cache_0"] == "state[draft].k_cache_0"
    assert base["rope_rotary_cos_sin"] == "rope table (shared)"


def test_inspect_config_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(EAGLE_JSON))
    assert rc == 0
    for name in reference_names("toy-eagle/draft"):
        assert name in out
    assert "profile 0 min / opt / max" in out and "trtio binding" in out and "bytes at max" in out
    assert "[1,1,64] [4,32,64] [4,64,64]" in out  # inputs_embeds, prefill profile
    assert "PipelineIO.draft_hidden_states_in" in out
    assert "11 inputs, 6 outputs, 2 profiles" in out


def test_inspect_config_with_a_config_that_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "inspect", str(LLM_JSON), "--config", str(DRAFT_JSON))
    assert_one_line_error(rc, err, "inspect", "does not fit", "hidden_states_input")


def test_inspect_config_with_a_config_that_fits(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(BASE_JSON), "--config", str(EAGLE_JSON), "--json")
    assert rc == 0
    entry = json.loads(out)["engines"][0]
    assert entry["config"] == str(EAGLE_JSON) and entry["role"] == "base"


@pytest.mark.parametrize("make, needles", [
    (lambda p: p / "missing.plan", ["does not exist"]),
    (lambda p: p, ["holds no model.plan"]),
    (lambda p: (p / "bad.json").write_text("{ nope") and p / "bad.json", ["is not valid JSON"]),
    (lambda p: (p / "c.json").write_text(json.dumps({"hidden_size": 64})) and p / "c.json", ["vocab_size", "required"]),
    (lambda p: (p / "n.json").write_text(json.dumps({**json.loads(LLM_JSON.read_text())["base"], "num_kv_heads": 3}))
     and p / "n.json", ["num_kv_heads"]),
])
def test_inspect_bad_targets_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any,
                                          needles: list[str]) -> None:
    rc, _, err = run(capsys, "inspect", str(make(tmp_path)))
    assert_one_line_error(rc, err, "inspect", *needles)


def test_inspect_unknown_module_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "inspect", str(LLM_JSON), "--module", "tensorrt_llm")
    assert_one_line_error(rc, err, "inspect", "--module", "'tensorrt_llm'")


def test_inspect_debug_shows_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "inspect", str(tmp_path / "missing.plan"), "--debug")
    assert rc == 1
    assert "Traceback (most recent call last)" in err and "EngineError" in err
    assert err.strip().splitlines()[-1].startswith("trtio inspect: error: ")


@pytest.fixture(scope="module")
def rtx_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAS_RTX:
        pytest.skip("tensorrt_rtx is not installed")
    out = tmp_path_factory.mktemp("rtx")
    ToyEngines.load().build_plans(out, "tensorrt_rtx", progress=False, engines=("toy-llm",))
    return out / "toy-llm"


@pytest.mark.rtx
@pytest.mark.skipif(cuda_available(), reason="a GPU answers: the plan may load here")
@pytest.mark.parametrize("how", ["dir", "plan", "plan+config"])
def test_inspect_an_rtx_plan_on_the_cpu_is_one_clean_line(rtx_plan: Path, capsys: pytest.CaptureFixture[str],
                                                          how: str) -> None:
    argv = {"dir": [str(rtx_plan)], "plan": [str(rtx_plan / "model.plan")],
            "plan+config": [str(rtx_plan / "model.plan"), "--config", str(DRAFT_JSON)]}[how]
    rc, out, err = run(capsys, "inspect", *argv, "--module", "tensorrt_rtx")
    line = assert_one_line_error(rc, err, "inspect", "model.plan", "no CUDA device answers")
    assert "trtio inspect" in line.split("error:", 1)[1]  # it says what to run instead
    assert out == ""


@pytest.mark.rtx
@pytest.mark.skipif(cuda_available(), reason="a GPU answers: the plan may load here")
def test_inspect_a_corrupt_plan_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A TensorRT-RTX plan's magic, then garbage: it passes the header check and reaches TensorRT.
    (tmp_path / "model.plan").write_bytes(b"vtrt" + b"\x00not a plan" * 10)
    rc, _, err = run(capsys, "inspect", str(tmp_path / "model.plan"), "--module", "tensorrt_rtx")
    assert_one_line_error(rc, err, "inspect", "model.plan")
    rc, _, err = run(capsys, "inspect", str(tmp_path / "model.plan"), "--module", "tensorrt_rtx", "--debug")
    assert "Traceback" in err and "trtio.trt" in err  # --debug also shows TensorRT's own log


@pytest.fixture
def fake_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An engines folder with model.plan files that "load" as the ReferenceEngines they were built from,
    so the plan code paths of inspect (config beside the plan, --config, base/draft folders) run here."""
    toys = ToyEngines.load()
    toys.write_configs(tmp_path)
    by_path = {}
    for name in ENGINE_NAMES:
        path = tmp_path / name / "model.plan"
        path.write_bytes(b"plan")
        by_path[path] = toys.reference_engine(name, device="host", null_compute=True)
    monkeypatch.setattr("trtio._tools.inspection._load", lambda plan, config, module, plugins=(): by_path[Path(plan)])
    return tmp_path


def test_inspect_plans_use_the_config_beside_them(fake_plans: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "inspect", str(fake_plans / "toy-eagle"), "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["kind"] == "plan"
    assert [e["role"] for e in result["engines"]] == ["base", "draft"]
    for entry, name in zip(result["engines"], ("toy-eagle/base", "toy-eagle/draft")):
        assert entry["plan"] == str(fake_plans / name / "model.plan")
        assert entry["config"] == str(fake_plans / "toy-eagle" / "config.json")
        assert [t["name"] for t in entry["tensors"]] == reference_names(name)
        assert all(t["binding"] for t in entry["tensors"])
    rc, out, _ = run(capsys, "inspect", str(fake_plans / "toy-eagle" / "draft" / "model.plan"))
    assert rc == 0 and "toy-draft (draft): plan " in out and "PipelineIO.draft_hidden_states_out" in out


def test_inspect_a_plan_with_a_config_that_does_not_fit(fake_plans: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "inspect", str(fake_plans / "toy-llm"), "--config", str(DRAFT_JSON))
    assert_one_line_error(rc, err, "inspect", "does not fit plan", "toy-llm/model.plan", "hidden_states_input")
    bigger = json.loads(LLM_JSON.read_text())
    bigger["base"]["max_kv_cache_capacity"] = 256
    (fake_plans / "other.json").write_text(json.dumps(bigger))
    rc, _, err = run(capsys, "inspect", str(fake_plans / "toy-llm" / "model.plan"), "--config",
                     str(fake_plans / "other.json"))
    assert_one_line_error(rc, err, "inspect", "other.json", "rope_rotary_cos_sin: dim 1 is 128",
                          "k_cache_0: dim 2 is 128 in the engine but 256 in the config")
    bigger["base"].update(max_kv_cache_capacity=128, max_supported_batch_size=8, max_supported_input_length=100)
    (fake_plans / "other.json").write_text(json.dumps(bigger))
    rc, _, err = run(capsys, "inspect", str(fake_plans / "toy-llm" / "model.plan"), "--config",
                     str(fake_plans / "other.json"))
    assert_one_line_error(rc, err, "inspect", "batches up to 4", "max_supported_batch_size is 8",
                          "prefill profile takes up to 64 tokens", "max_supported_input_length is 100")


def test_inspect_a_plan_without_a_config(fake_plans: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (fake_plans / "toy-llm" / "config.json").unlink()
    rc, out, _ = run(capsys, "inspect", str(fake_plans / "toy-llm"))
    assert rc == 0
    assert "pass --config CONFIG to see the trtio bindings" in out
    rc, out, _ = run(capsys, "inspect", str(fake_plans / "toy-llm"), "--config", str(LLM_JSON), "--json")
    assert all(t["binding"] for t in json.loads(out)["engines"][0]["tensors"])


# -- plan -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target, factory", [(LLM_JSON, "create_for_llm"), (EAGLE_JSON, "create_for_spec_decode"),
                                             (ENGINES / "toy-eagle", "create_for_spec_decode")])
def test_plan_reports_the_factories_memory(capsys: pytest.CaptureFixture[str], target: Path, factory: str) -> None:
    rc, out, err = run(capsys, "plan", str(target))
    assert rc == 0, err
    assert out.startswith(f"{factory} for ")
    assert "k_cache_0" in out and "inputs_embeds" in out and "context memory: not included" in out
    rc, out, _ = run(capsys, "plan", str(target), "--json")
    result = json.loads(out)
    assert rc == 0 and result["factory"] == factory
    mem = result["memory"]
    assert mem["total_allocated"] >= mem["total_required"] > 0
    assert "context_memory" not in {e["name"] for e in mem["entries"]}


def test_plan_is_the_live_setups_memory_without_context_memory() -> None:
    toys = ToyEngines.load()
    for dep in (toys.llm, toys.eagle):
        if dep.draft is None:
            setup = create_for_llm(ReferenceEngine.from_config(dep.base, device="host"), dep.base)
        else:
            setup = create_for_spec_decode(ReferenceEngine.from_config(dep.base, device="host"),
                                           ReferenceEngine.from_config(dep.draft, device="host"), dep)
        with setup:
            live = setup.memory_report()
        planned = planned_memory(dep)
        ctx = live.entry("context_memory")
        assert [e for e in live.entries if e.name != "context_memory"] == planned.entries
        assert planned.total_allocated == live.total_allocated - ctx.nbytes - 512
        assert planned.total_required == live.total_required - ctx.nbytes


def test_plan_an_8b_class_config_allocates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = LLMEngineConfig(hidden_size=4096, vocab_size=128256, max_supported_batch_size=8,
                          max_supported_input_length=4096, max_kv_cache_capacity=8192, num_attention_layers=36,
                          num_attention_heads=32, num_kv_heads=8, head_dim=128).validate()
    cfg.to_json(tmp_path / "big.json")
    t0 = time.perf_counter()
    rc, out, _ = run(capsys, "plan", str(tmp_path / "big.json"), "--json")
    assert rc == 0 and time.perf_counter() - t0 < 10
    entries = {e["name"]: e for e in json.loads(out)["memory"]["entries"]}
    assert entries["k_cache_35"]["nbytes"] == 8 * 8 * 8192 * 128 * 2  # [batch, kv heads, capacity, head dim] fp16
    assert json.loads(out)["memory"]["total_required"] > 36 * 2 * 8 * 8 * 8192 * 128 * 2


@pytest.mark.parametrize("target, needles", [
    (BASE_JSON, ["spec-decode base alone", "deployment"]),
    (DRAFT_JSON, ["spec-decode draft alone"]),
    (Path("/nonexistent/config.json"), ["no such config"]),
])
def test_plan_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], target: Path, needles: list[str]) -> None:
    rc, _, err = run(capsys, "plan", str(target))
    assert_one_line_error(rc, err, "plan", *needles)


def test_plan_corrupt_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text('{"base": {"hidden_size": 64,')
    rc, _, err = run(capsys, "plan", str(tmp_path))
    assert_one_line_error(rc, err, "plan", "not valid JSON")
    bad = json.loads(EAGLE_JSON.read_text())
    bad["spec"]["verify_size"] = 12
    (tmp_path / "config.json").write_text(json.dumps(bad))
    rc, _, err = run(capsys, "plan", str(tmp_path / "config.json"))
    assert_one_line_error(rc, err, "plan", "verify_size")


# -- the pieces: dry runs and binding tables ---------------------------------------------------------------


def test_dry_run_backend_hands_out_aligned_addresses_and_no_memory() -> None:
    be = DryRunBackend()
    a, b = be.alloc(100, trtio.Location.DEVICE), be.alloc(1 << 40, trtio.Location.DEVICE)  # a TiB: nothing happens
    assert a % 256 == 0 and b % 256 == 0 and b >= a + 256
    assert be.allocated[trtio.Location.DEVICE] == 100 + (1 << 40)
    be.memcpy(a, b, 10, 0)
    be.free(a, trtio.Location.DEVICE)
    with pytest.raises(ValueError, match=r"^alloc of 0 bytes: size must be positive$"):
        be.alloc(0, trtio.Location.DEVICE)


def test_dry_run_labels_equal_a_live_setups() -> None:
    toys = ToyEngines.load()
    with dry_run_setup(toys.eagle) as dry, create_for_spec_decode(
            ReferenceEngine.from_config(toys.eagle.base, device="host"),
            ReferenceEngine.from_config(toys.eagle.draft, device="host"), toys.eagle) as live:
        assert binding_labels(dry) == binding_labels(live)
        assert {r: [row["engine_tensor"] for row in rows] for r, rows in binding_rows(dry).items()} == \
            {r: [row["engine_tensor"] for row in rows] for r, rows in binding_rows(live).items()}


def test_dry_run_of_a_lone_base_or_draft_config() -> None:
    toys = ToyEngines.load()
    for name, role in (("toy-eagle/base", "base"), ("toy-eagle/draft", "draft")):
        with dry_run_setup(toys.config(name)) as setup:
            labels = binding_labels(setup)[role]
        assert set(labels) == set(reference_names(name))
    with pytest.raises(trtio.ConfigError, match="plain LLM base"):
        dry_run_setup(DeploymentConfig(toys.eagle.base))


def test_every_engine_name_is_covered_by_the_demo_configs() -> None:
    toys = ToyEngines.load()
    assert [toys.config(n).role for n in ENGINE_NAMES] == ["llm", "base", "draft"]


def test_inspect_a_file_that_is_not_a_plan_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model.plan").write_bytes(b"garbage!")
    rc, _, err = run(capsys, "inspect", str(tmp_path / "model.plan"))
    assert_one_line_error(rc, err, "inspect", "not a TensorRT plan")
    assert "CUDA device" not in err


def test_bench_reports_every_step_helper_of_both_contracts(capsys: pytest.CaptureFixture[str]) -> None:
    """``trtio bench`` at 8B-class scale on the dry-run backend (device work counted, not run): every
    helper of both contracts, beside prepare + execute, within the 16 device operations per call a step
    may enqueue. Timings are reported, never asserted."""
    from trtio._tools.bench_lora import ROWS as LORA_ROWS

    assert main(["bench", "--backend", "dry-run", "--steps", "3", "--rounds", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    helpers = {"LLMSetup.decode", "SpecDecodeSetup.draft_propose", "SpecDecodeSetup.verify", "SpecDecodeSetup.accept",
               "SpecDecodeSetup.draft_accept", "prepare + execute (decode, graph)",
               "prepare + execute (decode's own graph)", "prepare + execute (draft proposal, graph)",
               "speculative round (3 levels + verify + accept + draft_accept)",
               "speculative round, accepted paths new every round (1-4 nodes a sequence)"}
    assert out.keys() == {"batch", "ragged"}
    for contract, rows in out.items():
        # the ragged contract also times a LoRA engine's rows (issue 37), an MTP and a DFlash round, each also with
        # paths new every round (tests/test_bench.py), and a Gemma 4 decode (issue 34)
        extra = set(LORA_ROWS) | {"MTP round (chain of 3 + verify + accept + draft_accept)",
                                  "DFlash round (block of 8: verify + accept + draft_accept)",
                                  "MTP round, accepted paths new every round (1-4 nodes a sequence)",
                                  "DFlash round, accepted paths new every round (1-4 nodes a sequence)",
                                  "LLMSetup.decode, Gemma 4 (bounded SWA, KV sharing, dual RoPE, PLE)"} \
            if contract == "ragged" else set()
        assert rows.keys() == helpers | extra, contract
        for name, row in rows.items():
            # set_lora binds the adapter's own device copy: no device work (issue 37)
            assert 1 <= row["device_ops"] <= 16 or name in ("SpecDecodeSetup.accept", LORA_ROWS[2]), (contract, name,
                                                                                                    row)
            if name == "speculative round (3 levels + verify + accept + draft_accept)":  # its first level reads its
                # lengths on the device: no upload (tests/test_bench.py: the round of new paths)
                assert row["device_ops"] == 3 * rows["SpecDecodeSetup.draft_propose"]["device_ops"] + sum(
                    rows[f"SpecDecodeSetup.{h}"]["device_ops"] for h in ("verify", "accept", "draft_accept"))
            assert row["us_per_call_synced"] >= row["us_per_call"] > 0
            assert row["device_work_us"] is None, "the dry-run backend runs no device work to time"
        # Both contracts: the commit reads the starts verify staged, so moves that repeat are not copied again.
        assert rows["SpecDecodeSetup.accept"]["device_ops"] == 1, "one commit, no staged copy of repeated moves"


def test_bench_sequences_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    """``trtio bench --sequences`` on the dry-run backend: every call of sequences that come and go beside its
    whole-batch counterpart, the decode after admissions and releases enqueueing what a whole-batch decode does,
    and release / pin_prefix making no host synchronisation and enqueueing nothing. Timings are reported, never
    asserted."""
    assert main(["bench", "--sequences", "--backend", "dry-run", "--steps", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["sequences"]
    assert (out["kv_capacity"], out["page_size"], out["pool_pages"]) == (4096, 128, 8 * 32)
    rows = out["rows"]
    assert list(rows) == ["LLMSetup.decode, a batch of 8 prefilled whole",
                          "LLMSetup.decode, 8 slots after admissions and releases",
                          "LLMSetup.prefill, 16 tokens, the batch of 7 restarted (slots=None)",
                          "LLMSetup.prefill, 16 tokens, a batch of 1 restarted (slots=None)",
                          "LLMSetup.prefill(slots=[s]), 16 tokens, 7 others active",
                          "LLMSetup.release([s]), 7 others active", "LLMSetup.pin_prefix(s, 16)", "Prefix.release()",
                          "hybrid LLMSetup.decode, a batch of 8 prefilled whole",
                          "hybrid LLMSetup.decode, 8 slots after admissions and releases",
                          "hybrid admission: one slot's recurrent states zeroed (27 layers)"]
    for name, row in rows.items():
        assert row["us_per_call_synced"] >= row["us_per_call"] > 0, name
        assert row["host_syncs"] == 0, f"{name} synchronised the host"
    whole, churned = rows["LLMSetup.decode, a batch of 8 prefilled whole"], \
        rows["LLMSetup.decode, 8 slots after admissions and releases"]
    assert whole["device_ops"] == churned["device_ops"] == 1, "one graph launch per decode step, either way"
    admit = rows["LLMSetup.prefill(slots=[s]), 16 tokens, 7 others active"]
    assert admit["device_ops"] == rows["LLMSetup.prefill, 16 tokens, a batch of 1 restarted (slots=None)"]["device_ops"]
    for name in ("LLMSetup.release([s]), 7 others active", "LLMSetup.pin_prefix(s, 16)", "Prefix.release()"):
        assert rows[name]["device_ops"] == 0, f"{name} is host bookkeeping: nothing enqueued"
    hybrid_whole, hybrid_churned = rows["hybrid LLMSetup.decode, a batch of 8 prefilled whole"], \
        rows["hybrid LLMSetup.decode, 8 slots after admissions and releases"]
    assert hybrid_whole["device_ops"] == hybrid_churned["device_ops"] == 1
    assert rows["hybrid admission: one slot's recurrent states zeroed (27 layers)"]["device_ops"] == 1, \
        "one graph launch zeroes both kinds of state (conv, recurrent), every layer at once"
    targets = {t["what"]: t for t in out["targets"]}
    assert len(targets) == 7 and all(isinstance(t["met"], bool) for t in targets.values())
    assert targets["hybrid: decode after admissions and releases / whole-batch decode"]["value"] == pytest.approx(
        hybrid_churned["us_per_call_synced"] / hybrid_whole["us_per_call_synced"])
    assert targets["device operations per decode step, unchanged"]["met"]
    ratio = targets["decode after admissions and releases / whole-batch decode"]["value"]
    assert ratio == pytest.approx(churned["us_per_call_synced"] / whole["us_per_call_synced"])

    assert main(["bench", "--sequences", "--backend", "dry-run", "--steps", "3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Sequences that come and go at 8B-class scale (ragged contract: 36 layers, 8 slots, KV "
                           "capacity 4096, pages of 128 tokens, a pool of 256;")
    assert "| LLMSetup.release([s]), 7 others active: host time, no sync |" in text
    assert "| device operations per decode step, unchanged | 1 | = 1 | yes |" in text


def test_bench_sequences_is_for_the_ragged_contract(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "bench", "--sequences", "--contract", "batch", "--backend", "dry-run")
    assert_one_line_error(rc, err, "bench", "--contract", "ragged contract")
