"""create_for_audio: an audio encoder (Edge-LLM 0.11's ``audio/audio_encoder.engine``: Qwen3-ASR, Qwen3-Omni's audio
encoder) bound to worst-case buffers, and its one step, :meth:`AudioSetup.encode`.

The engine's I/O, as Edge-LLM's exporter writes it (``QwenAudioEncoder``, no plugins) and its runner binds it
(``cpp/multimodal/qwen3_omni/audioRunner.cpp``, ``encodeClip``):

* ``padded_feature`` float16 ``[chunks, 128, 2 * n_window]``: the clip's log-mel chunk by chunk;
* ``padded_mask_after_cnn_indices`` int64 ``[N, 2]``: (chunk, row) of each row kept after the convolutions;
* ``attention_mask`` float16 ``[N, N]``: 0 within an attention window, -65504 across;
* ``cu_seqlens`` / ``kv_lengths`` int32 ``[2]`` where the engine declares them (a TensorRT-attention export):
  ``[0, N]`` both, the runner's one sequence;
* output ``last_hidden_state`` float16 ``[N, output_dim]``: the rows that replace the prompt's audio tokens.

Every buffer is allocated once, for the config's caps (``builder_config.max_time_steps`` mel frames: whole chunks
of ``2 * n_window``, 13 rows each). An encode checks the features against the caps first (a refusal names the
input and changes nothing), uploads the four inputs through fenced pinned rings, binds the engine for the clip's
chunks and rows and runs it (one CUDA graph per clip shape where ``graphs=True``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Set
from typing import Any

import numpy as np

from trtio._cuda.backend import Backend
from trtio._dims import InferenceDims
from trtio._dtypes import DType
from trtio._memory import Arena, TensorRequest
from trtio._registry import ProfileShapes, TensorRegistry, TensorSpec
from trtio._setups.binding import engine_io
from trtio._setups.calls import one_thread
from trtio._staging import UploadRing
from trtio._stream import StreamLike, as_stream
from trtio._tensor import Tensor
from trtio.components.audio.audio_config import AudioConfig
from trtio.components.audio.audio_features import AudioFeatures
from trtio.components.encoder_setup import EncoderSetup
from trtio.errors import CapacityError, InvalidTypeError, InvalidValueError, ShapeError

__all__ = ["AUDIO_INPUTS", "AudioSetup", "audio_registry", "create_for_audio", "kAudioOutput"]

# Edge-LLM's binding names (cpp/common/bindingNames.h: kAudioPaddedFeatures, kAudioPaddedMaskIndices,
# kAudioAttentionMask, kAudioOutput, kCuSeqlens, kKvLengths).
kAudioPaddedFeature = "padded_feature"
kAudioPaddedMaskIndices = "padded_mask_after_cnn_indices"
kAudioAttentionMask = "attention_mask"
kAudioOutput = "last_hidden_state"
kCuSeqlens = "cu_seqlens"
kKvLengths = "kv_lengths"
#: The inputs every audio encoder takes (``cu_seqlens`` / ``kv_lengths`` are bound where declared).
AUDIO_INPUTS = (kAudioPaddedFeature, kAudioPaddedMaskIndices, kAudioAttentionMask)
_SEQLENS = (kCuSeqlens, kKvLengths)
_SLOTS = 2  # encodes the host may run ahead of the uploads of their inputs


def audio_registry(cfg: AudioConfig, declared: Set[str] = frozenset()) -> TensorRegistry:
    """Every binding an audio encoder of ``cfg`` declares (``cu_seqlens`` / ``kv_lengths`` where ``declared``
    names them), with its dtype, symbolic shape (``audio_chunks``, ``audio_tokens`` of
    :class:`~trtio._dims.InferenceDims`) and the one profile Edge-LLM's builder gives it
    (``_setup_component_profile``, the audio component: chunks ``ceil(min_time_steps / chunk) ..
    ceil(max_time_steps / chunk)``, rows from that minimum up to 13 a chunk)."""
    lo, hi = cfg.min_chunks, cfg.max_chunks
    mel, chunk, top = cfg.num_mel_bins, cfg.chunk_frames, cfg.max_tokens

    def span(shape: tuple[int | str, ...], low: int, high: int) -> tuple[ProfileShapes]:
        def at(v: int) -> tuple[int, ...]:
            return tuple(v if isinstance(d, str) else d for d in shape)
        return ((at(low), at((low + high) // 2), at(high)),)

    f16, i32, i64 = DType.FLOAT16, DType.INT32, DType.INT64
    specs = [
        TensorSpec(kAudioPaddedFeature, "input", f16, ("audio_chunks", mel, chunk),
                   profiles=span(("audio_chunks", mel, chunk), lo, hi)),
        TensorSpec(kAudioPaddedMaskIndices, "input", i64, ("audio_tokens", 2),
                   profiles=span(("audio_tokens", 2), lo, top)),
        TensorSpec(kAudioAttentionMask, "input", f16, ("audio_tokens", "audio_tokens"),
                   profiles=span(("audio_tokens", "audio_tokens"), lo, top)),
    ]
    specs += [TensorSpec(name, "input", i32, (2,), profiles=(((2,), (2,), (2,)),), optional=True, declared=(-1,))
              for name in _SEQLENS if name in declared]
    specs.append(TensorSpec(kAudioOutput, "output", f16, ("audio_tokens", cfg.output_dim)))
    return TensorRegistry("audio", specs, contract="audio")


class AudioSetup(EncoderSetup):
    """An audio encoder bound to its worst-case buffers (see module docstring); build it with
    :func:`create_for_audio`. ``cfg``, ``executor``, ``tensor_map`` and ``registry`` are public views.

    Streams: :meth:`encode` runs on ``stream`` (None: the calling thread's trtio default stream); encodes run in
    call order whatever streams they are given. Follows trtio's close protocol."""

    FACTORY = "create_for_audio"
    WHAT = "audio"

    def __init__(self, engine: Any, cfg: AudioConfig, stream: StreamLike = None, *, graphs: bool = False,
                 backend: Backend | str | None = None) -> None:
        if not isinstance(cfg, AudioConfig):
            raise InvalidTypeError(f"create_for_audio: cfg must be an AudioConfig (EngineDir.audio_config, or "
                                   f"AudioConfig.from_dir), got {type(cfg).__name__}")
        self.cfg = cfg
        registry = audio_registry(cfg, {n for n in _SEQLENS if n in engine_io(engine, self.FACTORY)})
        self._seqlens = tuple(n for n in _SEQLENS if n in registry)
        inputs = [s for s in registry if s.is_input]
        worst = {s.name: s.profiles[0][2] for s in inputs}
        requests = [TensorRequest.of(s.name, worst[s.name], s.dtype) for s in inputs]
        requests += [UploadRing.request(f"host_{s.name}", worst[s.name], s.dtype, slots=_SLOTS) for s in inputs]
        requests.append(TensorRequest.of(kAudioOutput, (cfg.max_tokens, cfg.output_dim), DType.FLOAT16))

        def staging(stack: contextlib.ExitStack, arena: Arena, be: Backend) -> None:
            self._rings = {spec.name: stack.enter_context(UploadRing(arena[f"host_{spec.name}"], be, slots=_SLOTS,
                                                                     title=f"{spec.name} staging"))
                           for spec in inputs}

        self._bind(engine, registry, requests, stream, graphs=graphs, backend=backend, staging=staging)
        self._output = self._arena[kAudioOutput]

    # -- the step ----------------------------------------------------------------------------------
    @one_thread
    def encode(self, features: AudioFeatures, stream: StreamLike = None) -> Tensor:
        """Run the encoder over one clip's ``features`` (:func:`trtio.audio.preprocess`); returns its rows
        (float16 ``[N, output_dim]``, N = ``features.tokens``), a view of the setup's output buffer written on the
        encode's stream, valid until the next encode overwrites it (splice it into the prompt, or copy it, first).

        Refused before any work, naming the input: features of another config's mel bins or chunk size, more
        chunks or rows than the engine's profile takes (CapacityError), fewer than its minimum, or inputs that
        disagree with each other. Nothing is allocated; the host never waits for the device (except where it runs
        two encodes ahead of the uploads)."""
        self._check_open()
        values = self._checked(features)
        s = as_stream(stream, self._backend)
        self._calls.stream(s)
        for name, v in values.items():
            self._rings[name].upload(v, self._arena[name], s, reshape=False)
        dims = InferenceDims(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, audio_chunks=features.chunks,
                             audio_tokens=features.tokens)
        ex = self.executor
        ex.prepare(0, self.tensor_map, dims, s)
        ex.execute(s)
        return self._output

    def _checked(self, features: AudioFeatures) -> dict[str, np.ndarray]:
        """The engine's input values of ``features``, checked against the config and the engine's caps."""
        if not isinstance(features, AudioFeatures):
            raise InvalidTypeError(f"encode: features must be AudioFeatures (trtio.audio.preprocess), got "
                                   f"{type(features).__name__}")
        cfg = self.cfg
        mel, width = features.input_features.shape
        if mel != cfg.num_mel_bins or features.chunk_frames != cfg.chunk_frames or \
                width != features.chunks * cfg.chunk_frames:
            raise ShapeError(f"features: {mel} mel bins in chunks of {features.chunk_frames} frames "
                             f"({width} frames); this encoder takes {cfg.num_mel_bins} bins in chunks of "
                             f"{cfg.chunk_frames} (2 x n_window)")
        chunks, n = features.chunks, features.tokens
        if not cfg.min_chunks <= chunks <= cfg.max_chunks:
            raise CapacityError(f"features: {chunks} chunks of {cfg.chunk_frames} mel frames; the audio engine takes "
                                f"{cfg.min_chunks}..{cfg.max_chunks} (builder_config min_time_steps "
                                f"{cfg.min_time_steps}, max_time_steps {cfg.max_time_steps})")
        if not cfg.min_chunks <= n <= cfg.max_tokens:
            raise CapacityError(f"features: {n} encoder rows; the audio engine takes {cfg.min_chunks}.."
                                f"{cfg.max_tokens}")
        if features.indices.shape != (n, 2) or features.attention_mask.shape != (n, n) or \
                int(features.chunk_tokens.sum()) != n:
            raise ShapeError(f"features: {n} rows by padded_mask_after_cnn_indices, attention_mask "
                             f"{list(features.attention_mask.shape)}, chunk rows summing to "
                             f"{int(features.chunk_tokens.sum())}: the arrays disagree (build them with "
                             f"trtio.audio.preprocess)")
        with np.errstate(over="ignore"):  # an overflow is refused just below
            feature = features.padded_feature.astype(np.float16)
        if not np.isfinite(feature).all():
            raise InvalidValueError("features: log-mel values float16 cannot hold")
        values = {kAudioPaddedFeature: feature, kAudioPaddedMaskIndices: features.indices,
                  kAudioAttentionMask: features.attention_mask}
        lengths = np.array([0, n], np.int32)
        values.update({name: lengths for name in self._seqlens})
        return values


def create_for_audio(engine: Any, cfg: AudioConfig, stream: StreamLike = None, *, graphs: bool = False,
                     backend: Backend | str | None = None) -> AudioSetup:
    """Bind an audio encoder engine (Qwen3-ASR, Qwen3-Omni's audio encoder) to its worst-case buffers; see
    :class:`AudioSetup`. Its declared I/O is checked against ``cfg`` first (names, dtypes, ranks, fixed dims, the
    profile against the config's caps: one BindingError lists every problem). Construction runs on ``stream``
    and ends synchronised."""
    return AudioSetup(engine, cfg, stream, graphs=graphs, backend=backend)
