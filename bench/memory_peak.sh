#!/usr/bin/env bash
# bench/memory_peak.py on one GPU through the device tool (carry .whl and .gpu): what is live
# at the allocator's peak of one schedule of gpu_step.py's workload. Run 12's 3B workload:
#   SHAPE=qwen2_5_vl_3b bash bench/memory_peak.sh --frames 16 --mean-length 160 --max-length 512
set -euo pipefail
SHAPE=${SHAPE:-qwen2_5_vl_3b} DEVICE=cuda TMP=${TMP:-/tmp}
OUT=${OUT:-bench/results/gpu_profile}
source bench/gpu_env.sh  # wheels, tokenizer, $FOLDER, $PY
mkdir -p "$OUT"
$PY bench/memory_peak.py --shape "$SHAPE" --folder "$FOLDER" --out "$OUT" "$@" 2>&1 \
  | grep -v -E "UserWarning|warnings\.warn\(|^\s*$|Loading weights" | tail -60
tar -czf "$OUT/memory_peak_runs_$SHAPE.tgz" -C "$OUT" runs && rm -rf "${OUT:?}/runs"  # traces: <= 8 files come back
