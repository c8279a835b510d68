"""The training micro-batch count is one number: what the planner sizes activations with
(`DeviceSizer.micro_batches`), what the plan carries, and what the trainer runs under the
executor, over workloads x `schedule.train_micro_tokens` (one micro-batch included)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import plan_step
from rollplex.planner.api import _sizers
from rollplex.planner.schedules import PlanningContext
from rollplex.planner.sizing import micro_batch_count, train_micro_batches
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.runtime.executor import ExecutionError
from rollplex.runtime.plan_tables import plan_micro_batches
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ScheduleSpec,
)

MODEL, CPU, ALGO = MODEL_PRESETS["tiny"], HARDWARE_PRESETS["cpu"], AlgoSpec(lr=1e-3)
TINY = WORKLOAD_PRESETS["tiny"]  # 4 prompts x G=4, 20 prefix tokens, mean response 8
WIDE = TINY.model_copy(update={"prompts_per_step": 6, "group_size": 2})


def _tokens(workload) -> float:
    mean = workload.response_length.mean
    return workload.samples_per_step * (workload.prefix_tokens(MODEL.vision) + mean)


@pytest.mark.parametrize(
    ("workload", "schedule", "micro_tokens"),
    [
        (TINY, ScheduleSpec(), 16384),  # the default: one micro-batch
        (TINY, ScheduleSpec(name="serial"), 448),  # exactly the step's 448 tokens: one
        (TINY, ScheduleSpec(name="serial"), 447),  # a token short: two
        (TINY, ScheduleSpec(), 150),  # three (rollplex: the prefix overlaps decode)
        (TINY, ScheduleSpec(name="serial", dedup=False), 30),  # verl: 15 of 16 samples
        (WIDE, ScheduleSpec(name="serial"), 100),  # six prompts' groups, uneven
        (WIDE, ScheduleSpec(name="serial", dedup=False), 60),
    ],
)
def test_trainer_runs_the_planned_micro_batches(workload, schedule, micro_tokens):
    schedule = schedule.model_copy(update={"train_micro_tokens": micro_tokens})
    planned = plan_step(MODEL, workload, ALGO, CPU, schedule)
    count = planned.plan.meta["train_micro_batches"]
    units = workload.prompts_per_step * (1 if schedule.dedup else workload.group_size)
    assert count == min(units, math.ceil(_tokens(workload) / micro_tokens))
    ctx = PlanningContext(planned.graph, MODEL, workload, CPU, schedule, None, None)
    assert {s.micro_batches() for s in _sizers(planned.plan, ctx).values()} == {count}
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    executor = Executor(planned.plan, planned.graph, backend)
    assert backend.trainer.micro_batches == count
    result = executor.run_step(0, TaskData(MODEL, workload, seed=0).step(0))
    assert result.metrics["train_micro_batches"] == count


@pytest.mark.parametrize(("dedup", "units"), [(True, 4), (False, 16)])
def test_a_count_above_the_units_is_planned_as_the_trainer_runs_it(caplog, dedup, units):
    # 28 tokens a micro-batch would need 16, but prefix sharing cuts only between the 4
    # prompts' groups (per-sample: between the 16 samples): the plan carries what runs
    schedule = ScheduleSpec(name="serial", train_micro_tokens=28, dedup=dedup)
    planned = plan_step(MODEL, TINY, ALGO, CPU, schedule)
    assert math.ceil(_tokens(TINY) / 28) == 16
    assert planned.plan.meta["train_micro_batches"] == units
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    result = Executor(planned.plan, planned.graph, backend).run_step(
        0, TaskData(MODEL, TINY, seed=0).step(0)
    )
    assert result.metrics["train_micro_batches"] == units
    assert "exceed this step's" not in caplog.text  # nothing clamped at run time


def test_micro_batch_count_is_never_zero():
    assert micro_batch_count(0, 16) == 1
    assert micro_batch_count(1, 10**9) == 1
    assert micro_batch_count(17, 16) == 2
    assert (
        train_micro_batches(
            MODEL, TINY, plan_step(MODEL, TINY, ALGO, CPU, ScheduleSpec()).graph, 64, 1
        )
        >= 1
    )
    with pytest.raises(ValueError, match=r"schedule\.train_micro_tokens"):
        micro_batch_count(10, 0)
    with pytest.raises(ValidationError, match="train_micro_tokens"):
        ScheduleSpec(train_micro_tokens=0)


def test_executor_refuses_a_plan_without_a_valid_count():
    planned = plan_step(MODEL, TINY, ALGO, CPU, ScheduleSpec())
    plan = planned.plan
    del plan.meta["train_micro_batches"]
    assert plan_micro_batches(plan) == 1  # a plan that has none: the whole step at once
    for bad in (0, -1, 2.5):
        plan.meta["train_micro_batches"] = bad
        with pytest.raises(ExecutionError, match="train_micro_tokens"):
            plan_micro_batches(plan)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
