"""A run's own folder: never one that an earlier run wrote.

The folder is claimed before Hydra starts: created atomically with a `_1`, `_2`... suffix
while the name is taken (two runs in one second share Hydra's name), then handed to Hydra.
Under torchrun only rank 0 claims one (a sweep's too); the others log into a temporary
folder until they take rank 0's (backends.distributed.from_rank0).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from rollplex.jobs.overrides import ConfigError

MAX_SUFFIX = 1000


def claim(path: Path) -> Path:
    """Create `path`, or the first free `path_N`, and return it (the caller's from now on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for i in range(MAX_SUFFIX):
        candidate = path if i == 0 else path.with_name(f"{path.name}_{i}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise ConfigError(f"hydra.run.dir: {path} and {MAX_SUFFIX - 1} suffixed names are all taken")


def folder_overrides(cfg: DictConfig, multirun: bool) -> list[str]:
    """Hydra overrides that point the run (or the sweep) at a folder claimed for it alone."""
    key = "sweep" if multirun else "run"
    if not is_rank0():  # a torchrun rank other than 0: each job takes rank 0's folder
        tmp = tempfile.mkdtemp(prefix=f"rollplex-rank{os.environ['RANK']}-")
        atexit.register(shutil.rmtree, tmp, True)
        return [f"hydra.{key}.dir={_quoted(tmp)}", "hydra.output_subdir=null"]
    try:
        wanted = Path(str(cfg.hydra[key].dir))
    except Exception as err:  # an interpolation that cannot resolve before the run
        raise ConfigError(f"hydra.{key}.dir: {err}") from None
    return [f"hydra.{key}.dir={_quoted(str(claim(wanted)))}"]


def is_rank0() -> bool:
    """This process is rank 0 of a torchrun launch, or no launch's rank at all."""
    return os.environ.get("RANK", "0") == "0"


def _quoted(path: str) -> str:
    """`path` as a Hydra override value, whatever characters it holds."""
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"
