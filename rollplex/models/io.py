"""Write and read Hub-format folders with transformers' own `save_pretrained` and
`from_pretrained`, so what we write is what any transformers or vLLM user can load."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from rollplex.models.files import ASSET_FILES, check_weights, read_config

DEFAULT_SHARD_SIZE = "5GB"  # the Hub's usual shard size


def default_dtype(device: str | torch.device) -> torch.dtype:
    """The dtype the torch roles load a model in on `device` (jobs/model_dtype.py)."""
    return getattr(torch, default_dtype_name(torch.device(device).type))


def default_dtype_name(device_type: str) -> str:
    """bfloat16 on CUDA (AdamW steps float32 masters: backends/torch/masters.py), else
    float32."""
    return "bfloat16" if device_type == "cuda" else "float32"


def save_hub_folder(
    model: Any,
    folder: str | Path,
    assets_from: str | Path | None = None,
    max_shard_size: int | str = DEFAULT_SHARD_SIZE,
) -> Path:
    """`model.save_pretrained` (config.json, generation_config.json, safetensors with Hub
    tensor names, sharded with an index above `max_shard_size`) plus the tokenizer and
    processor files of `assets_from`, copied byte for byte.

    Written into a hidden sibling folder and renamed into place, so `folder` is never
    half-written; an existing `folder` is replaced whole."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, max_shard_size=max_shard_size)
        if assets_from is not None:
            copy_assets(Path(assets_from), tmp)
        replace_folder(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def copy_assets(source: Path, dest: Path) -> list[str]:
    """Copy the tokenizer/processor/chat-template files `source` has into `dest`."""
    copied = []
    for name in ASSET_FILES:
        if (source / name).is_file() and not (dest / name).exists():
            shutil.copyfile(source / name, dest / name)
            copied.append(name)
    return copied


def replace_folder(tmp: Path, final: Path) -> None:
    """Move a complete `tmp` folder to `final`; an old `final` is swapped out, never left
    missing or half-replaced."""
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def load_pretrained(
    folder: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    attn_implementation: str = "sdpa",
) -> Any:
    """`Qwen2_5_VLForConditionalGeneration.from_pretrained` after checking every tensor's
    name and shape against config.json (from_pretrained would randomly fill a missing one).
    Loads straight onto a CUDA device when `accelerate` is installed (transformers needs it
    for device_map), else on the CPU and then moves."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    folder = Path(folder)
    check_weights(folder, read_config(folder))
    dtype = dtype or default_dtype(device)
    kwargs: dict[str, Any] = {}
    if torch.device(device).type != "cpu" and importlib.util.find_spec("accelerate"):
        kwargs["device_map"] = {"": str(device)}
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, dtype=dtype, attn_implementation=attn_implementation, **kwargs
    )
    model = model.to(device)
    reset_rotary(model)
    return model.eval()


def reset_rotary(model: torch.nn.Module) -> None:
    """Recompute rotary `inv_freq` buffers (not in checkpoints) from each module's config
    where they are missing, on meta, or differ from a fresh computation: a model built on
    meta and materialised holds garbage there."""
    for module in model.modules():
        if not hasattr(module, "inv_freq") or not hasattr(module, "config"):
            continue
        with torch.device("cpu"):
            fresh = type(module)(module.config)
        for name, buf in fresh.named_buffers(recurse=False):
            old = getattr(module, name, None)
            if old is None or old.is_meta or not torch.equal(old.cpu().to(buf.dtype), buf):
                where = old.device if old is not None and not old.is_meta else "cpu"
                module.register_buffer(name, buf.to(where), persistent=False)
