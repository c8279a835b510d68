#!/usr/bin/env bash
# What this stop changed, checked on one H200 in one device call (carry .whl; ~9 min):
# the decode engine with skinny.py's gate/up and LM-head kernels against the same engine on
# cuBLAS (`--compare cublas`, side by side), the vision tower deriving its longest window
# once per forward against once per block, then the engine's CUDA tests (skinny kernels
# are the engine's default on CUDA now) and the fused AdamW step's allocator check.
#   OUT=... bash bench/gpu_checks.sh
# (`python bench/gpu_skinny_gemm.py`, the kernels alone against cuBLAS, ran in the call
# before: bench/results/gpu_decode/skinny.md.)
set -uo pipefail
TMP=${TMP:-/tmp} OUT=${OUT:-bench/results/gpu_checks}
PY=${PY:-python3}
source bench/gpu_wheels.sh
mkdir -p "$OUT"
timeout 250 $PY bench/gpu_decode.py --models qwen2_5_vl_7b,qwen2_5_vl_3b --batches 8,32 \
  --repeats 2 --budget-s 210 --eager-max-batch 0 --compare cublas 2>&1 | quiet 8 \
  | tee "$OUT/gpu_decode.log"
timeout 120 $PY bench/gpu_vision.py --batches 4,8 --repeats 3 --out "$OUT" 2>&1 | quiet 7 \
  | tee "$OUT/gpu_vision.log"
timeout 150 $PY -m pytest -q -p no:cacheprovider -rs tests/backends/torch/test_engine_cuda.py \
  tests/backends/torch/test_skinny_cuda.py tests/backends/torch/test_riders_cuda.py \
  tests/backends/torch/test_masters.py \
  2>&1 | quiet 6 | tee "$OUT/engine_tests.log"
