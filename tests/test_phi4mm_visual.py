"""Phi-4-multimodal's vision encoder (``visual/`` of model_type ``phi4mm``): its config read and checked against the
LLM's, HF's HD transform (equal to ``Phi4MultimodalImageProcessor``'s numbers, stored by
``scripts/make_phi4mm_image_fixture.py``: no torch here), the image-token layout with its ``sub_GN`` / ``glb_GN``
rows (HF's token count; Edge-LLM's places for a grid without padding), the registry against the builder's graph
I/O, and a strict double of that I/O bound and stepped.

No real-graph parity for the encoder itself: Edge-LLM 0.11's visual ONNX export hard-codes SigLIP-so400m and fails on
a CPU (``docs/edgellm-assumptions.md`` 19).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trtio
from trtio.components.visual import phi4mm as P
from trtio.components.visual.phi4mm import Phi4mmVisualConfig
from trtio.components.visual.phi4mm_setup import create_for_phi4mm_visual
from trtio.components.visual.visual_component import VisualComponent
from trtio.errors import BindingError, CapacityError, ConfigError, InvalidValueError, ShapeError
from trtio.testing.reference_phi4mm import ReferencePhi4mmEngine, reference_phi4mm

FIXTURES = Path(__file__).parent / "fixtures"
DIR = FIXTURES / "edgellm-0.11" / "phi4mm"
HF = FIXTURES / "phi4mm-images" / "hf_processor.npz"


def synthetic_image(height: int, width: int) -> np.ndarray:
    """The fixture script's images (``scripts/make_phi4mm_image_fixture.py``), from integer arithmetic only."""
    y, x = np.mgrid[0:height, 0:width].astype(np.int64)
    r = (x * 7 + y * 3) % 256
    g = ((x // 3 + y // 3) % 2) * 200 + (y * 5) % 56
    b = (x * y) % 251
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


@pytest.fixture(scope="module")
def cfg() -> Phi4mmVisualConfig:
    return P.Phi4mmVisualConfig.from_dir(DIR / "visual")


def _llm(raw: dict[str, Any] | None = None) -> trtio.LLMEngineConfig:
    data = raw if raw is not None else json.loads((DIR / "config.json").read_text())
    return trtio.LLMEngineConfig.from_edgellm(data, what="phi4mm/config.json")


# -- the config --------------------------------------------------------------------------------------------------------


def test_the_component_reads_the_fixture_as_the_phi4mm_kind(cfg: Phi4mmVisualConfig) -> None:
    read = VisualComponent.read(DIR / "visual", _llm())
    assert isinstance(read, Phi4mmVisualConfig) and read.kind == "phi4mm" and read == cfg
    assert (cfg.crop_size, cfg.tokens_per_side, cfg.tokens_per_block) == (448, 16, 256)
    assert (cfg.out_hidden_size, cfg.image_token_id, cfg.vocab_size) == (128, 997, 1000)
    assert (cfg.min_blocks, cfg.max_blocks) == (1, 4)
    assert cfg.image_mean == cfg.image_std == (0.5, 0.5, 0.5) and cfg.dynamic_hd == 36  # HF's defaults


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(DIR, tmp_path / "phi4mm")
    return tmp_path / "phi4mm"


def _edit(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(("where", "edit", "match"), [
    ("llm", lambda d: d.update(hidden_size=256, num_attention_heads=8), "glb_GN.*hidden_size is 256"),
    ("llm", lambda d: d.update(image_token_id=996), "image_token_id.*997.*996"),
    ("llm", lambda d: d.update(vocab_size=1024), "vocab_size"),
    ("visual", lambda d: d["embd_layer"]["image_embd_layer"].update(crop_size=336), "vision_config.image_size"),
    ("visual", lambda d: d["builder_config"].pop("max_image_tokens"), "builder_config.max_image_tokens"),
    ("visual", lambda d: d["embd_layer"]["image_embd_layer"].update(crop_size=450), "crop_size"),
])
def test_a_directory_that_does_not_fit_is_refused_naming_the_key(tmp_path: Path, where: str,
                                                                  edit: Callable[[dict[str, Any]], None],
                                                                  match: str) -> None:
    root = _copy(tmp_path)
    _edit(root / "config.json" if where == "llm" else root / "visual" / "config.json", edit)
    llm = _llm(json.loads((root / "config.json").read_text()))
    with pytest.raises(ConfigError, match=match):
        VisualComponent.read(root / "visual", llm)


def test_a_missing_sidecar_is_refused_naming_it(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "visual" / P.GN_FILE).unlink()
    with pytest.raises(ConfigError, match="phi4mm_gn_proj.safetensors"):
        VisualComponent.read(root / "visual", _llm())


def test_a_preprocessor_key_trtio_does_not_implement_is_refused(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "visual" / "preprocessor_config.json").write_text(json.dumps({"dynamic_hd": 16, "resample": 2}))
    with pytest.raises(ConfigError, match="resample"):
        P.Phi4mmVisualConfig.from_dir(root / "visual")
    (root / "visual" / "preprocessor_config.json").write_text(json.dumps({"dynamic_hd": 16}))
    assert P.Phi4mmVisualConfig.from_dir(root / "visual").dynamic_hd == 16


# -- preprocessing: HF's numbers ---------------------------------------------------------------------------------------


def _hf() -> Iterator[tuple[int, tuple[int, int, int], Any]]:
    data = np.load(HF)
    for i, (h, w, hd) in enumerate(data["images"].tolist()):
        yield i, (h, w, hd), data


def _worst(cfg: Phi4mmVisualConfig) -> tuple[float, list[str]]:
    """The largest |Δ| between trtio's blocks and HF's (sampled rows and columns, and every block's mean), and
    where the token counts or grids differ."""
    worst, wrong = 0.0, []
    for i, (h, w, hd), data in _hf():
        c = dataclasses.replace(cfg, dynamic_hd=hd)
        blocks, layout = P.preprocess(synthetic_image(h, w), c)
        stride, offset = data["sample"].tolist()
        ours = blocks[:, :, offset::stride, offset::stride]
        theirs = data[f"sampled_{i}"]
        if ours.shape != theirs.shape:
            wrong.append(f"image {i}: blocks {list(ours.shape)}, HF's {list(theirs.shape)}")
            continue
        worst = max(worst, float(np.abs(ours - theirs).max()),
                    float(np.abs(blocks.mean(axis=(1, 2, 3), dtype=np.float64) - data[f"block_means_{i}"]).max()))
        rows, cols = layout[0, :2].tolist()
        if [rows * 448, cols * 448] != data[f"image_sizes_{i}"].tolist():
            wrong.append(f"image {i}: grid {rows} x {cols}, HF's image_sizes {data[f'image_sizes_{i}'].tolist()}")
        if P.image_tokens(layout[0], c) != int(data[f"num_img_tokens_{i}"][0]):
            wrong.append(f"image {i}: {P.image_tokens(layout[0], c)} tokens, HF's {data[f'num_img_tokens_{i}'][0]}")
    return worst, wrong


def test_preprocess_equals_hugging_face_s_processor(cfg: Phi4mmVisualConfig) -> None:
    """Four images: padding in height, in width, an exact 1 x 2 grid, more crops than dynamic_hd 4 (downscaled):
    every stored value within float32 rounding, the grids and HF's num_img_tokens (443, 561, 801, 1032) equal."""
    worst, wrong = _worst(cfg)
    assert not wrong and worst <= 1e-5, (worst, wrong)
    image = synthetic_image(200, 330)
    for ours, theirs in zip(trtio.vision.preprocess(image, cfg), P.preprocess(image, cfg)):  # the public face
        np.testing.assert_array_equal(ours, theirs)


def _global_unpadded(arr: np.ndarray, c: Phi4mmVisualConfig) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    blocks, row = ONE_IMAGE(arr, c)
    x = ((arr.astype(np.float32) - 127.5) / 127.5).transpose(2, 0, 1)
    blocks[0] = P.resize_bicubic_float(x, c.crop_size, c.crop_size)
    return blocks, row


def _column_major(arr: np.ndarray, c: Phi4mmVisualConfig) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    blocks, row = ONE_IMAGE(arr, c)
    rows, cols = row[:2]
    blocks[1:] = blocks[1:].reshape(rows, cols, *blocks.shape[1:]).transpose(1, 0, 2, 3, 4).reshape(blocks[1:].shape)
    return blocks, row


ONE_IMAGE = P._one_image
BUGS: dict[str, tuple[str, Any]] = {
    "Pillow's 22-bit weights in place of torch's int16 ones": ("_INT16_LIMIT", 1 << 40),
    "the global block resized from the unpadded image": ("_one_image", _global_unpadded),
    "the sub-blocks column by column": ("_one_image", _column_major),
    "no antialias (a plain bilinear sample)": ("resize_bilinear_aa", lambda img, h, w: img[
        (np.arange(h) * img.shape[0] // h)][:, (np.arange(w) * img.shape[1] // w)]),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_preprocessing_bug_fails(cfg: Phi4mmVisualConfig, bug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, wrong_fn = BUGS[bug]
    monkeypatch.setattr(P, name, wrong_fn)
    worst, wrong = _worst(cfg)
    assert wrong or worst > 1e-5


# -- the image-token layout --------------------------------------------------------------------------------------------


def _labelled(blocks: int, cfg: Phi4mmVisualConfig) -> np.ndarray:
    """Encoder rows whose first two values say (block, token): where each lands in the layout shows."""
    rows = np.zeros((blocks * cfg.tokens_per_block, cfg.out_hidden_size), np.float16)
    rows[:, 0] = np.repeat(np.arange(blocks), cfg.tokens_per_block)
    rows[:, 1] = np.tile(np.arange(cfg.tokens_per_block), blocks)
    rows[:, 2] = 1.0  # an encoder row (the separator rows here have other values in column 2)
    return rows


def _is_gn(row: np.ndarray, gn: np.ndarray) -> bool:
    return bool(np.array_equal(row, gn))


def test_the_layout_puts_each_row_where_edge_llm_and_hf_put_it(cfg: Phi4mmVisualConfig) -> None:
    """An exact 1 x 2 grid (no padding): 16 rows of 32 sub tokens each ended by sub_GN (block 1 then 2 along a row),
    glb_GN, 16 rows of the global block's 16 tokens each ended by sub_GN: 16 * 33 + 1 + 16 * 17 = 801 rows
    (Edge-LLM's ``16 hb (16 wb + 1) + 1 + 16 * 17``, HF's num_img_tokens)."""
    layout = np.array([[1, 2, 16, 32]])
    rows = P.image_rows(_labelled(3, cfg), layout, cfg)
    assert rows.shape == (801, 128) == (P.image_tokens(layout[0], cfg), 128)
    for r in range(16):
        line = rows[r * 33:(r + 1) * 33]
        assert _is_gn(line[32], cfg.sub_gn)
        blocks, tokens = line[:32, 0].tolist(), line[:32, 1].tolist()
        assert blocks == [1] * 16 + [2] * 16 and tokens == [r * 16 + c for c in range(16)] * 2
    assert _is_gn(rows[528], cfg.glb_gn)
    glb = rows[529:].reshape(16, 17, 128)
    assert all(_is_gn(glb[r, 16], cfg.sub_gn) for r in range(16))
    assert (glb[:, :16, 0] == 0).all() and glb[:, :16, 1].reshape(-1).tolist() == list(range(256))


def test_padding_drops_the_tokens_hf_drops(cfg: Phi4mmVisualConfig) -> None:
    """A 2 x 1 grid with 8 useful token columns (HF's mask): each of the 32 rows keeps its first 8 tokens."""
    layout = np.array([[2, 1, 32, 8]])
    rows = P.image_rows(_labelled(3, cfg), layout, cfg)
    assert rows.shape[0] == 32 * 9 + 1 + 16 * 17 == 561
    line = rows[17 * 9:18 * 9]  # row 17: the second block's row 1
    assert line[:8, 0].tolist() == [2] * 8 and line[:8, 1].tolist() == list(range(16, 24))
    assert _is_gn(line[8], cfg.sub_gn)


def test_expand_image_pads_expands_each_placeholder_into_its_image_s_tokens(cfg: Phi4mmVisualConfig) -> None:
    layout = np.array([[1, 2, 16, 32], [2, 1, 32, 8]])
    ids = np.array([5, 997, 6, 997, 7])
    out = P.expand_image_pads(ids, layout, cfg)
    assert out.tolist() == [5] + [997] * 801 + [6] + [997] * 561 + [7]
    with pytest.raises(ShapeError, match="2 image_token_id .*997.* placeholders for 1 images"):
        P.expand_image_pads(ids, layout[:1], cfg)
    with pytest.raises(ShapeError, match="layout"):
        P.image_rows(_labelled(3, cfg), np.array([[1, 2, 17, 32]]), cfg)


# -- the registry and a strict double of the builder's graph -----------------------------------------------------------


def test_the_registry_matches_the_builder_s_graph(cfg: Phi4mmVisualConfig) -> None:
    io = json.loads((DIR / "visual-io.json").read_text())
    reg = P.phi4mm_registry(cfg)
    declared = {**io["inputs"], **io["outputs"]}
    assert [s.name for s in reg] == list(declared)
    for spec in reg:
        want = declared[spec.name]
        assert spec.dtype.name.lower() == want["dtype"]
        assert len(spec.shape) == len(want["shape"])
        assert [d for d in spec.shape if isinstance(d, int)] == [d for d in want["shape"] if d >= 0]
    assert [list(p) for p in reg.get("input").profiles[0]] == io["profile"]["input"]


def test_the_double_binds_and_encodes(cfg: Phi4mmVisualConfig) -> None:
    engine = ReferencePhi4mmEngine.from_config(cfg, seed=3)
    blocks, layout = P.preprocess(synthetic_image(200, 330), cfg)
    with create_for_phi4mm_visual(engine, cfg, backend="host") as setup:
        out = setup.encode(blocks)
        embeds = out.embeds.to_numpy()
        assert embeds.shape == (512, 128)
        np.testing.assert_array_equal(embeds, reference_phi4mm(cfg, blocks.astype(np.float16), seed=3))
        rows = P.image_rows(embeds, layout, cfg)
        assert rows.shape[0] == P.image_tokens(layout[0], cfg) == 443
        with pytest.raises(CapacityError, match="5 blocks"):
            setup.encode(np.zeros((5, 3, 448, 448), np.float32))
        with pytest.raises(ShapeError, match="blocks"):
            setup.encode(np.zeros((2, 3, 224, 224), np.float32))
        bad = blocks.copy()
        bad[1, 2, 3, 4] = 1e6
        with pytest.raises(InvalidValueError, match=r"blocks\[1, 2, 3, 4\]"):
            setup.encode(bad)
        assert np.array_equal(setup.encode(blocks).embeds.to_numpy(), embeds)  # a refusal changed nothing


def test_an_engine_of_another_width_is_refused(cfg: Phi4mmVisualConfig) -> None:
    other = dataclasses.replace(cfg, out_hidden_size=64, glb_gn=np.zeros(64, np.float16),
                                sub_gn=np.zeros(64, np.float16))
    with pytest.raises(BindingError, match="output"):
        create_for_phi4mm_visual(ReferencePhi4mmEngine.from_config(other), cfg, backend="host")


def test_splice_writes_the_image_rows_over_the_expanded_placeholders(cfg: Phi4mmVisualConfig) -> None:
    table = np.random.default_rng(0).standard_normal((1000, 128)).astype(np.float16)
    layout = np.array([[1, 2, 16, 32]])
    encoded = _labelled(3, cfg)
    ids, embeds = P.splice(np.array([5, 997, 6]), layout, cfg, table, encoded)
    assert ids.shape == (803,) and embeds.shape == (803, 128)
    np.testing.assert_array_equal(embeds[0], table[5])
    np.testing.assert_array_equal(embeds[-1], table[6])
    np.testing.assert_array_equal(embeds[1:802], P.image_rows(encoded, layout, cfg))
    prompt = trtio.vision.splice(np.array([5, 997, 6]), layout, cfg, table, encoded)  # the public face: the kind's
    assert prompt.token_ids.tolist() == [ids.tolist()] and prompt.context_lengths.tolist() == [803]
    np.testing.assert_array_equal(prompt.inputs_embeds[0], embeds)


def test_an_engine_directory_opens_its_visual_folder_as_the_phi4mm_kind() -> None:
    """The shared fixture's directory (configs only): the LLM with LongRoPE and the phi4mm encoder."""
    d = trtio.EngineDir.open(DIR)
    assert d.visual_config is not None and d.visual_config.kind == "phi4mm"
    assert d.config.rope_scaling is not None and d.config.rope_scaling.rope_type == "longrope"
    assert trtio.EngineDir.open(DIR, components=("llm",)).visual_config is None


def test_the_component_attaches_a_phi4mm_setup(cfg: Phi4mmVisualConfig) -> None:
    """``create_from_engine_dir``'s path: the table's record binds a phi4mm config with Phi4mmVisualSetup."""
    attached: dict[str, Any] = {}

    class _Io:
        backend = trtio.get_backend("host")

    class _Setup:
        io = _Io()

        def attach(self, name: str, part: Any) -> None:
            attached[name] = part

    VisualComponent.attach(_Setup(), ReferencePhi4mmEngine.from_config(cfg), cfg)
    part = attached["visual"]
    try:
        assert type(part).__name__ == "Phi4mmVisualSetup" and part.cfg is cfg
        VisualComponent.check_attach(_llm(), part)
    finally:
        part.close()
