"""The cost model's fixed terms (CostModel.fixed_s, dispatch_s): what each run of a kind
pays beyond its roofline, and the host's time per op. Checked on a grid of shapes and
workloads through the planner: decode pays per layer of each step, the trainer's forward
with grad and backward per micro-batch, every other op once, every op its dispatch; the
bare model has none; a calibration rescales a kind's fixed part with its efficiency, and a
file records the constants that priced it, so a calibration from it rescales that model."""

from __future__ import annotations

import json

import pytest

from rollplex.jobs.pipeline import plan_step
from rollplex.jobs.pricing import _price, pricing_for
from rollplex.ops.rollout_costs import decode_steps
from rollplex.planner.cost_model import CostModel, write_calibration
from rollplex.planner.shipped_calibration import H200, CostConstants
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, AlgoSpec, ScheduleSpec, WorkloadSpec
from rollplex.specs.run import RunSpec
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


def test_a_calibration_rescales_a_kinds_fixed_part_with_its_efficiency():
    cm = CostModel(ROOMY, fixed_s={"backward": 0.2, "decode": 1e-5})
    entries = [{"kind": "backward", "predicted_s": 1.0, "measured_s": 2.0}]
    cal = cm.calibrated_by(entries)
    assert cal.fixed_s["backward"] == pytest.approx(0.4)
    assert cal.fixed_s["decode"] == cm.fixed_s["decode"]  # not measured: kept
    assert cal.eff("backward").compute == pytest.approx(cm.eff("backward").compute / 2)


def test_constants_round_trip_through_a_cost_model():
    bare = CostModel(ROOMY)
    back = CostConstants.of(H200.applied_to(bare))
    assert back.fixed_s == H200.fixed_s and back.dispatch_s == H200.dispatch_s
    assert back.scales.keys() == H200.scales.keys()
    for kind, k in H200.scales.items():
        assert back.scales[kind] == pytest.approx(k)


@pytest.mark.parametrize("priced", [True, False])
def test_a_file_rescales_the_model_that_priced_it(tmp_path, priced):
    """A run priced by the shipped constants whose ops measured what it predicted (an op's
    window holds all but the dispatch gap before it): with the file's `priced_with`,
    calibrating from it gives the shipped model back; a file without it (written before
    the field) rescales the bare model, as it always did."""
    shipped = H200.applied_to(CostModel(HARDWARE_PRESETS["h200"]))
    gap = H200.dispatch_s if priced else 0.0
    entries = [
        {"kind": k, "op": k, "predicted_s": 1.0, "measured_s": 1.0 - gap} for k in H200.scales
    ]
    path = tmp_path / "calibration.json"
    provenance = {"priced_with": H200.as_dict()} if priced else {}
    write_calibration(path, "NVIDIA H200", entries, provenance)
    assert ("priced_with" in json.loads(path.read_text())) is priced
    run = _h200_spec(str(path))
    cm = _price(run).cost_model
    for kind in H200.scales:
        want = shipped.eff(kind) if priced else CostModel(run.hardware).eff(kind)
        assert cm.eff(kind).compute == pytest.approx(want.compute)
    assert cm.fixed_s == (H200.fixed_s if priced else {})
    assert pricing_for(run).source == str(path)


def test_a_no_op_measured_at_a_microsecond_keeps_its_runs_file_loadable(tmp_path):
    """An aliased weight sync moves nothing: its op window measured 1.2 us against a
    prediction that is all dispatch gap (H100 run 28). The run's own calibration.json must
    load for the next run (`calibration=auto`), and the sync's ratio is of its launch."""
    from rollplex.ops.calibration import load_calibration

    predicted = H200.dispatch_s + CostModel(ROOMY).launch_s
    entries = [
        {"kind": "weight_sync", "op": "update.weight_sync", "predicted_s": predicted,
         "measured_s": 1.22e-6},
        {"kind": "backward", "op": "train.backward", "predicted_s": 1.48, "measured_s": 1.42},
    ]  # fmt: skip
    path = tmp_path / "calibration.json"
    write_calibration(path, "NVIDIA H200", entries, {"priced_with": H200.as_dict()})
    scales = load_calibration(path).scales()
    assert scales["weight_sync"] == pytest.approx(20e-6 / 1.22e-6)
    assert scales["backward"] == pytest.approx((1.48 - H200.dispatch_s) / 1.42)
    cm = _price(_h200_spec(str(path))).cost_model
    assert cm.fixed_s["backward"] == pytest.approx(H200.fixed_s["backward"] / scales["backward"])


def _h200_spec(path: str) -> RunSpec:
    from tests.jobs.test_pricing import spec_of

    return spec_of("model=qwen2_5_vl_7b", "hardware=h200", f"calibration={path}")
