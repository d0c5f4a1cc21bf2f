"""``trtio generate`` (trtio._tools.generate) on the toy directories, and the toy tokenizers and embedding tables
that make it run there (scripts/make_toy_assets.py).

The command runs in-process through ``trtio._cli.main``; its text must be the prompt followed by the decoded
greedy tokens of the toy model (:func:`trtio.testing.toy_runtime.greedy_generate`), speculatively or not.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trtio
from trtio._cli import main
from trtio._cuda.backend import cuda_available
from trtio.edgellm import EngineDir
from trtio.testing.toy_dirs import ASSETS_DIR, OWN_ASSETS, TOY_DIRECTORIES, linked_assets
from trtio.testing.toy_engines import RaggedToyEngines, ToyEngines, default_engines_dir
from trtio.testing.toy_runtime import greedy_generate

tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[1]
ENGINES = default_engines_dir()
PROMPT = "The quick brown fox"
LLM_DIRS = ("toy-llm-ragged", "toy-llm")
PAIR_DIRS = ("toy-eagle3-ragged", "toy-eagle")
VLM_DIRS = ("toy-vlm-ragged",)  # the vision-language toy (tests/test_vlm.py generates from it with images)
ASSETS = ("tokenizer.json", "tokenizer_config.json", "embedding.safetensors")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["generate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc: int, err: str, *needles: str) -> str:
    assert rc == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("trtio generate: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def tokenizer(name: str) -> Any:
    return tokenizers.Tokenizer.from_file(str(ENGINES / name / "tokenizer.json"))


def greedy_text(name: str, prompt: str, count: int, eos: int | None = 2) -> str:
    """What ``trtio generate`` must print: the prompt, then the toy model's greedy tokens (up to ``eos``)."""
    tok = tokenizer(name)
    ids = tok.encode(prompt).ids
    if name.endswith("-ragged"):
        toys: Any = RaggedToyEngines.load(ENGINES)
        engine = toys.reference_engine("toy-llm-ragged", device="host")
    else:
        toys = ToyEngines.load(ENGINES)
        engine = toys.reference_engine("toy-llm", device="host")
    with trtio.create_for_llm(engine, toys.llm_config) as setup:
        tokens = greedy_generate(setup, toys.embedding(), [ids], count)[0]
    if eos in tokens:
        tokens = tokens[:tokens.index(eos)]
    return prompt + tok.decode(tokens) + "\n"


# -- text out -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LLM_DIRS + PAIR_DIRS)
def test_generate_prints_the_toy_models_greedy_text(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, str(ENGINES / name), "--prompt", PROMPT, "--max-new-tokens", "12",
                       "--backend", "host")
    assert rc == 0, err
    assert out == greedy_text(name, PROMPT, 12)
    lines = err.strip().splitlines()
    assert lines[0] == (f"trtio generate: {ENGINES / name} has no engine files: running ReferenceEngines of its "
                        "configs with the toy model's seeded weights (trtio.testing)")
    assert lines[-1].startswith("trtio generate: 12 tokens in ") and lines[-1].endswith(" tokens/s")


@pytest.mark.parametrize("name", ["toy-llm-tp2", "toy-llm-tp4"])
def test_a_tensor_parallel_toy_directory_generates_through_its_ranks(name: str, capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Without engine files, the ranks run as ReferenceEngines on the host backend (each its share of the toy model
    that toy-llm-ragged computes whole): the one engine's greedy text, through a TensorParallelLLMSetup."""
    from trtio._setups.tensor_parallel import TensorParallelLLMSetup

    made: list[int] = []
    init = TensorParallelLLMSetup.__init__

    def spy(self: TensorParallelLLMSetup, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self.tp_size)

    monkeypatch.setattr(TensorParallelLLMSetup, "__init__", spy)
    rc, out, err = run(capsys, str(ENGINES / name), "--prompt", PROMPT, "--max-new-tokens", "12")
    assert rc == 0, err
    assert made == [int(name[-1])]
    assert tokenizer(name).to_str() == tokenizer("toy-llm-ragged").to_str()
    assert out == greedy_text("toy-llm-ragged", PROMPT, 12)
    assert "running its ranks as ReferenceEngines on the host backend" in err.splitlines()[0]
    rc, out, err = run(capsys, str(ENGINES / name), "--prompt", PROMPT, "--backend", "cuda")
    if cuda_available():
        one_line_error(rc, err, "--backend", "cuda needs engine files", "host backend only")
    else:  # the machine's lack comes first, in the option's words
        one_line_error(rc, err, "--backend: cuda: no CUDA device is usable here", "use --backend host")


@pytest.mark.parametrize("name", PAIR_DIRS)
@pytest.mark.parametrize("tree", [(), ("--draft-top-k", "2", "--draft-step", "3")])
def test_speculative_generation_prints_the_greedy_text(name: str, tree: tuple[str, ...],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, str(ENGINES / name), "--prompt", PROMPT, "--max-new-tokens", "20", "--speculative",
                       "--backend", "host", *tree)
    assert rc == 0, err
    assert out == greedy_text(name, PROMPT, 20)
    stats = err.strip().splitlines()[-1]
    assert stats.startswith("trtio generate: 20 tokens in ")
    assert " verify steps, " in stats and "% of drafted tokens accepted, " in stats
    assert stats.endswith(" accepted tokens per verify")


def test_the_statistics_count_rounds_and_accepted_tokens(tmp_path: Path) -> None:
    from trtio._tools.generate import GenerateOptions, run_generate

    out, err = _Text(), _Text()
    stats = run_generate(GenerateOptions(ENGINES / "toy-eagle", PROMPT, 30, speculative=True, draft_top_k=2,
                                         draft_step=3, backend="host"), out, err)
    assert stats["tokens"] == 30
    assert stats["drafted"] == 6 * stats["rounds"]
    assert 0 < stats["accepted"] <= stats["drafted"]
    # Every round emits its accepted tokens plus the base's own; the first token comes from the prefill.
    assert stats["rounds"] + stats["accepted"] + 1 >= 30 > stats["rounds"] + stats["accepted"] - 3
    assert stats["acceptance_rate"] == pytest.approx(stats["accepted"] / stats["drafted"])
    assert stats["accepted_per_verify"] == pytest.approx(stats["accepted"] / stats["rounds"])


class _Text:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_text_is_streamed_token_by_token() -> None:
    from trtio._tools.generate import GenerateOptions, run_generate

    out = _Text()
    run_generate(GenerateOptions(ENGINES / "toy-llm-ragged", PROMPT, 10, backend="host"), out, _Text())
    assert out.parts[0] == PROMPT
    assert out.parts[-1] == "\n"
    assert len(out.parts) >= 8, "one write per token (bar characters split across tokens), not one at the end"


# -- where generation stops -------------------------------------------------------------------------


def _copy(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(ENGINES / name, target)
    return target


@pytest.mark.parametrize(("name", "config", "speculative"), [("toy-llm-ragged", "config.json", False),
                                                             ("toy-eagle3-ragged", "base_config.json", False),
                                                             ("toy-eagle3-ragged", "base_config.json", True)])
def test_generation_stops_at_the_configs_end_token(name: str, config: str, speculative: bool, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    target = _copy(name, tmp_path)
    ids = tokenizer(name).encode(PROMPT).ids
    toys = RaggedToyEngines.load(ENGINES)
    with trtio.create_for_llm(toys.reference_engine("toy-llm-ragged", device="host"), toys.llm_config) as setup:
        greedy = greedy_generate(setup, toys.embedding(), [ids], 8)[0]
    data = json.loads((target / config).read_text())
    data["eos_token_id"] = [greedy[4]]
    (target / config).write_text(json.dumps(data))
    flags = ("--speculative",) if speculative else ()
    rc, out, err = run(capsys, str(target), "--prompt", PROMPT, "--max-new-tokens", "8", "--backend", "host", *flags)
    assert rc == 0, err
    stop = greedy.index(greedy[4])
    assert out == PROMPT + tokenizer(name).decode(greedy[:stop]) + "\n"
    assert f"trtio generate: {stop} tokens in " in err and "(stopped: end of sequence)" in err


def test_generation_stops_when_the_kv_cache_is_full(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, str(ENGINES / "toy-llm"), "--prompt", "Hello", "--max-new-tokens", "400",
                       "--backend", "host")
    assert rc == 0, err
    assert "trtio generate: 127 tokens in " in err
    assert "(stopped: the KV cache holds max_kv_cache_capacity (128) tokens)" in err


def test_the_end_token_of_a_trtio_toy_folder_comes_from_tokenizer_config(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    target = _copy("toy-llm", tmp_path)
    first = greedy_text("toy-llm", PROMPT, 1, eos=None)[len(PROMPT):-1]
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["eos_token"] = tokenizer("toy-llm").id_to_token(tokenizer("toy-llm").encode(first).ids[0])
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    rc, out, err = run(capsys, str(target), "--prompt", PROMPT, "--backend", "host")
    assert rc == 0, err
    assert out == PROMPT + "\n"
    assert "trtio generate: 0 tokens in " in err and "end of sequence" in err


# -- bad input: one line, exit 1 --------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["tokenizer.json", "embedding.safetensors"])
@pytest.mark.parametrize("name", ["toy-llm-ragged", "toy-eagle"])
def test_a_missing_runtime_file_is_named(missing: str, name: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    target = _copy(name, tmp_path)
    (target / missing).unlink()
    rc, out, err = run(capsys, str(target), "--prompt", PROMPT)
    one_line_error(rc, err, f"{target / missing}: no such file")
    assert out == ""


@pytest.mark.parametrize(("argv", "needles"), [
    (("{tmp}/nowhere", "--prompt", "x"), ("{tmp}/nowhere: no such engine directory",)),
    (("{tmp}", "--prompt", "x"), ("{tmp}: holds no engine config",)),
    (("{engines}/toy-llm-ragged", "--prompt", "x", "--speculative"),
     ("--speculative: needs a speculative pair", "holds a plain LLM")),
    (("{engines}/toy-llm", "--prompt", "x", "--draft-top-k", "2"), ("--draft-top-k: is for a speculative pair",)),
    (("{engines}/toy-eagle3-ragged", "--prompt", "x", "--speculative", "--draft-top-k", "3", "--draft-step", "3"),
     ("3 chains of 3 tokens need a draft tree of 9 nodes (the draft takes 8)",)),
    (("{engines}/toy-llm-ragged", "--prompt", "word " * 80), ("--prompt: ", "tokens, more than the engine takes",
                                                              "(max_supported_input_length 64)")),
    (("{engines}/toy-llm-ragged", "--prompt", ""), ("--prompt: '' has no tokens",)),
    # probe: more chains than a tree holds said "100 chains of 0 tokens need a draft tree of 0 nodes"
    (("{engines}/toy-eagle3-ragged", "--prompt", "x", "--speculative", "--draft-top-k", "100"),
     ("--draft-top-k: 100 chains of at least 1 token need a draft tree of 100 nodes and a verify tree of 101, but "
      "the draft takes 8 and the base 8: at most 7 chains",)),
    # probe: tree flags without --speculative were ignored (greedy decoding through the base alone)
    (("{engines}/toy-eagle3-ragged", "--prompt", "x", "--draft-top-k", "2"),
     ("--draft-top-k: shapes the draft tree of --speculative decoding", "(add --speculative)")),
    (("{engines}/toy-eagle3-ragged", "--prompt", "x", "--draft-step", "2"),
     ("--draft-step: shapes the draft tree of --speculative decoding",)),
    (("{engines}/toy-llm-tp2", "--prompt", "x", "--draft-top-k", "2"),
     ("--draft-top-k: is for a speculative pair", "holds a plain LLM")),
])
def test_bad_input_is_one_line(argv: tuple[str, ...], needles: tuple[str, ...], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    fill = {"tmp": str(tmp_path), "engines": str(ENGINES)}
    rc, _out, err = run(capsys, *(a.format(**fill) for a in argv), "--backend", "host")
    one_line_error(rc, err, *(n.format(**fill) for n in needles))


def test_a_config_json_of_neither_kind_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    rc, _out, err = run(capsys, str(tmp_path), "--prompt", PROMPT)
    one_line_error(rc, err, f"{tmp_path}: holds no engine config")


def test_a_corrupt_tokenizer_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = _copy("toy-llm-ragged", tmp_path)
    (target / "tokenizer.json").write_text("{not json")
    rc, _out, err = run(capsys, str(target), "--prompt", PROMPT)
    one_line_error(rc, err, f"{target / 'tokenizer.json'}: cannot be read by tokenizers")


def test_without_the_tokenizers_package_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    rc, _out, err = run(capsys, str(ENGINES / "toy-llm-ragged"), "--prompt", PROMPT)
    one_line_error(rc, err, "needs Hugging Face tokenizers", "pip install 'trtio[generate]'")


def test_generate_runs_as_a_command(tmp_path: Path) -> None:
    """``python -m trtio generate`` as a user runs it: exit 0, text on stdout."""
    proc = subprocess.run([sys.executable, "-m", "trtio", "generate", str(ENGINES / "toy-eagle3-ragged"), "--prompt",
                           PROMPT, "--max-new-tokens", "6", "--speculative", "--backend", "host"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == greedy_text("toy-eagle3-ragged", PROMPT, 6)


# -- the toy directories' tokenizers and embedding tables -------------------------------------------


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("make_toy_assets", ROOT / "scripts" / "make_toy_assets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _essentials(text: bytes) -> dict[str, Any]:
    """What makes a tokenizer.json this tokenizer (not how a tokenizers version lays the file out): the
    vocabulary, the merges (as pairs: versions write "a b" or ["a", "b"]), the special tokens, and the
    pre-tokenizer and decoder."""
    data = json.loads(text)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in data["model"]["merges"]]
    return {"vocab": data["model"]["vocab"], "merges": merges,
            "added": [(t["id"], t["content"], t["special"]) for t in data["added_tokens"]],
            "pre_tokenizer": data["pre_tokenizer"]["type"], "decoder": data["decoder"]["type"]}


def test_the_committed_toy_assets_are_what_the_script_makes() -> None:
    """One copy of each shared asset (toy-assets/), and in each toy directory a link to it (the vision-language
    toy's own tokenizer, which knows its image markers, excepted): the directories stay in Edge-LLM's layout
    without a copy of every file each."""
    script = _script()
    made = script.make_assets(ENGINES)
    assert sorted(made) == sorted([f"{ASSETS_DIR}/{a}" for a in ASSETS] +
                                  [f"{d}/{a}" for d, own in OWN_ASSETS.items() for a in own] +
                                  ["toy-gemma4-ragged/ple_embedding.safetensors"])
    for rel, data in made.items():
        committed = (ENGINES / rel).read_bytes()
        if rel.endswith("tokenizer.json"):
            assert _essentials(committed) == _essentials(data), rel
        else:
            assert committed == data, f"{rel} differs: run python3 scripts/make_toy_assets.py"
    links = script.links()
    assert sorted(links) == sorted(f"{d}/{a}" for d in TOY_DIRECTORIES for a in linked_assets(d))
    for rel, target in links.items():
        path = ENGINES / rel
        assert path.is_symlink() and str(path.readlink()) == target, f"{rel} is not a link to {target}"
        assert path.read_bytes() == (ENGINES / ASSETS_DIR / path.name).read_bytes()
    assert script.main(["--check"]) == 0


@pytest.mark.parametrize("name", LLM_DIRS + PAIR_DIRS + VLM_DIRS)
def test_the_toy_tokenizer_fits_the_config_and_round_trips_english(name: str) -> None:
    tok = tokenizer(name)
    assert tok.get_vocab_size() == 512
    assert tok.token_to_id("</s>") == 2, "the configs' eos_token_id"
    for text in ("The quick brown fox jumps over the lazy dog.", "Hello, world! 12 + 30 = 42", "naïve café"):
        ids = tok.encode(text).ids
        assert all(0 <= i < 512 for i in ids)
        assert tok.decode(ids) == text


@pytest.mark.parametrize("name", LLM_DIRS + PAIR_DIRS + VLM_DIRS)
def test_the_toy_embedding_file_holds_the_toy_table(name: str) -> None:
    toys: Any = RaggedToyEngines.load(ENGINES) if name.endswith("-ragged") else ToyEngines.load(ENGINES)
    want = toys.embedding().astype(np.float16)
    if name.endswith("-ragged"):
        got = EngineDir.open(ENGINES / name).embedding_table()
    else:
        from trtio._safetensors import read_safetensors

        got = read_safetensors(ENGINES / name / "embedding.safetensors")["embedding"].array
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)


def test_the_toy_assets_ship_in_the_wheel_once() -> None:
    """pyproject's package data for trtio._engines (engines/) takes each toy asset once (toy-assets/) and not the
    directories' links to it (a wheel would hold a copy per link)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["trtio._engines"]
    def ships(rel: str) -> bool:  # setuptools' glob: "*" stays within one folder name
        return any(len(p.split("/")) == len(rel.split("/")) and
                   all(fnmatch.fnmatchcase(x, y) for x, y in zip(rel.split("/"), p.split("/"))) for p in patterns)

    for asset in ASSETS:
        assert ships(f"{ASSETS_DIR}/{asset}"), f"{asset} is not package data"
        for d in TOY_DIRECTORIES:
            assert ships(f"{d}/{asset}") == (asset in OWN_ASSETS.get(d, ())), f"{d}/{asset}: shipped once, not twice"
    for d in VLM_DIRS:
        for rel in ("visual/config.json", "visual/preprocessor_config.json"):
            assert ships(f"{d}/{rel}"), f"{d}/{rel} is not package data"
