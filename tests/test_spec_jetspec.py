"""A JetSpec pair end to end on the host (``trtio.families.spec.jetspec``): the DFlash toy pair's directory with its
configs rewritten as Edge-LLM writes a JetSpec pair's (``spec_decode_type: jetspec``, ``jetspec_config`` with
``causal_head: true``, ``jetspec_tree_base``) opens through ``trtio generate``'s ``create_from_engine_dir`` path and
decodes the base's greedy text speculatively. (The toy draft unrolls its block one column at a time, each seeing the
columns before it, so its guesses are a causal block's; real-graph parity is ``tests/test_parity_jetspec.py``.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _generate import accepted_percent, generate

from trtio.edgellm import EngineDir
from trtio.families.spec.spec_config import SpecConfig
from trtio.testing.toy_engines import default_engines_dir


def jetspec_toy(tmp_path: Path, causal_head: bool = True) -> Path:
    """toy-dflash-ragged's directory as a JetSpec pair's."""
    out = tmp_path / "toy-jetspec"
    shutil.copytree(default_engines_dir() / "toy-dflash-ragged", out)
    for role in ("base", "draft"):
        path = out / f"{role}_config.json"
        raw = json.loads(path.read_text())
        block = raw.pop("dflash_config")
        block.pop("version", None)
        block.pop("supports_probabilistic_sampling", None)
        raw.update(spec_decode_type="jetspec", jetspec_config={**block, "causal_head": causal_head},
                   jetspec_tree_base=raw.pop("dflash_tree_base"))
        path.write_text(json.dumps(raw, indent=2))
    return out


def test_the_jetspec_toy_directory_reads_as_a_causal_block_draft_pair(tmp_path: Path) -> None:
    directory = EngineDir.open(jetspec_toy(tmp_path))
    spec = directory.draft_config.feature(SpecConfig)
    assert spec is not None and spec.is_block_draft and spec.block_family is not None and spec.block_family.causal
    assert directory.base_config.jetspec_tree_base is True and directory.base_config.eagle_hidden_state_layers == (0,)


def test_trtio_generate_speculative_on_a_jetspec_directory_prints_the_bases_greedy_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tokenizers")
    directory = jetspec_toy(tmp_path)
    rc, alone, err = generate(capsys, directory)
    assert rc == 0, err
    rc, out, err = generate(capsys, directory, "--speculative")
    assert rc == 0, err
    assert out == alone and accepted_percent(err) >= 60


def test_trtio_generate_refuses_a_jetspec_directory_without_causal_head(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _out, err = generate(capsys, jetspec_toy(tmp_path, causal_head=False), "--speculative")
    assert rc != 0 and "jetspec_config.causal_head" in err
