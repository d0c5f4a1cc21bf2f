"""Where the toy engine directories are, by name: ``toy_engine_dir("toy-llm-ragged")``.

The toy engines (``engines/`` in a source checkout, the package data ``trtio._engines`` in a wheel) are engine
directories in TensorRT Edge-LLM 0.11's layout: each holds its configs and, beside them, what Edge-LLM's builder
writes for a runtime (``embedding.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``). The
directories share one model's vocabulary and embedding, so those three files exist once, in ``toy-assets/``:

* in a source checkout, each directory's copies are symbolic links into ``toy-assets/`` (git keeps them), so
  ``engines/<name>`` is a complete directory as it is;
* a wheel cannot hold links, so it ships ``toy-assets/`` once and the configs; the first call here lays the
  directories out complete (the configs copied, the assets linked, or copied where links cannot be made) in
  trtio's cache folder (:func:`plan_cache_dir`), in a folder named after the package data's hash, and later
  calls (and later processes) reuse it.

:func:`default_engines_dir` returns the folder whose directories are complete; :func:`toy_engine_dir` one of them.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import logging
import os
import shutil
import tempfile
from pathlib import Path

from trtio.errors import UnknownNameError

__all__ = ["ASSETS_DIR", "OWN_ASSETS", "TOY_ASSETS", "TOY_DIRECTORIES", "default_engines_dir", "linked_assets",
           "plan_cache_dir", "toy_engine_dir"]

log = logging.getLogger("trtio")

#: The toy engine directories, by name (``engines/README.md`` says what each is).
TOY_DIRECTORIES = ("toy-llm", "toy-eagle", "toy-llm-ragged", "toy-eagle3-ragged", "toy-llm-tp2", "toy-llm-tp4",
                   "toy-qwen35-ragged", "toy-nemotron-h-ragged", "toy-vlm-ragged", "toy-mtp-ragged",
                   "toy-qwen35-mtp-ragged", "toy-lora-ragged", "toy-dflash-ragged", "toy-qwen35-dflash-ragged",
                   "toy-gemma4-ragged")
#: The files every toy directory holds beside its configs, kept once in :data:`ASSETS_DIR`.
TOY_ASSETS = ("embedding.safetensors", "tokenizer.json", "tokenizer_config.json")
#: Assets a directory holds as files of its own instead of links (the vision-language toy's tokenizer knows its
#: image markers).
OWN_ASSETS = {"toy-vlm-ragged": ("tokenizer.json", "tokenizer_config.json")}


def linked_assets(name: str) -> tuple[str, ...]:
    """The assets of toy directory ``name`` that are links into :data:`ASSETS_DIR`."""
    own = OWN_ASSETS.get(name, ())
    return tuple(a for a in TOY_ASSETS if a not in own)


#: The folder of the engines folder that holds :data:`TOY_ASSETS`.
ASSETS_DIR = "toy-assets"
_MARKER = ".complete"  # written last into a laid-out folder: a folder without it is half written


def plan_cache_dir() -> Path:
    """trtio's cache folder (plans ``trtio demo`` built, the toy directories of a wheel):
    ``$TRTIO_CACHE_DIR``, else ``$XDG_CACHE_HOME/trtio``, else ``~/.cache/trtio``."""
    explicit = os.environ.get("TRTIO_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "trtio"


def _is_complete(root: Path) -> bool:
    return all((root / d / a).is_file() for d in TOY_DIRECTORIES for a in TOY_ASSETS)


def _shipped() -> Path:
    """The engines folder this trtio comes with: a checkout's ``engines/`` (next to the ``trtio`` package),
    else the package data of a wheel."""
    checkout = Path(__file__).resolve().parents[2] / "engines"
    if (checkout / "toy-llm" / "config.json").is_file():
        return checkout
    return Path(str(importlib.resources.files("trtio._engines")))  # a wheel installs plain files


def _files(root: Path) -> list[Path]:
    """The package data's files, relative to ``root``, in a fixed order (no bytecode, no built plans)."""
    found = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if path.is_file() and rel.parts[0] not in ("build", "__pycache__") and path.suffix not in (".py", ".pyc"):
            found.append(rel)
    return sorted(found)


def _lay_out(shipped: Path, target: Path) -> None:
    """Write the complete toy directories under ``target`` (a new folder) from the package data ``shipped``."""
    for rel in _files(shipped):
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shipped / rel, target / rel)
    for name in TOY_DIRECTORIES:
        for asset in linked_assets(name):
            link = target / name / asset
            try:
                link.symlink_to(Path("..") / ASSETS_DIR / asset)
            except OSError:  # no symbolic links here (some file systems): a copy
                shutil.copyfile(target / ASSETS_DIR / asset, link)
    (target / _MARKER).write_text("")


@functools.cache
def default_engines_dir() -> Path:
    """The folder of complete toy engine directories (module docstring): the checkout's ``engines/``, or, from a
    wheel, the package data laid out in :func:`plan_cache_dir` (a temporary folder where the cache cannot be
    written). The same folder for the whole process."""
    shipped = _shipped()
    if _is_complete(shipped):
        return shipped
    digest = hashlib.sha256()
    for rel in _files(shipped):
        digest.update(str(rel).encode() + b"\0" + (shipped / rel).read_bytes())
    target = plan_cache_dir() / "toy-engines" / f"engines-{digest.hexdigest()[:16]}"
    if (target / _MARKER).is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".engines-", dir=target.parent))
    except OSError as exc:
        work = Path(tempfile.mkdtemp(prefix="trtio-engines-"))
        log.warning("cannot write the toy engine directories to %s (%s); using %s for this process",
                    target.parent, exc, work)
        _lay_out(shipped, work)
        return work
    _lay_out(shipped, work)
    try:
        work.rename(target)  # atomic: a folder at target is always complete
    except OSError:
        if (target / _MARKER).is_file():  # another process laid it out first: use theirs
            shutil.rmtree(work, ignore_errors=True)
            return target
        log.warning("%s is in the way of the toy engine directories (not trtio's); using %s", target, work)
        return work
    return target


def toy_engine_dir(name: str) -> Path:
    """The toy engine directory ``name`` (one of :data:`TOY_DIRECTORIES`), complete: its configs, its
    ``embedding.safetensors`` and its tokenizer, in Edge-LLM's layout. Works in a source checkout and from an
    installed wheel alike (module docstring). :class:`~trtio.UnknownNameError` lists the names for any other."""
    if name not in TOY_DIRECTORIES:
        raise UnknownNameError(f"no toy engine directory {name!r}; the toy engines are {', '.join(TOY_DIRECTORIES)}")
    return default_engines_dir() / name
