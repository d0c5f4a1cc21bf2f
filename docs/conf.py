"""Sphinx configuration: trtio's user guide (docs/guide/) and API reference (docs/api/), generated from the
docstrings. Build (README, "Documentation"; CI runs it with warnings as errors, nitpicky: a reference that resolves
nowhere fails the build)::

    python3 -m pip install -e '.[docs]'
    python3 -m sphinx -W --keep-going -n -q -b html docs docs/_build/html
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's trtio, not an installed one

from sphinx.util import logging as sphinx_logging  # noqa: E402

import trtio  # noqa: E402

logger = sphinx_logging.getLogger(__name__)

project = "trtio"
author = "the trtio authors"
copyright = "the trtio authors; Apache License 2.0"
release = version = trtio.__version__

extensions = ["sphinx.ext.autodoc", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# Maintainers' pages and logs: linked from the index, read in the repository (they cite code paths).
exclude_patterns = ["_build", "BENCHMARKS.md", "adding-a-family.md", "architecture.md", "edgellm-assumptions.md",
                    "faults.md", "toy-model.md"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
autoclass_content = "both"
myst_heading_anchors = 3
html_theme = "alabaster"
html_title = f"trtio {release}"

# Types of other packages in signatures resolve nowhere offline (no intersphinx here): not trtio's broken references.
nitpick_ignore_regex = [
    ("py:(class|obj|data)", r"(numpy|np|collections\.abc|os|pathlib|enum|types|typing|abc|threading)\..+"),
    ("py:(class|obj)", r"(tuple|dict|list|int|float|str|bool|bytes|object|None|Any|Callable)(\[.*)?"),
]


def _resolves(target: str, module: str | None, cls: str | None, source: str | None) -> bool:
    """Whether a reference names a Python object that exists: the dotted name itself, or relative to the
    documented module and class, or to the object whose docstring holds it (and that object's module)."""
    target = target.lstrip("~.")
    candidates = [target]
    if module:
        candidates += [f"{module}.{target}"] + ([f"{module}.{cls}.{target}"] if cls else [])
    where = re.search(r"docstring of ([\w.]+)", source or "")
    if where:
        owner = where.group(1).split(".")
        candidates += [".".join(owner[:cut] + [target]) for cut in range(len(owner), 0, -1)]
    for name in candidates:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            return True
    return False


def _existing_but_undocumented(app: Any, domain: Any, node: Any) -> bool | None:
    """A reference to an object that exists but has no page here (an internal class in a signature, a private
    base class) is not broken: no warning. A reference to nothing is broken: Sphinx warns, and -W fails the build."""
    if node.get("refdomain") != "py":
        return None
    found = _resolves(node["reftarget"], node.get("py:module"), node.get("py:class"), node.source)
    return True if found else None


def _every_public_name_documented(app: Any, env: Any) -> None:
    """The reference covers ``trtio.__all__`` and ``trtio.testing.__all__``: a name added there without a page is a
    warning (an error under -W)."""
    import trtio.testing

    documented = set(env.get_domain("py").objects)
    for module in (trtio, trtio.testing):
        for name in module.__all__:
            if f"{module.__name__}.{name}" not in documented:
                logger.warning(f"{module.__name__}.{name} is in {module.__name__}.__all__ but not in the API reference "
                               f"(docs/api/)")


def setup(app: Any) -> None:
    app.connect("warn-missing-reference", _existing_but_undocumented)
    app.connect("env-check-consistency", _every_public_name_documented)
