"""The audio encoder's inputs for one clip: Whisper's log-mel, cut into chunks, and the rows and windows the encoder
attends over (:func:`preprocess`, :class:`AudioFeatures`).

* **The log-mel** equals Hugging Face's feature extractor of the model (``Qwen3ASRFeatureExtractor``, Qwen3-Omni's
  ``WhisperFeatureExtractor``) on one clip: a clip shorter than ``cfg.min_samples`` is zero-padded to it (Qwen3-ASR
  pads to 0.5 s and counts the padding as speech, as the original Qwen3-ASR library does); a periodic Hann window of
  ``n_fft`` samples every ``hop_length`` samples over the clip reflect-padded by ``n_fft / 2`` at both ends
  (``torch.stft(center=True)``), the last frame dropped (``stft[..., :-1]``: ``len // hop`` frames), power spectrum
  through 128 Slaney mel filters (0-8000 Hz), ``log10`` of at least ``1e-10``, floored at the clip's maximum minus 8,
  then ``(x + 4) / 4``. Computed in float64 and rounded to float32 (torch computes in float32: the two agree to
  about 1e-6).
* **Chunks.** The frames are right-padded with zeros to whole chunks of ``2 * n_window`` (100) frames
  (``padded_feature [chunks, 128, 100]``, Hugging Face's ``input_features`` padded to a multiple of 100): Edge-LLM's
  ``chunkAndPadFeatures``.
* **Rows.** Three stride-2 convolutions leave 13 rows of a full chunk and ``conv_output_length(tail)`` of the last
  one's ``tail`` frames; ``padded_mask_after_cnn_indices [N, 2]`` lists (chunk, row) of each kept row, chunk by
  chunk (Edge-LLM's ``createPaddedMask`` + ``convertMaskToIndices``; Hugging Face's ``valid_mask.nonzero()``).
* **Windows.** Rows attend within windows of ``13 * (n_window_infer // 100)`` rows (the longest chunk's rows times
  the chunks a window spans), the clip's rows cut from the start, the last window what is left:
  ``attention_mask [N, N]`` float16 is 0 inside a window and -65504 across (Edge-LLM's
  ``createChunkwiseAttentionMask``; Hugging Face's ``get_audio_cu_seqlens`` segments).

One clip per call, as Edge-LLM's runner encodes one clip at a time. Everything here is host-side numpy.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._checks import is_int
from trtio.components.audio.audio_config import AudioConfig, conv_output_length
from trtio.errors import CapacityError, InvalidValueError, ShapeError

__all__ = ["AudioFeatures", "features_of", "log_mel", "mel_filters", "preprocess"]

_MASKED = np.float16(-65504.0)  # float16's lowest: Edge-LLM's mask value across windows
_LOG_FLOOR = 1e-10
_DYNAMIC_RANGE = 8.0
_MAX_FREQUENCY = 8000.0


@dataclass(frozen=True)
class AudioFeatures:
    """One clip's encoder inputs (see module docstring), as :func:`preprocess` gives them.

    ``input_features`` float32 ``[mel, chunks * chunk]``: the log-mel, right-padded with zeros to whole chunks
    (Hugging Face's ``input_features`` of the clip); ``frames``: the clip's mel frames (the sum of Hugging Face's
    ``input_features_mask``); ``chunk_tokens`` int64 ``[chunks]``: each chunk's rows after the convolutions;
    ``indices`` int64 ``[N, 2]``: ``padded_mask_after_cnn_indices``; ``windows`` int64 ``[W]``: the attention
    windows' lengths in rows; ``attention_mask`` float16 ``[N, N]``. Read-only arrays."""

    input_features: np.ndarray
    frames: int
    chunk_frames: int
    chunk_tokens: np.ndarray
    indices: np.ndarray
    windows: np.ndarray
    attention_mask: np.ndarray

    @property
    def chunks(self) -> int:
        return int(self.chunk_tokens.shape[0])

    @property
    def tokens(self) -> int:
        """The clip's encoder rows (N): the audio tokens one audio pad expands into."""
        return int(self.indices.shape[0])

    @property
    def padded_feature(self) -> np.ndarray:
        """float32 ``[chunks, mel, chunk]``: ``input_features`` chunk by chunk (the engine's ``padded_feature``)."""
        mel = self.input_features.shape[0]
        out: np.ndarray = self.input_features.reshape(mel, self.chunks, self.chunk_frames).transpose(1, 0, 2)
        return np.ascontiguousarray(out)

    @property
    def feature_mask(self) -> np.ndarray:
        """int32 ``[chunks * chunk]``: 1 on the clip's frames, 0 on the padding (Hugging Face's
        ``input_features_mask``)."""
        mask = np.zeros(self.input_features.shape[1], np.int32)
        mask[:self.frames] = 1
        return mask

    def __repr__(self) -> str:
        return (f"AudioFeatures(frames={self.frames}, chunks={self.chunks}, tokens={self.tokens}, "
                f"windows={self.windows.tolist()})")


@functools.lru_cache(maxsize=8)
def mel_filters(sampling_rate: int, n_fft: int, num_mel_bins: int) -> np.ndarray:
    """float64 ``[n_fft // 2 + 1, num_mel_bins]``: triangular Slaney-scale mel filters from 0 to 8000 Hz with Slaney
    area normalisation, as Hugging Face's ``audio_utils.mel_filter_bank(norm="slaney", mel_scale="slaney")``
    computes them for Whisper's feature extractors. Read-only."""
    bins = n_fft // 2 + 1
    mels = np.linspace(_hz_to_mel(0.0), _hz_to_mel(_MAX_FREQUENCY), num_mel_bins + 2)
    edges = _mel_to_hz(mels)
    fft_freqs = np.linspace(0, sampling_rate // 2, bins)
    slopes = edges[None, :] - fft_freqs[:, None]
    widths = np.diff(edges)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    filters *= (2.0 / (edges[2:num_mel_bins + 2] - edges[:num_mel_bins]))[None, :]
    filters.flags.writeable = False
    return filters


def _hz_to_mel(hz: Any) -> Any:
    """Slaney's mel scale: linear (3 mels every 200 Hz) below 1 kHz, logarithmic above."""
    f = np.asarray(hz, np.float64)
    mel = 3.0 * f / 200.0
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-300) / 1000.0) * (27.0 / np.log(6.4)), mel)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = 200.0 * mel / 3.0
    out: np.ndarray = np.where(mel >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mel - 15.0)), hz)
    return out


def log_mel(waveform: np.ndarray, cfg: AudioConfig) -> np.ndarray:
    """float32 ``[num_mel_bins, len // hop_length]``: Whisper's normalised log-mel of ``waveform`` (float32 ``[n]``,
    already padded to ``cfg.min_samples``); see the module docstring."""
    n_fft, hop = cfg.n_fft, cfg.hop_length
    pad = n_fft // 2
    x = np.pad(waveform.astype(np.float64), pad, mode="reflect")
    frames = waveform.shape[0] // hop  # 1 + len // hop, the last one dropped
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    framed = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop][:frames]
    power = np.abs(np.fft.rfft(framed * window, axis=1)) ** 2  # [frames, bins]
    mel = power @ mel_filters(cfg.sampling_rate, n_fft, cfg.num_mel_bins)  # [frames, mel]
    logs = np.log10(np.maximum(mel, _LOG_FLOOR)).T
    logs = np.maximum(logs, logs.max() - _DYNAMIC_RANGE) if logs.size else logs
    return np.ascontiguousarray(((logs + 4.0) / 4.0).astype(np.float32))


def preprocess(waveform: Any, sample_rate: int, cfg: AudioConfig) -> AudioFeatures:
    """One clip's encoder inputs (:class:`AudioFeatures`; see the module docstring): ``waveform`` mono float samples
    (``[n]``, in [-1, 1] as a decoder gives them; :func:`trtio.audio.read_wav` reads a PCM16 file) at
    ``sample_rate`` Hz, ``cfg`` the encoder's :class:`~trtio.components.audio.audio_config.AudioConfig`.

    Refused before any work: a sample rate other than the model's (InvalidValueError naming it: resample first),
    more than one channel, a clip too short for the STFT's reflect padding, non-finite samples, and a clip longer
    than the engine takes (CapacityError naming ``max_time_steps``)."""
    if not isinstance(cfg, AudioConfig):
        raise InvalidValueError(f"preprocess: cfg must be an AudioConfig (EngineDir.audio_config, or "
                                f"AudioConfig.from_dir), got {type(cfg).__name__}")
    if not is_int(sample_rate) or int(sample_rate) != cfg.sampling_rate:
        raise InvalidValueError(f"sample_rate {sample_rate!r} Hz: {cfg.model_type}'s feature extractor takes "
                                f"{cfg.sampling_rate} Hz audio (resample the clip first)")
    x = np.asarray(waveform)
    if x.ndim == 2 and 1 in x.shape:
        x = x.reshape(-1)
    if x.ndim != 1 or x.dtype.kind not in "fiu":
        raise ShapeError(f"waveform: expected mono samples, a 1-D array of numbers, got {x.dtype} {list(x.shape)}")
    x = x.astype(np.float32)
    if not np.isfinite(x).all():
        i = int(np.flatnonzero(~np.isfinite(x))[0])
        raise InvalidValueError(f"waveform[{i}] = {float(x[i])!r} is not a finite sample")
    if x.shape[0] < cfg.min_samples:
        x = np.pad(x, (0, cfg.min_samples - x.shape[0]))
    if x.shape[0] <= cfg.n_fft // 2:
        raise ShapeError(f"waveform: {x.shape[0]} samples; the STFT's reflect padding needs more than "
                         f"{cfg.n_fft // 2} ({(cfg.n_fft // 2 + 1) / cfg.sampling_rate * 1000:.1f} ms)")
    frames = x.shape[0] // cfg.hop_length
    if frames > cfg.max_frames:
        raise CapacityError(f"waveform: {x.shape[0]} samples give {frames} mel frames; the audio engine takes "
                            f"{cfg.max_frames} ({cfg.max_chunks} chunks of {cfg.chunk_frames}: builder_config "
                            f"max_time_steps {cfg.max_time_steps}); split the clip")
    return features_of(log_mel(x, cfg), cfg)


def features_of(mel: np.ndarray, cfg: AudioConfig) -> AudioFeatures:
    """The chunks, rows and windows of a log-mel ``[num_mel_bins, frames]`` (see the module docstring)."""
    frames = int(mel.shape[1])
    chunk = cfg.chunk_frames
    chunks = max(1, math.ceil(frames / chunk))
    padded = np.zeros((mel.shape[0], chunks * chunk), np.float32)
    padded[:, :frames] = mel
    lengths = np.full(chunks, chunk, np.int64)
    lengths[-1] = frames - (chunks - 1) * chunk
    per_chunk = np.array([conv_output_length(int(n), cfg.conv_stages) for n in lengths], np.int64)
    indices = np.concatenate([np.stack([np.full(n, c), np.arange(n)], 1) for c, n in enumerate(per_chunk.tolist())])
    n_tokens = int(per_chunk.sum())
    window = int(per_chunk.max()) * cfg.window_chunks
    windows = [window] * (n_tokens // window) + ([n_tokens % window] if n_tokens % window else [])
    mask = np.full((n_tokens, n_tokens), _MASKED, np.float16)
    start = 0
    for w in windows:
        mask[start:start + w, start:start + w] = 0
        start += w
    arrays = (padded, per_chunk, indices.astype(np.int64), np.array(windows, np.int64), mask)
    for a in arrays:
        a.flags.writeable = False
    return AudioFeatures(arrays[0], frames, chunk, arrays[1], arrays[2], arrays[3], arrays[4])
