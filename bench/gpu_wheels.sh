# Sourced by the one-process GPU scripts (gpu_riders.sh, gpu_checks.sh): the carried wheels
# (.whl: pydantic, hydra, ...) into $TMP/site on the GPU machine, and the environment that
# finds them, and `quiet N` (a log's last N lines without warnings). Expects PY and TMP.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$TMP/site" .whl/*.whl || echo "wheel install failed (continuing)"
export PYTHONPATH=$TMP/site:$PWD PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# drop warnings and blank lines, but never pytest's summary (it says "N warnings" too)
quiet() { awk 'tolower($0) ~ /passed|failed|error|^[|]/ || (tolower($0) !~ /warn/ && NF)' | tail -"$1"; }
