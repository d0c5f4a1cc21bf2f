"""examples/: each runs as it is, on the toy engines, and produces the toy model's greedy tokens (serve.py: each
request's own, as if it ran alone).

The host tests run each example as a user would (a subprocess, the host backend), sampling with numpy and,
where torch is installed, with torch on the CPU (the same code the GPU runs). The ``gpu`` tests run them on
the cuda backend with torch and with CuPy, and check in-process that the device loops leave the host alone:
no trtio host synchronisation at all, and torch's only ones are the reads the examples make on purpose (one at
the end of greedy generation, one per speculative round).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import trtio
from trtio.testing.toy_engines import RaggedToyEngines, default_engines_dir
from trtio.testing.toy_runtime import greedy_generate

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ENGINES = default_engines_dir()
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _common() -> Any:
    """examples/common.py, imported as the examples import it."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import common
    finally:
        sys.path.remove(str(EXAMPLES))
    return common


def _example(name: str) -> Any:
    _common()
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


def greedy_tokens(count: int) -> list[list[int]]:
    """The toy model's greedy tokens for the examples' prompts (numpy, in-process)."""
    toys = RaggedToyEngines.load(ENGINES)
    prompts = _common().prompt_ids(ENGINES / "toy-llm-ragged")
    with trtio.create_for_llm(toys.reference_engine("toy-llm-ragged", device="host"), toys.llm_config) as setup:
        return greedy_generate(setup, toys.embedding(), prompts, count)


def run_example(name: str, *argv: str, cwd: Path) -> tuple[list[list[int]], str]:
    proc = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *argv], capture_output=True, text=True,
                          cwd=cwd, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    rows = [[int(t) for t in m.group(1).split(", ")]
            for m in re.finditer(r"^tokens \d+: \[([\d, ]+)\]$", proc.stdout, re.M)]
    return rows, proc.stdout.strip().splitlines()[-1]


ARRAYS = ["numpy", pytest.param("torch", marks=pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed"))]


@pytest.mark.parametrize("array", ARRAYS)
def test_generate_example_gives_the_greedy_tokens(array: str, tmp_path: Path) -> None:
    rows, last = run_example("generate", "--max-new-tokens", "16", "--backend", "host", "--array", array,
                             cwd=tmp_path)
    assert rows == greedy_tokens(16)
    assert re.fullmatch(rf"32 tokens in [\d.]+ s: [\d.]+ tokens/s \(host backend, sampling with {array}\)", last)


@pytest.mark.parametrize("array", ARRAYS)
@pytest.mark.parametrize("tree", [("--top-k", "2", "--depth", "3"), ("--top-k", "1", "--depth", "5")])
def test_speculative_example_gives_the_greedy_tokens(array: str, tree: tuple[str, ...], tmp_path: Path) -> None:
    rows, last = run_example("speculative", "--max-new-tokens", "16", "--backend", "host", "--array", array, *tree,
                             cwd=tmp_path)
    assert rows == greedy_tokens(16)
    assert re.fullmatch(rf"32 tokens in [\d.]+ s: [\d.]+ tokens/s, [\d.]+ accepted tokens per verify "
                        rf"\(host backend, sampling with {array}\)", last)


def test_examples_take_an_engine_directory(tmp_path: Path) -> None:
    for name in ("toy-llm-ragged", "toy-eagle3-ragged"):
        shutil.copytree(ENGINES / name, tmp_path / name)
    greedy = greedy_tokens(6)
    rows, _ = run_example("generate", str(tmp_path / "toy-llm-ragged"), "--max-new-tokens", "6", "--backend", "host",
                          cwd=tmp_path)
    assert rows == greedy
    rows, _ = run_example("speculative", str(tmp_path / "toy-eagle3-ragged"), "--max-new-tokens", "6", "--backend",
                          "host", cwd=tmp_path)
    assert rows == greedy


@pytest.mark.parametrize("array", ARRAYS)
def test_the_speculative_rounds_accept_draft_tokens(array: str) -> None:
    """The toy draft is right some of the time: rounds accept tokens, and fewer rounds than tokens are needed."""
    example, common = _example("speculative"), _common()
    tree = example.Tree(2, 3)
    setup, table, d2t = common.open_directory(ENGINES / "toy-eagle3-ragged", "host", draft_top_k=2, draft_step=3,
                                              verify_size=7)
    with setup, table:
        tokens, stats = example.speculative(setup, table, d2t, common.prompt_ids(ENGINES / "toy-eagle3-ragged"), 40,
                                            common.array_library(array, setup), tree)
    assert tokens == greedy_tokens(40)
    assert stats["accepted_per_verify"] > 0
    assert stats["rounds"] < 39


def test_the_fixed_tree_and_its_paths() -> None:
    tree = _example("speculative").Tree(2, 3)
    assert tree.parents.tolist() == [-1, 0, 0, 1, 2, 3, 4]
    assert tree.depth_of.tolist() == [0, 1, 1, 2, 2, 3, 3]
    assert tree.paths[6] == [0, 2, 4, 6] and tree.paths[0] == [0]
    assert tree.emit_columns[6].tolist() == [2, 4, 6, 7] and tree.emit_columns[0].tolist() == [7, 7, 7, 7]


def served_tokens(count: int, eos: set[int]) -> list[list[int]]:
    """What examples/serve.py must give each of its requests: its greedy tokens alone (numpy, in-process), up to
    its budget or its first end-of-sequence token."""
    toys = RaggedToyEngines.load(ENGINES)
    out = []
    with trtio.create_for_llm(toys.reference_engine("toy-llm-ragged", device="host"), toys.llm_config) as setup:
        for r in _example("serve").requests(ENGINES / "toy-llm-ragged", count):
            tokens = greedy_generate(setup, toys.embedding(), [r.prompt], r.budget)[0]
            out.append(tokens[:next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))])
    return out


def served(stdout: str) -> list[dict[str, Any]]:
    """serve.py's request lines."""
    pattern = (r"^request (\d+): (\d+) prompt tokens, arrived at step (\d+), admitted at step (\d+) into slot (\d+), "
               r"ended at step (\d+) \((end of sequence|its budget)\)$")
    return [{"arrived": int(m[3]), "admitted": int(m[4]), "slot": int(m[5]), "ended": int(m[6]), "why": m[7]}
            for m in re.finditer(pattern, stdout, re.M)]


def run_serve(*argv: str, cwd: Path) -> tuple[list[list[int]], list[dict[str, Any]], str]:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "serve.py"), *argv], capture_output=True, text=True,
                          cwd=cwd, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    rows = [[int(t) for t in m.group(1).split(", ")]
            for m in re.finditer(r"^tokens \d+: \[([\d, ]+)\]$", proc.stdout, re.M)]
    return rows, served(proc.stdout), proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("array", ARRAYS)
def test_serve_example_gives_each_request_its_greedy_tokens(array: str, tmp_path: Path) -> None:
    """Six requests over four slots, arriving at different steps: each gets exactly its greedy tokens alone, up to
    its budget or the toy config's end-of-sequence token (2); requests wait for a slot, and slots are reused."""
    rows, reqs, last = run_serve("--max-new-tokens", "16", "--backend", "host", "--array", array, cwd=tmp_path)
    want = served_tokens(16, {2})
    assert rows == want
    assert len(reqs) == 6 and sum(len(r) for r in rows) == sum(len(w) for w in want)
    assert [r["arrived"] for r in reqs] == [0, 0, 2, 3, 5, 6]
    assert any(r["admitted"] > r["arrived"] for r in reqs), "a request waited for a free slot"
    slots = [r["slot"] for r in reqs]
    assert len(set(slots)) == 4 < len(slots), "the four slots, reused"
    for a in reqs:  # a slot serves one request at a time
        for b in reqs:
            if a is not b and a["slot"] == b["slot"]:
                assert a["ended"] < b["admitted"] or b["ended"] < a["admitted"], (a, b)
    count = sum(len(r) for r in rows)
    assert re.fullmatch(rf"{count} tokens in [\d.]+ s: [\d.]+ tokens/s \(6 requests over 4 slots, \d+ steps; host "
                        rf"backend, sampling with {array}\)", last), last


def test_serve_example_ends_a_request_at_an_end_of_sequence_token(tmp_path: Path) -> None:
    """With ``--eos`` set to the fifth greedy token of request 0, request 0 ends there (its slot freed early) and every
    other request ends at that token's first occurrence or its budget; an engine directory is taken as an argument."""
    shutil.copytree(ENGINES / "toy-llm-ragged", tmp_path / "toy-llm-ragged")
    eos = served_tokens(16, set())[0][4]
    rows, reqs, _ = run_serve(str(tmp_path / "toy-llm-ragged"), "--max-new-tokens", "16", "--backend", "host",
                              "--eos", str(eos), cwd=tmp_path)
    assert rows == served_tokens(16, {eos})
    assert rows[0][-1] == eos and len(rows[0]) <= 5 and reqs[0]["why"] == "end of sequence"
    assert all((r["why"] == "end of sequence") == (row[-1] == eos) for r, row in zip(reqs, rows))


def test_serve_example_refuses_a_speculative_pair(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "serve.py"), str(ENGINES / "toy-eagle3-ragged"), "--backend",
                           "host"], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and "holds a speculative pair" in proc.stderr and "Traceback" not in proc.stderr


# -- on a GPU ---------------------------------------------------------------------------------------


def _gpu_arrays() -> list[Any]:
    return ["torch", "cupy"]


def _require(array: str) -> None:
    if array == "torch":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("torch has no CUDA here")
    else:
        pytest.importorskip("cupy")


@pytest.mark.gpu
@pytest.mark.parametrize("example", ["generate", "speculative"])
@pytest.mark.parametrize("array", _gpu_arrays())
def test_examples_on_the_gpu_give_the_greedy_tokens(example: str, array: str, tmp_path: Path) -> None:
    _require(array)
    pytest.importorskip("cupy")  # the toy ReferenceEngines compute with CuPy on a GPU
    rows, last = run_example(example, "--max-new-tokens", "16", "--backend", "cuda", "--array", array, cwd=tmp_path)
    assert rows == greedy_tokens(16)
    assert last.endswith(f"(cuda backend, sampling with {array})")


@pytest.mark.gpu
@pytest.mark.parametrize("array", _gpu_arrays())
def test_serve_example_on_the_gpu_gives_each_request_its_greedy_tokens(array: str, tmp_path: Path) -> None:
    _require(array)
    pytest.importorskip("cupy")  # the toy ReferenceEngines compute with CuPy on a GPU
    rows, reqs, last = run_serve("--max-new-tokens", "16", "--backend", "cuda", "--array", array, cwd=tmp_path)
    assert rows == served_tokens(16, {2}) and len(reqs) == 6
    assert last.endswith(f"cuda backend, sampling with {array})")


def _sync_warnings(torch: Any, run: Any) -> int:
    """How many synchronising CUDA operations torch performs in ``run()``."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message) for w in caught)


@pytest.mark.gpu
@pytest.mark.parametrize("array", _gpu_arrays())
def test_device_loops_make_no_host_synchronisation_per_step(array: str) -> None:
    """The greedy loop's syncs do not grow with its length (none per step; torch reads once at the end); the
    speculative loop's grow by one per round (the accepted chains, read for accept); trtio makes none."""
    _require(array)
    pytest.importorskip("cupy")
    common, greedy_example, spec_example = _common(), _example("generate"), _example("speculative")
    torch = pytest.importorskip("torch") if array == "torch" else None
    be = trtio.get_backend("cuda")
    prompts = common.prompt_ids(ENGINES / "toy-llm-ragged")

    setup, table, _ = common.open_directory(ENGINES / "toy-llm-ragged", "cuda")
    with setup, table:
        lib = common.array_library(array, setup)
        greedy_example.generate(setup, table, prompts, 4, lib)  # capture the graphs first
        syncs, counts = be.sync_count, []
        for n in (8, 24):
            if torch is not None:
                counts.append(_sync_warnings(torch, lambda n=n: greedy_example.generate(setup, table, prompts, n, lib)))
            else:
                greedy_example.generate(setup, table, prompts, n, lib)
        assert be.sync_count == syncs, "trtio synchronised the host in the greedy device loop"
        if torch is not None:
            assert counts[0] == counts[1], f"torch synchronised per step: {counts}"

    tree = spec_example.Tree(2, 3)
    setup, table, d2t = common.open_directory(ENGINES / "toy-eagle3-ragged", "cuda", draft_top_k=2, draft_step=3,
                                              verify_size=7)
    with setup, table:
        lib = common.array_library(array, setup)
        # capture the graphs first: a round's first level reads its lengths as a prefill or a catch-up left them, its
        # embeddings copied in its graph or not (a new address); the second run meets the pairs the first did not
        for _ in range(2):
            spec_example.speculative(setup, table, d2t, prompts, 8, lib, tree)
        syncs, counts, rounds = be.sync_count, [], []
        for n in (8, 24):
            def run(n: int = n) -> None:
                rounds.append(spec_example.speculative(setup, table, d2t, prompts, n, lib, tree)[1]["rounds"])

            if torch is not None:
                counts.append(_sync_warnings(torch, run))
            else:
                run()
        assert be.sync_count == syncs, "trtio synchronised the host in the speculative device loop"
        if torch is not None:
            assert counts[1] - counts[0] == rounds[1] - rounds[0], (counts, rounds)


# -- bad arguments: one line, no traceback ------------------------------------------------------------------

BAD_RUNS = [
    # (example, argv, exit status, what the one line says); each gave a traceback (or an AssertionError, a KeyError,
    # a ValueError of numpy), or ran on with nonsense (0 or negative token counts).
    ("generate", ["{tmp}/nowhere"], 1, "generate.py: error: {tmp}/nowhere: no such engine directory"),
    ("speculative", ["{tmp}/nowhere"], 1, "speculative.py: error: {tmp}/nowhere: no such engine directory"),
    ("serve", ["{tmp}/nowhere"], 1, "serve.py: error: {tmp}/nowhere: no such engine directory"),
    ("generate", ["{engines}/toy-eagle3-ragged"], 2,
     "generate.py: error: {engines}/toy-eagle3-ragged holds a speculative pair; generate.py takes a plain LLM"),
    ("speculative", ["{engines}/toy-llm-ragged"], 2,
     "speculative.py: error: {engines}/toy-llm-ragged holds a plain LLM; speculative.py takes a speculative pair"),
    ("generate", ["--max-new-tokens", "0"], 2, "argument --max-new-tokens: expected a positive int, got 0"),
    ("speculative", ["--max-new-tokens", "-5"], 2, "argument --max-new-tokens: expected a positive int, got -5"),
    ("serve", ["--max-new-tokens", "0"], 2, "argument --max-new-tokens: expected a positive int, got 0"),
    ("speculative", ["--top-k", "0"], 2, "argument --top-k: expected a positive int, got 0"),
    ("generate", ["--max-new-tokens", "100000"], 1,
     "generate.py: error: --max-new-tokens: 100000 tokens after a prompt of"),
    ("speculative", ["--max-new-tokens", "100000"], 1,
     "speculative.py: error: --max-new-tokens: 100000 tokens after a prompt of"),
    ("serve", ["--max-new-tokens", "100000"], 1, "serve.py: error: --max-new-tokens: 100000 tokens after a prompt of"),
    ("generate", ["{engines}/toy-llm"], 1, "generate.py: error: {engines}/toy-llm/config.json: builder_config: is "
                                           "required"),
]


@pytest.mark.parametrize(("name", "argv", "status", "needle"), BAD_RUNS,
                         ids=[f"{b[0]} {' '.join(b[1])}" for b in BAD_RUNS])
def test_bad_arguments_end_an_example_with_one_line(name: str, argv: list[str], status: int, needle: str,
                                                    tmp_path: Path) -> None:
    fill = {"tmp": str(tmp_path), "engines": str(ENGINES)}
    proc = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *(a.format(**fill) for a in argv),
                           "--backend", "host"], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert needle.format(**fill) in proc.stderr, proc.stderr
    if status == 1:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_an_array_library_that_is_not_installed_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "generate.py"), "--array", "cupy", "--backend", "host"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1
    assert proc.stderr.strip() == "generate.py: error: --array cupy: cupy is not installed here"


def test_the_largest_budget_the_kv_cache_allows_runs(tmp_path: Path) -> None:
    """The refusal is exact: the most new tokens --max-new-tokens names as the limit are generated."""
    proc = subprocess.run([sys.executable, str(EXAMPLES / "generate.py"), "--max-new-tokens", "100000", "--backend",
                           "host"], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    most = int(re.search(r"at most (\d+) here", proc.stderr).group(1))  # type: ignore[union-attr]
    rows, _ = run_example("generate", "--max-new-tokens", str(most), "--backend", "host", cwd=tmp_path)
    assert all(len(r) == most for r in rows)


# -- real_engine.py: a directory with engine files and a plugin, to tokens ------------------------------------------


def _stand_in_loader(loads: list[tuple[str, tuple[str, ...]]]) -> Any:
    """A stand-in for trtio.load_engine (same arguments): each toy engine file's ReferenceEngine (the toy model of
    its config), recording the file's name and the plugins it was given."""
    toys = RaggedToyEngines.load(ENGINES)
    names = {"llm.engine": "toy-llm-ragged", "spec_base.engine": "toy-eagle3-ragged/base",
             "spec_draft.engine": "toy-eagle3-ragged/draft"}

    def load(path: Any, module: Any = "auto", *, plugins: Any = ()) -> Any:
        loads.append((Path(path).name, tuple(str(p) for p in plugins)))
        return toys.reference_engine(names[Path(path).name], device="host")

    return load


@pytest.mark.skipif(trtio._cuda.backend.cuda_available(),
                    reason="the stand-in engines compute on the host; GPU runners bind real directories "
                           "(tests/test_edgellm_engines.py)")
@pytest.mark.parametrize("by_hand", [False, True], ids=["create_from_engine_dir", "load_engine"])
@pytest.mark.parametrize("name", ["toy-llm-ragged", "toy-eagle3-ragged"])
def test_the_real_engine_example_binds_a_directory_with_its_plugin(name: str, by_hand: bool, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The example's own code on a directory with engine files (stand-ins that compute the toy model, loaded
    where trtio loads plans): every engine file loaded once, with the plugin given, and the toy model's greedy
    tokens (speculatively for the pair) for its prompt."""
    tokenizers = pytest.importorskip("tokenizers")
    d = tmp_path / name
    shutil.copytree(ENGINES / name, d)
    for engine in trtio.EngineDir.open(d).engine_paths:
        engine.write_bytes(b"a serialized engine would be here")
    loads: list[tuple[str, tuple[str, ...]]] = []
    monkeypatch.setattr("trtio._setups.engine_dir.load_engine", _stand_in_loader(loads))
    monkeypatch.setattr(trtio, "load_engine", _stand_in_loader(loads))
    plugin = "/opt/edgellm/lib/libNvInfer_edgellm_plugin.so"
    monkeypatch.setattr(sys, "argv", ["real_engine.py", str(d), "--plugin", plugin, "--max-new-tokens", "12",
                                      *(["--load-engine"] if by_hand else [])])
    _example("real_engine").main()
    out = capsys.readouterr().out
    rows = [[int(t) for t in m.group(1).split(", ")] for m in re.finditer(r"^tokens \d+: \[([\d, ]+)\]$", out, re.M)]
    toys = RaggedToyEngines.load(ENGINES)
    ids = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json")).encode("Once upon a time").ids
    with trtio.create_for_llm(toys.reference_engine("toy-llm-ragged", device="host"), toys.llm_config) as setup:
        assert rows == greedy_generate(setup, toys.embedding(), [ids], 12)
    files = ["llm.engine"] if name == "toy-llm-ragged" else ["spec_base.engine", "spec_draft.engine"]
    assert sorted(loads) == sorted((f, (plugin,)) for f in files)
    assert re.search(r"^12 tokens in [\d.]+ s: [\d.]+ tokens/s \((greedy|speculative, [\d.]+ accepted tokens per "
                     r"verify), host backend\)$", out, re.M), out


def test_the_real_engine_example_refuses_configs_only_and_a_missing_plugin(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "real_engine.py"), str(ENGINES / "toy-llm-ragged")],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and "holds configs only (no llm.engine)" in proc.stderr
    assert "examples/generate.py" in proc.stderr
    d = tmp_path / "with-engines"
    shutil.copytree(ENGINES / "toy-llm-ragged", d)
    (d / "llm.engine").write_bytes(b"x")
    env = {k: v for k, v in os.environ.items() if k != "EDGELLM_PLUGIN_PATH"}
    proc = subprocess.run([sys.executable, str(EXAMPLES / "real_engine.py"), str(d)], capture_output=True, text=True,
                          cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and "need its plugin library: pass --plugin PATH" in proc.stderr
