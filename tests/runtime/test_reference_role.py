"""The reference model exists exactly when a graph of the run reads it (algo.use_reference);
that no unread one is held is tests/runtime/test_persistent_state.py's grid."""

from __future__ import annotations

import pytest

from rollplex.backends.base import BackendError
from rollplex.backends.step import StepConfig
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import AlgoSpec, ScheduleSpec
from tests.runtime.conftest import CPU, MODEL, WORKLOAD


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
