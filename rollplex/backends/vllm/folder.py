"""Check a Hub-format model folder has what vLLM reads, before any engine starts.

An engine start takes seconds to minutes and fails deep inside vLLM on a missing file, with
a message about some other thing (a processor class, a tokenizer mode). So the folder is
validated first by `rollplex.models.open_model_folder` (config, weights and their shapes,
tokenizer, image processor, chat template), whose error names the folder and the file.
"""

from __future__ import annotations

import json
from pathlib import Path

from rollplex.models.files import ModelFolderError
from rollplex.models.folder import open_model_folder

__all__ = ["ModelFolderError", "check_model_folder", "placeholder_ids"]


def check_model_folder(path: str | Path) -> Path:
    """The folder vLLM should load (a training checkpoint's `model/`), resolved; raises
    ModelFolderError naming the folder and the missing or wrong file. Loads no weights."""
    return open_model_folder(path).path


def placeholder_ids(folder: Path) -> frozenset[int]:
    """The image and video pad token ids of a checked folder's config."""
    config = json.loads((folder / "config.json").read_text())
    return frozenset(
        int(config[k]) for k in ("image_token_id", "video_token_id") if config.get(k) is not None
    )
