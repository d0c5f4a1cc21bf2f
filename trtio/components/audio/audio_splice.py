"""The audio encoder's rows spliced into a prompt: each ``<|audio_pad|>`` expanded into its clip's rows
(:func:`expand_audio_pads`), the prompt's embeddings with the rows written over those tokens (:func:`splice`), and
the positions Edge-LLM gives audio + text (:class:`AudioPrompt`).

* **Expansion.** A tokenized prompt holds one ``audio_token_id`` pad per clip, between the chat template's
  ``<|audio_start|>`` and ``<|audio_end|>``; pad ``i`` becomes clip ``i``'s N rows of pads (Edge-LLM's
  ``Qwen3OmniAudioRunner::textPreprocess``; Hugging Face's processor writes the same ``N x <|audio_pad|>``). The
  markers stay as the template wrote them.
* **Splice.** The expanded prompt's tokens are looked up in the LLM's embedding table and the audio tokens' rows
  replaced by the encoder's, clip after clip in order (Hugging Face's ``masked_scatter`` of the audio features;
  Edge-LLM's multimodal indices into the runner's embedding buffer).
* **Positions.** Audio rows and text alike take the next sequential position: ``0 .. L - 1``, the same on all three
  MRoPE axes (Edge-LLM's ``initializeSequentialMRopeCache``; Hugging Face's Qwen3-ASR runs a 1-D RoPE text model on
  ``arange(L)``): no position delta. An MRoPE LLM setup writes exactly these rows for a prefill given no
  ``mrope_positions`` (a text prompt's rows); :attr:`AudioPrompt.mrope_positions` gives them explicitly.

Edge-LLM's runner takes one clip per request; the splice takes any number (a prompt of several clips is spliced as
Hugging Face splices it). Host-side numpy, except where a device Tensor of encoder rows is read (a synchronising
copy on ``stream``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._stream import StreamLike
from trtio.components.audio.audio_config import AudioConfig
from trtio.components.splice_checks import checked_ids, embedding_table
from trtio.errors import ShapeError

__all__ = ["AudioPrompt", "expand_audio_pads", "splice"]


@dataclass(frozen=True)
class AudioPrompt:
    """Prompts with their clips spliced in, shaped for an LLM setup's prefill (batch ``B``, longest prompt ``S``,
    hidden ``H``; shorter prompts right-padded with zeros): ``setup.prefill(p.inputs_embeds, p.context_lengths)``.

    ``token_ids`` ``[B, S]`` (audio pads expanded), ``inputs_embeds`` ``[B, S, H]``, ``positions`` int64 ``[B, S]``
    (each token's sequential position), ``context_lengths`` int64 ``[B]``. Host arrays owned by the object."""

    token_ids: np.ndarray
    inputs_embeds: np.ndarray
    positions: np.ndarray
    context_lengths: np.ndarray

    @property
    def mrope_positions(self) -> np.ndarray:
        """int64 ``[3, B, S]``: ``positions`` on all three MRoPE axes (for an MRoPE LLM's
        ``prefill(..., mrope_positions=)``)."""
        return np.ascontiguousarray(np.broadcast_to(self.positions[None], (3, *self.positions.shape)))

    @property
    def rope_deltas(self) -> np.ndarray:
        """int64 ``[B]``: each sequence's MRoPE position delta, 0 (audio counts one position a row)."""
        return np.zeros(self.positions.shape[0], np.int64)

    @classmethod
    def stack(cls, prompts: Sequence[AudioPrompt]) -> AudioPrompt:
        """Several prompts as one batch (each one's rows first, zeros after)."""
        if not prompts:
            raise ShapeError("AudioPrompt.stack: no prompts")
        hidden = {p.inputs_embeds.shape[2] for p in prompts}
        if len(hidden) != 1:
            raise ShapeError(f"AudioPrompt.stack: prompts of hidden sizes {sorted(hidden)}; a batch has one")
        b = sum(p.token_ids.shape[0] for p in prompts)
        s = max(p.token_ids.shape[1] for p in prompts)
        (h,) = hidden
        ids = np.zeros((b, s), np.int64)
        embeds = np.zeros((b, s, h), prompts[0].inputs_embeds.dtype)
        positions = np.zeros((b, s), np.int64)
        row = 0
        for p in prompts:
            n, width = p.token_ids.shape
            ids[row:row + n, :width] = p.token_ids
            embeds[row:row + n, :width] = p.inputs_embeds
            positions[row:row + n, :width] = p.positions
            row += n
        return cls(ids, embeds, positions, np.concatenate([p.context_lengths for p in prompts]))


def expand_audio_pads(token_ids: Any, tokens: Sequence[int], cfg: AudioConfig) -> np.ndarray:
    """``token_ids`` (int ``[L]``, one ``audio_token_id`` pad per clip, as a tokenizer gives it) with pad ``i``
    repeated ``tokens[i]`` times (clip ``i``'s encoder rows). ShapeError when the pads and the clips do not pair
    up."""
    ids = _token_ids(token_ids)
    counts = [int(n) for n in tokens]
    pads = np.flatnonzero(ids == cfg.audio_token_id)
    if pads.size != len(counts):
        raise ShapeError(f"token_ids: {pads.size} audio pad(s) (token {cfg.audio_token_id}) for {len(counts)} "
                         f"clip(s); a prompt holds one pad per clip (expand_audio_pads expands it)")
    if any(n < 1 for n in counts):
        raise ShapeError(f"tokens: {counts}; each clip has at least one encoder row")
    repeat = np.ones(ids.shape[0], np.int64)
    repeat[pads] = counts
    return np.repeat(ids, repeat)


def splice(token_ids: Any, cfg: AudioConfig, embedding: Any, audio_embeds: Any = None,
           stream: StreamLike = None) -> AudioPrompt:
    """One prompt with its clips spliced in (an :class:`AudioPrompt` of batch 1; see the module docstring).

    ``token_ids``: the tokenized prompt, one ``audio_token_id`` pad per clip; ``embedding``: the LLM's token
    embedding table ``[vocab, hidden]`` (host array); ``audio_embeds``: the encoder's rows of each clip, in the
    order of the pads: one ``[N, hidden]`` array or Tensor (what :meth:`AudioSetup.encode
    <trtio.components.audio.audio_setup.AudioSetup.encode>` returns) for one clip, a sequence of them for several, None
    for a prompt without audio. Device tensors are read with a synchronising copy on ``stream`` (the stream
    ``encode`` ran on). The rows come out in the embedding table's dtype."""
    clips: list[Any]
    if audio_embeds is None:
        clips = []
    elif isinstance(audio_embeds, (list, tuple)):
        clips = list(audio_embeds)
    else:
        clips = [audio_embeds]
    table = embedding_table(embedding, cfg.output_dim, "the audio encoder's rows have output_dim")
    vocab, hidden = table.shape
    rows = [_rows(c, f"audio_embeds[{i}]", hidden, stream) for i, c in enumerate(clips)]
    ids = expand_audio_pads(token_ids, [r.shape[0] for r in rows], cfg)
    checked_ids(ids, vocab)
    embeds = table[ids].copy()
    if rows:
        embeds[ids == cfg.audio_token_id] = np.concatenate(rows).astype(embeds.dtype)
    n = ids.shape[0]
    return AudioPrompt(ids[None], embeds[None], np.arange(n, dtype=np.int64)[None], np.array([n], np.int64))


def _token_ids(token_ids: Any) -> np.ndarray:
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.shape[0] < 1 or ids.dtype.kind not in "iu":
        raise ShapeError(f"token_ids: expected a non-empty 1-D sequence of integer token ids, got {ids.dtype} "
                         f"{list(ids.shape)}")
    return ids.astype(np.int64)


def _rows(x: Any, what: str, hidden: int, stream: StreamLike) -> np.ndarray:
    """``[N, hidden]`` rows from a host array or a device Tensor (read with a synchronising copy)."""
    arr: np.ndarray = x.to_numpy(stream) if hasattr(x, "to_numpy") else np.asarray(x)
    if arr.ndim != 2 or arr.shape[1] != hidden or arr.shape[0] < 1 or arr.dtype.kind != "f":
        raise ShapeError(f"{what}: expected [N, {hidden}] float rows (a clip's encoder rows), got {arr.dtype} "
                         f"{list(arr.shape)}")
    return arr
