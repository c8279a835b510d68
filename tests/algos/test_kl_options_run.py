"""The KL options through a real PPO step on the tiny model: the reward KL and a loss KL at
once, the reward_kl / loss_kl metrics (the loss KL used to be the only one, and read 0 with
kl_in_reward), and verl's adaptive controller moving the reward coefficient step to step."""

from __future__ import annotations

import pytest

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import AlgoSpec, ScheduleSpec
from tests.runtime.conftest import CPU, MODEL, WORKLOAD

BASE = dict(name="ppo", lr=1e-3, critic_lr=1e-3, use_reference=True, kl_in_reward=True)


def _steps(algo: AlgoSpec, n: int = 3):
    planned = plan_step(MODEL, WORKLOAD, algo, CPU, ScheduleSpec(name="serial"))
    backend = compose(StepConfig(MODEL, algo, seed=0, max_new_tokens=4))
    executor = Executor(planned.plan, planned.graph, backend, [])
    data = TaskData(MODEL, WORKLOAD, seed=0)
    return planned.graph, [executor.run_step(k, data.step(k)).metrics for k in range(n)]


@pytest.mark.parametrize("kl_loss_coef", [None, 0.05])
def test_reward_kl_and_loss_kl_at_once(kl_loss_coef):
    algo = AlgoSpec(**BASE, kl_coef=0.1, kl_loss_coef=kl_loss_coef, kl_loss_type="k3")
    graph, metrics = _steps(algo)
    (loss_op,) = [op for op in graph if op.kind == "policy_loss"]
    (gae_op,) = [op for op in graph if op.kind == "advantage"]
    assert {"old_logprobs", "ref_logprobs"} <= set(gae_op.inputs)
    assert ("ref_logprobs" in loss_op.inputs) == (kl_loss_coef is not None)
    assert loss_op.attrs["kl_coef"] == (kl_loss_coef or 0.0)
    # step 0: policy == reference, both KLs ~0; later the policy has moved and both show it
    assert abs(metrics[0]["reward_kl"]) < 1e-4
    assert all(m["reward_kl_coef"] == pytest.approx(0.1) for m in metrics)  # fixed
    assert abs(metrics[-1]["reward_kl"]) > 1e-5
    if kl_loss_coef is None:
        assert all(m["loss_kl"] == 0 for m in metrics)  # no loss term, and no pretence
    else:
        assert metrics[-1]["loss_kl"] > 1e-6
        assert metrics[-1]["loss"] == pytest.approx(
            metrics[-1]["pg_loss"] + kl_loss_coef * metrics[-1]["loss_kl"], rel=1e-5
        )


def test_adaptive_controller_moves_the_reward_coefficient():
    algo = AlgoSpec(**BASE, kl_coef=0.1, kl_ctrl="adaptive", target_kl=1e-3, kl_horizon=16)
    _, metrics = _steps(algo)
    coef = [m["reward_kl_coef"] for m in metrics]
    n = WORKLOAD.prompts_per_step * WORKLOAD.group_size  # verl's n_steps: the batch's samples
    for k in range(len(metrics) - 1):
        err = min(max(metrics[k]["reward_kl"] / 1e-3 - 1, -0.2), 0.2)
        assert coef[k + 1] == pytest.approx(coef[k] * (1 + err * n / 16), rel=1e-6)
    assert coef[-1] != pytest.approx(0.1)
