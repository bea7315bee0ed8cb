#!/usr/bin/env bash
# Where kiln's training time and memory go on the H200, with timm's capture rows beside it,
# in one call of the device tool (~9 min):
#     run(command="bash benchmarks/gpu/train_rows.sh", timeout_s=600)
# 1. benchmarks/breaks.py over timm's models on CPU cores 8-15, in the background (capture
#    only: graphs, breaks, eager frames of kiln and torch.compile);
# 2. benchmarks/train_profile.py on the GPU for PROFILE_MODELS (full size, fp32 strict):
#    eager / torch.compile / kiln step times, peak and saved-activation memory of each, and
#    kiln's step by kernel family (device time) and host time; pinned to cores 0-7;
# 3. with SPEED_MODELS set, benchmarks/models.py's bf16 inference rows for them.
source "$(dirname "$0")/setup.sh"
if [ -n "${TIMM:-timm_resnet50,timm_regnety_016}" ]; then
    taskset -c 8-15 timeout ${BREAKS_TIMEOUT:-480} python3 benchmarks/breaks.py \
        --models "${TIMM:-timm_resnet50,timm_regnety_016}" --timeout 150 \
        --out "$OUT/breaks_timm.json" > "$OUT/breaks_timm.log" 2>&1 &
fi
taskset -c 0-7 timeout ${PROFILE_TIMEOUT:-420} python3 benchmarks/train_profile.py --device cuda \
    --size large --models "${PROFILE_MODELS:-resnet50,bert}" --runs 3 --steps 5 2>&1 \
    | tee "$OUT/train_profile.log" | grep -v "^\s*[0-9.]* ms .*calls/step" | tail -60
cp benchmarks/results/train_profile_cuda_ce.json "$OUT/" 2>/dev/null
if [ -n "${SPEED_MODELS:-}" ]; then
    taskset -c 0-7 timeout ${SPEED_TIMEOUT:-150} python3 benchmarks/models.py --device cuda \
        --dtype bfloat16 --size large --models "$SPEED_MODELS" --runs 20 --no-warm \
        --timeout 140 --out "$OUT/models_bf16.json" 2>&1 | tail -6
fi
wait
tail -12 "$OUT/breaks_timm.log"
