#!/usr/bin/env bash
# Everything a GPU runner with full TensorRT can run, beyond the CPU CI (.ci/run):
#   1. the GPU and TensorRT tests: pytest -m "gpu or trt" (cuda backend, GPU ReferenceEngine, real plans);
#   2. the toy plans built with tensorrt (scripts/build_toy_engines.py), then `trtio inspect` on them;
#   3. `trtio demo` on those plans (greedy + speculative decoding, streaming, bindings, memory, graphs),
#      and on GPU ReferenceEngines where CuPy is installed.
#
# Needs a CUDA GPU, cuda-python and tensorrt (pip install -e '.[test,trt-cu12]' or '.[test,trt-cu13]');
# CuPy (and torch) for the GPU ReferenceEngine and interop tests. Stops at the first failure.
#
#   bash scripts/gpu_ci.sh            # PYTHON=... to pick the interpreter, GPU_CI_OUT=DIR to keep the plans
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
OUT=${GPU_CI_OUT:-$(mktemp -d -t trtio-gpu-ci.XXXXXX)}
step() { printf '\n== gpu_ci: %s\n' "$*"; }

step "what this runner offers"
"$PYTHON" -m trtio info
"$PYTHON" - <<'PY'
import importlib.util
import sys

import trtio

missing = []
if not trtio.cuda_available():
    missing.append("no CUDA device answers")
if importlib.util.find_spec("tensorrt") is None:
    missing.append("tensorrt is not installed")
if missing:
    sys.exit("gpu_ci.sh: " + "; ".join(missing) + " (this script is for a GPU runner with TensorRT)")
PY

step "pytest -m 'gpu or trt'"
"$PYTHON" -m pytest -m "gpu or trt" -q -rs

step "build the toy plans with tensorrt into $OUT"
"$PYTHON" scripts/build_toy_engines.py --out "$OUT" --module tensorrt

step "trtio inspect on the plans"
"$PYTHON" -m trtio inspect "$OUT/toy-llm" --module tensorrt
"$PYTHON" -m trtio inspect "$OUT/toy-eagle" --module tensorrt

step "trtio demo on the plans"
"$PYTHON" -m trtio demo --engine trt --module tensorrt --plans "$OUT"
"$PYTHON" -m trtio demo --engine trt --module tensorrt --plans "$OUT" --json > "$OUT/demo.json"

if "$PYTHON" -c "import cupy" 2>/dev/null; then
    step "trtio demo on GPU ReferenceEngines"
    "$PYTHON" -m trtio demo --engine reference --backend cuda
fi

step "all passed (plans and demo.json in $OUT)"
