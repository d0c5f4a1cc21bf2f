"""Test helper: the real Qwen3-ASR export of the parity fixture (``tests/fixtures/parity/qwen3-asr``) laid out as an
Edge-LLM 0.11 engine directory, as the builder writes it: ``config.json`` and ``audio/config.json`` with the
builder's ``builder_config`` (the fixture's ``builder_config.json``, completed as the builder completes it),
``audio/preprocessor_config.json``, ``embedding.safetensors``, a ``tokenizer.json`` and empty engine files; and a
stand-in for :func:`trtio.load_engine` giving each engine file its exported ONNX graph (an
:class:`~trtio.testing.OnnxEngine`): NVIDIA's real graphs, run on the host.

The tokenizer is a word-level one over the fixture's 512 ids (``t0`` .. ``t511``): the checkpoint is random and has
none, and a prompt ``"t475 t357 ..."`` is then exactly the fixture's prompt ids.
"""

from __future__ import annotations

import json
import shutil
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests._parity import Case
from trtio.errors import UnknownNameError
from trtio.testing import OnnxEngine

CASE = "qwen3-asr"


def word_tokenizer(vocab: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return tok


def asr_directory(root: Path, case: Case | None = None) -> Path:
    """Write the directory at ``root`` (see the module docstring); returns ``root``."""
    case = case or Case(CASE)
    llm = OnnxEngine.from_export(case.root / "llm", case.builder["llm"]).config
    audio = OnnxEngine.from_export(case.root / "audio", case.builder["audio"]).config
    (root / "audio").mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(llm, indent=2))
    (root / "audio" / "config.json").write_text(json.dumps(audio, indent=2))
    shutil.copy(case.root / "audio" / "preprocessor_config.json", root / "audio")
    shutil.copy(case.root / "llm" / "embedding.safetensors", root)
    word_tokenizer(int(llm["vocab_size"])).save(str(root / "tokenizer.json"))
    (root / "llm.engine").write_bytes(b"")
    (root / "audio" / "audio_encoder.engine").write_bytes(b"")
    return root


def onnx_loader(root: Path, case: Case | None = None, loaded: list[str] | None = None,
                backend: str = "host") -> Callable[..., Any]:
    """A stand-in for ``load_engine`` (patch ``trtio._setups.engine_dir.load_engine``): ``llm.engine`` and
    ``audio/audio_encoder.engine`` of ``root`` give the export's graphs (their tensors on ``backend``); the names
    loaded are appended to ``loaded``."""
    case = case or Case(CASE)
    roles = {root / "llm.engine": "llm", root / "audio" / "audio_encoder.engine": "audio"}

    def load(path: Any, module: Any = "auto", *, plugins: Any = ()) -> Any:
        role = roles.get(Path(path))
        if role is None:
            raise UnknownNameError(f"{path} is not an engine of {root}")
        if loaded is not None:
            loaded.append(role)
        return case.engine(role, backend)

    return load


def write_wav(path: Path, pcm: np.ndarray, rate: int) -> Path:
    """``pcm`` (int16) as a 16-bit mono WAV file."""
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(np.asarray(pcm, "<i2").tobytes())
    return path
