"""Real-graph parity of vision-language models (DESIGN §17): NVIDIA's exported Qwen2.5-VL and Qwen3-VL pairs (the
ViT graph with its ViTAttentionPlugin, the LLM graph with MRoPE, deepstack inputs and QK norm) driven by trtio's
preprocessing, ViT setup, splice and LLM setup equal Hugging Face's vision tower and full VLM forward, and wrong
runtime inputs fail the check (tests/_parity_vlm.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests._parity import Case
from tests._parity_vlm import (
    SCENARIOS,
    deepstack_shifted,
    deepstack_swapped,
    delta_lost,
    mrope_axis_swapped,
    planted,
    position_corners_swapped,
    rotary_axes_swapped,
    run,
    window_edges_early,
    window_order_reversed,
    windows_merged,
)
from trtio.testing.edgellm_plugins._common import PluginInputError
from trtio.testing.edgellm_plugins.vit import vit_attention_plugin

CASES = ["qwen25-vl", "qwen3-vl"]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("name", CASES)
def test_equals_hugging_face(name: str, scenario: str) -> None:
    cmp = run(Case(name), scenario)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


# (case, scenario, LLM hook factory or None, ViT hook or None): each plants one wrong runtime input.
BUGS = {
    "an MRoPE row on the wrong axis (height and width swapped)": ("image", mrope_axis_swapped, None),
    "the position delta lost in decode": ("image", delta_lost, None),
    "the ViT's rotary row and column halves swapped": ("vision", None, rotary_axes_swapped),
}
BUGS_25 = {
    "ViT windows merged pairwise": ("vision", None, windows_merged),
    "ViT window edges one merged token early": ("vision", None, window_edges_early),
    "reverse_window_index not undoing window_index": ("vision", None, window_order_reversed),
}
BUGS_3 = {
    "deepstack rows one token late": ("image", lambda _case: deepstack_shifted, None),
    "the two deepstack features swapped": ("image", lambda _case: deepstack_swapped, None),
    "learned position corners swapped": ("vision", None, position_corners_swapped),
}


@pytest.mark.parametrize(("name", "bug"), [(n, b) for n in CASES for b in BUGS]
                         + [("qwen25-vl", b) for b in BUGS_25] + [("qwen3-vl", b) for b in BUGS_3])
def test_a_planted_input_bug_fails_parity(name: str, bug: str) -> None:
    scenario, llm_bug, vit_bug = {**BUGS, **BUGS_25, **BUGS_3}[bug]
    case = Case(name)
    how = planted(case, scenario, hook=llm_bug(case) if llm_bug else None, visual_hook=vit_bug)
    assert how.startswith(("mismatch", "refused"))


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("name", CASES)
def test_equals_hugging_face_on_the_cuda_backend(name: str, scenario: str, graphs: bool) -> None:
    """The same on device memory: both graphs run in CUDA host functions between stream-ordered copies, also
    replayed from CUDA graphs."""
    cmp = run(Case(name), scenario, backend="cuda", graphs=graphs)
    assert cmp.rows >= 4 and cmp.worst <= 0.1


def test_the_vit_plugin_model_refuses_what_the_kernel_cannot_run() -> None:
    """ViTAttentionPlugin's model refuses a head size the FMHA kernels lack, ``cu_seqlens`` that leave rows unwritten
    or run backwards, and a segment longer than the carrier's extent (rows the launch never covers)."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((6, 1, 64)).astype(np.float16) for _ in range(3))
    attrs = {"num_heads": 1, "head_size": 64, "attention_scale": 0.125}

    def call(cu: list[int], carrier: int = 4, given: dict[str, object] = attrs, x: np.ndarray = q) -> np.ndarray:
        inputs = (x, k, v, np.array(cu, np.int32), np.zeros(carrier, np.int32))
        (out,) = vit_attention_plugin("n", inputs, dict(given))
        return out

    out = call([0, 2, 6])  # two segments, each sees only itself, no causal mask
    first = np.einsum("qd,kd->qk", q[:2, 0].astype(np.float32), k[:2, 0].astype(np.float32)) * 0.125
    weights = np.exp(first - first.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(out[:2, 0], weights @ v[:2, 0].astype(np.float32), atol=2e-3)
    for bad, why in (([0, 2, 5], "ends at 5"), ([0, 4, 2, 6], "decreases"), ([1, 6], "starts at row 0"),
                     ([0, 6], "more than max_seqlen_carrier")):
        with pytest.raises(PluginInputError, match=why):
            call(bad)
    with pytest.raises(PluginInputError, match="head_size 16"):
        call([0, 6], 6, {"num_heads": 4, "head_size": 16}, q.reshape(6, 4, 16))
