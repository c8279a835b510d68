"""RunSpec: the whole validated config of one `rollplex <job>` run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rollplex.specs.algo import AlgoSpec
from rollplex.specs.backend import BackendSpec
from rollplex.specs.base import Spec
from rollplex.specs.calibration import CalibrationSpec
from rollplex.specs.data import DataSpec
from rollplex.specs.hardware import HardwareSpec
from rollplex.specs.model import ModelSpec
from rollplex.specs.reward import RewardSpec
from rollplex.specs.schedule import ScheduleSpec
from rollplex.specs.weights import WeightsSpec
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
        10,
        ge=0,
        description="Write a checkpoint every N steps (and after the last one); 0 writes "
        "none (benchmarks: a 3B FSDP2 checkpoint with AdamW state is ~45 GB).",
    )
    resume: str | None = Field(
        None,
        description="Checkpoint folder to resume from; a run "
        "folder or its checkpoints/ folder means its latest checkpoint.",
    )
    max_new_tokens: int = Field(
        4,
        ge=1,
        description="Generation cap of a response. With response_lengths=model it also "
        "sizes the plan's responses (fixed at this length), unless the command line sets "
        "workload.response_length: then it must not exceed its max (jobs/sizing.py).",
    )
    response_lengths: Literal["model", "workload"] = Field(
        "model",
        description="model: a response ends at eos or train.max_new_tokens; workload: each "
        "response runs (eos ignored) to a length drawn from workload.response_length, "
        "capped by train.max_new_tokens, the same for every schedule of one seed "
        "(benchmarks: random-weight models never stop).",
    )
    device: str = Field(
        "cpu",
        description="torch device: cpu or cuda. On cuda the hardware is read from the device "
        "unless `hardware=` is given (then it must match it), and conf/train_gpu.yaml "
        "fills what the command line leaves unset: 16 prompts x G=8 per step, 128-token "
        "responses (jobs/sizing.py).",
    )
    deterministic: bool = Field(True, description="torch deterministic algorithms.")
    eval_every: int = Field(
        0,
        ge=0,
        description="Log greedy accuracy on the held-out split every N steps, before the "
        "first and after the last (0: never).",
    )
    eval_prompts: int = Field(
        64, ge=1, description="Held-out prompts scored per evaluation (the split's first)."
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
    profile: bool = Field(
        False,
        description="Record the last train.trace_steps RL steps with torch.profiler: "
        "the measured trace then holds the real ops, kernels and memory events under each "
        "plan step's name (it costs time while on).",
    )
    progress: bool = Field(True, description="Show a tqdm progress bar.")


class EvalSpec(Spec):
    """The `eval` job: greedy accuracy of a model folder (a train checkpoint) on a split.
    A checkpoint is scored the way its training run scored it: unset fields, and the
    data/workload/seed/model groups not given on the command line, come from the run's
    config.json (rollplex.jobs.eval)."""

    split: Literal["train", "test"] = Field("test", description="Which split to score.")
    prompts: int | None = Field(
        None,
        ge=1,
        description="Prompts scored (the split's first); None: the training run's "
        "train.eval_prompts, else 200.",
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        description="Generation cap per answer; None: the training run's "
        "train.max_new_tokens, else 8.",
    )
    device: str = Field("cpu", description="torch device: cpu or cuda.")
    samples: int = Field(
        1,
        ge=1,
        description="Answers per prompt [val_kwargs.n]: accuracy is their mean (mean@n), "
        "pass_at_n the share of prompts with one scoring 1.",
    )
    temperature: float = Field(
        0.0,
        ge=0,
        description="Sampling temperature of the answers [val_kwargs.temperature]; 0: greedy.",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus of the answers [val_kwargs.top_p].")

    @model_validator(mode="after")
    def _sampled(self) -> EvalSpec:
        if self.samples > 1 and self.temperature == 0:
            raise ValueError(
                f"eval.samples={self.samples} with eval.temperature=0: greedy answers are all "
                "the same; set eval.temperature > 0 (verl's val_kwargs use 0.6-1.0)"
            )
        return self


class RunSpec(Spec):
    job: Literal["graph", "plan", "train", "eval", "weights"] = Field(
        ..., description="What to run."
    )
    seed: int = Field(0, description="Seed of everything random.")
    model: ModelSpec = Field(..., description="The model (conf/model).")
    algo: AlgoSpec = Field(..., description="The algorithm (conf/algo).")
    workload: WorkloadSpec = Field(..., description="The workload (conf/workload).")
    schedule: ScheduleSpec = Field(..., description="The schedule (conf/schedule).")
    hardware: HardwareSpec = Field(..., description="The cluster (conf/hardware).")
    calibration: CalibrationSpec = Field(
        default_factory=CalibrationSpec,
        description="Measured op times that rescale the cost model: `calibration=<file>`, "
        "`calibration=auto`, `calibration=none`, `calibration.strict=true` "
        "(rollplex.specs.calibration.CalibrationSpec).",
    )
    data: DataSpec = Field(default_factory=DataSpec, description="Prompts (conf/data).")
    reward: RewardSpec = Field(
        default_factory=RewardSpec, description="Reward components (conf/reward)."
    )
    backend: BackendSpec = Field(
        default_factory=BackendSpec, description="Role implementations (conf/backend)."
    )
    train: TrainSpec = Field(default_factory=TrainSpec, description="The train job.")
    eval: EvalSpec = Field(default_factory=EvalSpec, description="The eval job.")
    weights: WeightsSpec = Field(
        default_factory=WeightsSpec,
        description="The weights job: training and rollout placements (rollplex.weights).",
    )
