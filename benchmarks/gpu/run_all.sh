#!/usr/bin/env bash
# Everything kiln-triton needs a GPU for, in one call of the device tool:
#     run(command="bash benchmarks/gpu/run_all.sh", timeout_s=600)
# Installs the kiln packages it needs (editable, no dependencies: the machine has torch,
# triton, transformers and timm), runs kiln-triton's GPU tests, then the kernel benchmark.
# Logs and JSON go to $OUT (the device tool's output folder) or benchmarks/results/gpu.
set -uo pipefail
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
export KILN_TRITON_TEST_GPU=1
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache}

nvidia-smi --query-gpu=name,clocks.sm,memory.used,memory.total --format=csv
python3 -m pip install -q --no-build-isolation --no-deps \
    -e packages/kiln-aot -e packages/kiln-inductor -e packages/kiln-triton 2>&1 | tail -3
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"

# tests: autotuning off except where a test turns it on (keeps compile time down).
# QUICK=1 runs only the CUDA-graph, model and autotune tests (not the op sweeps).
SELECT=()
if [ "${QUICK:-0}" = "1" ]; then SELECT=(-k "not sweep"); fi
KILN_TRITON_AUTOTUNE=0 timeout "${TEST_TIMEOUT:-330}" python3 -m pytest packages/kiln-triton/tests \
    -m gpu ${SELECT[@]+"${SELECT[@]}"} -q -p no:warnings -p no:cacheprovider -ra --durations=8 2>&1 \
    | tee "$OUT/gpu_tests.log"
echo "pytest exit: ${PIPESTATUS[0]}"

timeout 200 python3 benchmarks/triton_kernels.py --out "$OUT" 2>&1 | tee "$OUT/triton_kernels.log"
echo "benchmark exit: ${PIPESTATUS[0]}"
