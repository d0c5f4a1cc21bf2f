"""The package's import graph reads top-down: core <- setups <- tools, with testing beside the tools,
and has no cycle, between layers or within one.

Every import statement of every module under ``trtio/`` counts, module-level or inside a function
(a lazy import is an arrow too). ``trtio/__init__.py`` is the public facade and re-exports from the
core and the setups; a library module reaching it (``import trtio``) would reach the setups.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trtio"

# What each layer may import. testing (the shipped toy model and reference engine) sits beside the
# tools: it may use the library, the library never uses it; tools may use it (the demo runs the toys).
ALLOWED = {
    "core": {"core"},
    "setups": {"core", "setups"},
    # an engine beside the LLM (trtio/components/<name>/, DESIGN §18): its config, preprocessing, binding and setup
    "components": {"core", "setups", "components"},
    # the family table (trtio/families/family_table.py): it imports every family, the facade imports it
    "tables": {"core", "setups", "tables"},
    "testing": {"core", "setups", "components", "tables", "testing"},
    "tools": {"core", "setups", "components", "tables", "testing", "tools"},
}
# The public facade: the package (re-exports the setups) and trtio.types (re-exports the types they return or take).
FACADE = ("trtio", "trtio.types")
# The public modules of components (``trtio.audio``: the audio component's host-side steps) sit with them.
COMPONENT_FACES = {"audio", "vision"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    if module in FACADE:
        return "facade"
    top = module.split(".")[1]
    if top == "families":  # a family's module sits where its place says (PLUGIN_PLACES); the table above the setups
        place = PLUGIN_PLACES.get(module.partition(".")[2])
        return "tables" if module in PLUGIN_TABLES else "setups" if place == "setups" else "core"
    if top == "_setups":
        return "setups"
    if top == "components" or top in COMPONENT_FACES:
        return "components"
    if top == "testing":
        return "testing"
    if top in ("_tools", "_cli", "__main__"):
        return "tools"
    return "core"


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once for every check of this file (they only read it)."""
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


@pytest.fixture(scope="module", autouse=True)
def _trees_dropped_after_this_file() -> Iterator[None]:
    """The syntax trees go when this file's checks end. Kept, their half a million objects would be walked by every
    later ``gc.collect()`` of the worker (0.3 s each instead of 0.01 s: the lifetime and stream-order tests make
    hundreds)."""
    yield
    _parsed.cache_clear()


def _imports(module: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, imported trtio module) for every import in ``path``."""
    tree = _parsed(path)
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
        if module in FACADE:
            continue  # the facade: it re-exports
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


def _arrows() -> dict[str, dict[str, str]]:
    """module -> {imported trtio module: where the first such import is ("trtio/x.py:12")}."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, dict[str, str]] = {}
    for module, path in sorted(modules.items()):
        out = graph.setdefault(module, {})
        for line, target in sorted(_imports(module, path, known)):
            if target in known:
                out.setdefault(target, f"{path.relative_to(ROOT)}:{line}")
    return graph


def _strongly_connected(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def _cycle_through(graph: dict[str, dict[str, str]], start: str, members: set[str]) -> list[str]:
    """A shortest cycle from ``start`` back to it inside ``members`` (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w in members and w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"{start} is on no cycle inside {sorted(members)}")


def _cycles() -> list[str]:
    """One line per import cycle (per strongly connected group of modules): each arrow and where it is."""
    graph = _arrows()
    problems = []
    for component in _strongly_connected(graph):
        first = component[0]
        if len(component) == 1 and first not in graph[first]:
            continue
        cycle = _cycle_through(graph, first, set(component))
        arrows = " -> ".join(f"{b} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:]))
        problems.append(f"import cycle: {first} -> {arrows}")
    return problems


def test_import_graph_has_no_upward_arrow() -> None:
    assert _violations() == []


def test_the_checker_sees_an_upward_arrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is not vacuous: a core module importing a tool, lazily, is reported."""
    fake = tmp_path / "trtio"
    (fake / "_tools").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "_tools" / "__init__.py").write_text("")
    (fake / "_tools" / "demo.py").write_text("X = 1\n")
    (fake / "_engine.py").write_text("def f():\n    from trtio._tools.demo import X\n    return X\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert _violations() == ["trtio/_engine.py:2: trtio._engine (core) imports trtio._tools.demo (tools)"]


def test_import_graph_has_no_cycle() -> None:
    assert _cycles() == []


def _fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> None:
    fake = tmp_path / "trtio"
    for name, text in {"__init__.py": "", **files}.items():
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)


def test_the_checker_sees_a_cycle_within_a_layer_through_a_lazy_import(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_package(tmp_path, monkeypatch, {
        "_config.py": "from trtio._rope import R\n",
        "_rope.py": "from trtio import _dims\n",
        "_dims.py": "def f():\n    from trtio._config import C\n    return C\n",
        "names.py": "from trtio._dims import f\n",  # on the way into the cycle, not on it
    })
    assert _cycles() == ["import cycle: trtio._config -> trtio._rope (trtio/_config.py:1) -> trtio._dims "
                         "(trtio/_rope.py:1) -> trtio._config (trtio/_dims.py:2)"]


def test_the_checker_sees_a_cycle_across_layers_and_a_module_importing_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_package(tmp_path, monkeypatch, {
        "_tools/__init__.py": "",
        "_tools/plan.py": "import trtio._engine\n",
        "_engine.py": "import os\n\ndef g():\n    import trtio._tools.plan\n",
        "_trt.py": "def h():\n    from trtio import _trt\n",
    })
    assert _cycles() == [
        "import cycle: trtio._engine -> trtio._tools.plan (trtio/_engine.py:4) -> trtio._engine "
        "(trtio/_tools/plan.py:1)",
        "import cycle: trtio._trt -> trtio._trt (trtio/_trt.py:2)",
    ]


def test_layers_are_what_the_design_says() -> None:
    assert layer_of("trtio._engine") == "core"
    assert layer_of("trtio._cuda.device") == "core"
    assert layer_of("trtio._setups.llm") == "setups"
    assert layer_of("trtio.components.audio.audio_setup") == "components"
    assert layer_of("trtio.audio") == "components"
    assert layer_of("trtio._tools.demo") == "tools"
    assert layer_of("trtio._cli") == "tools"
    assert layer_of("trtio.testing.reference_engine") == "testing"


# The core reads bottom up in three sub-layers: memory (errors, backends, streams, tensors, foreign arrays, the
# arena and the staging ring) <- binding (configs, registries, the executor) <- steps (device work, pages, the engine
# state, the contracts, PipelineIO, trees, the VLM glue, engine directories: they gather their token embeddings on
# the device) <- setups. A new core module is placed here (an unplaced one is reported).
CORE_SUBLAYERS = {
    "memory": {"errors", "_checks", "_cache", "_hashing", "_json", "_lifetime", "_safetensors", "_dtypes", "_cuda",
               "_stream", "_dlpack", "_foreign", "_tensor", "_inputs", "_memory", "_staging"},
    "binding": {"names", "_dims", "_rope", "_config", "_edgellm_config",
                "_checkpoint", "features", "_registry", "_tensor_map", "_engine", "_trt",
                "_collectives", "_nccl"},
    "steps": {"_ops", "_trees", "_pages", "_embeddings", "edgellm", "_state", "_contracts", "_pipeline_io"},
}
SUBLAYER_ORDER = ("memory", "binding", "steps", "setups")


# A family's or a component's modules (trtio/families/<name>/, trtio/components/<name>/) each sit in the sub-layer
# of what they are: a typed config beside the configs, pools and step work beside the engine state, a setup's part
# among the setups. Their packages' __init__ files say what the family is and import nothing.
PLUGIN_PLACES = {
    "families": "steps",
    "families.hybrid": "binding", "families.hybrid.hybrid_config": "binding",
    "families.mrope": "binding", "families.mrope.mrope_config": "binding",
    "families.lora": "binding", "families.lora.lora_config": "binding",
    "families.spec": "binding", "families.spec.spec_config": "binding",
    "families.hybrid.recurrent": "steps", "families.hybrid.snapshots": "steps", "families.hybrid.replay": "steps",
    "families.hybrid.hybrid_feature": "setups",
    "families.mrope.slot_positions": "steps", "families.mrope.mrope_feature": "setups",
    "families.lora.adapters": "binding", "families.lora.lora_feature": "setups",
    "families.spec.dflash_bindings": "binding", "families.spec.dflash": "setups",
    "families.spec.block_family": "binding", "families.spec.jetspec": "binding", "families.spec.dspark": "binding",
    "families.gemma4": "binding", "families.gemma4.gemma4_config": "steps", "families.gemma4.swa": "steps",
    "families.gemma4.ple": "setups", "families.gemma4.gemma4_feature": "setups",
    "families.gemma4_mtp": "binding", "families.gemma4_mtp.gemma4_mtp_config": "steps",
    "families.gemma4_mtp.assistant": "setups", "families.gemma4_mtp.gemma4_mtp_feature": "setups",
    "families.gemma4_mtp.ddtree": "binding",
}


def sublayer_of(module: str) -> str | None:
    """The core sub-layer of a trtio module ("setups" for the setups; None outside core and setups)."""
    layer = layer_of(module)
    if layer == "setups":
        return "setups"
    if layer != "core":
        return None
    top = module.split(".")[1]
    if top in PLUGIN_TOPS:
        return PLUGIN_PLACES.get(module.partition(".")[2], "unplaced")
    for name, members in CORE_SUBLAYERS.items():
        if top in members:
            return name
    return "unplaced"


def _sublayer_violations() -> list[str]:
    modules = _modules()
    known = set(modules)
    problems = []
    for module, path in sorted(modules.items()):
        mine = sublayer_of(module) if module != "trtio" else None
        if mine is None:
            continue
        if mine == "unplaced":
            problems.append(f"{path.relative_to(ROOT)}: {module} is in no core sub-layer (tests/test_layout.py)")
            continue
        for line, target in _imports(module, path, known):
            theirs = sublayer_of(target) if target.split(".")[0] == "trtio" and target != "trtio" else None
            if theirs in SUBLAYER_ORDER and SUBLAYER_ORDER.index(theirs) > SUBLAYER_ORDER.index(mine):
                problems.append(f"{path.relative_to(ROOT)}:{line}: {module} ({mine}) imports {target} ({theirs})")
    return problems


def test_the_core_reads_bottom_up_memory_binding_steps_setups() -> None:
    assert _sublayer_violations() == []


def test_the_sublayer_checker_sees_a_step_module_below_the_binding(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_package(tmp_path, monkeypatch, {
        "_engine.py": "def f():\n    from trtio._pages import P\n",
        "_pages.py": "P = 1\n",
        "newthing.py": "X = 1\n",
    })
    assert _sublayer_violations() == [
        "trtio/_engine.py:2: trtio._engine (binding) imports trtio._pages (steps)",
        "trtio/newthing.py: trtio.newthing is in no core sub-layer (tests/test_layout.py)",
    ]


# -- sizes ----------------------------------------------------------------------------------------------------
# A function is read whole: none is over MAX_FUNCTION_LINES. A class is one concept, however long that takes: a review
# rule (docs/architecture.md, "Rules every module follows"), not a line count.

MAX_FUNCTION_LINES = 100


def _oversized(package: Path) -> list[str]:
    """Every function over MAX_FUNCTION_LINES lines under ``package`` (decorators and docstrings count), as
    ``path:line name (lines)``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(_parsed(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                lines = (node.end_lineno or node.lineno) - start + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(package.parent)}:{start} {node.name} ({lines} lines)")
    return found


def test_no_function_over_100_lines() -> None:
    assert _oversized(PACKAGE) == []


def test_the_size_checker_sees_a_long_function(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    methods = "\n".join(f"    def m{i}(self) -> int:\n        return {i}\n" for i in range(200))
    (package / "long.py").write_text(f"def short() -> None:\n    pass\n\n\ndef f() -> None:\n{body}\n\n\n"
                                     f"class C:\n{methods}\n")
    assert _oversized(package) == [f"pkg/long.py:5 f ({MAX_FUNCTION_LINES + 1} lines)"]


# -- the feature seam (docs/architecture.md, "Families and components") --------------------------------------------
# Generic modules bind the dense core and call the features at the step points: no conditional of theirs names a
# family or a component, and none imports a family or component module (they reach them through trtio.features).

FAMILY_WORDS = ("gemma4", "swa", "ple", "hybrid", "recurrent", "mamba", "mrope", "deepstack", "visual", "mtp",
                "dflash", "jetspec", "dspark", "lora", "audio")
GENERIC_TOPS = ("_setups", "_contracts", "_state", "_pipeline_io", "_config", "edgellm", "_edgellm_config", "_engine",
                "_staging", "features")
PLUGIN_TOPS = ("families", "components")
PLUGIN_TABLES = ("trtio.families.family_table",)  # the facade imports it


def is_generic(module: str) -> bool:
    """Whether ``module`` (dotted) is generic code: the setups, the contracts, the engine state, PipelineIO, the
    configs and their Edge-LLM mapping, the engine, staging and the seam itself."""
    parts = module.split(".")
    return len(parts) > 1 and parts[1] in GENERIC_TOPS


def family_words(text: str) -> set[str]:
    """The family words ``text`` names as whole words: identifiers split at underscores and case changes
    (``is_gemma4`` and ``PleSplit`` name them; ``simple`` and ``example`` do not)."""
    found = set()
    for token in re.findall(r"[A-Za-z0-9]+", text.replace("_", " ")):
        parts = re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", token)
        found |= {p.lower() for p in (token, *parts) if p.lower() in FAMILY_WORDS}
    return found


def _tests(tree: ast.AST) -> Iterator[ast.expr]:
    """Every test of a conditional: if / while / ternary tests, comprehension filters, match guards."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            yield node.test
        elif isinstance(node, ast.comprehension):
            yield from node.ifs
        elif isinstance(node, ast.match_case) and node.guard is not None:
            yield node.guard


def _segment(lines: list[str], node: ast.expr) -> str:
    """The source text of ``node`` (as ast.get_source_segment gives it; columns are UTF-8 byte offsets)."""
    assert node.end_lineno is not None and node.end_col_offset is not None
    first, last = node.lineno - 1, node.end_lineno - 1
    chunk = [line.encode() for line in lines[first:last + 1]]
    if first == last:
        return chunk[0][node.col_offset:node.end_col_offset].decode()
    return b"".join([chunk[0][node.col_offset:], *chunk[1:-1], chunk[-1][:node.end_col_offset]]).decode()


def family_conditionals() -> list[str]:
    """``path:line: words: test`` for every conditional of a generic module whose test names a family."""
    found = []
    for module, path in sorted(_modules().items()):
        if not is_generic(module):
            continue
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines(keepends=True)  # once a module: ast.get_source_segment splits it at every call
        for test in sorted(_tests(_parsed(path)), key=lambda node: (node.lineno, node.col_offset)):
            text = _segment(lines, test)
            words = family_words(text)
            if words:
                first = " ".join(text.split())[:80]
                found.append(f"{path.relative_to(ROOT)}:{test.lineno}: {','.join(sorted(words))}: {first}")
    return found


def _plugin_imports() -> list[str]:
    """Every import of a family or component module (their tables included) by a generic module."""
    modules = _modules()
    known = set(modules)
    problems = []
    for module, path in sorted(modules.items()):
        if not is_generic(module):
            continue
        for line, target in _imports(module, path, known):
            parts = target.split(".")
            if parts[0] == "trtio" and len(parts) > 1 and parts[1] in PLUGIN_TOPS:
                problems.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target}")
    return problems


def test_no_generic_module_imports_a_family_or_a_component() -> None:
    assert _plugin_imports() == []


def test_no_generic_conditional_names_a_family_or_a_component() -> None:
    """A generic module binds the dense core and calls the features at the step points: none of its conditionals asks
    which family (or which component) is there."""
    assert family_conditionals() == []


def test_the_seam_checker_sees_a_family_conditional_and_a_plugin_import(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks are not vacuous: on a package shaped like today's tree (a setup asking for Gemma 4 by name, the
    engine state importing a family's pools, a comprehension filtering on PLE) they report every case, and leave
    family modules, plain words (``simple``) and strings alone."""
    _fake_package(tmp_path, monkeypatch, {
        "_setups/__init__.py": "",
        "_setups/llm.py": "def f(cfg, x):\n    if cfg.gemma4 is not None:\n        return 1\n"
                         "    simple = [p for p in x if p.ple_ok]\n    return 2 if cfg.is_mrope else 'visual'\n",
        "_state.py": "from trtio.families.gemma4.swa import BoundedSwaPages\n\ndef g(simple):\n"
                    "    while simple:\n        simple = 'hybrid' and None\n",
        "families/__init__.py": "from trtio.families import gemma4\n",
        "families/gemma4/__init__.py": "",
        "families/gemma4/swa.py": "BoundedSwaPages = 1\n\ndef h(cfg):\n    if cfg.gemma4:\n        return 1\n",
        "_contracts/__init__.py": "import trtio.components\n",
        "components/__init__.py": "",
    })
    assert family_conditionals() == [
        "trtio/_setups/llm.py:2: gemma4: cfg.gemma4 is not None",
        "trtio/_setups/llm.py:4: ple: p.ple_ok",
        "trtio/_setups/llm.py:5: mrope: cfg.is_mrope",
    ]
    assert _plugin_imports() == [
        "trtio/_contracts/__init__.py:1: trtio._contracts imports trtio.components",
        "trtio/_state.py:1: trtio._state imports trtio.families.gemma4.swa",
    ]


def test_family_words_are_whole_words() -> None:
    assert family_words("cfg.is_hybrid and PleSplit or kSwaKVPageTable") == {"hybrid", "ple", "swa"}
    assert family_words("simple example displayed multiple") == set()


def test_the_wheel_ships_every_package() -> None:
    """pyproject.toml lists the packages a wheel holds by name: every package under ``trtio/`` is listed (a family or
    component folder left out installs a wheel whose imports fail), and nothing listed is missing."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    present = {_module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert listed - {"trtio._engines"} == present
