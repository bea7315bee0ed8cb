#!/usr/bin/env bash
# The lead's one-call GPU check (device tool: run(command="bash tools/device_check.sh")):
# builds every kiln package on the GPU machine's Python (3.12, torch 2.11: this is also
# the Python 3.12 run of kiln-capture's suite), runs the capture, aot and facade suites,
# then the model suite on CUDA (eager vs torch.compile vs kiln, bf16) into $OUT.
set -uo pipefail
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KILN_CACHE_DIR=/tmp/kiln-cache
unset TRITON_INTERPRET
python3 -m pip install -q --no-build-isolation --no-deps -e packages/kiln-capture \
    -e packages/kiln-aot -e packages/kiln-inductor -e packages/kiln-cpp \
    -e packages/kiln-triton -e packages/kiln 2>&1 | tail -3
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"
for pkg in kiln-capture kiln; do
    timeout ${TEST_TIMEOUT:-150} python3 -m pytest packages/$pkg/tests -q -x -p no:cacheprovider \
        -m "not slow" 2>&1 | tee "$OUT/tests_$pkg.log" | tail -5
done
timeout ${BENCH_TIMEOUT:-330} python3 benchmarks/models.py --device cuda --dtype bfloat16 --no-warm \
    --runs 20 --timeout 120 --out "$OUT/models_cuda_bf16.json" \
    --models ${MODELS:-gpt2,bert,llama,hf_vit,timm_resnet50,timm_convnext_tiny,timm_vit_small_patch16_224,timm_mixer_b16_224,mlp_mixer,t5} \
    2>&1 | tee "$OUT/models.log" | grep -v "^\[transformers"
