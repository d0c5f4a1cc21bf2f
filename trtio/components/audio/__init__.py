"""The audio component: a speech model's audio encoder (Edge-LLM 0.11's ``audio/``: Qwen3-ASR, Qwen3-Omni's audio
encoder), from a clip to the rows spliced into the LLM's prompt.

* :mod:`~trtio.components.audio.audio_config`: :class:`AudioConfig` (``audio/config.json`` and the feature extractor's
  ``preprocessor_config.json``);
* :mod:`~trtio.components.audio.audio_features`: :func:`preprocess`, a clip's log-mel chunks, rows and attention windows
  (:class:`AudioFeatures`), equal to the model's Hugging Face feature extractor;
* :mod:`~trtio.components.audio.audio_setup`: :func:`create_for_audio` / :class:`AudioSetup`, the encoder engine bound;
* :mod:`~trtio.components.audio.audio_splice`: :func:`splice`, the audio pads expanded and the rows spliced
  (:class:`AudioPrompt`, sequential positions);
* :mod:`~trtio.components.audio.wav`: :func:`read_wav`, a PCM16 mono WAV file.

``trtio.audio`` is the public module of the host-side steps (preprocess, splice, read_wav).
"""

from trtio.components.audio.audio_config import AUDIO_DIR, AUDIO_ENGINE_FILE, AUDIO_KINDS, AudioConfig
from trtio.components.audio.audio_features import AudioFeatures, preprocess
from trtio.components.audio.audio_setup import AudioSetup, create_for_audio
from trtio.components.audio.audio_splice import AudioPrompt, expand_audio_pads, splice
from trtio.components.audio.wav import read_wav

__all__ = ["AUDIO_DIR", "AUDIO_ENGINE_FILE", "AUDIO_KINDS", "AudioConfig", "AudioFeatures", "AudioPrompt",
           "AudioSetup", "create_for_audio", "expand_audio_pads", "preprocess", "read_wav", "splice"]
