#!/usr/bin/env bash
# The decode engine after stop 24's fusions, in one device call (carry .whl; ~9 min):
# the 7B engine at 8 / 64 / 256 rows, the default side by side with $COMPARE (stop 24 ran
# split_kernel_writes, since the default; now index_copy_kv), kernels profiled at 8 and 64 rows; the
# 3B engine likewise; the split kernels' and the engine's CUDA tests; the vision tower at
# 8 videos. Files land in $OUT; the tables print last.
#   OUT=... bash bench/gpu_decode_fusion.sh
set -uo pipefail
TMP=${TMP:-/tmp} OUT=${OUT:-bench/results/gpu_decode}
PY=${PY:-python3}
source bench/gpu_wheels.sh
mkdir -p "$OUT"
decode() {  # model, seconds, extra args
  timeout "$2" $PY bench/gpu_decode.py --models "$1" --batches 8,64,256 --repeats 2 \
    --budget-s $(( $2 - 40 )) --eager-max-batch 0 --compare "${COMPARE:-index_copy_kv}" "${@:3}" \
    --out "$OUT/gpu_decode_fusion_${1#qwen2_5_vl_}.json" > "$OUT/gpu_decode_fusion_${1#qwen2_5_vl_}.log" 2>&1
}
decode qwen2_5_vl_7b 210 --profile 8,64
decode qwen2_5_vl_3b 120
timeout 150 $PY -m pytest -q -p no:cacheprovider -rs tests/backends/torch/test_split_kernel_cuda.py \
  tests/backends/torch/test_engine_split_cuda.py > "$OUT/fusion_tests.log" 2>&1
timeout 90 $PY bench/gpu_vision.py --shape qwen2_5_vl_7b --batches 8 --repeats 3 \
  --out "$OUT/vision" > "$OUT/vision.log" 2>&1
grep -h "^|" "$OUT"/gpu_decode_fusion_*.log
grep -h "retries\|capture" "$OUT"/gpu_decode_fusion_*.log | cut -c1-200 | head -5
tail -3 "$OUT/fusion_tests.log"; tail -6 "$OUT/vision.log"
