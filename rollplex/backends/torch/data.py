"""Prompts for RL step k of the synthetic visual task: a pure function of (seed, k).

Step k takes task samples [k*N, (k+1)*N), so a resumed run sees exactly the prompts an
uninterrupted one would. Images are drawn at the workload's resolution, so the plan's
shapes (visual tokens per prompt) match what runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rollplex.backends.step import StepInputs
from rollplex.backends.torch.task import KINDS, VisualTask
from rollplex.backends.torch.tokenizer import (
    build_image_processor,
    build_tokenizer,
    encode_prompt,
    token_id,
)
from rollplex.data.prompt_media import Media
from rollplex.data.prompts import collate_prompts
from rollplex.specs import ModelSpec, WorkloadSpec


class TaskData:
    def __init__(
        self, model: ModelSpec, workload: WorkloadSpec, seed: int, kinds: Sequence[str] = KINDS
    ) -> None:
        if workload.frames != 1 or workload.height != workload.width:
            raise ValueError(
                f"the visual task draws square single images; workload '{workload.name}' has "
                f"frames={workload.frames}, {workload.height}x{workload.width}"
            )
        self.model, self.workload = model, workload
        self.task = VisualTask(seed=seed, image_size=workload.height, kinds=kinds)
        self.tokenizer = build_tokenizer(model)
        self.processor = build_image_processor(model, max_pixels=workload.height * workload.width)
        self.prompts = workload.prompts_per_step

    def step(self, k: int) -> StepInputs:
        samples = self.task.samples(k * self.prompts, self.prompts)
        enc = [encode_prompt(self.tokenizer, self.processor, s.image, s.question) for s in samples]
        answers = torch.tensor([token_id(self.tokenizer, s.answer) for s in samples])
        batch = collate_prompts(enc, pad_id=self.model.special_tokens.pad_token_id)
        # the same images, raw, for an engine rollout that runs its own processor (vLLM)
        media = Media(tuple((s.image.convert("RGB"),) for s in samples))
        return StepInputs(batch, answers, media)
