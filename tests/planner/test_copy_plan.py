"""`copy_plan`, the planner's copy of a whole plan to try memory moves on, is a deep copy:
equal to `copy.deepcopy`'s, sharing no list, dict or record with the original, so a trial
that moves a step or frees a tensor early leaves the plan it started from as it was."""

from __future__ import annotations

from copy import deepcopy
from dataclasses import fields, is_dataclass
from typing import Any

import pytest

from rollplex.jobs.pipeline import plan_step
from rollplex.planner.plan import MemAction, copy_plan
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec


def _mutable_ids(x: Any, out: set[int]) -> set[int]:
    """The ids of every list, dict and record reachable from `x`."""
    if isinstance(x, dict):
        values = list(x.values())
    elif isinstance(x, list):
        values = x
    elif is_dataclass(x):
        values = [getattr(x, f.name) for f in fields(x)]
    else:
        return out
    out.add(id(x))
    for v in values:
        _mutable_ids(v, out)
    return out


H200X8_55 = HARDWARE_PRESETS["h200x8"].model_copy(update={"hbm_gib": 55.0, "hbm_reserve": 0.0})


@pytest.mark.parametrize(
    ("model", "workload", "hardware", "schedule"),
    [
        (
            "tiny",
            "image",
            HARDWARE_PRESETS["cpu"],
            ScheduleSpec(name="rollplex", overlap="piggyback"),
        ),
        ("qwen2_5_vl_7b", "video", H200X8_55, ScheduleSpec(name="serial")),  # offloads
        ("qwen2_5_vl_7b", "video", HARDWARE_PRESETS["h200x8"], ScheduleSpec(name="disaggregated")),
    ],
    ids=["chunks_and_rides", "offloads", "transfers"],
)
def test_a_copy_equals_the_plan_and_shares_nothing_mutable(model, workload, hardware, schedule):
    plan = plan_step(
        MODEL_PRESETS[model], WORKLOAD_PRESETS[workload], AlgoSpec(), hardware, schedule
    ).plan
    actions = {e.action for d in plan.devices for e in d.effects}
    assert (
        max(s.chunks for s in plan.all_steps()) > 1
        or MemAction.OFFLOAD in actions
        or plan.transfers
    )
    copy = copy_plan(plan)
    assert copy == plan == deepcopy(plan)
    assert not _mutable_ids(copy, set()) & _mutable_ids(plan, set())
    # a trial's moves on the copy leave the plan as it was
    before = deepcopy(plan)
    dev = copy.devices[0]
    dev.steps[0].start_s += 1.0
    dev.effects[0].action = (
        MemAction.FREE if dev.effects[0].action is MemAction.ALLOC else MemAction.ALLOC
    )
    dev.steps.pop()
    copy.meta["trial"] = True
    assert plan == before and copy != plan
