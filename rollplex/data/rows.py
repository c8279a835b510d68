"""Row sources: EasyR1/verl-style rows (a `datasets.Dataset`, or `Columns`) as a PromptSource.

A row has a question (`prompt_key`, with optional "<image>"/"<video>" placeholders), an
answer, and optionally images or one video. Every row is checked (and its visuals decoded
once) when the source is built, so a bad row stops the run before any model loads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollplex.data.media import as_list, check_image, check_video, load_image, load_video
from rollplex.data.media_checks import MediaChecks
from rollplex.data.order import IndexedSource
from rollplex.data.sample import DataError, RowMedia, Sample
from rollplex.specs.data import DataSpec

IMAGE, VIDEO = "<image>", "<video>"
log = logging.getLogger(__name__)


class RowSource(IndexedSource):
    def __init__(
        self,
        name: str,
        split: str,
        seed: int,
        dataset: Any,  # a datasets.Dataset (files), or Columns (in-memory lists)
        *,
        spec: DataSpec,
        label: str,  # how errors name the data: a file path, or "easy-vqa train"
        base: Path,  # relative image/frame paths start here
        frames: int,
        max_rows: int | None,
        checks: MediaChecks | None = None,  # earlier runs' decodes of unchanged files
    ) -> None:
        self.label, self.base, self.frames, self.spec = label, base, frames, spec
        self.checks = checks
        columns = set(dataset.column_names)
        for field, key in (("prompt_key", spec.prompt_key), ("answer_key", spec.answer_key)):
            if key not in columns:
                raise DataError(
                    f"{label}: no column '{key}' (data.{field}); columns: {sorted(columns)}"
                )
        self.image_key = spec.image_key if spec.image_key in columns else None
        self.video_key = spec.video_key if spec.video_key in columns else None
        if max_rows is not None and max_rows < len(dataset):
            dataset = dataset.select(range(max_rows))
        if len(dataset) == 0:
            raise DataError(f"{label}: no rows")
        self.dataset = dataset
        super().__init__(name, split, seed, len(dataset))
        self.media: list[RowMedia] = []
        self._check_rows()
        self._say_resampled_videos()

    def _where(self, i: int, key: str) -> str:
        return f"{self.label} row {i} field '{key}'"

    def _check_rows(self) -> None:
        from tqdm.auto import tqdm

        known = self.checks.known if self.checks else 0  # the splits of a run share one
        keys = [self.spec.prompt_key, self.spec.answer_key, self.image_key, self.video_key]
        cols = self.dataset.select_columns([k for k in keys if k])
        seen: dict[str, tuple[int, int]] = {}  # rows repeat images (easy-vqa: ~10x)
        bar = tqdm(
            total=len(cols),
            desc=f"checking {self.label}",
            unit="row",
            leave=False,
            delay=2.0,  # only a slow pass shows a bar
        )
        for start in range(0, len(cols), 1024):
            chunk = cols[start : start + 1024]
            for j in range(len(chunk[self.spec.prompt_key])):
                row = {k: chunk[k][j] for k in chunk}
                self.media.append(self._check_row(start + j, row, seen))
            bar.update(len(chunk[self.spec.prompt_key]))
        bar.close()
        checks = self.checks
        if checks is None:
            return
        if checks.known > known:
            log.info(
                "%s: %d media files unchanged since an earlier check, %d decoded (%s)",
                self.label,
                checks.known - known,
                checks.added,
                checks.path,
            )
        checks.save()

    def _check_row(self, i: int, row: dict[str, Any], seen: dict[str, tuple[int, int]]) -> RowMedia:
        pk, ak = self.spec.prompt_key, self.spec.answer_key
        if not isinstance(row[pk], str):
            raise DataError(f"{self._where(i, pk)}: expected text, got {row[pk]!r:.80}")
        if row[ak] is None or (isinstance(row[ak], str) and not row[ak].strip()):
            raise DataError(f"{self._where(i, ak)}: the answer is missing")
        if isinstance(row[ak], bool) or not isinstance(row[ak], str | int | float):
            raise DataError(
                f"{self._where(i, ak)}: an answer is text or a number, got "
                f"{type(row[ak]).__name__} {row[ak]!r:.80}"
            )
        images = as_list(row[self.image_key]) if self.image_key else []
        sizes = []
        for item in images:
            size = seen.get(item) if isinstance(item, str) else None
            if size is None:
                size = check_image(item, self.base, self._where(i, self.image_key), self.checks)
                if isinstance(item, str):
                    seen[item] = size
            sizes.append(size)
        n_ph = row[pk].count(IMAGE)
        if n_ph and n_ph != len(images):
            raise DataError(
                f"{self._where(i, pk)}: {n_ph} {IMAGE} placeholder(s) but {len(images)} "
                f"image(s) in '{self.image_key or self.spec.image_key}'"
            )
        video = row[self.video_key] if self.video_key else None
        frames, frame_size = 0, None
        if video is not None and as_list(video):
            frames, frame_size = check_video(
                video, self.base, self._where(i, self.video_key), self.checks
            )
        elif VIDEO in row[pk]:
            raise DataError(f"{self._where(i, pk)}: {VIDEO} placeholder but the row has no video")
        if row[pk].count(VIDEO) > 1:
            raise DataError(f"{self._where(i, pk)}: one {VIDEO} placeholder at most")
        if sizes and frames:
            raise DataError(f"{self._where(i, pk)}: has images and a video; a prompt holds one")
        return RowMedia(tuple(sizes), frames, frame_size)

    def _say_resampled_videos(self) -> None:
        """Videos are sampled uniformly to `frames` (as qwen-vl-utils does); say so, never
        silently: how many differ, by how much, and the first row that does."""
        other = [
            (i, m.video_frames)
            for i, m in enumerate(self.media)
            if m.video_frames and m.video_frames != self.frames
        ]
        if not other:
            return
        counts = [n for _, n in other]
        log.warning(
            "%s: %d of %d videos have other than workload.frames=%d frames (%d to %d; first: "
            "row %d with %d): each is sampled uniformly to %d frames%s",
            self.label,
            len(other),
            sum(m.video_frames > 0 for m in self.media),
            self.frames,
            min(counts),
            max(counts),
            other[0][0],
            other[0][1],
            self.frames,
            ", repeating frames where it has fewer" if min(counts) < self.frames else "",
        )

    def prompt_rows(self) -> Iterator[tuple[str, str, RowMedia]]:
        """(uid, problem, media) of every row, in file order, with no pixels decoded."""
        # [:] reads the column as one list: iterating it formats row by row (10x slower)
        for i, problem in enumerate(self.dataset[self.spec.prompt_key][:]):
            yield self.uid(i), problem, self.media[i]

    def row(self, index: int) -> Sample:
        row = self.dataset[index]
        images = ()
        if self.image_key:
            where = self._where(index, self.image_key)
            images = tuple(load_image(v, self.base, where) for v in as_list(row[self.image_key]))
        video = None
        if self.video_key and as_list(row[self.video_key]):
            where = self._where(index, self.video_key)
            video = load_video(row[self.video_key], self.base, self.frames, where)
        answer = row[self.spec.answer_key]
        answer = answer if isinstance(answer, str) else json.dumps(answer)
        return Sample(self.uid(index), row[self.spec.prompt_key], answer, images, video)


def load_file(path: str, fmt: str) -> Any:
    """A jsonl or parquet file as a datasets.Dataset; unreadable -> DataError naming it."""
    file = Path(path)
    if not file.is_file():
        raise DataError(f"data file {file} does not exist")
    if fmt == "jsonl" and not any(line.strip() for line in file.open("rb")):
        raise DataError(f"{file}: no rows (the file is empty)")
    import datasets  # imported late: it takes seconds

    datasets.disable_progress_bars()
    builder = "json" if fmt == "jsonl" else "parquet"
    quiet = logging.getLogger("datasets")  # it logs the error we raise, as a second line
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        return datasets.load_dataset(
            builder, data_files=str(file), split="train", cache_dir=_cache_dir(file)
        )
    except Exception as err:
        bad = _bad_json_line(file) if fmt == "jsonl" else None
        raise DataError(f"{file}: cannot read as {fmt}{bad or ''}: {_first_line(err)}") from None
    finally:
        quiet.setLevel(level)


def _cache_dir(file: Path) -> str:
    """datasets keys its cache by the file's path, size and mtime, so an edit that keeps
    both is served stale rows; a folder per content hash cannot be."""
    import hashlib

    import datasets

    digest = hashlib.sha256()
    with file.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return str(Path(datasets.config.HF_DATASETS_CACHE) / f"rollplex-{digest.hexdigest()[:24]}")


def _bad_json_line(file: Path) -> str | None:
    """Where a jsonl file stops being JSON, for the error message."""
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        return " (not UTF-8 text)"
    for n, line in enumerate(lines, 1):
        try:
            if line.strip():
                json.loads(line)
        except json.JSONDecodeError as err:
            return f" (line {n}: {err.msg})"
    return None


def _first_line(err: BaseException) -> str:
    """The root cause's first line: datasets wraps parser errors in a generic one."""
    while err.__cause__ is not None or err.__context__ is not None:
        err = err.__cause__ or err.__context__
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0][:300]
