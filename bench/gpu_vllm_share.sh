#!/usr/bin/env bash
# vLLM on the trainer's storage (backend.vllm.weights=share) against its own copy, on one
# H200 (issue 10): the GPU test, then bench/gpu_vllm_share.py side by side at the 3B shape.
# Two device calls back to back (the machine keeps /tmp while warm), as gpu_train_vllm.sh:
#   call 1, carry .gpu1 .whl .gpu:  EXTRA_SHAPES= bash bench/gpu_train_vllm.sh prepare
#   call 2, carry .gpu2:            bash bench/gpu_vllm_share.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
SHAPE=${SHAPE:-qwen2_5_vl_3b}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1
[ -f /tmp/site/vllm/_C_stable_libtorch.abi3.so ] || tar -C /tmp/site -xJf .gpu2/c.tar.xz
mkdir -p "$OUT"
[ "${SKIP_TEST:-0}" = 1 ] || timeout 240 python3 -m pytest -q -p no:cacheprovider tests/backends/vllm/test_share_gpu.py 2>&1 \
  | grep -v "Loading weights" | tail -15
timeout 330 python3 bench/gpu_vllm_share.py --folder "/tmp/$SHAPE" --shape "$SHAPE" --out "$OUT" \
  2>&1 | grep -v "Loading weights\|it/s\]" | tail -30
