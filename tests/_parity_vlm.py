"""Real-graph parity of vision-language models (DESIGN §17): the exporter's ``visual/`` and ``llm/`` graphs of a tiny
Qwen2.5-VL / Qwen3-VL, driven by trtio (:func:`trtio.vision.preprocess`, :meth:`VisualSetup.encode
<trtio.components.visual.visual_setup.VisualSetup.encode>`, :func:`trtio.vision.splice`, the LLM setup's prefill and
decode), held to
Hugging Face's fp32 vision tower and full VLM forward on the same images and tokens (``scripts/parity_cases/vlm.py``
wrote the references).

The scenarios: ``vision`` (both images in one encode against HF's vision tower, embeds and deepstack features),
``image`` (text + image + text, then decodes), ``two-images``, ``batch`` (an image prompt, a text-only prompt and the
two-image prompt prefilled together, then decoded together), ``admission`` (a text prompt admitted into the slot a
two-image prompt left, while an image prompt decodes) and ``prefix`` (a prefix holding an image prefilled, pinned,
its slot released, then continued by text in another slot). The planted bugs rewrite one runtime input as a
trtio bug would: an MRoPE row built on the wrong axis, the position delta lost in decode, deepstack rows one token
off, and the ViT's window and rotary inputs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

import trtio
from tests._parity import Case, Compare, ParityMismatch, Seq, decode_all, llm_setup
from trtio.components.visual.visual_config import VisualConfig
from trtio.vision import VisionPrompt, preprocess, splice

Hook = Callable[[dict[str, np.ndarray]], None]

# The fp16 ViT against HF's fp32 vision tower: max |Δ| over the merged rows over max(1, their std) (measured: Qwen2.5-VL
# 0.0084 at std 3.5 = 0.0024, Qwen3-VL 0.0056 at std 1.7 = 0.0033; the planted ViT input bugs move it by 0.078-4.6).
VISION_TOLERANCE = 0.01


@dataclass
class Vlm:
    """One scenario's setups: the case, the LLM setup, the ViT setup and its config, the embedding table."""

    case: Case
    llm: Any
    visual: Any
    cfg: VisualConfig
    table: np.ndarray

    def images(self, which: list[int]) -> list[np.ndarray]:
        return [self.case.arrays[f"image_{i}"] for i in which]

    def prompt(self, seq: Seq) -> VisionPrompt:
        """``seq``'s prompt ids spliced with its images, encoded by the ViT (one encode per prompt)."""
        which = self.case.meta["sequences"][seq.index]["images"]
        ids = self.case.arrays[f"prompt_ids_{seq.index}"]
        if not which:
            p = splice(ids, None, self.cfg, self.table)
        else:
            patches, grid = preprocess(self.images(which), self.cfg)
            p = splice(ids, grid, self.cfg, self.table, self.visual.encode(patches, grid))
        # the splice expands each pad into the image's tokens exactly as Hugging Face's processor did
        np.testing.assert_array_equal(p.token_ids[0], seq.prompt)
        return p


def visual_config(case: Case, engine: Any) -> VisualConfig:
    preprocessor = json.loads((case.root / "visual" / "preprocessor_config.json").read_text())
    return VisualConfig.from_edgellm(engine.config, preprocessor=preprocessor, what=f"{case.name}/visual/config.json")


@contextlib.contextmanager
def vlm(case: Case, backend: str = "host", graphs: bool = False, hook: Hook | None = None,
        visual_hook: Hook | None = None) -> Iterator[Vlm]:
    engine = case.engine("visual", backend)
    engine.input_hook = visual_hook
    cfg = visual_config(case, engine)
    with llm_setup(case, backend, graphs, hook) as llm, \
            trtio.create_for_visual(engine, cfg, backend=backend, graphs=graphs) as visual:
        yield Vlm(case, llm, visual, cfg, case.table())


def _prefill(v: Vlm, p: VisionPrompt, **kwargs: Any) -> np.ndarray:
    deep = list(p.deepstack_embeds) or None
    logits: np.ndarray = v.llm.prefill(p.inputs_embeds, p.context_lengths, deepstack_embeds=deep,
                                       mrope_positions=p.mrope_positions, **kwargs).to_numpy()
    return logits


# -- the scenarios --------------------------------------------------------------------------------------------------


def vision(v: Vlm, cmp: Compare) -> None:
    """Both images preprocessed and encoded in one call (two ``cu_seqlens`` segments): the patches equal Hugging Face's
    processor's, the merged rows (and each deepstack feature) its vision tower's."""
    arrays = v.case.arrays
    patches, grid = preprocess(v.images([0, 1]), v.cfg)
    np.testing.assert_array_equal(grid, arrays["vision_grid"])
    np.testing.assert_allclose(patches, arrays["vision_pixels"], rtol=0, atol=1e-6)
    out = v.visual.encode(patches, grid)
    got = [out.embeds.to_numpy()] + [d.to_numpy() for d in out.deepstack]
    want = [arrays["vision_embeds"]] + [arrays[f"vision_deepstack_{j}"] for j in range(v.cfg.num_deepstack)]
    assert len(got) == len(want) == 1 + sum(k.startswith("vision_deepstack_") for k in arrays)
    for j, (g, w) in enumerate(zip(got, want)):
        what = "embeds" if j == 0 else f"deepstack feature {j - 1}"
        delta = float(np.abs(g.astype(np.float32) - w).max()) / max(1.0, float(w.std()))
        cmp.worst = max(cmp.worst, delta)
        cmp.rows += w.shape[0]
        if not delta <= VISION_TOLERANCE:
            raise ParityMismatch(f"vision {what}: max |Δ| / std {delta:.4f} > {VISION_TOLERANCE}")


def _alone(purpose: str) -> Callable[[Vlm, Compare], None]:
    def scenario(v: Vlm, cmp: Compare) -> None:
        (s,) = v.case.of(purpose)
        logits = _prefill(v, v.prompt(s))
        cmp.row(s, s.prompt_length - 1, logits[0], "prefill")
        cmp.token(s, s.prompt_length - 1, int(logits[0].argmax()), "prefill")
        decode_all(v.llm, v.table, [s], cmp, [s.prompt_length - 1], v.case.meta["continuation"] - 1)
    scenario.__doc__ = f"The {purpose!r} prompt prefilled alone, then decoded: each row equals Hugging Face's."
    return scenario


def batch(v: Vlm, cmp: Compare) -> None:
    """An image prompt, a text-only prompt and a two-image prompt prefilled together (each sequence's own MRoPE
    positions, the text one plain), then decoded together (each from its own delta)."""
    seqs = [v.case.of(p)[0] for p in ("image", "text", "two-images")]
    p = VisionPrompt.stack([v.prompt(s) for s in seqs])
    logits = _prefill(v, p)
    for i, s in enumerate(seqs):
        cmp.row(s, s.prompt_length - 1, logits[i], "batch prefill")
        cmp.token(s, s.prompt_length - 1, int(logits[i].argmax()), "batch prefill")
    decode_all(v.llm, v.table, seqs, cmp, [s.prompt_length - 1 for s in seqs], v.case.meta["continuation"] - 1)


def admission(v: Vlm, cmp: Compare) -> None:
    """An image prompt and a two-image prompt decode; the two-image one is released and a text-only prompt is
    admitted into its slot (whose rows the images had moved: it must get text positions back) while the first goes
    on decoding from its own delta."""
    first, second, new = (v.case.of(p)[0] for p in ("image", "two-images", "text"))
    logits = _prefill(v, VisionPrompt.stack([v.prompt(first), v.prompt(second)]))
    rows = [first.prompt_length - 1, second.prompt_length - 1]
    for i, s in enumerate((first, second)):
        cmp.row(s, rows[i], logits[i], "prefill")
    decode_all(v.llm, v.table, [first, second], cmp, rows, 2)
    v.llm.release([1])
    logits = _prefill(v, v.prompt(new), slots=[1])
    cmp.row(new, new.prompt_length - 1, logits[0], "admitted")
    cmp.token(new, new.prompt_length - 1, int(logits[0].argmax()), "admitted")
    decode_all(v.llm, v.table, [first, new], cmp, [rows[0], new.prompt_length - 1], 3, slots=[0, 1])


def prefix(v: Vlm, cmp: Compare) -> None:
    """A prefix holding an image (text, the image, text) prefilled in slot 2 and pinned; the slot is released and a
    new sequence starts from the prefix in slot 0 with the rest of the prompt (text, no positions given: it goes on
    from the prefix's delta, as HF's cache position + ``rope_deltas``), then decodes."""
    (s,) = v.case.of("prefix")
    (mark,) = s.marks
    pinned = mark + 1
    whole = v.prompt(s)
    head = VisionPrompt(whole.token_ids[:, :pinned], whole.inputs_embeds[:, :pinned],
                        tuple(d[:, :pinned] for d in whole.deepstack_embeds), whole.mrope_positions[:, :, :pinned],
                        np.array([pinned], np.int64), whole.rope_deltas)
    logits = _prefill(v, head, slots=[2])
    cmp.row(s, mark, logits[0], "prefix prefill")
    with contextlib.closing(v.llm.pin_prefix(2, pinned)) as pfx:
        v.llm.release([2])
        rest = s.prompt[pinned:]
        logits = v.llm.prefill(v.table[rest][None], [len(rest)], slots=[0], prefix=pfx).to_numpy()
        cmp.row(s, s.prompt_length - 1, logits[0], "after the prefix")
        cmp.token(s, s.prompt_length - 1, int(logits[0].argmax()), "after the prefix")
        decode_all(v.llm, v.table, [s], cmp, [s.prompt_length - 1], v.case.meta["continuation"] - 1, slots=[0])
        v.llm.release([0])


SCENARIOS: dict[str, Callable[[Vlm, Compare], None]] = {
    "vision": vision, "image": _alone("image"), "two-images": _alone("two-images"), "batch": batch,
    "admission": admission, "prefix": prefix,
}


def run(case: Case, scenario: str, backend: str = "host", graphs: bool = False, hook: Hook | None = None,
        visual_hook: Hook | None = None) -> Compare:
    cmp = Compare()
    with vlm(case, backend, graphs, hook, visual_hook) as v:
        SCENARIOS[scenario](v, cmp)
    return cmp


def planted(case: Case, scenario: str, hook: Hook | None = None, visual_hook: Hook | None = None) -> str:
    """Run ``scenario`` with a planted input bug; how the parity check failed (AssertionError if it passed)."""
    try:
        run(case, scenario, hook=hook, visual_hook=visual_hook)
    except ParityMismatch as exc:
        return f"mismatch: {exc}"
    except trtio.errors.InvalidValueError as exc:
        return f"refused: {exc}"
    raise AssertionError(f"{case.name}/{scenario}: the planted bug passed the parity check")


# -- planted bugs ---------------------------------------------------------------------------------------------------


def rope_rows(case: Case, positions: np.ndarray) -> np.ndarray:
    """float32 ``[T, D]`` rows ``[cos | sin]`` of 3-axis ``positions`` ``[3, T]``, written here from Hugging Face's
    definitions (``Qwen2_5_VLRotaryEmbedding`` + ``apply_multimodal_rotary_pos_emb`` with its ``mrope_section``
    split; Qwen3-VL's ``apply_interleaved_mrope``), apart from trtio's ``rope.py``: the planted bugs build their
    wrong rows with it, after showing it gives trtio's right rows."""
    llm = json.loads((case.root / "llm" / "config.json").read_text())
    rope = llm["rope_scaling"]
    dim = int(llm["head_dim"])
    half = dim // 2
    inv = 1.0 / (float(llm["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    s0, s1, s2 = rope["mrope_section"]
    axis = np.zeros(half, np.int64)
    if rope.get("mrope_interleaved"):
        j = np.arange(half)
        axis[(j % 3 == 1) & (j < 3 * s1)] = 1
        axis[(j % 3 == 2) & (j < 3 * s2)] = 2
    else:
        axis[s0:s0 + s1] = 1
        axis[s0 + s1:] = 2
    angles = positions[axis].T.astype(np.float64) * inv  # [T, half]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


def expected_positions(case: Case, seq: Seq) -> np.ndarray:
    """``[3, L]`` positions of ``seq``'s expanded prompt, from its layout (HF ``get_rope_index`` for still images)."""
    ids = seq.prompt
    pad = int(json.loads((case.root / "llm" / "config.json").read_text())["image_token_id"])
    grids = iter(case.arrays["vision_grid"][case.meta["sequences"][seq.index]["images"]])
    out = np.zeros((3, len(ids)), np.int64)
    pos = i = 0
    while i < len(ids):
        if ids[i] != pad:
            out[:, i] = pos
            pos, i = pos + 1, i + 1
            continue
        _, h, w = (int(x) // m for x, m in zip(next(grids), (1, 2, 2)))
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        n = h * w
        out[0, i:i + n] = pos
        out[1, i:i + n] = pos + rows.reshape(-1)
        out[2, i:i + n] = pos + cols.reshape(-1)
        pos, i = pos + max(h, w), i + n
    return out


def mrope_axis_swapped(case: Case) -> Hook:
    """The ``image`` prompt's prefill rows built from height and width positions swapped (a splice or table bug
    that puts an image token's row on the wrong axis); the hook first checks the right rows are trtio's."""
    (s,) = case.of("image")
    right = expected_positions(case, s)

    def hook(inputs: dict[str, np.ndarray]) -> None:
        if inputs["execution_phase_marker"].shape[0] != 1:
            return
        table = inputs["rope_rotary_cos_sin"]
        np.testing.assert_allclose(table[:s.prompt_length], rope_rows(case, right), atol=2e-5)
        inputs["rope_rotary_cos_sin"] = table.copy()
        inputs["rope_rotary_cos_sin"][:s.prompt_length] = rope_rows(case, right[[0, 2, 1]])
    return hook


def delta_lost(case: Case) -> Hook:
    """Decode rows at text position ``k`` instead of ``k + delta`` (the position delta lost after the prompt)."""
    (s,) = case.of("image")
    right = expected_positions(case, s)
    delta = int(right.max()) + 1 - s.prompt_length

    def hook(inputs: dict[str, np.ndarray]) -> None:
        if inputs["execution_phase_marker"].shape[0] != 3:
            return
        k = int(inputs["attention_sequence_lengths"][0]) - 1
        table = inputs["rope_rotary_cos_sin"]
        np.testing.assert_allclose(table[:1], rope_rows(case, np.full((3, 1), k + delta)), atol=2e-5)
        inputs["rope_rotary_cos_sin"] = rope_rows(case, np.full((3, 1), k))
    return hook


def deepstack_shifted(inputs: dict[str, np.ndarray]) -> None:
    """Every deepstack input's rows one token late (the ViT's rows scattered one row off)."""
    for name in [n for n in inputs if n.startswith("deepstack_embeds_")]:
        inputs[name] = np.roll(inputs[name], 1, axis=0)


def deepstack_swapped(inputs: dict[str, np.ndarray]) -> None:
    """The two deepstack features fed to each other's layer."""
    first, second = inputs["deepstack_embeds_0"], inputs["deepstack_embeds_1"]
    inputs["deepstack_embeds_0"], inputs["deepstack_embeds_1"] = second, first


def windows_merged(inputs: dict[str, np.ndarray]) -> None:
    """Qwen2.5-VL: ``cu_window_seqlens`` with each pair of windows merged (a window-size bug)."""
    cu = inputs["cu_window_seqlens"]
    inputs["cu_window_seqlens"] = np.concatenate([cu[:-1:2], cu[-1:]]).astype(np.int32)


def window_edges_early(inputs: dict[str, np.ndarray]) -> None:
    """Qwen2.5-VL: every inner ``cu_window_seqlens`` edge one merged token (4 patches) early."""
    cu = inputs["cu_window_seqlens"].copy()
    cu[1:-1] -= 4
    inputs["cu_window_seqlens"] = cu


def rotary_axes_swapped(inputs: dict[str, np.ndarray]) -> None:
    """The ViT's rotary table with its row and column halves swapped."""
    t = inputs["rotary_pos_emb"]
    half = t.shape[1] // 2
    inputs["rotary_pos_emb"] = np.concatenate([t[:, half:], t[:, :half]], axis=1)


def window_order_reversed(inputs: dict[str, np.ndarray]) -> None:
    """Qwen2.5-VL: ``reverse_window_index`` that does not undo ``window_index`` (the merged rows out of order)."""
    inputs["reverse_window_index"] = inputs["reverse_window_index"][::-1].copy()


def position_corners_swapped(inputs: dict[str, np.ndarray]) -> None:
    """Qwen3-VL: the bilinear weights of the learned position grid's top-left and bottom-right corners swapped."""
    w = inputs["fast_pos_embed_weight"].copy()
    w[[0, 3]] = w[[3, 0]]
    inputs["fast_pos_embed_weight"] = w
