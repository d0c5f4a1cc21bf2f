"""Real TensorRT Edge-LLM 0.11 vision-language directories (Qwen2.5-VL, Qwen3-VL: the LLM and ``visual/``) bound
with ``create_from_engine_dir`` (``-m trt``), and the same checks on ``engines/toy-vlm-ragged`` (CI).

On a GPU runner with real engines::

    TRTIO_EDGELLM_VLM_DIR=/engines/qwen2.5-vl-3b:/engines/qwen3-vl-2b \\
    EDGELLM_PLUGIN_PATH=/opt/edgellm/libNvInfer_edgellm_plugin.so \\
    python3 -m pytest -m trt -q -rs tests/test_edgellm_vlm.py

Without a reference model, what can be checked is checked (``docs/edgellm-assumptions.md`` section 9 names
them): **vl-bind** (the ViT attaches and an encode is finite and not constant, one row per merged token),
**vl-graphs** (the same tokens with CUDA graphs on and off), **vl-slots** (an image prompt admitted into slot 1
while another decodes in slot 0, which then ends, gives its tokens alone), **vl-chunk** (a prompt prefilled in
two chunks gives the single prefill's tokens), **vl-image** (another image gives other logits). Images are
synthetic; prompts are the vision markers and seeded token ids. Real fp16 engines may pick another token where
the reference barely prefers its own (within ``TIE_TOL`` of a logit): a difference is accepted there, and the
rest of that sequence is not compared; the toy directory runs with no tolerance, and CI shows each check fails
on a planted bug.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trtio
import trtio._contracts.ragged_steps as ragged_steps_module
import trtio._setups.engine_dir as engine_dir_module
from trtio import LLMSetup
from trtio._ops import DecodeAdvance
from trtio.edgellm import EngineDir
from trtio.testing.toy_engines import VisionToyEngines
from trtio.vision import VisionPrompt, preprocess, splice

ENV_DIRS = "TRTIO_EDGELLM_VLM_DIR"
NEW_TOKENS = 6
TIE_TOL = 0.1


@dataclass
class Target:
    """A vision-language directory: its engines loaded from the plans (``loader`` None), or stand-ins."""

    path: Path
    tie_tol: float = TIE_TOL
    loader: Callable[..., Any] | None = None

    @property
    def directory(self) -> EngineDir:
        return EngineDir.open(self.path)

    def bind(self, *, graphs: bool) -> LLMSetup:
        if self.loader is None:
            setup = trtio.create_from_engine_dir(self.path, graphs=graphs)
        else:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(engine_dir_module, "load_engine", self.loader)
                setup = trtio.create_from_engine_dir(self.path, graphs=graphs, backend="host")
        assert isinstance(setup, LLMSetup)
        return setup


def images_for(setup: LLMSetup) -> list[np.ndarray]:
    """Two synthetic 8-bit RGB images the ViT takes alone: a square one and a tall one (another token grid, so
    another position delta)."""
    assert setup.visual is not None
    cfg = setup.visual.cfg
    side = int(np.sqrt((cfg.min_pixels + cfg.max_pixels) / 2))
    yy, xx = np.mgrid[0:side, 0:side]
    first = np.stack([xx % 256, yy % 256, (xx + yy) % 256], -1).astype(np.uint8)
    yy, xx = np.mgrid[0:side, 0:max(side // 3, 1)]
    second = np.stack([(xx * yy) % 256, 255 - yy % 256, (3 * xx) % 256], -1).astype(np.uint8)
    return [first, second]


def prompt_ids(setup: LLMSetup, seed: int) -> list[int]:
    """The vision markers around one image pad, then seeded token ids that are none of the markers."""
    assert setup.visual is not None
    cfg = setup.visual.cfg
    special = {cfg.image_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id, cfg.video_token_id}
    rng = np.random.default_rng(seed)
    text = [int(t) for t in rng.integers(10, setup.cfg.vocab_size, 40) if int(t) not in special][:6]
    marker = [cfg.vision_start_token_id, cfg.image_token_id] + \
        ([cfg.vision_end_token_id] if cfg.vision_end_token_id is not None else [])
    return marker + text


def spliced(setup: LLMSetup, table: np.ndarray, image: np.ndarray, seed: int) -> VisionPrompt:
    assert setup.visual is not None
    patches, grid = preprocess(image, setup.visual.cfg)
    return splice(prompt_ids(setup, seed), grid, setup.visual.cfg, table, setup.visual.encode(patches, grid))


@dataclass
class Run:
    tokens: list[int]
    logits: list[np.ndarray]


def generate(setup: LLMSetup, table: np.ndarray, p: VisionPrompt, steps: int, *, slot: int = 0,
             chunk: int | None = None, others: Sequence[int] = ()) -> Run:
    """Greedy tokens of ``p`` in ``slot`` (``chunk``: its prompt prefilled in two parts); ``others`` are the
    slots of sequences already active, which decode alongside for two steps (their tokens ignored) and are then
    released, so ``p``'s sequence decodes first in its step and then alone."""
    kw = {"slots": [slot]} if others or slot else {}
    n = int(p.context_lengths[0])
    feats = list(p.deepstack_embeds)
    if chunk is None:
        logits = setup.prefill(p.inputs_embeds, p.context_lengths, deepstack_embeds=feats or None,
                               mrope_positions=p.mrope_positions, **kw).to_numpy()
    else:
        setup.prefill(p.inputs_embeds[:, :chunk], [chunk], deepstack_embeds=[f[:, :chunk] for f in feats] or None,
                      mrope_positions=p.mrope_positions[:, :, :chunk], **kw)
        logits = setup.prefill(p.inputs_embeds[:, chunk:], [n - chunk], past_lengths=[chunk], slots=[slot],
                               deepstack_embeds=[f[:, chunk:] for f in feats] or None,
                               mrope_positions=p.mrope_positions[:, :, chunk:]).to_numpy()
    run = Run([int(logits[0].argmax())], [logits[0].copy()])
    order = sorted([*others, slot])
    while len(run.tokens) < steps:
        if len(run.tokens) == 3 and others:
            setup.release(list(others))
            order = [slot]
        x = np.stack([table[run.tokens[-1] if s == slot else 0] for s in order]).astype(np.float16)[:, None]
        row = setup.decode(x).to_numpy()[order.index(slot)]
        run.tokens.append(int(row.argmax()))
        run.logits.append(row.copy())
    return run


def assert_same_tokens(got: Run, want: Run, tie_tol: float, what: str) -> None:
    for i, (g, w) in enumerate(zip(got.tokens, want.tokens)):
        if g != w:
            margin = float(want.logits[i][w] - want.logits[i][g])
            assert margin <= tie_tol, f"{what}: token {i} is {g}, the reference's {w} by a margin of {margin:.3f}"
            return
    assert len(got.tokens) == len(want.tokens)


def run_checks(target: Target) -> None:
    d = target.directory
    assert d.visual_config is not None, f"{d.path} has no visual/ (a vision-language directory)"
    table = np.array(d.embedding_table())
    with target.bind(graphs=False) as setup:
        visual = setup.visual
        assert visual is not None and visual.cfg == d.visual_config  # vl-bind
        images = images_for(setup)
        patches, grid = preprocess(images[0], visual.cfg)
        out = visual.encode(patches, grid)
        rows = out.embeds.to_numpy().astype(np.float32)
        assert rows.shape == (visual.cfg.image_tokens(tuple(grid[0])), setup.cfg.hidden_size)
        assert np.isfinite(rows).all() and rows.std() > 0, "vl-bind: the encode is not finite or constant"
        for feature in out.deepstack:
            f = feature.to_numpy().astype(np.float32)
            assert f.shape == rows.shape and np.isfinite(f).all() and f.std() > 0
        alone = generate(setup, table, spliced(setup, table, images[0], 1), NEW_TOKENS)
        assert all(np.isfinite(x).all() for x in alone.logits)
        setup.reset()
        other = generate(setup, table, spliced(setup, table, images[1], 1), 1)
        assert np.abs(other.logits[0] - alone.logits[0]).max() > 1e-3, "vl-image: another image, the same logits"
        setup.reset()
        chunk = max(1, int(spliced(setup, table, images[0], 1).context_lengths[0]) - 4)
        chunked = generate(setup, table, spliced(setup, table, images[0], 1), NEW_TOKENS, chunk=chunk)
        assert_same_tokens(chunked, alone, target.tie_tol, "vl-chunk")
        setup.reset()
        before = spliced(setup, table, images[1], 2)
        assert before.rope_deltas[0] != spliced(setup, table, images[0], 1).rope_deltas[0]
        generate(setup, table, before, 3)  # slot 0 keeps decoding
        beside = generate(setup, table, spliced(setup, table, images[0], 1), NEW_TOKENS, slot=1, others=[0])
        assert_same_tokens(beside, alone, target.tie_tol, "vl-slots")
    with target.bind(graphs=True) as setup:
        graphed = generate(setup, table, spliced(setup, table, images[0], 1), NEW_TOKENS)
        assert_same_tokens(graphed, alone, target.tie_tol, "vl-graphs")
        assert setup.graph_stats.hits > 0


def _real_dirs() -> list[Any]:
    raw = os.environ.get(ENV_DIRS, "").strip()
    if not raw:
        return [pytest.param(None, marks=pytest.mark.trt, id=f"{ENV_DIRS} unset")]
    return [pytest.param(Path(p), marks=pytest.mark.trt, id=Path(p).name) for p in raw.split(os.pathsep) if p]


@pytest.mark.parametrize("path", _real_dirs())
def test_a_real_vision_language_directory(path: Path | None) -> None:
    if path is None:
        pytest.skip(f"{ENV_DIRS} names no vision-language engine directory")
    run_checks(Target(path))


def toy_target() -> Target:
    toys = VisionToyEngines.load()
    return Target(toys.directory.path, tie_tol=0.0, loader=toys.loader(device="host"))


def test_the_checks_pass_on_the_toy_directory() -> None:
    run_checks(toy_target())


def test_the_checks_fail_on_a_decode_that_reads_another_slots_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    """vl-slots catches decode steps gathering MRoPE rows by the step's row instead of the sequence's slot."""

    def by_row(*args: Any, **kwargs: Any) -> DecodeAdvance:
        fields = dict(zip(("lengths", "batch", "past", "asl", "positions", "rope_rows", "rope_cap", "slots"), args))
        fields.update(kwargs)
        fields["slots"] = None
        return DecodeAdvance(**fields)

    monkeypatch.setattr(ragged_steps_module, "DecodeAdvance", by_row)
    with pytest.raises(AssertionError, match="vl-slots"):
        run_checks(toy_target())
