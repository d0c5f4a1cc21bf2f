"""Gemma 4 at run time: the SWA cache mode, the bounded SWA pool's pages, and the step inputs of its extra bindings.

A Gemma 4 engine's sliding layers read their KV through ``swa_kv_page_table``; the shape-only
``swa_kv_cache_mode`` says how (``docs/edgellm-assumptions.md`` §10):

* **full** (mode length 0): the sliding layers' pools have every page of the full layers' pool and the SWA table
  is ``kv_page_table`` itself. Always possible.
* **bounded** (mode length 1): the sliding layers' pools have ``num_swa_pages`` pages; each sequence reserves
  ``2 * (ceil(W / 128) + 1) + 1`` of them at admission and its window rotates through them: logical page ``j`` of
  the sequence (tokens ``128 j ..``) is mapped in column ``j`` of its SWA table row while it is inside the
  retained range ``[(end - W) // 128, ceil(end / 128))``; pages that fall behind it are retired (unmapped, back
  to the sequence's reserve) once the step that moved past them is complete, and every page goes back to the
  pool when the sequence is released. :class:`BoundedSwaPages` keeps that book.

:func:`choose_swa_mode` picks the mode and says why full mode is forced where it is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from trtio import names
from trtio._hashing import hash_once
from trtio.config import LLMEngineConfig
from trtio.cuda._hostmem import host_view
from trtio.cuda.backend import Backend
from trtio.cuda.kernels import MAX_COPY_JOBS
from trtio.engine import EngineIO
from trtio.errors import CapacityError, ConfigError, InvalidValueError, ShapeError
from trtio.gemma4_config import Gemma4Config
from trtio.ops import Copy2D, _copy_jobs, _host_work
from trtio.stream import Stream

__all__ = ["BoundedSwaPages", "PleSplit", "SwaMode", "bound_swa_mode", "check_cached_prefix_step", "choose_swa_mode",
           "q_only_consumers", "split_ple", "swa_room"]


@dataclass(frozen=True)
class SwaMode:
    """The SWA cache mode a setup binds: ``bounded`` with ``pool_pages`` pages per sliding pool, or full (the
    sliding pools as large as the full ones); ``reason`` says why (for ``trtio plan``)."""

    bounded: bool
    pool_pages: int
    private_pages: int  # pages each bounded sequence reserves (0 in full mode)
    reason: str

    @property
    def mode_length(self) -> int:
        """The extent bound to ``swa_kv_cache_mode``: 1 bounded, 0 full."""
        return 1 if self.bounded else 0

    def describe(self) -> str:
        what = (f"bounded SWA pool ({self.pool_pages} pages, {self.private_pages} per sequence)" if self.bounded
                else f"full SWA storage (sliding layers use kv_page_table over {self.pool_pages} pages)")
        return f"{what}: {self.reason}"


def choose_swa_mode(cfg: LLMEngineConfig, max_batch: int, *, engine_mode_max: int, engine_swa_pages: tuple[int, int],
                    prefix_reuse: bool = False, spec_decode: bool = False,
                    force_full: bool = False) -> SwaMode:
    """The SWA mode for ``max_batch`` sequences of a Gemma 4 engine: bounded where the engine declares it
    (``engine_mode_max`` = the largest ``swa_kv_cache_mode`` extent its profiles take, ``engine_swa_pages`` = the
    (min, max) pages its sliding pools take), the config says the window, the budget ``max_batch x private pages``
    is below the full pool and nothing forces full mode (prefix reuse, FP8 KV, spec decode, ``force_full``)."""
    g = cfg.gemma4
    if g is None:
        raise ConfigError("gemma4", "choose_swa_mode needs a Gemma 4 config")
    full_pages = cfg.kv_pool_pages

    def full(reason: str) -> SwaMode:
        return SwaMode(False, full_pages, 0, reason)

    if not any(g.is_sliding(i) for i in range(g.num_layers)):
        return full("the model has no sliding layer")
    if force_full:
        return full("full mode was asked for")
    if engine_mode_max < 1:
        return full(f"the engine's swa_kv_cache_mode profile takes length {engine_mode_max} at most (built without "
                    "a bounded SWA pool)")
    if not g.sliding_window:
        return full("the config writes no sliding window (sliding_window_size or a sliding layer's "
                    "kv_layer_configs[i].kv_cache_capacity), so the bounded pool cannot be sized")
    if cfg.kv_cache_dtype == "float8_e4m3fn" or cfg.kv_dtype.itemsize == 1:
        return full(f"FP8 KV cache ({cfg.kv_cache_dtype}) forces full mode, as in Edge-LLM")
    if spec_decode:
        return full("speculative decoding forces full mode, as in Edge-LLM")
    if prefix_reuse:
        return full("prefix reuse (pin_prefix) forces full mode, as in Edge-LLM")
    private = g.private_pages(cfg.kv_page_size)
    budget = g.num_swa_pages or max_batch * private
    if budget < max_batch * private:
        return full(f"builder_config.num_swa_pages ({budget}) is below {max_batch} sequences x {private} pages")
    if budget >= full_pages:
        return full(f"the bounded budget ({max_batch} sequences x {private} pages = {budget}) is not below the full "
                    f"pool ({full_pages} pages)")
    lo, hi = engine_swa_pages
    if not lo <= budget <= hi:
        return full(f"the engine's sliding pools take {lo} .. {hi} pages, not the bounded budget {budget}")
    return SwaMode(True, budget, private,
                   f"window {g.sliding_window} tokens: {max_batch} sequences x {private} pages instead of "
                   f"{full_pages}")


def bound_swa_mode(cfg: LLMEngineConfig, eio: EngineIO, max_batch: int, *, bounded_ok: str = "") -> SwaMode:
    """The SWA mode a setup binds for ``eio`` (a Gemma 4 engine's declared I/O): :func:`choose_swa_mode`'s, with the
    engine's mode profile and sliding pool range; ``bounded_ok``, where not empty, says why the setup binds the full
    mode where the bounded one would fit."""
    mode_max = eio[names.kSwaKVCacheMode].max_shape()[0] if names.kSwaKVCacheMode in eio else 0
    g = cfg.gemma4
    assert g is not None
    lo, hi = cfg.kv_pool_pages, cfg.kv_pool_pages
    for i in range(g.num_layers):
        past = names.past_key_values(i)
        if g.is_sliding(i) and past in eio and eio[past].profiles:
            lo = min(lo, min(p[0][1] for p in eio[past].profiles))
            hi = max(hi, max(p[2][1] for p in eio[past].profiles))
    possible = choose_swa_mode(cfg, max_batch, engine_mode_max=mode_max, engine_swa_pages=(lo, hi))
    if possible.bounded and bounded_ok:
        return SwaMode(False, cfg.kv_pool_pages, 0, f"the engine and config allow the {possible.describe()}, but "
                                                    f"{bounded_ok}")
    return possible


def q_only_consumers(g: Gemma4Config, swa_inputs: bool) -> tuple[int, ...]:
    """The KV-sharing layers Edge-LLM 0.11's exporter gives Q only (``enable_kv_shared`` 1,
    ``models/gemma4/modeling_gemma4_text.py::forward_ragged``): every full-attention consumer, and a sliding one
    where the engine has no SWA inputs (with them, a sliding consumer gets its donor's current K/V)."""
    return tuple(i for i, d in enumerate(g.donors) if d >= 0 and (not g.is_sliding(i) or not swa_inputs))


def check_cached_prefix_step(g: Gemma4Config, swa_inputs: bool, past: np.ndarray, what: str) -> None:
    """Refuse a prefill over cached tokens (``past_lengths=`` or ``prefix=``: phase 2 with a cached prefix) on an
    engine with Q-only KV-sharing layers: Edge-LLM 0.11's AttentionPlugin rotates their queries with RoPE row
    ``past + i`` of the step's token-aligned table instead of row ``i`` (``attentionPlugin.cpp``'s shared-KV
    prefill calls ``launchApplyRopeQOnly`` with ``kvCacheEndLens``), so their logits would be wrong
    (``docs/edgellm-assumptions.md`` §10.9)."""
    layers = q_only_consumers(g, swa_inputs)
    if layers and (past > 0).any():
        raise InvalidValueError(
            f"{what}: a prefill over cached tokens (past_lengths= or prefix=) on this Gemma 4 engine would give wrong "
            f"logits: Edge-LLM 0.11's AttentionPlugin rotates the queries of its KV-sharing layers {list(layers)} (Q "
            "only) with RoPE row past + i of the step's table instead of row i (launchApplyRopeQOnly with "
            "kvCacheEndLens); prefill each prompt whole")


def swa_room(pages: BoundedSwaPages, lengths: np.ndarray) -> int:
    """Decode steps (one token each) from ``lengths`` (the cached lengths) whose SWA table rows stay as the first
    one maps them: until a sequence's retained range gains a page or loses one."""
    e = lengths.astype(np.int64) + 1
    end_change = pages.page * -(-e // pages.page) + 1
    begin_change = pages.page * (np.maximum(e - pages.window, 0) // pages.page + 1) + pages.window
    return int((np.minimum(end_change, begin_change) - e).min(initial=1 << 30))


@dataclass
class _Window:
    """One sequence's bounded SWA state (Edge-LLM's ``SwaKVCacheState``)."""

    reserve: list[int]
    bindings: deque[tuple[int, int]] = field(default_factory=deque)  # (logical page, physical page), in order
    begin: int = 0  # retained logical pages [begin, end)
    end: int = 0
    length: int = 0  # tokens the sequence has committed
    retiring: list[tuple[int, int]] = field(default_factory=list)  # unmapped once the step is complete


class BoundedSwaPages:
    """The bounded SWA pool's page ids and each slot's row of ``swa_kv_page_table`` (see module docstring).

    Host bookkeeping only: a setup calls :meth:`admit`, then per step :meth:`advance` before it stages the rows
    (:meth:`rows`) and :meth:`complete` once the step is in stream order behind the next one, and :meth:`release`.
    """

    def __init__(self, pool_pages: int, max_batch: int, *, window: int, page_size: int, pages_per_sequence: int,
                 private_pages: int) -> None:
        if pool_pages < max_batch * private_pages:
            raise CapacityError(f"bounded SWA pool: {pool_pages} pages cannot reserve {max_batch} sequences x "
                                f"{private_pages} pages")
        self.pool_pages, self.window, self.page = pool_pages, window, page_size
        self.private_pages = private_pages
        self._free = list(range(pool_pages - 1, -1, -1))
        self._slots: dict[int, _Window] = {}
        self.table = np.full((max_batch, pages_per_sequence), -1, np.int32)  # K page ids; V = K + pool_pages

    @property
    def free(self) -> int:
        """Pages no sequence reserves."""
        return len(self._free)

    def held(self, slot: int) -> int:
        """Pages ``slot`` holds: mapped, reserved and retiring (always :attr:`private_pages` while admitted)."""
        w = self._slots[slot]
        return len(w.bindings) + len(w.reserve) + len(w.retiring)

    def mapped(self, slot: int) -> dict[int, int]:
        """Logical page -> physical page of ``slot``'s retained window."""
        return dict(self._slots[slot].bindings)

    def __contains__(self, slot: object) -> bool:
        return slot in self._slots

    def admit(self, slot: int) -> None:
        """Reserve ``slot``'s private pages; :class:`CapacityError` (nothing changed) where the pool is short."""
        if not 0 <= slot < self.table.shape[0]:
            raise InvalidValueError(f"bounded SWA pool: slot {slot} is outside 0 .. {self.table.shape[0] - 1}")
        if slot in self._slots:
            raise InvalidValueError(f"bounded SWA pool: slot {slot} is already admitted")
        if len(self._free) < self.private_pages:
            raise CapacityError(f"bounded SWA pool: slot {slot} needs {self.private_pages} pages, {len(self._free)} of "
                                f"{self.pool_pages} are free")
        self._slots[slot] = _Window([self._free.pop() for _ in range(self.private_pages)])
        self.table[slot] = -1

    def advance(self, slot: int, new_length: int) -> None:
        """Map the logical pages of ``slot``'s retained range for ``new_length`` committed tokens (the step about to
        run writes up to there); pages falling behind the range wait in ``retiring`` until :meth:`complete`."""
        w = self._slots[slot]
        self.complete(slot)
        if new_length < w.length:
            raise InvalidValueError(f"bounded SWA pool: slot {slot} cannot move back from {w.length} to "
                                    f"{new_length} tokens")
        if new_length == w.length:
            return
        end = -(-new_length // self.page)
        begin = max(0, new_length - self.window) // self.page
        if end > self.table.shape[1]:
            raise CapacityError(f"bounded SWA pool: slot {slot} at {new_length} tokens needs logical page {end - 1}, "
                                f"past the {self.table.shape[1]} pages of a page-table row")
        while w.bindings and w.bindings[0][0] < begin:
            w.retiring.append(w.bindings.popleft())
        have = {logical for logical, _ in w.bindings}
        for logical in range(begin, end):
            if logical in have:
                continue
            if not w.reserve:
                raise CapacityError(f"bounded SWA pool: slot {slot} has no reserved page left for logical page "
                                    f"{logical} ({self.private_pages} per sequence)")
            page = w.reserve.pop()
            w.bindings.append((logical, page))
            self.table[slot, logical] = page
        w.begin, w.end, w.length = begin, end, new_length

    def complete(self, slot: int) -> None:
        """The step that moved past ``slot``'s retiring pages is complete (in stream order before any later step):
        unmap them and give them back to the slot's reserve."""
        w = self._slots[slot]
        for logical, page in w.retiring:
            self.table[slot, logical] = -1
            w.reserve.append(page)
        w.retiring.clear()

    def release(self, slot: int) -> None:
        """Every page of ``slot`` back to the pool; its row unmapped."""
        w = self._slots.pop(slot)
        self._free.extend([p for _, p in w.bindings] + w.reserve + [p for _, p in w.retiring])
        self.table[slot] = -1

    def rows(self, slots: Sequence[int] | np.ndarray) -> np.ndarray:
        """int32 ``[len(slots), 2, M]``: each slot's K page ids and V page ids (K + pool pages), -1 unmapped."""
        k = self.table[np.asarray(slots, np.int64)]
        return np.stack([k, np.where(k >= 0, k + self.pool_pages, -1)], axis=1).astype(np.int32)


def split_ple(ple_embeds: np.ndarray, g: Gemma4Config) -> list[np.ndarray]:
    """``ple_embeds`` ``[..., L * ple_hidden]`` as the L per-layer inputs (columns ``i * ple_hidden ..``)."""
    width = g.ple_layers * g.ple_hidden
    if ple_embeds.shape[-1] != width:
        raise ShapeError(f"ple_embeds: expected {width} columns ({g.ple_layers} layers x {g.ple_hidden}), got "
                                f"shape {tuple(ple_embeds.shape)}")
    return [ple_embeds[..., i * g.ple_hidden:(i + 1) * g.ple_hidden] for i in range(g.ple_layers)]


@hash_once
@dataclass(frozen=True)
class PleSplit:
    """A step's per-layer embeddings ``[rows, L x width]`` (device address ``src``) split into the layers' inputs
    (``dsts``, each ``[rows, width]``): on the cuda backend one copy kernel per :data:`MAX_COPY_JOBS` layers (a
    launch takes that many copies), one host work elsewhere. Bytes: ``width`` per layer row."""

    backend: Backend
    dsts: tuple[int, ...]
    src: int
    width: int
    rows: int

    def enqueue(self, stream: Stream) -> None:
        be, w, n, pitch = self.backend, self.width, self.rows, self.width * len(self.dsts)
        if be.name == "cuda":
            jobs = tuple(Copy2D(be, d, w, self.src + i * w, pitch, w, n).job() for i, d in enumerate(self.dsts))
            for first in range(0, len(jobs), MAX_COPY_JOBS):
                _copy_jobs(be, jobs[first:first + MAX_COPY_JOBS])(stream.handle)
            return
        src, dsts = self.src, self.dsts

        def run() -> None:
            rows = host_view(src, n * pitch).reshape(n, len(dsts), w)
            for i, d in enumerate(dsts):
                host_view(d, n * w).reshape(n, w)[:] = rows[:, i]

        _host_work(be, stream, run)
