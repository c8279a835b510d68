#!/usr/bin/env bash
# `rollplex train backend.rollout=vllm` on one H200 (issue 8): the vLLM rollout beside the
# torch reference and trainer, 5 GRPO steps on easy-VQA at the 3B shape, measured timeline
# in TensorBoard; the engine's KV pool is the plan's and the plan's residency sleeps and wakes
# it. Then a torch.profiler look at 7B decode steps (bench/vllm_profile.py). Two device calls
# back to back (the machine keeps /tmp while warm):
#   call 1, carry .gpu1 .whl .gpu:  bash bench/gpu_train_vllm.sh prepare
#   call 2, carry .gpu2:            bash bench/gpu_train_vllm.sh run
# EXTRA adds overrides to the train command; the bf16 engine against the trainer (vLLM's
# logprobs vs the trainer's, metrics.csv mismatch_kl, rollout_is_*):
#   EXTRA="backend.vllm.return_logprobs=true algo.rollout_correction.rollout_is=token" \
#     bash bench/gpu_train_vllm.sh run
# .gpu1/.gpu2 hold rest.tar.xz/c.tar.xz from ../shared/gpu/vllm/pack.sh; .whl the cp312 wheels
# (hydra, omegaconf, datasets, easy-vqa, ...; pydantic comes with vLLM's part and is kept).
set -euo pipefail
OUT=${OUT:-/tmp/out}
SHAPE=${SHAPE:-qwen2_5_vl_3b}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1
unset PYTORCH_CUDA_ALLOC_CONF  # sleep mode's memory pool does not work with expandable segments
if [ "$1" = prepare ]; then
  mkdir -p /tmp/site /tmp/whl && tar -C /tmp/site -xJf .gpu1/rest.tar.xz
  # vLLM pins its pydantic: install every other wheel beside it
  cp .whl/*.whl /tmp/whl/ && rm -f /tmp/whl/pydantic* /tmp/whl/annotated_types* /tmp/whl/typing_inspection*
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/whl/*.whl
  mkdir -p /tmp/qtok && tar -C /tmp/qtok -xJf .gpu/qwen_tokenizer.tar.xz
  for shape in "$SHAPE" ${EXTRA_SHAPES:-qwen2_5_vl_7b}; do
    python3 -m rollplex.models.make_folder --shape "$shape" --tokenizer-dir /tmp/qtok \
      --out "/tmp/$shape" --device cuda
  done
  exit 0
fi
[ -f /tmp/site/vllm/_C_stable_libtorch.abi3.so ] || tar -C /tmp/site -xJf .gpu2/c.tar.xz
rm -rf "/tmp/run_vllm_$SHAPE"  # a taken run folder name would be suffixed: read the new run
python3 -m rollplex.cli train model="$SHAPE" model.path="/tmp/$SHAPE" hardware=h200 \
  train.device=cuda train.deterministic=false data=easyvqa backend.rollout=vllm \
  backend.vllm.gpu_memory_utilization=0.3 backend.vllm.sleep="${SLEEP:-always}" \
  backend.vllm.dtype=bfloat16 backend.vllm.max_model_len=4096 backend.vllm.enforce_eager=false \
  workload.prompts_per_step=8 workload.group_size=8 train.max_new_tokens=256 \
  workload.response_length.distribution=fixed workload.response_length.min=1 \
  workload.response_length.mean=256 workload.response_length.max=256 \
  train.steps=5 train.checkpoint_every=0 train.eval_every=0 train.trace_steps=3 \
  train.progress=false hydra.run.dir="/tmp/run_vllm_$SHAPE" ${EXTRA:-}
python3 bench/gpu_train_report.py "/tmp/run_vllm_$SHAPE" "vllm_$SHAPE" "$OUT"
# where a decode step's time goes (7B, batch 64 and 256), when its folder was prepared
if [ "${PROFILE:-1}" = 1 ] && [ -f /tmp/qwen2_5_vl_7b/config.json ]; then
  unset PYTORCH_CUDA_ALLOC_CONF
  timeout 300 python3 bench/vllm_profile.py --shape qwen2_5_vl_7b --batches 64,256 --tokens 64 \
    --out "$OUT" || echo "vllm_profile exited with $?"
fi
