"""Test helper: ``trtio generate`` on a toy directory, in process, and the acceptance rate it reports."""

from __future__ import annotations

from pathlib import Path

import pytest


def generate(capsys: pytest.CaptureFixture[str], directory: Path, *flags: str) -> tuple[int, str, str]:
    """``trtio generate DIRECTORY --prompt "Once upon a time" --max-new-tokens 24 --backend host FLAGS``: its exit
    status, stdout and stderr."""
    from trtio._cli import main

    rc = main(["generate", str(directory), "--prompt", "Once upon a time", "--max-new-tokens", "24",
               "--backend", "host", *flags])
    out, err = capsys.readouterr()
    return rc, out, err


def accepted_percent(err: str) -> float:
    """The percentage of drafted tokens accepted, from the last line ``trtio generate --speculative`` writes to
    stderr ("..., N verify steps, P% of drafted tokens accepted, ...")."""
    return float(err.strip().splitlines()[-1].split(" verify steps, ")[1].split("%")[0])
