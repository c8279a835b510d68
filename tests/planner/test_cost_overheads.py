"""The cost model's fixed terms (CostModel.fixed_s, dispatch_s): what each run of a kind
pays beyond its roofline, and the host's time per op. Checked on a grid of shapes and
workloads through the planner: decode pays per layer of each step, the trainer's forward
with grad and backward per micro-batch, every other op once, every op its dispatch; the
bare model has none."""

from __future__ import annotations

import pytest

from rollplex.jobs.pipeline import plan_step
from rollplex.ops.rollout_costs import decode_steps
from rollplex.planner.cost_model import CostModel
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, AlgoSpec, ScheduleSpec, WorkloadSpec
from rollplex.specs.workload import ResponseLengthSpec

# room for everything: no offload copies, so the plans differ only in their prices
ROOMY = HARDWARE_PRESETS["h200"].model_copy(update={"hbm_gib": 1e4})
SERIAL = ScheduleSpec(name="serial")
FIXED = 0.25  # seconds per run: far above any op's roofline in these tiny steps' gaps


def _workload(frames: int, mean: int) -> WorkloadSpec:
    lengths = ResponseLengthSpec(mean=mean, max=4 * mean, sigma=0.45)
    return WorkloadSpec(
        prompts_per_step=4, group_size=8, frames=frames, height=448, width=448,
        response_length=lengths,
    )  # fmt: skip


GRID = [
    (model, frames, mean)
    for model in ("qwen2_5_vl_3b", "qwen2_5_vl_7b")
    for frames, mean in ((8, 448), (32, 64), (16, 160))
]


def _plan(model: str, workload: WorkloadSpec, cm: CostModel):
    return plan_step(
        MODEL_PRESETS[model], workload, AlgoSpec(), ROOMY, SERIAL, cost_model=cm,
        enforce_budget=False,
    )  # fmt: skip


def _solo(plan) -> dict[str, tuple[str, float]]:
    out: dict[str, tuple[str, float]] = {}
    for dev in plan.devices:
        for s in dev.steps:
            kind, t = out.get(s.op, (s.kind, 0.0))
            out[s.op] = (kind, t + s.solo_s)
    return out


@pytest.mark.parametrize(("model", "frames", "mean"), GRID)
def test_each_kind_pays_its_fixed_seconds_per_run(model, frames, mean):
    workload = _workload(frames, mean)
    bare = CostModel(ROOMY)
    base = _plan(model, workload, bare)
    kinds = {s.kind for d in base.plan.devices for s in d.steps}
    fixed = CostModel(ROOMY, fixed_s={k: FIXED for k in kinds})
    priced = _plan(model, workload, fixed)
    micro = base.plan.meta["train_micro_batches"]
    layers = MODEL_PRESETS[model].num_layers
    before, after = _solo(base.plan), _solo(priced.plan)
    assert before.keys() == after.keys()
    for op, (kind, _) in after.items():
        runs = (after[op][1] - before[op][1]) / FIXED
        if kind == "decode":  # per layer of each of its steps
            graph_op = base.graph.ops[op]
            from rollplex.ops.costs import CostContext

            ctx = CostContext(MODEL_PRESETS[model], workload)
            assert runs == pytest.approx(decode_steps(base.graph, graph_op, ctx) * layers)
        elif op.startswith("train.") and kind in ("logprob_response", "backward"):
            assert runs == pytest.approx(micro)  # the trainer's micro-batches
        elif kind in ("onload", "offload", "weight_sync"):
            assert runs == 0  # copies: priced by the link
        else:
            assert runs == pytest.approx(1)


@pytest.mark.parametrize(("model", "frames", "mean"), GRID)
def test_dispatch_adds_once_per_op_to_a_serial_step(model, frames, mean):
    workload = _workload(frames, mean)
    base = _plan(model, workload, CostModel(ROOMY))
    d = 0.05
    slow = _plan(model, workload, CostModel(ROOMY, dispatch_s=d))
    ops = [s for dev in base.plan.devices for s in dev.steps]
    assert all(s.stream == ops[0].stream for s in ops)  # one stream: every op in the path
    grown = slow.plan.step_time_s - base.plan.step_time_s
    assert grown == pytest.approx(d * len(ops), rel=1e-6)


def test_the_bare_model_has_no_fixed_terms():
    cm = CostModel(ROOMY)
    assert cm.fixed_s == {} and cm.dispatch_s == 0.0
    from rollplex.ops.formulas import Cost

    cost = Cost(flops=1e12, bytes_read=1e9)
    for m in (1, 3):
        t = cm.time("backward", cost, micro_batches=m)
        with_fixed = CostModel(ROOMY, fixed_s={"backward": 0.1}, dispatch_s=0.01)
        u = with_fixed.time("backward", cost, micro_batches=m)
        assert u.seconds - t.seconds == pytest.approx(0.1 * m + 0.01)
        v = with_fixed.time("backward", cost, micro_batches=m, fixed_runs=0)
        assert v.seconds - t.seconds == pytest.approx(0.01)
    with pytest.raises(ValueError, match="fixed_runs"):
        cm.time("decode", cost, fixed_runs=-1)
