"""Compiled artifacts kept between runs: Inductor's and Triton's caches in
`~/.cache/rollplex/compile/<key>/` ($ROLLPLEX_CACHE_DIR replaces ~/.cache/rollplex).

The key hashes the model's shape, the torch, triton and transformers versions and the device
name, so a change gets another folder, never a stale one (a folder whose key.json disagrees
is emptied). Cache variables the user set are left alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

from rollplex.specs import ModelSpec
from rollplex.specs.calibration import model_shape  # what compiled code depends on

log = logging.getLogger(__name__)
KEY_FILE = "key.json"
PACKAGES = ("torch", "triton", "transformers")
CACHE_VARS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
_SET_BY_US: dict[str, str] = {}  # what an earlier job of this process set: not the user's


def cache_root() -> Path:
    return Path(os.environ.get("ROLLPLEX_CACHE_DIR") or "~/.cache/rollplex").expanduser()


def software_versions() -> dict[str, str | None]:
    """The installed versions compiled code depends on (None: not installed)."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def key_inputs(model: ModelSpec, device_name: str, versions: dict[str, str | None]) -> dict:
    return {"model": model_shape(model), "device": device_name, "versions": versions}


def cache_key(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def prepare_cache(root: Path, inputs: dict[str, Any]) -> tuple[Path, bool]:
    """The folder for `inputs` under root/compile, and whether it holds a matching earlier
    run's artifacts. A folder whose key.json is missing or another key's is emptied."""
    folder = root / "compile" / cache_key(inputs)
    key_file = folder / KEY_FILE
    try:
        reused = json.loads(key_file.read_text()) == inputs
    except (OSError, ValueError):
        reused = False
    if not reused:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        key_file.write_text(json.dumps(inputs, indent=1, sort_keys=True))
    return folder, reused


def _users(var: str) -> bool:
    """Whether `var` holds a cache dir the user chose: not ours, nor the default Inductor
    writes back into the environment once it has compiled anything."""
    value = os.environ.get(var)
    if not value or value == _SET_BY_US.get(var):
        return False
    if var == "TORCHINDUCTOR_CACHE_DIR":
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        return os.path.abspath(value) != os.path.abspath(default_cache_dir())
    return True


def use_compile_cache(model: ModelSpec, device_name: str, root: Path | None = None) -> Path | None:
    """Point Inductor and Triton at this model's, software's and device's cache folder
    (call before anything compiles); None where the user set their own cache dirs."""
    if any(_users(var) for var in CACHE_VARS):
        log.info("compile cache: the user's (TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR)")
        return None
    inputs = key_inputs(model, device_name, software_versions())
    folder, reused = prepare_cache(root or cache_root(), inputs)
    for var, sub in CACHE_VARS.items():
        os.environ[var] = _SET_BY_US[var] = str(folder / sub)
    how = "reused: a run of this shape and software compiled into it" if reused else "new"
    log.info("compile cache: %s (%s)", folder, how)
    return folder
