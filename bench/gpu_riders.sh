#!/usr/bin/env bash
# Piggybacked rows on one H200 through the device tool (carry .whl): the CUDA tests of the
# ride and the engine, then bench/gpu_piggyback.py and bench/gpu_masters.py, in one call.
#   OUT=... bash bench/gpu_riders.sh
set -uo pipefail
TMP=${TMP:-/tmp} OUT=${OUT:-bench/results/gpu_piggyback}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$TMP/site" .whl/*.whl || echo "wheel install failed (continuing)"
export PYTHONPATH=$TMP/site:$PWD PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT"
$PY -m pytest -q -p no:cacheprovider -rs -s tests/backends/torch/test_riders_cuda.py \
  tests/backends/torch/test_engine_cuda.py 2>&1 | grep -v -i warn | tail -15 | tee "$OUT/cuda_tests.log"
$PY bench/gpu_piggyback.py "$@" 2>&1 | grep -v -i warn | tail -8 | tee "$OUT/gpu_piggyback.log"
$PY bench/gpu_masters.py --out "$OUT/masters" 2>&1 | grep -v -i warn | tail -12
