"""The demo folder built from its recipe once per pytest run, for every file that needs a
fresh build (tests/models, tests/jobs/test_train_real.py): a build costs ~15 s of a shared
2-core machine, and xdist may put those files on different workers (tests/once.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.once import once


def demo_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    """(home the folder was built in, the folder, seconds the build took)."""

    def make(made: Path) -> None:
        from rollplex.models import ensure_demo_folder

        start = time.perf_counter()
        folder = ensure_demo_folder(made / "home")
        (made / "build.txt").write_text(f"{folder.name}\n{time.perf_counter() - start}\n")

    made = once(tmp_path_factory, "demo_home", make)
    name, seconds = (made / "build.txt").read_text().split()
    return made / "home", made / "home" / name, float(seconds)
