"""``trtio bench``: what every step helper costs at 8B-class scale, beside ``prepare + execute`` alone.

The engines are null-compute :class:`~trtio.testing.ReferenceEngine` s (their full I/O contract and
validation, no math), so every figure is trtio's own cost. Scale: a 36-layer base (hidden 4096, 32 query /
8 KV heads of 128, vocab 151936, KV capacity 4096), batch 8, an EAGLE-3-like one-layer draft (reads
3 x 4096 base features, draft vocab 32000), EAGLE drafting of top-10 x 6 levels, verify trees of 60 nodes (a
binary tree), accepted paths of 4 nodes; CUDA graphs on. Both contracts: trtio's batch-major one and Edge-LLM
0.11's token-major one. Inputs (``inputs``): device tensors (a runtime looks its embeddings up on the GPU), host
numpy arrays (beside each helper, one ``np.copyto`` of its input: the least any step spends on the bytes it is
given), or torch tensors (on the GPU with the cuda backend; beside the decode step fed one, the same step fed a
trtio Tensor; torch runs on the step's stream, and once more on its own default stream, beside which the step is
fed a trtio Tensor last written on another stream; each of those decode rows is timed right after the engine's
own rows, so that they follow the same calls). Beside ``prepare + execute`` of the engine alone, ``prepare +
execute`` replaying the decode step's own graph (the call ``LLMSetup.decode`` wraps), and a whole speculative
round of 3 levels timed as one call, then such rounds whose accepted paths change every round (a serving loop's:
1-4 nodes a sequence, at random). On the ragged contract, also a LoRA build of the LLM: its decode step with and
without an adapter, and ``set_lora`` switching adapters (:mod:`trtio._tools.bench_lora`); and an MTP round (the base
feeding its last layer's ``[T, 4096]`` stream to a one-layer draft of the base's vocabulary; a chain of 3, verify of
4 nodes, accept, catch-up) and a DFlash round (a block of 8) timed as one call, each also with paths new every round
(1-4 nodes of the verified chain a sequence, at random).

For each helper: the median host time of a call followed by a stream synchronisation, the median host
time of the call alone (the device work it enqueued runs meanwhile), and the device operations it
enqueues (counted by the host backend; the cuda backend issues the same ones). On the host backend, where
numpy runs the device work in the calling thread, also the part of the call spent in that work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from trtio._config import DeploymentConfig, LLMEngineConfig, SpecDecodeConfig
from trtio._cuda.backend import Backend, Location
from trtio._engine import DECODE_PROFILE
from trtio._setups import SpecDecodeSetup, create_for_llm, create_for_spec_decode
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio._tools.bench_lora import lora_rows
from trtio._tools.options import backend_option
from trtio.errors import InvalidValueError
from trtio.families.gemma4.gemma4_config import Gemma4Config
from trtio.families.spec.spec_config import SpecConfig

__all__ = ["DFLASH_BLOCK", "DFLASH_ROUND", "DFLASH_ROUND_NEW_PATHS", "GEMMA4_DECODE", "INPUTS", "MTP_ROUND",
           "MTP_ROUND_NEW_PATHS", "ROUND", "ROUND_NEW_PATHS", "Row", "bench_backend", "chain_paths",
           "configs", "copy_row", "default_kv_capacity", "device_tensor", "dflash_bundle", "format_results",
           "gemma4_config", "machine_name", "mtp_bundle", "null_engine", "run"]

BATCH, TOP_K, STEPS, VERIFY, PATH = 8, 10, 6, 60, 4
HIDDEN = 4096


def configs(contract: str, kv_capacity: int = 4096) -> tuple[LLMEngineConfig, DeploymentConfig]:
    """The 8B-class LLM and the EAGLE-3-like base + draft of ``contract`` (benchmarks/bench_pipeline_memory.py's)."""
    common: dict[str, Any] = dict(hidden_size=HIDDEN, max_supported_batch_size=BATCH, max_supported_input_length=128,
                                  max_kv_cache_capacity=kv_capacity, num_attention_heads=32, num_kv_heads=8,
                                  head_dim=128, rotary_dim=128, contract=contract)
    llm = LLMEngineConfig(vocab_size=151936, num_attention_layers=36, **common).validate()
    eagle = (0, 17, 33) if contract == "ragged" else ()
    base = LLMEngineConfig(vocab_size=151936, num_attention_layers=36, is_spec_decode_base=True,
                           max_verify_tree_size=64, eagle_hidden_state_layers=eagle, **common).validate()
    features = 3 * HIDDEN
    draft = LLMEngineConfig(vocab_size=32000, num_attention_layers=1, base_model_hidden_size=features,
                            max_draft_tree_size=64, **common).validate()
    if contract == "batch":  # the batch toy contract's base outputs its final hidden state only
        base = dataclasses.replace(base, hidden_size=HIDDEN)
        draft = dataclasses.replace(draft, base_model_hidden_size=HIDDEN)
        features = HIDDEN
    spec = SpecDecodeConfig(base_output_hidden_dim=features, draft_hidden_size=HIDDEN, max_verify_size=64,
                            max_draft_proposal_size=TOP_K * STEPS, drafting_top_k=TOP_K, drafting_step=STEPS,
                            verify_size=VERIFY)
    return llm, DeploymentConfig(base, draft, spec).validate()


#: The row of a Gemma 4 decode (ragged contract), beside ``LLMSetup.decode`` of the dense LLM of the same size.
GEMMA4_DECODE = "LLMSetup.decode, Gemma 4 (bounded SWA, KV sharing, dual RoPE, PLE)"


def gemma4_config(llm: LLMEngineConfig, *, window: int = 512, ple_hidden: int = 256) -> LLMEngineConfig:
    """A Gemma-4-like config the size of ``llm`` (ragged): every sixth layer full (head dim 2x), the others
    sliding (window ``window``), the last third reading the KV of the last earlier layer of its kind, PLE of
    ``ple_hidden`` per layer, as Edge-LLM's writer spells it."""
    n, d = llm.num_attention_layers, llm.head_dim
    kinds = ["full" if (i + 1) % 6 == 0 else "sliding" for i in range(n)]
    owners = n - n // 3
    donors = [-1 if i < owners else max(j for j in range(owners) if kinds[j] == kinds[i]) for i in range(n)]
    rope = {"rope_theta": 10000.0, "partial_rotary_factor": 1.0, "rope_scaling": {"rope_type": "default"}}
    raw = {
        "model": "gemma4_text", "engine_role": "llm", "vocab_size": llm.vocab_size, "hidden_size": llm.hidden_size,
        "num_hidden_layers": n, "num_attention_heads": llm.num_attention_heads,
        "num_key_value_heads": llm.num_kv_heads, "head_dim": d, "global_head_dim": 2 * d,
        "rope_theta": 1e6, "partial_rotary_factor": 0.25,
        "rope_scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        "sliding_rope_config": rope,
        "full_rope_config": {"rope_theta": 1e6, "partial_rotary_factor": 0.25,
                             "rope_scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.25}},
        "layer_types": ["attention"] * n,
        "kv_layer_configs": [{"num_kv_heads": llm.num_kv_heads, "head_dim": 2 * d if k == "full" else d}
                             for k in kinds],
        "kv_sharing_donors": donors, "sliding_window_size": window,
        "ple_enabled": True, "num_ple_inputs": n, "ple_hidden_size": ple_hidden,
        "builder_config": {"max_batch_size": llm.max_supported_batch_size,
                           "max_input_len": llm.max_supported_input_length,
                           "max_kv_cache_capacity": llm.max_kv_cache_capacity,
                           "ragged_backend": "entry_padded_compatibility"},
    }
    return LLMEngineConfig.from_edgellm(raw, what="bench gemma4 config")


def _gemma4_rows(llm: LLMEngineConfig, backend: Backend, stream: Stream, steps: int, clock: _Clock) -> None:
    """The decode step of :func:`gemma4_config`'s model, fed as the dense decode row is (its embeddings written in
    ``io.inputs_embeds`` in place) and device PLE rows (what :class:`~trtio._embeddings.TokenEmbeddings` gathers)."""
    cfg = gemma4_config(llm)
    g = cfg.feature(Gemma4Config)
    assert g is not None
    rng = np.random.default_rng(2)
    width = g.ple_layers * g.ple_hidden
    with create_for_llm(null_engine(cfg, backend), cfg, stream, graphs=True, backend=backend) as setup:
        setup.state.reset(stream, clear=True)
        prompt = device_tensor(backend, (BATCH, 16, HIDDEN), rng)
        ple_prompt = device_tensor(backend, (BATCH, 16, width), rng)
        embeds = setup.io.inputs_embeds
        ple = device_tensor(backend, (BATCH, 1, width), rng)
        try:
            setup.prefill(prompt, np.full(BATCH, 16), ple_embeds=ple_prompt)

            def decode() -> object:
                return setup.decode(embeds.reshape((BATCH, 1, HIDDEN)), ple_embeds=ple)

            for _ in range(3):
                decode()
            for _ in range(steps):
                clock(GEMMA4_DECODE, decode)
        finally:
            for t in (prompt, ple_prompt, ple):
                t.close()


def null_engine(cfg: LLMEngineConfig, backend: Backend) -> Any:
    """A null-compute ReferenceEngine of ``cfg`` (its I/O contract and checks, no math) for ``backend``."""
    from trtio.testing.reference_engine import ReferenceEngine

    device = "gpu" if backend.name == "cuda" else "host"
    return ReferenceEngine.from_config(cfg, device=device, null_compute=True)


class Row(NamedTuple):
    """One helper's medians: host µs per call followed by a sync and alone, device operations per call
    (counted by the host and dry-run backends, else NaN), and µs per call the host backend spent running
    the device work in numpy (NaN on other backends)."""

    synced: float
    alone: float
    ops: float
    work: float


class _Clock:
    """Host time per call (alone, and followed by a sync), device operations and device-work time per
    call, by helper."""

    def __init__(self, backend: Backend, stream: Stream) -> None:
        self.backend, self.stream = backend, stream
        self.alone: dict[str, list[float]] = {}
        self.synced: dict[str, list[float]] = {}
        self.ops: dict[str, list[int]] = {}
        self.work: dict[str, list[float]] = {}

    def __call__(self, name: str, fn: Callable[[], object]) -> None:
        ops, work = getattr(self.backend, "op_count", 0), getattr(self.backend, "work_seconds", 0.0)
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        self.stream.synchronize()
        t2 = time.perf_counter()
        self.alone.setdefault(name, []).append(t1 - t0)
        self.synced.setdefault(name, []).append(t2 - t0)
        self.ops.setdefault(name, []).append(getattr(self.backend, "op_count", 0) - ops)
        self.work.setdefault(name, []).append(getattr(self.backend, "work_seconds", 0.0) - work)

    def row(self, name: str) -> Row:
        nan = float("nan")
        counted = getattr(self.backend, "op_count", None) is not None
        timed = self.backend.name == "host"  # the dry-run backend runs no device work to time
        return Row(statistics.median(self.synced[name]) * 1e6, statistics.median(self.alone[name]) * 1e6,
                   statistics.median(self.ops[name]) if counted else nan,
                   statistics.median(self.work[name]) * 1e6 if timed else nan)


def device_tensor(backend: Backend, shape: Sequence[int], rng: np.random.Generator) -> Tensor:
    """A float16 device tensor of ``shape`` holding small random values (a step's embeddings); the caller closes it."""
    t = Tensor.empty(tuple(shape), "float16", Location.DEVICE, backend=backend, name="bench.embeds")
    t.copy_from((rng.standard_normal(shape) * 0.1).astype(np.float16))
    return t


INPUTS = ("device", "host", "torch")
ROUND = "speculative round (3 levels + verify + accept + draft_accept)"
ROUND_LEVELS = 3
#: The same round with accepted paths that change every round, as a serving loop's do: each sequence accepts a random
#: root path of 1-4 nodes of the verify tree (the round above accepts the same 4-node path every round).
ROUND_NEW_PATHS = "speculative round, accepted paths new every round (1-4 nodes a sequence)"
#: An MTP pair's round (ragged contract): a chain of 3 drafted tokens, a verify of the 4-node chain, accept, catch-up.
MTP_ROUND = "MTP round (chain of 3 + verify + accept + draft_accept)"
#: A DFlash pair's round (ragged contract): the verify of the root and a block's 7 guesses as a chain, accept, and
#: the next block drafted over the accepted path (draft_accept: the delta's KV and the block, one engine call).
DFLASH_BLOCK = 8
DFLASH_ROUND = "DFlash round (block of 8: verify + accept + draft_accept)"
#: The MTP and DFlash rounds with accepted paths that change every round (each sequence accepts 1-4 nodes of the
#: verified chain at random), as a serving loop's do.
MTP_ROUND_NEW_PATHS = "MTP round, accepted paths new every round (1-4 nodes a sequence)"
DFLASH_ROUND_NEW_PATHS = "DFlash round, accepted paths new every round (1-4 nodes a sequence)"


def chain_paths(rounds: int, seed: int) -> list[list[list[int]]]:
    """Per round, each of the batch's sequences' accepted path down a verified chain: its first 1-4 nodes, at
    random (a serving loop's)."""
    picks = np.random.default_rng(seed)
    return [[list(range(int(n))) for n in picks.integers(1, PATH + 1, BATCH)] for _ in range(rounds)]


def copy_row(helper: str) -> str:
    """The name of the row that times one ``np.copyto`` of ``helper``'s host input (the least any step spends on
    the bytes it is given)."""
    return f"np.copyto of {helper.rsplit('.', 1)[-1]}'s input"


class _Embeds:
    """A step's embeddings of each shape as the bench's ``inputs`` give them: ``device`` (a runtime's buffers on
    the device: written in place in ``io.inputs_embeds`` where the step reads them, else a device Tensor of
    their own), ``host`` (numpy arrays; beside each helper, one ``np.copyto`` of its input is timed) or
    ``torch`` (torch tensors: on the GPU with the cuda backend, in host memory elsewhere)."""

    def __init__(self, kind: str, backend: Backend, io_embeds: Tensor, seed: int) -> None:
        if kind not in INPUTS:
            raise InvalidValueError(f"inputs: {kind!r} is not one of {', '.join(INPUTS)}")
        self.kind, self.backend, self._io = kind, backend, io_embeds
        self._rng = np.random.default_rng(seed)
        self._owned: list[Tensor] = []
        self._floors: dict[tuple[int, ...], np.ndarray] = {}

    def _values(self, shape: tuple[int, ...]) -> np.ndarray:
        return (self._rng.standard_normal(shape) * 0.1).astype(np.float16)

    def in_place(self, shape: tuple[int, ...]) -> Callable[[], Any]:
        """Embeddings a runtime writes where the step reads them: ``io.inputs_embeds`` viewed as ``shape`` on
        device inputs (no copy), else an array of the bench's kind (the same object every call)."""
        if self.kind == "device":
            embeds, shape = self._io, tuple(shape)
            return lambda: embeds.reshape(shape)
        x = self.array(shape)
        return lambda: x

    def array(self, shape: tuple[int, ...]) -> Any:
        """An input of ``shape`` of the bench's kind, made once (device inputs: a device Tensor of its own)."""
        shape = tuple(shape)
        if self.kind == "device":
            t = device_tensor(self.backend, shape, self._rng)
            self._owned.append(t)
            return t
        values = self._values(shape)
        if self.kind == "host":
            return values
        import torch

        x = torch.from_numpy(values)
        return x.cuda() if self.backend.name == "cuda" else x

    def tensor(self, shape: tuple[int, ...]) -> Tensor:
        """A trtio device Tensor of ``shape`` (the torch inputs' comparison)."""
        t = device_tensor(self.backend, tuple(shape), self._rng)
        self._owned.append(t)
        return t

    def beside(self, shape: tuple[int, ...]) -> Any:
        """The torch inputs' comparison of ``shape``, in the memory torch's would be in: a trtio device Tensor on the
        cuda backend, numpy elsewhere (see :attr:`beside_name`)."""
        return self.tensor(shape) if self.backend.name == "cuda" else self._values(tuple(shape))

    @property
    def beside_name(self) -> str:
        return "fed a trtio Tensor" if self.backend.name == "cuda" else "fed numpy"

    def floor(self, shape: tuple[int, ...]) -> Callable[[], None] | None:
        """One ``np.copyto`` of a host input of ``shape`` into a buffer of its own (None unless inputs are host)."""
        if self.kind != "host":
            return None
        shape = tuple(shape)
        src, dst = self._values(shape), np.zeros(shape, np.float16)
        self._floors[shape] = dst
        return lambda: np.copyto(dst, src)

    def free(self) -> None:
        """Close the device tensors made for the inputs."""
        for t in self._owned:
            t.close()
        self._owned.clear()


def _llm_rows(llm: LLMEngineConfig, backend: Backend, stream: Stream, steps: int, clock: _Clock,
              inputs: str = "device") -> None:
    rng = np.random.default_rng(0)
    with create_for_llm(null_engine(llm, backend), llm, stream, graphs=True, backend=backend) as setup:
        setup.state.reset(stream, clear=True)  # touch the caches once: page faults are not step cost
        prompt = device_tensor(backend, (BATCH, 16, HIDDEN), rng)
        feed = _Embeds(inputs, backend, setup.io.inputs_embeds, 0)
        side: Stream | None = None
        try:
            setup.prefill(prompt, np.full(BATCH, 16))
            one = (BATCH, 1, HIDDEN)
            embeds = feed.in_place(one)  # device inputs: a runtime writes the step's embeddings in place: no copy

            def decode() -> object:
                return setup.decode(embeds())

            other: Callable[[], object] | None = None
            if inputs == "torch":  # the same step fed a trtio Tensor (cuda) or numpy (host memory elsewhere)
                x = feed.beside(one)

                def other() -> object:
                    return setup.decode(x)
            floor = feed.floor(one)
            for _ in range(3):
                decode()  # bind the decode shape and capture its graph
                if other is not None:
                    other()
            on_step_stream = torch_on_step_stream(backend, inputs)
            elsewhere: Callable[[], Any] | None = None
            apart: Callable[[], object] | None = None
            if inputs == "torch" and backend.name == "cuda":
                # torch runs on the step's stream (this thread's trtio default: as trtio._inputs advises, no event
                # per step), and once more on its own default stream (the producer ordered by an event each step)
                import torch

                elsewhere = functools.partial(torch.cuda.stream, torch.cuda.default_stream())
                # beside that one, a trtio Tensor last written on another stream: ordered by an event each step too
                side = Stream.create(backend)
                y = feed.tensor(one).copy_from(feed._values(one), side)

                def apart() -> object:
                    return setup.decode(y)
                apart()
            e = setup.engines()[0]
            dims = llm.decode_dims(BATCH)
            work = e.executor.last_work  # the device work decode enqueues before its engine, in its graph

            def prepare_execute() -> None:
                e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, stream)
                e.executor.execute(stream)

            def same_graph() -> None:
                e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, stream)
                e.executor.execute(stream, before=work)

            prepare_execute()  # its own graph: the engine alone, without the step's RoPE gather
            same_graph()
            # The rows compared follow the same calls (see below), each three calls after a decode of another row.
            rows: list[tuple[str, Callable[[], object], Callable[[], Any]]] = [
                ("LLMSetup.decode", decode, contextlib.nullcontext)]
            if apart is not None:
                rows.append(("LLMSetup.decode, fed a trtio Tensor written on another stream", apart,
                             contextlib.nullcontext))
            if elsewhere is not None:
                rows.append(("LLMSetup.decode, fed torch from its default stream", decode, elsewhere))
            if other is not None:
                rows.append((f"LLMSetup.decode, {feed.beside_name}", other, contextlib.nullcontext))
            with on_step_stream:
                for i in range(steps):
                    # Each decode row right after the engine's own two rows: what ran just before a call warms or
                    # cools the host's caches (a step timed right after another decode runs faster), so rows
                    # compared side by side follow the same calls. The rows take turns at going first: the
                    # setup's ring of inputs in flight is fenced once every few steps, and that fence (an event)
                    # falls on each row alike rather than always on the first.
                    turn = i % len(rows)
                    for name, step, context in rows[turn:] + rows[:turn]:
                        clock("prepare + execute (decode, graph)", prepare_execute)
                        # decode's graph: its device work advances the device's lengths once more (null compute)
                        clock("prepare + execute (decode's own graph)", same_graph)
                        with context():
                            clock(name, step)
                    if floor is not None:
                        clock(copy_row("LLMSetup.decode"), floor)
        finally:
            feed.free()
            if side is not None:
                side.close()
            prompt.close()


def torch_on_step_stream(backend: Backend, inputs: str) -> Any:
    """Where steps are fed torch's CUDA tensors: torch on this thread's trtio default stream, the steps' (as
    trtio._inputs advises: the steps order no event before their reads), for a ``with``; else a context that does
    nothing."""
    if inputs != "torch" or backend.name != "cuda":
        return contextlib.nullcontext()
    import torch

    external: Any = torch.cuda.ExternalStream
    return torch.cuda.stream(external(Stream.default(backend).handle))


@contextlib.contextmanager
def _spec_pair(bundle: DeploymentConfig, backend: Backend, stream: Stream, inputs: str,
               seed: int) -> Iterator[tuple[SpecDecodeSetup, _Embeds, Tensor]]:
    """A spec-decode setup of ``bundle`` on null-compute engines (graphs on, caches touched once: page faults are
    not step cost), the feed of its steps' embeddings and a 16-token prompt; all closed after."""
    assert bundle.draft is not None, "the bench's bundles always have a draft"
    rng = np.random.default_rng(seed)
    base, draft = null_engine(bundle.base, backend), null_engine(bundle.draft, backend)
    with create_for_spec_decode(base, draft, bundle, stream=stream, graphs=True, backend=backend) as sd:
        for e in sd.engines():
            e.state.reset(stream, clear=True)
        prompt = device_tensor(backend, (BATCH, 16, HIDDEN), rng)
        feed = _Embeds(inputs, backend, sd.io.inputs_embeds, seed)
        try:
            with torch_on_step_stream(backend, inputs):  # torch on the steps' stream, as the decode rows have it
                yield sd, feed, prompt
        finally:
            feed.free()
            prompt.close()


def _clock_rounds(clock: _Clock, name: str, rounds: int, whole_round: Callable[[], None]) -> None:
    """``rounds`` of ``whole_round`` timed as row ``name``, after two warm-up rounds (which capture every graph)."""
    for r in range(rounds + 2):
        if r >= 2:
            clock(name, whole_round)
        else:
            whole_round()


def _spec_rows(bundle: DeploymentConfig, backend: Backend, stream: Stream, rounds: int, clock: _Clock,
               inputs: str = "device") -> None:
    draft_cfg = bundle.draft
    assert draft_cfg is not None, "configs() always builds a bundle with a draft"
    with _spec_pair(bundle, backend, stream, inputs, 1) as (sd, feed, prompt):
        level = feed.array((BATCH, TOP_K, HIDDEN))  # a runtime's buffer per level, written in place each round
        tree = feed.in_place((BATCH, VERIFY, HIDDEN))  # device inputs: written in place by the runtime: no copy
        catch_up = feed.in_place((BATCH, PATH, HIDDEN))
        floors = {"SpecDecodeSetup.draft_propose": feed.floor((BATCH, TOP_K, HIDDEN)),
                  "SpecDecodeSetup.verify": feed.floor((BATCH, VERIFY, HIDDEN)),
                  "SpecDecodeSetup.draft_accept": feed.floor((BATCH, PATH, HIDDEN))}
        lens = np.full(BATCH, 16)
        sd.base_prefill(prompt, lens)
        sd.draft_prefill(prompt, lens)
        binary = [-1] + [(i - 1) // 2 for i in range(1, VERIFY)]  # a 60-node binary tree
        path = [0, 1, 3, 7]  # 4 nodes: root, child, grandchild, great-grandchild
        first = np.full(TOP_K, -1)
        parents = [first] + [(lv - 1) * TOP_K + np.arange(TOP_K) // 2 for lv in range(1, STEPS - 1)]
        e = sd.draft
        dims = draft_cfg.proposal_dims(BATCH, TOP_K * STEPS, TOP_K)

        def prepare_execute() -> None:
            e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, stream)
            e.executor.execute(stream)

        def untimed(name: str, fn: Callable[[], object]) -> object:
            return fn()

        def copies(timed: Callable[[str, Callable[[], object]], object], name: str) -> None:
            floor = floors.get(name)
            if floor is not None:
                timed(copy_row(name), floor)

        # Per round of ROUND_NEW_PATHS: each sequence's path, the root and 0-3 random children down the binary tree.
        picks = np.random.default_rng(3)
        new_paths: list[list[list[int]]] = []
        for _ in range(rounds + 2):
            new_paths.append([])
            for _ in range(BATCH):
                walk = [0]
                for _ in range(int(picks.integers(0, PATH))):
                    walk.append(2 * walk[-1] + 1 + int(picks.integers(0, 2)))  # a child of the node before
                new_paths[-1].append(walk)

        def whole_round(levels: int, paths: list[list[int]] | None = None, fed: tuple[Any, Any, Any] | None = None
                        ) -> None:
            for p in parents[:levels]:
                sd.draft_propose(level if fed is None else fed[0], parents=p)
            sd.verify(tree() if fed is None else fed[1], binary)  # (a view of io.inputs_embeds: made when it is fed)
            sd.accept([path] * BATCH if paths is None else paths)
            sd.draft_accept(catch_up() if fed is None else fed[2],
                            np.full(BATCH, PATH) if paths is None else np.array([len(p) for p in paths]))

        # Fed torch: beside each phase, the same phase fed what torch's tensors are compared with (a trtio Tensor on
        # the cuda backend, numpy elsewhere), timed in the same round, after the torch-fed one
        beside = None if inputs != "torch" else (feed.beside((BATCH, TOP_K, HIDDEN)),
                                                  feed.beside((BATCH, VERIFY, HIDDEN)),
                                                  feed.beside((BATCH, PATH, HIDDEN)))

        for r in range(rounds + 2):
            # two warm-up rounds capture every graph
            timed: Callable[[str, Callable[[], object]], object] = clock if r >= 2 else untimed
            for p in parents:
                timed("SpecDecodeSetup.draft_propose", functools.partial(sd.draft_propose, level, parents=p))
                copies(timed, "SpecDecodeSetup.draft_propose")
            timed("prepare + execute (draft proposal, graph)", prepare_execute)
            timed("SpecDecodeSetup.verify", lambda: sd.verify(tree(), binary))
            copies(timed, "SpecDecodeSetup.verify")
            timed("SpecDecodeSetup.accept", lambda: sd.accept([path] * BATCH))
            timed("SpecDecodeSetup.draft_accept", lambda: sd.draft_accept(catch_up(), np.full(BATCH, PATH)))
            copies(timed, "SpecDecodeSetup.draft_accept")
            if beside is not None:
                _beside_phases(sd, timed, beside, parents, binary, path, feed.beside_name)
            # a whole round of 3 levels (two rounds in, its own graphs are captured too)
            timed(ROUND, functools.partial(whole_round, ROUND_LEVELS))
            if beside is not None:
                timed(f"{ROUND}, {feed.beside_name}", functools.partial(whole_round, ROUND_LEVELS, fed=beside))
        # then rounds of new paths, in a loop of their own (between the steady rounds they would make those unsteady)
        plans = iter(new_paths)
        _clock_rounds(clock, ROUND_NEW_PATHS, rounds, lambda: whole_round(ROUND_LEVELS, next(plans)))


def _beside_phases(sd: SpecDecodeSetup, timed: Callable[[str, Callable[[], object]], object], fed: tuple[Any, Any, Any],
                   parents: list[np.ndarray], tree: list[int], path: list[int], name: str) -> None:
    """Each spec phase of a round fed ``fed`` (a level's, verify's and the catch-up's inputs), timed as
    ``"<phase>, <name>"``: the comparison of the same phases fed torch tensors."""
    level, verify, catch_up = fed
    for p in parents:
        timed(f"SpecDecodeSetup.draft_propose, {name}", functools.partial(sd.draft_propose, level, parents=p))
    timed(f"SpecDecodeSetup.verify, {name}", lambda: sd.verify(verify, tree))
    sd.accept([path] * BATCH)
    timed(f"SpecDecodeSetup.draft_accept, {name}", lambda: sd.draft_accept(catch_up, np.full(BATCH, PATH)))


def _lora_rows(llm: LLMEngineConfig, backend: Backend, stream: Stream, steps: int, clock: _Clock,
               inputs: str = "device") -> None:
    """:mod:`trtio._tools.bench_lora`'s rows, fed as the other decode rows are."""
    prompt = device_tensor(backend, (BATCH, 16, HIDDEN), np.random.default_rng(2))
    feeds: list[_Embeds] = []

    def feed(io_embeds: Tensor) -> Callable[[], object]:
        feeds.append(_Embeds(inputs, backend, io_embeds, 2))
        return feeds[-1].in_place((BATCH, 1, HIDDEN))
    try:
        lora_rows(llm, backend, stream, steps, clock, null_engine, prompt, feed)
    finally:
        for f in feeds:
            f.free()
        prompt.close()


def mtp_bundle(bundle: DeploymentConfig) -> DeploymentConfig:
    """The 8B-class base of ``bundle`` as an MTP base (``hidden_states``: its last layer's stream [T, H]) with a
    one-layer MTP draft reading it, chain drafting 3 deep (verify trees of 4 nodes)."""
    assert bundle.draft is not None
    base = dataclasses.replace(bundle.base, features=(*bundle.base.features, SpecConfig())).validate()
    draft = dataclasses.replace(bundle.draft, base_model_hidden_size=HIDDEN, vocab_size=base.vocab_size,
                                output_vocab_size=base.vocab_size).validate()
    spec = SpecDecodeConfig(base_output_hidden_dim=HIDDEN, draft_hidden_size=HIDDEN, max_verify_size=64,
                            max_draft_proposal_size=ROUND_LEVELS, drafting_top_k=1, drafting_step=ROUND_LEVELS,
                            verify_size=ROUND_LEVELS + 1)
    return DeploymentConfig(base, draft, spec).validate()


def dflash_bundle(bundle: DeploymentConfig) -> DeploymentConfig:
    """The 8B-class base of ``bundle`` (its 3 EAGLE layers' streams side by side, ``hidden_states [T, 3H]``) with a
    one-layer DFlash block draft reading them, blocks of :data:`DFLASH_BLOCK` (verify chains of as many nodes)."""
    assert bundle.draft is not None
    base = bundle.base
    family = base.feature(SpecConfig)
    assert family is not None
    block = {"version": 1, "target_layer_ids": list(family.eagle_hidden_state_layers), "block_size": DFLASH_BLOCK,
             "mask_token_id": 0}
    width = HIDDEN * len(family.eagle_hidden_state_layers)
    draft = dataclasses.replace(bundle.draft, base_model_hidden_size=width, vocab_size=base.vocab_size,
                                output_vocab_size=base.vocab_size, max_draft_tree_size=DFLASH_BLOCK,
                                extras={**bundle.draft.extras, "spec_decode_type": "dflash", "dflash_config": block}
                                ).validate()
    spec = SpecDecodeConfig(base_output_hidden_dim=width, draft_hidden_size=HIDDEN, max_verify_size=64,
                            max_draft_proposal_size=DFLASH_BLOCK, drafting_top_k=1, drafting_step=DFLASH_BLOCK - 1,
                            verify_size=DFLASH_BLOCK)
    return DeploymentConfig(base, draft, spec).validate()


def _dflash_rows(bundle: DeploymentConfig, backend: Backend, stream: Stream, rounds: int, clock: _Clock,
                 inputs: str = "device") -> None:
    """:data:`DFLASH_ROUND` timed as one call, its steps fed ``inputs``; every block accepted whole."""
    with _spec_pair(bundle, backend, stream, inputs, 3) as (sd, feed, prompt):
        block = feed.in_place((BATCH, DFLASH_BLOCK, HIDDEN))
        lens = np.full(BATCH, 16)
        sd.base_prefill(prompt, lens)
        sd.draft_prefill(block(), lens)
        chain = list(range(-1, DFLASH_BLOCK - 1))
        path = list(range(DFLASH_BLOCK))

        def whole_round(paths: list[list[int]] | None = None) -> None:
            sd.verify(block(), chain)
            sd.accept([path] * BATCH if paths is None else paths)
            sd.draft_accept(block(), np.full(BATCH, DFLASH_BLOCK) if paths is None else
                            np.array([len(p) for p in paths]))

        _clock_rounds(clock, DFLASH_ROUND, rounds, whole_round)
        plans = iter(chain_paths(rounds + 2, 5))  # then new paths every round, in a loop of their own
        _clock_rounds(clock, DFLASH_ROUND_NEW_PATHS, rounds, lambda: whole_round(next(plans)))


def _mtp_rows(bundle: DeploymentConfig, backend: Backend, stream: Stream, rounds: int, clock: _Clock,
              inputs: str = "device") -> None:
    """:data:`MTP_ROUND` timed as one call, its steps fed ``inputs``."""
    with _spec_pair(bundle, backend, stream, inputs, 2) as (sd, feed, prompt):
        level = feed.array((BATCH, 1, HIDDEN))
        chain = feed.in_place((BATCH, ROUND_LEVELS + 1, HIDDEN))
        catch_up = feed.in_place((BATCH, PATH, HIDDEN))
        lens = np.full(BATCH, 16)
        sd.base_prefill(prompt, lens)
        sd.draft_prefill(prompt, lens)
        parents = list(range(-1, ROUND_LEVELS))  # the root and 3 chained nodes
        path = [0, 1, 2, 3]

        def whole_round(paths: list[list[int]] | None = None) -> None:
            for _ in range(ROUND_LEVELS - 1):  # level 1's token comes from the catch-up's logits
                sd.draft_propose(level)
            sd.verify(chain(), parents)
            sd.accept([path] * BATCH if paths is None else paths)
            sd.draft_accept(catch_up(), np.full(BATCH, PATH) if paths is None else np.array([len(p) for p in paths]))

        _clock_rounds(clock, MTP_ROUND, rounds, whole_round)
        plans = iter(chain_paths(rounds + 2, 4))  # then new paths every round, in a loop of their own
        _clock_rounds(clock, MTP_ROUND_NEW_PATHS, rounds, lambda: whole_round(next(plans)))


def _tensor_parallel_rows(llm: LLMEngineConfig, backend: Backend, steps: int, sizes: Sequence[int],
                          clock: _Clock) -> None:
    """The decode step of ``llm`` split across ``n`` ranks for each of ``sizes`` (heads and KV heads split evenly,
    null-compute rank engines, graphs on, device-tensor inputs), beside one LLMSetup's in the same run. On the
    cuda backend the ranks need ``n`` GPUs, nccl4py and a C compiler (a stand-in of Edge-LLM's plugin library
    takes the communicators' registration); sizes beyond the GPUs here are left out."""
    import tempfile

    from trtio._setups.tensor_parallel import RankSpec, TensorParallelLLMSetup
    from trtio.testing.reference_tp import build_stand_in_plugin

    def timed(setup: Any, name: str, stream: Stream) -> None:
        rng = np.random.default_rng(0)
        prompt = device_tensor(setup.io.inputs_embeds.backend, (BATCH, 16, HIDDEN), rng)
        embeds = setup.io.inputs_embeds
        setup.prefill(prompt, np.full(BATCH, 16), stream)
        for i in range(steps + 3):  # three warm-up steps capture the graphs
            if i >= 3:
                clock(name, lambda: setup.decode(embeds.reshape((BATCH, 1, HIDDEN)), stream))
            else:
                setup.decode(embeds.reshape((BATCH, 1, HIDDEN)), stream)
        prompt.close()

    stream = Stream.create(backend)
    try:
        with create_for_llm(null_engine(llm, backend), llm, stream, graphs=True, backend=backend) as one:
            timed(one, "LLMSetup.decode", stream)
    finally:
        stream.close()
    gpus = 0
    if backend.name == "cuda":
        from trtio._cuda.device import probe_device_count

        gpus = probe_device_count()
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            if backend.name == "cuda" and n > gpus:
                continue
            rank = dataclasses.replace(llm, num_attention_heads=llm.num_attention_heads // n,
                                       num_kv_heads=max(1, llm.num_kv_heads // n)).validate()
            specs = [RankSpec(rank, r, functools.partial(null_engine, rank, backend), {}) for r in range(n)]
            kind: Any = "cuda" if backend.name == "cuda" else backend
            plugins = [str(build_stand_in_plugin(tmp))] if backend.name == "cuda" else []
            with TensorParallelLLMSetup(llm, specs, backend=kind, graphs=True, plugins=plugins) as tp:
                s = Stream.create(tp.io.inputs_embeds.backend)
                try:
                    timed(tp, f"TensorParallelLLMSetup.decode ({n} ranks)", s)
                finally:
                    s.close()


Results = dict[str, dict[str, Row]]


def bench_backend(kind: str) -> Backend:
    """The backend a benchmark runs on: ``host``, ``cuda``, or ``dry-run`` (the device work counted but not
    run: trtio's own host cost alone)."""
    if kind == "dry-run":
        from trtio._tools.dry_run import DryRunBackend

        return DryRunBackend()
    return backend_option(kind, takes_auto=False)


def default_kv_capacity(backend: Backend) -> int:
    """Tokens per sequence at 8B-class scale: 4096, or 1024 on the host backend, whose "device" memory is host
    RAM (36 layers of 8 x 4096-token caches are 9.6 GB)."""
    return 4096 if backend.name in ("cuda", "dry-run") else 1024


def run(backend_kind: str = "host", *, steps: int = 200, rounds: int = 30,
        contracts: Sequence[str] = ("batch", "ragged"), kv_capacity: int | None = None,
        tensor_parallel: Sequence[int] = (), inputs: str = "device") -> Results:
    """``{contract: {helper: Row}}`` for each contract, one run; with ``tensor_parallel`` (rank counts) also
    ``"ragged, tensor parallel"``: the LLM's decode step on one engine and across that many ranks.

    ``inputs`` says what the steps are fed (:class:`_Embeds`): ``device`` arrays (the default), ``host`` numpy
    arrays (with one ``np.copyto`` of each helper's input timed beside it) or ``torch`` tensors (with the decode
    step fed a trtio Tensor beside it: on the GPU with the cuda backend, numpy elsewhere).
    ``kv_capacity`` defaults to 4096 on the cuda backend and 1024 on the host backend (whose "device"
    memory is host RAM: 36 layers of 8 x 4096-token caches are 9.6 GB)."""
    if inputs not in INPUTS:
        raise InvalidValueError(f"inputs: {inputs!r} is not one of {', '.join(INPUTS)}")
    backend = bench_backend(backend_kind)
    kv = kv_capacity or default_kv_capacity(backend)
    out: Results = {}
    for contract in contracts:
        llm, bundle = configs(contract, kv)
        stream = Stream.create(backend)
        try:
            clock = _Clock(backend, stream)
            _llm_rows(llm, backend, stream, steps, clock, inputs)
            if contract == "ragged" and inputs == "device":
                _gemma4_rows(llm, backend, stream, steps, clock)
            _spec_rows(bundle, backend, stream, rounds, clock, inputs)
            if contract == "ragged":  # a LoRA engine's decode with and without an adapter, and a switch; an MTP round
                _lora_rows(llm, backend, stream, steps, clock, inputs)
                _mtp_rows(mtp_bundle(bundle), backend, stream, rounds, clock, inputs)
                _dflash_rows(dflash_bundle(bundle), backend, stream, rounds, clock, inputs)
            out[contract] = {name: clock.row(name) for name in clock.alone}
        finally:
            stream.close()
    if tensor_parallel:
        llm, _ = configs("ragged", kv)
        clock = _Clock(backend, Stream.default(backend))
        _tensor_parallel_rows(llm, backend, steps, tensor_parallel, clock)
        out["ragged, tensor parallel"] = {name: clock.row(name) for name in clock.alone}
    return out


def format_results(results: Results, backend_kind: str, inputs: str = "device") -> str:
    """A markdown table of :func:`run`'s results (``backend_kind``: host, cuda or dry-run; ``inputs``: what the
    steps were fed).

    ``x decode`` divides by ``LLMSetup.decode``'s time in the same run. With host inputs one column more takes
    one ``np.copyto`` of each helper's own input off its time first (``beyond np.copyto, x decode``). On the
    host backend one column more says how much of a call numpy spent running its device work (the moves a GPU
    makes)."""
    host = backend_kind == "host"
    copies = inputs == "host"
    lines = [f"Step helpers at 8B-class scale, null-compute engines, graphs on, {inputs} inputs "
             f"({machine_name(backend_kind)}):", ""]
    head = "| contract | step | host µs per call + sync | host µs per call | device ops per call | x decode |"
    rule = "| --- | --- | ---: | ---: | ---: | ---: |"
    if copies:
        head += " beyond np.copyto, x decode |"
        rule += " ---: |"
    if host:
        head += " of which device work µs (numpy) |"
        rule += " ---: |"
    lines += [head, rule]
    for contract, rows in results.items():
        decode = rows["LLMSetup.decode"]
        for name, row in rows.items():
            count = "-" if row.ops != row.ops else f"{row.ops:g}"  # NaN: the cuda backend does not count
            line = (f"| {contract} | {name} | {row.synced:.1f} | {row.alone:.1f} | {count} | "
                    f"{row.synced / decode.synced:.2f} |")
            if copies:
                floor = rows.get(copy_row(name))
                line += f" {(row.synced - floor.synced) / decode.synced:.2f} |" if floor is not None else " |"
            if host:
                line += f" {row.work:.1f} |"
            lines.append(line)
    return "\n".join(lines)


def machine_name(backend_kind: str) -> str:
    """Where a benchmark ran: the GPU's name, or the CPU's architecture and cores, with the backend and Python."""
    import os
    import platform

    if backend_kind == "cuda":
        name = getattr(backend_option("cuda", takes_auto=False), "device_name", "GPU")
        return f"{name}, cuda backend, Python {platform.python_version()}"
    return f"{platform.machine()}, {os.cpu_count()} cores, {backend_kind} backend, Python {platform.python_version()}"
