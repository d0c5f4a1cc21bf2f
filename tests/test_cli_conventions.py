"""What every ``trtio`` command shares (trtio._cli, trtio._tools.options): ``--version``, one exit-status convention
(2: the command line is wrong; 1: the command ran and failed), errors in the command line's words, a quiet end on a
closed standard output, the toy engine directories by name, and ``info`` telling why CUDA is not there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import trtio
from trtio._cli import EXIT_STATUS, build_parser, main
from trtio._cuda.backend import cuda_available
from trtio._tools import options

ROOT = Path(trtio.__file__).resolve().parents[1]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"trtio {command}: error: ") or lines[0].startswith("trtio: error: "), err
    return lines[0]


# -- --version ---------------------------------------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "--version")
    assert rc == 0 and out == f"trtio {trtio.__version__}\n" and not err


# -- one exit-status convention ----------------------------------------------------------------------------


USAGE_ERRORS = [  # the command line itself is wrong: status 2, before anything is read
    ["launch"],
    ["demo", "--frobnicate"],
    ["demo", "--contract", "all"],
    ["demo", "--backend", "gpu"],
    ["demo", "--engine", "onnx"],
    ["demo", "--module", "tensorrt_llm"],
    ["demo", "--max-new-tokens", "0"],
    ["demo", "--max-new-tokens", "65"],
    ["demo", "--contract", "ragged", "--engine", "trt"],
    ["demo", "--contract", "ragged", "--plans", "/somewhere"],
    ["demo", "--engine", "trt", "--backend", "host"],
    ["inspect"],
    ["inspect", "toy-llm", "--module", "tensorrt_llm"],
    ["plan", "a", "b"],
    ["plan", "toy-eagle3-ragged", "--draft-top-k", "0"],
    ["generate", "toy-llm-ragged"],
    ["generate", "toy-llm-ragged", "--prompt", "hi", "--backend", "gpu"],
    ["bench", "--contract", "all"],
    ["bench", "--sequences", "--contract", "batch"],
]

FAILURES = [  # the command ran and failed: status 1
    ["demo", "--engines", "/nonexistent/engines"],
    ["plan", "/nonexistent/config.json"],
    ["plan", "toy-gpt"],
    ["inspect", "engines/toy-eagle3-ragged", "--plugin", "libNvInfer_edgellm_plugin.so"],
    ["generate", "toy-llm-ragged", "--prompt", "hi", "--speculative"],
]


@pytest.mark.parametrize("argv", USAGE_ERRORS, ids=" ".join)
def test_a_wrong_command_line_is_status_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2, err
    line = one_line(err, argv[0] if argv[0] != "launch" else "")
    assert line.endswith("--help)"), "a usage error points at the command's help"
    assert "Traceback" not in err and not out


@pytest.mark.parametrize("argv", FAILURES, ids=" ".join)
def test_a_command_that_fails_is_status_1(capsys: pytest.CaptureFixture[str], argv: list[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    rc, _, err = run(capsys, *argv)
    assert rc == 1, err
    one_line(err, argv[0])


def test_the_convention_is_in_every_commands_help() -> None:
    parser = build_parser()
    assert EXIT_STATUS[2].startswith("the command line is wrong") and EXIT_STATUS[1].startswith("the command ran")
    texts = [parser.format_help()]
    sub = next(a for a in parser._actions if a.dest == "command")  # argparse keeps subparsers there
    texts += [p.format_help() for p in sub.choices.values()]  # type: ignore[union-attr]
    for text in texts:
        flat = " ".join(text.split())
        assert "exit status: 0 success; 1 the command ran and failed" in flat, text[:80]
        assert "2 the command line is wrong" in flat, text[:80]


# -- errors in the command line's words ----------------------------------------------------------------------


@pytest.mark.skipif(cuda_available(), reason="a CUDA device answers here")
@pytest.mark.parametrize("argv, option", [
    (["demo", "--backend", "cuda"], "--backend"),
    (["demo", "--engine", "trt"], "--engine"),
    (["bench", "--backend", "cuda", "--steps", "1", "--rounds", "1"], "--backend"),
    (["generate", "toy-llm-ragged", "--prompt", "hi", "--backend", "cuda"], "--backend"),
])
def test_no_cuda_is_said_in_options_not_calls(capsys: pytest.CaptureFixture[str], argv: list[str],
                                              option: str) -> None:
    rc, _, err = run(capsys, *argv)
    line = one_line(err, argv[0])
    assert rc == 1
    assert f"error: {option}: " in line and "no CUDA device is usable here" in line or "need a CUDA device" in line
    assert "get_backend(" not in line and "device must be" not in line
    assert "use --backend host" in line or "use --engine reference" in line


def test_a_bare_plugin_name_says_a_path_is_wanted(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    rc, _, err = run(capsys, "inspect", "engines/toy-eagle3-ragged", "--plugin", "libNvInfer_edgellm_plugin.so")
    line = one_line(err, "inspect")
    assert rc == 1 and "--plugin" in line and "path" in line


# -- a closed standard output --------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["info"], ["plan", "toy-eagle3-ragged"], ["--version"],
                                  ["demo", "--max-new-tokens", "2", "--backend", "host"]], ids=" ".join)
def test_a_closed_pipe_ends_quietly(argv: list[str], tmp_path: Path) -> None:
    """``trtio ... | head`` where head has gone: no traceback, no Errno 32, status 0."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        proc = subprocess.run([sys.executable, "-m", "trtio", *argv], stdout=write, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr


# -- toy engine directories by name ---------------------------------------------------------------------------


def test_toy_engines_by_name(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no engines/ here: the names resolve to the toy directories trtio comes with
    rc, out, err = run(capsys, "plan", "toy-eagle")
    assert rc == 0, err
    assert "create_for_spec_decode for " in out and "toy-eagle" in out
    rc, out, err = run(capsys, "plan", "toy-eagle3-ragged", "--json")
    assert rc == 0, err
    pytest.importorskip("tokenizers")
    rc, out, err = run(capsys, "generate", "toy-llm-ragged", "--prompt", "Once upon a time", "--max-new-tokens", "4")
    assert rc == 0, err
    assert out.startswith("Once upon a time")


def test_a_path_wins_over_a_toy_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toy-llm").mkdir()
    assert options.engine_path("toy-llm") == Path("toy-llm")
    assert options.engine_path("toy-llm-ragged") == trtio.testing.toy_engine_dir("toy-llm-ragged")
    with pytest.raises(trtio.ConfigError, match=r"toy-gpt: no such file or folder here, nor a toy engine directory"):
        options.engine_path("toy-gpt")
    assert options.engine_path("some/where") == Path("some/where"), "a path is left to the command to report"


# -- info --------------------------------------------------------------------------------------------------------


def test_info_without_a_driver_does_not_ask_for_a_driver_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where libcuda cannot be loaded there is no driver to update: info says so."""
    from cuda.bindings import driver

    def no_driver() -> tuple[int, int]:
        raise RuntimeError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(options, "cuda_available", lambda: False)
    monkeypatch.setattr(driver, "cuDriverGetVersion", no_driver)
    text = options.cuda_status()
    assert text == "no NVIDIA driver is installed: libcuda cannot be loaded"
    assert "insufficient" not in text.lower() and "update" not in text


def test_info_names_a_driver_older_than_cuda_python_and_both_ways_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda import bindings
    from cuda.bindings import driver

    major = int(bindings.__version__.split(".")[0])
    monkeypatch.setattr(options, "cuda_available", lambda: False)
    monkeypatch.setattr(driver, "cuDriverGetVersion", lambda: (0, (major - 1) * 1000 + 40))
    text = options.cuda_status()
    assert f"the NVIDIA driver supports CUDA {major - 1}.4, but cuda-python {bindings.__version__} needs a CUDA " \
           f"{major} driver" in text
    assert f"update the driver, or install the cuda-python of its CUDA (pip install 'cuda-python<{major}')" in text


def test_info_reports_why_no_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    rc, out, _ = run(capsys, "info", "--json")
    info = json.loads(out)
    assert rc == 0 and info["trtio"] == trtio.__version__
    if not cuda_available():
        assert info["why_no_cuda"] == options.cuda_status()
