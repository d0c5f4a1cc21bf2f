#!/usr/bin/env bash
# One device-machine session: the gpu tests, then the benchmarks whose tables docs/BENCHMARKS.md shows (cuda).
# Usage (from the repository root, on a GPU machine): bash scripts/gpu_session.sh OUTDIR [tests|bench|all]
# Needs no TensorRT. A runner with full TensorRT (and real Edge-LLM engine directories in
# TRTIO_EDGELLM_DIR) runs scripts/gpu_ci.sh instead, which also runs the trt tests.
set -u
out=${1:-.}
what=${2:-all}
mkdir -p "$out"
export PYTHONPATH=.
python3 -c "import sys, numpy, cupy; print(sys.version); print('numpy', numpy.__version__, 'cupy', cupy.__version__)" > "$out/env.txt" 2>&1
python3 -c "import ml_dtypes, hypothesis; print('ml_dtypes', ml_dtypes.__version__, 'hypothesis', hypothesis.__version__)" >> "$out/env.txt" 2>&1
if [ "$what" != bench ]; then
  timeout "${GPU_TEST_TIMEOUT:-330}" python3 -m pytest -m gpu -q -p no:cacheprovider ${GPU_TEST_ARGS:-} > "$out/gpu_tests.txt" 2>&1
  echo "pytest exit $?" >> "$out/gpu_tests.txt"
fi
[ "$what" = tests ] && exit 0
bench() {  # bench NAME TIMEOUT COMMAND...
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "exit $?" >> "$out/$name.txt"
}
# The host's Python speed core by core, before and after (a shared host's cores differ, and change: docs/BENCHMARKS.md)
python3 scripts/host_speed.py > "$out/host_speed.txt" 2>&1
bench bench_cuda 150 python3 -m trtio bench --backend cuda --rounds 30 --steps 200
bench bench_cuda_torch 100 python3 -m trtio bench --backend cuda --rounds 20 --steps 200 --inputs torch
bench bench_cuda_sequences 100 python3 -m trtio bench --backend cuda --sequences --steps 100
bench bench_decode_step 60 python3 benchmarks/bench_decode_step.py --backend cuda
bench bench_memory_layer 60 python3 benchmarks/bench_memory_layer.py --backend cuda
bench bench_pipeline_memory 60 python3 benchmarks/bench_pipeline_memory.py --backend cuda
bench bench_setup_and_streaming 60 python3 benchmarks/bench_setup_and_streaming.py --backend cuda
python3 scripts/host_speed.py >> "$out/host_speed.txt" 2>&1
