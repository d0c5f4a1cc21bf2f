"""README.md's code blocks: each one is run somewhere in CI, by its marker (scripts/readme_blocks.py): .ci/run
runs the main, test and docs commands, scripts/check_wheel.sh the ``ci:wheel`` blocks from a wheel, this file the
``ci:checkout`` ones from the checkout and the ``ci:stand-in`` ones on stand-in engines; a ``ci:not-run`` block
(it needs a GPU, TensorRT or NVIDIA's package index) has its command lines checked: they parse, and the extras,
markers, scripts and examples they name exist."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trtio
import trtio.testing
from trtio._cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import readme_blocks  # noqa: E402 - from scripts/, as .ci/run and check_wheel.sh run it

sys.path.remove(str(ROOT / "scripts"))

BLOCKS = readme_blocks.blocks(ROOT / "README.md")


def _ids(kind: str) -> list[Any]:
    return [pytest.param(b, id=f"line{b.line}") for b in BLOCKS if b.kind == kind]


def _lines(block: readme_blocks.Block) -> list[list[str]]:
    """The block's commands, split as the shell splits them (comments and environment assignments dropped)."""
    commands: list[list[str]] = []
    for line in block.text.replace("\\\n", " ").splitlines():
        command: list[str] = []
        for word in shlex.split(line, comments=True) + ["&&"]:
            if word != "&&":
                if command or not re.fullmatch(r"[A-Z_]+=\S*", word):  # VAR=value before a command: dropped
                    command.append(word)
            elif command:
                commands.append(command)
                command = []
    return commands


def test_every_block_says_where_ci_runs_it() -> None:
    assert BLOCKS, "README.md has code blocks"
    for b in BLOCKS:
        assert b.kind in readme_blocks.KINDS, f"README.md:{b.line}: no ci: marker on the line before the block"
        if b.kind in ("ci:not-run", "ci:stand-in"):
            assert len(b.reason) > 20, f"README.md:{b.line}: say why CI cannot run it"
        assert b.lang in ("bash", "python"), f"README.md:{b.line}: a {b.lang!r} block"
    for kind in ("ci:main-command", "ci:test-command", "ci:docs-command"):
        assert sum(b.kind == kind for b in BLOCKS) == 1, kind


def test_ci_runs_the_marked_commands_and_the_wheel_blocks() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 scripts/readme_blocks.py command" in ci
    for kind in ("ci:main-command", "ci:test-command", "ci:docs-command"):
        assert re.search(rf"^(run_readme|main_cmd=\$\(readme) {kind}\b", ci, re.M), f".ci/run does not run {kind}"
    assert re.search(r'readme_blocks\.py"? write ci:wheel', (ROOT / "scripts" / "check_wheel.sh").read_text())
    assert "bash scripts/check_wheel.sh" in ci
    test = next(b for b in BLOCKS if b.kind == "ci:test-command").text
    assert "-ra" not in test and "-q" in test, "a short summary: skips counted, not listed"
    assert re.search(r"-m \"not slow and not rtx\"", test)
    assert 'pytest -q -m "slow or rtx"' in ci, ".ci/run also runs what the test command leaves out"


def test_ci_runs_the_test_command_as_a_newcomer_gets_it_then_what_the_test_only_packages_enable() -> None:
    """.ci/run runs the README's test command in a fresh virtual environment before any test-only package is
    installed (a test that needs torch, transformers or Pillow must skip cleanly there, as it does for a newcomer),
    and only then installs .ci/requirements.txt and runs the tests that skipped for want of them."""
    ci = (ROOT / ".ci" / "run").read_text()

    def where(pattern: str) -> int:
        found = re.search(pattern, ci, re.M)
        assert found, f".ci/run: nothing matches {pattern!r}"
        return found.start()

    venv, activate = where(r"^python3 -m venv "), where(r"^\. \S*/bin/activate\b")
    main, test = where(r"^main_cmd=\$\(readme ci:main-command"), where(r"^run_readme ci:test-command\b")
    packages = where(r"^python3 -m pip install .*-r \.ci/requirements\.txt")
    rerun = where(r"^python3 -m pytest .*--rerun-import-skips")
    assert venv < activate < main < test < packages < rerun
    assert ci.count("-r .ci/requirements.txt") == 1, "one install of the test-only packages, after the test command"


@pytest.mark.slow  # runs pytest twice in subprocesses (about 25 s of CPU): .ci/run's slow step runs it
def test_the_tests_skipped_for_want_of_a_package_are_recorded_and_rerun_alone(tmp_path: Path) -> None:
    """tests/conftest.py records the tests a run skipped because a package could not be imported
    (pytest.importorskip, or a skip saying the package "is not installed"; a module skipped whole at collection
    too), and ``--rerun-import-skips`` runs only those: .ci/run's run after .ci/requirements.txt, on pytest-xdist's
    workers as there."""
    pytest.importorskip("xdist")
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_some.py").write_text(
        "import importlib.util\n"
        "import pytest\n\n"
        "def test_runs():\n    pass\n\n"
        "def test_imports_it():\n    pytest.importorskip('trtio_ci_probe')\n\n"
        "@pytest.mark.skipif(importlib.util.find_spec('trtio_ci_probe') is None,\n"
        "                    reason='trtio_ci_probe is not installed')\n"
        "@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_marked(n):\n    pass\n\n"
        "def test_skips_for_another_reason():\n    pytest.skip('not here')\n")
    (tmp_path / "test_whole.py").write_text(
        "import pytest\n\npytest.importorskip('trtio_ci_probe')\n\n"
        "def test_one():\n    pass\n\ndef test_two():\n    pass\n")

    def pytest_run(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout.strip().splitlines()[-1]

    assert re.match(r"1 passed, 5 skipped", pytest_run()), "the first run: the probe is missing"
    recorded = json.loads((tmp_path / ".pytest_cache" / "v" / "trtio" / "import-skips").read_text())
    assert recorded == ["test_some.py::test_imports_it", "test_some.py::test_marked[1]",
                        "test_some.py::test_marked[2]", "test_whole.py"]
    (tmp_path / "trtio_ci_probe.py").write_text("")  # the package is installed now
    # the five it skipped, and neither test_runs nor the other skip (xdist's workers count no deselection)
    assert re.fullmatch(r"5 passed in [\d.]+s", pytest_run("--rerun-import-skips"))


@pytest.mark.parametrize("block", _ids("ci:checkout"))
def test_checkout_blocks_run(block: readme_blocks.Block, tmp_path: Path) -> None:
    script = tmp_path / "block.sh"
    script.write_text(block.text)
    proc = subprocess.run(["bash", "-euo", "pipefail", str(script)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, f"README.md:{block.line}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


def _stand_in_loader(loads: list[str]) -> Any:
    from trtio.testing.toy_engines import RaggedToyEngines

    toys = RaggedToyEngines.load()

    def load(path: Any, module: Any = "auto", *, plugins: Any = ()) -> Any:
        loads.append(f"{Path(path).name} {list(map(str, plugins))}")
        return toys.reference_engine("toy-llm-ragged", device="host")

    return load


@pytest.mark.skipif(trtio._cuda.backend.cuda_available(), reason="the stand-in engines compute on the host")
@pytest.mark.parametrize("block", _ids("ci:stand-in"))
def test_stand_in_blocks_run(block: readme_blocks.Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    """The real-engine snippet, ENGINE_DIR a copy of toy-llm-ragged with an llm.engine, which the stand-in for
    load_engine (where create_from_engine_dir loads plans) gives a ReferenceEngine of: it runs as written and
    prints the toy model's greedy tokens."""
    assert block.lang == "python" and "ENGINE_DIR" in block.text
    d = tmp_path / "engine-dir"
    shutil.copytree(trtio.testing.toy_engine_dir("toy-llm-ragged"), d)
    (d / "llm.engine").write_bytes(b"a serialized engine would be here")
    loads: list[str] = []
    monkeypatch.setattr("trtio._setups.engine_dir.load_engine", _stand_in_loader(loads))
    exec(compile(block.text.replace("ENGINE_DIR", str(d)), f"README.md:{block.line}", "exec"), {})
    printed = capsys.readouterr().out
    assert loads == ["llm.engine ['/path/to/libNvInfer_edgellm_plugin.so']"], "the plugin reached load_engine"
    from trtio.testing import greedy_generate
    from trtio.testing.toy_engines import RaggedToyEngines

    toys = RaggedToyEngines.load()
    table = np.array(trtio.EngineDir.open(d).embedding_table())
    with trtio.create_for_llm(toys.reference_engine("toy-llm-ragged", device="host"), toys.llm_config) as setup:
        assert printed.strip() == str(greedy_generate(setup, table, [[1, 2, 3, 4]], 16))


def _extras() -> set[str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def _markers() -> set[str]:
    tomllib = pytest.importorskip("tomllib")
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    return {m.split(":")[0] for m in found}


def _check_command(words: list[str], where: str) -> None:
    """A README command line that is not run here: what it names exists and its arguments parse."""
    if words[:3] == ["python3", "-m", "trtio"]:
        try:
            build_parser().parse_args(words[3:])
        except SystemExit as exc:
            raise AssertionError(f"{where}: {' '.join(words)} does not parse (exit {exc.code})") from None
    elif words[:4] == ["python3", "-m", "pip", "install"]:
        for spec in words[4:]:
            extras = re.fullmatch(r"(?:\.|trtio)\[([\w,-]+)\]", spec)
            if extras:
                missing = set(extras.group(1).split(",")) - _extras()
                assert not missing, f"{where}: no extra {missing} in pyproject.toml"
        for flag, path in zip(words[4:], words[5:]):
            if flag == "-r":
                assert (ROOT / path).is_file(), f"{where}: no {path}"
    elif words[:3] == ["python3", "-m", "pytest"]:
        if "-m" in words[3:]:
            expr = words[words.index("-m", 3) + 1]
            names = set(re.findall(r"[a-z_0-9]+", expr)) - {"and", "or", "not"}
            assert names <= _markers(), f"{where}: unknown markers {names - _markers()}"
    elif words[0] == "bash":
        assert (ROOT / words[1]).is_file(), f"{where}: no {words[1]}"
    elif words[0] == "python3" and words[1].startswith("examples/"):
        path = ROOT / words[1]
        assert path.is_file(), f"{where}: no {words[1]}"
        spec = importlib.util.spec_from_file_location("readme_example", path)
        assert spec is not None and spec.loader is not None
        sys.path.insert(0, str(path.parent))
        try:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            try:
                module.build_parser().parse_args(words[2:])
            except SystemExit as exc:
                raise AssertionError(f"{where}: {' '.join(words)} does not parse (exit {exc.code})") from None
        finally:
            sys.path.remove(str(path.parent))
    else:
        raise AssertionError(f"{where}: no check for {' '.join(words)}; run it somewhere or teach this test")


@pytest.mark.parametrize("block", _ids("ci:not-run"))
def test_blocks_not_run_here_name_what_exists_and_parse(block: readme_blocks.Block) -> None:
    commands = _lines(block)
    assert commands, f"README.md:{block.line}: no command"
    for words in commands:
        _check_command(words, f"README.md:{block.line}")


@pytest.mark.parametrize("block", [pytest.param(b, id=f"line{b.line}") for b in BLOCKS
                                   if b.kind in ("ci:wheel", "ci:checkout") and b.lang == "bash"])
def test_the_trtio_lines_of_the_run_blocks_parse_too(block: readme_blocks.Block) -> None:
    """Quick to see here what the wheel check would say at the end of CI: every trtio line parses."""
    for words in _lines(block):
        if words[:3] == ["python3", "-m", "trtio"]:
            _check_command(words, f"README.md:{block.line}")


def test_the_python_blocks_read_no_checkout_paths() -> None:
    """The Python snippets run from a wheel: no path into a checkout (engines/..., examples/...)."""
    for b in BLOCKS:
        if b.lang == "python":
            assert not re.search(r"[\"'](engines|examples|scripts)/", b.text), f"README.md:{b.line}"
            compile(b.text, f"README.md:{b.line}", "exec")
