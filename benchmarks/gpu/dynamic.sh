#!/usr/bin/env bash
# Dynamic shapes on the H200, in one call of the device tool (~8 min):
#     run(command="bash benchmarks/gpu/dynamic.sh", timeout_s=600)
# 1. kiln-triton's dynamic-shape GPU tests and kiln's generate() test on CUDA (the decode
#    step's attention bias alignment);
# 2. benchmarks/generate.py: HF generate() with caches, eager / torch.compile / kiln, bf16;
# 3. benchmarks/dynamic_shapes.py on a subset: graphs per compiler, dynamic vs static.
source "$(dirname "$0")/setup.sh"
if [ -f packages/kiln-triton/tests/test_gpu_dynamic.py ]; then
    KILN_TRITON_TEST_GPU=1 timeout ${TEST_TIMEOUT:-120} python3 -m pytest \
        packages/kiln-triton/tests/test_gpu_dynamic.py -q -p no:cacheprovider -p no:warnings -x \
        > "$OUT/dynamic_gpu_tests.log" 2>&1
    echo "kiln-triton dynamic GPU tests: $(tail -1 "$OUT/dynamic_gpu_tests.log")"
fi
timeout ${GEN_TIMEOUT:-260} python3 benchmarks/generate.py --device cuda --dtype bfloat16 \
    --models ${GEN_MODELS:-gpt2,llama,qwen2} --prompts 5,9,17 --new-tokens 24 --samples 3 \
    --out "$OUT/generate_cuda_bfloat16.json" 2>&1 | tee "$OUT/generate_cuda.log" | tail -12
timeout ${DYN_TIMEOUT:-150} python3 benchmarks/dynamic_shapes.py --device cuda \
    --programs ${DYN_PROGRAMS:-causal_attention,layer_norm,mlp_varying_batch,kv_decode_step,hf_gpt2} \
    --scale 16 --samples 5 --out "$OUT/dynamic_shapes_cuda.json" \
    2>&1 | tee "$OUT/dynamic_shapes_cuda.log" | tail -10
