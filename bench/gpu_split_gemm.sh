#!/usr/bin/env bash
# The split-reduction projections (skinny.py skinny_partials), in one device call
# (nvidia-h200, carry .whl; ~8 min). Steps, each skipped with its variable set to 0:
#   KERNELS: the kernels alone against cuBLAS over L2-defeating weight copies
#   ENGINE:  the default engine (split_gemm on) against it with o and down on cuBLAS
#            (no_split_gemm; COMPARE= other variants, empty for none), side by side, 7B
#            and 3B shapes (MODELS) at ROWS rows, kernels profiled at PROFILE rows (8;
#            empty for none); SPLIT_MAX_ROWS=n: split_gemm up to n rows in every engine
#   TESTS:   their CUDA tests (test_skinny_cuda.py; TESTS_S seconds, default 200)
#   OUT=... bash bench/gpu_split_gemm.sh
set -uo pipefail
TMP=${TMP:-/tmp} OUT=${OUT:-bench/results/gpu_decode}
PY=${PY:-python3}
source bench/gpu_wheels.sh
mkdir -p "$OUT"
if [ "${KERNELS:-1}" != 0 ]; then
  timeout 140 $PY bench/gpu_split_gemm.py --models qwen2_5_vl_7b,qwen2_5_vl_3b \
    --rows 8,32,64 --splits 2,4,8 2>&1 | quiet 24 | tee "$OUT/gpu_split_gemm.log"
fi
if [ "${ENGINE:-1}" != 0 ]; then
  timeout ${ENGINE_S:-300} $PY bench/gpu_decode.py --models ${MODELS:-qwen2_5_vl_7b,qwen2_5_vl_3b} \
    --batches ${ROWS:-8,32} --repeats 2 --budget-s $(( ${ENGINE_S:-300} - 40 )) --eager-max-batch 0 \
    --compare "${COMPARE-no_split_gemm}" --profile "${PROFILE-8}" ${SPLIT_MAX_ROWS:+--split-max-rows $SPLIT_MAX_ROWS} --out "$OUT/gpu_decode_split_gemm.json" 2>&1 \
    | quiet 10 | tee "$OUT/gpu_decode_split_gemm.log"
fi
if [ "${TESTS:-1}" != 0 ]; then
  timeout ${TESTS_S:-200} $PY -m pytest -q -p no:cacheprovider -rs tests/backends/torch/test_skinny_cuda.py \
    2>&1 | quiet 8 | tee "$OUT/gpu_split_gemm_tests.log"
fi
