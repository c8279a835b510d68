"""Build, save and load a transformers Qwen2.5-VL from a ModelSpec.

Folders are Hub-format, written and read by transformers itself, with the Hub's tensor names
that transformers, vLLM and our roles read. A folder is checked before loading (tensor names
and shapes against config.json, config.json against the spec), so a mismatch is named
rather than filled with random values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from rollplex.backends.torch.vision_attention import compile_vision_blocks, use_varlen_vision
from rollplex.models.files import ModelFolderError, read_config
from rollplex.models.io import load_pretrained, save_hub_folder
from rollplex.specs.model import ModelSpec

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# Fields that decide tensor shapes or token layout; anything else (dtype, versions) may differ.
_TEXT_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
)
_VISION_FIELDS = (
    "depth",
    "hidden_size",
    "num_heads",
    "intermediate_size",
    "out_hidden_size",
    "patch_size",
    "temporal_patch_size",
    "spatial_merge_size",
    "window_size",
    "fullatt_block_indexes",
    "in_channels",
)
_TOP_FIELDS = (
    "tie_word_embeddings",
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
)
# One error for every unusable model folder (kept under its old name for callers).
CheckpointError = ModelFolderError


def arch_fields(config: Qwen2_5_VLConfig) -> dict[str, Any]:
    """The architecture of a config as flat `section.field -> JSON value` pairs."""
    text, vision = config.text_config, config.vision_config
    rope = dict(getattr(text, "rope_parameters", None) or {})
    out: dict[str, Any] = {f: getattr(config, f) for f in _TOP_FIELDS}
    out |= {f"text_config.{f}": getattr(text, f) for f in _TEXT_FIELDS}
    out["text_config.rope_theta"] = rope.get("rope_theta", getattr(text, "rope_theta", None))
    out["text_config.mrope_section"] = rope.get("mrope_section")
    out |= {f"vision_config.{f}": getattr(vision, f) for f in _VISION_FIELDS}
    return json.loads(json.dumps(out))  # tuples -> lists, so saved and fresh values compare


def _diff(a: Mapping[str, Any], b: Mapping[str, Any], a_name: str, b_name: str) -> str:
    """'' when equal, else one clause per differing field, e.g.
    "text_config.hidden_size: config.json has 256, spec 'tiny' has 128"."""
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return "; ".join(f"{k}: {a_name} has {a.get(k)!r}, {b_name} has {b.get(k)!r}" for k in keys)


def build_model(
    spec: ModelSpec,
    seed: int,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised model; the same seed gives the same weights. The global RNG is
    left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration._from_config(
            spec.to_hf_config(), attn_implementation=attn_implementation, dtype=dtype
        )
    return _vision_varlen(model, attn_implementation).eval()


def _vision_varlen(model: Any, attn_implementation: str) -> Any:
    """SDPA models run their vision windows in one varlen call (vision_attention.py)."""
    return use_varlen_vision(model) if attn_implementation == "sdpa" else model


def set_trainable(model: Qwen2_5_VLForConditionalGeneration, spec: ModelSpec) -> None:
    """Freeze the vision tower unless the spec trains it; the merger (the projection into
    the LLM) and the LLM always train."""
    for name, p in model.named_parameters():
        in_tower = name.startswith("model.visual.") and not name.startswith("model.visual.merger.")
        p.requires_grad_(spec.trainable_vision or not in_tower)


def save_model(
    model: Qwen2_5_VLForConditionalGeneration,
    spec: ModelSpec,
    folder: str | Path,
    assets_from: str | Path | None = None,
) -> Path:
    """`save_pretrained` into `folder` (atomically: a temporary folder renamed into place),
    plus the tokenizer/processor files of `assets_from` (default: the spec's own folder,
    `spec.path`), so the result is a complete model folder."""
    expected = arch_fields(spec.to_hf_config())
    if mismatch := _diff(arch_fields(model.config), expected, "model", f"spec {spec.name!r}"):
        raise ValueError(f"model does not match spec {spec.name!r}: {mismatch}")
    return save_hub_folder(model, folder, assets_from if assets_from is not None else spec.path)


def load_model(
    folder: str | Path,
    dtype: torch.dtype = torch.float32,
    spec: ModelSpec | None = None,
    attn_implementation: str = "sdpa",
    device: str | torch.device = "cpu",
) -> Qwen2_5_VLForConditionalGeneration:
    """Read a Hub-format model folder with `from_pretrained`. Raises CheckpointError,
    naming the file and the field or tensor, when config.json disagrees with `spec` or
    the weights with config.json. Only reads: the folder is never modified."""
    folder = Path(folder)
    config = read_config(folder)
    if spec is not None:
        expected = arch_fields(spec.to_hf_config())
        if mismatch := _diff(arch_fields(config), expected, CONFIG_FILE, f"spec {spec.name!r}"):
            raise CheckpointError(f"{folder}: not spec {spec.name!r}: {mismatch}")
    return _vision_varlen(
        load_pretrained(folder, device, dtype, attn_implementation), attn_implementation
    )


def model_for(
    spec: ModelSpec,
    seed: int,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    attn_implementation: str = "sdpa",
) -> Qwen2_5_VLForConditionalGeneration:
    """The model a run starts from: the weights of `spec.path` when the spec names a folder
    (checked against the spec), else random weights from `seed`. dtype defaults to
    bfloat16 on CUDA and float32 elsewhere. On CUDA the vision blocks are compiled
    (vision_attention.compile_vision_blocks)."""
    from rollplex.models.io import default_dtype

    dtype = dtype or default_dtype(device)
    if spec.path is not None:
        model = load_model(spec.path, dtype, spec, attn_implementation, device)
    else:
        model = build_model(spec, seed, dtype, attn_implementation).to(device)
    if torch.device(device).type == "cuda":
        # 4x the per-window tower on an H200 (bench/results/gpu_vision/vision_compiled.md)
        compile_vision_blocks(model)
    return model
