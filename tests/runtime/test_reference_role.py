"""The reference model exists exactly when a graph of the run reads it (algo.use_reference):
an unread one held a whole model copy on the device that no plan priced."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.base import BackendError
from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import AlgoSpec, ScheduleSpec
from tests.runtime.conftest import CPU, MODEL, WORKLOAD


def _parameter_bytes(dispatch) -> int:
    """Bytes of the distinct parameter storages every role of `dispatch` holds."""
    models = [dispatch.trainer.model, dispatch.rollout.model]
    if dispatch.reference is not None:
        models.append(dispatch.reference.model)
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
        for m in models
        for p in m.parameters()
    }
    return sum(storages.values())


@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo"])
def test_a_run_without_a_kl_term_holds_one_policy_and_steps(algo: str) -> None:
    spec = AlgoSpec(name=algo, lr=1e-3, kl_coef=0.0)
    dispatch = compose(StepConfig(MODEL, spec, seed=0, max_new_tokens=4))
    assert dispatch.reference is None
    policy = sum(p.numel() * p.element_size() for p in dispatch.trainer.model.parameters())
    assert _parameter_bytes(dispatch) == policy  # the rollout aliases it; nothing else
    planned = plan_step(MODEL, WORKLOAD, spec, CPU, ScheduleSpec(name="serial"))
    result = Executor(planned.plan, planned.graph, dispatch, [], device="cpu").run_step(
        0, TaskData(MODEL, WORKLOAD, seed=0).step(0)
    )
    assert torch.isfinite(torch.as_tensor(result.metrics["loss"]))


def test_a_kl_term_builds_a_frozen_reference_of_its_own() -> None:
    dispatch = compose(StepConfig(MODEL, AlgoSpec(lr=1e-3, kl_coef=0.1), seed=0, max_new_tokens=4))
    assert dispatch.reference is not None
    ref = dispatch.reference.model.model.language_model
    policy = dispatch.trainer.model.model.language_model
    assert all(not p.requires_grad for p in ref.parameters())
    assert ref.embed_tokens.weight.data_ptr() != policy.embed_tokens.weight.data_ptr()


def test_a_graph_that_reads_a_reference_is_refused_where_none_was_built() -> None:
    dispatch = compose(StepConfig(MODEL, AlgoSpec(lr=1e-3, kl_coef=0.0), seed=0, max_new_tokens=4))
    with_kl = plan_step(MODEL, WORKLOAD, AlgoSpec(lr=1e-3, kl_coef=0.1), CPU, ScheduleSpec())
    with pytest.raises(BackendError, match="the graph reads a reference, none was built"):
        Executor(with_kl.plan, with_kl.graph, dispatch, [], device="cpu")
