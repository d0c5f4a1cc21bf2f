"""Real-graph parity of a speech model (DESIGN §17): the exporter's ``audio/`` and ``llm/`` graphs of a tiny Qwen3-ASR,
driven by trtio (:func:`trtio.audio.preprocess`, :meth:`AudioSetup.encode
<trtio.components.audio.audio_setup.AudioSetup.encode>`, :func:`trtio.audio.splice`, the LLM setup's prefill and
decode),
held to Hugging Face's fp32 feature extractor, audio tower and full Qwen3-ASR forward on the same clips and tokens
(``scripts/parity_cases/audio.py`` wrote the references).

The scenarios: ``encoder`` (each clip preprocessed and encoded alone, against Hugging Face's features and audio
tower: the 2.5 s clip spans two attention windows, the 0.3 s one is shorter than the extractor's ``min_length``),
``asr`` (text + a clip + text, then decodes), ``batch`` (three prompts with a clip each and a text-only prompt
prefilled together with explicit MRoPE positions, then decoded together) and ``admission`` (a prompt with a clip
admitted into the slot a text prompt left while another decodes). The planted bugs rewrite one runtime input as a
trtio bug would: the mel a frame late, attention windows of the wrong size, a chunk's rows one off, the audio rows
spliced one token late, and positions that count the audio as one token.
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
from trtio.audio import AudioPrompt, preprocess, splice
from trtio.components.audio import AudioConfig, create_for_audio

Hook = Callable[[dict[str, np.ndarray]], None]

# The fp16 encoder against HF's fp32 audio tower: max |Δ| over the rows over max(1, their std) (measured: 0.0041 at
# std 1.50 for the 2.5 s clip; the planted encoder input bugs move it by 0.19-1.6).
ENCODER_TOLERANCE = 0.01
# trtio's log-mel (float64 rounded to float32) against HF's (torch float32): measured 3e-5 at most.
FEATURE_TOLERANCE = 1e-4


@dataclass
class Asr:
    """One scenario's setups: the case, the LLM setup, the audio setup and its config, the embedding table."""

    case: Case
    llm: Any
    audio: Any
    cfg: AudioConfig
    table: np.ndarray

    def clip(self, i: int) -> np.ndarray:
        """Clip ``i`` as float samples (the int16 PCM over 32768, what Hugging Face was given)."""
        return self.case.arrays[f"clip_{i}"].astype(np.float32) / np.float32(32768.0)

    def prompt(self, seq: Seq) -> AudioPrompt:
        """``seq``'s prompt ids spliced with its clip, preprocessed and encoded (one encode per clip)."""
        which = self.case.meta["sequences"][seq.index]["clips"]
        ids = self.case.arrays[f"prompt_ids_{seq.index}"]
        rate = self.case.meta["sample_rate"]
        rows = [self.audio.encode(preprocess(self.clip(i), rate, self.cfg)).to_numpy() for i in which]
        p = splice(ids, self.cfg, self.table, rows)
        # the splice expands each pad into the clip's rows exactly as Hugging Face's processor did
        np.testing.assert_array_equal(p.token_ids[0], seq.prompt)
        return p


def audio_config(case: Case, engine: Any) -> AudioConfig:
    """The engine's ``config.json`` (with the builder's caps) and the feature extractor's config beside it."""
    preprocessor = json.loads((case.root / "audio" / "preprocessor_config.json").read_text())
    return AudioConfig.from_edgellm(engine.config, preprocessor=preprocessor, what=f"{case.name}/audio/config.json")


@contextlib.contextmanager
def asr(case: Case, backend: str = "host", graphs: bool = False, hook: Hook | None = None,
        audio_hook: Hook | None = None) -> Iterator[Asr]:
    engine = case.engine("audio", backend)
    engine.input_hook = audio_hook
    cfg = audio_config(case, engine)
    with llm_setup(case, backend, graphs, hook) as llm, \
            create_for_audio(engine, cfg, backend=backend, graphs=graphs) as audio:
        yield Asr(case, llm, audio, cfg, case.table())


# -- the scenarios --------------------------------------------------------------------------------------------------


def encoder(a: Asr, cmp: Compare) -> None:
    """Each clip preprocessed and encoded alone: the log-mel equals Hugging Face's feature extractor's (frames and
    values), the rows its audio tower's."""
    arrays = a.case.arrays
    for i, tokens in enumerate(a.case.meta["audio_tokens"]):
        f = preprocess(a.clip(i), a.case.meta["sample_rate"], a.cfg)
        assert f.frames == int(arrays[f"audio_frames_{i}"]) and f.tokens == tokens
        np.testing.assert_allclose(f.input_features, arrays[f"audio_features_{i}"], rtol=0, atol=FEATURE_TOLERANCE)
        got = a.audio.encode(f).to_numpy().astype(np.float32)
        want = arrays[f"audio_embeds_{i}"]
        delta = float(np.abs(got - want).max()) / max(1.0, float(want.std()))
        cmp.worst = max(cmp.worst, delta)
        cmp.rows += want.shape[0]
        if not delta <= ENCODER_TOLERANCE:
            raise ParityMismatch(f"clip {i} encoder rows: max |Δ| / std {delta:.4f} > {ENCODER_TOLERANCE}")


def _prefill(a: Asr, p: AudioPrompt, explicit: bool = False, **kwargs: Any) -> np.ndarray:
    positions = {"mrope_positions": p.mrope_positions} if explicit else {}
    logits: np.ndarray = a.llm.prefill(p.inputs_embeds, p.context_lengths, **positions, **kwargs).to_numpy()
    return logits


def alone(a: Asr, cmp: Compare) -> None:
    """The ``asr`` prompt (text, the 2.5 s clip, text) prefilled alone, then decoded: each row equals HF's."""
    (s,) = a.case.of("asr")
    logits = _prefill(a, a.prompt(s))
    cmp.row(s, s.prompt_length - 1, logits[0], "prefill")
    cmp.token(s, s.prompt_length - 1, int(logits[0].argmax()), "prefill")
    decode_all(a.llm, a.table, [s], cmp, [s.prompt_length - 1], a.case.meta["continuation"] - 1)


def batch(a: Asr, cmp: Compare) -> None:
    """Three prompts with a clip each and a text-only prompt prefilled together, with explicit MRoPE positions
    (sequential on all three axes), then decoded together."""
    seqs = [a.case.of(p)[0] for p in ("asr", "short", "tiny", "text")]
    logits = _prefill(a, AudioPrompt.stack([a.prompt(s) for s in seqs]), explicit=True)
    for i, s in enumerate(seqs):
        cmp.row(s, s.prompt_length - 1, logits[i], "batch prefill")
        cmp.token(s, s.prompt_length - 1, int(logits[i].argmax()), "batch prefill")
    decode_all(a.llm, a.table, seqs, cmp, [s.prompt_length - 1 for s in seqs], a.case.meta["continuation"] - 1)


def admission(a: Asr, cmp: Compare) -> None:
    """The ``short`` prompt and the text prompt decode; the text one is released and the ``tiny`` prompt (a clip
    under ``min_length``) is admitted into its slot while the first goes on decoding."""
    first, second, new = (a.case.of(p)[0] for p in ("short", "text", "tiny"))
    logits = _prefill(a, AudioPrompt.stack([a.prompt(first), a.prompt(second)]))
    rows = [first.prompt_length - 1, second.prompt_length - 1]
    for i, s in enumerate((first, second)):
        cmp.row(s, rows[i], logits[i], "prefill")
    decode_all(a.llm, a.table, [first, second], cmp, rows, 2)
    a.llm.release([1])
    logits = _prefill(a, a.prompt(new), slots=[1])
    cmp.row(new, new.prompt_length - 1, logits[0], "admitted")
    cmp.token(new, new.prompt_length - 1, int(logits[0].argmax()), "admitted")
    decode_all(a.llm, a.table, [first, new], cmp, [rows[0], new.prompt_length - 1], 3, slots=[0, 1])


SCENARIOS: dict[str, Callable[[Asr, Compare], None]] = {
    "encoder": encoder, "asr": alone, "batch": batch, "admission": admission,
}


def run(case: Case, scenario: str, backend: str = "host", graphs: bool = False, hook: Hook | None = None,
        audio_hook: Hook | None = None) -> Compare:
    cmp = Compare()
    with asr(case, backend, graphs, hook, audio_hook) as a:
        SCENARIOS[scenario](a, cmp)
    return cmp


def planted(case: Case, scenario: str, hook: Hook | None = None, audio_hook: Hook | None = None) -> str:
    """Run ``scenario`` with a planted input bug; how the parity check failed (AssertionError if it passed)."""
    try:
        run(case, scenario, hook=hook, audio_hook=audio_hook)
    except ParityMismatch as exc:
        return f"mismatch: {exc}"
    except trtio.errors.InvalidValueError as exc:
        return f"refused: {exc}"
    raise AssertionError(f"{case.name}/{scenario}: the planted bug passed the parity check")


# -- planted bugs: the encoder's inputs ------------------------------------------------------------------------------


def mel_frame_late(inputs: dict[str, np.ndarray]) -> None:
    """The log-mel one frame late (a framing bug: a frame of silence first, the last frame lost), chunk boundaries
    kept."""
    x = inputs["padded_feature"]
    chunks, mel, width = x.shape
    flat = x.transpose(1, 0, 2).reshape(mel, chunks * width)
    late = np.concatenate([np.zeros((mel, 1), x.dtype), flat[:, :-1]], axis=1)
    inputs["padded_feature"] = np.ascontiguousarray(late.reshape(mel, chunks, width).transpose(1, 0, 2))


def _mask(windows: list[int], n: int) -> np.ndarray:
    mask = np.full((n, n), np.float16(-65504.0), np.float16)
    start = 0
    for w in windows:
        mask[start:start + w, start:start + w] = 0
        start += w
    return mask


def windows_of_one_chunk(inputs: dict[str, np.ndarray]) -> None:
    """Attention windows of one chunk's rows (13) instead of ``n_window_infer``'s two chunks (26)."""
    n = inputs["attention_mask"].shape[0]
    inputs["attention_mask"] = _mask([13] * (n // 13) + ([n % 13] if n % 13 else []), n)


def one_window(inputs: dict[str, np.ndarray]) -> None:
    """One attention window over the whole clip (``n_window_infer`` ignored)."""
    n = inputs["attention_mask"].shape[0]
    inputs["attention_mask"] = _mask([n], n)


def tail_rows_shifted(inputs: dict[str, np.ndarray]) -> None:
    """The last chunk's kept rows counted from its second row (a wrong tail length after the convolutions)."""
    idx = inputs["padded_mask_after_cnn_indices"].copy()
    last = idx[:, 0] == idx[-1, 0]
    idx[last, 1] += 1
    inputs["padded_mask_after_cnn_indices"] = idx


# -- planted bugs: the LLM's inputs ----------------------------------------------------------------------------------


def _audio_span(case: Case, purpose: str) -> tuple[Seq, int, int]:
    """``purpose``'s sequence and where its audio rows start and stop in the expanded prompt."""
    (s,) = case.of(purpose)
    pad = int(json.loads((case.root / "llm" / "config.json").read_text())["audio_token_id"])
    pads = np.flatnonzero(s.prompt == pad)
    return s, int(pads[0]), int(pads[-1]) + 1


def rows_spliced_late(case: Case) -> Hook:
    """The ``asr`` prompt's audio rows written one token late (over ``<|audio_end|>``; the first pad keeps the pad's
    own embedding), as a splice off by one writes them."""
    s, start, stop = _audio_span(case, "asr")
    table = case.table()

    def hook(inputs: dict[str, np.ndarray]) -> None:
        if inputs["execution_phase_marker"].shape[0] != 1:
            return
        x = inputs["inputs_embeds"].copy()
        x[start + 1:stop + 1] = inputs["inputs_embeds"][start:stop]
        x[start] = table[s.prompt[start]]
        inputs["inputs_embeds"] = x
    return hook


def rope_rows(case: Case, positions: np.ndarray) -> np.ndarray:
    """float32 ``[T, D]`` rows ``[cos | sin]`` of 1-D ``positions`` (Hugging Face's Qwen3 RoPE: the same position on
    the three MRoPE axes is the plain table), written here apart from trtio's ``rope.py``."""
    llm = json.loads((case.root / "llm" / "config.json").read_text())
    dim = int(llm["head_dim"])
    inv = 1.0 / (float(llm["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    angles = positions[:, None].astype(np.float64) * inv
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


def audio_as_one_position(case: Case) -> Hook:
    """The ``asr`` prompt's positions as if its clip took one position (the text after it ``N - 1`` positions early,
    an image-like position delta applied to audio); the hook first checks trtio's rows are the sequential ones."""
    s, start, stop = _audio_span(case, "asr")
    n = s.prompt_length

    def hook(inputs: dict[str, np.ndarray]) -> None:
        if inputs["execution_phase_marker"].shape[0] != 1:
            return
        table = inputs["rope_rotary_cos_sin"]
        np.testing.assert_allclose(table[:n], rope_rows(case, np.arange(n)), atol=2e-5)
        wrong = np.arange(n)
        wrong[start:stop] = start
        wrong[stop:] -= stop - start - 1
        inputs["rope_rotary_cos_sin"] = table.copy()
        inputs["rope_rotary_cos_sin"][:n] = rope_rows(case, wrong)
    return hook
