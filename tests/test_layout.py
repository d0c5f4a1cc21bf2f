"""The package's import graph reads top-down: core <- setups <- tools, with testing beside the tools.

Every import statement of every module under ``trtio/`` counts, module-level or inside a function
(a lazy import is an arrow too). ``trtio/__init__.py`` is the public facade and re-exports from the
core and the setups; a library module reaching it (``import trtio``) would reach the setups.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trtio"

# What each layer may import. testing (the shipped toy model and reference engine) sits beside the
# tools: it may use the library, the library never uses it; tools may use it (the demo runs the toys).
ALLOWED = {
    "core": {"core"},
    "setups": {"core", "setups"},
    "testing": {"core", "setups", "testing"},
    "tools": {"core", "setups", "testing", "tools"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    if module == "trtio":
        return "facade"
    top = module.split(".")[1]
    if top == "setups":
        return "setups"
    if top == "testing":
        return "testing"
    if top in ("tools", "cli", "__main__"):
        return "tools"
    return "core"


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(module: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, imported trtio module) for every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] in ("trtio", "tests")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] not in ("trtio", "tests"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((node.lineno, sub if sub in known else target))
    return out


def _violations() -> list[str]:
    modules = _modules()
    known = set(modules)
    problems = []
    for module, path in sorted(modules.items()):
        if module == "trtio":
            continue  # the facade
        mine = layer_of(module)
        for line, target in _imports(module, path, known):
            where = f"{path.relative_to(ROOT)}:{line}"
            if target.split(".")[0] == "tests":
                problems.append(f"{where}: {module} imports test code ({target})")
                continue
            theirs = layer_of(target)
            if theirs == "facade" and mine in ("core", "setups"):
                problems.append(f"{where}: {module} ({mine}) imports the facade `trtio`, which re-exports the setups")
            elif theirs != "facade" and theirs not in ALLOWED[mine]:
                problems.append(f"{where}: {module} ({mine}) imports {target} ({theirs})")
    return problems


def test_import_graph_has_no_upward_arrow() -> None:
    assert _violations() == []


def test_the_checker_sees_an_upward_arrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is not vacuous: a core module importing a tool, lazily, is reported."""
    fake = tmp_path / "trtio"
    (fake / "tools").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "tools" / "__init__.py").write_text("")
    (fake / "tools" / "demo.py").write_text("X = 1\n")
    (fake / "engine.py").write_text("def f():\n    from trtio.tools.demo import X\n    return X\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert _violations() == ["trtio/engine.py:2: trtio.engine (core) imports trtio.tools.demo (tools)"]


def test_layers_are_what_the_design_says() -> None:
    assert layer_of("trtio.engine") == "core"
    assert layer_of("trtio.cuda.device") == "core"
    assert layer_of("trtio.setups.llm") == "setups"
    assert layer_of("trtio.tools.demo") == "tools"
    assert layer_of("trtio.cli") == "tools"
    assert layer_of("trtio.testing.reference_engine") == "testing"
