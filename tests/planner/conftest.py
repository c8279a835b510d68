from __future__ import annotations

import pytest

from rollplex.algos import build_step
from rollplex.graph.ir import Graph, Op, Value
from rollplex.graph.passes import DEDUP_PASSES, run_passes
from rollplex.jobs.pipeline import PlanResult, plan_step
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
        # every eligible prefix op riding the decode: auto keeps serial+dedup at this
        # workload (the ride is priced to cost more than it saves)
        "rollplex_piggyback": plan_7b("rollplex", overlap="piggyback"),
    }


def replicated(k: int, algo: str = "grpo") -> Graph:
    """K copies of the deduplicated 7B step sharing every external value (weights, prompts):
    K micro-steps of one long step, as bench/planner_scale.py builds them."""
    base, _ = run_passes(
        build_step(MODEL_PRESETS["qwen2_5_vl_7b"], VIDEO_16, AlgoSpec(name=algo)), DEDUP_PASSES
    )
    shared = {n for n, v in base.values.items() if v.external}
    g = Graph([v for n, v in base.values.items() if n in shared])

    def rn(name: str, i: int) -> str:
        return name if name in shared else f"s{i}/{name}"

    for i in range(k):
        for n, v in base.values.items():
            if n not in shared:
                g.add_value(Value(rn(n, i), v.shape, v.dtype, v.kind, v.version, v.external))
        for op in base.ops.values():
            ins = {p: rn(v, i) for p, v in op.inputs.items()}
            outs = {p: rn(v, i) for p, v in op.outputs.items()}
            g.add_op(Op(f"s{i}/{op.name}", op.kind, op.phase, ins, outs, dict(op.attrs)))
    return g
