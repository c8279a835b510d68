"""The synthetic video task: shapes moving across the frames, a pure function of (seed, index).

Each shape moves in a straight line, at least a pixel per frame. Questions (one-word
answers): direction ("which way does the shape move ?" -> left|right|up|down, one shape) and
count ("how many shapes are moving ?" -> one..four, each in its own horizontal band, so
connected components give the count back).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw

from rollplex.data.shapes import BACKGROUND, COUNT_WORDS, MARGIN, PALETTE, SHAPES

QUESTIONS: dict[str, str] = {
    "direction": "which way does the shape move ?",
    "count": "how many shapes are moving ?",
}
KINDS: tuple[str, ...] = tuple(QUESTIONS)
DIRECTIONS: dict[str, tuple[int, int]] = {
    "left": (-1, 0),
    "right": (1, 0),
    "up": (0, -1),
    "down": (0, 1),
}
ANSWER_WORDS: tuple[str, ...] = COUNT_WORDS + tuple(DIRECTIONS)
VOCAB_WORDS: tuple[str, ...] = tuple(
    dict.fromkeys([*(w for q in QUESTIONS.values() for w in q.split()), *ANSWER_WORDS])
)
BANDS = 4  # horizontal bands of the count question, one shape each


@dataclass(slots=True, frozen=True)
class Track:
    kind: str  # "square" | "disc"
    size: int  # side in pixels
    start: tuple[int, int]  # top-left corner in the first frame
    direction: str  # key of DIRECTIONS
    speed: int  # pixels per frame, >= 1

    def box(self, t: int) -> tuple[int, int, int, int]:
        dx, dy = DIRECTIONS[self.direction]
        x0, y0 = self.start[0] + dx * self.speed * t, self.start[1] + dy * self.speed * t
        return (x0, y0, x0 + self.size - 1, y0 + self.size - 1)


@dataclass(slots=True, frozen=True)
class MotionSample:
    frames: tuple[Image.Image, ...]
    question: str
    answer: str
    kind: str  # "direction" | "count"
    colour: str
    tracks: tuple[Track, ...]


class MotionTask:
    """Moving-shape questions over `frames` frames, generated on the fly from a seed."""

    def __init__(
        self, seed: int, image_size: int = 84, frames: int = 8, kinds: Sequence[str] = KINDS
    ) -> None:
        if unknown := set(kinds) - set(KINDS):
            raise ValueError(f"unknown video question kinds {sorted(unknown)}; known: {KINDS}")
        if frames < 2:
            raise ValueError(f"the video task needs at least 2 frames, got {frames}")
        # Smallest travel room: a band-high shape crossing the frame, one pixel per frame.
        band = image_size // BANDS
        if band - 2 * MARGIN < 4 or image_size - 2 * MARGIN - band < frames - 1:
            raise ValueError(f"image_size {image_size} too small for {frames} moving frames")
        self.seed, self.image_size, self.frames = seed, image_size, frames
        self.kinds = tuple(kinds)

    def sample(self, index: int) -> MotionSample:
        rng = random.Random(f"rollplex-motion-task:{self.seed}:{index}")
        kind = rng.choice(self.kinds)
        colour = rng.choice(tuple(PALETTE))
        if kind == "direction":
            tracks = (self._crossing(rng, rng.choice(tuple(DIRECTIONS))),)
            answer = tracks[0].direction
        else:
            count = rng.randint(1, BANDS)
            bands = sorted(rng.sample(range(BANDS), count))
            tracks = tuple(self._in_band(rng, b) for b in bands)
            answer = COUNT_WORDS[count - 1]
        frames = tuple(self._draw(tracks, colour, t) for t in range(self.frames))
        return MotionSample(frames, QUESTIONS[kind], answer, kind, colour, tracks)

    def _travel(self, rng: random.Random, room: int) -> tuple[int, int]:
        """(speed, free start offset) for a run of `frames` inside `room` pixels of travel."""
        speed = rng.randint(1, max(1, room // (self.frames - 1)))
        return speed, rng.randint(0, room - speed * (self.frames - 1))

    def _crossing(self, rng: random.Random, direction: str) -> Track:
        s = self.image_size
        size = rng.randint(max(4, s // 8), s // BANDS)
        room = s - 2 * MARGIN - size
        speed, offset = self._travel(rng, room)
        along = MARGIN + offset  # start on the moving axis, then mirrored for left/up
        dx, dy = DIRECTIONS[direction]
        if dx < 0 or dy < 0:
            along = s - MARGIN - size - offset
        across = rng.randint(MARGIN, s - MARGIN - size)
        start = (along, across) if dx else (across, along)
        return Track(rng.choice(SHAPES), size, start, direction, speed)

    def _in_band(self, rng: random.Random, band: int) -> Track:
        s, h = self.image_size, self.image_size // BANDS
        size = rng.randint(4, h - 2 * MARGIN)
        direction = rng.choice(("left", "right"))
        speed, offset = self._travel(rng, s - 2 * MARGIN - size)
        x = MARGIN + offset if direction == "right" else s - MARGIN - size - offset
        y = band * h + rng.randint(MARGIN, h - MARGIN - size)
        return Track(rng.choice(SHAPES), size, (x, y), direction, speed)

    def _draw(self, tracks: Sequence[Track], colour: str, t: int) -> Image.Image:
        image = Image.new("RGB", (self.image_size, self.image_size), BACKGROUND)
        draw = ImageDraw.Draw(image)
        for tr in tracks:
            if tr.kind == "square":
                draw.rectangle(tr.box(t), fill=PALETTE[colour])
            else:
                draw.ellipse(tr.box(t), fill=PALETTE[colour])
        return image
