"""Every op reports the weights version it read; a plan that would read stale weights, or
a rollout whose weight sync is missing, stops with an error instead of training off-policy."""

from __future__ import annotations

import copy

import pytest

from rollplex.backends.base import BackendError
from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.graph.ir import Op, Phase, Value, ValueKind
from rollplex.jobs.pipeline import plan_step
from rollplex.planner.plan import Step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import ScheduleSpec
from tests.runtime.conftest import ALGO, CPU, MODEL, WORKLOAD, cached_run


def test_piggybacked_prefix_reads_the_decode_weights():
    run = cached_run(ScheduleSpec(name="rollplex", overlap="piggyback"))
    for k, r in enumerate(run.results):
        reads = {m.step.name: m.reads.get("weights") for m in r.steps}
        decode = {v for n, v in reads.items() if n.startswith("rollout.decode")}
        assert decode == {f"policy@{k}"}
        assert reads["train.logprob_prefix"] == f"policy@{k}"
        assert reads["update.weight_sync"] == f"policy@{k + 1}"  # the next step's weights


def _executor(plan, graph):
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    return Executor(plan, graph, backend), TaskData(MODEL, WORKLOAD, seed=0)


def test_a_read_after_the_in_place_update_is_refused():
    planned = plan_step(MODEL, WORKLOAD, ALGO, CPU, ScheduleSpec(name="serial"))
    plan, graph = copy.deepcopy(planned.plan), planned.graph.copy()
    # A (user-written) op that reads policy.weights after the optimizer step updated them
    # in place: it would compute with policy@1 while the graph says policy@0.
    late = graph.ops["train.logprob_prefix"]
    graph.add_value(Value("late.kv", (1,), "float32", ValueKind.KV_CACHE, "policy@0"))
    graph.add_op(
        Op(
            "update.late_prefix",
            "logprob_prefix",
            Phase.TRAIN,
            {p: late.inputs[p] for p in ("features", "text", "weights")},
            {"kv": "late.kv"},
        )
    )
    dev = plan.devices[0]
    opt = next(s for s in dev.steps if s.kind == "optimizer_step")
    step = Step(
        1 + max(s.index for s in dev.steps),
        "update.late_prefix",
        "logprob_prefix",
        "train",
        0,
        start_s=opt.end_s,
        end_s=opt.end_s,
        weights_version="policy@0",
    )
    dev.steps.append(step)
    order = dev.streams[0].steps
    order.insert(order.index(opt.index) + 1, step.index)
    ex, data = _executor(plan, graph)
    # Frees of its inputs (planned before it) wait for it, and say so.
    assert any(
        "rollout.vision_encode.features" in n and "update.late_prefix" in n for n in ex.notes
    )
    with pytest.raises(BackendError, match=r"reads policy@0, but the parameters were updated"):
        ex.run_step(0, data.step(0))


def test_a_missing_weight_sync_is_refused():
    planned = plan_step(MODEL, WORKLOAD, ALGO, CPU, ScheduleSpec(name="serial"))
    plan = copy.deepcopy(planned.plan)
    dev = plan.devices[0]
    sync = next(s for s in dev.steps if s.kind == "weight_sync")
    dev.steps.remove(sync)
    dev.streams[sync.stream].steps.remove(sync.index)
    ex, data = _executor(plan, planned.graph)
    ex.run_step(0, data.step(0))
    with pytest.raises(BackendError, match="a weight_sync is missing"):
        ex.run_step(1, data.step(1))
