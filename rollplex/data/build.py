"""build_source: a DataSpec and a split -> a validated PromptSource."""

from __future__ import annotations

from pathlib import Path

from rollplex.data.media_checks import MediaChecks
from rollplex.data.order import IndexedSource
from rollplex.data.sample import DataError
from rollplex.specs.data import FILE_SOURCES, SOURCES, DataSpec

SPLITS = ("train", "test")


def build_source(
    spec: DataSpec,
    split: str,
    seed: int,
    *,
    frames: int = 1,
    checks: MediaChecks | None = None,
) -> IndexedSource:
    """The split's prompts; checks files, columns and rows now, raising DataError naming the
    file, row and field, so bad data stops a run before any model loads (image and video
    files `checks` knows unchanged since an earlier check are not decoded again)."""
    if split not in SPLITS:
        raise DataError(f"unknown split '{split}'; known: {SPLITS}")
    if frames < 1:
        raise DataError(f"frames must be >= 1, got {frames}")
    if spec.source == "synthetic":
        from rollplex.data.synthetic import SyntheticSource

        return SyntheticSource(spec, split, seed)
    if spec.source == "synthetic_video":
        from rollplex.data.synthetic import SyntheticVideoSource

        return SyntheticVideoSource(spec, split, seed, frames)
    if spec.source == "easyvqa":
        from rollplex.data.easyvqa import easyvqa_source

        return easyvqa_source(spec, split, seed, frames, checks)
    if spec.source in FILE_SOURCES:
        return _file_source(spec, split, seed, frames, checks)
    raise DataError(f"unknown data source '{spec.source}'; known: {SOURCES}")


def _file_source(
    spec: DataSpec, split: str, seed: int, frames: int, checks: MediaChecks | None
) -> IndexedSource:
    from rollplex.data.rows import RowSource, load_file

    path = spec.path if split == "train" else spec.eval_path
    if not path:
        field = "path" if split == "train" else "eval_path"
        raise DataError(f"data source '{spec.source}' split '{split}' needs data.{field}")
    file = Path(path).expanduser()
    return RowSource(
        spec.source,
        split,
        seed,
        load_file(str(file), spec.source),
        spec=spec,
        label=str(file),
        base=file.parent,
        frames=frames,
        max_rows=spec.max_rows if split == "train" else spec.eval_max_rows,
        checks=checks,
    )
