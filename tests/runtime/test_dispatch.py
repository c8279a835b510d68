"""RoleDispatch: one routing for every mix of roles; old logprobs only from a rollout whose
logprobs are of the distribution the trainer scores."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from rollplex.backends.base import BackendError
from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.backends.torch.roles import TorchRollout
from rollplex.graph.ir import Op, Phase
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import ScheduleSpec
from rollplex.specs.roles import RoleCapabilities
from tests.runtime.conftest import ALGO, CPU, MODEL, WORKLOAD, cached_run


class UnscaledRollout(TorchRollout):
    """The torch rollout, declared like vLLM's: its logprobs are not logits / T."""

    capabilities: ClassVar[RoleCapabilities] = RoleCapabilities(
        segmented_decode=True, prefix_kv_export=True, in_place_weight_load=True
    )


def _run_with(rollout_cls, steps: int = 3):
    planned = plan_step(MODEL, WORKLOAD, ALGO, CPU, ScheduleSpec(name="serial"))
    dispatch = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    rollout = rollout_cls(MODEL, torch.device("cpu"))
    rollout.load_weights(dispatch.trainer.live_weights())
    dispatch.rollout = rollout
    seen: list = []
    loss = dispatch.trainer.loss

    def spy(logprobs, old, *a, **kw):
        seen.append(old)
        return loss(logprobs, old, *a, **kw)

    dispatch.trainer.loss = spy
    ex = Executor(planned.plan, planned.graph, dispatch)
    data = TaskData(MODEL, WORKLOAD, seed=0)
    results = [ex.run_step(k, data.step(k)) for k in range(steps)]
    params = {n: p.detach().clone() for n, p in dispatch.trainer.model.named_parameters()}
    return results, params, seen


def test_unscaled_rollout_logprobs_are_not_old_logprobs():
    results, params, seen = _run_with(UnscaledRollout)
    # old = the trainer's own logprobs, detached: on-policy, ratio exactly 1, nothing clipped
    assert all(not o.values.requires_grad for o in seen)
    assert all(r.metrics["clip_frac"] == 0 for r in results)
    scaled, scaled_params, _ = _run_with(TorchRollout)
    # the torch decode's logprobs (logits / T) serve as old logprobs there, and equal the
    # trainer's to fp32 rounding: both runs train the same weights within 1e-5
    assert [r.metrics["reward"] for r in results] == [r.metrics["reward"] for r in scaled]
    for n in params:
        torch.testing.assert_close(params[n], scaled_params[n], atol=1e-5, rtol=0, msg=n)


def test_a_fused_engine_refuses_a_graph_planned_without_its_capabilities():
    class Fused(TorchRollout):
        capabilities: ClassVar[RoleCapabilities] = RoleCapabilities(fused_prefix=True)

    planned = plan_step(MODEL, WORKLOAD, ALGO, CPU, ScheduleSpec(name="serial"))
    dispatch = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    dispatch.rollout = Fused(MODEL, torch.device("cpu"))
    with pytest.raises(BackendError, match=r"prefills inside its engine.*capabilities"):
        Executor(planned.plan, planned.graph, dispatch)


def test_ops_no_role_runs_are_named():
    dispatch = cached_run(ScheduleSpec(name="serial")).backend
    graph = cached_run(ScheduleSpec(name="serial")).planned.graph.copy()
    graph.add_op(Op("rollout.mystery", "logprob_prefix", Phase.ROLLOUT))
    with pytest.raises(BackendError, match=r"no role runs: rollout.mystery \(rollout"):
        dispatch.check_graph(graph)
