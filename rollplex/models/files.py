"""What a Hub-format Qwen2.5-VL folder must hold, checked without loading a model.

Checks are eager and cheap: file presence, config.json parsed into a ModelSpec, and each
safetensors header (names, shapes) compared with the tensors the config implies, built on
the meta device. A folder that passes can be handed to `from_pretrained`, which would
otherwise fill a missing tensor with random values and only warn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from safetensors import SafetensorError, safe_open

from rollplex.specs.model import ModelSpec

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
PROCESSOR_CHAT_TEMPLATE_FILE = "chat_template.json"  # what Hub Qwen2.5-VL repos ship
PREPROCESSOR_FILE = "preprocessor_config.json"
# Files a checkpoint copies from its source folder so it is a complete folder itself.
ASSET_FILES = (
    TOKENIZER_FILE,
    TOKENIZER_CONFIG_FILE,
    CHAT_TEMPLATE_FILE,
    PROCESSOR_CHAT_TEMPLATE_FILE,
    PREPROCESSOR_FILE,
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "video_preprocessor_config.json",
    "generation_config.json",
)
# (module prefix in transformers 5, prefix in Hub checkpoints)
RENAMES = (("model.visual.", "visual."), ("model.language_model.", "model."))


class ModelFolderError(ValueError):
    """A model folder that cannot be used; the message names the folder, file and field."""


def to_hub_name(name: str) -> str:
    for ours, hub in RENAMES:
        if name.startswith(ours):
            return hub + name[len(ours) :]
    return name


def read_json(folder: Path, name: str) -> Any:
    path = folder / name
    if not path.is_file():
        raise ModelFolderError(f"model folder {folder}: missing {name}")
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFolderError(f"{path}: not readable JSON ({e})") from e


def read_config(folder: Path) -> Any:
    """config.json as a transformers `Qwen2_5_VLConfig`."""
    from transformers import Qwen2_5_VLConfig

    raw = read_json(folder, CONFIG_FILE)
    path = folder / CONFIG_FILE
    if not isinstance(raw, dict) or raw.get("model_type") != "qwen2_5_vl":
        found = raw.get("model_type") if isinstance(raw, dict) else type(raw).__name__
        raise ModelFolderError(f"{path}: model_type is {found!r}, not 'qwen2_5_vl'")
    try:
        return Qwen2_5_VLConfig.from_dict(raw)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise ModelFolderError(f"{path}: not a valid Qwen2.5-VL config ({e})") from e


def spec_of(folder: Path, config: Any, name: str, **overrides: Any) -> ModelSpec:
    try:
        return ModelSpec.from_hf_config(config, name=name, path=str(folder), **overrides)
    except ValidationError as e:
        why = "; ".join(
            f"{'.'.join(map(str, x['loc'])) or 'model'}: {x['msg']}" for x in e.errors()
        )
        raise ModelFolderError(f"{folder / CONFIG_FILE}: {why}") from e


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files: the index's shards, or the single file."""
    if (folder / INDEX_FILE).is_file():
        index = read_json(folder, INDEX_FILE)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelFolderError(f"{folder / INDEX_FILE}: no 'weight_map'")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ModelFolderError(
                f"model folder {folder}: missing {missing[0]} (a shard listed in {INDEX_FILE})"
            )
        return [folder / s for s in shards]
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    raise ModelFolderError(f"model folder {folder}: missing {WEIGHTS_FILE} (or {INDEX_FILE})")


def read_headers(files: list[Path]) -> dict[str, tuple[tuple[int, ...], Path]]:
    """Tensor name -> (shape, file), from the safetensors headers only."""
    out: dict[str, tuple[tuple[int, ...], Path]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for k in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    out[k] = (tuple(f.get_slice(k).get_shape()), path)
        except (SafetensorError, OSError) as e:
            raise ModelFolderError(f"{path}: not a readable safetensors file ({e})") from e
    return out


def expected_tensors(config: Any) -> dict[str, tuple[int, ...]]:
    """Hub tensor name -> shape that `config` implies (built on the meta device)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(config)
    tied = bool(config.tie_word_embeddings)
    return {
        to_hub_name(k): tuple(v.shape)
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }


def check_weights(folder: Path, config: Any) -> None:
    """Every tensor the config needs is present with its shape, and nothing else is."""
    found = read_headers(weight_files(folder))
    want = expected_tensors(config)
    if bool(config.tie_word_embeddings):
        found.pop("lm_head.weight", None)  # a tied head may be saved too
    missing = sorted(set(want) - set(found))
    unexpected = sorted(set(found) - set(want))
    if missing or unexpected:
        where = found[unexpected[0]][1] if unexpected else folder
        raise ModelFolderError(
            f"{where}: tensors do not match {CONFIG_FILE}: missing {missing[:3]}"
            f"{'...' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}"
            f"{'...' if len(unexpected) > 3 else ''}"
        )
    for k, shape in want.items():
        if found[k][0] != shape:
            raise ModelFolderError(
                f"{found[k][1]}: {k} has shape {found[k][0]} but {CONFIG_FILE} implies {shape}"
            )


def check_tokenizer_files(folder: Path) -> None:
    """tokenizer.json, tokenizer_config.json and a chat template (in tokenizer_config.json,
    chat_template.jinja or chat_template.json)."""
    for name in (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, PREPROCESSOR_FILE):
        if not (folder / name).is_file():
            raise ModelFolderError(f"model folder {folder}: missing {name}")
    tok_config = read_json(folder, TOKENIZER_CONFIG_FILE)
    has_template = (
        (isinstance(tok_config, dict) and tok_config.get("chat_template"))
        or (folder / CHAT_TEMPLATE_FILE).is_file()
        or (folder / PROCESSOR_CHAT_TEMPLATE_FILE).is_file()
    )
    if not has_template:
        raise ModelFolderError(
            f"model folder {folder}: missing {CHAT_TEMPLATE_FILE} (no chat template in "
            f"{TOKENIZER_CONFIG_FILE}, {CHAT_TEMPLATE_FILE} or {PROCESSOR_CHAT_TEMPLATE_FILE})"
        )
