#!/usr/bin/env bash
# The H200 training tables, fp32 strict and bf16 autocast, all eight models of
# benchmarks/training.py at one commit, with the layout A/B of the two CNNs, in a pipeline
# that outlives one call of the device tool (600 s each). Call it repeatedly, back to back
# (the machine is given back after 30 s idle):
#     run(command="KILN_COMMIT=<hash> bash benchmarks/gpu/train_all.sh", timeout_s=600)
# The first call snapshots the tree, installs kiln from the snapshot and starts the
# pipeline there (setsid: it survives the call); every
# call then returns DEADLINE seconds after its start (or when the pipeline is done), having
# copied what is done to $OUT as it came, with the log's tail. A machine lost between calls
# loses the pipeline: the next call starts it again.
# Stages, logged to /tmp/train_all/log:
#   1. fill the caches: every (model, mode) row compiled and checked once, three workers
#      per mode side by side (--rounds 0 --jobs 3): cold compile times under load;
#   2. timed, one worker at a time: bf16 then fp32 (3 rounds of 5 steps), each row's
#      compilers compiled from warm caches (compile s in those tables is warm);
#   3. the CNNs' layout A/B, kiln only: bf16 with KILN_CHANNELS_LAST=auto (channels-last
#      training graphs; off by default), fp32 with KILN_CHANNELS_LAST=cuda.
# PLAN=cnn runs a short plan instead (the bf16 CNN rows with all three compilers, cold, then
# the bf16 channels-last A/B): for when the session's device time is short.
set -uo pipefail
OUT=${OUT:-benchmarks/results/gpu}
WORK=/tmp/train_all
ALL=gpt2,bert,distilbert,llama,t5,resnet50,convnext_tiny,vit_small
CNN=resnet50,convnext_tiny
DEADLINE=${DEADLINE:-570}  # seconds after this script's start at which a call returns
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
if [ ! -e "$WORK/started" ]; then
    # Later calls bring the working tree as it is then, and kiln is installed editable:
    # the pipeline runs from a snapshot of the tree the first call brought, so every row
    # is measured at that one commit whatever changes here meanwhile.
    rm -rf "$WORK" && mkdir -p "$WORK/repo"
    tar --exclude=./.git --exclude=./benchmarks/results -cf - . | tar -xf - -C "$WORK/repo"
    cd "$WORK/repo" || exit 1
    source benchmarks/gpu/setup.sh > "$OUT/setup.log" 2>&1
    tail -3 "$OUT/setup.log"
    touch "$WORK/started"
    T="python3 benchmarks/training.py --device cuda --timeout ${MODEL_TIMEOUT:-400}"
    AB_BF16="KILN_CHANNELS_LAST=auto $T --mode bf16 --models $CNN --compilers kiln \
        --out $WORK/layout_bf16_auto.json"
    if [ "${PLAN:-full}" = cnn ]; then
        STEPS="
        echo stage 2 \$(date +%T)
        $T --mode bf16 --models $CNN --out $WORK/training_cuda_bf16.json
        echo stage 3 \$(date +%T)
        $AB_BF16"
    else
        STEPS="
        echo stage 1 \$(date +%T)
        $T --mode bf16 --models $ALL --rounds 0 --jobs 3 --out $WORK/warm_bf16.json &
        $T --mode fp32 --models $ALL --rounds 0 --jobs 3 --out $WORK/warm_fp32.json &
        wait
        echo stage 2 \$(date +%T)
        $T --mode bf16 --models $ALL --out $WORK/training_cuda_bf16.json
        $T --mode fp32 --models $ALL --out $WORK/training_cuda_fp32.json
        echo stage 3 \$(date +%T)
        $AB_BF16
        KILN_CHANNELS_LAST=cuda $T --mode fp32 --models $CNN --compilers kiln \
            --out $WORK/layout_fp32_nhwc.json"
    fi
    setsid nohup bash -c "
        export PYTHONUNBUFFERED=1 KILN_CACHE_DIR=\${KILN_CACHE_DIR:-/tmp/kiln-cache}
        unset TRITON_INTERPRET
        $STEPS
        echo done \$(date +%T)
        touch $WORK/done
    " > "$WORK/log" 2>&1 < /dev/null &
fi
# results are copied as they come: a call cut short still brings back what was done
while [ "$SECONDS" -lt "$DEADLINE" ] && [ ! -e "$WORK/done" ]; do
    cp "$WORK"/*.json "$WORK/log" "$OUT/" 2>/dev/null
    sleep 5
done
cp "$WORK"/*.json "$WORK/log" "$OUT/" 2>/dev/null
grep -E "^stage|^done|compiled in|round 3/3|error|Error|timed out|^\[[0-9]" "$WORK/log" | tail -${TAIL:-60}
for f in "$WORK"/training_cuda_*.json "$WORK"/layout_*.json; do
    [ -e "$f" ] || continue
    python3 -c "import json,sys; print(sys.argv[1]); print('\n'.join(json.load(open(sys.argv[1]))['table']))" "$f"
done
