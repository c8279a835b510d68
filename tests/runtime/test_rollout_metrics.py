"""The rollout's logged numbers on a real step of the tiny model: response_length is the
mean of the responses' lengths and response_clip_ratio (verl's response_length/clip_ratio)
the share that ran to train.max_new_tokens, read from the lengths the rollout returned."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.backends.torch.values import Responses
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import AlgoSpec, ScheduleSpec
from tests.runtime.conftest import CPU, MODEL, WORKLOAD

CAP = 4


def test_response_length_and_clip_ratio_are_the_rollouts():
    algo = AlgoSpec(lr=1e-3, kl_coef=0.0)
    planned = plan_step(MODEL, WORKLOAD, algo, CPU, ScheduleSpec(name="serial"))
    backend = compose(StepConfig(MODEL, algo, seed=0, max_new_tokens=CAP))
    seen: list[torch.Tensor] = []
    start = backend.rollout.start_decode

    def cut(*args, **kw):
        """Every third response ends early, at its row's (k % 3) + 1 tokens."""
        session = start(*args, **kw)
        result = session.result

        def cut_result():
            responses, lp = result()
            n = responses.lengths.shape[0]
            short = torch.arange(n) % 3 == 0
            lengths = torch.where(short, torch.arange(n) % 2 + 1, responses.lengths)
            seen.append(lengths)
            return Responses(responses.tokens, lengths), lp

        session.result = cut_result
        return session

    backend.rollout.start_decode = cut
    executor = Executor(planned.plan, planned.graph, backend, [])
    m = executor.run_step(0, TaskData(MODEL, WORKLOAD, seed=0).step(0)).metrics
    (lengths,) = seen
    assert 0 < int((lengths == CAP).sum()) < lengths.numel()  # some at the cap, some not
    assert float(m["response_length"]) == pytest.approx(float(lengths.float().mean()))
    assert float(m["response_clip_ratio"]) == pytest.approx(float((lengths == CAP).float().mean()))
