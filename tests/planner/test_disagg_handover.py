"""The disaggregated plan's hand-over: what it sends to the trainers lives in the rollout
pool until the hand-over step (the rollout ranks issue it after all their own steps) and in
the training pool from that step on, on every preset x workload x pool size tried."""

from __future__ import annotations

import pytest

from rollplex.graph.ir import Phase
from rollplex.jobs.pipeline import plan_step
from rollplex.planner.plan import MemAction
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

# 16 prompts where the preset's count (256 images, 128 videos) would not fit the training
# pool: every training micro-batch's saved inputs wait for the backward.
GRID = [
    ("tiny", "tiny", "cpu", 2, None),
    ("tiny", "tiny", "cpu", 4, None),
    ("qwen2_5_vl_3b", "image", "h200x2", 2, 16),
    ("qwen2_5_vl_7b", "video", "h200x8", 8, None),
    ("qwen2_5_vl_32b", "video", "h200x8", 8, 16),
]


@pytest.mark.parametrize(("model", "workload", "hardware", "gpus", "prompts"), GRID)
def test_handed_over_values_live_across_the_hand_over(model, workload, hardware, gpus, prompts):
    hw = HARDWARE_PRESETS[hardware].model_copy(update={"num_gpus": gpus})
    wl = WORKLOAD_PRESETS[workload]
    r = plan_step(
        MODEL_PRESETS[model],
        wl.model_copy(update={"prompts_per_step": prompts}) if prompts else wl,
        AlgoSpec(),
        hw,
        ScheduleSpec(name="disaggregated"),
    )
    plan, graph = r.plan, r.graph
    (hand,) = [t.step for t in plan.transfers if t.what == "rollout outputs"]
    made = {v for op in graph if op.phase is Phase.ROLLOUT for v in op.outputs.values()}
    read = {v for op in graph if op.phase is not Phase.ROLLOUT for v in op.inputs.values()}
    sent = made & read
    assert sent
    roll, train = (next(d for d in plan.devices if d.name == n) for n in ("rollout", "train"))
    assert all(s.index < hand for s in roll.steps)  # the rollout ranks issue it last
    frees = {e.value: e.at for e in roll.effects if e.action is MemAction.FREE}
    allocs = {e.value: e.at for e in train.effects if e.action is MemAction.ALLOC}
    for v in sent:
        assert frees[v] == hand, v
        assert allocs[v] == hand, v
