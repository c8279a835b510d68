"""The vLLM rollout built for a run: an engine on the trainer's initial weights.

The engine starts on `model.path`, or on a Hub-format folder written once from the trainer's
weights and the run's tokenizer and processor; later updates go in place (`weight_sync`),
never through disk. With `backend.vllm.weights=share` (CUDA) the trainer's parameters become
views of the engine's tensors (share.py).
"""

from __future__ import annotations

import logging
import math
import tempfile
from pathlib import Path
from typing import Any

from rollplex.backends.vllm.rollout import VllmRollout
from rollplex.graph.ir import DTYPE_BYTES
from rollplex.ops.formulas.engines import KV_BLOCK_TOKENS
from rollplex.specs.backend import BackendSpec
from rollplex.specs.vllm import VllmSpec

log = logging.getLogger(__name__)

__all__ = ["VllmRollout", "build_rollout", "write_start_folder"]


def write_start_folder(config: Any, trainer: Any, folder: Path, max_pixels: int) -> Path:
    """The trainer's current weights, with the tokenizer and processor of the tiny task, as
    a folder vLLM can start on (config, safetensors, tokenizer + chat template, processor)."""
    from rollplex.backends.torch.model import save_model
    from rollplex.backends.torch.tokenizer import build_image_processor, build_tokenizer
    from rollplex.models.chat_template import QWEN2_5_VL_CHAT_TEMPLATE

    save_model(trainer.model, config.model, folder)
    tok = build_tokenizer(config.model)
    tok.chat_template = QWEN2_5_VL_CHAT_TEMPLATE
    tok.save_pretrained(folder)
    build_image_processor(config.model, max_pixels=max_pixels).save_pretrained(folder)
    return folder


def kv_budget(model: Any, spec: VllmSpec, planned: int | None) -> int:
    """The engine's KV cache bytes: the plan's pool (sized in the model's dtype) in the
    engine's dtype, and never below what one `max_model_len` sequence needs, without which
    vLLM refuses to start. No plan: the spec's `kv_cache_bytes`."""
    if planned is None:
        return spec.kv_cache_bytes
    per_token = model.kv_bytes_per_token() // model.dtype_bytes * DTYPE_BYTES[spec.dtype]
    in_engine = math.ceil(planned / model.dtype_bytes * DTYPE_BYTES[spec.dtype])
    # Twice the bare K/V bytes: vLLM's layout can take more per token than ours (its CPU
    # backend, 128-token blocks, served 384 of 512 tokens from 512 tokens' bytes).
    one_sequence = 2 * -(-spec.max_model_len // KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS * per_token
    if one_sequence > in_engine:
        log.info(
            "vLLM KV cache: the plan's %d bytes raised to %d, one max_model_len=%d sequence",
            in_engine,
            one_sequence,
            spec.max_model_len,
        )
    return max(in_engine, one_sequence)


def build_rollout(
    config: Any,
    trainer: Any,
    spec: BackendSpec,
    workdir: Path | None = None,
    max_pixels: int = 112 * 112,
    kv_cache_bytes: int | None = None,
    **_: Any,
) -> VllmRollout:
    """`max_pixels`: the image processor's bound the prompts were rendered with, so vLLM
    expands each image to the same number of visual tokens as the trainer sees.
    `kv_cache_bytes`: the plan's KV pool for the engine (`engine_kv_budget(plan)`)."""
    if spec.vllm.weights == "share":
        check_shareable(trainer, spec.vllm)  # before a start folder is written
    if config.model.path:
        folder = Path(config.model.path)
    else:
        root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="rollplex-vllm-"))
        folder = write_start_folder(config, trainer, root / "vllm-start", max_pixels)
    live = trainer.live_weights()
    kv = kv_budget(config.model, spec.vllm, kv_cache_bytes)
    rollout = VllmRollout(folder, spec.vllm, kv, model=live.model, version=live.version)
    if spec.vllm.weights == "share":
        rollout.share_storage(trainer.model, config.model)
    return rollout


def check_shareable(trainer: Any, spec: VllmSpec) -> None:
    """What `weights=share` needs of the trainer and the engine, checked before it starts."""
    import torch

    from rollplex.backends.base import BackendError
    from rollplex.backends.vllm.engine import on_cpu, require_vllm
    from rollplex.backends.vllm.share import ON_CPU

    require_vllm()
    if on_cpu():
        raise BackendError(ON_CPU)
    model = getattr(trainer, "model", None)
    first = next(model.parameters()) if model is not None else None
    want = getattr(torch, spec.dtype)
    if first is None or first.dtype != want or first.device.type != "cuda":
        raise BackendError(
            f"backend.vllm.weights=share needs the trainer's parameters on CUDA in "
            f"backend.vllm.dtype={spec.dtype}; they are "
            f"{'absent' if first is None else f'{first.dtype} on {first.device}'}"
        )
