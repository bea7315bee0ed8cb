#!/usr/bin/env bash
# Dynamic shapes on the H200, in one or two calls of the device tool:
#     run(command="PART=tests,generate bash benchmarks/gpu/dynamic.sh", timeout_s=600)
#     run(command="PART=shapes bash benchmarks/gpu/dynamic.sh", timeout_s=600)
# tests:    kiln-triton's dynamic-shape GPU tests (direct C launches of sized kernels
#           checked against eager); if they fail, the benchmarks run with
#           KILN_TRITON_C_LAUNCH=0 and the log says so;
# generate: benchmarks/generate.py, HF generate() with caches, eager / torch.compile /
#           kiln, bf16, each row within ROW_TIMEOUT seconds;
# shapes:   benchmarks/dynamic_shapes.py on a subset: graphs per compiler, dynamic vs static.
# Rows are written as they finish, so a call cut short keeps what it measured.
source "$(dirname "$0")/setup.sh"
PART=${PART:-tests,generate,shapes}
if [[ $PART == *tests* ]]; then
    KILN_TRITON_TEST_GPU=1 timeout ${TEST_TIMEOUT:-150} python3 -m pytest \
        packages/kiln-triton/tests/test_gpu_dynamic.py -q -p no:cacheprovider -p no:warnings -x \
        > "$OUT/dynamic_gpu_tests.log" 2>&1
    status=$?
    echo "kiln-triton dynamic GPU tests: $(tail -1 "$OUT/dynamic_gpu_tests.log")"
    if [ $status -ne 0 ]; then
        grep -E "Error|assert" "$OUT/dynamic_gpu_tests.log" | head -5
        echo "tests failed: benchmarks run with KILN_TRITON_C_LAUNCH=0"
        export KILN_TRITON_C_LAUNCH=0
    fi
fi
if [[ $PART == *generate* ]]; then
    timeout ${GEN_TIMEOUT:-400} python3 benchmarks/generate.py --device cuda --dtype bfloat16 \
        --models ${GEN_MODELS:-gpt2,llama,qwen2,mistral} --prompts 5,9,17 --new-tokens 24 --samples 3 \
        --timeout ${ROW_TIMEOUT:-100} --out "$OUT/generate_cuda_bfloat16.json" \
        > "$OUT/generate_cuda.log" 2>&1
    grep -v "^\[transformers\]" "$OUT/generate_cuda.log" | grep -v "^frame #" | tail -14
fi
if [[ $PART == *shapes* ]]; then
    timeout ${DYN_TIMEOUT:-450} python3 benchmarks/dynamic_shapes.py --device cuda \
        --programs ${DYN_PROGRAMS:-pointwise,layer_norm,causal_attention,mlp_varying_batch,kv_decode_step,hf_gpt2,train_mlp} \
        --scale 16 --samples 5 --timeout ${ROW_TIMEOUT:-100} \
        --out "$OUT/dynamic_shapes_cuda.json" > "$OUT/dynamic_shapes_cuda.log" 2>&1
    grep -v "^\s*\[" "$OUT/dynamic_shapes_cuda.log" | tail -12
fi
