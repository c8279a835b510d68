"""One RL step's inputs from a prompt source, and the workload shape measured from it.

`StepData.step(k)` is a pure function of (seed, k): the source's batch k, rendered. The
planner is sized from `measure_workload`, which renders the first batches and takes the
longest visual and text spans seen, so the plan's shapes are what the run feeds in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rollplex.data import PromptSource
from rollplex.data.prompts import PromptBatch
from rollplex.data.render import PromptRenderer
from rollplex.data.sample import Sample
from rollplex.specs import ModelSpec, WorkloadSpec


@dataclass(slots=True)
class StepInputs:
    """One RL step's prompts: the rendered batch and the samples it came from (answers)."""

    batch: PromptBatch
    samples: Sequence[Sample]


@dataclass(slots=True)
class StepData:
    source: PromptSource
    renderer: PromptRenderer
    prompts_per_step: int

    def samples(self, k: int) -> list[Sample]:
        return self.source.batch(k, self.prompts_per_step)

    def step(self, k: int) -> StepInputs:
        samples = self.samples(k)
        return StepInputs(self.renderer.encode_batch(samples), samples)


@dataclass(slots=True, frozen=True)
class MeasuredShape:
    visual_tokens: int  # most visual tokens of one prompt
    text_tokens: int  # most text tokens of one prompt (chat template included)
    frames: int
    prompts_seen: int


def measure_shape(data: StepData, model: ModelSpec, batches: int = 2) -> MeasuredShape:
    """Render the first `batches` steps and take the longest visual and text spans."""
    st = model.special_tokens
    visual_ids = {st.image_token_id, st.video_token_id}
    most_visual = most_text = seen = 0
    for k in range(batches):
        batch = data.step(k).batch
        for row, n in enumerate(batch.lengths.tolist()):
            ids = batch.input_ids[row, :n].tolist()
            visual = sum(i in visual_ids for i in ids)
            most_visual, most_text = max(most_visual, visual), max(most_text, n - visual)
            seen += 1
    frames = max(
        (len(s.video) for k in range(batches) for s in data.samples(k) if s.video), default=1
    )
    return MeasuredShape(most_visual, most_text, frames, seen)


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
