"""The glue between speech and a speech model's LLM (Qwen3-ASR; Qwen3-Omni's audio encoder): a clip's encoder inputs,
and the encoder's rows spliced into the prompt (DESIGN §19). The implementation lives in the audio component,
:mod:`trtio.components.audio`; the encoder's setup is :func:`trtio.components.audio.create_for_audio`.

* :func:`preprocess` ``(waveform, sample_rate, cfg)`` -> :class:`AudioFeatures`: Whisper's 128-bin log-mel equal to
  the model's Hugging Face feature extractor, in chunks of ``2 * n_window`` frames, with the rows kept after the
  convolutions and the attention windows over ``n_window_infer`` frames;
* :func:`splice` ``(token_ids, cfg, embedding, audio_embeds)`` -> :class:`AudioPrompt`: each ``<|audio_pad|>``
  expanded into its clip's rows (:func:`expand_audio_pads`), the rows written over them, sequential positions;
* :func:`read_wav`: a PCM16 mono WAV file as float samples and its rate.

Everything here is host-side numpy.
"""

from trtio.components.audio.audio_config import AudioConfig
from trtio.components.audio.audio_features import AudioFeatures, preprocess
from trtio.components.audio.audio_splice import AudioPrompt, expand_audio_pads, splice
from trtio.components.audio.wav import read_wav

__all__ = ["AudioConfig", "AudioFeatures", "AudioPrompt", "expand_audio_pads", "preprocess", "read_wav", "splice"]
