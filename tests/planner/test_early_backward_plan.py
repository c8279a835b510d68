"""schedule.early_backward (opt-in): refused at plan time, naming the setting, where the
gradient is not linear in per-row advantages; where it is, the plan says that per-group
placement is not planned yet (one backward after the decode), and nothing else changes."""

from __future__ import annotations

import pytest

from rollplex.jobs.pipeline import plan_step
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec


def _plan(name: str, schedule: str, early: bool, workload: str = "video"):
    return plan_step(
        MODEL_PRESETS["qwen2_5_vl_7b"],
        WORKLOAD_PRESETS[workload],
        AlgoSpec(name=name),
        HARDWARE_PRESETS["h200x8"],
        ScheduleSpec(name=schedule, early_backward=early),
    )


@pytest.mark.parametrize("schedule", ["serial", "rollplex"])
@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_an_eligible_step_is_planned_as_before_and_says_so(name, schedule):
    on, off = _plan(name, schedule, True), _plan(name, schedule, False)
    assert on.plan.notes[-1].startswith("early backward: the gradient is linear")
    assert "not planned yet" in on.plan.notes[-1]
    grads = on.graph.values["train.backward.grads"]  # two buffers of the policy's gradient
    assert f"{2 * grads.nbytes / 2**30:.2f} GiB per group in flight" in on.plan.notes[-1]
    assert on.plan.step_time_s == off.plan.step_time_s
    assert not any(n.startswith("early backward") for n in off.plan.notes)


@pytest.mark.parametrize("schedule", ["serial", "rollplex"])
def test_ppo_is_refused_by_name_before_planning(schedule):
    with pytest.raises(ValueError, match=r"schedule.early_backward: refused, algo.name=ppo"):
        _plan("ppo", schedule, True)
