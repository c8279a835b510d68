"""What every prompt source yields: `Sample`, the `PromptSource` protocol, `DataError`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from PIL import Image


class DataError(ValueError):
    """Bad input data; the message names the file, row and field (the CLI exits with 2)."""


@dataclass(slots=True, frozen=True)
class Sample:
    uid: str  # stable: "<source>:<split>:<row index>"
    problem: str  # may hold "<image>"/"<video>" placeholders, or none
    answer: str  # ground truth text
    images: tuple[Image.Image, ...] = ()  # RGB
    video: tuple[Image.Image, ...] | None = None  # RGB frames, sampled to the frame count


@dataclass(slots=True, frozen=True)
class RowMedia:
    """A row's visuals as the data pass decoded them: what sizing needs, no pixels."""

    image_sizes: tuple[tuple[int, int], ...] = ()  # (width, height) of each image
    video_frames: int = 0  # frames in the file or list, before sampling; 0: no video
    video_size: tuple[int, int] | None = None  # (width, height) of its frames


@runtime_checkable
class PromptSource(Protocol):
    name: str
    split: str

    def __len__(self) -> int: ...

    def batch(self, step: int, n: int) -> list[Sample]:
        """Rows [step*n, (step+1)*n) of an endless stream of epochs, each epoch a permutation
        seeded by (seed, epoch): a pure function of (seed, step, n), so resumes repeat it."""
        ...

    def epoch(self, step: int, n: int) -> int:
        """The epoch that step's first row belongs to."""
        ...
