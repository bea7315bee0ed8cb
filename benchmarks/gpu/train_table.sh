#!/usr/bin/env bash
# benchmarks/training.py on the H200 in one call of the device tool:
#     run(command="MODELS=gpt2,bert MODE=fp32 bash benchmarks/gpu/train_table.sh", timeout_s=600)
# Full-size configs, eager / torch.compile / kiln side by side, every gradient checked; the
# JSON goes to $OUT/training_cuda_<mode>.json (set KILN_COMMIT=<short hash> in the command:
# the device copy has no git). ~60-130 s per model: four models per call.
source "$(dirname "$0")/setup.sh"
MODE=${MODE:-fp32}
taskset -c 0-15 timeout ${TABLE_TIMEOUT:-540} python3 benchmarks/training.py --device cuda \
    --mode "$MODE" --models "${MODELS:-gpt2,bert,llama,t5}" --rounds ${ROUNDS:-3} \
    --steps ${STEPS:-5} --timeout ${MODEL_TIMEOUT:-170} \
    --out "$OUT/training_cuda_${MODE}.json" 2>&1 | tail -${TAIL:-40}
