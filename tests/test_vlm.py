"""The toy vision-language model (engines/toy-vlm-ragged, Edge-LLM's layout of a Qwen3-VL build) end to end:
images preprocessed, encoded by the ViT setup, spliced into prompts, prefilled with their deepstack features and
3-axis MRoPE positions, decoded from each sequence's position delta; batched and admitted at different steps,
with CUDA graphs on and off, on the host backend here and on the cuda backend with CuPy engines (``-m gpu``).

The ground truth recomputes each sequence from scratch with numpy (:func:`trtio.testing.toy_model.reference_forward`
over the spliced rows of :func:`trtio.testing.reference_visual.reference_vit`, each token rotated by the MRoPE row
of its 3-axis position), so a wrong splice, deepstack row or position shows in the logits and the tokens.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trtio
from trtio import ShapeError
from trtio._rope import mrope_cos_sin_rows
from trtio.testing import ReferenceEngine
from trtio.testing.reference_visual import reference_vit
from trtio.testing.toy_engines import VisionToyEngines
from trtio.testing.toy_model import reference_forward
from trtio.vision import VisionPrompt, expand_image_pads, mrope_positions, preprocess, splice

ROOT = Path(__file__).resolve().parents[1]
TOYS = VisionToyEngines.load()
CFG, VCFG = TOYS.config, TOYS.visual_config
TABLE = TOYS.embedding().astype(np.float16)


def open_vlm(device: str = "host", graphs: bool = False) -> trtio.LLMSetup:
    setup = trtio.create_for_llm(TOYS.reference_engine(device=device), CFG, graphs=graphs)
    setup.attach_visual(trtio.create_for_visual(TOYS.visual_engine(device=device), VCFG, graphs=graphs,
                                                backend=setup.io.backend))
    return setup


def picture(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([(xx * 3 + seed * 40) % 256, (yy * 2) % 256, (xx * yy) % 256], -1)
    return np.clip(base + rng.integers(-30, 31, (h, w, 3)), 0, 255).astype(np.uint8)


# (images, prompt ids with one pad per image between text)
REQUESTS = {
    "one image": ([picture(70, 100, 1)], [9, 10, 3, 5, 4, 11, 12, 13]),
    "two images": ([picture(64, 64, 2), picture(120, 50, 3)], [3, 5, 4, 20, 21, 3, 5, 4, 22, 23, 24]),
    "tall image": ([picture(200, 40, 4)], [30, 3, 5, 4, 31, 32]),
    "text": ([], [40, 41, 42, 43, 44, 45]),
}


def spliced(setup: trtio.LLMSetup, name: str) -> VisionPrompt:
    images, ids = REQUESTS[name]
    if not images:
        return splice(ids, None, VCFG, TABLE)
    assert setup.visual is not None
    patches, grid = preprocess(images, VCFG)
    return splice(ids, grid, VCFG, TABLE, setup.visual.encode(patches, grid))


def prefill(setup: trtio.LLMSetup, p: VisionPrompt, **kw: Any) -> np.ndarray:
    return setup.prefill(p.inputs_embeds, p.context_lengths, deepstack_embeds=list(p.deepstack_embeds) or None,
                         mrope_positions=p.mrope_positions, **kw).to_numpy()


# -- the ground truth ---------------------------------------------------------------------------------

def truth_prompt(name: str) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """(embeddings [L, H], deepstack [L, H] each, positions [3, L]) of a request, from the numpy ViT."""
    images, ids = REQUESTS[name]
    grid = preprocess(images, VCFG)[1] if images else np.zeros((0, 3), np.int64)
    expanded = expand_image_pads(ids, grid, VCFG)
    embeds = TABLE[expanded].astype(np.float32)
    deep = [np.zeros_like(embeds) for _ in range(3)]
    if images:
        patches, _ = preprocess(images, VCFG)
        rows, ds = reference_vit(VCFG, TOYS.vit_weights, patches, grid)
        at = expanded == VCFG.image_token_id
        embeds[at] = rows.astype(np.float16)
        for d, f in zip(deep, ds):
            d[at] = f.astype(np.float16)
    return embeds, deep, mrope_positions(expanded, grid, VCFG)[0]


def truth_logits(embeds: np.ndarray, deep: list[np.ndarray], positions: np.ndarray) -> np.ndarray:
    """Every token's logits, each token rotated by the MRoPE row of its position."""
    sc = CFG.rope_scaling
    assert sc is not None and sc.mrope_section is not None
    rows = mrope_cos_sin_rows(positions, CFG.rotary_dim, CFG.rope_theta, sc.mrope_section,
                              interleaved=sc.mrope_interleaved, scaling=sc)
    return reference_forward(TOYS.weights, CFG, embeds.astype(np.float16), positions=np.arange(embeds.shape[0]),
                             rope=rows, deepstack=[d.astype(np.float16) for d in deep])[1]


def truth_tokens(name: str, count: int) -> list[int]:
    """Greedy tokens recomputed from scratch each step: generated tokens are text at position k + delta."""
    embeds, deep, positions = truth_prompt(name)
    delta = int(positions.max()) + 1 - positions.shape[1]
    out: list[int] = []
    for _ in range(count):
        token = int(truth_logits(embeds, deep, positions)[-1].argmax())
        out.append(token)
        k = embeds.shape[0]
        embeds = np.concatenate([embeds, TABLE[token][None].astype(np.float32)])
        deep = [np.concatenate([d, np.zeros((1, d.shape[1]), np.float32)]) for d in deep]
        positions = np.concatenate([positions, np.full((3, 1), k + delta)], 1)
    return out


def alone(name: str, count: int, device: str = "host", graphs: bool = False) -> list[int]:
    with open_vlm(device, graphs) as setup:
        tokens = [int(prefill(setup, spliced(setup, name))[0].argmax())]
        while len(tokens) < count:
            tokens.append(int(setup.decode(TABLE[tokens[-1]][None, None]).to_numpy()[0].argmax()))
        return tokens


# -- tests --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_prefill_and_decodes_equal_the_ground_truth(name: str, device: str) -> None:
    assert alone(name, 6, device) == truth_tokens(name, 6)


def test_prefill_logits_equal_the_ground_truth_and_depend_on_every_part() -> None:
    with open_vlm() as setup:
        p = spliced(setup, "two images")
        got = prefill(setup, p)[0]
        embeds, deep, positions = truth_prompt("two images")
        want = truth_logits(embeds, deep, positions)[-1]
        np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)
        wrong = {
            "text positions": truth_logits(embeds, deep, np.tile(np.arange(positions.shape[1]), (3, 1)))[-1],
            "no deepstack": truth_logits(embeds, [np.zeros_like(d) for d in deep], positions)[-1],
            "no image rows": truth_logits(TABLE[p.token_ids[0]].astype(np.float32), deep, positions)[-1],
        }
        for what, logits in wrong.items():
            assert np.abs(logits - got).max() > 0.1, f"{what} gives the same logits: the test could not tell"
        other = spliced(setup, "one image")
        assert other.inputs_embeds.shape[1] != p.inputs_embeds.shape[1] or \
            not np.array_equal(other.inputs_embeds, p.inputs_embeds)


@pytest.mark.parametrize("graphs", [False, True])
def test_batched_sequences_admitted_at_different_steps_generate_their_tokens_alone(graphs: bool,
                                                                                  device: str) -> None:
    """Two sequences with different images, the second admitted three steps after the first into another slot
    (and a text one after the first has left, into its slot): each gets the tokens it gets alone."""
    count = 8
    want = {name: alone(name, count, device, graphs) for name in ("one image", "two images", "text")}
    assert want["one image"] != want["two images"]
    with open_vlm(device, graphs) as setup:
        got: dict[str, list[int]] = {}
        slots: dict[str, int] = {}
        schedule = {0: ("one image", 0), 3: ("two images", 2)}
        step = 0
        while step < 20 and (slots or step <= 3 or "text" not in got):
            if step in schedule:
                name, slot = schedule[step]
                got[name] = [int(prefill(setup, spliced(setup, name), slots=[slot])[0].argmax())]
                slots[name] = slot
            if "one image" in slots and len(got["one image"]) == count:
                setup.release([slots.pop("one image")])
                got["text"] = [int(prefill(setup, spliced(setup, "text"), slots=[0])[0].argmax())]
                slots["text"] = 0  # the slot the image sequence left: its rows are text rows again
            for name in [n for n in slots if len(got[n]) == count]:
                setup.release([slots.pop(name)])
            if slots:
                order = sorted(slots, key=slots.__getitem__)
                x = np.stack([TABLE[got[n][-1]] for n in order])[:, None]
                rows = setup.decode(x).to_numpy()
                for row, n in zip(rows, order):
                    got[n].append(int(row.argmax()))
            step += 1
        assert got == want
        if graphs:
            assert setup.graph_stats.hits > 0 and setup.visual is not None


def test_a_batch_prefilled_together_equals_each_alone() -> None:
    names = ["two images", "one image", "tall image"]
    with open_vlm() as setup:
        batch = VisionPrompt.stack([spliced(setup, n) for n in names])
        logits = setup.prefill(batch.inputs_embeds, batch.context_lengths,
                               deepstack_embeds=list(batch.deepstack_embeds),
                               mrope_positions=batch.mrope_positions).to_numpy()
        assert setup.rope_deltas.tolist() == batch.rope_deltas.tolist()
        assert batch.rope_deltas[0] < 0 and batch.rope_deltas[2] == 0, "a tall image's tokens take one position each"
    for name, row in zip(names, logits):
        with open_vlm() as setup:
            np.testing.assert_allclose(row, prefill(setup, spliced(setup, name))[0], atol=1e-3)


def test_a_chunked_prompt_continues_with_its_positions() -> None:
    """A long prompt prefilled in two chunks (past_lengths), each with its own absolute positions, and a
    continuation without positions (text from the delta on) give the single prefill's logits."""
    with open_vlm() as setup:
        p = spliced(setup, "two images")
        n = int(p.context_lengths[0])
        one = prefill(setup, p)[0]
        then = setup.decode(TABLE[7][None, None]).to_numpy()[0]
        setup.reset()
        cut = n - 9
        args = {"deepstack_embeds": [d[:, :cut] for d in p.deepstack_embeds],
                "mrope_positions": p.mrope_positions[:, :, :cut]}
        setup.prefill(p.inputs_embeds[:, :cut], [cut], **args)
        rest = {"deepstack_embeds": [d[:, cut:] for d in p.deepstack_embeds],
                "mrope_positions": p.mrope_positions[:, :, cut:]}
        two = setup.prefill(p.inputs_embeds[:, cut:], [n - cut], past_lengths=[cut], **rest).to_numpy()[0]
        np.testing.assert_allclose(two, one, atol=1e-3)
        assert setup.rope_deltas.tolist() == p.rope_deltas.tolist()
        np.testing.assert_allclose(setup.decode(TABLE[7][None, None]).to_numpy()[0], then, atol=1e-3)


def test_a_sequence_continued_from_a_pinned_image_prefix_goes_on_from_its_delta() -> None:
    """An image prompt (21 tokens, delta -12) pinned whole, or cut in its text after or before the image, and continued
    by text in another slot: the continuation's positions go on from the delta at the cut (Hugging Face's cache
    position + ``rope_deltas``), so its logits and its next decode equal the same tokens prefilled whole. The prefix
    keeps what it needs after its slot is reused, and a prefix pinned from a continued sequence, cut before the image,
    goes on at delta 0."""
    images, ids, more = [picture(128, 128, 5)], [9, 10, 3, 5, 4, 11], [50, 51, 52, 53, 54]
    with open_vlm() as setup, open_vlm() as whole:
        assert setup.visual is not None
        patches, grid = preprocess(images, VCFG)
        encoded = setup.visual.encode(patches, grid)
        p = splice(ids, grid, VCFG, TABLE, encoded)
        n, delta = int(p.context_lengths[0]), int(p.rope_deltas[0])
        assert (n, delta) == (21, -12)
        expanded = p.token_ids[0].tolist()

        def go_on(prefix: trtio.Prefix, slot: int, rest: list[int], same: list[int]) -> None:
            """Continue ``prefix`` by ``rest`` in ``slot`` and decode once: as ``same`` (the prompt ids, one pad per
            image) prefilled whole and decoded."""
            image = VCFG.image_token_id in same
            q = splice(same, grid if image else None, VCFG, TABLE, encoded if image else None)
            assert q.token_ids[0].tolist() == expanded[:prefix.tokens] + rest
            want = prefill(whole, q)[0]
            want_then = whole.decode(TABLE[7][None, None]).to_numpy()[0]
            assert prefix.rope_delta == int(q.rope_deltas[0])
            got = setup.prefill(TABLE[rest][None], [len(rest)], slots=[slot], prefix=prefix).to_numpy()[0]
            then = setup.decode(TABLE[7][None, None], slots=[slot]).to_numpy()[0]
            np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3, err_msg=f"after {prefix.tokens}")
            np.testing.assert_allclose(then, want_then, atol=2e-3, rtol=2e-3, err_msg=f"after {prefix.tokens}, decode")
            assert setup.rope_deltas[setup.active.tolist().index(slot)] == int(q.rope_deltas[0])

        prefill(setup, p, slots=[0])
        for cut, slot, same in ((n, 1, ids + more), (n - 1, 2, ids + more), (2, 3, ids[:2] + more)):
            with setup.pin_prefix(0, cut) as prefix:
                go_on(prefix, slot, (expanded + more)[cut:] if cut > 2 else more, same)
                assert prefix.rope_delta == (delta if cut > 2 else 0)
            setup.release([slot])
        with setup.pin_prefix(0, n) as pinned:
            setup.release([0])
            setup.prefill(TABLE[more][None], [5], slots=[0])  # the slot the prefix came from, reused by text
            go_on(pinned, 1, more, ids + more)
        with setup.pin_prefix(1, 2) as early:  # a prefix of the continued sequence, cut before its image
            go_on(early, 2, more, ids[:2] + more)


def test_a_text_sequence_after_a_prefix_continuation_in_an_image_slot_gets_text_positions() -> None:
    """A sequence started from a text prefix in a slot an image prompt used rewrites the rows after the prefix only;
    the image's rows below stay until a text sequence admitted there later gets the plain rows back."""
    with open_vlm() as setup:
        prefill(setup, spliced(setup, "text"), slots=[0])
        with setup.pin_prefix(0, 4) as head:
            prefill(setup, spliced(setup, "two images"), slots=[1])  # its first image's rows from row 1 on
            setup.release([1])
            setup.prefill(TABLE[[7, 8]][None], [2], slots=[1], prefix=head)
        setup.release([1])
        text = spliced(setup, "text")
        got = setup.prefill(text.inputs_embeds, text.context_lengths, slots=[1]).to_numpy()[0]
        embeds, deep, positions = truth_prompt("text")
        np.testing.assert_allclose(got, truth_logits(embeds, deep, positions)[-1], atol=2e-2)
        assert setup.rope_deltas.tolist() == [0, 0]


def test_a_sequence_after_a_vlm_sequence_in_its_slot_gets_text_positions() -> None:
    with open_vlm() as setup:
        prefill(setup, spliced(setup, "two images"), slots=[1])
        assert setup.rope_deltas.tolist() == [int(spliced(setup, "two images").rope_deltas[0])] != [0]
        setup.release([1])
        text = spliced(setup, "text")
        got = setup.prefill(text.inputs_embeds, text.context_lengths, slots=[1]).to_numpy()[0]
        embeds, deep, positions = truth_prompt("text")
        np.testing.assert_allclose(got, truth_logits(embeds, deep, positions)[-1], atol=2e-2)
        assert setup.rope_deltas.tolist() == [0]


def test_an_mrope_model_without_rope_gets_the_identity_rows_for_its_images_too() -> None:
    """``use_rope`` false on an MRoPE model: every row of every slot's table is cos 1, sin 0 (the prompt's 3-axis rows,
    its text rows from the delta and the text table alike), and the logits are those of attention without rotation,
    which differ from the rotated ones."""
    cfg = dataclasses.replace(CFG, use_rope=False)
    embeds, deep, positions = truth_prompt("two images")
    n = embeds.shape[0]
    with trtio.create_for_llm(ReferenceEngine.from_config(cfg, weights=TOYS.weights), cfg) as setup:
        got = setup.prefill(embeds[None].astype(np.float16), [n], slots=[1], mrope_positions=positions[:, None],
                            deepstack_embeds=[d[None].astype(np.float16) for d in deep]).to_numpy()[0]
        assert setup.rope_deltas.tolist() == [int(positions.max()) + 1 - n] != [0]
        table = setup.io.mrope_cos_sin.to_numpy()
    half = cfg.rotary_dim // 2
    np.testing.assert_array_equal(table[..., :half], 1.0)
    np.testing.assert_array_equal(table[..., half:], 0.0)
    plain = reference_forward(TOYS.weights, cfg, embeds.astype(np.float16),
                              deepstack=[d.astype(np.float16) for d in deep])[1][-1]
    np.testing.assert_allclose(got, plain, atol=2e-2, rtol=2e-2)
    assert np.abs(truth_logits(embeds, deep, positions)[-1] - plain).max() > 0.1, "rotation changes the logits"


def test_mrope_positions_are_checked_before_any_work() -> None:
    with open_vlm() as setup:
        p = spliced(setup, "one image")
        calls = dict(setup.executor.context.calls)
        for bad, why in [(p.mrope_positions[:, :, :-1], r"mrope_positions: expected integer positions \[3, batch=1"),
                         (p.mrope_positions.astype(np.float32), "mrope_positions: expected integer"),
                         (-p.mrope_positions - 1, "a negative position")]:
            with pytest.raises(ShapeError, match=why):
                setup.prefill(p.inputs_embeds, p.context_lengths, mrope_positions=bad)
        assert setup.executor.context.calls == calls and setup.batch is None
    text_llm = VisionToyEngines.load()
    from trtio.testing.toy_engines import RaggedToyEngines

    ragged = RaggedToyEngines.load()
    with trtio.create_for_llm(ragged.reference_engine("toy-llm-ragged", device="host"), ragged.llm_config) as plain:
        with pytest.raises(ShapeError, match="mrope_positions: given, but the engine.s RoPE is not MRoPE"):
            plain.prefill(np.zeros((1, 4, 64), np.float16), [4], mrope_positions=np.zeros((3, 1, 4), np.int64))
    assert text_llm.config.is_mrope


def test_a_continued_prefill_that_fails_after_writing_its_rows_breaks_the_setup(monkeypatch: Any) -> None:
    with open_vlm() as setup:
        p = spliced(setup, "one image")
        n = int(p.context_lengths[0])
        setup.prefill(p.inputs_embeds[:, :5], [5], mrope_positions=p.mrope_positions[:, :, :5],
                      deepstack_embeds=[d[:, :5] for d in p.deepstack_embeds])
        monkeypatch.setattr(setup.executor.context, "execute_async_v3", lambda stream: False)
        with pytest.raises(trtio.EngineError):
            setup.prefill(p.inputs_embeds[:, 5:], [n - 5], past_lengths=[5],
                          mrope_positions=p.mrope_positions[:, :, 5:],
                          deepstack_embeds=[d[:, 5:] for d in p.deepstack_embeds])
        assert setup.is_broken
        with pytest.raises(trtio.TrtioError, match="is broken: a prefill that continued sequences with new MRoPE"):
            setup.decode(TABLE[3][None, None])
        monkeypatch.undo()
        setup.reset()
        assert not setup.is_broken
        # A new sequence's failed prefill breaks nothing: its slot is free again, and its next owner gets text rows.
        monkeypatch.setattr(setup.executor.context, "execute_async_v3", lambda stream: False)
        with pytest.raises(trtio.EngineError):
            prefill(setup, p, slots=[2])
        monkeypatch.undo()
        assert not setup.is_broken and setup.batch is None
        text = spliced(setup, "text")
        got = setup.prefill(text.inputs_embeds, text.context_lengths, slots=[2]).to_numpy()[0]
        embeds, deep, positions = truth_prompt("text")
        np.testing.assert_allclose(got, truth_logits(embeds, deep, positions)[-1], atol=2e-2)


def test_the_memory_report_holds_the_position_rows_ring() -> None:
    with open_vlm() as setup:
        report = setup.memory_report()
        ring = report.entry("host_mrope_rows")
        assert ring.location == "pinned" and ring.shape == (4, CFG.max_supported_input_length, CFG.rotary_dim)
        assert report.entry("mrope_cos_sin").shape == (CFG.max_supported_batch_size, CFG.max_kv_cache_capacity,
                                                       CFG.rotary_dim)


def test_create_from_engine_dir_attaches_the_vision_encoder(monkeypatch: Any) -> None:
    from trtio._setups import engine_dir

    monkeypatch.setattr(engine_dir, "load_engine", TOYS.loader(device="host"))
    setup = trtio.create_from_engine_dir(TOYS.directory.path, graphs=True, backend="host")
    with setup:
        assert isinstance(setup, trtio.LLMSetup) and isinstance(setup.visual, trtio.VisualSetup)
        assert setup.visual.cfg == VCFG and setup.visual.executor.graphs_enabled
        tokens = [int(prefill(setup, spliced(setup, "one image"))[0].argmax())]
        assert tokens == alone("one image", 1)
        visual = setup.visual
    assert visual.is_closed, "the encoder is closed with the LLM's setup"


def test_generate_with_images_prints_the_models_tokens(tmp_path: Path, capsys: Any) -> None:
    """``trtio generate DIR --image A --image B --prompt ...`` from the source tree: the prompt, then the greedy
    tokens of the prompt with both images before its text."""
    tokenizers = pytest.importorskip("tokenizers")
    pil = pytest.importorskip("PIL.Image")
    from trtio._cli import main

    first, second = picture(70, 100, 1), picture(64, 64, 2)
    np.save(tmp_path / "a.npy", first)
    pil.fromarray(second).save(tmp_path / "b.png")
    prompt = "Describe the pictures."
    tok = tokenizers.Tokenizer.from_file(str(TOYS.directory.path / "tokenizer.json"))
    ids = [3, 5, 4, 3, 5, 4] + tok.encode(prompt).ids
    REQUESTS["cli"] = ([first, second], ids)
    try:
        want = alone("cli", 6)
    finally:
        del REQUESTS["cli"]
    rc = main(["generate", str(TOYS.directory.path), "--image", str(tmp_path / "a.npy"), "--image",
               str(tmp_path / "b.png"), "--prompt", prompt, "--max-new-tokens", "6", "--backend", "host"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out == prompt + tok.decode(want) + "\n"
    assert "6 tokens in" in err


def test_generate_refuses_an_image_for_a_text_model(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("tokenizers")
    from trtio._cli import main

    np.save(tmp_path / "a.npy", picture(40, 40, 0))
    rc = main(["generate", str(ROOT / "engines" / "toy-llm-ragged"), "--image", str(tmp_path / "a.npy"), "--prompt",
               "Hello"])
    err = capsys.readouterr().err
    assert rc == 1 and "--image: " in err and "has no vision encoder" in err


def test_the_vision_example_serves_the_requests_their_own_tokens(tmp_path: Path) -> None:
    """examples/vision.py (a subprocess, the host backend): each request's tokens are its tokens alone."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import vision as example
    finally:
        sys.path.remove(str(ROOT / "examples"))
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "vision.py"), "--max-new-tokens", "6",
                           "--backend", "host"], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    rows = [line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("tokens ")]
    images = example.synthetic_images()
    for i, question in enumerate(example.QUESTIONS):
        REQUESTS["example"] = ([images[i]], example.prompt_ids(TOYS.directory.path, question, VCFG))
        try:
            want = alone("example", 6)
        finally:
            del REQUESTS["example"]
        assert rows[i] == str(want[:next((j + 1 for j, t in enumerate(want) if t == 2), len(want))])
