"""The vLLM rollout built for a run: an engine on the trainer's initial weights.

With `model.path` set the engine starts on that folder (the trainer loaded the same
weights from it). Otherwise the trainer's weights, the tokenizer and the image processor
the run's prompts were encoded with are written once as a Hub-format folder, and the
engine starts on it; every later update goes in place (`weight_sync`), never through disk.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rollplex.backends.vllm.rollout import VllmRollout
from rollplex.specs.backend import BackendSpec

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


def build_rollout(
    config: Any,
    trainer: Any,
    spec: BackendSpec,
    workdir: Path | None = None,
    max_pixels: int = 112 * 112,
    **_: Any,
) -> VllmRollout:
    """`max_pixels`: the image processor's bound the prompts were rendered with, so vLLM
    expands each image to the same number of visual tokens as the trainer sees."""
    if config.model.path:
        folder = Path(config.model.path)
    else:
        root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="rollplex-vllm-"))
        folder = write_start_folder(config, trainer, root / "vllm-start", max_pixels)
    live = trainer.live_weights()
    return VllmRollout(folder, spec.vllm, model=live.model, version=live.version)
