"""``trtio demo``: the toy engines end to end — greedy, speculative decoding, streaming, bindings.

The demo loads the toy engines of ``engines/`` (:mod:`trtio.testing.toy_engines`): real plans
with TensorRT where ``tensorrt`` imports and a GPU answers (built into a cache folder on first
use), else :class:`~trtio.testing.ReferenceEngine` s on the best backend. Then:

1. greedy generation for four prompts of different lengths with ``create_for_llm`` (decode loop
   with CUDA graphs), and, right after the prefill, a streaming snapshot: ``populate_streaming()``,
   a consumer on another :class:`~trtio.Stream` that waits on ``streaming_prefill.ready_event``
   and copies the snapshot out while the decode loop overwrites the live buffers, and a byte
   comparison with copies of the live buffers taken right after the prefill;
2. speculative decoding of the same prompts with ``create_for_spec_decode`` (EAGLE draft, a tree
   of the ``spec`` section's ``drafting_top_k`` / ``drafting_step``), whose tokens must equal the
   greedy ones;
3. the binding tables, the memory reports and the graph statistics of both setups.

:func:`run_demo` returns a JSON-able summary; :func:`format_demo` renders it for a terminal.
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

from trtio.cuda.backend import Backend, Location, get_backend
from trtio.engine import EngineIO
from trtio.errors import ConfigError
from trtio.setups import LLMSetup, create_for_llm, create_for_spec_decode
from trtio.stream import Stream
from trtio.tensor import Tensor
from trtio.testing.toy_engines import ENGINE_NAMES, ToyEngines
from trtio.testing.toy_runtime import embed_batch, spec_generate
from trtio.tools.binding_table import binding_rows, format_binding_table
from trtio.tools.inspection import check_fits
from trtio.trt import KNOWN_MODULES

__all__ = ["DemoOptions", "demo_prompts", "format_demo", "run_demo"]

log = logging.getLogger("trtio")

BACKENDS = ("auto", "host", "cuda")
ENGINE_KINDS = ("auto", "trt", "reference")
MODULES = ("auto",) + KNOWN_MODULES
PROMPT_LENGTHS = (5, 12, 3, 8)


@dataclass(frozen=True)
class DemoOptions:
    """What ``trtio demo`` takes (its command-line options)."""

    backend: str = "auto"  # "host" | "cuda" | "auto"
    engine: str = "auto"  # "trt" (plans) | "reference" (ReferenceEngine) | "auto"
    module: str = "auto"  # TensorRT module for plans: "tensorrt" | "tensorrt_rtx" | "auto"
    engines_dir: Path | None = None  # default: the repository's engines/
    plans_dir: Path | None = None  # default: beside the configs, engines/build, else the plan cache
    max_new_tokens: int = 20
    graphs: bool = True
    progress: TextIO | None = None  # where plan builds draw their progress (default stderr)

    def validate(self) -> DemoOptions:
        for flag, value, allowed in (("--backend", self.backend, BACKENDS), ("--engine", self.engine, ENGINE_KINDS),
                                     ("--module", self.module, MODULES)):
            if value not in allowed:
                raise ConfigError(flag, f"unknown value {value!r}; expected {', '.join(allowed)}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or not 1 <= self.max_new_tokens <= 64:
            raise ConfigError("--max-new-tokens", f"must be an int in 1..64, got {self.max_new_tokens!r}")
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
        be = get_backend("cuda" if opts.backend == "auto" else opts.backend)
        if be.name != "cuda":
            raise ConfigError("--engine", "TensorRT plans run on the cuda backend; use --backend cuda (or auto), "
                                          "or --engine reference")
        return "trt", be, "--engine trt"
    be = get_backend(opts.backend)
    module = "tensorrt" if opts.module == "auto" else opts.module
    if opts.engine == "auto" and be.name == "cuda" and _importable(module):
        return "trt", be, "TensorRT imports and a GPU answers"
    why = "--engine reference" if opts.engine == "reference" else (
        "no CUDA device answers" if be.name == "host" else "tensorrt does not import")
    if be.name == "cuda" and not _importable("cupy"):
        if opts.backend == "cuda":
            raise ConfigError("--backend", "the reference engines need CuPy on the cuda backend; install cupy, "
                                           "or use --backend host")
        be = get_backend("host")
        why += "; CuPy is missing, so the reference engines compute on the host"
    return "reference", be, why


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
    from trtio.trt import import_trt, load_engine  # noqa: PLC0415 - TensorRT only where asked for

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


def _greedy_with_streaming(setup: LLMSetup, embedding: np.ndarray, prompts: list[list[int]], max_new: int,
                           main: Stream, consumer: Stream, be: Backend) -> tuple[list[list[int]], dict[str, Any],
                                                                                 dict[str, float]]:
    """Greedy decoding, with the prefill snapshot streamed to a consumer on another stream."""
    io = setup.io
    dtype = io.inputs_embeds.dtype.numpy
    emb, lens = embed_batch(embedding, prompts, dtype)
    setup.reset(main)
    t0 = time.perf_counter()
    logits = setup.prefill(emb, lens, main).to_numpy(main)
    t_prefill = time.perf_counter() - t0
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

        consumer.synchronize()
        seen_embeds = got_embeds.to_numpy(consumer)
        seen_hidden = got_hidden.to_numpy(consumer)
    finally:
        got_embeds.close()
        got_hidden.close()
    now = io.inputs_embeds.to_numpy(main).reshape(-1)
    overwritten = not np.array_equal(now.view(np.uint8), live_embeds.reshape(-1)[:now.size].view(np.uint8))
    streaming = {
        "identical": seen_embeds.tobytes() == live_embeds.tobytes() and seen_hidden.tobytes() == live_hidden.tobytes(),
        "input_embeds_identical": seen_embeds.tobytes() == live_embeds.tobytes(),
        "hidden_states_identical": seen_hidden.tobytes() == live_hidden.tobytes(),
        "shape": list(shape),
        "dtype": str(snap.input_embeds.dtype),
        "bytes": int(seen_embeds.nbytes + seen_hidden.nbytes),
        "live_overwritten_by_decode": bool(overwritten),
    }
    timings = {"prefill_s": t_prefill, "decode_s": t_decode, "decode_steps": steps,
               "decode_step_ms": 1e3 * t_decode / max(steps, 1)}
    return out, streaming, timings


def run_demo(opts: DemoOptions | None = None) -> dict[str, Any]:
    """Run the demo (module docstring) and return its summary; ``summary["ok"]`` is False when the
    speculative tokens differ from the greedy ones or the streamed snapshot is not byte-identical."""
    opts = (opts or DemoOptions()).validate()
    t_start = time.perf_counter()
    toys = ToyEngines.load(opts.engines_dir)
    kind, be, why = _choose(opts)
    t0 = time.perf_counter()
    engines, engine_info = _open_engines(toys, kind, be, opts)
    t_engines = time.perf_counter() - t0
    llm_cfg, bundle = toys.llm_config, toys.eagle
    spec = bundle.spec
    assert spec is not None
    depth, top_k = spec.drafting_step, spec.drafting_top_k
    embedding = toys.embedding()
    prompts = demo_prompts(llm_cfg.vocab_size, toys.seed)
    summary: dict[str, Any] = {
        "engines_dir": str(toys.root),
        "engine": engine_info,
        "backend": be.name,
        "why": why,
        "graphs": opts.graphs,
        "seed": toys.seed,
        "prompts": prompts,
        "max_new_tokens": opts.max_new_tokens,
    }
    main = Stream.create(be)
    consumer = Stream.create(be)
    try:
        t0 = time.perf_counter()
        with create_for_llm(engines["toy-llm"], llm_cfg, main, graphs=opts.graphs, backend=be) as llm:
            t_setup_llm = time.perf_counter() - t0
            vanilla, streaming, greedy_t = _greedy_with_streaming(llm, embedding, prompts, opts.max_new_tokens,
                                                                  main, consumer, be)
            bindings = {"llm": binding_rows(llm)["llm"]}
            memory = {"llm": llm.memory_report()}
            graph_stats = {"llm": dataclasses.asdict(llm.graph_stats)}
        t0 = time.perf_counter()
        with create_for_spec_decode(engines["toy-eagle/base"], engines["toy-eagle/draft"], bundle, stream=main,
                                    graphs=opts.graphs, backend=be) as sd:
            t_setup_sd = time.perf_counter() - t0
            t0 = time.perf_counter()
            tokens, stats = spec_generate(sd, embedding, prompts, opts.max_new_tokens, depth=depth, top_k=top_k,
                                          stream=main)
            t_spec = time.perf_counter() - t0
            rows = binding_rows(sd)
            bindings["base"], bindings["draft"] = rows["base"], rows["draft"]
            memory["spec_decode"] = sd.memory_report()
            graph_stats.update({role: dataclasses.asdict(g) for role, g in sd.graph_stats.items()})
    finally:
        main.close()
        consumer.close()
    equal = tokens == vanilla
    summary.update({
        "vanilla_tokens": vanilla,
        "spec_tokens": tokens,
        "tokens_equal": equal,
        "spec_decode": {
            "tree": {"top_k": top_k, "depth": depth, "draft_nodes": top_k * depth, "verify_size": spec.verify_size},
            "rounds": stats.rounds, "proposed": stats.proposed, "accepted": stats.accepted,
            "acceptance_rate": stats.acceptance_rate, "tokens_per_verify": stats.tokens_per_verify,
            "accepted_per_sequence": list(stats.accepted_per_sequence),
        },
        "streaming": streaming,
        "graph_stats": graph_stats,
        "bindings": bindings,
        "memory": {k: v.to_dict() for k, v in memory.items()},
        "memory_text": {k: str(v) for k, v in memory.items()},
        "timings": {"engines_s": t_engines, "setup_llm_s": t_setup_llm, **greedy_t, "setup_spec_s": t_setup_sd,
                    "spec_decode_s": t_spec, "total_s": time.perf_counter() - t_start},
        "ok": bool(equal and streaming["identical"]),
    })
    return summary


# -- text -------------------------------------------------------------------------------------------


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def _tokens(rows: list[list[int]]) -> list[str]:
    return [f"  [{i}] " + " ".join(str(t) for t in row) for i, row in enumerate(rows)]


def _graphs(stats: dict[str, Any]) -> str:
    return (f"{stats['hits']} replays, {stats['captures']} captures, {stats['graphs']} graphs"
            + (f" (last capture: {stats['last_miss_reason']})" if stats.get("last_miss_reason") else ""))


def format_demo(s: dict[str, Any]) -> str:
    """The summary of :func:`run_demo` as text."""
    e = s["engine"]
    if e["kind"] == "trt":
        engines = f"TensorRT plans ({e['module']} {e['version']}, from {e['plans_dir']})"
    else:
        engines = f"ReferenceEngines ({'numpy' if e['device'] == 'host' else 'CuPy'})"
    sd, st, t = s["spec_decode"], s["streaming"], s["timings"]
    lens = ", ".join(str(len(p)) for p in s["prompts"])
    lines = [
        f"trtio demo: toy-llm and toy-eagle from {s['engines_dir']} (seed {s['seed']})",
        f"engines: {engines} on the {s['backend']} backend ({s['why']}); CUDA graphs "
        f"{'on' if s['graphs'] else 'off'}",
        f"prompts: {len(s['prompts'])} of lengths {lens}; {s['max_new_tokens']} new tokens each",
        "",
        f"greedy (create_for_llm): prefill {1e3 * t['prefill_s']:.1f} ms, decode {t['decode_step_ms']:.2f} ms/step",
        *_tokens(s["vanilla_tokens"]),
        f"speculative (create_for_spec_decode, EAGLE tree drafting: top_k={sd['tree']['top_k']} per level, "
        f"{sd['tree']['depth']} levels, {sd['tree']['draft_nodes']} draft nodes, verify trees of "
        f"{sd['tree']['verify_size']}): {sd['rounds']} verify rounds, "
        f"{t['spec_decode_s']:.2f} s",
        *_tokens(s["spec_tokens"]),
        f"acceptance rate: {sd['acceptance_rate']:.3f} ({sd['accepted']} of {sd['proposed']} drafted tokens "
        f"accepted; {sd['tokens_per_verify']:.2f} tokens per verify step)",
        f"spec-decode tokens equal vanilla tokens: {_yes(s['tokens_equal'])}",
        "",
        f"streaming prefill snapshot: populate_streaming() after prefill; a consumer stream waited on "
        f"ready_event and copied 2 x {'x'.join(map(str, st['shape']))} {st['dtype']} ({st['bytes']} bytes) "
        f"while decode ran",
        f"snapshot identical to the prefill-time buffers: {_yes(st['identical'])} (live buffers overwritten by "
        f"decode since: {_yes(st['live_overwritten_by_decode'])})",
        "",
    ]
    titles = {"llm": "toy-llm (create_for_llm), shapes of its last decode step",
              "base": "toy-eagle base (create_for_spec_decode), shapes of its last verify",
              "draft": "toy-eagle draft (create_for_spec_decode), shapes of its last catch-up"}
    for role, rows in s["bindings"].items():
        lines.append(f"bindings of {titles[role]}:")
        lines.extend(format_binding_table(rows))
        lines.append("")
    for key in ("llm", "spec_decode"):
        lines.append(f"memory: {s['memory_text'][key]}")
        lines.append("")
    lines.append("CUDA graphs: " + "; ".join(f"{role} {_graphs(g)}" for role, g in s["graph_stats"].items()))
    lines.append(f"time: engines {t['engines_s']:.2f} s, total {t['total_s']:.2f} s")
    lines.append(f"result: tokens equal {_yes(s['tokens_equal'])}, acceptance rate {sd['acceptance_rate']:.3f}, "
                 f"snapshot identical {_yes(st['identical'])} -> {'OK' if s['ok'] else 'FAILED'}")
    return "\n".join(lines)
