#!/usr/bin/env bash
# Everything this project measures on the GPU, in one call of the device tool (~8 min):
#     run(command="bash benchmarks/gpu/final.sh", timeout_s=600)
# 1. kiln-triton's and kiln-aot's GPU tests (direct launches, matmul templates, CUDA graphs, scans,
#    fused attention, models;
#    the op sweeps run in CI under Triton's interpreter and with QUICK=0 here),
#    and, on the side (CPU only), kiln-capture's and kiln's suites on this Python (3.12)
#    and benchmarks/capture_overhead.py over the HF and timm models;
# 2. benchmarks/triton_kernels.py alone on the GPU (pointwise, softmax, layer_norm vs copy
#    bandwidth; linear+GELU with and without the matmul template; reduce-overhead);
# 3. benchmarks/gpu/suite.py: 10 models in bf16 and fp32 (+ GPT-2 forward+backward in
#    fp32) through eager, torch.compile and kiln, several jobs per GPU.
# Logs and JSON go to $OUT (the device tool's output folder) or benchmarks/results/gpu.
# To run exactly a commit while the working tree has other edits, export it first:
#     git archive HEAD | tar -x -C benchmarks/results/devtree   (ignored; carry it)
# and run `cd benchmarks/results/devtree && bash benchmarks/gpu/final.sh`.
source "$(dirname "$0")/setup.sh"
# kiln-triton's C launcher (kiln_triton._launch) must launch correctly before anything is
# timed with it: if its GPU tests fail, everything below runs with Triton's launcher
if ! KILN_TRITON_TEST_GPU=1 timeout 150 python3 -m pytest packages/kiln-triton/tests/test_gpu.py \
    -q -p no:cacheprovider -p no:warnings -k "c_launch or direct_launch" \
    > "$OUT/c_launch_check.log" 2>&1; then
    export KILN_TRITON_C_LAUNCH=0
    echo "C launch check FAILED (c_launch_check.log): timing with Triton's launcher"
else
    echo "C launch check: $(tail -1 "$OUT/c_launch_check.log")"
fi

(
    [ "${SKIP_SIDE:-0}" = "1" ] && exit 0
    for pkg in kiln-capture kiln; do
        timeout ${CPU_TEST_TIMEOUT:-400} python3 -m pytest packages/$pkg/tests -q -p no:cacheprovider \
            -m "not slow and not gpu" > "$OUT/tests_${pkg}_py312.log" 2>&1
        echo "$pkg suite on $(python3 -V): $(tail -1 "$OUT/tests_${pkg}_py312.log")"
    done
    # capture of HF and timm models (timm is installed here, not on the CPU machine)
    timeout ${CAPTURE_TIMEOUT:-200} python3 benchmarks/capture_overhead.py --models all \
        --out "$OUT/capture_overhead.json" > "$OUT/capture_overhead.log" 2>&1
    echo "capture benchmark exit: $? (table in capture_overhead.log)"
) &
SIDE=$!

# optional, with 2+ GPUs: channels-last on/off for kiln on the last GPU while the tests and
# the kernel benchmark use the first (LAYOUT_AB=resnet50,convnext_tiny)
LAYOUT=
NGPU=$(nvidia-smi -L | wc -l)
if [ -n "${LAYOUT_AB:-}" ] && [ "$NGPU" -ge 2 ]; then
    CUDA_VISIBLE_DEVICES=$((NGPU - 1)) timeout ${LAYOUT_TIMEOUT:-240} python3 \
        benchmarks/gpu/layout_ab.py --models "$LAYOUT_AB" --batch ${LAYOUT_BATCH:-32} \
        > "$OUT/layout_ab.log" 2>&1 &
    LAYOUT=$!
fi

SELECT=()
if [ "${QUICK:-1}" = "1" ]; then SELECT=(-k "not sweep"); fi
KILN_TRITON_TEST_GPU=1 KILN_TRITON_AUTOTUNE=0 timeout ${TEST_TIMEOUT:-200} python3 -m pytest \
    packages/kiln-triton/tests -m gpu ${SELECT[@]+"${SELECT[@]}"} -q -p no:warnings \
    -p no:cacheprovider -ra 2>&1 | tee "$OUT/gpu_tests.log" | tail -4
# kiln-aot's CUDA tests (fused attention, dropout, cuDNN batch norm) in their own run: both
# packages have a test_gpu.py
timeout ${TEST_TIMEOUT:-200} python3 -m pytest packages/kiln-aot/tests -m gpu -q -p no:warnings \
    -p no:cacheprovider -ra 2>&1 | tee "$OUT/gpu_tests_aot.log" | tail -3
timeout ${TEST_TIMEOUT:-200} python3 -m pytest packages/kiln/tests -m gpu -q -p no:warnings \
    -p no:cacheprovider -ra 2>&1 | tee "$OUT/gpu_tests_kiln.log" | tail -3

KILN_LOG=kernels timeout ${KERNEL_TIMEOUT:-240} python3 benchmarks/triton_kernels.py --out "$OUT" \
    > "$OUT/triton_kernels.log" 2>&1
echo "kernel benchmark exit: $?"

if [ -n "$LAYOUT" ]; then wait $LAYOUT; echo "layout A/B exit: $?"; grep -v "^\[" "$OUT/layout_ab.log" | tail -8; fi

# the suite gets what is left of TOTAL_BUDGET seconds (the device call's limit, less a margin)
SUITE_TIMEOUT=${SUITE_TIMEOUT:-$(( ${TOTAL_BUDGET:-580} - SECONDS - 25 ))}
echo "model suite: ${SUITE_TIMEOUT} s"
timeout ${SUITE_TIMEOUT} python3 benchmarks/gpu/suite.py --per-gpu ${PER_GPU:-5} --runs 20 \
    --timeout 200 --out "$OUT" --dtypes ${DTYPES:-bfloat16,float32} \
    --models ${MODELS:-gpt2,bert,llama,t5,hf_vit,timm_resnet50,timm_convnext_tiny,timm_vit_small_patch16_224,timm_efficientnet_b0,timm_mixer_b16_224} \
    2>&1 | grep -v "^\[transformers" | tee "$OUT/suite.log" | grep -v "^\[[0-9]*/"
wait $SIDE
# optional: where the per-call host time goes (cProfile of kiln's calls), OVERHEAD=models
if [ -n "${OVERHEAD:-}" ]; then
    timeout ${OVERHEAD_TIMEOUT:-120} python3 benchmarks/gpu/overhead.py --models "$OVERHEAD" \
        --calls 50 --out "$OUT" > "$OUT/overhead.log" 2>&1
    echo "overhead exit: $?"; grep -A8 "^== " "$OUT/overhead.log"
fi
cat "$OUT/triton_kernels.txt" 2>/dev/null || tail -20 "$OUT/triton_kernels.log"
grep -v "^\[" "$OUT/capture_overhead.log" | tail -14
# the device tool brings back only a few files: pack the per-model ones into one archive
# and the logs: the summaries stay outside the archive
( cd "$OUT" && tar czf /tmp/details.tgz --exclude suite.txt --exclude triton_kernels.txt \
    --exclude suite.json --exclude triton_kernels.json . && find . -type f ! -name suite.txt \
    ! -name triton_kernels.txt ! -name suite.json ! -name triton_kernels.json -delete \
    && mv /tmp/details.tgz . )
