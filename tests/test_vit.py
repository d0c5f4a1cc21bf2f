"""The ViT bindings (trtio.components.visual.vit) against what NVIDIA's Edge-LLM 0.11 package wrote, and every ViT
input computed
from the patch grids against Hugging Face transformers' own definitions.

``tests/fixtures/edgellm-0.11/qwen3vl-visual`` and ``qwen25vl-visual`` hold the configs the package's builder
wrote for a tiny Qwen3-VL and Qwen2.5-VL, the inputs and outputs of the graphs its ONNX exporter wrote
(``onnx-io-visual.txt``: the ViT; ``onnx-io.txt``: the LLM) and the optimization profile its builder gives the
visual engine (``visual-profiles.json``), see that folder's README.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _onnx_io import parse_onnx_io

from trtio import CapacityError, DType, EngineDir, ShapeError
from trtio._contracts import build_registry
from trtio._state import paged_state_specs
from trtio.components.visual.visual_config import VisualConfig
from trtio.components.visual.vit import (
    check_grid,
    cu_seqlens,
    fast_pos_embed,
    rotary_pos_emb,
    vit_registry,
    vit_step,
    window_index,
)

FIXTURES = Path(__file__).parent / "fixtures" / "edgellm-0.11"
KINDS = {"qwen2_5_vl": "qwen25vl-visual", "qwen3_vl": "qwen3vl-visual"}


def visual(kind: str) -> VisualConfig:
    cfg = EngineDir.open(FIXTURES / KINDS[kind]).visual_config
    assert cfg is not None and cfg.model_type == kind
    return cfg


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_vit_registry_equals_the_exporters_visual_graph(kind: str) -> None:
    graph = parse_onnx_io(FIXTURES / KINDS[kind] / "onnx-io-visual.txt")
    registry = vit_registry(visual(kind))
    assert registry.names() == list(graph), "every binding, in the exporter's order"
    for name, (io, dtype, shape) in graph.items():
        spec = registry[name]
        assert (spec.io, spec.dtype, spec.engine_shape) == (io, dtype, shape), name


def test_the_fixture_parser_reads_both_visual_graphs() -> None:
    qwen3 = parse_onnx_io(FIXTURES / "qwen3vl-visual" / "onnx-io-visual.txt")
    assert qwen3["fast_pos_embed_idx"] == ("input", DType.INT64, (4, -1))
    assert qwen3["deepstack_features_2"] == ("output", DType.FLOAT16, (-1, 128))
    qwen25 = parse_onnx_io(FIXTURES / "qwen25vl-visual" / "onnx-io-visual.txt")
    assert qwen25["input"] == ("input", DType.FLOAT16, (-1, 1176))
    assert len(qwen25) == 8 and len(qwen3) == 10


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_vit_profile_equals_the_builders(kind: str) -> None:
    """visual-profiles.json: what the builder's _setup_component_profile set for the fixture's token caps."""
    want = json.loads((FIXTURES / KINDS[kind] / "visual-profiles.json").read_text())
    registry = vit_registry(visual(kind))
    inputs = [s for s in registry if s.is_input]
    assert sorted(s.name for s in inputs) == sorted(want)
    for spec in inputs:
        assert len(spec.profiles) == 1
        assert [list(x) for x in spec.profiles[0]] == want[spec.name], spec.name


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_llm_half_equals_the_exporters_llm_graph(kind: str) -> None:
    graph = parse_onnx_io(FIXTURES / KINDS[kind] / "onnx-io.txt")
    cfg = EngineDir.open(FIXTURES / KINDS[kind]).config
    assert cfg.is_mrope and cfg.contract == "ragged"
    specs = {s.name: s for s in [*build_registry(cfg), *paged_state_specs(cfg)]}
    optional = {n for n, s in specs.items() if s.optional and n not in graph}
    assert set(specs) - optional == set(graph)
    for name, (io, dtype, shape) in graph.items():
        assert (specs[name].io, specs[name].dtype, specs[name].engine_shape) == (io, dtype, shape), name
    deepstack = [n for n in graph if n.startswith("deepstack_embeds_")]
    assert len(deepstack) == cfg.num_deepstack_features == visual(kind).num_deepstack


# -- every input from the grids, against transformers' definitions ----------------------------------

GRIDS = [
    [[1, 4, 4]],
    [[1, 4, 6]],
    [[1, 16, 2]],
    [[1, 10, 14], [1, 4, 4]],
    [[2, 6, 8]],  # a two-frame video: its windows and tables repeat per frame
    [[1, 8, 8], [1, 2, 18], [1, 12, 6]],
]


def _torch_vision_utils() -> tuple[object, object]:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import transformers.vision_utils as vu

    return torch, vu


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_rotary_table_and_cu_seqlens_equal_transformers(kind: str, grid: list[list[int]]) -> None:
    torch, vu = _torch_vision_utils()
    cfg = visual(kind)
    g = torch.tensor(grid)  # type: ignore[attr-defined]
    d = cfg.rotary_dim
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float) / d))  # type: ignore[attr-defined]
    pos = vu.get_vision_position_ids(g, cfg.merge_size)  # type: ignore[attr-defined]
    want = (pos.unsqueeze(-1) * inv).flatten(1).numpy()
    got = rotary_pos_emb(cfg, np.asarray(grid))
    assert got.dtype == np.float32 and got.shape == (sum(t * h * w for t, h, w in grid), d)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(cu_seqlens(np.asarray(grid)), vu.get_vision_cu_seqlens(g).numpy())  # type: ignore


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_window_indexes_equal_transformers(grid: list[list[int]]) -> None:
    torch, vu = _torch_vision_utils()
    cfg = visual("qwen2_5_vl")
    index, windows = vu.get_vision_window_index(torch.tensor(grid), spatial_merge_size=cfg.merge_size,  # type: ignore
                                                window_size=cfg.window_size, patch_size=cfg.patch_size)
    got_index, got_windows = window_index(cfg, np.asarray(grid))
    np.testing.assert_array_equal(got_index, index.numpy())
    np.testing.assert_array_equal(got_windows, windows.numpy())
    step = vit_step(cfg, grid)
    np.testing.assert_array_equal(step.values["reverse_window_index"], np.argsort(index.numpy()))
    assert step.dims.vit_windows_p1 == windows.shape[0]


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_fast_position_embeddings_interpolate_as_transformers(grid: list[list[int]]) -> None:
    """Each patch's blend of the learned position table equals transformers' bilinear interpolation (its corners
    and weights may differ where its float32 linspace lands a hair off a grid line: the blend is the same)."""
    torch, vu = _torch_vision_utils()
    cfg = visual("qwen3_vl")
    side = cfg.grid_side
    idx, weight = vu.get_vision_bilinear_indices_and_weights(torch.tensor(grid), num_grid_per_side=side,  # type: ignore
                                                             spatial_merge_size=cfg.merge_size)
    table = np.random.default_rng(0).standard_normal((cfg.num_position_embeddings, 5))
    want = (table[idx.numpy()] * weight.numpy()[:, :, None]).sum(0)
    got_idx, got_weight = fast_pos_embed(cfg, np.asarray(grid))
    assert got_idx.shape == got_weight.shape == (4, sum(t * h * w for t, h, w in grid))
    assert got_idx.min() >= 0 and got_idx.max() < cfg.num_position_embeddings
    np.testing.assert_allclose((table[got_idx] * got_weight[:, :, None]).sum(0), want, atol=1e-5)
    np.testing.assert_allclose(got_weight.sum(0), 1.0, atol=1e-6)
    assert vit_step(cfg, grid).values["fast_pos_embed_weight"].dtype == np.float16  # the engine's input dtype


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_step_binds_the_grids_shapes(kind: str) -> None:
    cfg = visual(kind)
    step = vit_step(cfg, [[1, 4, 6], [1, 8, 2]])
    d = step.dims
    assert (d.vit_patches, d.vit_tokens, d.vit_frames_p1, d.vit_max_seqlen) == (40, 10, 3, 24)
    assert vit_registry(cfg)["rotary_pos_emb"].resolve(d) == (40, cfg.rotary_dim)
    assert vit_registry(cfg)["output"].resolve(d) == (10, cfg.out_hidden_size)
    for v in step.values.values():
        assert not v.flags.writeable  # staging constants: a grid seen before uploads nothing new


def test_the_engines_caps_are_refused_naming_them() -> None:
    cfg = visual("qwen2_5_vl")  # builder_config: min 4, max 256 merged tokens; 128 per image
    with pytest.raises(CapacityError, match="hold 1088 patches .* takes 16..1024 patches"):
        vit_step(cfg, [[1, 32, 34]])
    with pytest.raises(CapacityError, match=r"grid_thw\[1\]: a frame of 520 patches; the visual engine takes 512"):
        vit_step(cfg, [[1, 2, 2], [1, 20, 26]])
    with pytest.raises(CapacityError, match="hold 4 patches"):
        vit_step(cfg, [[1, 2, 2]])  # one merged token: below min_image_tokens (4)
    with pytest.raises(CapacityError, match="65 frames .* takes 64"):
        vit_step(cfg, [[1, 2, 2]] * 65)


@pytest.mark.parametrize("bad, why", [
    ([[1, 3, 4]], r"grid_thw\[0\] = \(1, 3, 4\): expected t >= 1 and h, w positive multiples of merge_size 2"),
    ([[0, 2, 2]], r"grid_thw\[0\]"),
    ([1, 2], r"expected integer \(t, h, w\) rows"),
    ([[1.0, 2.0, 2.0]], "expected integer"),
    ([], "expected integer"),
])
def test_malformed_grids_are_refused(bad: object, why: str) -> None:
    with pytest.raises(ShapeError, match=why):
        check_grid(bad, visual("qwen3_vl"))
