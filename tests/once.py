"""Expensive session setup made once per pytest run, not once per xdist worker.

`--dist loadfile` puts test files on several workers, and each worker has a session of its
own: a session fixture used by files on two workers would run twice (a pair of training
runs costs a minute of CPU). `once` makes the folder under the run's shared base temp
directory, under a file lock: the first worker to ask makes it, the others wait and reuse
it (pytest-xdist's documented recipe; filelock comes with torch).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

DONE = ".made"  # written last: a folder without it was left by a failed attempt


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base temp directory all workers of this run share (a worker's own is below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """`make(folder)` run once for the whole run; every caller gets the same folder.

    A failed `make` leaves no marker, so the next caller tries again (and fails with its
    own output) rather than reading half a folder."""
    folder = shared_root(tmp_path_factory) / f"once-{name}"
    with FileLock(folder.with_suffix(".lock")):
        if not (folder / DONE).exists():
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir()
            make(folder)
            (folder / DONE).touch()
    return folder
