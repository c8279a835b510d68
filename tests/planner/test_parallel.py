"""schedule.parallel degrees are checked against the cluster and the model, and training
TP pays for its all-reduces."""

from __future__ import annotations

import pytest

from rollplex.graph.ir import Phase
from rollplex.jobs.pipeline import build_graph, plan_step, rollout_tp_options
from rollplex.planner.cost_model import CostModel
from rollplex.planner.layout import OpTimer, RoleLayout
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec
from rollplex.specs.schedule import ScheduleSpec, check_parallel

M7B, H8 = MODEL_PRESETS["qwen2_5_vl_7b"], HARDWARE_PRESETS["h200x8"]


def sched(**parallel: int) -> ScheduleSpec:
    return ScheduleSpec(name="serial", parallel=parallel)


@pytest.mark.parametrize(
    "tp, words",
    [
        (16, "exceeds the 8 GPUs of one node"),
        (3, "does not divide hardware.num_gpus=8"),
        (8, "does not divide model.num_heads=28"),
    ],
)
def test_bad_train_tp_is_named(tp: int, words: str) -> None:
    with pytest.raises(ValueError, match=r"schedule\.parallel\.train_tp") as err:
        plan_step(M7B, WORKLOAD_PRESETS["image"], AlgoSpec(), H8, sched(train_tp=tp))
    assert words in str(err.value)


def test_kv_heads_may_be_replicated_not_split_unevenly() -> None:
    m32 = MODEL_PRESETS["qwen2_5_vl_32b"]  # 40 heads, 8 KV heads
    check_parallel(sched(train_tp=4), m32, H8)
    m3b = MODEL_PRESETS["qwen2_5_vl_3b"]  # 16 heads, 2 KV heads: TP 4 replicates KV
    check_parallel(sched(train_tp=4, rollout_tp=8), m3b, H8)


def test_rollout_tp_search_skips_degrees_that_split_heads_unevenly() -> None:
    assert 8 not in rollout_tp_options(M7B, H8)  # 28 heads


def test_training_tp_costs_its_all_reduces() -> None:
    w = WORKLOAD_PRESETS["image"]
    _, graph, _ = build_graph(M7B, w, AlgoSpec(), sched())

    def train_comm(tp: int) -> float:
        timer = OpTimer(graph, M7B, w, H8, CostModel(H8), RoleLayout(8, 1), RoleLayout(8, tp))
        ops = [op for op in graph if op.phase is Phase.TRAIN and op.kind != "policy_loss"]
        return sum(timer.time(op).comm_s for op in ops)

    one, four = train_comm(1), train_comm(4)
    assert four > one + 0.01  # seconds of exposed TP all-reduce for a 512-sample step
    tp4 = plan_step(M7B, w, AlgoSpec(), H8, sched(train_tp=4, rollout_tp=1))
    tp1 = plan_step(M7B, w, AlgoSpec(), H8, sched(train_tp=1, rollout_tp=1))
    assert tp4.report.phase_time_s["train"] > tp1.report.phase_time_s["train"]
