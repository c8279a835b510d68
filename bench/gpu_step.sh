#!/usr/bin/env bash
# bench/gpu_step.py on one H200 through the device tool (carry .whl and .gpu): a random-weight
# Hub-format folder of $SHAPE with Qwen's tokenizer, every one-GPU schedule side by side in
# A/B rounds (--rounds, default 2: A B C | C B A; each ratio with its half-width, a same-plan
# pair as same_plan: true), then the decode engine alone at the step's batch
# (decode_bw_efficiency), all in one call. Issue 31's two workloads (7B):
#   SHAPE=qwen2_5_vl_7b bash bench/gpu_step.sh --frames 32 --mean-length 64 --max-length 256
#   SHAPE=qwen2_5_vl_7b bash bench/gpu_step.sh --frames 8 --mean-length 448
# Time: every schedule's --warmup-steps (the first also pays the process's cold compiles: on
# an H100 at 3B the two warm-ups of run 25 took 235 s), then rounds x schedules x --steps
# steps (each run also loads and plans); --budget-s starts no run past it, under the device's
# 600 s per command. Two schedules a call leave room for two rounds: at 3B --budget-s 420.
#   SHAPE=qwen2_5_vl_3b bash bench/gpu_step.sh [gpu_step.py args]
set -euo pipefail
SHAPE=${SHAPE:-qwen2_5_vl_3b} DEVICE=cuda TMP=${TMP:-/tmp}
OUT=${OUT:-bench/results/gpu_step}
source bench/gpu_env.sh  # wheels, tokenizer, $FOLDER, $PY
mkdir -p "$OUT"
$PY bench/gpu_step.py --shape "$SHAPE" --folder "$FOLDER" --out "$OUT" "$@" 2>&1 \
  | grep -v -E "UserWarning|warnings\.warn\(|^\s*$" | tee "$OUT/gpu_step_$SHAPE.log" | tail -40
# DECODE=0 skips the decode engine's bench (a call short of device time)
if [ "${DECODE:-1}" != 0 ]; then
ROWS=$($PY -c "import json; w=json.load(open('$OUT/gpu_step_$SHAPE.json'))['workload']; print(w['prompts']*w['group'])")
$PY bench/gpu_decode.py --models "$SHAPE" --batches "$ROWS" --repeats 2 --compare "" \
  --eager-max-batch 0 --out "$OUT/gpu_decode_$SHAPE.json" 2>&1 | grep -v -E "UserWarning|warnings\.warn\(" | tail -4
$PY - "$OUT/gpu_step_$SHAPE.json" "$OUT/gpu_decode_$SHAPE.json" <<'PYEOF'
import json, sys
step, dec = (json.load(open(p)) for p in sys.argv[1:3])
row = dec["rows"][0]
step["decode_bw_efficiency"] = row.get("engine_hbm_share")
step["decode_bench"] = {k: row.get(k) for k in ("batch", "engine_ms_per_step", "engine_hbm_share")}
json.dump(step, open(sys.argv[1], "w"), indent=1)
print("decode_bw_efficiency", step["decode_bw_efficiency"])
PYEOF
fi
# the run folders (traces, metrics, plans) in one archive: the device tool returns <= 8 files
tar -czf "$OUT/runs_$SHAPE.tgz" -C "$OUT" "runs_$SHAPE" && rm -rf "${OUT:?}/runs_$SHAPE"
