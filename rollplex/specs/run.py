"""RunSpec: the whole validated config of one `rollplex <job>` run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollplex.specs.algo import AlgoSpec
from rollplex.specs.base import Spec
from rollplex.specs.data import DataSpec
from rollplex.specs.fsdp import FsdpSpec
from rollplex.specs.hardware import HardwareSpec
from rollplex.specs.model import ModelSpec
from rollplex.specs.reward import RewardSpec
from rollplex.specs.schedule import ScheduleSpec
from rollplex.specs.workload import WorkloadSpec


class TrainSpec(Spec):
    """The `train` job: a real GRPO loop on the torch backend (rollplex.jobs.train)."""

    steps: int = Field(
        20,
        ge=1,
        description="RL steps to run in total (a resumed run counts "
        "the checkpoint's steps, so it ends where an uninterrupted run would).",
    )
    checkpoint_every: int = Field(
        10, ge=1, description="Write a checkpoint every N steps (and after the last one)."
    )
    resume: str | None = Field(
        None,
        description="Checkpoint folder to resume from; a run "
        "folder or its checkpoints/ folder means its latest checkpoint.",
    )
    max_new_tokens: int = Field(
        4,
        ge=1,
        description="Generation cap of the tiny task (at most "
        "workload.response_length.max, which the plan is sized for).",
    )
    backend: str = Field(
        "torch",
        description="Backend that runs the plan (rollplex.backends.REGISTRY): 'torch', or "
        "'fsdp' (FSDP2 trainer, data-parallel over torchrun's ranks); 'vllm' refuses with "
        "the reason.",
    )
    fsdp: FsdpSpec = Field(
        default_factory=FsdpSpec, description="FSDP2 settings (backend 'fsdp' only)."
    )
    device: str = Field("cpu", description="torch device: cpu or cuda.")
    deterministic: bool = Field(True, description="torch deterministic algorithms.")
    reward: Literal["first_token", "answer_eos"] = Field(
        "first_token",
        description="first_token: 1 iff the first generated token is the answer (learnable "
        "from random weights); answer_eos: 1 iff the response is exactly [answer, eos].",
    )
    questions: tuple[Literal["count", "colour"], ...] = Field(
        ("count", "colour"),
        min_length=1,
        description="Question kinds of the visual task. ['colour'] alone is the small answer "
        "set (4 words) on which a tiny model learns to read the image within a few hundred "
        "steps; with both, it first learns each question's answer words (reward ~0.25).",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="torch CPU threads (None: torch's "
        "default). Runs compared bit for bit should use the same.",
    )
    trace_steps: int = Field(
        3,
        ge=1,
        description="The last N RL steps whose measured timeline "
        "is exported to TensorBoard next to the planned one.",
    )
    progress: bool = Field(True, description="Show a tqdm progress bar.")


class RunSpec(Spec):
    job: Literal["graph", "plan", "train"] = Field(..., description="What to run.")
    seed: int = Field(0, description="Seed of everything random.")
    model: ModelSpec = Field(..., description="The model (conf/model).")
    algo: AlgoSpec = Field(..., description="The algorithm (conf/algo).")
    workload: WorkloadSpec = Field(..., description="The workload (conf/workload).")
    schedule: ScheduleSpec = Field(..., description="The schedule (conf/schedule).")
    hardware: HardwareSpec = Field(..., description="The cluster (conf/hardware).")
    calibration: str | None = Field(
        None,
        description="Measured op times (rollplex-calibration/1 JSON, e.g. "
        "bench/results/calibration_h200_qwen2_5_vl_7b.json) that rescale the cost model.",
    )
    data: DataSpec = Field(default_factory=DataSpec, description="Prompts (conf/data).")
    reward: RewardSpec = Field(
        default_factory=RewardSpec, description="Reward components (conf/reward)."
    )
    train: TrainSpec = Field(default_factory=TrainSpec, description="The train job.")
