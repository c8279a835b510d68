"""The planner's decode_once decision (jobs/reuse_forwards.py): with roles that hand over
activations it plans the step with the rollout's decode as the training response forward,
keeps that plan when it fits and is predicted faster, holds the decode's kept layer outputs
all step (the engine's workspace), and says why when it does not take it."""

from __future__ import annotations

import pytest

from rollplex.jobs.pipeline import PlanResult
from rollplex.specs import HARDWARE_PRESETS, ParallelSpec, ScheduleSpec
from rollplex.specs.roles import FSDP_TRAINER, TORCH_ROLLOUT, TORCH_SCORER, VLLM_ROLLOUT
from tests.planner.test_prefill_once_plan import H200, VIDEO, _plan, _step, _workload


def _kept(r: PlanResult) -> bool:
    return any(op.kind == "attach_response" for op in r.graph)


def _long(name: str):
    """Issue 31's long responses (8 frames, G=8, mean 448) beside the presets."""
    if name != "long_responses":
        return _workload(name)
    rl = VIDEO.response_length.model_copy(update={"mean": 448.0, "max": 1024})
    return VIDEO.model_copy(
        update={"frames": 8, "prompts_per_step": 4, "group_size": 8, "response_length": rl}
    )


@pytest.mark.parametrize("prefill_once", [True, False], ids=["with_prefill_once", "alone"])
@pytest.mark.parametrize("schedule", ["serial", "rollplex"])
@pytest.mark.parametrize("workload", ["image", "video", "dense_video", "long_responses"])
@pytest.mark.parametrize("model", ["qwen2_5_vl_3b", "qwen2_5_vl_7b"])
def test_the_response_forward_is_saved_and_the_outputs_held_to_the_backward(
    model, workload, schedule, prefill_once
):
    load = _long(workload)
    base = ScheduleSpec(name=schedule, prefill_once=prefill_once)
    off = _plan(model, load, base.model_copy(update={"decode_once": False}))
    on = _plan(model, load, base)
    assert not _kept(off)
    if not _kept(on):  # 7B on one H200: 6 GiB more through the optimizer's peak
        assert model == "qwen2_5_vl_7b", on.plan.notes
        assert any(n.startswith("decode once not taken: holding") for n in on.plan.notes)
        assert on.plan.step_time_s == off.plan.step_time_s
        return
    notes = [n for n in on.plan.notes if n.startswith(("prefill once: ", "decode once: "))]
    assert notes[-1].startswith("decode once: ") and len(notes) == 1 + prefill_once
    assert on.plan.step_time_s < off.plan.step_time_s
    # the training response forward's time is gone (the LM head is what is left)
    forward = _step(off, "train.logprob_response").solo_s
    assert _step(on, "train.logprob_response").solo_s < 0.5 * forward
    assert off.plan.step_time_s - on.plan.step_time_s > 0.3 * forward
    # the kept outputs live in the engine's workspace, which it keeps across steps: held
    # all step, through the optimizer step (where 7B's peak is), not only to the backward
    steps = on.plan.devices[0].steps
    (slot,) = [s for s in on.plan.devices[0].slots if s.value == "rollout.decode.kept"]
    kept = on.graph.values[slot.value]
    assert slot.size == kept.nbytes  # one GPU: every row's layer outputs, at the cap
    assert slot.first <= min(s.index for s in steps)
    assert slot.last >= _step(on, "update.optimizer_step").index


@pytest.mark.parametrize(
    ("rollout", "trainer"),
    [(VLLM_ROLLOUT, TORCH_SCORER), (TORCH_ROLLOUT, FSDP_TRAINER), (None, None)],
    ids=["vllm_rollout", "fsdp_trainer", "roles_unknown"],
)
@pytest.mark.parametrize("workload", ["image", "dense_video"])
def test_roles_that_cannot_export_keep_todays_forward(workload, rollout, trainer):
    r = _plan("qwen2_5_vl_3b", _workload(workload), ScheduleSpec(name="serial"), rollout, trainer)
    assert not _kept(r)
    assert not any("decode once" in n for n in r.plan.notes)
    assert any(op.kind == "logprob_response" and op.phase.value == "train" for op in r.graph)


def test_a_rollout_tp_other_than_the_trainers_is_not_planned():
    schedule = ScheduleSpec(name="serial", parallel=ParallelSpec(rollout_tp=2))
    r = _plan("qwen2_5_vl_7b", VIDEO, schedule, hw=HARDWARE_PRESETS["h200x8"])
    assert not _kept(r)
    assert any("decode once not planned: rollout TP 2" in n for n in r.plan.notes)


def test_the_held_bytes_are_traded_against_the_saved_forward():
    """Under budgets between the two plans' peaks: halfway, holding the kept outputs fits
    by moving part of AdamW's state (idle at the peak) and is faster than the forward;
    a tenth of the way up, it does not fit (or needs offloads that cost more than the
    forward saves): today's forward is kept, and the plan says why. With the forward fused
    into each micro-batch's backward, the forward holds one micro-batch's activations
    where decode once holds every row's."""
    load = _workload("video").model_copy(update={"prompts_per_step": 8})
    model = "qwen2_5_vl_3b"
    schedule = ScheduleSpec(name="serial", prefill_once=False, train_micro_fused=True)
    off = _plan(model, load, schedule.model_copy(update={"decode_once": False}))
    on = _plan(model, load, schedule)
    assert _kept(on) and on.plan.peak_bytes_per_gpu > off.plan.peak_bytes_per_gpu
    gap = on.plan.peak_bytes_per_gpu - off.plan.peak_bytes_per_gpu

    def under(share: float):
        hbm = (off.plan.peak_bytes_per_gpu + share * gap) / 2**30
        return _plan(model, load, schedule, hw=H200.model_copy(update={"hbm_gib": hbm}))

    half = under(0.5)
    assert _kept(half) and half.plan.step_time_s < off.plan.step_time_s
    moved = [s for s in half.plan.all_steps() if s.kind == "offload" and s.op == "policy.adam"]
    assert moved and 0 < moved[0].share < 1
    tight = under(0.1)
    assert not _kept(tight)
    assert tight.plan.step_time_s == pytest.approx(off.plan.step_time_s)
    assert any(n.startswith("decode once not taken") for n in tight.plan.notes)


def test_the_disaggregated_schedule_keeps_its_forward():
    r = _plan("qwen2_5_vl_7b", VIDEO, ScheduleSpec(name="disaggregated"),
              hw=HARDWARE_PRESETS["h200x8"])  # fmt: skip
    assert not _kept(r)


def test_a_plan_that_would_offload_the_kept_outputs_is_not_taken(monkeypatch):
    """The kept outputs live in the engine's workspace: offloading them frees nothing
    (and the runtime cannot move them), so such a plan keeps today's forward."""
    from dataclasses import replace

    import rollplex.jobs.reuse_forwards as chooser

    real = chooser.plan_graph

    def offloading(graph, *args, **kwargs):
        plan = real(graph, *args, **kwargs)
        dev = plan.devices[0]
        last = dev.steps[-1]
        dev.steps.append(replace(last, index=last.index + 1, op="rollout.decode.kept",
                                 kind="offload"))  # fmt: skip
        return plan

    monkeypatch.setattr(chooser, "plan_graph", offloading)
    r = _plan("qwen2_5_vl_3b", _workload("image"), ScheduleSpec(name="serial"))
    assert not _kept(r)
    assert any("offloading rollout.decode.kept" in n for n in r.plan.notes)


@pytest.mark.parametrize("fraction", [0.75, 0.9, 1.0])
def test_decode_once_never_narrows_what_fits(fraction):
    """3B image GRPO at 8 prompts on one H100-like GPU, at fractions of the roomy peak
    without decode once: wherever the step without it fits, the step with it fits too and
    is no slower. (Until AdamW's state could wait on host through the backward, the plan
    with its own response forward missed the H100 by 1.2 GiB at 16 prompts and only decode
    once fitted: the planner tries the reuse before enforcing the budget.)"""
    from rollplex.jobs.pipeline import plan_step
    from rollplex.planner.residency import PlanOverBudget
    from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec

    w = WORKLOAD_PRESETS["image"].model_copy(update={"prompts_per_step": 8})
    caps = {"rollout": TORCH_ROLLOUT, "trainer": TORCH_SCORER}

    def plan(hbm_gib: float, decode_once: bool):
        hw = HARDWARE_PRESETS["h100"].model_copy(update={"hbm_gib": hbm_gib, "hbm_reserve": 0})
        sched = ScheduleSpec(name="rollplex", decode_once=decode_once)
        try:
            return plan_step(
                MODEL_PRESETS["qwen2_5_vl_3b"], w, AlgoSpec(name="grpo"), hw, sched, **caps
            )
        except PlanOverBudget:
            return None

    roomy = plan(1000.0, False).plan.peak_bytes_per_gpu / 2**30
    off, on = plan(fraction * roomy, False), plan(fraction * roomy, True)
    assert off is not None  # every fraction here fits (0.75 and 0.9 by offloading)
    assert on is not None and on.plan.step_time_s <= off.plan.step_time_s * (1 + 1e-9)
    if fraction == 1.0:
        assert _kept(on) and any(n.startswith("decode once: ") for n in on.plan.notes)
