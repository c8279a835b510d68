"""One RL step's inputs from a prompt source, and the workload shape measured from it.

`StepData.step(k)` is a pure function of (seed, k): the source's batch k, rendered. The
planner is sized from `measure_shape`: the longest visual and text spans of every row of a
file source (from the sizes its data pass decoded), or of the first batches of a generated
one. A rendered row longer than what the plan was sized for is refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from rollplex.data import PromptSource
from rollplex.data.prompts import PromptBatch
from rollplex.data.render import PromptRenderer
from rollplex.data.sample import DataError, RowMedia, Sample
from rollplex.specs import ModelSpec, WorkloadSpec


@dataclass(slots=True)
class StepInputs:
    """One RL step's prompts: the rendered batch and the samples it came from (answers)."""

    batch: PromptBatch
    samples: Sequence[Sample]


@dataclass(slots=True, frozen=True)
class MeasuredShape:
    visual_tokens: int  # most visual tokens of one prompt
    text_tokens: int  # most text tokens of one prompt (chat template included)
    frames: int
    prompts_seen: int


@dataclass(slots=True)
class StepData:
    source: PromptSource
    renderer: PromptRenderer
    prompts_per_step: int
    limits: MeasuredShape | None = None  # what the plan was sized for; longer rows refused

    def samples(self, k: int) -> list[Sample]:
        return self.source.batch(k, self.prompts_per_step)

    def step(self, k: int) -> StepInputs:
        samples = self.samples(k)
        batch = self.renderer.encode_batch(samples)
        if self.limits is not None:
            self._check_limits(batch, samples)
        return StepInputs(batch, samples)

    def _check_limits(self, batch: PromptBatch, samples: Sequence[Sample]) -> None:
        lim = self.limits
        for sample, (visual, text) in zip(samples, _spans(batch, self.renderer.model), strict=True):
            if visual > lim.visual_tokens or text > lim.text_tokens:
                raise DataError(
                    f"row {sample.uid}: {visual} visual + {text} text tokens, more than the "
                    f"{lim.visual_tokens} + {lim.text_tokens} the plan was sized for "
                    f"(measured over {lim.prompts_seen} prompts); set workload.* to the "
                    "longest prompt, or drop the row"
                )


def _spans(batch: PromptBatch, model: ModelSpec) -> Iterator[tuple[int, int]]:
    """(visual, text) tokens of each rendered row."""
    st = model.special_tokens
    visual_ids = {st.image_token_id, st.video_token_id}
    for row, n in enumerate(batch.lengths.tolist()):
        visual = sum(i in visual_ids for i in batch.input_ids[row, :n].tolist())
        yield visual, n - visual


def measure_shape(data: StepData, model: ModelSpec, batches: int = 2) -> MeasuredShape:
    """The longest visual and text spans: over every row where the source lists its rows'
    sizes (files, easy-VQA), else over the first `batches` rendered steps (generated
    sources, whose rows share one shape)."""
    rows = getattr(data.source, "prompt_rows", None)
    if rows is not None:
        return _measure_rows(data.renderer, rows(), data.source.frames)
    most_visual = most_text = seen = 0
    for k in range(batches):
        for visual, text in _spans(data.step(k).batch, model):
            most_visual, most_text = max(most_visual, visual), max(most_text, text)
            seen += 1
    frames = max(
        (len(s.video) for k in range(batches) for s in data.samples(k) if s.video), default=1
    )
    return MeasuredShape(most_visual, most_text, frames, seen)


def _measure_rows(
    renderer: PromptRenderer, rows: Iterable[tuple[str, str, RowMedia]], frames: int
) -> MeasuredShape:
    most_visual = most_text = seen = 0
    has_video = False
    for _, media, visual, text in prompt_lengths(renderer, rows, frames):
        most_visual, most_text = max(most_visual, visual), max(most_text, text)
        has_video |= media.video_frames > 0
        seen += 1
    return MeasuredShape(most_visual, most_text, frames if has_video else 1, seen)


def prompt_lengths(
    renderer: PromptRenderer, rows: Iterable[tuple[str, str, RowMedia]], frames: int
) -> Iterator[tuple[str, RowMedia, int, int]]:
    """(uid, media, visual tokens, text tokens) of each rendered prompt, no pixels decoded."""
    # Rows repeat questions and image sizes (easy-vqa: 38,575 rows, ~4,000 images of one size).
    text_of: dict[tuple[str, int, bool], int] = {}
    visual_of: dict[tuple[object, ...], int] = {}
    for uid, problem, media in rows:
        video = media.video_frames > 0
        key = (problem, len(media.image_sizes), video)
        if key not in text_of:
            text_of[key] = renderer.text_tokens(uid, problem, len(media.image_sizes), video)
        sizes = (media.image_sizes, media.video_size)
        if sizes not in visual_of:
            visual_of[sizes] = renderer.visual_tokens(media, frames)
        yield uid, media, visual_of[sizes], text_of[key]


def measured_workload(workload: WorkloadSpec, shape: MeasuredShape) -> WorkloadSpec:
    """The workload with its visual and text lengths replaced by what the data holds."""
    per_frame = max(1, math.ceil(shape.visual_tokens / shape.frames))
    return workload.model_copy(
        update={
            "frames": shape.frames,
            "visual_tokens_per_frame": per_frame,
            "text_tokens": max(1, shape.text_tokens),
        }
    )
