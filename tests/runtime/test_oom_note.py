"""An out-of-memory error inside a plan step leaves with a note naming that step and what the
plan placed on its GPU, so a user (and bench/gpu_step.py's record) sees where the plan was
short, not only the allocator's numbers."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import ScheduleSpec
from tests.runtime.conftest import ALGO, CPU, MODEL, WORKLOAD


@pytest.mark.parametrize("failing", ["rollout.decode", "train.backward"])
def test_an_oom_names_the_plan_step_and_the_planned_peak(failing):
    planned = plan_step(MODEL, WORKLOAD, ALGO, CPU, ScheduleSpec(name="serial"))
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    run_op = backend.run_op

    def short_of_memory(op, *args, **kw):
        if op.name == failing:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.95 GiB.")
        return run_op(op, *args, **kw)

    backend.run_op = short_of_memory
    ex = Executor(planned.plan, planned.graph, backend)
    with pytest.raises(torch.OutOfMemoryError) as err:
        ex.run_step(0, TaskData(MODEL, WORKLOAD, seed=0).step(0))
    (note,) = err.value.__notes__
    dev = planned.plan.devices[0]
    assert f"plan step '{failing}'" in note and "of RL step 0" in note
    assert f"{dev.peak_bytes / 2**30:.1f} GiB of its {dev.budget_bytes / 2**30:.1f} GiB" in note
    assert "hardware.hbm_reserve" in note


def test_other_errors_pass_through_unannotated():
    planned = plan_step(MODEL, WORKLOAD, ALGO, CPU, ScheduleSpec(name="serial"))
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))

    def broken(op, *args, **kw):
        raise ValueError("not memory")

    backend.run_op = broken
    with pytest.raises(ValueError, match="not memory") as err:
        Executor(planned.plan, planned.graph, backend).run_step(
            0, TaskData(MODEL, WORKLOAD, seed=0).step(0)
        )
    assert not getattr(err.value, "__notes__", None)
