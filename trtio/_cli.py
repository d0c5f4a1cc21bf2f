"""The ``trtio`` command: ``info``, ``demo``, ``generate``, ``inspect``, ``plan``, ``bench``.

``demo`` runs the toy engines of both engine contracts (``--contract batch|ragged|both``); ``generate``,
``inspect`` and ``plan`` take TensorRT Edge-LLM 0.11 engine directories (``config.json`` + ``llm.engine``, or
``base_config.json`` + ``draft_config.json`` + their engines; the engine files optional), trtio's own configs and
plans, and the toy engine directories by name (``toy-llm-ragged``, ``toy-eagle``, ...). ``--debug`` and
``--verbose`` go before or after the command.

Every command prints a human-readable report, or JSON with ``--json``. Exit status (:data:`EXIT_STATUS`): 0
success; 1 the command ran and failed (a missing or corrupt file, a config that does not fit its engine, a
backend this machine lacks, a failed check); 2 the command line itself is wrong (an unknown command or option, a
missing or malformed argument, a value the option does not take, options that exclude each other), refused before
anything is read. Either error is one line on stderr, ``trtio COMMAND: error: ...``; ``--debug`` adds the
traceback. trtio's log goes to stderr: warnings by default (held back when the command fails, so the error stays
one line), everything with ``--verbose``; TensorRT's own log only with ``--verbose`` or ``--debug`` (its errors
reach you inside trtio's error message). A closed standard output (``trtio demo | head``) ends the command quietly
with status 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from trtio.errors import TrtioError

__all__ = ["EXIT_STATUS", "main", "build_parser"]

#: The exit statuses of every command.
EXIT_STATUS = {0: "success", 1: "the command ran and failed", 2: "the command line is wrong (usage error)"}

_EPILOG = ("exit status: 0 success; 1 the command ran and failed (a missing or corrupt file, a config that does not "
           "fit its engine, a backend this machine lacks, a failed check); 2 the command line is wrong (unknown "
           "command or option, a value the option does not take, options that exclude each other). Errors are one "
           "line on stderr; --debug adds the traceback.")


class _UsageError(TrtioError):
    """The command line is wrong in a way argparse cannot see (options that exclude each other): exit status 2."""


# -- commands ---------------------------------------------------------------------------------------


def _cmd_info(args: argparse.Namespace) -> int:
    import numpy as np

    import trtio
    from trtio._cuda.backend import cuda_available
    from trtio._tools.options import cuda_status

    be = trtio.get_backend()
    info = {
        "trtio": trtio.__version__,
        "numpy": np.__version__,
        "backend": be.name,
        "cuda_available": cuda_available(),
    }
    if be.name == "cuda":
        info["device"] = getattr(be, "device_name", "?")
        info["compute_capability"] = list(getattr(be, "compute_capability", ()))
    else:
        info["why_no_cuda"] = cuda_status()
    for mod in ("cuda.bindings", "tensorrt", "tensorrt_rtx", "ml_dtypes", "cupy", "torch", "tokenizers"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            info[mod] = getattr(m, "__version__", "installed")
        except Exception:
            info[mod] = None
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k:>18}: {v}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from trtio._tools.demo import DemoOptions, format_demo, run_demo
    from trtio.errors import ConfigError

    opts = DemoOptions(contract=args.contract, backend=args.backend, engine=args.engine, module=args.module,
                       engines_dir=args.engines,
                       plans_dir=args.plans, max_new_tokens=args.max_new_tokens, graphs=not args.no_graphs,
                       progress=sys.stderr)
    try:
        opts.validate()
    except ConfigError as exc:  # options that exclude each other
        raise _UsageError(str(exc)) from None
    summary = run_demo(opts)
    if args.json:
        summary = dict(summary)
        summary.pop("memory_text", None)
        print(json.dumps(summary, indent=2))
    else:
        print(format_demo(summary, verbose=args.verbose or args.debug))
    return 0 if summary["ok"] else 1


def _cmd_inspect(args: argparse.Namespace) -> int:
    from trtio._tools.inspection import format_inspection, inspect_target
    from trtio._tools.options import engine_path

    result = inspect_target(engine_path(args.target), config=args.config, module=args.module, plugins=args.plugin)
    print(json.dumps(result, indent=2) if args.json else format_inspection(result))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from trtio._tools.inspection import format_plan, plan_config
    from trtio._tools.options import engine_path

    result = plan_config(engine_path(args.config), draft_top_k=args.draft_top_k, draft_step=args.draft_step,
                         verify_size=args.verify_size, sequence_length=args.sequence_length)
    if args.json:
        result = dict(result)
        result.pop("text")
        print(json.dumps(result, indent=2))
    else:
        print(format_plan(result))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from trtio._tools.bench import format_results, machine_name, run

    if args.sequences:
        return _bench_sequences(args, machine_name(args.backend))
    contracts = ("batch", "ragged") if args.contract == "both" else (args.contract,)
    results = run(args.backend, steps=args.steps, rounds=args.rounds, contracts=contracts,
                  kv_capacity=args.kv_capacity, tensor_parallel=(args.tp,) if args.tp else (), inputs=args.inputs)
    if args.json:
        def number(x: float) -> float | None:
            return None if x != x else x  # NaN (not measured on this backend): null

        print(json.dumps({c: {name: {"us_per_call_synced": v.synced, "us_per_call": v.alone,
                                     "device_ops": number(v.ops), "device_work_us": number(v.work)}
                              for name, v in rows.items()} for c, rows in results.items()}, indent=2))
    else:
        print(format_results(results, args.backend, args.inputs))
    return 0


def _bench_sequences(args: argparse.Namespace, machine: str) -> int:
    from trtio._tools.bench_sequences import format_sequences, run_sequences

    if args.contract == "batch":
        raise _UsageError("--contract: batch: --sequences measures the ragged contract (Edge-LLM 0.11's slots and "
                          "paged pools); the batch contract's steps are whole-batch steps")
    results = run_sequences(args.backend, steps=args.steps, kv_capacity=args.kv_capacity)
    print(json.dumps({"sequences": results.to_dict()}, indent=2) if args.json else format_sequences(results, machine))
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from trtio._tools.generate import GenerateOptions, run_generate
    from trtio._tools.options import engine_path

    run_generate(GenerateOptions(path=engine_path(args.engine_dir), prompt=args.prompt,
                                 max_new_tokens=args.max_new_tokens, speculative=args.speculative,
                                 draft_top_k=args.draft_top_k, draft_step=args.draft_step, backend=args.backend,
                                 images=tuple(args.image or ()), audio=tuple(args.audio or ()), lora=args.lora))
    return 0



# -- parser -----------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit status 2), like every other trtio error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _common() -> _Parser:
    """``--debug`` and ``--verbose``, accepted before and after the command.

    A new parent per parser: argparse shares a parent's action objects with every parser made from it,
    so a default set on one would be set on all. The command's copies default to SUPPRESS, so that
    ``trtio --debug inspect X`` keeps the top level's value when the command does not repeat the flag.
    """
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error, and every log message")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log what trtio (and TensorRT) does to stderr; demo: also every binding, the memory "
                             "reports and the graph statistics")
    return common


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {value}")
    return value


def _demo_tokens(text: str) -> int:
    value = _positive_int(text)
    if value > 64:
        raise argparse.ArgumentTypeError(f"expected an int in 1..64 (the toy engines' KV capacity), got {value}")
    return value


def _toy_names() -> str:
    """Every toy engine directory's name, for the commands that take one by name."""
    from trtio.testing.toy_dirs import TOY_DIRECTORIES  # noqa: PLC0415 - only where a parser is built

    return f"{', '.join(TOY_DIRECTORIES[:-1])} or {TOY_DIRECTORIES[-1]}"


_MODULES = ["auto", "tensorrt", "tensorrt_rtx"]


def _add_demo(sub: argparse._SubParsersAction[_Parser]) -> None:
    demo = sub.add_parser(
        "demo", parents=[_common()], epilog=_EPILOG,
        help="run the toy engines: greedy and speculative decoding, sequences that come and go",
        description="Run the toy engines of both engine contracts. Batch contract: toy-llm and toy-eagle "
                    "(TensorRT plans where tensorrt imports and a GPU answers, built on first use; else "
                    "ReferenceEngines). Ragged contract: toy-llm-ragged and toy-eagle3-ragged, engine "
                    "directories in TensorRT Edge-LLM 0.11's layout with paged KV pools (always ReferenceEngines: "
                    "plans of this contract come from Edge-LLM's builder). For each: generate greedily for four "
                    "prompts with create_for_llm, decode them speculatively with create_for_spec_decode (EAGLE "
                    "tree drafting), stream the prefill snapshot to a consumer stream where the engine has a "
                    "hidden_states output; on the ragged contract also serve requests that arrive and leave "
                    "(slots, KV pages on demand, a pinned prefix), each checked against its solo greedy run. "
                    "Prints the tokens, the acceptance rate, the sequences and the result; --verbose adds every "
                    "binding, the memory reports and the graph statistics. Exit status 1 when any contract's "
                    "speculative tokens differ from its greedy ones, or a request's tokens from its solo run.")
    demo.add_argument("--contract", default="both", choices=["batch", "ragged", "both"],
                      help="which toy engines to run: batch (toy-llm, toy-eagle), ragged (toy-llm-ragged, "
                           "toy-eagle3-ragged) or both (default)")
    demo.add_argument("--backend", default="auto", choices=["auto", "host", "cuda"],
                      help="memory backend (default auto: cuda when a GPU answers)")
    demo.add_argument("--engine", default="auto", choices=["auto", "trt", "reference"],
                      help="the batch toy engines as TensorRT plans, ReferenceEngines, or auto (plans where "
                           "tensorrt and a GPU are present); the ragged toys are always ReferenceEngines")
    demo.add_argument("--module", default="auto", choices=_MODULES,
                      help="TensorRT module for the plans (default auto: tensorrt)")
    demo.add_argument("--engines", type=Path, default=None, metavar="DIR",
                      help="engines folder with toy-llm/ and toy-eagle/ (batch) and toy-llm-ragged/ and "
                           "toy-eagle3-ragged/ (ragged) (default: the toy engines trtio comes with)")
    demo.add_argument("--plans", type=Path, default=None, metavar="DIR",
                      help="folder of built plans of the batch toy engines (engines layout); default: beside the "
                           "configs, then engines/build, then a cache folder where they are built if missing")
    demo.add_argument("--max-new-tokens", type=_demo_tokens, default=20, metavar="N",
                      help="tokens per prompt, 1..64 (default 20)")
    demo.add_argument("--no-graphs", action="store_true", help="run decode steps without graphs")
    demo.add_argument("--json", action="store_true", help="machine-readable summary, everything included")
    demo.set_defaults(func=_cmd_demo)


def _add_inspect(sub: argparse._SubParsersAction[_Parser]) -> None:
    insp = sub.add_parser(
        "inspect", parents=[_common()], epilog=_EPILOG,
        help="an engine's I/O table and the trtio binding of each tensor",
        description="Show every I/O tensor of a plan (where TensorRT can load it) or of the engine a config "
                    "describes (anywhere): mode, dtype, shape, location, each profile's min/opt/max, aliasing, "
                    "bytes at the max shape, and the trtio tensor create_for_llm / create_for_spec_decode binds "
                    "to it. A TensorRT Edge-LLM 0.11 engine directory (config.json + llm.engine, or "
                    "base_config.json + draft_config.json + spec_base.engine + spec_draft.engine) shows each "
                    "engine from its plan where it deserializes here (pass the path of Edge-LLM's plugin library "
                    "with --plugin or EDGELLM_PLUGIN_PATH), else from its config, saying why the plan was not read. "
                    "A config that does not fit the engine is an error listing every disagreement.")
    insp.add_argument("target", metavar="PLAN_OR_DIR_OR_CONFIG",
                      help="a plan file, a folder with model.plan (or base/ and draft/) or config.json, a config "
                           f"JSON, an Edge-LLM engine directory, or a toy engine directory by name ({_toy_names()})")
    insp.add_argument("--config", type=Path, default=None, metavar="CONFIG",
                      help="config to bind with (default: the config.json beside the plan)")
    insp.add_argument("--module", default="auto", choices=_MODULES,
                      help="TensorRT module that loads the plan (default auto)")
    insp.add_argument("--plugin", action="append", default=[], metavar="PATH",
                      help="the path of a TensorRT plugin library to load before deserializing (repeatable), e.g. "
                           "Edge-LLM's libNvInfer_edgellm_plugin.so; EDGELLM_PLUGIN_PATH (a path too) is loaded too")
    insp.add_argument("--json", action="store_true")
    insp.set_defaults(func=_cmd_inspect)


def _add_plan(sub: argparse._SubParsersAction[_Parser]) -> None:
    plan = sub.add_parser(
        "plan", parents=[_common()], epilog=_EPILOG,
        help="what create_for_llm / create_for_spec_decode allocate for a config or engine directory",
        description="The memory report of create_for_llm (a plain LLM) or create_for_spec_decode (a deployment "
                    "with a draft), tensor by tensor: PipelineIO, each engine's KV state (contiguous caches, or "
                    "the paged KV pools and page table of a TensorRT Edge-LLM 0.11 engine), staging and RoPE. "
                    "Takes trtio's config JSONs and Edge-LLM engine directories (config.json, or "
                    "base_config.json + draft_config.json; engine files optional). Allocates nothing. An "
                    "Edge-LLM speculative pair also needs Edge-LLM's three run-time values; each one not given is "
                    "the largest the configs' caps allow: --verify-size = builder_config.max_verify_tree_size of "
                    "base_config.json, --draft-top-k 1 and --draft-step = builder_config.max_draft_tree_size of "
                    "draft_config.json (draft-top-k x draft-step must fit it).")
    plan.add_argument("config", metavar="CONFIG_OR_DIR",
                      help="a config JSON, a folder holding config.json, an Edge-LLM engine directory, or a toy "
                           f"engine directory by name ({_toy_names()})")
    plan.add_argument("--draft-top-k", type=_positive_int, default=None, metavar="N",
                      help="Edge-LLM pair: candidates per drafted node (default: 1)")
    plan.add_argument("--draft-step", type=_positive_int, default=None, metavar="N",
                      help="Edge-LLM pair: draft levels per round (default: the largest that fits, "
                           "builder_config.max_draft_tree_size // draft-top-k)")
    plan.add_argument("--verify-size", type=_positive_int, default=None, metavar="N",
                      help="Edge-LLM pair: tree nodes the base verifies per round (default: "
                           "builder_config.max_verify_tree_size)")
    plan.add_argument("--sequence-length", type=_positive_int, default=None, metavar="N",
                      help="how many sequences of N tokens fit the KV pools (default: max_kv_cache_capacity; for a "
                           "speculative pair less its widest round, which writes its tree past a sequence's length)")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(func=_cmd_plan)


def _add_generate(sub: argparse._SubParsersAction[_Parser]) -> None:
    gen = sub.add_parser(
        "generate", parents=[_common()], epilog=_EPILOG,
        help="generate text from an engine directory with its tokenizer and embedding table",
        description="Tokenize PROMPT with the directory's tokenizer.json (Hugging Face tokenizers: pip install "
                    "'trtio[generate]'), embed it with its embedding.safetensors on the device, and generate greedily "
                    "(or, for a speculative pair with --speculative, with draft chains verified by the base), "
                    "streaming the text to stdout; tokens/s (and the acceptance rate) go to stderr at the end. Takes "
                    "an Edge-LLM engine directory, one of trtio's toy folders, or a toy engine directory by name; "
                    "without engine files (the toys) it runs ReferenceEngines with the toy model's weights and says "
                    "so.")
    gen.add_argument("engine_dir", metavar="ENGINE_DIR",
                     help=f"the engine directory, or a toy engine directory by name ({_toy_names()})")
    gen.add_argument("--prompt", required=True, metavar="TEXT", help="the text to continue")
    gen.add_argument("--max-new-tokens", type=_positive_int, default=32, metavar="N",
                     help="stop after N tokens (default 32), or earlier at an end-of-sequence token or a full KV cache")
    gen.add_argument("--speculative", action="store_true",
                     help="speculative decoding (a directory with base and draft engines)")
    gen.add_argument("--draft-top-k", type=_positive_int, default=None, metavar="N",
                     help="--speculative: draft chains per round, from the draft's N best first tokens (default 1)")
    gen.add_argument("--draft-step", type=_positive_int, default=None, metavar="N",
                     help="--speculative: tokens per chain (default: the longest the engines' tree caps allow)")
    gen.add_argument("--backend", default="auto", choices=["auto", "host", "cuda"],
                     help="memory backend of ReferenceEngines (directories without engine files); default auto")
    gen.add_argument("--image", type=Path, action="append", metavar="PATH",
                     help="an image for a vision-language model's directory (repeat for several; PNG/JPEG with "
                          "'trtio[vision]', or a .npy uint8 [H, W, 3] array); each goes before the prompt unless the "
                          "prompt places it with the image pad token")
    gen.add_argument("--audio", type=Path, action="append", metavar="FILE.wav",
                     help="a clip for a speech model's directory (audio/ beside the LLM: Qwen3-ASR, Qwen3-Omni's "
                          "thinker), a 16-bit PCM mono WAV file at the model's rate (repeat for several); each goes "
                          "before the prompt, between the audio markers, unless the prompt places it with the audio "
                          "pad token")
    gen.add_argument("--lora", type=Path, default=None, metavar="PATH",
                     help="a LoRA adapter (Edge-LLM's process-lora safetensors, or its folder; or the name of one "
                          "of the directory's adapters/, e.g. toy-lora-ragged's chat) for a LoRA engine's directory "
                          "(builder_config.max_lora_rank > 0)")
    gen.set_defaults(func=_cmd_generate)


def _add_bench(sub: argparse._SubParsersAction[_Parser]) -> None:
    bench = sub.add_parser(
        "bench", parents=[_common()], epilog=_EPILOG,
        help="what every step helper costs at 8B-class scale, beside prepare + execute alone",
        description="Time every step helper of create_for_llm and create_for_spec_decode at 8B-class scale (36 "
                    "layers, batch 8, an EAGLE-3-like draft, EAGLE drafting of top-10 x 6 levels, 60-node verify "
                    "trees, accepted paths of 4 nodes, graphs on) on null-compute ReferenceEngines, so every figure "
                    "is trtio's own cost, on both contracts in one run: host time per call (with and without a "
                    "stream synchronisation) and device operations per call (counted by the host and dry-run "
                    "backends), beside prepare + execute alone. Results: docs/BENCHMARKS.md.")
    bench.add_argument("--backend", default="host", choices=["host", "cuda", "dry-run"],
                       help="host (numpy runs the device work), cuda, or dry-run (device work counted, not run: "
                            "trtio's own host cost)")
    bench.add_argument("--steps", type=_positive_int, default=200, help="decode steps timed (default 200)")
    bench.add_argument("--rounds", type=_positive_int, default=30, help="speculative rounds timed (default 30)")
    bench.add_argument("--contract", choices=["batch", "ragged", "both"], default="both")
    bench.add_argument("--kv-capacity", type=_positive_int, default=None, metavar="N",
                       help="tokens per sequence in the KV caches (default 4096; 1024 on the host backend, whose "
                            "device memory is host RAM)")
    bench.add_argument("--sequences", action="store_true",
                       help="instead: sequences that come and go on the ragged contract, beside whole-batch steps (a "
                            "decode of 8 slots after admissions and releases, an admission's prefill, release, "
                            "pin_prefix; --steps of each)")
    bench.add_argument("--tp", type=_positive_int, default=None, metavar="N",
                       help="also the LLM's decode step across N tensor-parallel ranks (cuda: N GPUs, nccl4py and a C "
                            "compiler), beside one engine's")
    bench.add_argument("--inputs", choices=["device", "host", "torch"], default="device",
                       help="what the steps are fed: device tensors (default), host numpy arrays (one np.copyto of "
                            "each helper's input timed beside it) or torch tensors (on the GPU with --backend cuda; "
                            "the decode step fed a trtio Tensor beside it)")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(func=_cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    from trtio import __version__

    p = _Parser(prog="trtio", description="Pointer-stable TensorRT binding manager for LLM inference.",
                epilog=_EPILOG, parents=[_common()])
    p.add_argument("--version", action="version", version=f"trtio {__version__}")
    p.set_defaults(debug=False, verbose=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    info = sub.add_parser("info", help="what trtio sees here: backend, device, optional packages",
                          parents=[_common()], epilog=_EPILOG)
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=_cmd_info)
    for add in (_add_demo, _add_generate, _add_inspect, _add_plan, _add_bench):
        add(sub)
    return p


# -- logging and errors -----------------------------------------------------------------------------


class _HeldBack(logging.Handler):
    """Keeps records until the command ends: printed after success, dropped after an error."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith("trtio.trt"):  # TensorRT's errors come back inside trtio's exceptions
            self.records.append(record)


@contextlib.contextmanager
def _logging(verbose: bool, debug: bool) -> Iterator[_HeldBack | None]:
    logger = logging.getLogger("trtio")
    old_level = logger.level
    fmt = logging.Formatter("%(name)s: %(levelname)s: %(message)s")
    handler: logging.Handler
    held = None
    if verbose or debug:
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.DEBUG if debug else logging.INFO)
        logger.setLevel(handler.level)
    else:
        handler = held = _HeldBack()
    handler.setFormatter(fmt)
    logger.addHandler(handler)
    try:
        yield held
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line (multi-line messages, like BindingError's list, joined by ';')."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    head, rest = lines[0], [line[2:] if line.startswith("- ") else line for line in lines[1:]]
    text = head if not rest else head + " " + "; ".join(rest)
    from trtio.errors import TrtioError

    if not isinstance(exc, (TrtioError, OSError)):
        text = f"{type(exc).__name__}: {text}"
    return text


def _quiet_stdout() -> None:
    """Standard output was closed by the reader (``| head``): point it at /dev/null, so that nothing more is
    written there and Python's flush at exit does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _usage_error(command: str, exc: BaseException) -> int:
    print(f"trtio {command}: error: {_one_line(exc)} (see trtio {command} --help)", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``trtio`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit status
    (:data:`EXIT_STATUS`)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors, --help and --version: argparse already printed its lines
        return int(exc.code or 0)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    with _logging(args.verbose, args.debug) as held:
        try:
            rc = int(args.func(args))
            sys.stdout.flush()  # a closed pipe shows here, where it can be told apart
        except BrokenPipeError:
            _quiet_stdout()
            return 0
        except KeyboardInterrupt:
            print(f"trtio {args.command}: interrupted", file=sys.stderr)
            return 130
        except _UsageError as exc:
            if args.debug:
                traceback.print_exc(file=sys.stderr)
            return _usage_error(args.command, exc)
        except Exception as exc:  # one clear line unless --debug
            if args.debug:
                traceback.print_exc(file=sys.stderr)
            print(f"trtio {args.command}: error: {_one_line(exc)}", file=sys.stderr)
            return 1
        if held is not None:
            for record in held.records:
                print(f"trtio {args.command}: {record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)
        return rc


if __name__ == "__main__":
    sys.exit(main())
