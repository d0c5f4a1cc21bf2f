#!/usr/bin/env bash
# Everything a GPU runner with full TensorRT can run, beyond the CPU CI (.ci/run):
#   1. the GPU and TensorRT tests: pytest -m "gpu or trt" (cuda backend, GPU ReferenceEngine, real plans);
#   2. where TRTIO_EDGELLM_DIR names real Edge-LLM 0.11 engine directories (plain or speculative, several
#      separated by ':'): pytest -m trt tests/test_edgellm_engines.py on them (finite logits, graphs change
#      no token, speculative tokens = the base's greedy tokens), then `trtio inspect` on each;
#      EDGELLM_PLUGIN_PATH names Edge-LLM's plugin library (libNvInfer_edgellm_plugin.so); step 1 also runs
#      tests/test_edgellm_lora_engines.py on a LoRA directory where TRTIO_EDGELLM_LORA_DIR and
#      TRTIO_EDGELLM_LORA_ADAPTERS (one or two process-lora adapters, ':'-separated) name them;
#   3. the toy plans built with tensorrt (scripts/build_toy_engines.py), then `trtio inspect` on them;
#   4. `trtio demo` on those plans (greedy + speculative decoding, streaming, bindings, memory, graphs),
#      and on GPU ReferenceEngines where CuPy is installed.
#
# Needs a CUDA GPU, cuda-python and tensorrt (pip install -e '.[test,trt-cu12]' or '.[test,trt-cu13]');
# CuPy (and torch) for the GPU ReferenceEngine and interop tests. Stops at the first failure, exiting
# non-zero. (scripts/gpu_session.sh is the lighter session for a GPU machine without TensorRT.)
#
#   bash scripts/gpu_ci.sh            # PYTHON=... to pick the interpreter, GPU_CI_OUT=DIR to keep the plans
#   TRTIO_EDGELLM_DIR=/engines/llm:/engines/eagle3 EDGELLM_PLUGIN_PATH=/path/libNvInfer_edgellm_plugin.so \
#       bash scripts/gpu_ci.sh
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
if not trtio._cuda.backend.cuda_available():
    missing.append("no CUDA device answers")
if importlib.util.find_spec("tensorrt") is None:
    missing.append("tensorrt is not installed")
if missing:
    sys.exit("gpu_ci.sh: " + "; ".join(missing) + " (this script is for a GPU runner with TensorRT)")
PY

step "pytest -m 'gpu or trt'"
# The Edge-LLM directory tests run in their own step below (their host half runs in the CPU CI).
"$PYTHON" -m pytest -m "gpu or trt" -q -rs --ignore=tests/test_edgellm_engines.py

if [ -n "${TRTIO_EDGELLM_DIR:-}" ]; then
    step "real Edge-LLM engine directories: $TRTIO_EDGELLM_DIR"
    if [ -z "${EDGELLM_PLUGIN_PATH:-}" ]; then
        echo "gpu_ci.sh: EDGELLM_PLUGIN_PATH is not set; Edge-LLM's engines need libNvInfer_edgellm_plugin.so" >&2
    fi
    "$PYTHON" -m pytest -m trt -q -rs tests/test_edgellm_engines.py
    IFS=: read -r -a edgellm_dirs <<< "$TRTIO_EDGELLM_DIR"
    for dir in "${edgellm_dirs[@]}"; do
        if [ -n "$dir" ]; then
            "$PYTHON" -m trtio inspect "$dir" --module tensorrt
        fi
    done
else
    step "TRTIO_EDGELLM_DIR is not set: no real Edge-LLM engine directory to test (tests/test_edgellm_engines.py)"
fi

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
