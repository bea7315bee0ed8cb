#!/usr/bin/env bash
# Capture of timm models on the H200, in one call of the device tool (~7 min):
#     run(command="bash benchmarks/gpu/capture_rows.sh", timeout_s=600)
# 1. benchmarks/breaks.py over the timm models (graphs, breaks, eager frames of kiln and
#    torch.compile; capture only, on the host's CPU cores 8-15: timm is installed here and
#    not on the CPU machine), in the background;
# 2. benchmarks/models.py on the GPU (bf16, eager / torch.compile / kiln, kiln's capture)
#    for SPEED_MODELS, pinned to cores 0-7;
# 3. with REGIONAL_AB=1: kiln with regional reuse off (KILN_REGIONAL_REUSE=0) and on, for
#    AB_MODELS, in two runs of models.py (kiln only), to check the default on the GPU.
source "$(dirname "$0")/setup.sh"
TIMM=${TIMM:-timm_resnet50,timm_vit_small,timm_regnety_016,timm_convnext_tiny,timm_efficientnet_b0,timm_mobilenetv3,timm_swin_tiny,timm_deit_small}
taskset -c 8-15 timeout ${BREAKS_TIMEOUT:-480} python3 benchmarks/breaks.py --models "$TIMM" \
    --timeout 150 --out "$OUT/breaks_timm.json" > "$OUT/breaks_timm.log" 2>&1 &
BP=$!
taskset -c 0-7 timeout ${SPEED_TIMEOUT:-300} python3 benchmarks/models.py --device cuda \
    --dtype bfloat16 --size large --models "${SPEED_MODELS:-timm_regnety_016}" --runs 20 \
    --no-warm --timeout 280 --out "$OUT/models_timm_bf16.json" 2>&1 \
    | tee "$OUT/models_timm_bf16.log" | tail -8
if [ "${REGIONAL_AB:-0}" = "1" ]; then
    for reuse in 0 1; do
        KILN_REGIONAL_REUSE=$reuse taskset -c 0-7 timeout ${AB_TIMEOUT:-120} python3 \
            benchmarks/models.py --device cuda --dtype bfloat16 --size large \
            --models "${AB_MODELS:-gpt2,llama}" --compilers kiln --runs 20 --no-warm \
            --out "$OUT/models_reuse$reuse.json" 2>&1 | tee "$OUT/models_reuse$reuse.log" | tail -5
    done
fi
wait $BP
tail -25 "$OUT/breaks_timm.log"
