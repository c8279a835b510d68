"""The data check's results for image and video files, kept between runs.

A run decodes every image and video file its rows name before any model loads
(data/rows.py). A file whose absolute path, size and modification time match an earlier
decode is not decoded again: its result is read back (Python's bytecode cache keys its files
alike; a file rewritten to its old size with its old time restored counts as checked). One
JSON file holds them; a writer replaces it whole (os.replace), so runs that check at once
(torchrun's ranks, a sweep) never read half a file, and the last writer's entries stand. An
unreadable file is checked again. A write drops the entries of files that are gone, so
the file holds what exists, not every file ever checked (temporary datasets add up).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)
FORMAT = 1
# An image's (width, height); a video file's (frames, width, height).
Result = tuple[int, ...]


@dataclass(slots=True)
class MediaChecks:
    path: Path | None = None  # None: remembered in this process only
    files: dict[str, list[int]] = field(default_factory=dict)  # file -> [size, mtime_ns, *result]
    known: int = 0  # lookups answered from an earlier check
    added: int = 0  # files decoded since the last save

    @classmethod
    def load(cls, path: Path) -> MediaChecks:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as err:
            log.warning("%s is unreadable (%s): every file is checked again", path, err)
            return cls(path)
        files = data.get("files") if isinstance(data, dict) else None
        if not isinstance(files, dict) or data.get("format") != FORMAT:
            log.warning("%s is not a media check file of format %d: ignored", path, FORMAT)
            return cls(path)
        return cls(path, files)

    def recall(self, file: Path, length: int, check: Callable[[], Result]) -> Result:
        """`check()`'s result for `file` (`length` numbers): read back when the file is
        unchanged since an earlier check, else checked now and kept."""
        key, stat = _key(file), _stat(file)
        entry = self.files.get(key)
        if (
            stat is not None
            and isinstance(entry, list)
            and len(entry) == 2 + length
            and entry[:2] == list(stat)
            and all(isinstance(x, int) for x in entry)
        ):
            self.known += 1
            return tuple(entry[2:])
        result = check()  # raises DataError on a bad file: nothing is kept for it
        if stat is not None:
            self.files[key] = [*stat, *result]
            self.added += 1
        return result

    def save(self) -> None:
        """Write the file if anything was decoded; a cache that cannot be written is said
        once and costs the next run a decode, nothing else."""
        if self.path is None or not self.added:
            return
        self.files = {k: v for k, v in self.files.items() if os.path.exists(k)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
            with os.fdopen(fd, "w") as f:
                json.dump({"format": FORMAT, "files": self.files}, f)
            os.replace(tmp, self.path)
        except OSError as err:
            log.warning("media checks not kept for the next run (%s: %s)", self.path, err)
        self.added = 0


def _key(file: Path) -> str:
    return os.path.abspath(file)


def _stat(file: Path) -> tuple[int, int] | None:
    try:
        st = file.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns
