#!/usr/bin/env bash
# What this stop changed, checked on one H200 in one device call (carry .whl; ~8 min):
# the engine's CUDA tests with attention "auto" (split for few prompts), the riders', the
# split engine's and the green contexts' (close now retires them: the process must exit
# cleanly), then bench/gpu_attention.py and bench/gpu_micro_saved.py (3B shape).
#   OUT=... bash bench/gpu_checks.sh
set -uo pipefail
TMP=${TMP:-/tmp} OUT=${OUT:-bench/results/gpu_checks}
PY=${PY:-python3}
source bench/gpu_wheels.sh
mkdir -p "$OUT"
quiet() { grep -v -i -E "warn|^ *$" | tail -"$1"; }
timeout 300 $PY -m pytest -q -p no:cacheprovider -rs tests/backends/torch/test_engine_cuda.py \
  tests/backends/torch/test_riders_cuda.py tests/backends/torch/test_engine_split_cuda.py \
  2>&1 | quiet 6 | tee "$OUT/engine_tests.log"
timeout 150 $PY -m pytest -q -p no:cacheprovider -m gpu tests/runtime/test_green_contexts_cuda.py \
  > "$OUT/green_tests.full.log" 2>&1
echo "green tests exit status $?" | tee "$OUT/green_tests.log"  # 0: passed and exited cleanly
quiet 4 < "$OUT/green_tests.full.log" | tee -a "$OUT/green_tests.log"
rm -f "$OUT/green_tests.full.log"
timeout 150 $PY bench/gpu_attention.py 2>&1 | quiet 20 | tee "$OUT/gpu_attention.log"
timeout 300 $PY bench/gpu_micro_saved.py --shape qwen2_5_vl_3b 2>&1 | quiet 10 | tee "$OUT/gpu_micro_saved.log"
