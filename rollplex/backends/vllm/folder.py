"""Check a Hub-format model folder has what vLLM reads, before any engine starts.

An engine start takes seconds to minutes and fails deep inside vLLM on a missing file, with
a message about some other thing (a processor class, a tokenizer mode). So the files are
checked here first, and the error names the folder and the file.
"""

from __future__ import annotations

import json
from pathlib import Path

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
PROCESSOR = "preprocessor_config.json"
WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
TEMPLATES = ("chat_template.jinja", "chat_template.json")


class ModelFolderError(ValueError):
    """A model folder vLLM cannot serve; names the folder and the missing file or field."""


def _has_template(folder: Path) -> bool:
    if any((folder / t).is_file() for t in TEMPLATES):
        return True
    cfg = folder / "tokenizer_config.json"
    try:
        return cfg.is_file() and bool(json.loads(cfg.read_text()).get("chat_template"))
    except (OSError, json.JSONDecodeError):
        return False


def check_model_folder(path: str | Path) -> Path:
    """The folder as a resolved Path; raises ModelFolderError naming the first missing file
    (config, weights, tokenizer, image processor, chat template) or a wrong model type."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise ModelFolderError(f"model folder {folder} does not exist")

    def need(name: str, what: str) -> None:
        if not (folder / name).is_file():
            raise ModelFolderError(f"model folder {folder} lacks {name} ({what})")

    need(CONFIG, "the model config")
    try:
        model_type = json.loads((folder / CONFIG).read_text()).get("model_type")
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise ModelFolderError(f"{folder / CONFIG}: not a readable JSON object ({e})") from e
    if model_type != "qwen2_5_vl":
        raise ModelFolderError(f"{folder / CONFIG}: model_type is {model_type!r}, not 'qwen2_5_vl'")
    if not any((folder / w).is_file() for w in WEIGHTS):
        raise ModelFolderError(f"model folder {folder} lacks {WEIGHTS[0]} (the weights)")
    need(TOKENIZER, "the tokenizer; save_pretrained of a fast tokenizer writes it")
    need(PROCESSOR, "the image processor; save_pretrained of Qwen2VLImageProcessor writes it")
    if not _has_template(folder):
        raise ModelFolderError(
            f"model folder {folder} lacks {TEMPLATES[0]} (the chat template; or a "
            "'chat_template' entry in tokenizer_config.json)"
        )
    return folder


def placeholder_ids(folder: Path) -> frozenset[int]:
    """The image and video pad token ids of a checked folder's config."""
    config = json.loads((folder / CONFIG).read_text())
    return frozenset(
        int(config[k]) for k in ("image_token_id", "video_token_id") if config.get(k) is not None
    )
