"""`model.path` as a Hub repo id ("Qwen/Qwen2.5-VL-3B-Instruct"): its files fetched into
huggingface_hub's cache on first use (a later run, or HF_HUB_OFFLINE=1, reads the cache),
so a first GPU run needs no separate download step. The spec keeps the repo id as its
path; the config validator reads only config.json, the model folder fetches the rest."""

from __future__ import annotations

import functools
from pathlib import Path

# what a Hub-format Qwen2.5-VL folder holds that a run reads (no .bin, no README images)
FILES = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model")


def looks_like_repo_id(path: str | Path) -> bool:
    """'org/name' as huggingface_hub validates ids, with no folder of that name here (a
    bare 'name' is a relative folder)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    text = str(path)
    if text.count("/") != 1 or Path(text).exists():
        return False
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def repo_name(repo_id: str) -> str:
    return repo_id.split("/")[1]


def repo_config(repo_id: str) -> Path:
    """The repo's config.json, from the cache or the Hub."""
    from huggingface_hub import hf_hub_download

    return _fetched(repo_id, lambda: Path(hf_hub_download(repo_id, "config.json")))


@functools.cache
def repo_folder(repo_id: str) -> Path:
    """The repo's files a run reads, as a local snapshot folder (fetched once a process)."""
    from huggingface_hub import snapshot_download

    return _fetched(repo_id, lambda: Path(snapshot_download(repo_id, allow_patterns=list(FILES))))


def _fetched(repo_id: str, fetch) -> Path:
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return fetch()
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        text = str(e).strip()
        first = text.splitlines()[0] if text else type(e).__name__
        raise ValueError(
            f"model.path={repo_id}: no such folder, and the Hub repo could not be fetched "
            f"({first}); give a local Hub-format folder, or run once with network access "
            "(the files stay in huggingface_hub's cache)"
        ) from e
