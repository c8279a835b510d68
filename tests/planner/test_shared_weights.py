"""A colocated rollout that aliases the trainer's weights is charged only the bytes the
layout algebra rebuilds (planner/shared_weights.py); an engine's own copy, the whole shard."""

from __future__ import annotations

import math

import pytest

from rollplex.graph.ir import Value, ValueKind
from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.planner.api import _sizers
from rollplex.planner.cost_model import CostModel
from rollplex.planner.lifetimes import device_lifetimes
from rollplex.planner.plan import DevicePlan
from rollplex.planner.schedules import PlanningContext
from rollplex.planner.shared_weights import (
    MAX_EXACT_GPUS,
    rollout_copy_bytes,
    shared_weights,
    towers_of,
)
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ScheduleSpec,
)
from rollplex.specs.roles import VLLM_ROLLOUT
from rollplex.specs.weights import WeightsSpec
from rollplex.weights import build_sharing

from .conftest import VIDEO_16

M32 = MODEL_PRESETS["qwen2_5_vl_32b"]


def _workload(name: str):
    # 32B on 8 GPUs at the video preset's 128 prompts needs 180 GiB per GPU: every training
    # micro-batch's saved inputs wait for the backward. The sharing checks need a plan.
    return VIDEO_16 if name == "video" else WORKLOAD_PRESETS[name]


def _plan(model: str, workload: str, hardware: str, tp: int | None, caps=None) -> PlanResult:
    sched = ScheduleSpec(name="serial", parallel={"rollout_tp": tp})
    return plan_step(
        MODEL_PRESETS[model],
        _workload(workload),
        AlgoSpec(),
        HARDWARE_PRESETS[hardware],
        sched,
        rollout=caps,
    )


def _copies(dev: DevicePlan) -> dict[str, int]:
    return {s.value: s.size for s in dev.slots if s.value_kind == "rollout_weights"}


def _rebuild(model, fsdp: int, tp: int, tower: str) -> int:
    """The most any GPU rebuilds of `tower`, from the full model's algebra (what `rollplex
    weights` computes), independently of the planner's one-layer shortcut."""
    ws = WeightsSpec(train_fsdp=fsdp, rollout_tp=tp, dtype=model.dtype, train_dtype=model.dtype)
    s = build_sharing(model, ws)
    return max(
        sum(
            sh.rebuild_bytes * n
            for sh, n in s.class_shares(g)
            if s.tensors[sh.tensor].tower == tower
        )
        for g in range(fsdp)
    )


def test_one_gpu_rollout_copy_costs_no_extra_bytes() -> None:
    r = _plan("tiny", "tiny", "cpu", None)
    (dev,) = r.plan.devices
    copies = _copies(dev)
    assert {
        "policy.weights@rollout",
        "policy.weights@rollout.next",
        "vision.weights@rollout",
    } <= set(copies)
    assert set(copies.values()) == {0}


def test_fsdp8_rollout_tp8_32b_charges_the_algebras_rebuild_bytes() -> None:
    r = _plan("qwen2_5_vl_32b", "video", "h200x8", 8)
    (dev,) = r.plan.devices
    copies, g = _copies(dev), r.graph
    llm, vision = _rebuild(M32, 8, 8, "llm"), _rebuild(M32, 8, 8, "vision")
    assert copies["policy.weights@rollout"] == copies["policy.weights@rollout.next"] == llm
    assert copies["vision.weights@rollout"] == vision
    # the old charge was a whole TP shard of the LLM (7.6 GiB); aligned layouts share ~all
    assert llm < g.values["policy.weights"].nbytes / 8 / 1000
    # vLLM's vision tower is replicated at TP 8 (3420 % 8): more than a 1/8 shard
    assert vision > math.ceil(g.values["vision.weights"].nbytes / 8)


def test_engine_copy_still_costs_the_full_shard() -> None:
    r = _plan("qwen2_5_vl_32b", "video", "h200x8", 8, caps=VLLM_ROLLOUT)
    (dev,) = r.plan.devices
    copies, g = _copies(dev), r.graph
    for name in ("policy.weights", "vision.weights"):
        assert copies[f"{name}@rollout"] == math.ceil(g.values[name].nbytes / 8)


@pytest.mark.parametrize(
    "model, fsdp, tp", [("qwen2_5_vl_32b", 8, 4), ("qwen2_5_vl_7b", 8, 4), ("qwen2_5_vl_3b", 4, 2)]
)
def test_one_layer_shortcut_equals_the_full_models_algebra(model: str, fsdp: int, tp: int) -> None:
    spec = MODEL_PRESETS[model]
    shared = shared_weights(spec, fsdp, 1, tp)
    assert shared is not None
    for tower in ("llm", "vision"):
        assert shared.rebuild_bytes((tower,)) == _rebuild(spec, fsdp, tp, tower)


def test_fsdp_over_tp_layouts_share_at_most_tp_over_gpus() -> None:
    """FSDP 8 vs rollout TP 4 on 32B: a GPU holds 1/8 of the weights and needs 1/4, so at
    least half of the LLM shard is rebuilt, and the algebra gets that bound exactly."""
    shared = shared_weights(M32, 8, 1, 4)
    assert shared is not None
    full = max(s.full for s in shared.per_gpu["llm"])
    assert shared.rebuild_bytes(("llm",)) == pytest.approx(full / 2, rel=0.01)


def test_unanswered_layouts_charge_the_full_shard() -> None:
    v = Value("policy.weights", (M32.llm_param_count(),), M32.dtype, ValueKind.WEIGHTS)
    full = math.ceil(v.nbytes / 8)
    assert towers_of(M32, v) == ("llm",)
    assert rollout_copy_bytes(M32, v, MAX_EXACT_GPUS * 2, 1, 8, aliased=True) == full
    assert rollout_copy_bytes(M32, v, 8, 3, 8, aliased=True) == full  # 3 does not divide 8
    odd = Value("other.weights", (12345,), M32.dtype, ValueKind.WEIGHTS)
    assert rollout_copy_bytes(M32, odd, 8, 1, 8, aliased=True) == math.ceil(odd.nbytes / 8)
    assert rollout_copy_bytes(M32, v, 8, 1, 8, aliased=False) == full
    assert rollout_copy_bytes(M32, v, 8, 1, 8, aliased=True) < full


def test_size_bound_still_covers_every_record() -> None:
    """`size_bound` lets settling skip the lifetimes; the replicated vision rebuild is
    larger than a TP shard, so the bound must take the larger of the two."""
    r = _plan("qwen2_5_vl_32b", "video", "h200x8", 8)
    sched = ScheduleSpec(name="serial", parallel={"rollout_tp": 8})
    ctx = PlanningContext(r.graph, M32, _workload("video"), HARDWARE_PRESETS["h200x8"], sched, None)
    (dev,) = r.plan.devices
    sizer = _sizers(r.plan, ctx)[dev.name]
    lives = device_lifetimes(r.graph, dev, sizer, True)
    records = sum(lf.record.size for lf in lives if lf.kind != "scratch")
    assert sizer.size_bound() >= records


def test_aliased_weight_sync_prices_the_bytes_that_move() -> None:
    one = _plan("tiny", "tiny", "cpu", None)
    eight = _plan("qwen2_5_vl_32b", "video", "h200x8", 8)
    engine = _plan("qwen2_5_vl_32b", "video", "h200x8", 8, caps=VLLM_ROLLOUT)

    def sync_s(r: PlanResult) -> float:
        return next(s.solo_s for d in r.plan.devices for s in d.steps if s.kind == "weight_sync")

    hw = HARDWARE_PRESETS["h200x8"]
    cm = CostModel(hw)
    assert sync_s(one) == pytest.approx(CostModel(HARDWARE_PRESETS["cpu"]).launch_s)
    shared = shared_weights(M32, 8, 1, 8)
    assert shared is not None
    moves = shared.sync_bytes(("llm",))
    want = max(r / (hw.nvlink_gbps * 1e9) + 2 * c / (hw.hbm_bandwidth_gbps * 1e9) for r, c in moves)
    assert sync_s(eight) == pytest.approx(want + cm.launch_s)
    # the old price of an alias sync: every byte of the shard but the local 1/8 over NVLink
    full = eight.graph.values["policy.weights"].nbytes / 8
    assert sync_s(eight) < cm.transfer_s(full * 7 / 8, hw.nvlink_gbps) / 100
    assert sync_s(engine) == pytest.approx(cm.transfer_s(full, hw.nvlink_gbps))


def test_the_plan_says_what_the_rollout_copy_costs() -> None:
    torch = _plan("qwen2_5_vl_32b", "video", "h200x8", 8).plan.notes
    (note,) = [n for n in torch if n.startswith("rollout weights aliased")]
    assert "(FSDP 8 x TP 1 vs rollout TP 8, vision=replicated): 1.12 GiB per GPU rebuilt" in note
    engine = _plan("qwen2_5_vl_32b", "video", "h200x8", 8, caps=VLLM_ROLLOUT).plan.notes
    assert not any(n.startswith("rollout weights aliased") for n in engine)
