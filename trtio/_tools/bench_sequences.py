"""``trtio bench --sequences``: what sequences that come and go cost, beside today's whole-batch steps.

One null-compute LLM of 8B-class scale on the ragged contract (the bench's: 36 layers, 8 slots, KV capacity
4096, pages of 128 tokens; :func:`trtio._tools.bench.configs`), CUDA graphs on, measured side by side in one
run, in rounds that alternate the two ways so a drift of the machine's speed hits both alike:

* **decode**: a decode of the 8 slots after admissions and releases (sequences admitted one or two at a time
  into scattered slots while the others decode, two released and their slots taken again, so every
  sequence's pages sit somewhere else in the pool) against a decode of a batch prefilled whole (target: at
  most 1.2x), and the device operations each enqueues (they must be the same);
* **admission**: ``prefill(..., slots=[s])`` of a 16-token prompt while 7 other sequences are active against
  a whole-batch ``prefill`` of the same prompt, the cheaper of a restart that ends 7 sequences and one that
  ends 1 (target: at most 30 µs more);
* **release** and **pin_prefix** (and ``Prefix.release``): host time (target: at most 20 µs each) and the
  host synchronisations they make (counted by the backend: there must be none).

* **hybrid**: the same on a Qwen3.5-like hybrid of that scale (27 Gated-DeltaNet layers and 9 attention layers,
  recurrent states of 16 heads x 128 x 128 FP32 per slot and layer): a decode of the 8 slots after admissions and
  releases against a whole-batch decode (target: at most 1.2x), and the host time the zeroing of an admitted slot's
  recurrent states adds to its prefill (the device work an admission enqueues before the engine: target at most
  5 µs).

Each figure is the median host time of one call, alone and followed by a stream synchronisation; device
operations and host synchronisations are counted by the backend around the call alone. Every call is timed
right after a decode step, as a server makes it (back to back, the same calls find the CPU's caches warm and
take less).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._config import KVLayerConfig, LLMEngineConfig
from trtio._cuda.backend import Backend
from trtio._setups import LLMSetup, create_for_llm
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio._tools.bench import BATCH, HIDDEN, bench_backend, configs, default_kv_capacity, device_tensor, null_engine
from trtio.families.hybrid.hybrid_config import HybridConfig

__all__ = ["SeqRow", "SequenceResults", "format_sequences", "run_sequences"]

PROMPT = 16  # tokens per prompt
DECODE_TARGET = 1.2  # a decode after admissions and releases, against a whole-batch decode
ADMIT_TARGET_US = 30.0  # an admission's host time over a whole-batch prefill's
HOST_TARGET_US = 20.0  # release and pin_prefix
ADMISSION_ORDER = (5, 2, 7, 0, 3, 6, 1, 4)  # the slots, in the order sequences are admitted
RELEASED = (2, 5)  # released after that, and taken again
SLOT = 5  # the slot admissions, releases and prefixes are measured on, the 7 others active

DECODE_WHOLE = "LLMSetup.decode, a batch of 8 prefilled whole"
DECODE_CHURNED = "LLMSetup.decode, 8 slots after admissions and releases"
PREFILL_WHOLE_7 = "LLMSetup.prefill, 16 tokens, the batch of 7 restarted (slots=None)"
PREFILL_WHOLE = "LLMSetup.prefill, 16 tokens, a batch of 1 restarted (slots=None)"
PREFILL_ADMIT = "LLMSetup.prefill(slots=[s]), 16 tokens, 7 others active"
RELEASE = "LLMSetup.release([s]), 7 others active"
PIN = "LLMSetup.pin_prefix(s, 16)"
UNPIN = "Prefix.release()"
HYBRID_WHOLE = "hybrid LLMSetup.decode, a batch of 8 prefilled whole"
HYBRID_CHURNED = "hybrid LLMSetup.decode, 8 slots after admissions and releases"
HYBRID_ZERO = "hybrid admission: one slot's recurrent states zeroed (27 layers)"
ZERO_TARGET_US = 5.0  # the host time an admission's state zeroing adds


@dataclass(frozen=True)
class SeqRow:
    """One call's medians: host µs alone and followed by a sync, device operations and host syncs per call
    (NaN where the backend does not count operations)."""

    alone: float
    synced: float
    ops: float
    syncs: float


@dataclass(frozen=True)
class SequenceResults:
    """Every call's row, and the targets read from them."""

    rows: dict[str, SeqRow]
    kv_capacity: int
    page_size: int
    pool_pages: int

    @property
    def decode_ratio(self) -> float:
        return self.rows[DECODE_CHURNED].synced / self.rows[DECODE_WHOLE].synced

    @property
    def admit_extra_us(self) -> float:
        """An admission's time over the cheaper whole-batch prefill (a restart ending 7 sequences or 1)."""
        whole = min(self.rows[PREFILL_WHOLE].synced, self.rows[PREFILL_WHOLE_7].synced)
        return self.rows[PREFILL_ADMIT].synced - whole

    @property
    def hybrid_decode_ratio(self) -> float:
        return self.rows[HYBRID_CHURNED].synced / self.rows[HYBRID_WHOLE].synced

    @property
    def ops_unchanged(self) -> bool | None:
        """Whether a decode after admissions and releases enqueues what a whole-batch one does (None: not
        counted on this backend)."""
        a, b = self.rows[DECODE_CHURNED].ops, self.rows[DECODE_WHOLE].ops
        return None if math.isnan(a) else a == b

    def targets(self) -> list[dict[str, Any]]:
        """Each target: what, the figure, the limit and whether it is met."""
        out: list[dict[str, Any]] = [
            {"what": "decode after admissions and releases / whole-batch decode", "value": self.decode_ratio,
             "unit": "x", "limit": DECODE_TARGET, "met": self.decode_ratio <= DECODE_TARGET},
            {"what": "admission prefill - the cheaper whole-batch prefill of the same prompt",
             "value": self.admit_extra_us,
             "unit": "us", "limit": ADMIT_TARGET_US, "met": self.admit_extra_us <= ADMIT_TARGET_US},
        ]
        for name in (RELEASE, PIN):
            row = self.rows[name]
            out.append({"what": f"{name}: host time, no sync", "value": row.alone, "unit": "us",
                        "limit": HOST_TARGET_US, "met": row.alone <= HOST_TARGET_US and row.syncs == 0})
        out += [
            {"what": "hybrid: decode after admissions and releases / whole-batch decode",
             "value": self.hybrid_decode_ratio, "unit": "x", "limit": DECODE_TARGET,
             "met": self.hybrid_decode_ratio <= DECODE_TARGET},
            {"what": f"{HYBRID_ZERO}: host time, no sync", "value": self.rows[HYBRID_ZERO].alone, "unit": "us",
             "limit": ZERO_TARGET_US,
             "met": self.rows[HYBRID_ZERO].alone <= ZERO_TARGET_US and self.rows[HYBRID_ZERO].syncs == 0},
        ]
        unchanged = self.ops_unchanged
        if unchanged is not None:
            out.append({"what": "device operations per decode step, unchanged", "value": self.rows[DECODE_CHURNED].ops,
                        "unit": "ops", "limit": self.rows[DECODE_WHOLE].ops, "met": unchanged})
        return out

    def to_dict(self) -> dict[str, Any]:
        def number(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {"kv_capacity": self.kv_capacity, "page_size": self.page_size, "pool_pages": self.pool_pages,
                "rows": {name: {"us_per_call": r.alone, "us_per_call_synced": r.synced, "device_ops": number(r.ops),
                                "host_syncs": r.syncs} for name, r in self.rows.items()},
                "targets": self.targets()}


class _Clock:
    """Per call: host time alone and followed by a sync; device operations and host syncs of the call alone."""

    def __init__(self, backend: Backend, stream: Stream) -> None:
        self.backend, self.stream = backend, stream
        self.samples: dict[str, list[tuple[float, float, int, int]]] = {}

    def __call__(self, name: str, fn: Callable[[], object]) -> Any:
        be = self.backend
        ops, syncs = getattr(be, "op_count", 0), be.sync_count
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        d_ops, d_syncs = getattr(be, "op_count", 0) - ops, be.sync_count - syncs
        self.stream.synchronize()
        t2 = time.perf_counter()
        self.samples.setdefault(name, []).append((t1 - t0, t2 - t0, d_ops, d_syncs))
        return out

    def row(self, name: str) -> SeqRow:
        alone, synced, ops, syncs = zip(*self.samples[name])
        counted = getattr(self.backend, "op_count", None) is not None
        return SeqRow(statistics.median(alone) * 1e6, statistics.median(synced) * 1e6,
                      float(statistics.median(ops)) if counted else float("nan"), float(max(syncs)))


def _untimed(name: str, fn: Callable[[], object]) -> Any:
    return fn()


def _churn(setup: LLMSetup, one: Tensor, step: Callable[[], object]) -> None:
    """Leave every slot active after admissions and releases: sequences admitted one at a time into scattered
    slots with a decode between, then two released and their slots taken again."""
    setup.reset()
    for slot in ADMISSION_ORDER:
        setup.prefill(one, [PROMPT], slots=[slot])
        step()
    setup.release(list(RELEASED))
    step()
    for slot in RELEASED:
        setup.prefill(one, [PROMPT], slots=[slot])


def run_sequences(backend_kind: str = "host", *, steps: int = 200,
                  kv_capacity: int | None = None) -> SequenceResults:
    """Measure (module docstring) on the backend ``backend_kind`` (host, cuda or dry-run): ``steps`` decode
    steps of each kind, and as many admissions, releases and whole-batch prefills."""
    backend = bench_backend(backend_kind)
    kv = kv_capacity or default_kv_capacity(backend)
    llm, _ = configs("ragged", kv)
    rng = np.random.default_rng(2)
    stream = Stream.create(backend)
    per_round = min(steps, 25)
    rounds = -(-steps // per_round)
    try:
        clock = _Clock(backend, stream)
        with create_for_llm(null_engine(llm, backend), llm, stream, graphs=True, backend=backend) as setup, \
                device_tensor(backend, (BATCH, PROMPT, HIDDEN), rng) as prompts, \
                device_tensor(backend, (1, PROMPT, HIDDEN), rng) as one:
            setup.state.reset(stream, clear=True)  # touch the caches once: page faults are not step cost
            embeds = setup.io.inputs_embeds  # a runtime writes the step's embeddings in place: no copy

            def decode() -> object:
                return setup.decode(embeds.reshape((setup.batch or 1, 1, HIDDEN)))

            _churn(setup, one, decode)  # warm-up: every batch size's decode graph is captured here
            for r in range(rounds + 1):
                timed = clock if r else _untimed  # round 0 warms up what the timed rounds run
                setup.prefill(prompts, np.full(BATCH, PROMPT))
                for _ in range(per_round):
                    timed(DECODE_WHOLE, decode)
                for _ in range(per_round):  # after a decode of 7 sequences, as the admissions below, and of 1
                    setup.reset()
                    for slot in range(1, BATCH):
                        setup.prefill(one, [PROMPT], slots=[slot])
                    decode()
                    timed(PREFILL_WHOLE_7, lambda: setup.prefill(one, [PROMPT]))
                    decode()
                    timed(PREFILL_WHOLE, lambda: setup.prefill(one, [PROMPT]))
                _churn(setup, one, decode)
                for _ in range(per_round):
                    timed(DECODE_CHURNED, decode)
                setup.release([SLOT])
                for _ in range(per_round):
                    decode()
                    timed(PREFILL_ADMIT, lambda: setup.prefill(one, [PROMPT], slots=[SLOT]))
                    decode()
                    timed(RELEASE, lambda: setup.release([SLOT]))
                # Apart from the admissions: the decode after a pin copies the shared page (36 layers of it),
                # which on the host backend leaves the CPU's caches cold for whatever comes next.
                setup.prefill(one, [PROMPT], slots=[SLOT])
                for _ in range(per_round):
                    decode()
                    prefix = timed(PIN, lambda: setup.pin_prefix(SLOT, PROMPT))
                    decode()
                    timed(UNPIN, prefix.release)
            rows = {name: clock.row(name) for name in (DECODE_WHOLE, DECODE_CHURNED, PREFILL_WHOLE_7, PREFILL_WHOLE,
                                                       PREFILL_ADMIT, RELEASE, PIN, UNPIN)}
            page_size, pool = int(setup.state.page_size), setup.kv_pages.total
        _hybrid(backend, hybrid_config(llm), clock, stream, rounds, per_round, rng)
        rows.update((name, clock.row(name)) for name in (HYBRID_WHOLE, HYBRID_CHURNED, HYBRID_ZERO))
        return SequenceResults(rows, kv, page_size, pool)
    finally:
        stream.close()


def hybrid_config(llm: LLMEngineConfig) -> LLMEngineConfig:
    """The bench's LLM as a Qwen3.5-like hybrid: 3 Gated-DeltaNet layers to 1 attention layer (27 and 9 of 36),
    recurrent states of 16 value heads x 128 x 128 (FP32) and a conv state of 6144 x 4 (FP16) per slot and layer."""
    types = ("mamba", "mamba", "mamba", "attention") * (llm.num_attention_layers // 4)
    kv = KVLayerConfig(llm.num_kv_heads, llm.head_dim)
    recurrent = HybridConfig(recurrent_kind="gated_deltanet", conv_dim=2 * 16 * 128 + 16 * 128, conv_kernel=4,
                             recurrent_state_num_heads=16, recurrent_state_head_dim=128, recurrent_state_size=128,
                             recurrent_spec_verify_mode="snapshot")
    return dataclasses.replace(
        llm, num_attention_layers=types.count("attention"), layer_types=types,
        kv_layer_configs=tuple(kv if t == "attention" else None for t in types), features=(*llm.features, recurrent),
        kv_pool_pages=0).validate()


def _hybrid(backend: Backend, cfg: LLMEngineConfig, clock: _Clock, stream: Stream, rounds: int, per_round: int,
            rng: np.random.Generator) -> None:
    """The hybrid rows (module docstring), in rounds as the others."""
    with create_for_llm(null_engine(cfg, backend), cfg, stream, graphs=True, backend=backend) as setup, \
            device_tensor(backend, (BATCH, PROMPT, HIDDEN), rng) as prompts, \
            device_tensor(backend, (1, PROMPT, HIDDEN), rng) as one:
        setup.state.reset(stream, clear=True)
        embeds = setup.io.inputs_embeds
        rec = setup.recurrent
        assert rec is not None

        def decode() -> object:
            return setup.decode(embeds.reshape((setup.batch or 1, 1, HIDDEN)))

        def zero() -> None:  # the device work an admission adds before the engine, as the prefill enqueues it
            for work in rec.admission([SLOT], None):
                work.enqueue(stream)

        _churn(setup, one, decode)
        for r in range(rounds + 1):
            timed = clock if r else _untimed
            setup.prefill(prompts, np.full(BATCH, PROMPT))
            for _ in range(per_round):
                timed(HYBRID_WHOLE, decode)
            _churn(setup, one, decode)
            for _ in range(per_round):
                timed(HYBRID_CHURNED, decode)
                timed(HYBRID_ZERO, zero)


def format_sequences(res: SequenceResults, machine: str) -> str:
    """Markdown: every call's row, then the targets (``machine`` names where it ran)."""
    lines = [f"Sequences that come and go at 8B-class scale (ragged contract: 36 layers, {BATCH} slots, KV capacity "
             f"{res.kv_capacity}, pages of {res.page_size} tokens, a pool of {res.pool_pages}; null-compute engine, "
             f"graphs on; {machine}):", "",
             "| call | host µs per call + sync | host µs per call | device ops per call | host syncs per call |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, r in res.rows.items():
        ops = "-" if math.isnan(r.ops) else f"{r.ops:g}"
        lines.append(f"| {name} | {r.synced:.1f} | {r.alone:.1f} | {ops} | {r.syncs:g} |")
    lines += ["", "| target | measured | limit | met |", "| --- | ---: | ---: | --- |"]
    for t in res.targets():
        if t["unit"] == "x":
            value, limit = f"{t['value']:.2f}x", f"<= {t['limit']:.1f}x"
        elif t["unit"] == "ops":
            value, limit = f"{t['value']:g}", f"= {t['limit']:g}"
        else:
            value, limit = f"{t['value']:+.1f} µs" if "prefill" in t["what"] else f"{t['value']:.1f} µs", \
                f"<= {'+' if 'prefill' in t['what'] else ''}{t['limit']:.0f} µs"
        lines.append(f"| {t['what']} | {value} | {limit} | {'yes' if t['met'] else 'NO'} |")
    return "\n".join(lines)
