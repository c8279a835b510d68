#!/usr/bin/env bash
# Piggybacked rows on one H200 through the device tool (carry .whl): the CUDA tests of the
# ride and the engine, then bench/gpu_piggyback.py and bench/gpu_masters.py, in one call.
#   OUT=... bash bench/gpu_riders.sh
set -uo pipefail
TMP=${TMP:-/tmp} OUT=${OUT:-bench/results/gpu_piggyback}
PY=${PY:-python3}
source bench/gpu_wheels.sh
mkdir -p "$OUT"
$PY -m pytest -q -p no:cacheprovider -rs -s tests/backends/torch/test_riders_cuda.py \
  tests/backends/torch/test_engine_cuda.py 2>&1 | grep -v -i -E "^.*Warning:|warnings.warn" | tail -15 | tee "$OUT/cuda_tests.log"
$PY bench/gpu_piggyback.py "$@" 2>&1 | grep -v -i warn | tail -8 | tee "$OUT/gpu_piggyback.log"
[ "${SKIP_MASTERS:-0}" = 1 ] || $PY bench/gpu_masters.py --out "$OUT/masters" 2>&1 | grep -v -i warn | tail -12
