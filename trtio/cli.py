"""The ``trtio`` command: ``info``, ``demo``, ``inspect``, ``plan``.

Every command prints a human-readable report, or JSON with ``--json``. Bad input (a missing or
corrupt plan, a config that does not fit its engine, an unknown option value) ends with one line
on stderr, ``trtio COMMAND: error: ...``, and exit status 1 (2 for command-line usage errors);
``--debug`` adds the traceback. trtio's log goes to stderr: warnings by default (held back when
the command fails, so the error stays one line), everything with ``--verbose``; TensorRT's own
log only with ``--verbose`` or ``--debug`` (its errors reach you inside trtio's error message).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

__all__ = ["main", "build_parser"]


# -- commands ---------------------------------------------------------------------------------------


def _cmd_info(args: argparse.Namespace) -> int:
    import numpy as np

    import trtio
    from trtio.cuda.backend import cuda_available
    from trtio.cuda.device import probe_error

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
        info["why_no_cuda"] = probe_error()
    for mod in ("tensorrt", "tensorrt_rtx", "ml_dtypes", "cupy", "torch"):
        try:
            m = __import__(mod)
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
    from trtio.tools.demo import DemoOptions, format_demo, run_demo

    opts = DemoOptions(backend=args.backend, engine=args.engine, module=args.module, engines_dir=args.engines,
                       plans_dir=args.plans, max_new_tokens=args.max_new_tokens, graphs=not args.no_graphs,
                       progress=sys.stderr)
    summary = run_demo(opts)
    if args.json:
        summary = dict(summary)
        summary.pop("memory_text", None)
        print(json.dumps(summary, indent=2))
    else:
        print(format_demo(summary))
    return 0 if summary["ok"] else 1


def _cmd_inspect(args: argparse.Namespace) -> int:
    from trtio.tools.inspection import format_inspection, inspect_target

    _check_module(args.module)
    result = inspect_target(args.target, config=args.config, module=args.module)
    print(json.dumps(result, indent=2) if args.json else format_inspection(result))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from trtio.tools.inspection import format_plan, plan_config

    result = plan_config(args.config)
    if args.json:
        result = dict(result)
        result.pop("text")
        print(json.dumps(result, indent=2))
    else:
        print(format_plan(result))
    return 0


def _check_module(module: str) -> None:
    from trtio.errors import ConfigError
    from trtio.trt import KNOWN_MODULES

    if module != "auto" and module not in KNOWN_MODULES:
        raise ConfigError("--module", f"unknown TensorRT module {module!r}; expected auto, "
                                      + " or ".join(KNOWN_MODULES))


# -- parser -----------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit status 2), like every other trtio error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error, and every log message")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log what trtio (and TensorRT) does to stderr")

    p = _Parser(prog="trtio", description="Pointer-stable TensorRT binding manager for LLM inference.",
                parents=[common])
    p.set_defaults(debug=False, verbose=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    info = sub.add_parser("info", help="what trtio sees here: backend, device, optional packages",
                          parents=[common])
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=_cmd_info)

    demo = sub.add_parser(
        "demo", parents=[common],
        help="run the toy engines: greedy and speculative decoding, streaming, bindings, memory",
        description="Load the toy engines (TensorRT plans where tensorrt imports and a GPU answers, built on "
                    "first use; else ReferenceEngines), generate greedily for four prompts with create_for_llm, "
                    "decode them speculatively with create_for_spec_decode, stream the prefill snapshot to a "
                    "consumer stream, and print tokens, acceptance rate, bindings, memory and graph statistics. "
                    "Exit status 1 when the speculative tokens differ from the greedy ones.")
    demo.add_argument("--backend", default="auto", metavar="{host,cuda,auto}",
                      help="memory backend (default auto: cuda when a GPU answers)")
    demo.add_argument("--engine", default="auto", metavar="{auto,trt,reference}",
                      help="TensorRT plans, ReferenceEngines, or auto (plans where tensorrt and a GPU are present)")
    demo.add_argument("--module", default="auto", metavar="{auto,tensorrt,tensorrt_rtx}",
                      help="TensorRT module for the plans (default auto: tensorrt)")
    demo.add_argument("--engines", type=Path, default=None, metavar="DIR",
                      help="engines folder with toy-llm/ and toy-eagle/ configs (default: the repository's engines/)")
    demo.add_argument("--plans", type=Path, default=None, metavar="DIR",
                      help="folder of built plans (engines layout); default: beside the configs, then "
                           "engines/build, then a cache folder where they are built if missing")
    demo.add_argument("--max-new-tokens", type=int, default=20, metavar="N", help="tokens per prompt (default 20)")
    demo.add_argument("--no-graphs", action="store_true", help="run decode steps without CUDA graphs")
    demo.add_argument("--json", action="store_true", help="machine-readable summary")
    demo.set_defaults(func=_cmd_demo)

    insp = sub.add_parser(
        "inspect", parents=[common],
        help="an engine's I/O table and the trtio binding of each tensor",
        description="Show every I/O tensor of a plan (where TensorRT can load it) or of the engine a config "
                    "describes (anywhere): mode, dtype, shape, location, each profile's min/opt/max, aliasing, "
                    "bytes at the max shape, and the trtio tensor create_for_llm / create_for_spec_decode binds "
                    "to it. A config that does not fit the engine is an error listing every disagreement.")
    insp.add_argument("target", metavar="PLAN_OR_DIR_OR_CONFIG",
                      help="a plan file, a folder with model.plan (or base/ and draft/) or config.json, or a "
                           "config JSON")
    insp.add_argument("--config", type=Path, default=None, metavar="CONFIG",
                      help="config to bind with (default: the config.json beside the plan)")
    insp.add_argument("--module", default="auto", metavar="{auto,tensorrt,tensorrt_rtx}",
                      help="TensorRT module that loads the plan (default auto)")
    insp.add_argument("--json", action="store_true")
    insp.set_defaults(func=_cmd_inspect)

    plan = sub.add_parser(
        "plan", parents=[common],
        help="what create_for_llm / create_for_spec_decode allocate for a config",
        description="The memory report of create_for_llm (a plain LLM config) or create_for_spec_decode (a "
                    "deployment with a draft) for a config, tensor by tensor: PipelineIO, each engine's KV "
                    "state, staging and RoPE. Allocates nothing.")
    plan.add_argument("config", metavar="CONFIG", help="a config JSON, or a folder holding config.json")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(func=_cmd_plan)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors and --help: argparse already printed its line
        return int(exc.code or 0)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    with _logging(args.verbose, args.debug) as held:
        try:
            rc = int(args.func(args))
        except KeyboardInterrupt:
            print(f"trtio {args.command}: interrupted", file=sys.stderr)
            return 130
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
