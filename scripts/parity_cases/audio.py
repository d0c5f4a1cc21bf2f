"""Speech in: Qwen3-ASR (an audio encoder of three stride-2 convolutions and windowed attention, and a dense Qwen3 LLM
whose prompt carries the encoder's rows). The case is a pair: the exporter's ``audio/`` and ``llm/`` graphs.

The checkpoint: transformers 5.14's ``Qwen3ASRForConditionalGeneration`` (tiny, seeded, weights rounded to float16)
is Hugging Face's truth; the exporter reads the hub's layout, which transformers 5.14 no longer writes (it writes a
flat ``model.audio_tower`` / ``model.multi_modal_projector`` / ``model.language_model`` checkpoint, which the
exporter's audio loader does not match). So the same weights are written twice: ``hf/`` as transformers saves them
(the reference loads it), and the root in the hub's layout for the exporter: root ``model_type`` ``qwen3_asr`` with
everything under ``thinker_config`` (``audio_config``, ``text_config`` with the hub's ``rope_scaling`` ``{mrope_section,
interleaved, mrope_interleaved}``, the audio token ids), weights ``thinker.audio_tower.*`` (the projector as
``thinker.audio_tower.proj1`` / ``proj2``), ``thinker.model.*`` and ``thinker.lm_head.weight``. The checkpoint's feature
extractor (``Qwen3ASRFeatureExtractor``, ``preprocessor_config.json``) is copied into ``audio/`` as Edge-LLM's builder
copies it (``runtime_artifacts.py``).

``n_window_infer`` is 200 (windows of two chunks: 26 rows), so the 2.5 s clip's 33 rows span two attention windows
(26 + 7) and a wrong window shows; the 0.3 s clip is shorter than the extractor's ``min_length`` (0.5 s: zero-padded,
7 rows).

The reference (``asr_reference``) holds, besides the usual rows of logits: each clip (int16 PCM at 16 kHz, fed to
Hugging Face as ``pcm / 32768``), Hugging Face's features of it (``input_features``, and the mask's sum) and its audio
tower's rows (``get_audio_features(...).pooler_output``: encoder and projector, what the exported graph computes), in
fp32, and the tower's own bookkeeping (``get_audio_cu_seqlens``: its attention windows; the conv rows it keeps, as
``chunk * 13 + row``); for each prompt its token ids with one ``<|audio_pad|>`` (``prompt_ids_i``) and expanded to the
clip's rows, as Hugging Face's processor writes them (``tokens_i``, then the greedy continuation); the logits are
Hugging Face's full forward (``input_ids``, ``input_features``, ``input_features_mask``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from make_parity_fixtures import (
    CONTINUATION,
    GAP,
    Case,
    Role,
    Sequence,
    export,
    gap,
    greedy_continuation,
    seeded_model,
    stored_positions,
)

AUDIO_PAD, AUDIO_START, AUDIO_END, USER, EOS = 500, 501, 502, 503, 504
TEXT_TOKENS = (1, 490)  # text tokens are drawn from here (the audio markers sit above)
LLM_BUILDER = {"max_batch_size": 4, "max_input_len": 64, "max_kv_cache_capacity": 256}
AUDIO_BUILDER = {"min_time_steps": 100, "max_time_steps": 600}
RATE = 16000
CLIP_SECONDS = (2.5, 1.3, 0.3)  # two attention windows; one chunk and a tail; under min_length


@dataclass(frozen=True)
class Prompt:
    """A prompt's layout: ``parts`` are text runs (an int: that many drawn tokens) and a clip (``"A"``, ``"B"``,
    ``"C"``: audio start, the audio pad, audio end)."""

    purpose: str
    parts: tuple[int | str, ...]


PROMPTS = (
    Prompt("asr", (4, "A", 3)),
    Prompt("short", (2, "B", 5)),
    Prompt("tiny", (6, "C", 2)),
    Prompt("text", (9,)),
)
CLIP_NAMES = ("A", "B", "C")


def _configs() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    rope = {"rope_type": "default", "mrope_section": [6, 5, 5], "interleaved": True, "mrope_interleaved": True}
    text = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, rope_theta=10000.0,
                initializer_range=0.2, tie_word_embeddings=False, eos_token_id=EOS)
    audio = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, d_model=64,
                 output_dim=128, downsample_hidden_size=32, n_window=50, n_window_infer=200, initializer_range=0.1)
    return text, audio, rope


def qwen3_asr(folder: Path, seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration
    from transformers.models.qwen3_asr.feature_extraction_qwen3_asr import Qwen3ASRFeatureExtractor

    text, audio, rope = _configs()
    config = Qwen3ASRConfig(audio_config=audio, text_config=text, audio_token_id=AUDIO_PAD, eos_token_id=EOS,
                            pad_token_id=EOS, tie_word_embeddings=False, initializer_range=0.2)
    model = seeded_model(Qwen3ASRForConditionalGeneration, config, seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(folder / "hf")
    model.to(torch.float32)
    hub = {}
    for key, value in model.state_dict().items():
        head, _, rest = key.partition(".")
        if key.startswith("model.audio_tower."):
            name = "thinker.audio_tower." + key[len("model.audio_tower."):]
        elif key.startswith("model.multi_modal_projector.linear_"):
            layer, _, param = key[len("model.multi_modal_projector.linear_"):].partition(".")
            name = f"thinker.audio_tower.proj{layer}.{param}"
        elif key.startswith("model.language_model."):
            name = "thinker.model." + key[len("model.language_model."):]
        elif key == "lm_head.weight":
            name = "thinker.lm_head.weight"
        else:
            raise KeyError(f"{key}: no place in the hub's Qwen3-ASR layout")
        hub[name] = value.to(torch.float16).contiguous()
    save_file(hub, str(folder / "model.safetensors"), metadata={"format": "pt"})
    audio_config = dict(audio, model_type="qwen3_asr_audio_encoder", max_source_positions=1500,
                        activation_function="gelu", scale_embedding=False, conv_chunksize=500)
    text_config = dict(text, model_type="qwen3", rope_scaling=rope, rms_norm_eps=1e-6, hidden_act="silu")
    root = {"model_type": "qwen3_asr", "architectures": ["Qwen3ASRForConditionalGeneration"],
            "thinker_config": {"model_type": "qwen3_asr_thinker", "audio_config": audio_config,
                               "text_config": text_config, "audio_token_id": AUDIO_PAD,
                               "audio_start_token_id": AUDIO_START, "audio_end_token_id": AUDIO_END,
                               "user_token_id": USER, "initializer_range": 0.2},
            "eos_token_id": EOS, "tie_word_embeddings": False, "torch_dtype": "float16"}
    (folder / "config.json").write_text(json.dumps(root, indent=2) + "\n")
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    Qwen3ASRFeatureExtractor().save_pretrained(folder)


def export_asr(checkpoint: Path, out: Path) -> None:
    """The exporter on the hub layout; the feature extractor's config copied into ``audio/`` as the builder does."""
    export(checkpoint, out, ())
    shutil.copy2(checkpoint / "preprocessor_config.json", out / "audio" / "preprocessor_config.json")


# -- the reference -------------------------------------------------------------------------------------------------


def _clips(case: Case) -> list[np.ndarray]:
    """The case's clips: int16 PCM at 16 kHz, a few sines whose loudness drifts, over noise (seeded)."""
    rng = np.random.default_rng(case.seed * 1000 + 999)
    out = []
    for seconds in CLIP_SECONDS:
        t = np.arange(int(seconds * RATE)) / RATE
        wave = np.zeros_like(t)
        for _ in range(3):
            f, phase = rng.uniform(120.0, 3500.0), rng.uniform(0.0, 2 * np.pi)
            wave += rng.uniform(0.1, 0.3) * (1 + 0.5 * np.sin(2 * np.pi * rng.uniform(0.5, 3.0) * t)) * \
                np.sin(2 * np.pi * f * t + phase)
        wave += 0.03 * rng.standard_normal(t.shape)
        out.append(np.clip(np.round(wave * 32768.0), -32768, 32767).astype(np.int16))
    return out


def _features(extractor: Any, pcm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hugging Face's features of one clip, as ``Qwen3ASRProcessor`` asks for them: ``input_features`` ``[128, T]``
    and ``input_features_mask`` ``[T]``."""
    out = extractor(pcm.astype(np.float32) / 32768.0, sampling_rate=RATE, padding=True, truncation=False,
                    return_attention_mask=True, n_window=50, return_tensors="np")
    return out["input_features"][0].astype(np.float32), out["attention_mask"][0].astype(np.int64)


def _expanded(parts: tuple[int | str, ...], texts: list[np.ndarray], tokens_of: dict[str, int]) -> tuple[
        np.ndarray, np.ndarray, list[int]]:
    """(token ids with one pad per clip, the same expanded, the clips' indexes in order)."""
    short: list[int] = []
    long: list[int] = []
    clips: list[int] = []
    text = iter(texts)
    for part in parts:
        if isinstance(part, int):
            run = next(text).tolist()
            short += run
            long += run
        else:
            short += [AUDIO_START, AUDIO_PAD, AUDIO_END]
            long += [AUDIO_START] + [AUDIO_PAD] * tokens_of[part] + [AUDIO_END]
            clips.append(CLIP_NAMES.index(part))
    return np.array(short, np.int32), np.array(long, np.int64), clips


def asr_reference(case: Case, checkpoint: Path, _out: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    import torch
    from transformers import Qwen3ASRForConditionalGeneration
    from transformers.models.qwen3_asr.feature_extraction_qwen3_asr import Qwen3ASRFeatureExtractor
    from transformers.models.qwen3_asr.modeling_qwen3_asr import get_audio_cu_seqlens
    from transformers.models.qwen3_asr.processing_qwen3_asr import Qwen3ASRProcessor

    model = Qwen3ASRForConditionalGeneration.from_pretrained(checkpoint / "hf", dtype=torch.float32).eval()
    extractor = Qwen3ASRFeatureExtractor.from_pretrained(checkpoint)
    clips = _clips(case)
    arrays: dict[str, np.ndarray] = {}
    feats: list[tuple[torch.Tensor, torch.Tensor]] = []
    tokens_of: dict[str, int] = {}
    for i, (name, pcm) in enumerate(zip(CLIP_NAMES, clips)):
        features, mask = _features(extractor, pcm)
        n = int(Qwen3ASRProcessor._get_audio_token_length(None, torch.tensor(mask.sum()), 50))
        x, m = torch.tensor(features[None]), torch.tensor(mask[None])
        with torch.no_grad():
            rows = model.model.get_audio_features(x, m).pooler_output.float().numpy()
        assert rows.shape[0] == n, (name, rows.shape, n)
        # the tower's own bookkeeping: its attention windows and the conv rows it keeps (chunk * 13 + row)
        tower = model.model.audio_tower
        chunk = 2 * tower.n_window
        chunk_lengths = m.view(1, -1, chunk).sum(-1).reshape(-1)
        cu = get_audio_cu_seqlens(chunk_lengths, m.sum(-1), tower.n_window_infer, tower.n_window)
        steps = chunk
        for _ in range(3):  # the conv stack's stride-2 stages
            steps = (steps - 1) // 2 + 1
        kept = torch.arange(steps) < tower._post_cnn_length(chunk_lengths)[:, None]
        arrays[f"audio_cu_seqlens_{i}"] = cu.numpy().astype(np.int64)
        arrays[f"audio_kept_rows_{i}"] = kept.flatten().nonzero().squeeze(-1).numpy().astype(np.int64)
        arrays[f"clip_{i}"] = pcm
        arrays[f"audio_features_{i}"] = features
        arrays[f"audio_frames_{i}"] = np.array(int(mask.sum()), np.int64)
        arrays[f"audio_embeds_{i}"] = rows
        feats.append((x, m))
        tokens_of[name] = n

    def logits_of(ids: np.ndarray, which: list[int]) -> np.ndarray:
        kwargs: dict[str, Any] = {}
        if which:
            kwargs["input_features"] = torch.cat([feats[i][0] for i in which])
            kwargs["input_features_mask"] = torch.cat([feats[i][1] for i in which])
        with torch.no_grad():
            return model(input_ids=torch.tensor(ids)[None], use_cache=False, **kwargs).logits[0].float().numpy()

    sequences = []
    for i, prompt in enumerate(PROMPTS):
        rng = np.random.default_rng(case.seed * 1000 + i)
        for _ in range(2000):
            texts = [rng.integers(*TEXT_TOKENS, n) for n in prompt.parts if isinstance(n, int)]
            short, ids, which = _expanded(prompt.parts, texts, tokens_of)
            extended = greedy_continuation(ids, lambda t, w=which: logits_of(t, w)[-1])
            if extended is not None:
                ids = extended
                break
        else:
            raise RuntimeError(f"{case.name}: no {prompt.purpose} prompt with greedy gaps >= {GAP} in 2000 draws")
        length = len(ids) - CONTINUATION
        logits = logits_of(ids[:-1], which)
        rows = stored_positions(Sequence(prompt.purpose, length))
        arrays[f"tokens_{i}"] = ids.astype(np.int32)
        arrays[f"prompt_ids_{i}"] = short
        arrays[f"positions_{i}"] = rows
        arrays[f"logits_{i}"] = logits[rows].astype(np.float32)
        greedy = logits[length - 1:length - 1 + CONTINUATION]
        sequences.append({"purpose": prompt.purpose, "prompt_length": length, "marks": [], "clips": which,
                          "smallest_greedy_gap": round(min(gap(r) for r in greedy), 4)})
    return arrays, {"sequences": sequences, "continuation": CONTINUATION, "sample_rate": RATE,
                    "audio_tokens": [tokens_of[n] for n in CLIP_NAMES],
                    "audio_std": [round(float(arrays[f"audio_embeds_{i}"].std()), 4) for i in range(len(clips))]}


_NOTES = ("The checkpoint is written twice from the same seeded `Qwen3ASRForConditionalGeneration`: `hf/` as "
          "transformers 5.14 saves it (the reference loads it) and the root in the hub's layout the exporter reads "
          "(`thinker_config`, `thinker.audio_tower.*` with the projector as `proj1` / `proj2`, `thinker.model.*`, "
          "`thinker.lm_head.weight`): transformers 5.14 writes a flat layout the exporter's audio loader does not "
          "match. The audio role's `config.json` is the exporter's; `builder_config.json` holds the mel-frame caps "
          "Edge-LLM's builder adds to it (`min_time_steps`, `max_time_steps`), and `profiles.json` its one profile "
          "(`_setup_component_profile`, the audio component). `audio/preprocessor_config.json` is the checkpoint's "
          "`Qwen3ASRFeatureExtractor`, copied as the builder copies it. The clips are seeded sines over noise, "
          "stored as int16 PCM at 16 kHz.")

CASES = [
    Case("qwen3-asr", "Qwen3-ASR: audio encoder of 2 layers of 64 (4 heads, convolutions of 32 channels, n_window 50, "
                      "n_window_infer 200: windows of 26 rows; output 128); LLM of 2 layers of 128 (Qwen3, QK norm, "
                      "the hub's interleaved MRoPE rope_scaling, vocab 512).",
         qwen3_asr, {"llm": Role("llm", LLM_BUILDER), "audio": Role("audio", AUDIO_BUILDER, component="audio")},
         export=export_asr, reference=asr_reference, notes=_NOTES, size_limit=3 * 1024 * 1024),
]
