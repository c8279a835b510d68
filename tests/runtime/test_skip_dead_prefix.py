"""Behind a rollout no rows can ride and no prefill can be taken from (a vLLM engine's
capabilities, here over the torch roles), the trainer's own prefix forward, and the vision
encode only it reads, skip the prompts whose groups train no row
(graph/passes/skip_dead_prefix.py): the step trains what training every row trains, its
trace says how many prompts ran, and none of the dead ones did."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rollplex.backends.step import StepConfig
from rollplex.backends.torch import training_prefix
from rollplex.backends.torch.data import TaskData
from rollplex.engine.prefix import prefix_forward
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.runtime.dispatch import RoleDispatch
from rollplex.specs import AlgoSpec, ScheduleSpec
from rollplex.specs.roles import TORCH_ROLLOUT, TORCH_SCORER
from tests.runtime.conftest import CPU, MODEL, WORKLOAD

NO_RIDE_NO_EXPORT = replace(TORCH_ROLLOUT, piggyback_rows=False, activation_export=False)
ROLLOUTS = {
    "unfused": NO_RIDE_NO_EXPORT,  # the trainer reuses the rollout's vision features
    "fused": replace(NO_RIDE_NO_EXPORT, fused_prefix=True),  # as vLLM: it encodes its own
}
STEPS = 2
# the prefix in one forward, and in the plan's micro-batches (4: one prompt each, so some
# are all dead; 2)
SCHEDULES = {
    "serial": ScheduleSpec(name="serial"),
    "serial_4_micro": ScheduleSpec(name="serial", train_micro_tokens=128),
    "rollplex": ScheduleSpec(name="rollplex"),
    "rollplex_2_micro": ScheduleSpec(name="rollplex", train_micro_tokens=256),
}


def _even_prompts_dead(self, responses, answers, group_size: int) -> torch.Tensor:
    """Every sample of an even prompt scores 1 (its advantages are all 0); an odd prompt's
    samples alternate 0 and 1 (RoleDispatch._reward, the hook tests may patch)."""
    rows = torch.arange(responses.tokens.shape[0])
    return torch.where((rows // group_size) % 2 == 0, 1.0, (rows % 2).float())


def _run(rollout: str, schedule: ScheduleSpec, skip: bool) -> tuple:
    """(plan, step results, trained parameters) of STEPS steps."""
    algo = AlgoSpec(lr=1e-3, kl_coef=0.0, skip_zero_advantage=skip)
    planned = plan_step(
        MODEL, WORKLOAD, algo, CPU, schedule,
        rollout=ROLLOUTS[rollout], trainer=TORCH_SCORER,
    )  # fmt: skip
    dispatch = compose(StepConfig(MODEL, algo, seed=0, max_new_tokens=4))
    executor = Executor(planned.plan, planned.graph, dispatch, [], device="cpu")
    data = TaskData(MODEL, WORKLOAD, seed=0)
    results = [executor.run_step(k, data.step(k)) for k in range(STEPS)]
    params = {n: p.detach().clone() for n, p in dispatch.trainer.model.named_parameters()}
    return planned, results, params


CASES = [("unfused", name) for name in SCHEDULES] + [("fused", "serial"), ("fused", "rollplex")]


@pytest.mark.parametrize(("rollout", "name"), CASES)
def test_the_dead_prompts_prefix_is_skipped_and_the_step_trains_the_same(
    rollout: str, name: str, monkeypatch
):
    schedule = SCHEDULES[name]
    monkeypatch.setattr(RoleDispatch, "_reward", _even_prompts_dead)
    ran: list[int] = []

    def counted(model, batch, *args, **kwargs):
        ran.append(batch.size)
        return prefix_forward(model, batch, *args, **kwargs)

    monkeypatch.setattr(training_prefix, "prefix_forward", counted)
    planned, results, params = _run(rollout, schedule, True)
    rows_on = sum(ran)
    (prefix,) = [op for op in planned.graph if op.kind == "logprob_prefix"]
    assert "advantages" in prefix.inputs
    micro = planned.plan.meta["op_micro_batches"].get(prefix.name, 1)
    assert micro == {"serial_4_micro": 4, "rollplex_2_micro": 2}.get(name, 1)
    every = _run(rollout, schedule, False)[2]
    rows_off = sum(ran) - rows_on
    # Adam's steps on near-0 gradients (the loss is ~1e-8 here) round apart by ~1e-5 where
    # the two runs' sums differ in order, as in tests/jobs/test_skip_zero_advantage_train.py
    for n, w in every.items():
        torch.testing.assert_close(params[n], w, atol=1e-4, rtol=0, msg=n)
        assert (params[n] - w).abs().mean() < 1e-6, n
    prompts = WORKLOAD.prompts_per_step
    skipping = {op.name for op in planned.graph if op.kind in ("vision_encode", "logprob_prefix")
                and "advantages" in op.inputs}  # fmt: skip
    assert skipping == {prefix.name} | ({"train.vision_encode"} if rollout == "fused" else set())
    notes = [m.note for r in results for m in r.steps if m.step.name in skipping]
    said = f"ran {prompts // 2} of {prompts} prompts (the others' advantages are 0)"
    assert notes == [said] * STEPS * len(skipping)
    # the training prefix forward ran the live prompts alone
    assert (rows_on, rows_off) == (STEPS * prompts // 2, STEPS * prompts)
