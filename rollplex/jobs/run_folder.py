"""A run's own folder: never one that an earlier run wrote.

Hydra names a run folder by the second the run started (conf/config.yaml: hydra.run.dir).
Two runs in one second, or a fixed `hydra.run.dir=`, would share it, and a failed run would
rewrite an earlier run's `.hydra/` and `config.json` beside that run's plan and summary.
So the folder is claimed before Hydra starts: created atomically (mkdir fails on an existing
name), with a `_1`, `_2`... suffix while the name is taken, and handed to Hydra by name.

Under torchrun only rank 0 gets a run folder. The other ranks take rank 0's once the process
group is up (runtime.distributed.from_rank0); until then they log into a temporary folder,
removed at exit, so no stray one-rank folders are left beside the run.
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
    if os.environ.get("RANK", "0") != "0":  # a torchrun rank other than 0
        tmp = tempfile.mkdtemp(prefix=f"rollplex-rank{os.environ['RANK']}-")
        atexit.register(shutil.rmtree, tmp, True)
        return [f"hydra.run.dir={_quoted(tmp)}", "hydra.output_subdir=null"]
    key = "sweep" if multirun else "run"
    try:
        wanted = Path(str(cfg.hydra[key].dir))
    except Exception as err:  # an interpolation that cannot resolve before the run
        raise ConfigError(f"hydra.{key}.dir: {err}") from None
    return [f"hydra.{key}.dir={_quoted(str(claim(wanted)))}"]


def _quoted(path: str) -> str:
    """`path` as a Hydra override value, whatever characters it holds."""
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"
