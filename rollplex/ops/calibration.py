"""Reads a calibration file: its schema (specs/calibration.py), then its op kinds against
the graph's registry, so a misspelt kind ends the run with one line naming file and field."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from rollplex.graph.schema import all_kinds
from rollplex.specs.calibration import CalibrationError, CalibrationFile


def load_calibration(path: str | Path) -> CalibrationFile:
    """Read and validate; raise CalibrationError (a ValueError) naming file and field."""
    path = Path(path)
    where = f"calibration file '{path}'"
    if path.is_dir():
        raise CalibrationError(f"{where}: a folder, not a calibration JSON file")
    if not path.is_file():
        raise CalibrationError(f"{where}: no such file")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CalibrationError(f"{where}: not valid JSON ({err})") from None
    try:
        file = CalibrationFile.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"])
        field = field.lstrip(".") or "top level"
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        # a field's value says what was wrong; the whole file (a top-level check) does not
        got = "" if not e["loc"] else f" (got {e.get('input')!r})"
        raise CalibrationError(f"{where}: {field}: {e['msg']}{got}{more}") from None
    _check_kinds(file, where)
    return file


def _check_kinds(file: CalibrationFile, where: str) -> None:
    """Every entry's kind is a registered op kind: a misspelt one would rescale nothing."""
    known = all_kinds()
    for i, e in enumerate(file.entries):
        if e.kind not in known:
            raise CalibrationError(
                f"{where}: entries[{i}].kind: unknown op kind '{e.kind}' (known: "
                f"{', '.join(sorted(known))})"
            )


__all__ = ["load_calibration"]
