"""The training micro-batch count is one rule (rollplex/ops/micro_batches.py): the count the
plan carries and prices equals the count the torch trainer runs, and the rows each
micro-batch holds (so the widths priced per micro-batch, ops/response_width.py) are the rows
the trainer cuts. On a grid of prompts x G x prefix lengths x `train_micro_tokens` x dedup
x data-parallel ranks; each rank runs its equal slice of the prompts (planner/pools.py), so
one rank's slice runs here under the plan's count."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from rollplex.backends.step import StepConfig
from rollplex.backends.torch import micro as torch_micro
from rollplex.backends.torch.data import TaskData
from rollplex.graph.ir import Phase
from rollplex.jobs.pipeline import plan_step
from rollplex.ops.costs import op_cost
from rollplex.ops.micro_batches import largest_share, trained_forward, trained_units
from rollplex.ops.response_width import micro_batch_rows
from rollplex.planner.cost_model import CostModel
from rollplex.planner.schedules import PlanningContext
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

MODEL, ALGO = MODEL_PRESETS["tiny"], AlgoSpec(lr=1e-3)
TINY = WORKLOAD_PRESETS["tiny"]  # 16 text tokens, a 56x56 image, responses 1..16 (mean 8)
# (prompts, G, data-parallel ranks): uneven splits, one prompt per rank, two ranks
SHAPES = [(4, 4, 1), (3, 2, 1), (6, 2, 2), (2, 3, 2)]
PREFIXES = [{}, {"text_tokens": 48, "height": 112, "width": 112}]
# a rank's step tokens over this: 2.5 (three micro-batches unless the units are fewer),
# or one token a micro-batch (as many as the units allow)
SPLITS = [2.5, math.inf]


def _rank_tokens(workload, dp: int) -> float:
    per_sample = workload.prefix_tokens(MODEL.vision) + workload.response_length.mean
    return workload.samples_per_step / dp * per_sample


@pytest.mark.parametrize("dedup", [True, False], ids=["shared", "per-sample"])
@pytest.mark.parametrize("split", SPLITS, ids=["few", "one-token"])
@pytest.mark.parametrize("prefix", PREFIXES, ids=["short", "long"])
@pytest.mark.parametrize(("prompts", "group", "dp"), SHAPES)
def test_the_planned_count_is_the_count_the_trainer_runs(
    monkeypatch, prompts, group, dp, prefix, split, dedup
):
    workload = TINY.model_copy(update={"prompts_per_step": prompts, "group_size": group, **prefix})
    micro_tokens = max(1, math.floor(_rank_tokens(workload, dp) / split))
    schedule = ScheduleSpec(name="serial", dedup=dedup, train_micro_tokens=micro_tokens)
    hardware = HARDWARE_PRESETS["cpu"].model_copy(update={"num_gpus": dp})
    planned = plan_step(MODEL, workload, ALGO, hardware, schedule)
    count = planned.plan.meta["train_micro_batches"]
    units_run = prompts // dp * (1 if dedup else group)
    assert count == min(units_run, math.ceil(_rank_tokens(workload, dp) / micro_tokens))

    # What the plan prices: the training forward and its backward in `count` micro-batches
    # (each one's scratch), over the rows per micro-batch that set its padded width.
    ctx = PlanningContext(planned.graph, MODEL, workload, hardware, schedule, CostModel(hardware))
    timer = ctx.timer(dp, dp).inner
    graph = planned.graph
    trained = [
        op for op in graph.ops.values() if op.phase is Phase.TRAIN and trained_forward(graph, op)
    ]
    assert {trained_forward(graph, op).kind for op in trained} == {
        "logprob_response" if dedup else "logprob"
    }
    priced_rows = set()
    for op in trained:
        op_ctx = timer.context(op)
        assert op_ctx.micro_batches == count
        units, per_unit = trained_units(graph.inputs_of(trained_forward(graph, op)), op_ctx.dp)
        # a run's scratch: the largest micro-batch's (whole units, uneven past a count that
        # divides them), each formula told that share (the head's chunk cap, per-layer terms)
        share = largest_share(units, count)
        cost = op_cost(graph, op, replace(op_ctx, run_share=share))
        assert timer.time(op).scratch_bytes == pytest.approx(cost.transient_bytes * share)
        priced_rows.add(tuple(micro_batch_rows(units, count, per_unit)))

    # What one rank's trainer runs: its slice of the prompts under the plan's count.
    runs: list[list[int]] = []
    inner = torch_micro.forward_micro_batches

    def recorded(model, ranges, rows_per_unit, *args, **kwargs):
        runs.append([(hi - lo) * rows_per_unit for lo, hi, trains in ranges if trains])
        return inner(model, ranges, rows_per_unit, *args, **kwargs)

    monkeypatch.setattr(torch_micro, "forward_micro_batches", recorded)
    rank = workload.model_copy(update={"prompts_per_step": prompts // dp})
    rank_plan = plan_step(MODEL, rank, ALGO, HARDWARE_PRESETS["cpu"], schedule)
    rank_plan.plan.meta["train_micro_batches"] = count
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    result = Executor(rank_plan.plan, rank_plan.graph, backend).run_step(
        0, TaskData(MODEL, rank, seed=0).step(0)
    )
    assert result.metrics["train_micro_batches"] == count
    assert runs and {tuple(r) for r in runs} == priced_rows
    assert all(len(r) == count for r in runs)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
