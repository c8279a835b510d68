#!/usr/bin/env bash
# The disaggregated schedule on its two pools (issue 10: "the plan's ranks and transfers are
# applied for real") on 2 H200s of one host: the small GRPO job of gpu_fsdp_share.sh on a
# random-weight Qwen2.5-VL-3B-shaped folder, as `schedule=disaggregated` (rank 0 rolls out
# with a full bf16 model, rank 1 trains with FSDP2 and holds the reference; every step the
# weights go 1 -> 0 and the rollout's outputs 0 -> 1 by NCCL point-to-point) against
# colocated FSDP2 (gather-and-copy rollout) on the same 2 GPUs. Prints the step times and,
# per transfer step, the bytes moved per step (against the plan's routes) and the send /
# receive seconds; writes $OUT/{gpu_disagg.json,gpu_disagg.md} and prints a table last.
# Run from the repo root through the device tool (kind nvidia-h200-x2), carrying .whl
# (pydantic, hydra... cp312 wheels) and .gpu (qwen_tokenizer.tar.xz), as gpu_fsdp_share.sh:
#   bash bench/gpu_disagg.sh
# Budget: under 6 minutes (folder ~1 min, each run bounded by RUN_S; a run that would
# start past BUDGET_S is skipped and reported as such).
# Dry run on CPU (gloo, 2 processes, the tiny demo model): DEVICE=cpu bash bench/gpu_disagg.sh
# JOB_EXTRA="..." appends overrides to every run (bench/gpu_step.py's video workload:
# JOB_EXTRA="$(python bench/gpu_step.py --print-job)").
set -uo pipefail
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-qwen2_5_vl_3b}
OUT=${OUT:-$PWD/bench/results/disagg}
BUDGET_S=${BUDGET_S:-240}   # start no train run past this
RUN_S=${RUN_S:-120}         # each train run's limit
TMP=${TMPDIR:-/tmp}/gpu_disagg
mkdir -p "$OUT" "$TMP"
. bench/gpu_env.sh

# gpu_fsdp_share.sh's JOB: 4 prompts x 4 samples, 32 new tokens, 3 steps, no checkpoint.
JOB=(backend=fsdp train.deterministic=false workload.prompts_per_step=4 workload.group_size=4
  train.max_new_tokens=32 workload.response_length.distribution=fixed
  workload.response_length.min=1 workload.response_length.mean=32
  workload.response_length.max=32 train.steps=${STEPS:-3} train.checkpoint_every=0
  train.eval_every=0 train.trace_steps=1 train.progress=false)
RUNS=()
train() {  # name, then the train job's own overrides
  local name=$1; shift
  if (( SECONDS > BUDGET_S )); then echo "== $name: skipped (time budget)"; return; fi
  echo "== train $name"
  local t=$SECONDS
  rm -rf "$TMP/run_$name"
  # shellcheck disable=SC2086  # JOB_EXTRA: more overrides, split on spaces (later wins)
  timeout "$RUN_S" $TORCHRUN -m rollplex.cli train "${MODEL[@]}" "${JOB[@]}" ${JOB_EXTRA:-} "$@" \
    hydra.run.dir="$TMP/run_$name" > "$TMP/$name.log" 2>&1 \
    || { echo "   failed or timed out (exit $?):"; tail -5 "$TMP/$name.log"; }
  echo "   $(( SECONDS - t )) s"
  grep -h "rollplex.runtime.pool_steps" "$TMP/run_$name"/ranks/rank*.log 2>/dev/null | tail -4 \
    | sed 's/^/   /' | cut -c1-220
  RUNS+=("$name=$TMP/run_$name")
}
# The plan is made for the torchrun world: hardware.num_gpus=2 (1 rollout + 1 training GPU).
train disagg schedule=disaggregated hardware.num_gpus=2 schedule.rollout_gpus=1
train colocated backend.fsdp.rollout_sync=gather
echo "total: $SECONDS s"
$PY bench/gpu_disagg.py --out "$OUT" "${RUNS[@]}"
