"""docs/: the user guide's code runs, the API reference covers ``trtio.__all__`` and ``trtio.testing.__all__``, and
the build (Sphinx, warnings as errors, nitpicky: .ci/run runs README's docs command) fails on a broken reference."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import trtio
import trtio.testing

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDES = sorted((DOCS / "guide").glob("*.md"))
TASKS = ["bind-an-engine", "check-against-hugging-face", "serve-sequences", "speculative-decoding",
         "tensor-parallelism", "testing-without-a-gpu"]


def _python_blocks(page: Path) -> list[tuple[int, str]]:
    text = page.read_text(encoding="utf-8")
    return [(text[:m.start()].count("\n") + 2, m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


def test_a_guide_page_per_task_in_the_index() -> None:
    assert [p.stem for p in GUIDES] == sorted(TASKS)
    index = (DOCS / "index.md").read_text()
    for task in TASKS:
        assert f"guide/{task}\n" in index, task


@pytest.mark.parametrize("page, line, code", [pytest.param(p, line, code, id=f"{p.stem}:{line}")
                                               for p in GUIDES for line, code in _python_blocks(p)])
def test_the_guides_code_runs(page: Path, line: int, code: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every Python block runs as written, on the toy engines; a block that needs a GPU says so on its first line
    (``# needs: ...``) and is compiled only."""
    compiled = compile(code, f"{page.name}:{line}", "exec")
    if code.startswith("# needs: "):
        assert "ENGINE_DIR" in code or "/path/to/" in code, "a block not run here uses placeholders only"
        return
    if trtio._cuda.backend.cuda_available() and "backend=\"host\"" not in code:
        pytest.skip("the guide's toy runs pick the cuda backend here, the reference engines the host")
    exec(compiled, {"__name__": "__guide__"})
    capsys.readouterr()


def _documented() -> set[str]:
    names = set()
    for page in (DOCS / "api").glob("*.rst"):
        names |= set(re.findall(r"^\.\. auto(?:function|class|exception|data):: ([\w.]+)", page.read_text(), re.M))
    return names


def test_the_api_reference_covers_every_public_name() -> None:
    documented = _documented()
    for module in (trtio, trtio.testing):
        for name in module.__all__:
            assert f"{module.__name__}.{name}" in documented, f"{module.__name__}.{name} has no entry in docs/api/"


def _build(docs: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-n", "-q", "-b", "html",
                           str(docs), str(out)], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_docs_build_and_fail_on_a_broken_reference(tmp_path: Path) -> None:
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    proc = _build(DOCS, tmp_path / "ok")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ok" / "api" / "trtio.html").is_file()
    for planted, needle in [
        ("See {py:func}`trtio.create_from_engine_directory`.", "trtio.create_from_engine_directory"),
        ("See {doc}`no-such-page`.", "no-such-page"),
        ("See {py:meth}`trtio.LLMSetup.prefil`.", "trtio.LLMSetup.prefil"),
    ]:
        docs = tmp_path / "docs"
        shutil.rmtree(docs, ignore_errors=True)
        shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("_build"))
        page = docs / "guide" / "serve-sequences.md"
        page.write_text(page.read_text() + f"\n{planted}\n")
        proc = _build(docs, tmp_path / "broken")
        assert proc.returncode != 0, f"the build passed with {planted!r}"
        assert needle in proc.stderr, proc.stderr
    docs = tmp_path / "docs"  # a public name without a page
    api = docs / "api" / "trtio.rst"
    api.write_text(re.sub(r"^\.\. autofunction:: trtio\.get_backend\n", "", (DOCS / "api" / "trtio.rst").read_text(),
                          flags=re.M))
    (docs / "guide" / "serve-sequences.md").write_text((DOCS / "guide" / "serve-sequences.md").read_text())
    proc = _build(docs, tmp_path / "uncovered")
    assert proc.returncode != 0 and "trtio.get_backend is in trtio.__all__ but not in the API reference" in proc.stderr
