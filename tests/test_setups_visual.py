"""create_for_visual / VisualSetup.encode on reference ViT engines of both kinds (the host backend here; the
cuda backend with CuPy engines on a GPU: ``-m gpu``).

The ground truth is :func:`trtio.testing.reference_visual.reference_vit`: the toy ViT over the patches and the
inputs :func:`trtio.components.visual.vit.vit_step` computes from the grids (themselves held to transformers in
tests/test_vit.py),
so an encode equals it only where every input reached the engine at its place and shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trtio
from trtio import BindingError, CapacityError, ClosedError, EngineDir, InvalidValueError, ShapeError
from trtio.components.visual.visual_config import VisualConfig
from trtio.components.visual.visual_setup import VisualSetup, create_for_visual
from trtio.components.visual.vit import vit_step
from trtio.testing.reference_visual import ReferenceVisualEngine, VitWeights, reference_vit

FIXTURES = Path(__file__).parent / "fixtures" / "edgellm-0.11"
KINDS = {"qwen2_5_vl": "qwen25vl-visual", "qwen3_vl": "qwen3vl-visual"}
GRIDS = ([[1, 8, 12]], [[1, 4, 4], [1, 6, 8]], [[1, 2, 10], [1, 12, 2], [1, 4, 4]], [[2, 4, 6]])


def visual(kind: str) -> VisualConfig:
    cfg = EngineDir.open(FIXTURES / KINDS[kind]).visual_config
    assert cfg is not None
    return cfg


def backend_of(device: str) -> str:
    return "cuda" if device == "gpu" else "host"


def patches_for(cfg: VisualConfig, grid: list[list[int]], seed: int = 0) -> np.ndarray:
    n = sum(t * h * w for t, h, w in grid)
    return np.random.default_rng(seed).standard_normal((n, cfg.patch_dim)).astype(np.float32)


def check(cfg: VisualConfig, weights: VitWeights, out: Any, patches: np.ndarray, grid: list[list[int]]) -> None:
    want, want_ds = reference_vit(cfg, weights, patches, grid)
    got = out.embeds.to_numpy()
    assert got.dtype == np.float16 and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float32), want, atol=2e-3, rtol=2e-3)
    assert len(out.deepstack) == cfg.num_deepstack == len(want_ds)
    for feature, wanted in zip(out.deepstack, want_ds):
        np.testing.assert_allclose(feature.to_numpy().astype(np.float32), wanted, atol=2e-3, rtol=2e-3)
    np.testing.assert_array_equal(out.grid_thw, np.asarray(grid))


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_encode_equals_the_reference_vit(kind: str, graphs: bool, device: str) -> None:
    cfg = visual(kind)
    engine = ReferenceVisualEngine.from_config(cfg, device=device)
    with create_for_visual(engine, cfg, graphs=graphs, backend=backend_of(device)) as v:
        for i, grid in enumerate(GRIDS + GRIDS[:2]):  # the last two repeat earlier grids: graph replays
            patches = patches_for(cfg, grid, seed=i)
            check(cfg, engine.weights, v.encode(patches, grid), patches, grid)
        stats = v.graph_stats
        if graphs:
            assert (stats.captures, stats.hits) == (len(GRIDS), 2), "a graph per grid shape, replayed on repeats"
        else:
            assert stats.captures == stats.hits == 0


def test_a_grid_seen_before_uploads_no_new_inputs() -> None:
    cfg = visual("qwen3_vl")
    with create_for_visual(ReferenceVisualEngine.from_config(cfg, device="host"), cfg, backend="host") as v:
        grid = [[1, 6, 8]]
        v.encode(patches_for(cfg, grid), grid)
        skipped = v._staging.skipped
        v.encode(patches_for(cfg, grid, 1), grid)
        assert v._staging.skipped - skipped == len(v._geometry_names), "every grid input was held already"


def test_device_patches_are_taken_as_they_are(device: str) -> None:
    cfg = visual("qwen2_5_vl")
    be = backend_of(device)
    engine = ReferenceVisualEngine.from_config(cfg, device=device)
    grid = [[1, 4, 6]]
    patches = patches_for(cfg, grid)
    with create_for_visual(engine, cfg, backend=be) as v, \
            trtio.Tensor.from_numpy(patches.astype(np.float16), backend=be) as on_device:
        check(cfg, engine.weights, v.encode(on_device, grid), patches, grid)
        with pytest.raises(ShapeError, match=r"expected a \[16, 1176\] float16 device array .* got \[24, 1176\]"):
            v.encode(on_device, [[1, 4, 4]])


def test_every_input_counts() -> None:
    """The toy ViT's output moves when any one input it is given moves (a wrong binding cannot pass)."""
    import trtio.testing.reference_visual as rv

    for kind in KINDS:
        cfg = visual(kind)
        weights = VitWeights.generate(cfg, 0)
        grid = [[1, 6, 8], [1, 4, 4]]
        step = vit_step(cfg, grid)
        base: dict[str, Any] = dict(step.values)
        base["input"] = patches_for(cfg, grid).astype(np.float16)
        want, _ = rv._vit_forward(np, np.matmul, cfg, weights, base, step.dims.vit_max_seqlen, checked=True)
        changes = {
            "input": lambda v: v[::-1].copy(),
            "rotary_pos_emb": lambda v: v * 1.5,
            "cu_seqlens": lambda v: np.array([0, 16, 64], np.int32),
            "window_index": lambda v: np.roll(v, 1),
            "cu_window_seqlens": lambda v: np.array([0, v[-1]], np.int32),
            "fast_pos_embed_idx": lambda v: np.roll(v, 1, axis=1),
            "fast_pos_embed_weight": lambda v: v[::-1].copy(),
        }
        for name, change in changes.items():
            if name not in base:
                continue
            io = dict(base)
            io[name] = change(base[name])
            if name == "window_index":  # keep the pair consistent: the order itself is what changes
                io["reverse_window_index"] = np.argsort(io[name])
            got, _ = rv._vit_forward(np, np.matmul, cfg, weights, io, step.dims.vit_max_seqlen, checked=True)
            assert np.abs(got - want).max() > 1e-3, f"{kind}: {name} did not change the output"
        short, _ = rv._vit_forward(np, np.matmul, cfg, weights, base, step.dims.vit_max_seqlen // 2, checked=False)
        assert np.abs(short - want).max() > 1e-3, f"{kind}: max_seqlen_carrier's extent did not count"


def test_the_host_engine_refuses_inputs_it_cannot_use() -> None:
    import trtio.testing.reference_visual as rv

    cfg = visual("qwen2_5_vl")
    weights = VitWeights.generate(cfg, 0)
    grid = [[1, 6, 8]]
    step = vit_step(cfg, grid)
    base: dict[str, Any] = dict(step.values)
    base["input"] = patches_for(cfg, grid).astype(np.float16)
    cases = {
        "cu_seqlens": (np.array([0, 40], np.int32), "must rise from 0 to the 48 rows"),
        "window_index": (np.zeros(12, np.int64), "window_index must be a permutation"),
        "reverse_window_index": (np.arange(12)[::-1].copy(), "reverse_window_index must undo window_index"),
    }
    for name, (value, why) in cases.items():
        io = dict(base)
        io[name] = value
        with pytest.raises(InvalidValueError, match=why):
            rv._vit_forward(np, np.matmul, cfg, weights, io, 48, checked=True)
    with pytest.raises(InvalidValueError, match="longer than max_seqlen_carrier's extent 20"):
        rv._vit_forward(np, np.matmul, cfg, weights, base, 20, checked=True)


def test_bad_input_is_refused_before_any_work() -> None:
    cfg = visual("qwen3_vl")
    engine = ReferenceVisualEngine.from_config(cfg, device="host")
    with create_for_visual(engine, cfg, backend="host") as v:
        grid = [[1, 4, 6]]
        v.encode(patches_for(cfg, grid), grid)
        before = dict(v.executor.context.calls)
        uploads = v._staging.uploads
        bad_patches = patches_for(cfg, grid)
        bad_patches[3, 7] = 1e6
        for patches, g, error, why in [
            (patches_for(cfg, grid)[:-1], grid, ShapeError, r"patches: expected \[24, 1536\] float values"),
            (bad_patches, grid, InvalidValueError, r"patches\[3, 7\] = 1000000.0 is not a finite float16 value"),
            (patches_for(cfg, grid).astype(np.int32), grid, ShapeError, "float values"),
            (patches_for(cfg, [[1, 64, 66]]), [[1, 64, 66]], CapacityError, "hold 4224 patches"),
            (patches_for(cfg, grid), [[1, 4, 5]], ShapeError, r"grid_thw\[0\] = \(1, 4, 5\)"),
        ]:
            with pytest.raises(error, match=why):
                v.encode(patches, g)
        assert v.executor.context.calls == before and v._staging.uploads == uploads, "nothing was enqueued"
    with pytest.raises(ClosedError):
        v.encode(patches_for(cfg, grid), grid)


def test_an_engine_of_another_kind_is_refused_listing_every_problem() -> None:
    qwen25, qwen3 = visual("qwen2_5_vl"), visual("qwen3_vl")
    with pytest.raises(BindingError) as caught:
        create_for_visual(ReferenceVisualEngine.from_config(qwen3, device="host", null_compute=True), qwen25,
                          backend="host")
    text = str(caught.value)
    for needle in ("fast_pos_embed_idx: the engine declares this input but a visual engine",
                   "cu_window_seqlens: the config implies this input but the engine does not declare it",
                   "input: dim 1 is 1536 in the engine but 1176 in the config",
                   "deepstack_features_0: the engine declares this output"):
        assert needle in text, text


def test_a_profile_narrower_than_the_config_is_refused() -> None:
    import dataclasses

    cfg = visual("qwen3_vl")
    engine = ReferenceVisualEngine.from_config(dataclasses.replace(cfg, max_image_tokens=256,
                                                                   max_image_tokens_per_image=128),
                                               device="host", null_compute=True)
    with pytest.raises(BindingError, match=r"input: profile 0 goes up to \[1024, 1536\] in the engine, the config "
                                           r"needs \[4096, 1536\]"):
        create_for_visual(engine, cfg, backend="host")
    with pytest.raises(trtio.InvalidTypeError, match="cfg must be a VisualConfig"):
        create_for_visual(engine, trtio.LLMEngineConfig.from_edgellm(FIXTURES / "qwen3vl-visual" / "config.json"))


def test_encodes_on_two_streams_run_in_call_order() -> None:
    """The second encode's stream waits for the first's (they share the input buffers): on the lazily ordered
    AsyncHostBackend, a missing wait would let the second upload overwrite the first's patches."""
    from trtio.testing import AsyncHostBackend

    cfg = visual("qwen2_5_vl")
    be = AsyncHostBackend(seed=0)
    engine = ReferenceVisualEngine.from_config(cfg, backend=be)
    with create_for_visual(engine, cfg, backend=be) as v:
        s1, s2 = trtio.Stream.create(be), trtio.Stream.create(be)
        grid = [[1, 4, 6]]
        a, b = patches_for(cfg, grid, 1), patches_for(cfg, grid, 2)
        first = v.encode(a, grid, s1).embeds.to_numpy(s1).copy()
        check(cfg, engine.weights, v.encode(b, grid, s2), b, grid)
        want, _ = reference_vit(cfg, engine.weights, a, grid)
        np.testing.assert_allclose(first.astype(np.float32), want, atol=2e-3)


def test_device_patches_dropped_as_the_encode_returns_are_read_intact() -> None:
    """Patches in device memory that goes back to its allocator as encode returns (the caller keeps no
    reference) are read as they were: the encode keeps them until its copy has run. The lazily running
    AsyncHostBackend overwrites freed memory at once, so a copy that ran later would read garbage."""
    import gc
    import weakref

    from trtio._cuda.backend import Location
    from trtio.testing import AsyncHostBackend

    cfg = visual("qwen2_5_vl")
    be = AsyncHostBackend(seed=0)
    engine = ReferenceVisualEngine.from_config(cfg, backend=be)
    grid = [[1, 4, 6]]
    patches = patches_for(cfg, grid)

    class Block:
        def __init__(self, nbytes: int) -> None:
            self.ptr = be.alloc(nbytes, Location.DEVICE)
            weakref.finalize(self, be.free, self.ptr, Location.DEVICE)

    def dropped() -> trtio.Tensor:
        host = patches.astype(np.float16)
        block = Block(host.nbytes)
        view = trtio.Tensor.wrap(block.ptr, host.shape, trtio.DType.FLOAT16, Location.DEVICE, backend=be, owner=block)
        view.copy_from(host)
        return view

    with create_for_visual(engine, cfg, backend=be) as v:
        out = v.encode(dropped(), grid)
        gc.collect()
        check(cfg, engine.weights, out, patches, grid)


def test_memory_is_planned_from_the_caps() -> None:
    cfg = visual("qwen2_5_vl")
    with create_for_visual(ReferenceVisualEngine.from_config(cfg, device="host"), cfg, backend="host") as v:
        report = v.memory_report()
        assert report.entry("input").shape == (cfg.max_patches, cfg.patch_dim)
        assert report.entry("output").shape == (cfg.max_image_tokens, cfg.out_hidden_size)
        assert report.entry("cu_seqlens").shape == (cfg.max_frames + 1,)
        assert report.entry("max_seqlen_carrier").shape == (cfg.max_frame_patches,)
        assert isinstance(v, VisualSetup) and "qwen2_5_vl" in repr(v)


def test_a_gpu_reference_engine_without_cupy_is_refused_as_it_is_made() -> None:
    """Both reference engines (the LLM's and the ViT's) refuse device='gpu' where CuPy is missing, naming
    themselves and the way out, when they are made rather than at their first step; a null-compute one, which
    computes nothing, is made."""
    import importlib.util

    from trtio._tools.bench import configs
    from trtio.testing import ReferenceEngine

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    llm, _ = configs("ragged", 256)
    for make, who in ((lambda **kw: ReferenceVisualEngine.from_config(visual("qwen3_vl"), **kw),
                       "ReferenceVisualEngine"),
                      (lambda **kw: ReferenceEngine.from_config(llm, **kw), "ReferenceEngine")):
        with pytest.raises(trtio.EngineError, match=rf"^{who}: device='gpu' needs CuPy .*use device='host'"):
            make(device="gpu")
        make(device="gpu", null_compute=True)
