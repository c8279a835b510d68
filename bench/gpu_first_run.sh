#!/usr/bin/env bash
# Issue 32's GPU first run on one H200 through the device tool (carry .whl and .gpu, as
# bench/gpu_step.sh): a random-weight Hub folder per shape with Qwen's tokenizer, then for
# each algorithm the user's command twice,
#   rollplex train model=hub model.path=<folder> train.device=cuda train.steps=5 [algo=ppo]
# first with an empty compile cache (a first run), then again with the cache it left (a
# second run), and bench/gpu_first_run.py assembles first_run.json from the run folders:
# predicted (as priced for a user: no calibration given) and steady step, the first step of
# each run. Besides the user's command each run gets only hydra.run.dir and
# train.checkpoint_every=0: a 7B checkpoint with its AdamW state does not fit the machine's
# 64 GiB disk beside the folder (the quick start's checkpoint path is the same code).
# One call is limited to 10 minutes, so split the shapes and algorithms over calls; each
# call merges its rows into the carried bench/results/gpu_first_run/first_run.json:
#   SHAPES=qwen2_5_vl_3b bash bench/gpu_first_run.sh
#   SHAPES=qwen2_5_vl_7b ALGOS=grpo bash bench/gpu_first_run.sh
#   SHAPES=qwen2_5_vl_7b ALGOS=ppo bash bench/gpu_first_run.sh
set -euo pipefail
SHAPES=${SHAPES:-"qwen2_5_vl_3b qwen2_5_vl_7b"} ALGOS=${ALGOS:-"grpo ppo"}
DEVICE=cuda TMP=${TMP:-/tmp} OUT=${OUT:-bench/results/gpu_first_run}
RESULTS=bench/results/gpu_first_run RUNS=$TMP/first_run_runs
SHAPE=${SHAPES%% *}
source bench/gpu_env.sh  # wheels, Qwen's tokenizer in $TMP/qtok, $FOLDER for $SHAPE, $PY
mkdir -p "$OUT" "$RUNS"
TAG=$(echo "$SHAPES $ALGOS" | tr ' ' '_')
LOG=$OUT/first_run_$TAG.log
for SHAPE in $SHAPES; do
  FOLDER=$TMP/$SHAPE
  [ -f "$FOLDER/config.json" ] || $PY -m rollplex.models.make_folder --shape "$SHAPE" \
    --tokenizer-dir "$TMP/qtok" --out "$FOLDER" --device cuda
  for ALGO in $ALGOS; do
    ALGO_ARG=(); [ "$ALGO" = grpo ] || ALGO_ARG=(algo="$ALGO")  # grpo: train's default
    # a compile cache of this shape and algorithm alone: run 1 compiles from nothing
    export ROLLPLEX_CACHE_DIR=$TMP/rollplex_cache/${SHAPE}_$ALGO
    rm -rf "$ROLLPLEX_CACHE_DIR"
    for N in 1 2; do
      RUN=$RUNS/${SHAPE}_${ALGO}_run$N
      rm -rf "$RUN"
      echo "== $SHAPE $ALGO run $N" | tee -a "$LOG"
      t0=$SECONDS
      if ! $PY -m rollplex.cli train model=hub model.path="$FOLDER" train.device=cuda \
        train.steps=5 "${ALGO_ARG[@]}" train.checkpoint_every=0 hydra.run.dir="$RUN" \
        > "$RUN.out" 2>&1; then
        echo "FAILED: $SHAPE $ALGO run $N" | tee -a "$LOG"
      fi
      tr '\r' '\n' < "$RUN.out" | grep -v -E "UserWarning|warnings\.warn\(|^\s*$|it/s\]$" \
        >> "$LOG" || true
      grep -E "sized:|priced by|: [0-9.]+ s$|step time:|Error|rollplex:" "$RUN.out" \
        | tail -30 || true
      echo "wall $(( SECONDS - t0 )) s" | tee -a "$LOG"
    done
  done
  rm -rf "$FOLDER"  # the next shape's folder needs the disk
done
MERGE=(); [ -f "$RESULTS/first_run.json" ] && MERGE=(--merge "$RESULTS/first_run.json")
$PY bench/gpu_first_run.py --runs "$RUNS" --out "$OUT/first_run.json" "${MERGE[@]}" \
  --command "SHAPES='$SHAPES' ALGOS='$ALGOS' bash bench/gpu_first_run.sh" | tee -a "$LOG"
# the run folders' small files in one archive (the device tool returns a few files)
tar -czf "$OUT/runs_$TAG.tgz" -C "$RUNS" --exclude='*.pt.trace.json' --exclude='events.*' .
