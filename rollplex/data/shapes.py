"""The synthetic image task: coloured shapes on a grey background, a pure function of (seed, index).

One to four squares or discs of one colour in a 3x3 grid, never touching, so components and
pixel colours give the answers back. Questions (one-word answers): count ("how many shapes
are in the image ?" -> one..four) and colour ("what colour are the shapes ?" -> red|green|
blue|yellow).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw

BACKGROUND: tuple[int, int, int] = (128, 128, 128)
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 210, 40),
}
COUNT_WORDS: tuple[str, ...] = ("one", "two", "three", "four")
QUESTIONS: dict[str, str] = {
    "count": "how many shapes are in the image ?",
    "colour": "what colour are the shapes ?",
}
KINDS: tuple[str, ...] = tuple(QUESTIONS)
ANSWER_WORDS: tuple[str, ...] = COUNT_WORDS + tuple(PALETTE)
# Every word the task can emit; the tokenizer builds its vocabulary from these.
VOCAB_WORDS: tuple[str, ...] = tuple(
    dict.fromkeys([*(w for q in QUESTIONS.values() for w in q.split()), *ANSWER_WORDS])
)
GRID = 3
MARGIN = 3
SHAPES: tuple[str, ...] = ("square", "disc")


@dataclass(slots=True, frozen=True)
class Shape:
    kind: str  # "square" | "disc"
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 inclusive


@dataclass(slots=True, frozen=True)
class TaskSample:
    image: Image.Image
    question: str
    answer: str  # one word of ANSWER_WORDS
    kind: str  # "count" | "colour"
    count: int
    colour: str
    shapes: tuple[Shape, ...]


class VisualTask:
    """Coloured-shape questions, generated on the fly from a seed."""

    def __init__(
        self, seed: int, image_size: int = 84, kinds: Sequence[str] = KINDS, max_count: int = 4
    ) -> None:
        cell = image_size // GRID
        if cell - 2 * MARGIN < 4:
            raise ValueError(f"image_size {image_size} too small for a {GRID}x{GRID} grid")
        if unknown := set(kinds) - set(KINDS):
            raise ValueError(f"unknown question kinds {sorted(unknown)}; known: {KINDS}")
        if not 1 <= max_count <= len(COUNT_WORDS):
            raise ValueError(f"max_count must lie in [1, {len(COUNT_WORDS)}]")
        self.seed, self.image_size, self.max_count = seed, image_size, max_count
        self.kinds = tuple(kinds)

    def sample(self, index: int) -> TaskSample:
        # A string seed is hashed with sha512: stable across processes and PYTHONHASHSEED.
        rng = random.Random(f"rollplex-visual-task:{self.seed}:{index}")
        count = rng.randint(1, self.max_count)
        colour = rng.choice(tuple(PALETTE))
        kind = rng.choice(self.kinds)
        cell = self.image_size // GRID
        image = Image.new("RGB", (self.image_size, self.image_size), BACKGROUND)
        draw = ImageDraw.Draw(image)
        shapes = []
        for c in sorted(rng.sample(range(GRID * GRID), count)):
            size = rng.randint(max(4, cell // 3), cell - 2 * MARGIN)
            x0 = (c % GRID) * cell + rng.randint(MARGIN, cell - MARGIN - size)
            y0 = (c // GRID) * cell + rng.randint(MARGIN, cell - MARGIN - size)
            shape = Shape(rng.choice(SHAPES), (x0, y0, x0 + size - 1, y0 + size - 1))
            fill = PALETTE[colour]
            if shape.kind == "square":
                draw.rectangle(shape.box, fill=fill)
            else:
                draw.ellipse(shape.box, fill=fill)
            shapes.append(shape)
        answer = COUNT_WORDS[count - 1] if kind == "count" else colour
        return TaskSample(image, QUESTIONS[kind], answer, kind, count, colour, tuple(shapes))

    def samples(self, start: int, n: int) -> list[TaskSample]:
        return [self.sample(i) for i in range(start, start + n)]
