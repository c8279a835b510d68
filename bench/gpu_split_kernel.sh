#!/usr/bin/env bash
# split_kernel.py on one H200 in one device call (carry .whl; ~9 min): the 7B decode engine
# at 8 / 64 / 256 rows, the default ("auto": split on the kernels, which write the step's
# K/V) side by side with the cache's two copies before them (`index_copy_kv`) and with split
# on compiled torch matmuls (`split_torch`), then the kernels' and the engine's CUDA tests.
# Stop 23 ran it with COMPARE=split_kernel,split_torch, before "auto" chose the kernels at
# every size.
#   OUT=... bash bench/gpu_split_kernel.sh
set -uo pipefail
TMP=${TMP:-/tmp} OUT=${OUT:-bench/results/gpu_decode}
PY=${PY:-python3}
source bench/gpu_wheels.sh
mkdir -p "$OUT"
timeout ${DECODE_S:-330} $PY bench/gpu_decode.py --models "${MODELS:-qwen2_5_vl_7b}" \
  --batches "${BATCHES:-8,64,256}" --repeats 2 --budget-s 260 --eager-max-batch 0 \
  --compare "${COMPARE:-index_copy_kv,split_torch}" --out "$OUT/gpu_decode_split_kernel.json" \
  2>&1 | grep -v -i warn > "$OUT/gpu_decode_split_kernel.log"
tail -12 "$OUT/gpu_decode_split_kernel.log"
timeout ${TESTS_S:-200} $PY -m pytest -q -p no:cacheprovider -rs \
  tests/backends/torch/test_split_kernel_cuda.py tests/backends/torch/test_engine_split_cuda.py \
  tests/backends/torch/test_skinny_cuda.py tests/backends/torch/test_host_memory.py \
  tests/backends/torch/test_engine_cuda.py 2>&1 | tail -60 > "$OUT/split_kernel_tests.log"
tail -4 "$OUT/split_kernel_tests.log"
