#!/usr/bin/env bash
# The decode engine as it ships (no variants), 7B and 3B shapes at batch 8 / 64 / 256, then
# the CUDA tests of what the last stops changed (host copies, split kernels, the engine on
# them), in one device call (nvidia-h200, carry .whl; ~8 min):
#   OUT=... bash bench/gpu_decode_sweep.sh
set -uo pipefail
TMP=${TMP:-/tmp} OUT=${OUT:-bench/results/gpu_decode}
PY=${PY:-python3}
source bench/gpu_wheels.sh
mkdir -p "$OUT"
timeout 300 $PY bench/gpu_decode.py --models qwen2_5_vl_7b,qwen2_5_vl_3b --batches 8,64,256 \
  --repeats 2 --budget-s 260 --eager-max-batch 0 --compare "" \
  --out "$OUT/gpu_decode_sweep.json" 2>&1 | quiet 10 | tee "$OUT/gpu_decode_sweep.log"
timeout 220 $PY -m pytest -q -p no:cacheprovider -rs tests/backends/torch/test_host_memory.py \
  tests/backends/torch/test_engine_split_cuda.py tests/backends/torch/test_split_kernel_cuda.py \
  2>&1 | quiet 8 | tee "$OUT/gpu_decode_sweep_tests.log"
