from __future__ import annotations

import pytest

from rollplex.planner.api import PlanResult, plan_step
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ScheduleSpec,
    WorkloadSpec,
)

VIDEO_16 = WORKLOAD_PRESETS["video"].model_copy(update={"prompts_per_step": 16})


def plan_7b(
    schedule: str,
    dedup: bool = True,
    workload: WorkloadSpec = VIDEO_16,
    hardware: str = "h200x8",
    **kw,
) -> PlanResult:
    return plan_step(
        MODEL_PRESETS["qwen2_5_vl_7b"],
        workload,
        AlgoSpec(),
        HARDWARE_PRESETS[hardware],
        ScheduleSpec(name=schedule, dedup=dedup, **kw),
    )


@pytest.fixture(scope="module")
def plans_7b() -> dict[str, PlanResult]:
    return {
        "serial": plan_7b("serial", dedup=False),
        "serial_dedup": plan_7b("serial"),
        "disaggregated": plan_7b("disaggregated"),
        "rollplex": plan_7b("rollplex"),
    }
