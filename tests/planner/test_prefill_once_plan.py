"""The planner's prefill_once decision (jobs/pipeline.py): with roles that hand over
activations it plans the step with the rollout's prefill as the training prefix forward,
keeps that plan when it fits and is predicted faster, holds the export from the prefill
to the backward (across the decode), and says why when it does not take it."""

from __future__ import annotations

import pytest

from rollplex.jobs.pipeline import PlanResult, plan_step
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ParallelSpec,
    ScheduleSpec,
    WorkloadSpec,
)
from rollplex.specs.roles import (
    FSDP_TRAINER,
    TORCH_ROLLOUT,
    TORCH_SCORER,
    VLLM_ROLLOUT,
)

H200 = HARDWARE_PRESETS["h200"]
VIDEO = WORKLOAD_PRESETS["video"]


def _workload(name: str) -> WorkloadSpec:
    if name == "dense_video":  # issue 31's: 32 frames of 448x448, mean response 64
        rl = VIDEO.response_length.model_copy(update={"mean": 64.0, "max": 256})
        return VIDEO.model_copy(
            update={"frames": 32, "height": 448, "width": 448, "prompts_per_step": 4,
                    "group_size": 8, "response_length": rl}
        )  # fmt: skip
    return WORKLOAD_PRESETS[name].model_copy(update={"prompts_per_step": 4})


def _plan(model, workload, schedule, rollout=TORCH_ROLLOUT, trainer=TORCH_SCORER, hw=H200):
    return plan_step(
        MODEL_PRESETS[model], workload, AlgoSpec(), hw, schedule, rollout=rollout, trainer=trainer
    )


def _attached(r: PlanResult) -> bool:
    return any(op.kind == "attach_prefix" for op in r.graph)


def _step(r: PlanResult, op: str):
    (step,) = [s for s in r.plan.devices[0].steps if s.op == op]
    return step


@pytest.mark.parametrize("schedule", ["serial", "rollplex"])
@pytest.mark.parametrize("workload", ["image", "video", "dense_video"])
@pytest.mark.parametrize("model", ["qwen2_5_vl_3b", "qwen2_5_vl_7b"])
def test_the_forward_is_saved_and_the_export_held_across_the_decode(model, workload, schedule):
    load = _workload(workload)
    off = _plan(model, load, ScheduleSpec(name=schedule, prefill_once=False))
    on = _plan(model, load, ScheduleSpec(name=schedule))
    assert not _attached(off) and _attached(on), on.plan.notes
    assert on.plan.notes[0].startswith("prefill once: ")
    assert on.plan.step_time_s < off.plan.step_time_s
    # the training prefix forward's time is gone (an attach: a K/V copy and the head)
    forward = _step(off, "train.logprob_prefix").solo_s
    assert _step(on, "train.logprob_prefix").solo_s < 0.1 * forward
    assert off.plan.step_time_s - on.plan.step_time_s > 0.5 * forward
    # the export lives from the prefill through the decode to the backward
    prefill, decode = _step(on, "rollout.prefix_prefill"), _step(on, "rollout.decode")
    backward = _step(on, "train.backward")
    (slot,) = [s for s in on.plan.devices[0].slots if s.value == "rollout.prefix_prefill.exported"]
    exported = on.graph.values[slot.value]
    assert slot.size == exported.nbytes  # one GPU: every row's layer inputs and K/V
    assert slot.first <= prefill.index < decode.index < backward.index <= slot.last


@pytest.mark.parametrize(
    ("rollout", "trainer"),
    [(VLLM_ROLLOUT, TORCH_SCORER), (TORCH_ROLLOUT, FSDP_TRAINER), (None, None)],
    ids=["vllm_rollout", "fsdp_trainer", "roles_unknown"],
)
@pytest.mark.parametrize("workload", ["image", "dense_video"])
def test_roles_that_cannot_export_keep_todays_forward(workload, rollout, trainer):
    r = _plan("qwen2_5_vl_3b", _workload(workload), ScheduleSpec(name="serial"), rollout, trainer)
    assert not _attached(r)
    assert not any("prefill once" in n for n in r.plan.notes)
    trains = [op for op in r.graph if op.kind == "logprob_prefix" and op.phase.value == "train"]
    assert trains or rollout is VLLM_ROLLOUT  # vLLM: no rollout features for it to share


def test_a_rollout_tp_other_than_the_trainers_is_not_planned():
    schedule = ScheduleSpec(name="serial", parallel=ParallelSpec(rollout_tp=2))
    r = _plan("qwen2_5_vl_7b", VIDEO, schedule, hw=HARDWARE_PRESETS["h200x8"])
    assert not _attached(r)
    assert any("rollout TP 2 differs from training TP 1" in n for n in r.plan.notes)


@pytest.mark.parametrize("write_back", ["step_end", "auto"])
def test_the_held_bytes_are_traded_against_the_saved_forward(write_back):
    """Over budgets from the forward plan's peak down to the last where it still fits
    (23 GiB under, neither fits), with AdamW's write-back at the step's end or the next
    step's start: prefill once is taken only where its plan fits and is faster than keeping
    the forward (moves included), and where it is not taken the plan says why. At the
    last budget it is taken, by moving part of AdamW's state: 6.6 GiB under was where the
    export stopped fitting while AdamW's state moved only whole."""
    load = _workload("video").model_copy(update={"prompts_per_step": 8})
    # prefill once alone: decode once (on by default) would hold its own bytes in both plans
    model = "qwen2_5_vl_3b"
    schedule = ScheduleSpec(name="serial", decode_once=False, write_back=write_back)
    forward = schedule.model_copy(update={"prefill_once": False})
    peak = _plan(model, load, forward).plan.peak_bytes_per_gpu / 2**30
    taken = []
    for under in (0.0, 2.0, 4.0, 6.0, 7.5, 13.0, 21.0):  # GiB under the forward's roomy peak
        hw = H200.model_copy(update={"hbm_gib": peak - under, "hbm_reserve": 0.0})
        on, off = _plan(model, load, schedule, hw=hw), _plan(model, load, forward, hw=hw)
        assert on.plan.fits_budget and off.plan.fits_budget
        if _attached(on):
            assert on.plan.step_time_s < off.plan.step_time_s
        else:
            assert on.plan.step_time_s == pytest.approx(off.plan.step_time_s)
            assert any(n.startswith("prefill once not taken") for n in on.plan.notes)
        taken.append(_attached(on))
    assert taken[0] and taken[-1]
    moved = [s for s in on.plan.all_steps() if s.kind == "offload" and s.op == "policy.adam"]
    assert moved and 0 < moved[0].share < 1


def test_the_disaggregated_schedule_keeps_its_forward():
    r = _plan("qwen2_5_vl_7b", VIDEO, ScheduleSpec(name="disaggregated"),
              hw=HARDWARE_PRESETS["h200x8"])  # fmt: skip
    assert not _attached(r)
