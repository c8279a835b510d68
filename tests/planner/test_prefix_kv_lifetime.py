"""The training prefix's K/V live until the backward: each response micro-batch's graph
attends to its prompts' K/V, so autograd holds them until that micro-batch's backward (and
recompute and fused modes run the forward again there). The plan frees them no earlier,
on every schedule and micro-batch mode that reads them with grad; the reference's, read
without grad, go after their last reader."""

from __future__ import annotations

import pytest

from rollplex.jobs.pipeline import plan_step
from rollplex.planner.plan import MemAction
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

SCHEDULES = {
    "separate": ScheduleSpec(name="serial", prefill_once=False, decode_once=False),
    "prefill-once": ScheduleSpec(name="serial", decode_once=False),
    "recompute": ScheduleSpec(name="serial", train_micro_recompute=True, prefill_once=False),
    "fused": ScheduleSpec(name="serial", train_micro_fused=True, prefill_once=False),
    "rollplex": ScheduleSpec(name="rollplex"),
}


def _free_step(plan, value: str) -> int:
    dev = plan.devices[0]
    frees = [e.at for e in dev.effects if e.action is MemAction.FREE and e.value == value]
    assert len(frees) == 1, value
    return frees[0]


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("model", ["tiny", "qwen2_5_vl_3b"])
def test_the_training_prefix_kv_is_freed_after_the_backward(model, name):
    hardware = HARDWARE_PRESETS["cpu" if model == "tiny" else "h200"]
    workload = WORKLOAD_PRESETS["tiny" if model == "tiny" else "video"]
    workload = workload.model_copy(update={"prompts_per_step": 8})
    planned = plan_step(MODEL_PRESETS[model], workload, AlgoSpec(), hardware, SCHEDULES[name])
    graph, plan = planned.graph, planned.plan
    steps = {s.index: s for s in plan.devices[0].steps}
    backward = next(s.index for s in steps.values() if s.op == "train.backward")
    trained = [
        op
        for op in graph.ops.values()
        if op.phase.value == "train" and "kv" in op.inputs and "saved" in op.outputs
    ]
    assert trained, "no training forward reads prefix K/V"
    for op in trained:
        assert _free_step(plan, op.inputs["kv"]) >= backward, (op.name, op.inputs["kv"])
    for op in graph.ops.values():  # the reference's K/V: after their last reader
        if op.phase.value == "reference" and "kv" in op.inputs:
            assert _free_step(plan, op.inputs["kv"]) < backward
