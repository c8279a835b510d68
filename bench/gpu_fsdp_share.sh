#!/usr/bin/env bash
# Runtime weight sharing on 2 H200s of one host (issue 10 item 3): 2-way FSDP2 on a random-
# weight Qwen2.5-VL-3B-shaped folder, the torch rollout by gather-and-copy, or sharing the
# trainer's shards in TP 1 / TP 2 (backend.fsdp.rollout_sync=share). Records per GPU the
# measured memory the rollout adds (vs gather's full second copy), the weight_sync time
# against gather-and-copy, and `rollplex train`'s step time on 2 GPUs against 1 GPU.
# Run from the repo root through the device tool (kind nvidia-h200-x2), carrying .whl
# (pydantic, hydra... cp312 wheels) and .gpu (qwen_tokenizer.tar.xz, package/models/
# tokenizer*.json), as bench/gpu_train_real_size.sh does:
#   bash bench/gpu_fsdp_share.sh
# Writes $OUT (default bench/results/fsdp_share)/{sync.json,fsdp_share.json,fsdp_share.md}
# and prints a short table last. Budget: under 8 minutes (each train run is bounded;
# runs that would start past the budget are skipped and reported as such).
# Dry run on CPU (gloo, 2 processes, the tiny preset, no folder): DEVICE=cpu bash bench/gpu_fsdp_share.sh
# Parts: SKIP_SYNC=1 skips the sync bench; ONLY=gpu2_share_tp2,gpu1 runs only those train runs.
set -uo pipefail
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-qwen2_5_vl_3b}
OUT=${OUT:-$PWD/bench/results/fsdp_share}
BUDGET_S=${BUDGET_S:-360}   # start no train run past this (the whole script stays < 8 min)
RUN_S=${RUN_S:-110}         # each train run's limit
TMP=${TMPDIR:-/tmp}/fsdp_share
mkdir -p "$OUT" "$TMP"
. bench/gpu_env.sh
if [ "$DEVICE" = cuda ]; then
  SYNC=(--device cuda --shape "$SHAPE" --folder "$FOLDER")
else
  SYNC=(--device cpu --shape tiny --repeats 2)
fi

if [ "${SKIP_SYNC:-0}" = 1 ]; then echo "== sync bench skipped (SKIP_SYNC=1)"; else
echo "== weight_sync and memory: gather vs share TP 1 / TP 2 (2 ranks)"
t0=$SECONDS
timeout 180 $TORCHRUN bench/gpu_fsdp_share.py sync "${SYNC[@]}" --out "$OUT" 2>&1 \
  | grep -v "Loading weights" | tail -40
echo "sync bench: $(( SECONDS - t0 )) s"
fi

# The same small GRPO job on 2 GPUs (gather, share TP 1, share TP 2) and on 1 GPU.
JOB=(backend=fsdp train.deterministic=false workload.prompts_per_step=4 workload.group_size=4
  train.max_new_tokens=32 workload.response_length.distribution=fixed train.checkpoint_every=0
  workload.response_length.min=1 workload.response_length.mean=32
  workload.response_length.max=32 train.steps=3
  train.eval_every=0 train.trace_steps=1 train.progress=false)
RUNS=()
train() {  # name, launcher words..., then overrides after --
  local name=$1; shift
  if (( SECONDS > BUDGET_S )); then echo "== $name: skipped (time budget)"; return; fi
  if [ -n "${ONLY:-}" ] && [[ ",$ONLY," != *",$name,"* ]]; then echo "== $name: not in ONLY"; return; fi
  echo "== train $name"
  local t=$SECONDS
  rm -rf "$TMP/run_$name"
  timeout "$RUN_S" "$@" "${MODEL[@]}" "${JOB[@]}" hydra.run.dir="$TMP/run_$name" \
    > "$TMP/$name.log" 2>&1 || { echo "   failed or timed out (exit $?):"; tail -5 "$TMP/$name.log"; }
  echo "   $(( SECONDS - t )) s"
  mkdir -p "$OUT/logs" && grep -v "Loading weights" "$TMP/$name.log" | tail -200 > "$OUT/logs/$name.log"
  RUNS+=("$name=$TMP/run_$name")
}
train gpu2_share_tp2 $TORCHRUN -m rollplex.cli train backend.fsdp.rollout_sync=share backend.fsdp.rollout_tp=2
train gpu2_gather $TORCHRUN -m rollplex.cli train backend.fsdp.rollout_sync=gather
train gpu1 env CUDA_VISIBLE_DEVICES=0 $PY -m rollplex.cli train backend.fsdp.rollout_sync=gather
train gpu2_share_tp1 $TORCHRUN -m rollplex.cli train backend.fsdp.rollout_sync=share backend.fsdp.rollout_tp=1
echo "total: $SECONDS s"
$PY bench/gpu_fsdp_share.py report --out "$OUT" "${RUNS[@]}"
