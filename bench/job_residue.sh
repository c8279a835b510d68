#!/usr/bin/env bash
# bench/job_residue.py on one GPU through the device tool (carry .whl and .gpu): what each
# train job of gpu_step.py's workload leaves allocated for the next job of the process.
#   SHAPE=qwen2_5_vl_3b bash bench/job_residue.sh --frames 32 --mean-length 64 --max-length 256
set -euo pipefail
SHAPE=${SHAPE:-qwen2_5_vl_3b} DEVICE=cuda TMP=${TMP:-/tmp}
OUT=${OUT:-bench/results/gpu_profile}
source bench/gpu_env.sh  # wheels, tokenizer, $FOLDER, $PY
mkdir -p "$OUT"
$PY bench/job_residue.py --shape "$SHAPE" --folder "$FOLDER" --out "$OUT" "$@" 2>&1 \
  | grep -v -E "UserWarning|warnings\.warn\(|^\s*$|Loading weights" | tee "$OUT/job_residue_$SHAPE.log" | tail -60
rm -rf "${OUT:?}/residue_runs"
