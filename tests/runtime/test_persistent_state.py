"""The weights and optimizer state the roles hold across steps are the ones the plan prices,
over algorithms x KL x schedules x parameter dtypes: an unpriced model copy (the reference
a kl_coef=0 run once built and never read, 5.75 GiB at 3B) fails here, not on a GPU."""

from __future__ import annotations

import itertools

import pytest
import torch

import rollplex.models.io as model_io
from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.backends.torch.handles import OptimizerHandle
from rollplex.backends.torch.masters import own_masters
from rollplex.graph.ir import ValueKind
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import AlgoSpec, ScheduleSpec
from tests.runtime.conftest import CPU, MODEL, WORKLOAD

GRID = list(
    itertools.product(
        ("grpo", "rloo", "ppo"), (0.0, 0.1), ("serial", "rollplex"), ("bfloat16", "float32")
    )
)


def _bytes(tensors) -> int:
    """Bytes of the distinct storages of `tensors`, scalars (AdamW's step counts) left out."""
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in tensors
        if isinstance(t, torch.Tensor) and t.numel() > 1
    }
    return sum(storages.values())


def _held(dispatch) -> tuple[int, int]:
    """(weights of every role's model, float32 masters and AdamW moments) the roles hold."""
    models = [dispatch.trainer.model, dispatch.rollout.model]
    trained = [dispatch.trainer]
    if dispatch.reference is not None:
        models.append(dispatch.reference.model)
    if dispatch.critic is not None:
        models.append(dispatch.critic.model)
        trained.append(dispatch.critic)
    weights = _bytes(p for m in models for p in m.parameters())
    state = (
        t
        for role in trained
        for t in OptimizerHandle(role.optimizer, own_masters(role.masters)).tensors()
    )
    return weights, _bytes(state)


@pytest.mark.parametrize(("algo", "kl", "schedule", "dtype"), GRID)
def test_the_roles_hold_the_weights_and_optimizer_state_the_plan_prices(
    algo: str, kl: float, schedule: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bfloat16 parameters as on a GPU: float32 masters beside AdamW's moments
    monkeypatch.setattr(model_io, "default_dtype", lambda device: getattr(torch, dtype))
    model = MODEL.model_copy(update={"dtype": dtype})
    spec = AlgoSpec(name=algo, lr=1e-3, kl_coef=kl)
    planned = plan_step(model, WORKLOAD, spec, CPU, ScheduleSpec(name=schedule))
    priced = {ValueKind.WEIGHTS: 0, ValueKind.OPTIMIZER_STATE: 0}
    for v in planned.graph.values.values():
        if v.external and v.kind in priced:
            priced[v.kind] += v.nbytes
    dispatch = compose(StepConfig(model, spec, seed=0, max_new_tokens=4))
    executor = Executor(planned.plan, planned.graph, dispatch, [], device="cpu")
    data = TaskData(model, WORKLOAD, seed=0)
    for k in range(2):  # AdamW's moments exist from the first step's update
        executor.run_step(k, data.step(k))
    weights, state = _held(dispatch)
    assert weights <= priced[ValueKind.WEIGHTS]
    assert state <= priced[ValueKind.OPTIMIZER_STATE]
    # Priced as held, to PPO's critic (no LM head, a value head: 3% under its policy's
    # price); float32 parameters are their own masters, priced as if they were not.
    assert weights >= 0.97 * priced[ValueKind.WEIGHTS]
    if dtype == "bfloat16":
        assert state >= 0.97 * priced[ValueKind.OPTIMIZER_STATE]
    else:
        assert state >= 0.97 * 2 / 3 * priced[ValueKind.OPTIMIZER_STATE]
