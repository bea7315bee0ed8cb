#!/usr/bin/env bash
# Index checks on the H200, in one call of the device tool (~8 min):
#     run(command="bash benchmarks/gpu/index_checks.sh", timeout_s=600)
# 1. kiln-triton's bad-index tests on the GPU (-m gpu: eager's exception type, the CUDA
#    context alive afterwards, CUDA graph replays) and its other GPU tests;
# 2. benchmarks/index_check_cost.py: kiln with checks vs without, bf16, back-to-back calls
#    timed with CUDA events: large configs (GPU-bound) and small ones (launch-bound, where a
#    per-call synchronization shows most).
# LARGE_SAMPLES / SMALL_SAMPLES: samples per config (7); PIN: a prefix such as
# "taskset -c 0-7" that keeps the timed processes off cores other work uses.
source "$(dirname "$0")/setup.sh"
KILN_TRITON_TEST_GPU=1 timeout ${TEST_TIMEOUT:-200} python3 -m pytest \
    packages/kiln-triton/tests/test_index_checks.py -m gpu -q -p no:cacheprovider -p no:warnings \
    > "$OUT/index_checks_tests.log" 2>&1
echo "index check GPU tests: $(tail -1 "$OUT/index_checks_tests.log")"
if [ "${SKIP_GPU_SUITE:-0}" != "1" ]; then
    KILN_TRITON_TEST_GPU=1 timeout ${TEST_TIMEOUT:-200} python3 -m pytest \
        packages/kiln-triton/tests/test_gpu.py -q -p no:cacheprovider -p no:warnings -x \
        > "$OUT/triton_gpu_tests.log" 2>&1
    echo "kiln-triton GPU tests: $(tail -1 "$OUT/triton_gpu_tests.log")"
fi
${PIN:-} timeout ${BENCH_TIMEOUT:-330} python3 benchmarks/index_check_cost.py --device cuda \
    --dtype bfloat16 --size large --models gpt2,bert,llama,t5,hf_vit --calls 20 --samples ${LARGE_SAMPLES:-7} \
    --no-torch-compile --timeout 150 --out "$OUT/index_check_cost_cuda_large.json" \
    2>&1 | tee "$OUT/index_check_cost_cuda_large.log" | tail -9
${PIN:-} timeout ${BENCH_SMALL_TIMEOUT:-150} python3 benchmarks/index_check_cost.py --device cuda \
    --dtype bfloat16 --size small --models gpt2,llama --calls 50 --samples ${SMALL_SAMPLES:-7} \
    --no-torch-compile --timeout 70 --out "$OUT/index_check_cost_cuda_small.json" \
    2>&1 | tee "$OUT/index_check_cost_cuda_small.log" | tail -5
