"""algo.rollout_correction through real GRPO steps on the tiny model. On CPU in fp32 the
torch rollout's logprobs are the trainer's, so the correction changes nothing: weights 1,
nothing rejected, the same loss as without it. An engine whose logprobs sit a known
distance off (each sampled token's shifted by -ln 3, as a bf16 engine might drift) shows
the wiring end to end: mismatch_kl reads the shift, every IS weight is 3 truncated to 2,
so the policy-gradient loss doubles; rejection at 2 drops every token."""

from __future__ import annotations

import math

import pytest
import torch

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.backends.torch.values import TokenLogprobs
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import AlgoSpec, ScheduleSpec
from tests.runtime.conftest import CPU, MODEL, WORKLOAD

SHIFT = -math.log(3.0)  # log pi_rollout - log pi_old on every sampled token
# groups of one: each advantage is its raw reward, so the on-policy loss (ratio 1) is
# -mean(A) and not 0, as G-centred advantages over equal lengths would make it
ONES = WORKLOAD.model_copy(update={"group_size": 1})


def _shifted(start):
    """`start` (a rollout's start_decode) whose sessions' logprobs are SHIFT off."""

    def shifted_start(*args, **kw):
        session = start(*args, **kw)
        result = session.result

        def shifted_result():
            responses, lp = result()
            valid = lp.mask.bool()
            return responses, TokenLogprobs(torch.where(valid, lp.values + SHIFT, 0.0), lp.mask)

        session.result = shifted_result
        return session

    return shifted_start


def _step(correction: dict | None, shift: bool = False) -> dict:
    algo = AlgoSpec(lr=1e-3, kl_coef=0.0, rollout_correction=correction or {})
    planned = plan_step(MODEL, ONES, algo, CPU, ScheduleSpec(name="serial"))
    backend = compose(StepConfig(MODEL, algo, seed=0, max_new_tokens=4))
    # rewards that differ between rows: something to weigh
    backend._reward = lambda responses, answers, group_size: (
        torch.arange(responses.tokens.shape[0]) % 3
    ).float()
    if shift:
        rollout = backend.rollout
        for name in ("start_decode", "start_decode_kept"):
            if hasattr(rollout, name):
                setattr(rollout, name, _shifted(getattr(rollout, name)))
    executor = Executor(planned.plan, planned.graph, backend, [])
    data = TaskData(MODEL, ONES, seed=0)
    return {k: float(v) for k, v in executor.run_step(0, data.step(0)).metrics.items()}


@pytest.fixture(scope="module")
def plain() -> dict:
    return _step(None)


def test_agreeing_engines_leave_the_step_unchanged(plain):
    got = _step({"rollout_is": "token", "rollout_rs": "geometric"})
    assert abs(got["mismatch_kl"]) < 1e-5 and got["mismatch_k3_kl"] < 1e-8
    assert got["rollout_is_mean"] == pytest.approx(1.0, abs=1e-5)
    assert got["rollout_rs_masked_fraction"] == 0
    assert got["pg_loss"] == pytest.approx(plain["pg_loss"], rel=1e-5, abs=1e-7)
    assert "mismatch_kl" not in plain  # off: not measured


def test_a_drifted_engine_is_weighed_and_rejected(plain):
    assert abs(plain["pg_loss"]) > 1e-4  # something to scale
    weighed = _step({"rollout_is": "token", "rollout_is_threshold": 2.0}, shift=True)
    assert weighed["mismatch_kl"] == pytest.approx(SHIFT, rel=1e-5)
    assert weighed["rollout_is_mean"] == pytest.approx(3.0, rel=1e-5)
    assert weighed["rollout_is_ratio_fraction_high"] == 1.0
    # on-policy the ratio is 1: the loss is the weight times the plain one
    assert weighed["pg_loss"] == pytest.approx(2.0 * plain["pg_loss"], rel=1e-5)
    rejected = _step({"rollout_rs": "token", "rollout_rs_threshold": 2.0}, shift=True)
    assert rejected["rollout_rs_masked_fraction"] == 1.0
    assert rejected["pg_loss"] == 0.0
