"""Build, save and load a transformers Qwen2.5-VL from a ModelSpec.

Checkpoints use the Hub's tensor names (`visual.*`, `model.layers.*`, `model.embed_tokens.*`,
`lm_head.*`), which is what transformers' own `save_pretrained` writes and what both its
`from_pretrained` and vLLM read. transformers 5 keeps the modules at `model.visual.*` and
`model.language_model.*`, so names are mapped on the way in and out.

`save_model` also stores the architecture fields in the safetensors metadata, so a
`config.json` that belongs to another model is caught on load, naming the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from rollplex.specs.model import ModelSpec

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_META_KEY = "rollplex.arch"
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
# (module name prefix in transformers 5, prefix in Hub checkpoints)
_RENAMES = (("model.visual.", "visual."), ("model.language_model.", "model."))


class CheckpointError(ValueError):
    """A model folder that cannot be loaded as the model it claims to be."""


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
    return model.eval()


def set_trainable(model: Qwen2_5_VLForConditionalGeneration, spec: ModelSpec) -> None:
    """Freeze the vision tower unless the spec trains it; the merger (the projection into
    the LLM) and the LLM always train."""
    for name, p in model.named_parameters():
        in_tower = name.startswith("model.visual.") and not name.startswith("model.visual.merger.")
        p.requires_grad_(spec.trainable_vision or not in_tower)


def _to_hub_name(name: str) -> str:
    for ours, hub in _RENAMES:
        if name.startswith(ours):
            return hub + name[len(ours) :]
    return name


def _from_hub_name(name: str) -> str:
    if name.startswith(tuple(ours for ours, _ in _RENAMES)):  # already in transformers-5 form
        return name
    for ours, hub in _RENAMES:
        if name.startswith(hub):
            return ours + name[len(hub) :]
    return name


def save_model(
    model: Qwen2_5_VLForConditionalGeneration, spec: ModelSpec, folder: str | Path
) -> Path:
    """Write `config.json` and `model.safetensors` (Hub names). Each file is written to a
    temporary name first and renamed, so a crash never leaves a half-written file."""
    expected = arch_fields(spec.to_hf_config())
    if mismatch := _diff(arch_fields(model.config), expected, "model", f"spec {spec.name!r}"):
        raise ValueError(f"model does not match spec {spec.name!r}: {mismatch}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tied = bool(model.config.tie_word_embeddings)
    tensors = {
        _to_hub_name(k): v.detach().to("cpu").contiguous()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")  # safetensors refuses shared storage
    }
    config = model.config.to_dict()
    config["architectures"] = [type(model).__name__]
    metadata = {"format": "pt", _META_KEY: json.dumps(expected)}
    tmp_weights, tmp_config = folder / f".{WEIGHTS_FILE}.tmp", folder / f".{CONFIG_FILE}.tmp"
    try:
        save_file(tensors, str(tmp_weights), metadata=metadata)
        tmp_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        os.replace(tmp_weights, folder / WEIGHTS_FILE)
        os.replace(tmp_config, folder / CONFIG_FILE)
    finally:
        tmp_weights.unlink(missing_ok=True)
        tmp_config.unlink(missing_ok=True)
    return folder


def _read_config(folder: Path) -> tuple[Qwen2_5_VLConfig, dict[str, Any]]:
    """The folder's config and its architecture fields."""
    path = folder / CONFIG_FILE
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read config ({e})") from e
    if not isinstance(raw, dict) or raw.get("model_type") != "qwen2_5_vl":
        found = raw.get("model_type") if isinstance(raw, dict) else raw
        raise CheckpointError(f"{path}: model_type is {found!r}, not 'qwen2_5_vl'")
    try:
        config = Qwen2_5_VLConfig.from_dict(raw)
        return config, arch_fields(config)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise CheckpointError(f"{path}: not a valid Qwen2.5-VL config ({e})") from e


def _restore_buffers(model: torch.nn.Module) -> None:
    """Non-persistent buffers (the rotary `inv_freq`) are not in checkpoints: after a meta
    init they hold no data, so rebuild their modules from config on the CPU."""
    for module in model.modules():
        meta = [n for n, b in module.named_buffers(recurse=False) if b.is_meta]
        if not meta:
            continue
        with torch.device("cpu"):
            fresh = type(module)(module.config)
        for n in meta:
            module.register_buffer(n, getattr(fresh, n), persistent=False)


def load_model(
    folder: str | Path,
    dtype: torch.dtype = torch.float32,
    spec: ModelSpec | None = None,
    attn_implementation: str = "sdpa",
) -> Qwen2_5_VLForConditionalGeneration:
    """Read a model folder (ours or a Hub-style one). Raises CheckpointError, naming the file
    and the field or tensor, when the files disagree with each other or with `spec`.
    Only reads: the folder is never modified."""
    folder = Path(folder)
    config, found = _read_config(folder)
    if spec is not None:
        expected = arch_fields(spec.to_hf_config())
        if mismatch := _diff(found, expected, CONFIG_FILE, f"spec {spec.name!r}"):
            raise CheckpointError(f"{folder}: not spec {spec.name!r}: {mismatch}")
    path = folder / WEIGHTS_FILE
    try:
        with safe_open(str(path), framework="pt") as f:
            saved = (f.metadata() or {}).get(_META_KEY)
            if saved is not None and (
                mismatch := _diff(found, json.loads(saved), CONFIG_FILE, WEIGHTS_FILE)
            ):
                raise CheckpointError(
                    f"{folder}: {CONFIG_FILE} belongs to another model: {mismatch}"
                )
            tensors = {_from_hub_name(k): f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(
            config, attn_implementation=attn_implementation, dtype=dtype
        )
    tied = bool(config.tie_word_embeddings)
    if tied:
        tensors.pop("lm_head.weight", None)
    want = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    missing, unexpected = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: tensors do not match {CONFIG_FILE}: missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
            f"{'...' if len(unexpected) > 5 else ''}"
        )
    for k, v in want.items():
        if tensors[k].shape != v.shape:
            raise CheckpointError(
                f"{path}: {_to_hub_name(k)} has shape {tuple(tensors[k].shape)} but "
                f"{CONFIG_FILE} implies {tuple(v.shape)}"
            )
    model.load_state_dict({k: t.to(dtype) for k, t in tensors.items()}, strict=False, assign=True)
    if tied:
        model.lm_head.weight = model.get_input_embeddings().weight
    _restore_buffers(model)
    return model.eval()
