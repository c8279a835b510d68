"""The micro-batch count is priced: each micro-batch of a forward or backward reads the
weights again and launches its kernels again, and `train_micro_recompute` runs each
micro-batch's forward once more. At a fixed response length, smaller micro-batches never
make a step faster at a budget that needs no offloads (models x workloads x schedules x GPU
counts), and past one unit a micro-batch (a prompt's group or a sample for the trainer, a
row for the other forwards) fewer tokens cost nothing more: the runtime runs no more. (With
long-tailed lengths they can: each micro-batch runs to its own longest response, so fewer
rows together pad less; tests/ops/test_padded_width.py holds that pricing.)"""

from __future__ import annotations

import itertools

import pytest

from rollplex.jobs.pipeline import plan_step
from rollplex.ops.formulas import Cost
from rollplex.planner.cost_model import CostModel
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

MICRO_TOKENS = (1 << 24, 16384, 4096, 1024, 256, 16, 1)
SCHEDULES = [
    ScheduleSpec(name="serial", dedup=False),
    ScheduleSpec(name="serial"),
    ScheduleSpec(name="rollplex"),
]


def _plan(model: str, workload: str, gpus: int, schedule: ScheduleSpec, micro: int, **kw):
    w = WORKLOAD_PRESETS[workload]
    fixed = w.response_length.model_copy(update={"distribution": "fixed"})
    w = w.model_copy(update={"prompts_per_step": 2 * gpus, "response_length": fixed})
    roomy = HARDWARE_PRESETS["h200x8"].model_copy(update={"num_gpus": gpus, "hbm_gib": 1e6})
    sched = schedule.model_copy(update={"train_micro_tokens": micro, **kw})
    return plan_step(MODEL_PRESETS[model], w, AlgoSpec(), roomy, sched).plan


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.name}-dedup{s.dedup}")
@pytest.mark.parametrize(
    ("model", "workload", "gpus"),
    [("qwen2_5_vl_7b", "video", 8), ("qwen2_5_vl_3b", "image", 1), ("qwen2_5_vl_7b", "image", 2)],
)
def test_more_micro_batches_never_make_a_step_faster(model, workload, gpus, schedule):
    plans = [_plan(model, workload, gpus, schedule, t) for t in MICRO_TOKENS]
    counts = [p.meta["train_micro_batches"] for p in plans]
    assert counts == sorted(counts) and counts[0] == 1
    for a, b in itertools.pairwise(plans):
        # 2e-5 of a step at most: one count packs the training prefix with its response
        # forward (one weight read), where the next, its prefix cut in the trainer's
        # micro-batches (unpackable), rides the decode's weight reads instead (3B image:
        # 20 us of 0.87 s); the planner packs before it tries rides
        assert a.step_time_s <= b.step_time_s * (1 + 1e-4)
    # the trainer runs at most one micro-batch per unit: a prompt's group (dedup), a sample
    units = 2 * (1 if schedule.dedup else WORKLOAD_PRESETS[workload].group_size)
    assert _count(plans[-1]) == units
    if gpus == 1 or not schedule.dedup:
        # strictly slower where the extra runs show: where FSDP (several GPUs) hides a
        # compute-bound forward's weight reads and launches, the prefix-shared step's two
        # micro-batches a rank cost nothing more (the rollout's TP-group forwards run whole)
        assert plans[-1].step_time_s > plans[0].step_time_s
    # every count is capped at its op's units (ops/micro_batches.py), as the runtime runs
    # it: past one unit a micro-batch everywhere, fewer tokens cost nothing more
    last = plans[-1].meta
    capped = [p for p in plans if p.meta["op_micro_batches"] == last["op_micro_batches"]]
    capped = [p for p in capped if _count(p) == units]
    assert capped and all(p.step_time_s == pytest.approx(plans[-1].step_time_s) for p in capped)


def _count(plan) -> int:
    return plan.meta["train_micro_batches"]


@pytest.mark.parametrize("micro", [16384, 1024, 64])
def test_recompute_costs_a_forward_per_micro_batch(micro: int):
    plain = _plan("qwen2_5_vl_7b", "video", 8, SCHEDULES[1], micro)
    again = _plan("qwen2_5_vl_7b", "video", 8, SCHEDULES[1], micro, train_micro_recompute=True)
    bwd = [next(s for s in p.all_steps() if s.op == "train.backward") for p in (plain, again)]
    assert bwd[1].solo_s > bwd[0].solo_s
    assert again.step_time_s >= plain.step_time_s


def test_cost_model_micro_batches_read_the_weights_and_launch_again():
    hw = HARDWARE_PRESETS["h200"]
    cm = CostModel(hw)
    bw = hw.hbm_bandwidth * cm.eff("logprob").bandwidth
    # weight-bound: 1 GB of weights, little else; m micro-batches read them m times
    cost = Cost(flops=1.0, bytes_read=1.01e9, weight_bytes=1e9)
    for m in (1, 2, 8):
        t = cm.time("logprob", cost, micro_batches=m)
        assert t.memory_s == pytest.approx((1.01e9 + (m - 1) * 1e9) / bw)
    # launch-bound: tiny work, many kernels: m * kernels launches
    small = Cost(flops=1e3, bytes_read=1e3)
    t = cm.time("logprob", small, micro_batches=4, kernels=100)
    assert t.seconds == pytest.approx(400 * cm.launch_s + cm.launch_s)
    assert t.launch_bound_s == pytest.approx(400 * cm.launch_s - max(t.compute_s, t.memory_s))
    # compute-bound work hides both
    big = Cost(flops=1e15, bytes_read=1e9, weight_bytes=1e8)
    assert cm.time("logprob", big, micro_batches=4, kernels=100).seconds == pytest.approx(
        cm.time("logprob", big).seconds
    )
    with pytest.raises(ValueError, match="micro_batches=0"):
        cm.time("logprob", big, micro_batches=0)
