"""algo.skip_zero_advantage in the spec and the plan: when it resolves on and what refuses
it, the training forwards that read the advantages (through the dedup, prefill-once and
decode-once rewrites, and each PPO-style mini-batch), and a plan that prices every row, so
that turning it on changes neither the planned time nor the planned peak; the old-logprob
forward of PPO-style updates reads them too (its dead rows are never read)."""

from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from rollplex.graph.ir import Phase
from rollplex.graph.passes import skip_dead_prefix
from rollplex.jobs.pipeline import PlanResult, passes_for, plan_step
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, AlgoSpec, ScheduleSpec
from rollplex.specs.algo import skip_refusal
from rollplex.specs.roles import TORCH_ROLLOUT, TORCH_SCORER, VLLM_ROLLOUT
from tests.planner.test_prefill_once_plan import _workload

FORWARDS = ("logprob", "logprob_response", "attach_response")


def test_null_resolves_on_exactly_where_no_loss_term_reads_a_zero_advantage_row():
    for name, kl, ref, entropy in itertools.product(
        ("grpo", "rloo", "ppo"), (0.0, 0.04), (None, True), (0.0, 0.01)
    ):
        algo = AlgoSpec(name=name, kl_coef=kl, use_reference=ref, entropy_coeff=entropy)
        unread = name != "ppo" and entropy == 0 and not algo.use_reference
        assert algo.skip_zero_advantage is unread, (name, kl, ref, entropy)
        assert (skip_refusal(algo) is None) is (name != "ppo" and entropy == 0 and kl == 0)
        if skip_refusal(algo) is None:  # true is taken where nothing reads the rows
            assert AlgoSpec(**algo.model_dump() | {"skip_zero_advantage": True})
            continue
        with pytest.raises(ValidationError, match="skip_zero_advantage=true: "):
            AlgoSpec(name=name, kl_coef=kl, use_reference=ref, entropy_coeff=entropy,
                     skip_zero_advantage=True)  # fmt: skip


def _plan(model: str, workload: str, schedule: ScheduleSpec, algo: AlgoSpec) -> PlanResult:
    hw = HARDWARE_PRESETS["h200"]
    load = _workload(workload)
    return plan_step(
        MODEL_PRESETS[model], load, algo, hw, schedule, rollout=TORCH_ROLLOUT, trainer=TORCH_SCORER
    )


def _trained_forwards(r: PlanResult) -> list:
    losses = [op for op in r.graph if op.kind == "policy_loss"]
    made = r.graph.producers()
    return [made[loss.inputs["logprobs"]] for loss in losses]


SCHEDULES = {
    "verl_like": ScheduleSpec(name="serial", dedup=False),
    "serial": ScheduleSpec(name="serial"),
    "rollplex": ScheduleSpec(name="rollplex"),
    "rollplex_alone": ScheduleSpec(name="rollplex", prefill_once=False, decode_once=False),
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("workload", ["image", "video", "dense_video"])
@pytest.mark.parametrize("model", ["qwen2_5_vl_3b", "qwen2_5_vl_7b"])
def test_each_training_forward_reads_the_advantages_and_the_plan_is_unchanged(
    model, workload, schedule
):
    on = _plan(model, workload, SCHEDULES[schedule], AlgoSpec(kl_coef=0))
    off_algo = AlgoSpec(kl_coef=0, skip_zero_advantage=False)
    off = _plan(model, workload, SCHEDULES[schedule], off_algo)
    (adv,) = [op.outputs["advantages"] for op in on.graph if op.kind == "advantage"]
    forwards = _trained_forwards(on)
    assert forwards and all(f.kind in FORWARDS for f in forwards)
    assert all(f.inputs.get("advantages") == adv for f in forwards), forwards
    assert not any("advantages" in f.inputs for f in _trained_forwards(off))
    assert [f.kind for f in forwards] == [f.kind for f in _trained_forwards(off)]
    # priced and sized as if every group trains: the read changes no price and no lifetime
    assert on.plan.step_time_s == off.plan.step_time_s
    assert [d.peak_bytes for d in on.plan.devices] == [d.peak_bytes for d in off.plan.devices]


def _own_training_prefixes(r: PlanResult) -> list:
    """The trainer's own prefix forwards and vision encodes."""
    kinds = ("logprob_prefix", "vision_encode")
    return [op for op in r.graph if op.kind in kinds and op.phase is Phase.TRAIN]


@pytest.mark.parametrize("schedule", ["serial", "rollplex", "rollplex_alone"])
@pytest.mark.parametrize("workload", ["image", "video", "dense_video"])
@pytest.mark.parametrize("model", ["qwen2_5_vl_3b", "qwen2_5_vl_7b"])
def test_a_trainers_own_prefix_skips_dead_prompts_where_no_rollout_can_carry_it(
    model, workload, schedule
):
    """graph/passes/skip_dead_prefix.py: behind a vLLM rollout (no rows ride its steps, no
    prefill to export) the trainer's own prefix forward and vision encode read the
    advantages too; behind
    the torch engine it keeps its ride or prefill-once choice (a disaggregated step, whose
    trainer GPUs idle through the rollout, too: pipeline.passes_for). The plan is unchanged."""

    def plan(rollout, skip: bool) -> PlanResult:
        algo = AlgoSpec(kl_coef=0, skip_zero_advantage=skip)
        hw, load = HARDWARE_PRESETS["h200"], _workload(workload)
        return plan_step(MODEL_PRESETS[model], load, algo, hw, SCHEDULES[schedule],
                         rollout=rollout, trainer=TORCH_SCORER)  # fmt: skip

    on, off = plan(VLLM_ROLLOUT, True), plan(VLLM_ROLLOUT, False)
    (adv,) = [op.outputs["advantages"] for op in on.graph if op.kind == "advantage"]
    prefixes = _own_training_prefixes(on)
    assert {p.kind for p in prefixes} == {"logprob_prefix", "vision_encode"}
    assert all(p.inputs.get("advantages") == adv for p in prefixes)
    assert not any("advantages" in p.inputs for p in _own_training_prefixes(off))
    assert on.plan.step_time_s == off.plan.step_time_s
    assert [d.peak_bytes for d in on.plan.devices] == [d.peak_bytes for d in off.plan.devices]
    torch_rollout = plan(TORCH_ROLLOUT, True)
    assert not any("advantages" in p.inputs for p in _own_training_prefixes(torch_rollout))
    assert skip_dead_prefix not in passes_for(ScheduleSpec(name="disaggregated"))


def test_each_mini_batch_forward_reads_its_own_advantages():
    algo = AlgoSpec(kl_coef=0, ppo_mini_batch_size=2, ppo_epochs=2)
    r = _plan("qwen2_5_vl_3b", "image", ScheduleSpec(name="serial"), algo)
    forwards = _trained_forwards(r)
    assert len(forwards) == 4  # 4 prompts: 2 mini-batches x 2 epochs
    made = r.graph.producers()
    losses = [op for op in r.graph if op.kind == "policy_loss"]
    for f, loss in zip(forwards, losses, strict=True):
        assert f.inputs["advantages"] == loss.inputs["advantages"]
        assert made[f.inputs["advantages"]].kind == "select_rows"
    # the old-logprob forward (no grad, every row once) reads the whole batch's
    (adv,) = [op.outputs["advantages"] for op in r.graph if op.kind == "advantage"]
    (old,) = [op for op in r.graph if op.name.startswith("reference.old_logprob")
              and op.kind in FORWARDS]  # fmt: skip
    assert old.inputs["advantages"] == adv
