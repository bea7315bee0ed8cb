# Sourced by the device-tool scripts (final.sh, index_checks.sh): the output folder, the
# environment, the GPU's name, and kiln's packages installed editable over the machine's
# torch and triton (no dependencies fetched: the device machine has no network).
set -uo pipefail
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache}
unset TRITON_INTERPRET
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps -e packages/kiln-capture \
    -e packages/kiln-shapes -e packages/kiln-aot -e packages/kiln-inductor -e packages/kiln-cpp \
    -e packages/kiln-triton -e packages/kiln 2>&1 | tail -3
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"
