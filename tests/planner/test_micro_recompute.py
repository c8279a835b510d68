"""`schedule.train_micro_recompute`: the training forward over responses keeps nothing for
the backward, which runs each micro-batch's forward again, one at a time. The plan prices
exactly that (no saved inputs between the steps, one micro-batch's inside the backward, a
forward more of time), over models x workloads x prompt counts; a step refused for its
saved inputs fits with it; the CPU run trains what the plain run trains, holding less."""

from __future__ import annotations

import pytest
import torch

from rollplex.jobs.pipeline import plan_step
from rollplex.planner.residency import PlanOverBudget
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from rollplex.specs.roles import TORCH_ROLLOUT
from tests.runtime.conftest import run_schedule

GIB = 1 << 30


def _plan(model: str, workload: str, prompts: int, recompute: bool, name: str = "serial"):
    w = WORKLOAD_PRESETS[workload].model_copy(update={"prompts_per_step": prompts})
    return plan_step(
        MODEL_PRESETS[model],
        w,
        AlgoSpec(),
        HARDWARE_PRESETS["h200x8"],
        ScheduleSpec(name=name, train_micro_recompute=recompute),
        rollout=TORCH_ROLLOUT,
        enforce_budget=False,
    ).plan


def _slot(plan, value: str) -> int:
    return sum(s.size for d in plan.devices for s in d.slots if s.value == value)


def _step(plan, name: str):
    (step,) = [s for s in plan.all_steps() if s.name == name]
    return step


@pytest.mark.parametrize("model", ["qwen2_5_vl_3b", "qwen2_5_vl_7b"])
@pytest.mark.parametrize(("workload", "prompts"), [("video", 32), ("video", 128), ("image", 256)])
@pytest.mark.parametrize("name", ["serial", "rollplex"])
def test_the_plan_prices_one_micro_batch_at_a_time_and_a_forward_more(
    model, workload, prompts, name
):
    plain, again = (_plan(model, workload, prompts, r, name) for r in (False, True))
    assert again.meta["train_micro_recompute"] and not plain.meta["train_micro_recompute"]
    saved = "train.logprob_response.saved"
    assert _slot(plain, saved) > 0 and _slot(again, saved) == 0
    back_plain, back_again = _step(plain, "train.backward"), _step(again, "train.backward")
    forward = _step(plain, "train.logprob_response")
    extra = back_again.solo_s - back_plain.solo_s
    assert 0.5 * forward.solo_s < extra < 1.5 * forward.solo_s  # one forward more
    # inside the backward: one micro-batch's saved inputs, not all of them, and the
    # forward's own scratch where it is above the backward's (the LM head's: 2 chunks
    # of logits with the entropy, against the fused backward's 1.5)
    micro = plain.meta["train_micro_batches"]
    grown = back_again.scratch_bytes - back_plain.scratch_bytes
    above = max(0, forward.scratch_bytes - back_plain.scratch_bytes)
    assert 0 < grown <= _slot(plain, saved) / micro * 1.01 + above + 1
    assert again.peak_bytes_per_gpu <= plain.peak_bytes_per_gpu


def test_a_step_refused_for_its_saved_inputs_fits_with_recompute():
    w = WORKLOAD_PRESETS["image"].model_copy(update={"prompts_per_step": 80})
    args = (MODEL_PRESETS["qwen2_5_vl_3b"], w, AlgoSpec(), HARDWARE_PRESETS["h200"])
    with pytest.raises(PlanOverBudget, match="train_micro_fused=true"):
        plan_step(*args, ScheduleSpec(name="serial"), rollout=TORCH_ROLLOUT)
    fits = plan_step(*args, ScheduleSpec(name="serial", train_micro_recompute=True))
    assert fits.plan.fits_budget
    fused = plan_step(*args, ScheduleSpec(name="serial", train_micro_fused=True))
    assert fused.plan.fits_budget  # the same memory, the forward not run twice
    assert fused.plan.step_time_s < fits.plan.step_time_s


def test_the_cpu_run_trains_the_same_and_holds_less():
    plain = run_schedule(ScheduleSpec(name="serial"), steps=2)
    again = run_schedule(ScheduleSpec(name="serial", train_micro_recompute=True), steps=2)
    assert again.backend.trainer.micro_recompute and not plain.backend.trainer.micro_recompute
    a, b = plain.params(), again.params()
    for n in a:  # the same forward twice: the backward's graph is the plain run's
        torch.testing.assert_close(b[n], a[n], atol=1e-6, rtol=0, msg=n)

    def held(run, value: str) -> int:  # resident bytes the executor saw after the forward
        (m,) = [m for m in run.results[-1].steps if m.step.name == "train.logprob_response"]
        return m.resident_bytes

    assert held(again, "") < held(plain, "")
    for run in (plain, again):
        peak = max(m.resident_bytes for m in run.results[-1].steps)
        assert peak <= run.planned.plan.devices[0].peak_bytes
