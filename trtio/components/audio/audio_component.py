"""The audio component as the component table sees it: a speech model's audio encoder in ``audio/`` (Qwen3-ASR,
Qwen3-Omni's audio encoder), read by :class:`~trtio.edgellm.EngineDir` (``EngineDir.audio_config``) and attached by
:func:`~trtio._setups.create_from_engine_dir` as the LLM setup's ``audio`` (an
:class:`~trtio.components.audio.audio_setup.AudioSetup`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtio._config import LLMEngineConfig
from trtio._stream import StreamLike
from trtio.components.audio.audio_config import AUDIO_CONFIG_FILE, AUDIO_DIR, AUDIO_ENGINE_FILE, AudioConfig
from trtio.components.audio.audio_setup import create_for_audio
from trtio.errors import ConfigError
from trtio.features import Component

__all__ = ["AUDIO_ROLE", "AudioComponent"]

AUDIO_ROLE = "audio"
# The token ids both configs write (the LLM's config.json and audio/config.json, from the checkpoint's thinker
# config): the splice writes the encoder's rows over audio_token_id, between the two markers.
_TOKEN_KEYS = ("audio_token_id", "audio_start_token_id", "audio_end_token_id")


class AudioComponent(Component):
    """``audio/``: ``config.json`` (with the builder's ``builder_config``) and the checkpoint's
    ``preprocessor_config.json`` (an :class:`~trtio.components.audio.audio_config.AudioConfig`, checked against the
    LLM's), ``audio_encoder.engine``."""

    NAME = AUDIO_ROLE
    FOLDER = AUDIO_DIR
    CONFIG_FILE = AUDIO_CONFIG_FILE
    ENGINE_FILE = AUDIO_ENGINE_FILE
    WHAT = "audio encoder"

    @classmethod
    def read(cls, folder: Path, llm: LLMEngineConfig) -> AudioConfig | None:
        """``folder``'s config, checked against the LLM's (ConfigError naming the file and the key), or None."""
        if not (folder / AUDIO_CONFIG_FILE).is_file():
            return None
        cfg = AudioConfig.from_dir(folder)
        file = folder / AUDIO_CONFIG_FILE
        if cfg.output_dim != llm.hidden_size:
            raise ConfigError(f"{file}: audio_config.output_dim", f"is {cfg.output_dim}, but the LLM's hidden_size is "
                                                                  f"{llm.hidden_size}: the audio rows take the place "
                                                                  "of text embeddings")
        if cfg.audio_token_id >= llm.vocab_size:
            raise ConfigError(f"{file}: audio_token_id", f"is {cfg.audio_token_id}, outside the LLM's vocabulary "
                                                         f"(vocab_size {llm.vocab_size})")
        for key in _TOKEN_KEYS:
            theirs, mine = llm.extras.get(key), getattr(cfg, key)
            if theirs is not None and mine is not None and theirs != mine:
                raise ConfigError(f"{file}: {key}", f"is {mine}, the LLM's config says {theirs}")
        if cfg.rope_theta is not None and cfg.rope_theta != llm.rope_theta:
            raise ConfigError(f"{file}: text_config.rope_theta", f"is {cfg.rope_theta}, the LLM's rope_theta is "
                                                                 f"{llm.rope_theta}")
        return cfg

    @classmethod
    def check_attach(cls, llm: LLMEngineConfig, part: Any) -> None:
        """The encoder's rows take the place of text embeddings: its output width is the LLM's hidden size."""
        if part.cfg.output_dim != llm.hidden_size:
            raise ConfigError("audio_config.output_dim", f"is {part.cfg.output_dim}, but the LLM's hidden_size is "
                                                         f"{llm.hidden_size}")

    @classmethod
    def attach(cls, setup: Any, engine: Any, config: AudioConfig, stream: StreamLike = None, *,
               graphs: bool = False) -> None:
        setup.attach(cls.NAME, create_for_audio(engine, config, stream, graphs=graphs, backend=setup.io.backend))
