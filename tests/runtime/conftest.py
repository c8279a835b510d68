"""Run the tiny GRPO step through real plans: a model, a backend, a plan, an executor."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.runtime import Callback, Executor, StepResult
from rollplex.runtime.compose import compose
from rollplex.runtime.dispatch import RoleDispatch
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    HardwareSpec,
    ScheduleSpec,
)

torch.set_num_threads(1)
MODEL = MODEL_PRESETS["tiny"]
WORKLOAD = WORKLOAD_PRESETS["tiny"]
# A learning rate at which 3 steps visibly move the weights (Adam moves each by ~lr).
ALGO = AlgoSpec(lr=1e-3)
CPU = HARDWARE_PRESETS["cpu"]


@pytest.fixture(autouse=True)
def _deterministic():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


@dataclass
class Run:
    planned: PlanResult
    backend: RoleDispatch
    executor: Executor
    results: list[StepResult]

    def params(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.backend.trainer.model.named_parameters()}


def run_schedule(
    schedule: ScheduleSpec,
    steps: int = 3,
    hardware: HardwareSpec = CPU,
    callbacks: list[Callback] | None = None,
    seed: int = 0,
    device: str = "cpu",
    max_new_tokens: int = 4,
) -> Run:
    planned = plan_step(MODEL, WORKLOAD, ALGO, hardware, schedule)
    config = StepConfig(MODEL, ALGO, seed=seed, max_new_tokens=max_new_tokens, device=device)
    backend = compose(config)
    executor = Executor(planned.plan, planned.graph, backend, callbacks or [], device=device)
    data = TaskData(MODEL, WORKLOAD, seed=seed)
    results = [executor.run_step(k, data.step(k)) for k in range(steps)]
    return Run(planned, backend, executor, results)


_RUNS: dict[tuple, Run] = {}


def cached_run(schedule: ScheduleSpec, hardware: HardwareSpec = CPU) -> Run:
    """3 steps of `schedule`, run once per test session (runs are read, never changed)."""
    key = (schedule, hardware)
    if key not in _RUNS:
        _RUNS[key] = run_schedule(schedule, hardware=hardware)
    return _RUNS[key]


def initial_params(seed: int = 0) -> dict[str, torch.Tensor]:
    backend = compose(StepConfig(MODEL, ALGO, seed=seed, max_new_tokens=4))
    return {n: p.detach().clone() for n, p in backend.trainer.model.named_parameters()}
