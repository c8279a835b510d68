#!/usr/bin/env bash
# What this stop changed, checked on one H200 in one device call (carry .whl; ~9 min):
# the two-level draw against the one-scan draw (alone, then in the decode engine side by
# side), then the engine's, riders', split engine's and green contexts' CUDA tests (the
# green tests must exit cleanly after close).
#   OUT=... bash bench/gpu_checks.sh
set -uo pipefail
TMP=${TMP:-/tmp} OUT=${OUT:-bench/results/gpu_checks}
PY=${PY:-python3}
source bench/gpu_wheels.sh
mkdir -p "$OUT"
# drop warnings and blank lines, but never pytest's summary (it says "N warnings" too)
quiet() { awk 'tolower($0) ~ /passed|failed|error|^[|]/ || (tolower($0) !~ /warn/ && NF)' | tail -"$1"; }
timeout 90 $PY bench/gpu_sampler_check.py 2>&1 | quiet 16 | tee "$OUT/gpu_sampler.log"
timeout 270 $PY bench/gpu_decode.py --models qwen2_5_vl_7b,qwen2_5_vl_3b --batches 8,64,256 \
  --repeats 2 --budget-s 170 --eager-max-batch 0 --compare one_scan 2>&1 | quiet 9 \
  | tee "$OUT/gpu_decode.log"
timeout 150 $PY -m pytest -q -p no:cacheprovider -rs tests/backends/torch/test_engine_cuda.py \
  tests/backends/torch/test_riders_cuda.py tests/backends/torch/test_engine_split_cuda.py \
  2>&1 | quiet 6 | tee "$OUT/engine_tests.log"
timeout 90 $PY -m pytest -q -p no:cacheprovider -m gpu tests/runtime/test_green_contexts_cuda.py \
  > "$OUT/green_tests.full.log" 2>&1
echo "green tests exit status $?" | tee "$OUT/green_tests.log"  # 0: passed and exited cleanly
grep -E -A12 "^_{3,} test" "$OUT/green_tests.full.log" | grep -E "Error|assert|^E " | head -8 \
  | tee -a "$OUT/green_tests.log"
quiet 4 < "$OUT/green_tests.full.log" | tee -a "$OUT/green_tests.log"
rm -f "$OUT/green_tests.full.log"
