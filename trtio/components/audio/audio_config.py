"""AudioConfig: a speech model's audio encoder directory (``audio/``), as Edge-LLM 0.11 writes it.

Edge-LLM's builder writes ``audio/config.json`` beside ``audio/audio_encoder.engine`` for Qwen3-ASR (model type
``qwen3_asr_thinker``) and Qwen3-Omni's audio encoder (``qwen3_omni_audio_encoder``): the checkpoint's
``audio_config`` (``num_mel_bins``, ``n_window``, ``n_window_infer``, ``output_dim``, and the keys that only shape
the engine's own computation), the audio token ids, ``text_config.rope_theta`` and the ``builder_config`` the engine
was built for (``min_time_steps`` / ``max_time_steps``: the mel frames its one profile takes). It copies the
checkpoint's ``preprocessor_config.json`` (Hugging Face's feature extractor) beside it where the checkpoint has one.

What trtio computes from it (:func:`trtio.audio.preprocess`, the encoder's inputs, the splice):

* the log-mel: Whisper's front end, the only one Edge-LLM's runner has for these model types (128 Slaney mel bins
  over a 400-point periodic Hann STFT at a 160-sample hop, 16 kHz); a ``preprocessor_config.json`` that asks for
  anything else (another rate, hop, FFT size, bin count, dither) is refused, naming the key;
* ``min_samples``: Hugging Face's ``Qwen3ASRFeatureExtractor`` zero-pads a clip shorter than ``min_length``
  samples (8000 by default) before the mel, and counts the padding as speech; Qwen3-Omni's
  ``WhisperFeatureExtractor`` does not (0). trtio follows the checkpoint's feature extractor (the model's truth);
  Edge-LLM's runner never pads (``docs/edgellm-assumptions.md``);
* chunks of ``2 * n_window`` mel frames, three stride-2 convolutions (13 tokens a full chunk of 100), and attention
  windows of ``n_window_infer // (2 * n_window)`` chunks' tokens.

``qwen3_omni_next_audio_encoder`` (a fourth convolution) and other model types are refused naming them. Keys of
``audio_config`` that only shape the engine's own computation (``d_model``, ``encoder_layers``,
``activation_function``, ...) stay in :attr:`AudioConfig.extras`: trtio computes no encoder layer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from trtio._checks import is_int
from trtio.components.config_files import PREPROCESSOR_FILE, ComponentFiles, keys_of
from trtio.errors import ConfigError

__all__ = ["AUDIO_CONFIG_FILE", "AUDIO_DIR", "AUDIO_ENGINE_FILE", "AUDIO_KINDS", "PREPROCESSOR_FILE", "AudioConfig"]

#: The audio encoder kinds trtio binds (``model_type`` of ``audio/config.json``) and their feature extractors'
#: default ``min_length`` (samples a shorter clip is zero-padded to): Qwen3-ASR's ``Qwen3ASRFeatureExtractor``
#: pads to 8000, Qwen3-Omni's ``WhisperFeatureExtractor`` does not pad.
AUDIO_KINDS: Mapping[str, int] = MappingProxyType({"qwen3_asr_thinker": 8000, "qwen3_omni_audio_encoder": 0})
AUDIO_DIR = "audio"
AUDIO_CONFIG_FILE = "config.json"
AUDIO_ENGINE_FILE = "audio_encoder.engine"

# Whisper's front end as Edge-LLM's runner hard-codes it (makeWhisperExtractor): the preprocessor keys that must
# hold these values (Hugging Face's names) and the values.
_WHISPER = {"sampling_rate": 16000, "n_fft": 400, "hop_length": 160}
_FEATURE_EXTRACTORS = {"Qwen3ASRFeatureExtractor": 8000, "WhisperFeatureExtractor": 0}
_CONV_STAGES = 3  # stride-2 convolutions of Qwen3-ASR's and Qwen3-Omni's encoders
_MEL_BINS = 128


@dataclass(frozen=True)
class AudioConfig:
    """An audio encoder's config (see module docstring); build it with :meth:`from_edgellm` or :meth:`from_dir`."""

    model_type: str
    num_mel_bins: int
    n_window: int  # half a chunk's mel frames
    n_window_infer: int  # mel frames an attention window spans
    output_dim: int  # an encoder row's width: the LLM's hidden size
    min_time_steps: int  # mel frames the engine's profile takes (builder_config)
    max_time_steps: int
    audio_token_id: int
    audio_start_token_id: int | None = None
    audio_end_token_id: int | None = None
    sampling_rate: int = 16000
    n_fft: int = 400
    hop_length: int = 160
    min_samples: int = 0  # a shorter clip is zero-padded to this many samples before the mel
    rope_theta: float | None = None
    extras: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.model_type not in AUDIO_KINDS:
            raise ConfigError("model_type", f"{self.model_type!r} is not an audio encoder trtio binds (expected one "
                                            f"of {list(AUDIO_KINDS)})")
        for name in ("num_mel_bins", "n_window", "n_window_infer", "output_dim", "min_time_steps", "max_time_steps",
                     "sampling_rate", "n_fft", "hop_length"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ConfigError(name, f"expected an integer >= 1, got {value!r}")
        if self.num_mel_bins != _MEL_BINS:
            raise ConfigError("audio_config.num_mel_bins", f"is {self.num_mel_bins}; Edge-LLM's Whisper front end "
                                                           f"computes {_MEL_BINS} mel bins")
        for key, want in _WHISPER.items():
            if getattr(self, key) != want:
                raise ConfigError(key, f"is {getattr(self, key)}; Edge-LLM's runner computes Whisper's log-mel "
                                       f"({key} {want}) for {self.model_type}")
        if self.n_window_infer < self.chunk_frames:
            raise ConfigError("audio_config.n_window_infer",
                              f"is {self.n_window_infer}, less than a chunk (2 x n_window = {self.chunk_frames} mel "
                              f"frames): an attention window spans n_window_infer // {self.chunk_frames} chunks")
        if self.min_time_steps > self.max_time_steps:
            raise ConfigError("builder_config", f"expected min_time_steps <= max_time_steps, got "
                                                f"{self.min_time_steps}, {self.max_time_steps}")
        if not is_int(self.min_samples) or self.min_samples < 0:
            raise ConfigError("min_samples", f"expected an integer >= 0, got {self.min_samples!r}")
        object.__setattr__(self, "extras", MappingProxyType(dict(self.extras)))

    # -- reading ------------------------------------------------------------------------------
    @classmethod
    def from_edgellm(cls, data: Mapping[str, Any], *, preprocessor: Mapping[str, Any] | None = None,
                     what: str = AUDIO_CONFIG_FILE, preprocessor_what: str = PREPROCESSOR_FILE) -> AudioConfig:
        """The config of an ``audio/config.json`` (``data``) and, where given, its ``preprocessor_config.json``.

        Raises :class:`ConfigError` naming ``"<what>: <dotted key>"`` for a missing or malformed key, a model type
        not in :data:`AUDIO_KINDS`, or a preprocessing key trtio cannot honour."""
        if not isinstance(data, Mapping):
            raise ConfigError(what, f"expected a JSON object, got {type(data).__name__}")
        with keys_of(what):
            values = _values(data)
        if preprocessor is not None:
            with keys_of(preprocessor_what):
                values.update(_preprocessing(preprocessor, values))
        with keys_of(what):
            return cls(**values)

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str]) -> AudioConfig:
        """Read ``path/config.json`` and, where present, ``path/preprocessor_config.json`` (an ``audio/``
        directory). ConfigError naming the file for a missing config."""
        files = ComponentFiles("AudioConfig.from_dir", path, AUDIO_CONFIG_FILE)
        return cls.from_edgellm(files.data, preprocessor=files.preprocessor, what=files.what,
                                preprocessor_what=files.preprocessor_what)

    # -- derived sizes --------------------------------------------------------------------------
    @property
    def chunk_frames(self) -> int:
        """Mel frames of one chunk the encoder's convolutions take (``2 * n_window``)."""
        return 2 * self.n_window

    @property
    def conv_stages(self) -> int:
        """Stride-2 convolutions along time (3 for Qwen3-ASR and Qwen3-Omni)."""
        return _CONV_STAGES

    @property
    def chunk_tokens(self) -> int:
        """Encoder rows of a full chunk (13 for 100 frames)."""
        return conv_output_length(self.chunk_frames, self.conv_stages)

    @property
    def window_chunks(self) -> int:
        """Chunks whose tokens one attention window spans (``n_window_infer // (2 * n_window)``)."""
        return self.n_window_infer // self.chunk_frames

    @property
    def min_chunks(self) -> int:
        """Chunks the engine's profile takes at least (``ceil(min_time_steps / chunk_frames)``, as the builder)."""
        return max(1, -(-self.min_time_steps // self.chunk_frames))

    @property
    def max_chunks(self) -> int:
        """Chunks the engine's profile takes at most (``ceil(max_time_steps / chunk_frames)``, as the builder)."""
        return max(1, -(-self.max_time_steps // self.chunk_frames))

    @property
    def max_tokens(self) -> int:
        """Encoder rows of one call at most (every chunk full), the engine's profile maximum."""
        return self.max_chunks * self.chunk_tokens

    @property
    def max_frames(self) -> int:
        """Mel frames of the longest clip one call takes (``max_chunks`` whole chunks)."""
        return self.max_chunks * self.chunk_frames


def conv_output_length(frames: int, stages: int = _CONV_STAGES) -> int:
    """Time steps after ``stages`` stride-2 convolutions (kernel 3, padding 1) of ``frames`` mel frames, chunk by
    chunk of 100 as Edge-LLM's ``computeFeatExtractOutputLength`` and Hugging Face's
    ``_get_feat_extract_output_lengths`` count them: full chunks give 13 each, the tail ``(t - 1) // 2 + 1`` per
    stage (0 for no tail). Here for one chunk or tail (``frames`` at most a chunk)."""
    n = frames
    for _ in range(stages):
        n = (n - 1) // 2 + 1
    return max(n, 0)


def _values(data: Mapping[str, Any]) -> dict[str, Any]:
    kind = data.get("model_type")
    if kind == "qwen3_omni_next_audio_encoder":
        raise ConfigError("model_type", "'qwen3_omni_next_audio_encoder' (Qwen3-Next Omni: a fourth stride-2 "
                                        "convolution) is not an audio encoder trtio binds yet")
    if not isinstance(kind, str) or kind not in AUDIO_KINDS:
        raise ConfigError("model_type", f"{kind!r} is not an audio encoder trtio binds (expected one of "
                                        f"{list(AUDIO_KINDS)}); this directory's audio encoder is not supported")
    audio = _section(data, "audio_config")
    builder = _section(data, "builder_config",
                       "holds the mel-frame caps Edge-LLM's builder writes when it builds the audio engine")
    values: dict[str, Any] = {
        "model_type": kind,
        "num_mel_bins": _int(audio, "audio_config", "num_mel_bins", default=_MEL_BINS),
        "n_window": _int(audio, "audio_config", "n_window", default=50),
        # Hugging Face's default is 800, Edge-LLM's runner's 200: a config without it is read two ways
        "n_window_infer": _int(audio, "audio_config", "n_window_infer"),
        "output_dim": _int(audio, "audio_config", "output_dim"),
        "min_time_steps": _int(builder, "builder_config", "min_time_steps"),
        "max_time_steps": _int(builder, "builder_config", "max_time_steps"),
        "audio_token_id": _int(data, "", "audio_token_id", minimum=0),
        "audio_start_token_id": _int(data, "", "audio_start_token_id", minimum=0, optional=True),
        "audio_end_token_id": _int(data, "", "audio_end_token_id", minimum=0, optional=True),
        "min_samples": AUDIO_KINDS[kind],
    }
    text = data.get("text_config")
    if isinstance(text, Mapping) and text.get("rope_theta") is not None:
        values["rope_theta"] = float(text["rope_theta"])
    used = {"num_mel_bins", "n_window", "n_window_infer", "output_dim"}
    extras = {f"audio_config.{k}": v for k, v in audio.items() if k not in used}
    extras.update({f"builder_config.{k}": v for k, v in builder.items() if k not in ("min_time_steps",
                                                                                     "max_time_steps")})
    extras.update({k: v for k, v in data.items()
                   if k not in ("model_type", "audio_config", "builder_config", "audio_token_id",
                                "audio_start_token_id", "audio_end_token_id")})
    values["extras"] = extras
    return values


def _preprocessing(pre: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """What a ``preprocessor_config.json`` (Hugging Face's feature extractor) sets: the Whisper constants (refused
    where they differ from what Edge-LLM's runner computes), the mel bins and chunk size (equal to the encoder's),
    and ``min_length``."""
    if not isinstance(pre, Mapping):
        raise ConfigError("", f"expected a JSON object, got {type(pre).__name__}")
    kind = pre.get("feature_extractor_type")
    if kind not in _FEATURE_EXTRACTORS:
        raise ConfigError("feature_extractor_type", f"{kind!r}: trtio computes the features of "
                                                    f"{list(_FEATURE_EXTRACTORS)} (Whisper's log-mel)")
    out: dict[str, Any] = {}
    for key, want in _WHISPER.items():
        if key in pre:
            out[key] = _int(pre, "", key)
            if out[key] != want:
                raise ConfigError(key, f"is {out[key]}; Edge-LLM's runner computes Whisper's log-mel ({key} {want}) "
                                       f"for {values['model_type']}")
    bins = _int(pre, "", "feature_size", default=_MEL_BINS)
    if bins != values["num_mel_bins"]:
        raise ConfigError("feature_size", f"is {bins}, the encoder's audio_config.num_mel_bins "
                                          f"{values['num_mel_bins']}")
    if pre.get("dither", 0.0) not in (0, 0.0):
        raise ConfigError("dither", f"is {pre['dither']!r}: random noise added to each frame; trtio computes the "
                                    "features without it (dither 0)")
    window = pre.get("n_window")
    if window is not None and window != values["n_window"]:
        raise ConfigError("n_window", f"is {window!r}, the encoder's audio_config.n_window {values['n_window']}")
    default = _FEATURE_EXTRACTORS[kind]
    out["min_samples"] = _int(pre, "", "min_length", default=default, minimum=0) if default else 0
    return out


def _section(data: Mapping[str, Any], key: str, why: str = "") -> Mapping[str, Any]:
    section = data.get(key)
    if not isinstance(section, Mapping):
        raise ConfigError(key, "is missing" + (f" ({why})" if why else "") if section is None else
                          f"expected a JSON object, got {type(section).__name__}")
    return section


def _int(section: Mapping[str, Any], where: str, key: str, *, default: int | None = None, minimum: int = 1,
         optional: bool = False) -> Any:
    dotted = f"{where}.{key}" if where else key
    value = section.get(key)
    if value is None:
        if default is not None or optional:
            return default
        raise ConfigError(dotted, "is missing")
    if not is_int(value) or value < minimum:
        raise ConfigError(dotted, f"expected an integer >= {minimum}, got {value!r}")
    return int(value)
