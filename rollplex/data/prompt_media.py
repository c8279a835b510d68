"""A batch's raw media per prompt (images, sampled video frames and their rate), as the
rollout roles take it: the torch backend builds it, the vLLM rollout turns it into requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image


@dataclass(slots=True, frozen=True)
class Media:
    """Per prompt: its images (RGB) and its video frames (RGB, or None). Frames are already
    sampled (the data layer picks them), at `fps` frames per second of video: M-RoPE's
    temporal positions follow it, so it must be the rate the prompt renderer used."""

    images: tuple[tuple[Image.Image, ...], ...]
    videos: tuple[tuple[Image.Image, ...] | None, ...] = ()
    fps: float = 2.0

    @staticmethod
    def of(samples: Sequence[Any], fps: float = 2.0) -> Media:
        """The media of data samples (`rollplex.data.Sample`: `.images`, `.video`)."""
        return Media(
            tuple(tuple(s.images) for s in samples),
            tuple(tuple(s.video) if s.video else None for s in samples),
            fps,
        )

    @property
    def rows(self) -> int:
        return len(self.images)

    def video(self, row: int) -> tuple[Image.Image, ...] | None:
        return self.videos[row] if self.videos else None
