#!/usr/bin/env python3
"""Build trtio's toy engines as real TensorRT / TensorRT-RTX plans.

Reads the deployments of ``engines/`` (``toy-llm/config.json``, ``toy-eagle/config.json``; see
``trtio.testing.toy_engines``) with trtio's config classes, draws the seeded weights (the EAGLE
draft from ``ToyWeights.generate_draft``, so it approximates the base), builds each network
(``trtio.testing.toy_build``; the model is ``docs/toy-model.md``) and writes, under ``--out``::

    toy-llm/model.plan           toy-llm/config.json            (the toy-llm deployment)
    toy-eagle/base/model.plan    toy-eagle/base/config.json     (the base's LLMEngineConfig)
    toy-eagle/draft/model.plan   toy-eagle/draft/config.json    (the draft's LLMEngineConfig)
                                 toy-eagle/config.json          (the toy-eagle deployment)

That is the layout of ``engines/`` itself, so ``trtio demo --engines OUT`` runs the plans and
``trtio inspect OUT/toy-llm`` shows one. TensorRT-RTX builds on a CPU-only machine (ahead of
time); running the plans needs a GPU (and, for TensorRT-RTX, one it supports).

    python scripts/build_toy_engines.py [--out engines/build] [--module tensorrt|tensorrt_rtx]
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from trtio._trt import KNOWN_MODULES
from trtio.errors import TrtioError
from trtio.testing.toy_build import (  # noqa: F401 - re-exported for scripts and tests that import this file
    BuiltPlan,
    build_network,
    build_plan,
    contract_diff,
    network_contract,
    network_engine_io,
    profile_shapes,
    resolve_module,
    step_capacity,
)
from trtio.testing.toy_engines import ENGINE_NAMES, ToyEngines, default_engines_dir

__all__ = ["ENGINE_GROUPS", "main"]

#: ``--engines`` names and the engines each one builds.
ENGINE_GROUPS: dict[str, tuple[str, ...]] = {
    "toy-llm": ("toy-llm",),
    "toy-eagle": ("toy-eagle/base", "toy-eagle/draft"),
    "toy-eagle/base": ("toy-eagle/base",),
    "toy-eagle/draft": ("toy-eagle/draft",),
}

DEFAULT_OUT = default_engines_dir() / "build"  # git-ignored (.gitignore: build/)


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _parse_engines(text: str) -> tuple[str, ...]:
    selected: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if item not in ENGINE_GROUPS:
            raise ValueError(f"unknown engine {item!r}; expected {', '.join(ENGINE_GROUPS)}")
        selected.extend(e for e in ENGINE_GROUPS[item] if e not in selected)
    if not selected:
        raise ValueError("--engines names no engine")
    return tuple(e for e in ENGINE_NAMES if e in selected)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(
        prog="build_toy_engines",
        description="Build trtio's toy engines (docs/toy-model.md) as TensorRT / TensorRT-RTX plans.",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output folder, engines layout (default: {DEFAULT_OUT}, git-ignored)")
    parser.add_argument("--module", default="auto",
                        help="tensorrt or tensorrt_rtx (default: tensorrt when importable, else tensorrt_rtx)")
    parser.add_argument("--engines", default="toy-llm,toy-eagle",
                        help="comma-separated: toy-llm, toy-eagle (= toy-eagle/base + toy-eagle/draft)")
    parser.add_argument("--config-dir", type=Path, default=default_engines_dir(),
                        help="the engines folder holding toy-llm/config.json and toy-eagle/config.json "
                             "(default: the repository's engines/)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (one line already printed) and --help
        return int(exc.code or 0)
    prog = parser.prog

    if args.module != "auto" and args.module not in KNOWN_MODULES:
        print(f"{prog}: unknown --module {args.module!r}; expected tensorrt or tensorrt_rtx", file=sys.stderr)
        return 2
    try:
        engines = _parse_engines(args.engines)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    try:
        toys = ToyEngines.load(args.config_dir)
        trt = resolve_module(args.module)
        if not args.quiet:
            print(f"building {', '.join(engines)} with {trt.__name__} {getattr(trt, '__version__', '')} "
                  f"from {args.config_dir} (seed {toys.seed}) into {args.out}", file=sys.stderr)
        toys.build_plans(args.out, trt, progress=not args.quiet, engines=engines)
    except (OSError, ValueError, RuntimeError, TrtioError) as exc:
        print(f"{prog}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")
    sys.exit(main())
