"""read_wav: a PCM16 mono WAV file as float samples (the standard library's ``wave``; no audio package)."""

from __future__ import annotations

import os
import wave

import numpy as np

from trtio.errors import ConfigError, InvalidTypeError

__all__ = ["read_wav"]


def read_wav(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """``(samples, sample_rate)`` of a WAV file of 16-bit PCM mono: float32 samples in [-1, 1) (each int16 over
    32768, as ``soundfile`` and ``torchaudio`` read it), and the file's rate in Hz. ConfigError naming the file for
    another sample width or channel count, a compressed format, or a file ``wave`` cannot read."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError(f"read_wav: expected a file path, got {type(path).__name__}")
    what = os.fspath(path)
    try:
        with wave.open(what, "rb") as f:
            channels, width, rate, count = f.getnchannels(), f.getsampwidth(), f.getframerate(), f.getnframes()
            data = f.readframes(count)
    except (wave.Error, EOFError) as exc:
        raise ConfigError(what, f"is not a PCM WAV file the standard library reads ({exc})") from None
    except OSError as exc:
        raise ConfigError(what, f"cannot be read ({exc.strerror or exc})") from None
    if width != 2:
        raise ConfigError(what, f"holds {8 * width}-bit samples; trtio reads 16-bit PCM (convert it, e.g. "
                                "`ffmpeg -i IN -ac 1 -ar 16000 -c:a pcm_s16le OUT.wav`)")
    if channels != 1:
        raise ConfigError(what, f"holds {channels} channels; the speech models take one (mix it down first)")
    samples = np.frombuffer(data, "<i2").astype(np.float32) / np.float32(32768.0)
    return samples, int(rate)
