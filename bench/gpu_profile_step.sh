#!/usr/bin/env bash
# bench/gpu_profile_step.py on one GPU through the device tool (carry .whl and .gpu): one
# schedule of gpu_step.py's workload, its last step under torch.profiler, and the kernels
# inside each plan step (bench/trace_kernels.py). Issue 31's dense video at 7B:
#   SHAPE=qwen2_5_vl_7b bash bench/gpu_profile_step.sh --frames 32 --mean-length 64 --max-length 256
set -euo pipefail
SHAPE=${SHAPE:-qwen2_5_vl_3b} DEVICE=cuda TMP=${TMP:-/tmp}
OUT=${OUT:-bench/results/gpu_profile}
source bench/gpu_env.sh  # wheels, tokenizer, $FOLDER, $PY
mkdir -p "$OUT"
$PY bench/gpu_profile_step.py --shape "$SHAPE" --folder "$FOLDER" --out "$OUT/runs" "$@" 2>&1 \
  | grep -v -E "UserWarning|warnings\.warn\(|^\s*$|Loading weights" | tail -150
# the kernel tables, and the measured trace itself for bench/trace_kernels.py offline
cp "$OUT"/runs/kernels_*.md "$OUT/"
for run in "$OUT"/runs/*/; do
  cp "$run"tb/measured*.pt.trace.json.gz "$OUT/trace_$(basename "$run").json.gz" 2>/dev/null || true
done
rm -rf "${OUT:?}/runs"
