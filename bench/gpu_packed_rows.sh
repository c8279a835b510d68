#!/usr/bin/env bash
# bench/gpu_packed_rows.py on one GPU through the device tool (carry .whl; ~6 min): packed
# vs padded response scoring at the 7B long-responses shape in A/B rounds, then the CUDA
# tests whose response forwards now run packed (flex attention on the unpacked layout).
#   bash bench/gpu_packed_rows.sh [gpu_packed_rows.py args]
set -euo pipefail
PY=${PY:-python3} TMP=${TMP:-/tmp}
source bench/gpu_wheels.sh
OUT=${OUT:-bench/results/gpu_packed_rows}
mkdir -p "$OUT"
$PY bench/gpu_packed_rows.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_packed_rows.log" | quiet 14
$PY -m pytest -q -p no:cacheprovider tests/backends/torch/test_packed_rows_cuda.py \
  tests/backends/torch/test_shared_prefix_cuda.py \
  tests/backends/torch/test_decode_once_cuda.py 2>&1 | tee "$OUT/cuda_tests.log" | quiet 6
