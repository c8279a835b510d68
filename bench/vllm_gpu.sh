#!/usr/bin/env bash
# The vLLM rollout role on one H200 (bench/vllm_gpu.py): decode throughput at batch 8-256,
# in-place weight update, sleep level 1, for random-weight Qwen2.5-VL 3B- and 7B-shaped
# folders. Run from the repo root on the GPU machine, after vLLM 0.26.0 is unpacked into
# /tmp/site (../shared/gpu/vllm/README.md: rest.tar.xz in one call, c.tar.xz in the next).
#
#   call 1 (carry .gpu1 .gpu):  mkdir -p /tmp/site && tar -C /tmp/site -xJf .gpu1/rest.tar.xz \
#                               && bash bench/vllm_gpu.sh --prepare
#   call 2 (carry .gpu2):       tar -C /tmp/site -xJf .gpu2/c.tar.xz && bash bench/vllm_gpu.sh
#
# --prepare unpacks the Qwen tokenizer (.gpu/qwen_tokenizer.tar.xz) to /tmp/qtok and builds
# the model folders /tmp/<shape> that are missing, then stops. Without it the same steps run
# (skipped when already done) and then the benchmark, under a total wall budget of
# VLLM_GPU_TOTAL_S seconds (default 560) counted from this script's start: the python
# script gets what is left minus a margin as --budget-s (at most 480) and is killed 15 s
# before the end; the table is then rebuilt from the JSON. Extra arguments go to
# bench/vllm_gpu.py (e.g. --shapes qwen2_5_vl_3b --batches 8,256).
# Writes $OUT/<shape>/vllm_gpu.json (incrementally) and $OUT/<shape>/vllm_gpu.md, one process
# per shape.
set -uo pipefail
T_START=$(date +%s)
TOTAL_S=${VLLM_GPU_TOTAL_S:-560}
OUT=${OUT:-/tmp/out}
SHAPES=${VLLM_GPU_SHAPES:-qwen2_5_vl_3b,qwen2_5_vl_7b}
PREPARE=0
if [ "${1:-}" = "--prepare" ]; then PREPARE=1; shift; fi
mkdir -p "$OUT"
since() { echo $(( $(date +%s) - T_START )); }
say() { echo "[vllm_gpu.sh $(since)s] $*"; }

export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# sleep mode's memory pool does not work with expandable segments
unset PYTORCH_CUDA_ALLOC_CONF

# vLLM's part 1 brings pydantic 2.12.5 (enough for rollplex); the .whl wheels only when
# pydantic is missing altogether, so that they do not replace vLLM's pins.
if ! python3 -c "import pydantic" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    say "no pydantic under /tmp/site: installing .whl"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site .whl/*.whl || say "WARNING: .whl install failed"
  else
    say "WARNING: pydantic not importable and no .whl to install it from"
  fi
fi
[ -f /tmp/site/vllm/__init__.py ] || say "WARNING: /tmp/site/vllm missing (rest.tar.xz not unpacked?)"
[ -f /tmp/site/vllm/_C_stable_libtorch.abi3.so ] || say "note: vllm/_C_stable_libtorch.abi3.so missing (c.tar.xz not unpacked yet)"

if [ ! -f /tmp/qtok/tokenizer.json ]; then
  if [ -f .gpu/qwen_tokenizer.tar.xz ]; then
    mkdir -p /tmp/qtok && tar -C /tmp/qtok -xJf .gpu/qwen_tokenizer.tar.xz
    say "tokenizer unpacked to /tmp/qtok"
  else
    say "WARNING: no /tmp/qtok/tokenizer.json and no .gpu/qwen_tokenizer.tar.xz: missing folders cannot be built"
  fi
fi

python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(), 'free GiB %.1f' % (torch.cuda.mem_get_info()[0] / 2**30))" || true
df -h /tmp | tail -1

for shape in ${SHAPES//,/ }; do
  if [ -f "/tmp/$shape/config.json" ]; then
    say "/tmp/$shape exists"
    continue
  fi
  if [ "$(since)" -gt $(( TOTAL_S - 200 )) ]; then
    say "not building /tmp/$shape: too little time left"
    continue
  fi
  t0=$(date +%s)
  python3 -m rollplex.models.make_folder --shape "$shape" --tokenizer-dir /tmp/qtok \
    --out "/tmp/$shape" --device cuda || say "WARNING: make_folder $shape failed"
  say "make_folder $shape: $(( $(date +%s) - t0 )) s"
done

if [ "$PREPARE" = 1 ]; then
  ls -la /tmp/qtok /tmp/qwen2_5_vl_* 2>&1 | head -40
  say "prepared"
  exit 0
fi

LEFT=$(( TOTAL_S - $(since) ))
BUDGET=$(( LEFT - 60 ))
[ "$BUDGET" -gt 480 ] && BUDGET=480
[ "$BUDGET" -lt 30 ] && BUDGET=30
KILL_AFTER=$(( LEFT - 15 ))
[ "$KILL_AFTER" -lt 45 ] && KILL_AFTER=45
# One process per shape: a process holds only one sleep-mode engine (vLLM's CuMem allocator
# asserts "can only be used for one instance per process"). Results go to $OUT/<shape>/.
rc=0
for shape in ${SHAPES//,/ }; do
  LEFT=$(( TOTAL_S - $(since) ))
  BUDGET=$(( LEFT - 60 ))
  [ "$BUDGET" -gt 480 ] && BUDGET=480
  if [ "$BUDGET" -lt 60 ]; then say "skipping $shape: too little time left"; continue; fi
  KILL_AFTER=$(( LEFT - 15 ))
  say "running bench/vllm_gpu.py for $shape: --budget-s $BUDGET (killed after ${KILL_AFTER}s)"
  mkdir -p "$OUT/$shape"
  timeout -k 5 "$KILL_AFTER" python3 bench/vllm_gpu.py --shapes "$shape" --models-dir /tmp \
    --out "$OUT/$shape" --budget-s "$BUDGET" --grace-s 40 "$@"
  one=$?
  say "bench/vllm_gpu.py ($shape) exited with $one"
  if [ "$one" -ne 0 ] && [ -f "$OUT/$shape/vllm_gpu.json" ]; then
    # killed or crashed before printing: the table from what the JSON holds
    python3 bench/vllm_gpu.py --table-only "$OUT/$shape/vllm_gpu.json" || cat "$OUT/$shape/vllm_gpu.json"
  fi
  [ "$one" -ne 0 ] && rc=$one
done
exit "$rc"
