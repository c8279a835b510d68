"""WorkloadSpec: what one RL step processes — prompts, group size, visual input, lengths."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Literal

from pydantic import Field, model_validator

from rollplex.specs.base import Spec
from rollplex.specs.model import VisionSpec


class ResponseLengthSpec(Spec):
    """Distribution of generated response lengths (tokens)."""

    distribution: Literal["fixed", "uniform", "lognormal"] = Field(
        "lognormal",
        description="fixed: every response has `mean` tokens; uniform: on "
        "[min, max]; lognormal: median-free heavy tail with `mean` and `sigma`, clipped to max.",
    )
    mean: int = Field(256, ge=1, description="Mean response length in tokens.")
    min: int = Field(1, ge=1, description="Shortest response (uniform only).")
    max: int = Field(1024, ge=1, description="Generation cap: no response is longer.")
    sigma: float = Field(0.6, gt=0, description="Log-space standard deviation (lognormal).")

    @model_validator(mode="after")
    def _check(self) -> ResponseLengthSpec:
        if self.max < self.mean:
            raise ValueError(f"response_length.max={self.max} is below mean={self.mean}")
        if self.distribution == "uniform" and not self.min <= self.mean <= self.max:
            raise ValueError("response_length: uniform needs min <= mean <= max")
        return self

    def quantile(self, q: float) -> float:
        """Length at quantile q (0 < q < 1), clipped to max."""
        if self.distribution == "fixed":
            return float(self.mean)
        if self.distribution == "uniform":
            lo, hi = self.min, 2 * self.mean - self.min
            return min(float(self.max), lo + q * (hi - lo))
        mu = math.log(self.mean) - self.sigma**2 / 2  # E[X] = mean
        return min(float(self.max), math.exp(mu + self.sigma * NormalDist().inv_cdf(q)))

    def expected_max(self, batch: int) -> float:
        """Expected longest response in a batch: decode runs until it finishes."""
        return self.quantile(batch / (batch + 1))

    def survival(self, length: float) -> float:
        """P(response longer than `length` tokens)."""
        if length >= self.max:
            return 0.0
        if self.distribution == "fixed":
            return 1.0 if length < self.mean else 0.0
        if self.distribution == "uniform":
            lo, hi = self.min, 2 * self.mean - self.min
            return min(1.0, max(0.0, (hi - length) / (hi - lo))) if hi > lo else float(length < lo)
        if length <= 0:
            return 1.0
        mu = math.log(self.mean) - self.sigma**2 / 2
        return 1 - NormalDist().cdf((math.log(length) - mu) / self.sigma)

    def expected_active(self, batch: int, step: int) -> float:
        """Expected sequences still decoding at `step` (0-based) in a batch."""
        return batch * self.survival(step)


class WorkloadSpec(Spec):
    """One RL step's inputs: N prompts, each with visual content, sampled G times."""

    name: str = Field("custom", description="Preset name.")
    prompts_per_step: int = Field(..., ge=1, description="Prompts (N) per RL step, all GPUs.")
    group_size: int = Field(..., ge=1, description="Responses sampled per prompt (G).")
    frames: int = Field(1, ge=1, description="Video frames per prompt; 1 means one image.")
    height: int = Field(448, ge=28, description="Frame height in pixels (multiple of 28).")
    width: int = Field(448, ge=28, description="Frame width in pixels (multiple of 28).")
    visual_tokens_per_frame: int | None = Field(
        None, ge=1, description="If set, overrides the resolution: LLM tokens per frame."
    )
    text_tokens: int = Field(256, ge=1, description="Text tokens of each prompt.")
    response_length: ResponseLengthSpec = Field(
        default_factory=ResponseLengthSpec, description="Response length distribution."
    )

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        if self.visual_tokens_per_frame is None:
            for field in ("height", "width"):
                if getattr(self, field) % 28:
                    raise ValueError(f"{field}={getattr(self, field)} must be a multiple of 28")
        return self

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    def visual_tokens(self, vision: VisionSpec) -> int:
        """LLM tokens the vision tower emits for one prompt."""
        if self.visual_tokens_per_frame is not None:
            return self.frames * self.visual_tokens_per_frame
        grid_t = math.ceil(self.frames / vision.temporal_patch_size)
        grid_hw = (self.height // vision.patch_size) * (self.width // vision.patch_size)
        return grid_t * grid_hw // vision.merge_factor

    def grid(self, vision: VisionSpec) -> tuple[int, int, int]:
        """(t, h, w) in ViT patches of one prompt's visual input, as the processor lays it
        out: t temporal patches of h x w. With `visual_tokens_per_frame` each frame is its
        own temporal patch, square when its patch count is a square, else a strip m wide
        (m: the merge size) — the window layout is then approximate."""
        m = vision.spatial_merge_size
        if self.visual_tokens_per_frame is None:
            grid_t = math.ceil(self.frames / vision.temporal_patch_size)
            return grid_t, self.height // vision.patch_size, self.width // vision.patch_size
        per_frame = self.visual_tokens_per_frame * m * m
        side = math.isqrt(per_frame)
        if side * side == per_frame:
            return self.frames, side, side
        return self.frames, m, per_frame // m

    def patches(self, vision: VisionSpec) -> int:
        """ViT patches of one prompt (before the merger)."""
        return self.visual_tokens(vision) * vision.merge_factor

    def prefix_tokens(self, vision: VisionSpec) -> int:
        """Response-independent tokens of one sequence: visual plus text."""
        return self.visual_tokens(vision) + self.text_tokens

    def prefix_fraction(self, vision: VisionSpec) -> float:
        p = self.prefix_tokens(vision)
        return p / (p + self.response_length.mean)


WORKLOAD_PRESETS: dict[str, WorkloadSpec] = {
    # 16 frames at 448x448 -> 2048 visual + 256 text = the 2,304-token prefix of FACTS.md.
    "video": WorkloadSpec(
        name="video", prompts_per_step=128, group_size=8, frames=16, text_tokens=256
    ),
    "image": WorkloadSpec(
        name="image",
        prompts_per_step=256,
        group_size=8,
        frames=1,
        height=896,
        width=896,
        text_tokens=128,
    ),
    "tiny": WorkloadSpec(
        name="tiny",
        prompts_per_step=4,
        group_size=4,
        frames=1,
        height=56,
        width=56,
        text_tokens=16,
        response_length=ResponseLengthSpec(distribution="uniform", mean=8, min=1, max=16),
    ),
}
