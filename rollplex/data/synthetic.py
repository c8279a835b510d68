"""The synthetic sources: shapes (one image) and moving shapes (a video) as PromptSources.

Row i of a split is task sample `offset + i` of a generator seeded with the run's seed, so
the train split is indices [0, rows) and the test split a disjoint range far above it.
"""

from __future__ import annotations

from rollplex.data.motion import MotionTask
from rollplex.data.order import IndexedSource
from rollplex.data.sample import DataError, Sample
from rollplex.data.shapes import VisualTask
from rollplex.specs.data import DataSpec

TRAIN_ROWS = 1_000_000
TEST_ROWS = 1_000
TEST_OFFSET = 1 << 40  # test indices never meet train ones


def _split(spec: DataSpec, split: str) -> tuple[int, int]:
    """(first generator index, rows) of a split."""
    if split == "train":
        return 0, spec.max_rows or TRAIN_ROWS
    if split == "test":
        return TEST_OFFSET, spec.eval_max_rows or TEST_ROWS
    raise DataError(f"data source '{spec.source}' has splits train and test, not '{split}'")


class SyntheticSource(IndexedSource):
    def __init__(self, spec: DataSpec, split: str, seed: int) -> None:
        self.offset, rows = _split(spec, split)
        super().__init__("synthetic", split, seed, rows)
        try:
            kwargs = {"kinds": spec.questions} if spec.questions else {}
            self.task = VisualTask(seed, image_size=spec.image_size, **kwargs)
        except ValueError as err:
            raise DataError(f"data.source=synthetic: {err}") from None

    def row(self, index: int) -> Sample:
        s = self.task.sample(self.offset + index)
        return Sample(self.uid(index), s.question, s.answer, images=(s.image,))


class SyntheticVideoSource(IndexedSource):
    def __init__(self, spec: DataSpec, split: str, seed: int, frames: int) -> None:
        self.offset, rows = _split(spec, split)
        super().__init__("synthetic_video", split, seed, rows)
        try:
            kwargs = {"kinds": spec.questions} if spec.questions else {}
            self.task = MotionTask(seed, image_size=spec.image_size, frames=frames, **kwargs)
        except ValueError as err:
            where = f"workload.frames={frames}, data.image_size={spec.image_size}"
            raise DataError(f"data.source=synthetic_video with {where}: {err}") from None

    def row(self, index: int) -> Sample:
        s = self.task.sample(self.offset + index)
        return Sample(self.uid(index), s.question, s.answer, video=s.frames)
