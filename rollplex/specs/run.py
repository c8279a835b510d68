"""RunSpec: the whole validated config of one `rollplex <job>` run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollplex.specs.algo import AlgoSpec
from rollplex.specs.base import Spec
from rollplex.specs.hardware import HardwareSpec
from rollplex.specs.model import ModelSpec
from rollplex.specs.schedule import ScheduleSpec
from rollplex.specs.workload import WorkloadSpec


class TrainSpec(Spec):
    """The `train` job: a real GRPO loop on the torch backend."""

    steps: int = Field(20, ge=1, description="RL steps to run.")
    checkpoint_every: int = Field(10, ge=1, description="Write a checkpoint every N steps.")
    resume: str | None = Field(None, description="Checkpoint folder to resume from.")
    max_new_tokens: int = Field(4, ge=1, description="Generation cap of the tiny task.")
    device: str = Field("cpu", description="torch device: cpu or cuda.")
    deterministic: bool = Field(True, description="torch deterministic algorithms.")


class RunSpec(Spec):
    job: Literal["graph", "plan", "train"] = Field(..., description="What to run.")
    seed: int = Field(0, description="Seed of everything random.")
    model: ModelSpec = Field(..., description="The model (conf/model).")
    algo: AlgoSpec = Field(..., description="The algorithm (conf/algo).")
    workload: WorkloadSpec = Field(..., description="The workload (conf/workload).")
    schedule: ScheduleSpec = Field(..., description="The schedule (conf/schedule).")
    hardware: HardwareSpec = Field(..., description="The cluster (conf/hardware).")
    train: TrainSpec = Field(default_factory=TrainSpec, description="The train job.")
