"""``trtio demo``: the toy engines of both contracts end to end — greedy, speculative, streaming, bindings.

The demo runs the toy engines of ``engines/`` (:mod:`trtio.testing.toy_engines`) for one or both of
trtio's engine contracts (``--contract``):

* **batch** — ``toy-llm`` and ``toy-eagle`` (batch-major, contiguous KV caches): real plans with
  TensorRT where ``tensorrt`` imports and a GPU answers (built into a cache folder on first use), else
  :class:`~trtio.testing.ReferenceEngine` s on the best backend;
* **ragged** — ``toy-llm-ragged`` and ``toy-eagle3-ragged``: engine directories in TensorRT Edge-LLM
  0.11's layout, token-major with paged KV pools, always on ReferenceEngines (plans of this contract
  come from Edge-LLM's builder and its attention plugin).

For each contract:

1. greedy generation for four prompts of different lengths with ``create_for_llm`` (decode loop
   with CUDA graphs), and, where the LLM engine has a ``hidden_states`` output, a streaming snapshot
   right after the prefill: ``populate_streaming()``, a consumer on another :class:`~trtio.Stream`
   that waits on ``streaming_prefill.ready_event`` and copies the snapshot out while the decode loop
   overwrites the live buffers, and a byte comparison with copies of the live buffers taken right
   after the prefill (the ragged LLM has no such output, as Edge-LLM's plain LLM engines have none:
   the summary says so);
2. speculative decoding of the same prompts with ``create_for_spec_decode`` and EAGLE tree drafting
   (batch: the ``spec`` section's ``drafting_top_k`` / ``drafting_step`` / ``verify_size``; ragged:
   Edge-LLM's run-time values :data:`~trtio.testing.toy_engines.RAGGED_DEMO_TREE`), whose tokens
   must equal the greedy ones, and how much the base accepted of the draft's proposals
   (:class:`~trtio.testing.toy_runtime.SpecStats`: the acceptance rate per draft level, the mean accepted
   tokens per verify, the drafted tree nodes accepted);
3. on the ragged contract, requests that arrive and leave the LLM setup
   (:mod:`trtio._tools.admissions`): prompts of different lengths admitted into free slots at different
   steps while the others decode, one finishing early and its slot reused by a request that starts from a
   pinned prefix, the KV pages in use at each event, and each request's tokens checked against its solo
   greedy run;
4. the binding tables, the memory reports and the graph statistics of both setups;
5. with the ragged contract, the hybrid toy directories (:mod:`trtio._tools.hybrid_demo`: Gated DeltaNet and
   Mamba2, recurrent state per slot): greedy decoding and the admission story; and the MTP pairs
   (:mod:`trtio._tools.mtp_demo`: on a dense and on a hybrid base), and the DFlash ones
   (:mod:`trtio._tools.dflash_demo`): speculative tokens equal to greedy ones.

:func:`run_demo` returns a JSON-able summary (shared options at the top, one section per contract
under ``"contracts"``); :func:`format_demo` renders it for a terminal.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from trtio import names
from trtio._cuda.backend import Backend, Location, cuda_available
from trtio._engine import EngineIO
from trtio._setups import LLMSetup, create_for_llm, create_for_spec_decode
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio._tools.admissions import format_admissions, run_admissions, story_requests, summarize_admissions
from trtio._tools.binding_table import binding_rows, format_binding_table
from trtio._tools.dflash_demo import format_dflash, run_dflash
from trtio._tools.gemma4_demo import format_gemma4, run_gemma4
from trtio._tools.hybrid_demo import format_hybrid, run_hybrid
from trtio._tools.inspection import check_fits
from trtio._tools.lora_demo import format_lora, run_lora
from trtio._tools.mtp_demo import format_mtp, run_mtp
from trtio._tools.options import backend_option, cuda_status
from trtio._trt import KNOWN_MODULES
from trtio.errors import ConfigError
from trtio.testing.toy_engines import (
    ENGINE_NAMES,
    RAGGED_DEMO_TREE,
    RAGGED_DIRS,
    RAGGED_ENGINE_NAMES,
    RAGGED_SEED,
    RaggedToyEngines,
    ToyEngines,
    default_engines_dir,
)
from trtio.testing.toy_runtime import embed_batch, spec_generate

__all__ = ["DemoOptions", "demo_prompts", "format_demo", "run_demo"]

log = logging.getLogger("trtio")

CONTRACTS = ("batch", "ragged", "both")
BACKENDS = ("auto", "host", "cuda")
ENGINE_KINDS = ("auto", "trt", "reference")
MODULES = ("auto",) + KNOWN_MODULES
PROMPT_LENGTHS = (5, 12, 3, 8)


@dataclass(frozen=True)
class DemoOptions:
    """What ``trtio demo`` takes (its command-line options)."""

    contract: str = "both"  # "batch" | "ragged" | "both"
    backend: str = "auto"  # "host" | "cuda" | "auto"
    engine: str = "auto"  # batch contract: "trt" (plans) | "reference" (ReferenceEngine) | "auto"
    module: str = "auto"  # TensorRT module for plans: "tensorrt" | "tensorrt_rtx" | "auto"
    engines_dir: Path | None = None  # default: the repository's engines/
    plans_dir: Path | None = None  # default: beside the configs, engines/build, else the plan cache
    max_new_tokens: int = 20
    graphs: bool = True
    progress: TextIO | None = None  # where plan builds draw their progress (default stderr)

    @property
    def contracts(self) -> tuple[str, ...]:
        """The contracts to run, in order."""
        return ("batch", "ragged") if self.contract == "both" else (self.contract,)

    def validate(self) -> DemoOptions:
        for flag, value, allowed in (("--contract", self.contract, CONTRACTS), ("--backend", self.backend, BACKENDS),
                                     ("--engine", self.engine, ENGINE_KINDS), ("--module", self.module, MODULES)):
            if value not in allowed:
                raise ConfigError(flag, f"unknown value {value!r}; expected {', '.join(allowed)}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or not 1 <= self.max_new_tokens <= 64:
            raise ConfigError("--max-new-tokens", f"must be an int in 1..64, got {self.max_new_tokens!r}")
        if self.engine == "trt" and self.backend == "host":
            raise ConfigError("--engine", "trt: TensorRT plans run on the cuda backend; use --backend cuda (or auto), "
                                          "or --engine reference")
        if self.contract == "ragged":
            no_plans = ("the ragged toy engines run as ReferenceEngines (plans of Edge-LLM's contract come from "
                        "its own builder); it applies to --contract batch or both")
            if self.engine == "trt":
                raise ConfigError("--engine", f"trt: {no_plans}")
            if self.plans_dir is not None:
                raise ConfigError("--plans", no_plans)
        return self


def demo_prompts(vocab: int, seed: int) -> list[list[int]]:
    """Four seeded prompts of different lengths (5, 12, 3 and 8 tokens)."""
    rng = np.random.default_rng(seed + 1)
    return [[int(t) for t in rng.integers(0, vocab, n)] for n in PROMPT_LENGTHS]


# -- engines --------------------------------------------------------------------------------------


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _choose(opts: DemoOptions) -> tuple[str, Backend, str]:
    """(engine kind, backend, why) for the options on this machine."""
    if opts.engine == "trt":
        if not cuda_available():
            raise ConfigError("--engine", f"trt: TensorRT plans need a CUDA device, and none is usable here: "
                                          f"{cuda_status()}; use --engine reference (or auto)")
        return "trt", backend_option("cuda"), "--engine trt"
    be = backend_option(opts.backend)
    module = "tensorrt" if opts.module == "auto" else opts.module
    if opts.engine == "auto" and be.name == "cuda" and _importable(module):
        return "trt", be, "TensorRT imports and a GPU answers"
    why = "--engine reference" if opts.engine == "reference" else (
        cuda_status() if be.name == "host" else "tensorrt does not import")
    be, why = _reference_backend(opts, be, why)
    return "reference", be, why


def _reference_backend(opts: DemoOptions, be: Backend, why: str) -> tuple[Backend, str]:
    """The backend ReferenceEngines compute on: the host where the cuda backend has no CuPy (an error
    where ``--backend cuda`` asked for it)."""
    if be.name == "cuda" and not _importable("cupy"):
        if opts.backend == "cuda":
            raise ConfigError("--backend", "the reference engines need CuPy on the cuda backend; install cupy, "
                                           "or use --backend host")
        return backend_option("host"), why + "; CuPy is missing, so the reference engines compute on the host"
    return be, why


def _choose_ragged(opts: DemoOptions) -> tuple[Backend, str]:
    """(backend, why) for the ragged toy engines, which are always ReferenceEngines."""
    always = "always ReferenceEngines: plans of this contract come from Edge-LLM's builder"
    be = backend_option(opts.backend)
    why = "--backend host" if opts.backend == "host" else ("no CUDA" if be.name == "host" else "a GPU answers")
    be, why = _reference_backend(opts, be, why)
    return be, f"{always}; {why}"


def _locate_plans(toys: ToyEngines, opts: DemoOptions) -> tuple[dict[str, Path], str]:
    if opts.plans_dir is not None:
        plans = toys.plans_in(opts.plans_dir)
        if plans is None:
            raise ConfigError(str(opts.plans_dir), "holds no toy plans (" + ", ".join(f"{n}/model.plan" for n in
                              ENGINE_NAMES) + "); build them with scripts/build_toy_engines.py --out DIR")
        return plans, str(opts.plans_dir)
    for candidate in (toys.root, toys.root / "build"):
        try:
            plans = toys.plans_in(candidate)
        except ConfigError as exc:
            log.info("demo: not using the plans in %s: %s", candidate, exc)
            continue
        if plans is not None:
            return plans, str(candidate)
    plans = toys.cached_plans(opts.module, progress=True, stream=opts.progress or sys.stderr)
    return plans, str(plans["toy-llm"].parent.parent)


def _open_engines(toys: ToyEngines, kind: str, be: Backend, opts: DemoOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    if kind == "reference":
        device = "host" if be.name == "host" else "gpu"
        engines = {name: toys.reference_engine(name, device=device) for name in ENGINE_NAMES}
        return engines, {"kind": "reference", "device": device}
    from trtio._trt import import_trt, load_engine  # noqa: PLC0415 - TensorRT only where asked for

    plans, where = _locate_plans(toys, opts)
    trt = import_trt(opts.module)
    engines = {}
    for name, path in plans.items():
        engines[name] = load_engine(path, trt)
        config = toys.root / ("toy-llm" if name == "toy-llm" else "toy-eagle") / "config.json"
        check_fits(EngineIO.from_engine(engines[name]), toys.config(name), f"plan {path}", config)
    return engines, {"kind": "trt", "module": trt.__name__, "version": getattr(trt, "__version__", "?"),
                     "plans": {n: str(p) for n, p in plans.items()}, "plans_dir": where}


# -- the runs ---------------------------------------------------------------------------------------


def _greedy(setup: LLMSetup, embedding: np.ndarray, prompts: list[list[int]], max_new: int, main: Stream,
            consumer: Stream, be: Backend, name: str) -> tuple[list[list[int]], dict[str, Any], dict[str, float]]:
    """Greedy decoding; where the engine has a ``hidden_states`` output, the prefill snapshot is streamed
    to a consumer on another stream while the decode loop runs."""
    io = setup.io
    dtype = io.inputs_embeds.dtype.numpy
    emb, lens = embed_batch(embedding, prompts, dtype)
    streams = names.kOutputHiddenStates in setup.executor.io
    setup.reset(main)
    t0 = time.perf_counter()
    logits = setup.prefill(emb, lens, main).to_numpy(main)
    t_prefill = time.perf_counter() - t0
    got_embeds = got_hidden = None
    if streams:
        # What the consumer must see: the live buffers as the prefill left them.
        live_embeds = io.inputs_embeds.to_numpy(main)
        live_hidden = io.output_hidden_states.to_numpy(main)
        setup.populate_streaming(main)
        snap = io.streaming_prefill
        shape = snap.input_embeds.shape
        got_embeds = Tensor.empty(shape, snap.input_embeds.dtype, Location.PINNED, name="consumer.input_embeds",
                                  backend=be)
        got_hidden = Tensor.empty(shape, snap.engine_hidden_states.dtype, Location.PINNED,
                                  name="consumer.engine_hidden_states", backend=be)
    try:
        if got_embeds is not None and got_hidden is not None:
            snap.ready_event.wait(consumer)  # the consumer's stream waits for the snapshot copies, not the host
            got_embeds.copy_from(snap.input_embeds, consumer)
            got_hidden.copy_from(snap.engine_hidden_states, consumer)
            snap.release(consumer)

        out: list[list[int]] = [[] for _ in prompts]
        t0 = time.perf_counter()
        steps = 0
        for step in range(max_new):
            nxt = logits.argmax(axis=-1)
            for b, t in enumerate(nxt):
                out[b].append(int(t))
            if step + 1 == max_new:
                break
            logits = setup.decode(embedding[nxt][:, None, :].astype(dtype), main).to_numpy(main)
            steps += 1
        t_decode = time.perf_counter() - t0

        streaming: dict[str, Any] = {
            "checked": False,
            "why": f"{name} declares no {names.kOutputHiddenStates} output (nor do Edge-LLM's plain LLM engines), "
                   "so there is no prefill snapshot to stream",
        }
        if got_embeds is not None and got_hidden is not None:
            consumer.synchronize()
            seen_embeds = got_embeds.to_numpy(consumer)
            seen_hidden = got_hidden.to_numpy(consumer)
            now = io.inputs_embeds.to_numpy(main).reshape(-1)
            overwritten = not np.array_equal(now.view(np.uint8), live_embeds.reshape(-1)[:now.size].view(np.uint8))
            streaming = {
                "checked": True,
                "identical": seen_embeds.tobytes() == live_embeds.tobytes()
                and seen_hidden.tobytes() == live_hidden.tobytes(),
                "input_embeds_identical": seen_embeds.tobytes() == live_embeds.tobytes(),
                "hidden_states_identical": seen_hidden.tobytes() == live_hidden.tobytes(),
                "shape": list(shape),
                "dtype": str(snap.input_embeds.dtype),
                "bytes": int(seen_embeds.nbytes + seen_hidden.nbytes),
                "live_overwritten_by_decode": bool(overwritten),
            }
    finally:
        for t in (got_embeds, got_hidden):
            if t is not None:
                t.close()
    timings = {"prefill_s": t_prefill, "decode_s": t_decode, "decode_steps": steps,
               "decode_step_ms": 1e3 * t_decode / max(steps, 1)}
    return out, streaming, timings


@dataclass
class _Pair:
    """One contract's engines and configs, ready to run."""

    names: dict[str, str]  # role -> engine name
    llm_engine: Any
    llm_cfg: Any
    base_engine: Any
    draft_engine: Any
    bundle: Any
    embedding: np.ndarray
    seed: int


def _run_contract(pair: _Pair, be: Backend, opts: DemoOptions) -> dict[str, Any]:
    """Greedy (with the streaming check where it applies) and speculative decoding on one contract."""
    spec = pair.bundle.spec
    assert spec is not None
    depth, top_k = spec.drafting_step, spec.drafting_top_k
    prompts = demo_prompts(pair.llm_cfg.vocab_size, pair.seed)
    main = Stream.create(be)
    consumer = Stream.create(be)
    try:
        t0 = time.perf_counter()
        with create_for_llm(pair.llm_engine, pair.llm_cfg, main, graphs=opts.graphs, backend=be) as llm:
            t_setup_llm = time.perf_counter() - t0
            contract = llm.contract
            vanilla, streaming, greedy_t = _greedy(llm, pair.embedding, prompts, opts.max_new_tokens, main,
                                                   consumer, be, pair.names["llm"])
            bindings = {"llm": binding_rows(llm)["llm"]}
            memory = {"llm": llm.memory_report()}
            graph_stats = {role: dataclasses.asdict(g) for role, g in llm.graph_stats.items()}
            admissions = None
            if contract == "ragged":  # sequences that come and go: slots, pages on demand, a pinned prefix
                requests = story_requests(prompts, pair.llm_cfg.vocab_size, pair.seed, opts.max_new_tokens)
                admissions = run_admissions(llm, pair.embedding, requests, main)
        t0 = time.perf_counter()
        with create_for_spec_decode(pair.base_engine, pair.draft_engine, pair.bundle, stream=main,
                                    graphs=opts.graphs, backend=be) as sd:
            t_setup_sd = time.perf_counter() - t0
            t0 = time.perf_counter()
            tokens, stats = spec_generate(sd, pair.embedding, prompts, opts.max_new_tokens, depth=depth, top_k=top_k,
                                          verify_size=spec.verify_size, stream=main)
            t_spec = time.perf_counter() - t0
            rows = binding_rows(sd)
            bindings["base"], bindings["draft"] = rows["base"], rows["draft"]
            memory["spec_decode"] = sd.memory_report()
            graph_stats.update({role: dataclasses.asdict(g) for role, g in sd.graph_stats.items()})
    finally:
        main.close()
        consumer.close()
    equal = tokens == vanilla
    section = {
        "contract": contract,
        "engines": dict(pair.names),
        "backend": be.name,
        "seed": pair.seed,
        "prompts": prompts,
        "vanilla_tokens": vanilla,
        "spec_tokens": tokens,
        "tokens_equal": equal,
        "spec_decode": {
            "tree": {"top_k": top_k, "depth": depth, "draft_nodes": top_k * depth, "verify_size": spec.verify_size},
            "rounds": stats.rounds, "proposed": stats.proposed, "accepted": stats.accepted,
            "acceptance_rate": stats.acceptance_rate, "accepted_per_verify": stats.accepted_per_verify,
            "node_acceptance_rate": stats.node_acceptance_rate, "tokens_per_verify": stats.tokens_per_verify,
            "accepted_per_sequence": list(stats.accepted_per_sequence),
        },
        "streaming": streaming,
        "graph_stats": graph_stats,
        "bindings": bindings,
        "memory": {k: v.to_dict() for k, v in memory.items()},
        "memory_text": {k: str(v) for k, v in memory.items()},
        "timings": {"setup_llm_s": t_setup_llm, **greedy_t, "setup_spec_s": t_setup_sd, "spec_decode_s": t_spec},
        "ok": bool(equal and streaming.get("identical", True)),
    }
    if admissions is not None:
        section["admissions"] = admissions
        section["ok"] = bool(section["ok"] and admissions["equal"])
    return section


def _batch_section(toys: ToyEngines, opts: DemoOptions) -> dict[str, Any]:
    kind, be, why = _choose(opts)
    t0 = time.perf_counter()
    engines, engine_info = _open_engines(toys, kind, be, opts)
    t_engines = time.perf_counter() - t0
    pair = _Pair({"llm": "toy-llm", "base": "toy-eagle/base", "draft": "toy-eagle/draft"}, engines["toy-llm"],
                 toys.llm_config, engines["toy-eagle/base"], engines["toy-eagle/draft"], toys.eagle,
                 toys.embedding(), toys.seed)
    section = _run_contract(pair, be, opts)
    section.update(engine=engine_info, why=why)
    section["timings"]["engines_s"] = t_engines
    return section


def _ragged_section(toys: RaggedToyEngines, opts: DemoOptions) -> dict[str, Any]:
    be, why = _choose_ragged(opts)
    device = "host" if be.name == "host" else "gpu"
    t0 = time.perf_counter()
    llm_name, base_name, draft_name = RAGGED_ENGINE_NAMES
    engines = {name: toys.reference_engine(name, device=device) for name in RAGGED_ENGINE_NAMES}
    t_engines = time.perf_counter() - t0
    pair = _Pair({"llm": llm_name, "base": base_name, "draft": draft_name}, engines[llm_name], toys.llm_config,
                 engines[base_name], engines[draft_name], toys.deployment(*RAGGED_DEMO_TREE), toys.embedding(),
                 toys.seed)
    section = _run_contract(pair, be, opts)
    section.update(engine={"kind": "reference", "device": device}, why=why,
                   directories={"llm": str(toys.llm_dir.path), "spec_decode": str(toys.pair_dir.path)})
    section["timings"]["engines_s"] = t_engines
    return section


def run_demo(opts: DemoOptions | None = None) -> dict[str, Any]:
    """Run the demo (module docstring) and return its summary: ``contract``, ``engines_dir``, ``graphs``,
    ``max_new_tokens``, ``contracts`` (``{"batch": {...}, "ragged": {...}}``: each contract's engines,
    backend, prompts, tokens, spec-decode statistics, streaming check, graph statistics, bindings, memory
    and timings; the ragged one also ``admissions``, :func:`~trtio._tools.admissions.run_admissions`' story),
    ``timings`` and ``ok``, which is False when any contract's speculative tokens differ from its greedy ones,
    a streamed snapshot is not byte-identical, or a request of the admission story differs from its solo run."""
    opts = (opts or DemoOptions()).validate()
    t_start = time.perf_counter()
    root = opts.engines_dir if opts.engines_dir is not None else default_engines_dir()
    # Every engine folder is read before anything runs, so a bad one fails fast.
    toys = ToyEngines.load(root) if "batch" in opts.contracts else None
    ragged = None
    if "ragged" in opts.contracts:
        if opts.contract == "both" and not any((root / d).is_dir() for d in RAGGED_DIRS):
            raise ConfigError(str(root / RAGGED_DIRS[0]), f"no such engine directory: {root} has no ragged toy "
                                                          f"engines ({RAGGED_DIRS[0]}/, {RAGGED_DIRS[1]}/); run "
                                                          "--contract batch for a folder of batch toys only")
        ragged = RaggedToyEngines.load(root)
    sections: dict[str, Any] = {}
    for contract in opts.contracts:
        if contract == "batch":
            assert toys is not None
            sections["batch"] = _batch_section(toys, opts)
        else:
            assert ragged is not None
            sections["ragged"] = _ragged_section(ragged, opts)
    hybrid: dict[str, Any] = {}
    lora: dict[str, Any] = {}
    mtp: dict[str, Any] = {}
    dflash: dict[str, Any] = {}
    gemma4: dict[str, Any] = {}
    if "ragged" in opts.contracts:  # hybrid models speak the ragged contract: their toy directories run with it
        assert ragged is not None
        be, _why = _choose_ragged(opts)
        prompts = demo_prompts(ragged.llm_config.vocab_size, RAGGED_SEED)
        hybrid = run_hybrid(root, prompts, opts.max_new_tokens, be, graphs=opts.graphs)
        lora = run_lora(root, prompts, opts.max_new_tokens, be, graphs=opts.graphs)
        mtp = run_mtp(root, prompts, opts.max_new_tokens, be, graphs=opts.graphs)
        dflash = run_dflash(root, prompts, opts.max_new_tokens, be, graphs=opts.graphs)
        gemma4 = run_gemma4(root, prompts, opts.max_new_tokens, be, graphs=opts.graphs)
    return {
        "contract": opts.contract,
        "engines_dir": str(root),
        "graphs": opts.graphs,
        "max_new_tokens": opts.max_new_tokens,
        "contracts": sections,
        "hybrid": hybrid,
        "lora": lora,
        "mtp": mtp,
        "dflash": dflash,
        "gemma4": gemma4,
        "timings": {"total_s": time.perf_counter() - t_start},
        "ok": all(s["ok"] for s in sections.values())
        and all(h["ok"] for h in [*hybrid.values(), *lora.values(), *mtp.values(), *dflash.values(),
                                  *gemma4.values()]),
    }


# -- text -------------------------------------------------------------------------------------------


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def _tokens(rows: list[list[int]], indent: str = "  ") -> list[str]:
    return [f"{indent}[{i}] " + " ".join(str(t) for t in row) for i, row in enumerate(rows)]


def _graphs(stats: dict[str, Any]) -> str:
    return (f"{stats['hits']} replays, {stats['captures']} captures, {stats['graphs']} graphs"
            + (f" (last capture: {stats['last_miss_reason']})" if stats.get("last_miss_reason") else ""))


def _engines(s: dict[str, Any]) -> str:
    e = s["engine"]
    if e["kind"] == "trt":
        return f"TensorRT plans ({e['module']} {e['version']}, from {e['plans_dir']})"
    return f"ReferenceEngines ({'numpy' if e['device'] == 'host' else 'CuPy'})"


def _graph_mode(graphs: bool, backend: str) -> str:
    """What "graphs" means on this backend: CUDA graphs on a GPU, the host backend's recorded steps elsewhere."""
    if not graphs:
        return "decode steps enqueued one by one (--no-graphs)"
    if backend == "cuda":
        return "decode steps replayed as CUDA graphs"
    return "decode steps replayed as graphs of the host backend (its recorded numpy work; no CUDA here)"


_TITLES = {
    "batch": "batch contract: toy-llm and toy-eagle (batch-major [B, S, H], contiguous KV caches)",
    "ragged": "ragged contract: toy-llm-ragged and toy-eagle3-ragged (Edge-LLM 0.11 engine directories: "
              "token-major [T, H], paged KV pools)",
}


def _spec_line(s: dict[str, Any]) -> str:
    sd, tree = s["spec_decode"], s["spec_decode"]["tree"]
    return (f"speculative tokens ({s['engines']['base']} + {s['engines']['draft']}, create_for_spec_decode, EAGLE "
            f"trees of top-{tree['top_k']} x {tree['depth']} levels, verify {tree['verify_size']}): equal the greedy "
            f"ones: {_yes(s['tokens_equal'])}; acceptance rate {sd['acceptance_rate']:.3f} "
            f"({sd['accepted_per_verify']:.2f} accepted tokens per verify)")


def _streaming_line(st: dict[str, Any]) -> str:
    if not st["checked"]:
        return f"streaming prefill snapshot: not checked: {st['why']}"
    return (f"streaming prefill snapshot (read on another stream while decode overwrote the live buffers): identical "
            f"to the prefill-time buffers: {_yes(st['identical'])}")


def _brief_section(key: str, s: dict[str, Any]) -> list[str]:
    """A contract in a few lines: the tokens, the acceptance, the sequences, the checks."""
    lines = [f"{_TITLES[key]}; {_engines(s)} on the {s['backend']} backend ({s['why']})",
             f"  greedy tokens ({s['engines']['llm']}, create_for_llm):", *_tokens(s["vanilla_tokens"], "    "),
             "  " + _spec_line(s), "  " + _streaming_line(s["streaming"])]
    if "admissions" in s:
        lines.append("  " + summarize_admissions(s["admissions"]))
    return lines


def _format_section(key: str, s: dict[str, Any]) -> list[str]:
    """A contract in full (``--verbose``): tokens, tree, acceptance, streaming, the admission story, every binding,
    the memory reports and the graph statistics."""
    sd, st, t = s["spec_decode"], s["streaming"], s["timings"]
    lens = ", ".join(str(len(p)) for p in s["prompts"])
    n = s["engines"]
    lines = [
        f"== {_TITLES[key]} ==",
        f"engines: {_engines(s)} on the {s['backend']} backend ({s['why']})",
        f"prompts: {len(s['prompts'])} of lengths {lens} (seed {s['seed']})",
        "",
        f"greedy ({n['llm']}, create_for_llm): prefill {1e3 * t['prefill_s']:.1f} ms, decode "
        f"{t['decode_step_ms']:.2f} ms/step",
        *_tokens(s["vanilla_tokens"]),
        f"speculative ({n['base']} + {n['draft']}, create_for_spec_decode, EAGLE tree drafting: "
        f"top_k={sd['tree']['top_k']} per level, {sd['tree']['depth']} levels, {sd['tree']['draft_nodes']} draft "
        f"nodes, verify trees of {sd['tree']['verify_size']}): {sd['rounds']} verify rounds, "
        f"{t['spec_decode_s']:.2f} s",
        *_tokens(s["spec_tokens"]),
        f"acceptance rate: {sd['acceptance_rate']:.3f} of the {sd['tree']['depth']} draft levels per verify "
        f"(mean accepted tokens per verify: {sd['accepted_per_verify']:.2f}; {sd['tokens_per_verify']:.2f} tokens "
        f"per verify step with the base's own); {sd['accepted']} of {sd['proposed']} drafted tree nodes accepted "
        f"({sd['node_acceptance_rate']:.3f}; at most 1 in {sd['tree']['top_k']}: one node per level can be)",
        f"spec-decode tokens equal vanilla tokens: {_yes(s['tokens_equal'])}",
        "",
    ]
    if "admissions" in s:
        lines += [*format_admissions(s["admissions"], n["llm"]), ""]
    if st["checked"]:
        lines += [
            f"streaming prefill snapshot: populate_streaming() after prefill; a consumer stream waited on "
            f"ready_event and copied 2 x {'x'.join(map(str, st['shape']))} {st['dtype']} ({st['bytes']} bytes) "
            f"while decode ran",
            f"snapshot identical to the prefill-time buffers: {_yes(st['identical'])} (live buffers overwritten by "
            f"decode since: {_yes(st['live_overwritten_by_decode'])})",
        ]
    else:
        lines.append(f"streaming prefill snapshot: not checked: {st['why']}")
    lines.append("")
    titles = {"llm": f"{n['llm']} (create_for_llm), shapes of its last decode step",
              "base": f"{n['base'].replace('/', ' ')} (create_for_spec_decode), shapes of its last verify",
              "draft": f"{n['draft'].replace('/', ' ')} (create_for_spec_decode), shapes of its last catch-up"}
    for role, rows in s["bindings"].items():
        lines.append(f"bindings of {titles[role]}:")
        lines.extend(format_binding_table(rows))
        lines.append("")
    for mem in ("llm", "spec_decode"):
        lines.append(f"memory: {s['memory_text'][mem]}")
        lines.append("")
    graphs = "CUDA graphs" if s["backend"] == "cuda" else "graphs (the host backend's recorded steps)"
    lines.append(f"{graphs}: " + "; ".join(f"{role} {_graphs(g)}" for role, g in s["graph_stats"].items()))
    lines.append("")
    return lines


def _verdict(key: str, s: dict[str, Any]) -> str:
    st = s["streaming"]
    snap = f"snapshot identical {_yes(st['identical'])}" if st["checked"] else "snapshot not checked (no hidden_states)"
    sd = s["spec_decode"]
    story = f", admissions equal {_yes(s['admissions']['equal'])}" if "admissions" in s else ""
    return (f"{key}: tokens equal {_yes(s['tokens_equal'])}, acceptance rate {sd['acceptance_rate']:.3f} "
            f"({sd['accepted_per_verify']:.2f} accepted tokens per verify), {snap}{story}")


def format_demo(s: dict[str, Any], *, verbose: bool = False) -> str:
    """The summary of :func:`run_demo` as text: a few lines per contract (the tokens, the acceptance rate, the
    sequences, the result; under 40 lines in all), or with ``verbose`` everything, the binding tables, memory
    reports, graph statistics and timings included."""
    contracts = s["contracts"]
    first = next(iter(contracts.values()))
    lens = ", ".join(str(len(p)) for p in first["prompts"])
    lines = [f"trtio demo: the toy engines of {s['engines_dir']}, {' and '.join(contracts)} contract"
             f"{'s' if len(contracts) > 1 else ''}; {s['max_new_tokens']} new tokens for each of "
             f"{len(first['prompts'])} prompts (lengths {lens})",
             f"graphs: {_graph_mode(s['graphs'], first['backend'])}", ""]
    for key, section in contracts.items():
        lines += _format_section(key, section) if verbose else [*_brief_section(key, section), ""]
    lines += format_hybrid(s.get("hybrid", {}), verbose=verbose)
    lines += format_lora(s.get("lora", {}), verbose=verbose)
    lines += format_mtp(s.get("mtp", {}), verbose=verbose)
    lines += format_dflash(s.get("dflash", {}), verbose=verbose)
    lines += format_gemma4(s.get("gemma4", {}), verbose=verbose)
    if verbose:
        engines_s = sum(sec["timings"]["engines_s"] for sec in contracts.values())
        lines.append(f"time: engines {engines_s:.2f} s, total {s['timings']['total_s']:.2f} s")
    else:
        lines.append("(--verbose adds every binding, the memory reports, graph statistics, the requests' story and "
                     "timings; --json all of it)")
    verdicts = [_verdict(k, sec) for k, sec in contracts.items()]
    verdicts += [f"{k}: speculative equal {_yes(m['ok'])}" for k, m in [*s.get("mtp", {}).items(),
                                                                         *s.get("dflash", {}).items()]]
    verdicts += [f"{k}: admissions equal {_yes(h['ok'])}" for k, h in s.get("hybrid", {}).items()]
    verdicts += [f"{k}: adapters switch cleanly {_yes(x['ok'])}" for k, x in s.get("lora", {}).items()]
    verdicts += [f"{k}: bounded SWA equal {_yes(x['ok'])}" for k, x in s.get("gemma4", {}).items()]
    lines.append("result: " + "; ".join(verdicts) + f" -> {'OK' if s['ok'] else 'FAILED'}")
    return "\n".join(lines)
