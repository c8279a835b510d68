"""Images and video frames from row values: paths, bytes, dicts as parquet stores them.

Every error is a DataError whose message starts with `where` ("<file> row <i> field
'<column>'"), so the user sees which row of which file to fix. Frames come back RGB;
resizing to pixel bounds is the renderer's job.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageSequence

from rollplex.data.media_checks import MediaChecks
from rollplex.data.sample import DataError

# Animated formats PIL decodes itself; other video files need PyAV (`pip install av`).
PIL_VIDEO_SUFFIXES = (".gif", ".webp", ".apng", ".png")


def as_list(value: Any) -> list[Any]:
    """A column value as a list of items: None -> [], one item -> [item]."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _ref(value: Any, base: Path, where: str) -> Path | bytes | Image.Image:
    """Resolve one image item to a path, raw bytes or an already decoded image."""
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, dict):  # datasets' Image storage: {"bytes": …, "path": …}
        if value.get("bytes"):
            return bytes(value["bytes"])
        value = value.get("path")
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str) and value:
        path = Path(value)
        return path if path.is_absolute() else base / path
    raise DataError(f"{where}: expected an image path, bytes or {{'bytes': …}}, got {value!r:.80}")


def check_image(
    value: Any, base: Path, where: str, checks: MediaChecks | None = None
) -> tuple[int, int]:
    """Decode the image once, as a batch will: a corrupt or missing file stops the run
    before the first step, naming its row. Returns its (width, height) for sizing. A file
    `checks` knows unchanged since an earlier decode is not decoded again."""
    ref = _ref(value, base, where)
    if checks is None or not isinstance(ref, Path):  # bytes have no file to key by
        return _decode(ref, where).size
    width, height = checks.recall(ref, 2, lambda: _decode(ref, where).size)
    return width, height


def load_image(value: Any, base: Path, where: str) -> Image.Image:
    return _decode(_ref(value, base, where), where)


def _decode(ref: Path | bytes | Image.Image, where: str) -> Image.Image:
    if isinstance(ref, Image.Image):
        return ref.convert("RGB")
    try:
        with Image.open(io.BytesIO(ref) if isinstance(ref, bytes) else ref) as im:
            return im.convert("RGB")
    except FileNotFoundError:
        raise DataError(f"{where}: image file {ref} does not exist") from None
    except Exception as err:  # PIL raises several types for corrupt data
        what = "image bytes" if isinstance(ref, bytes) else f"image file {ref}"
        raise DataError(f"{where}: cannot decode {what}: {err}") from None


def uniform_indices(total: int, frames: int) -> list[int]:
    """`frames` indices spread evenly over [0, total) (qwen-vl-utils' linspace + round)."""
    return [int(i) for i in np.linspace(0, total - 1, frames).round()]


def check_video(
    value: Any, base: Path, where: str, checks: MediaChecks | None = None
) -> tuple[int, tuple[int, int]]:
    """Decode every frame once (as `check_image`, with `checks` alike); returns (frame
    count, (width, height))."""
    items = _video_items(value, where)
    if not isinstance(items, list):
        return _check_video_file(base / items, where, checks)
    sizes = {check_image(item, base, f"{where} frame {i}", checks) for i, item in enumerate(items)}
    return len(items), _one_size(sizes, where)


def _check_video_file(
    file: Path, where: str, checks: MediaChecks | None
) -> tuple[int, tuple[int, int]]:
    def check() -> tuple[int, int, int]:
        frames = _decode_file(file, where)
        return len(frames), *_one_size({f.size for f in frames}, where)

    count, width, height = check() if checks is None else checks.recall(file, 3, check)
    return count, (width, height)


def _one_size(sizes: set[tuple[int, int]], where: str) -> tuple[int, int]:
    if len(sizes) > 1:
        raise DataError(f"{where}: video frames differ in size {sorted(sizes)}")
    return next(iter(sizes))


def load_video(value: Any, base: Path, frames: int, where: str) -> tuple[Image.Image, ...]:
    """The video's frames, sampled uniformly to `frames`, RGB."""
    items = _video_items(value, where)
    if isinstance(items, list):
        picked = uniform_indices(len(items), frames)
        return tuple(load_image(items[i], base, f"{where} frame {i}") for i in picked)
    decoded = _decode_file(base / items, where)
    return tuple(decoded[i] for i in uniform_indices(len(decoded), frames))


def _decode_file(path: Path, where: str) -> list[Image.Image]:
    if not path.is_file():
        raise DataError(f"{where}: video file {path} does not exist")
    decoded = _decode_pil(path) if path.suffix.lower() in PIL_VIDEO_SUFFIXES else None
    if decoded is None:
        decoded = _decode_av(path, where)
    if not decoded:
        raise DataError(f"{where}: video file {path} has no frames")
    return decoded


def _video_items(value: Any, where: str) -> list[Any] | str:
    """A frame list, or the path of one video file."""
    items = as_list(value)
    if len(items) == 1 and isinstance(items[0], list | tuple | str):
        items = items[0]  # [video] or [[frames]]: the row's one video
    if isinstance(items, str):
        return items
    if not items:
        raise DataError(f"{where}: empty video")
    if isinstance(items, list | tuple) and all(isinstance(i, str) for i in items):
        # Several strings: frame paths, unless they are video files (more than one video).
        if len(items) > 1 and all(Path(i).suffix.lower() in _VIDEO_FILES for i in items):
            raise DataError(f"{where}: a row holds one video, got {len(items)} video files")
        return list(items)
    if isinstance(items, list | tuple):
        return list(items)
    raise DataError(f"{where}: expected a video file or a list of frames, got {value!r:.80}")


_VIDEO_FILES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".gif")


def _decode_pil(path: Path) -> list[Image.Image] | None:
    try:
        with Image.open(path) as im:
            return [f.convert("RGB") for f in ImageSequence.Iterator(im)]
    except Exception:
        return None  # not a format PIL reads; try PyAV


def _decode_av(path: Path, where: str) -> list[Image.Image]:
    try:
        import av  # optional: `pip install av` (rollplex[video])
    except ImportError:
        raise DataError(
            f"{where}: decoding video file {path} needs PyAV (pip install av); "
            "frame-path lists and GIFs work without it"
        ) from None
    try:
        with av.open(str(path)) as container:
            return [f.to_image().convert("RGB") for f in container.decode(video=0)]
    except Exception as err:
        raise DataError(f"{where}: cannot decode video file {path}: {err}") from None
