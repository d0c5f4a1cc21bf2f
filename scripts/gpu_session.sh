#!/usr/bin/env bash
# One device-machine session: the gpu tests, then the step-helper benchmark on the cuda backend.
# Usage (from the repository root, on a GPU machine): bash scripts/gpu_session.sh OUTDIR
# Needs no TensorRT. A runner with full TensorRT (and real Edge-LLM engine directories in
# TRTIO_EDGELLM_DIR) runs scripts/gpu_ci.sh instead, which also runs the trt tests.
set -u
out=${1:-.}
mkdir -p "$out"
export PYTHONPATH=.
python3 -c "import sys, numpy, cupy; print(sys.version); print('numpy', numpy.__version__, 'cupy', cupy.__version__)" > "$out/env.txt" 2>&1
python3 -c "import ml_dtypes, hypothesis; print('ml_dtypes', ml_dtypes.__version__, 'hypothesis', hypothesis.__version__)" >> "$out/env.txt" 2>&1
timeout "${GPU_TEST_TIMEOUT:-330}" python3 -m pytest -m gpu -q -p no:cacheprovider -x ${GPU_TEST_ARGS:-} > "$out/gpu_tests.txt" 2>&1
echo "pytest exit $?" >> "$out/gpu_tests.txt"
timeout "${BENCH_TIMEOUT:-200}" python3 -m trtio bench --backend cuda --rounds 30 --steps 200 > "$out/bench_cuda.txt" 2>&1
echo "bench exit $?" >> "$out/bench_cuda.txt"
