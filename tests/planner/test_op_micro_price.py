"""The forwards the runtime cuts into micro-batches of its own (ops/micro_batches.py
`op_micro_batches`: vision, prefix forwards, no-grad scoring) are priced in exactly those:
every plan step the plan says runs in `count` micro-batches has the count of the one rule,
the runtime's ranges of its units, and the scratch of the largest range (not the
average); every other such step, and a forward that cannot be cut, is priced whole. On a
grid of presets x workloads x schedules (verl-like = serial, no dedup, fused micro-batches)
x GPUs. `plan.json` carries the counts, and a bad one is refused by name."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from rollplex.graph.ir import Phase
from rollplex.jobs.pipeline import plan_step
from rollplex.ops.costs import op_cost
from rollplex.ops.micro_batches import (
    OP_MICRO_KINDS,
    largest_share,
    micro_ranges,
    op_micro_batches,
    op_units,
)
from rollplex.planner.cost_model import CostModel
from rollplex.planner.plan import dump_plan
from rollplex.planner.schedules import PlanningContext
from rollplex.planner.validate import PlanError, load_plan, validate_plan
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from rollplex.specs.roles import TORCH_ROLLOUT, TORCH_SCORER

VIDEO = WORKLOAD_PRESETS["video"]
WORKLOADS = {
    # issue 31's dense video: 4 prompts x G=8 of 32 frames 448x448, mean 64 tokens
    "dense-video": VIDEO.model_copy(
        update={
            "prompts_per_step": 4,
            "frames": 32,
            "response_length": VIDEO.response_length.model_copy(update={"mean": 64, "max": 256}),
        }
    ),
    "video-6x3": VIDEO.model_copy(update={"prompts_per_step": 6, "group_size": 3}),
    "image-5x4": WORKLOAD_PRESETS["image"].model_copy(
        update={"prompts_per_step": 5, "group_size": 4}
    ),
}
SCHEDULES = {
    "verl-like": ScheduleSpec(name="serial", dedup=False, train_micro_fused=True),
    "serial+dedup": ScheduleSpec(name="serial"),
    "rollplex-piggyback": ScheduleSpec(name="rollplex", overlap="piggyback"),
    "prefill-once": ScheduleSpec(name="serial", prefill_once=True),  # with torch roles
    "small-micro": ScheduleSpec(name="serial", dedup=False, train_micro_tokens=3000),
}
GRID = [
    (m, w, s, hw)
    for m in ("qwen2_5_vl_3b", "qwen2_5_vl_7b")
    for w in WORKLOADS
    for s in SCHEDULES
    for hw in ("h200", "h200x2")
]


def _plan(model: str, workload: str, schedule: str, hardware: str):
    spec, wl, hw = MODEL_PRESETS[model], WORKLOADS[workload], HARDWARE_PRESETS[hardware]
    sched = SCHEDULES[schedule]
    torch_roles = schedule == "prefill-once"  # roles that export the prefill (prefill_once)
    roles = {"rollout": TORCH_ROLLOUT, "trainer": TORCH_SCORER} if torch_roles else {}
    planned = plan_step(spec, wl, AlgoSpec(), hw, sched, enforce_budget=False, **roles)
    return planned, PlanningContext(planned.graph, spec, wl, hw, sched, CostModel(hw))


@pytest.mark.parametrize(("model", "workload", "schedule", "hardware"), GRID)
def test_each_cut_forward_is_priced_in_the_runtimes_ranges(model, workload, schedule, hardware):
    planned, ctx = _plan(model, workload, schedule, hardware)
    plan, graph = planned.plan, planned.graph
    counts = plan.meta["op_micro_batches"]
    train_gpus = next(len(d.ranks) for d in plan.devices if d.name != "rollout")
    mean = ctx.workload.response_length.mean
    seen, whole = 0, set()
    for dev in plan.devices:
        timer = ctx.timer(dev.tp * dev.dp, train_gpus, dev.tp).inner
        for s in dev.steps:
            op = graph.ops.get(s.op)
            if op is None or op.kind not in OP_MICRO_KINDS or timer._step_count(op) is not None:
                continue  # the trainer's forwards keep its own count (train_micro_batches)
            op_ctx = timer.context(op, s.chunks)
            transient = op_cost(graph, op, op_ctx).transient_bytes  # run whole
            count = counts.get(op.name, 1)
            if s.chunks > 1 or op_units(graph, op, mean) is None:
                assert count == 1, s.name  # a row chunk, or an export: run (and priced) whole
                whole.add("exported" if "exported" in op.outputs else "chunk")
                assert s.scratch_bytes == pytest.approx(transient, rel=1e-6, abs=1), s.name
                continue
            # the one rule, at this step's ranks
            micro_tokens = ctx.schedule.train_micro_tokens
            assert count == op_micro_batches(
                graph, op, op_ctx.dp, micro_tokens, mean, op_ctx.tp, op_ctx.micro_batches
            )
            if op.phase is Phase.ROLLOUT and op_ctx.tp > 1:
                assert count == 1  # a TP group's rows in one call
            units = math.ceil(op_units(graph, op, mean)[0] / op_ctx.dp)
            ranges = micro_ranges(units, count)  # what the runtime runs on a rank
            assert len(ranges) == count <= units
            largest = max(hi - lo for lo, hi in ranges)
            # its largest range's share, which also caps the LM head's chunks (head.py)
            run_ctx = replace(op_ctx, run_share=largest / units)
            transient = op_cost(graph, op, run_ctx).transient_bytes
            assert s.scratch_bytes == pytest.approx(transient * largest / units, rel=1e-6, abs=1)
            assert s.scratch_bytes >= transient / count * (1 - 1e-9)
            seen += count > 1
    if schedule == "verl-like" and workload == "dense-video":
        # issue 31's case: the reference's vision over 32 samples' videos is cut
        vision = [n for n in counts if graph.ops[n].kind == "vision_encode"]
        assert any(graph.ops[n].phase is Phase.REFERENCE for n in vision), counts
    assert seen == len(counts)
    if schedule == "prefill-once" and hardware == "h200":
        assert "exported" in whole  # the prefill that exports for the trainer: one call
    if schedule == "rollplex-piggyback" and workload == "dense-video":
        assert "chunk" in whole  # the training prefix rides the decode in row chunks


def test_the_largest_range_sets_the_scratch_not_the_average():
    assert largest_share(7, 2) == pytest.approx(4 / 7)  # ranges of 3 and 4 units
    assert largest_share(8, 4) == pytest.approx(1 / 4)
    assert largest_share(3, 9) == pytest.approx(1 / 3)  # capped at one unit each


@pytest.fixture(scope="module")
def verl_like():
    return _plan("qwen2_5_vl_7b", "dense-video", "verl-like", "h200")[0]


def test_the_counts_round_trip_through_plan_json(verl_like):
    counts = verl_like.plan.meta["op_micro_batches"]
    assert counts and all(n > 1 for n in counts.values())
    loaded = load_plan(dump_plan(verl_like.plan), verl_like.graph, budget=False)
    assert loaded.meta["op_micro_batches"] == counts


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (
            {"reference.vision_encode": 1},
            r"\['reference.vision_encode'\]=1 must be an integer >= 2",
        ),
        ({"reference.vision_encode": "4"}, r"\['reference.vision_encode'\]='4'"),
        ({"reference.vision_encode": True}, r"\['reference.vision_encode'\]=True"),
        ({"no.such.op": 3}, r"\['no.such.op'\]: no step runs a forward"),
        ({"update.optimizer_step": 3}, r"\['update.optimizer_step'\]: no step runs a forward"),
        ([3], r"meta.op_micro_batches=\[3\] must map op names"),
    ],
)
def test_a_bad_count_is_refused_by_name(verl_like, bad, named):
    text = json.loads(dump_plan(verl_like.plan))
    text["meta"]["op_micro_batches"] = bad
    with pytest.raises(PlanError, match=named):
        load_plan(json.dumps(text), verl_like.graph, budget=False)


def test_a_count_on_a_chunked_op_is_refused():
    planned, _ = _plan("qwen2_5_vl_3b", "dense-video", "rollplex-piggyback", "h200")
    chunked = next(
        s.op
        for d in planned.plan.devices
        for s in d.steps
        if s.chunks > 1 and s.kind in OP_MICRO_KINDS
    )
    planned.plan.meta["op_micro_batches"] = {chunked: 2}
    with pytest.raises(PlanError, match=f"'{chunked}'.*row chunks"):
        validate_plan(planned.plan, planned.graph, budget=False)
