"""`open_model_folder`: a Hub-format Qwen2.5-VL folder, validated before anything loads.

The folder decides the architecture (config.json). A preset named beside it (the
`model=` group) must agree field by field; it still decides what the config does not
say: the name, the dtype used for rollout/reference and whether the vision tower trains.
Tokenizer, image processor and weights load through transformers' own classes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rollplex.models.files import (
    CONFIG_FILE,
    PROCESSOR_CHAT_TEMPLATE_FILE,
    TOKENIZER_FILE,
    ModelFolderError,
    check_tokenizer_files,
    check_weights,
    read_config,
    spec_of,
)
from rollplex.specs.hub_repo import looks_like_repo_id, repo_folder, repo_name
from rollplex.specs.model import ModelSpec

_TOKEN_TEXT = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
}


@dataclass(slots=True, frozen=True)
class ModelFolder:
    """A validated model folder. `spec` is read from config.json (with `path` set)."""

    path: Path
    spec: ModelSpec

    def tokenizer(self) -> Any:
        """The folder's tokenizer (AutoTokenizer), checked to place Qwen2.5-VL's vision
        tokens at the ids config.json gives them."""
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.path)
        if tok.chat_template is None and (self.path / PROCESSOR_CHAT_TEMPLATE_FILE).is_file():
            # Hub Qwen2.5-VL repos keep the template with the processor.
            raw = json.loads((self.path / PROCESSOR_CHAT_TEMPLATE_FILE).read_text())
            tok.chat_template = raw.get("chat_template")
        ids = self.spec.special_tokens.model_dump()
        for field, text in _TOKEN_TEXT.items():
            got = tok.convert_tokens_to_ids(text)
            if got != ids[field]:
                raise ModelFolderError(
                    f"{self.path / TOKENIZER_FILE}: {text} has id {got}, but "
                    f"{CONFIG_FILE} says {field}={ids[field]}"
                )
        return tok

    def image_processor(self) -> Any:
        """The folder's image processor. AutoImageProcessor, not AutoProcessor: the latter
        also wants a video processor (and torchvision) that a folder need not carry."""
        from transformers import AutoImageProcessor

        try:
            return AutoImageProcessor.from_pretrained(self.path)
        except (OSError, ValueError, ImportError) as e:
            # The fast (torchvision) class may be unavailable: the PIL one reads the same file.
            from transformers import Qwen2VLImageProcessorPil

            try:
                return Qwen2VLImageProcessorPil.from_pretrained(self.path)
            except (OSError, ValueError) as e2:
                raise ModelFolderError(f"{self.path}: image processor ({e}; {e2})") from e2

    def load_model(
        self,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        attn_implementation: str = "sdpa",
    ) -> Any:
        """`Qwen2_5_VLForConditionalGeneration.from_pretrained`, in eval mode on `device`.
        dtype defaults to bfloat16 on CUDA and float32 elsewhere."""
        from rollplex.models.io import load_pretrained

        return load_pretrained(self.path, device, dtype, attn_implementation)


def _agree(folder: Path, spec: ModelSpec, preset: ModelSpec) -> None:
    diff = preset.arch_diff(spec)
    if diff:
        why = "; ".join(
            f"model.{k}: preset {a!r}, {CONFIG_FILE} {b!r}" for k, (a, b) in diff.items()
        )
        raise ModelFolderError(
            f"model folder {folder} does not match preset {preset.name!r}: {why}"
        )


def open_model_folder(path: str | Path, preset: ModelSpec | None = None) -> ModelFolder:
    """Validate a Hub-format Qwen2.5-VL folder (or a training checkpoint, meaning its
    `model/`) and read its spec; loads no weights.

    `path` may be a Hub repo id ("org/name", no such folder here): its files are fetched
    into huggingface_hub's cache first (specs/hub_repo.py), and the spec is named for the repo.

    Raises ModelFolderError (a ValueError) naming the folder and the missing file, the
    unreadable file, the tensor, or the field where config.json and `preset` disagree."""
    name = None
    if looks_like_repo_id(path):
        try:
            name, path = repo_name(str(path)), repo_folder(str(path))
        except ValueError as e:
            raise ModelFolderError(str(e)) from e
    folder = Path(path).expanduser().resolve()
    if (folder / "trainer_state.json").is_file() and (folder / "model").is_dir():
        folder = folder / "model"  # a training checkpoint: its model folder
    if not folder.is_dir():
        raise ModelFolderError(f"model folder {folder}: no such folder")
    config = read_config(folder)
    if preset is None:
        spec = spec_of(folder, config, name=name or folder.name)
    else:
        spec = spec_of(
            folder,
            config,
            name=preset.name,
            dtype=preset.dtype,
            trainable_vision=preset.trainable_vision,
        )
        _agree(folder, spec, preset)
    check_tokenizer_files(folder)
    check_weights(folder, config)
    return ModelFolder(folder, spec)
