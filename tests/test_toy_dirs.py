"""trtio.testing.toy_dirs: the toy engine directories by name, complete (configs, embedding table, tokenizer) in a
source checkout and when only a wheel's package data (the assets once, no links) is there."""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import trtio
from trtio.edgellm import EngineDir
from trtio.testing import toy_dirs, toy_engine_dir
from trtio.testing.toy_dirs import ASSETS_DIR, OWN_ASSETS, TOY_ASSETS, TOY_DIRECTORIES, linked_assets

ROOT = Path(__file__).resolve().parents[1]


def _ships(rel: str, patterns: list[str]) -> bool:
    """Whether setuptools' package data takes ``rel`` (a path under engines/): glob patterns, ``*`` within one
    folder name."""
    parts = rel.split("/")
    return any(len(p.split("/")) == len(parts) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, p.split("/")))
               for p in patterns)


def _package_data(tmp_path: Path) -> Path:
    """What a wheel installs as trtio/_engines: the files pyproject's package data takes from engines/."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "trtio._engines"]
    shipped = tmp_path / "shipped"
    engines = ROOT / "engines"
    for path in engines.rglob("*"):
        rel = path.relative_to(engines).as_posix()
        if path.is_file() and _ships(rel, patterns):
            (shipped / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, shipped / rel)
    return shipped


@pytest.fixture
def from_a_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """toy_dirs as a wheel sees it: the package data in place of engines/, the cache in tmp_path."""
    shipped = _package_data(tmp_path)
    monkeypatch.setattr(toy_dirs, "_shipped", lambda: shipped)
    monkeypatch.setenv("TRTIO_CACHE_DIR", str(tmp_path / "cache"))
    toy_dirs.default_engines_dir.cache_clear()
    yield shipped
    toy_dirs.default_engines_dir.cache_clear()


def _complete(path: Path) -> None:
    for asset in TOY_ASSETS:
        assert (path / asset).is_file(), f"{path / asset} is missing"
        shared = asset in linked_assets(path.name)
        source = ROOT / "engines" / (ASSETS_DIR if shared else path.name) / asset
        assert (path / asset).read_bytes() == source.read_bytes()


@pytest.mark.parametrize("name", TOY_DIRECTORIES)
def test_each_toy_directory_is_complete_in_a_checkout(name: str) -> None:
    path = toy_engine_dir(name)
    assert path == ROOT / "engines" / name
    _complete(path)


def test_an_unknown_name_lists_the_toy_directories() -> None:
    with pytest.raises(trtio.UnknownNameError, match=r"no toy engine directory 'toy-gpt'; the toy engines are "
                                                     r"toy-llm, toy-eagle, toy-llm-ragged, .*toy-llm-tp4"):
        toy_engine_dir("toy-gpt")


def test_the_package_data_holds_each_asset_once(from_a_wheel: Path) -> None:
    found = [p.name for p in from_a_wheel.rglob("*") if p.name in TOY_ASSETS]
    assert sorted(found) == sorted(TOY_ASSETS + tuple(a for own in OWN_ASSETS.values() for a in own))
    assert not (from_a_wheel / "toy-llm" / "tokenizer.json").exists(), "a wheel holds no per-directory copy"


def test_from_a_wheel_the_directories_are_laid_out_complete_in_the_cache(from_a_wheel: Path,
                                                                          tmp_path: Path) -> None:
    root = toy_dirs.default_engines_dir()
    assert root.parent == tmp_path / "cache" / "toy-engines"
    for name in TOY_DIRECTORIES:
        assert toy_engine_dir(name) == root / name
        _complete(root / name)
    pair = EngineDir.open(toy_engine_dir("toy-eagle3-ragged"))
    assert pair.kind == "spec_decode"
    want = EngineDir.open(ROOT / "engines" / "toy-eagle3-ragged").embedding_table()
    np.testing.assert_array_equal(np.asarray(pair.embedding_table()), np.asarray(want))
    assert EngineDir.open(toy_engine_dir("toy-llm-tp2")).tp_size == 2


def test_a_laid_out_folder_is_reused_and_a_changed_package_data_gets_its_own(from_a_wheel: Path) -> None:
    first = toy_dirs.default_engines_dir()
    marker = first / "toy-llm" / "config.json"
    stamp = marker.stat().st_mtime_ns
    toy_dirs.default_engines_dir.cache_clear()  # as a later process
    assert toy_dirs.default_engines_dir() == first
    assert marker.stat().st_mtime_ns == stamp, "the folder was written again"
    (from_a_wheel / "toy-llm" / "config.json").write_text((from_a_wheel / "toy-llm" / "config.json").read_text()
                                                          + "\n")
    toy_dirs.default_engines_dir.cache_clear()  # another trtio version's package data
    assert toy_dirs.default_engines_dir() != first


def test_a_folder_in_the_way_is_left_alone(from_a_wheel: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A folder where the laid-out one goes, without the marker written last, was not made by trtio (trtio renames
    a complete folder into place): it is not used, nor removed."""
    first = toy_dirs.default_engines_dir()
    shutil.rmtree(first)
    (first / "toy-llm").mkdir(parents=True)
    toy_dirs.default_engines_dir.cache_clear()
    with caplog.at_level(logging.WARNING, logger="trtio"):
        root = toy_dirs.default_engines_dir()
    assert root != first and root.parent == first.parent
    _complete(root / "toy-llm")
    assert (first / "toy-llm").is_dir() and not any((first / "toy-llm").iterdir())
    assert "is in the way of the toy engine directories" in caplog.text


def test_without_a_writable_cache_a_temporary_folder_serves(from_a_wheel: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("TRTIO_CACHE_DIR", str(blocked))
    with caplog.at_level(logging.WARNING, logger="trtio"):
        root = toy_dirs.default_engines_dir()
    try:
        assert not root.is_relative_to(blocked)
        _complete(root / "toy-llm-ragged")
        assert "cannot write the toy engine directories" in caplog.text
    finally:
        shutil.rmtree(root)


def test_links_fall_back_to_copies(from_a_wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(self: Path, target: str | os.PathLike[str], target_is_directory: bool = False) -> None:
        raise OSError("symbolic links are not supported here")

    monkeypatch.setattr(Path, "symlink_to", no_links)
    root = toy_dirs.default_engines_dir()
    assert not (root / "toy-llm" / "tokenizer.json").is_symlink()
    _complete(root / "toy-llm")


def test_the_package_data_takes_no_build_output() -> None:
    """What scripts/build_toy_engines.py writes into engines/ (engines/build/, plans beside the configs) never
    matches pyproject's package data, so a wheel built after it holds none of it."""
    tomllib = pytest.importorskip("tomllib")
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "trtio._engines"]
    built = ["build/toy-llm/config.json", "build/toy-llm/model.plan", "build/toy-eagle/base/config.json",
             "build/toy-eagle/draft/model.plan", "toy-llm/model.plan", "toy-eagle/base/model.plan",
             "toy-llm-ragged/llm.engine", "build/config.json"]
    for rel in built:
        assert not _ships(rel, patterns), f"{rel} would ship in a wheel"
    for rel in ("toy-llm/config.json", "toy-eagle/base/config.json", "toy-eagle3-ragged/base_config.json",
                "toy-llm-tp2/config_world2.json", "toy-checkpoint/model.safetensors", "README.md"):
        assert _ships(rel, patterns), f"{rel} would not ship"


def test_from_a_wheel_the_lora_toy_has_its_adapters(from_a_wheel: Path) -> None:
    """Issue 37: toy-lora-ragged's adapters are package data, laid out with its directory (generate --lora chat)."""
    from trtio.families.lora.adapters import LoraAdapter

    path = toy_engine_dir("toy-lora-ragged")
    assert path.parent == toy_dirs.default_engines_dir() and path.parent != ROOT / "engines"
    for name, rank in (("chat", 8), ("terse", 4)):
        adapter = LoraAdapter.load(path / "adapters" / name)
        assert set(adapter.ranks.values()) == {rank}


def test_from_a_wheel_the_gemma4_toy_has_its_ple_table(from_a_wheel: Path) -> None:
    """Issue 34: toy-gemma4-ragged's per-layer embedding table is package data, laid out with its directory, and
    EngineDir.embeddings() of the laid-out directory gathers its rows."""
    path = toy_engine_dir("toy-gemma4-ragged")
    assert path.parent == toy_dirs.default_engines_dir() and path.parent != ROOT / "engines"
    d = EngineDir.open(path)
    ple = d.ple_embedding_table()
    assert ple is not None
    np.testing.assert_array_equal(ple, EngineDir.open(ROOT / "engines" / "toy-gemma4-ragged").ple_embedding_table())
    with d.embeddings("host") as emb:
        got = emb.embed(np.array([[3, 511]]))
        assert isinstance(got, tuple)
        np.testing.assert_array_equal(got[1].to_numpy()[0], ple[[3, 511]])
