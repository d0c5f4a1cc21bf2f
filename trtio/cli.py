"""The ``trtio`` command."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

__all__ = ["main"]


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trtio", description="Pointer-stable TensorRT binding manager for LLM inference.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="what trtio sees here: backend, device, optional packages")
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=_cmd_info)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except Exception as exc:  # one clear line unless --debug
        if args.debug:
            raise
        print(f"trtio {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
