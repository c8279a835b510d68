"""prefill_once through real plans and the executor (tiny GRPO on CPU, torch roles): the
plan reuses the rollout's prefill as the training prefix forward, no training prefix
forward runs, and K steps train exactly what the same schedule without it trains; an
export is attached only at the weights version that made it."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.base import BackendError
from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.backends.torch.exported_prefix import ExportedPrefix
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import AlgoSpec, ScheduleSpec
from rollplex.specs.roles import TORCH_ROLLOUT, TORCH_SCORER
from tests.runtime.conftest import ALGO, CPU, MODEL, WORKLOAD, Run, initial_params

PPO = AlgoSpec(name="ppo", lr=1e-3, critic_lr=1e-3, use_reference=True, kl_coef=0.04)


def _run(schedule: ScheduleSpec, steps: int = 3, seed: int = 0, algo: AlgoSpec = ALGO) -> Run:
    planned = plan_step(
        MODEL, WORKLOAD, algo, CPU, schedule, rollout=TORCH_ROLLOUT, trainer=TORCH_SCORER
    )
    backend = compose(StepConfig(MODEL, algo, seed=seed, max_new_tokens=4, device="cpu"))
    executor = Executor(planned.plan, planned.graph, backend, [], device="cpu")
    data = TaskData(MODEL, WORKLOAD, seed=seed)
    results = [executor.run_step(k, data.step(k)) for k in range(steps)]
    return Run(planned, backend, executor, results)


@pytest.mark.parametrize(
    "schedule",
    [ScheduleSpec(name="serial"), ScheduleSpec(name="rollplex", overlap="streams")],
    ids=["serial", "rollplex_streams"],
)
def test_k_steps_train_what_the_separate_forward_trains(schedule, monkeypatch):
    forwards = []
    real = TorchTrainer.logprob_prefix

    def counted(self, *args, **kwargs):
        forwards.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TorchTrainer, "logprob_prefix", counted)
    once = _run(schedule)
    assert any(op.kind == "attach_prefix" for op in once.planned.graph)
    assert not forwards  # no training prefix forward ran, in any of the 3 steps
    separate = _run(schedule.model_copy(update={"prefill_once": False}))
    assert len(forwards) == 3
    a, b, start = separate.params(), once.params(), initial_params()
    assert all(not torch.equal(a[n], start[n]) for n in a if "layers.0." in n)  # it trained
    for n in a:  # the same math (tests/backends/torch/test_prefill_once.py: to 1e-6)
        torch.testing.assert_close(b[n], a[n], atol=1e-6, rtol=0, msg=n)
    assert [r.metrics["reward"] for r in once.results] == [
        r.metrics["reward"] for r in separate.results
    ]
    for r in once.results:
        assert not any(m.deviations for m in r.steps)
    # the export is held from the prefill to the backward, inside the plan's peak
    planned = once.planned.plan.devices[0].peak_bytes
    assert 0 < max(m.resident_bytes for r in once.results for m in r.steps) <= planned


def test_ppo_trains_policy_and_critic_as_with_separate_forwards():
    """The policy attaches the rollout's prefill, the critic its own old-values forward."""
    once = _run(ScheduleSpec(name="serial"), algo=PPO)
    attached = {op.name for op in once.planned.graph if op.kind == "attach_prefix"}
    assert attached == {"train.logprob_prefix", "train.critic_prefix"}
    separate = _run(ScheduleSpec(name="serial", prefill_once=False), algo=PPO)
    for model in ("trainer", "critic"):
        a = dict(getattr(separate.backend, model).model.named_parameters())
        b = dict(getattr(once.backend, model).model.named_parameters())
        for n in a:
            torch.testing.assert_close(b[n], a[n], atol=1e-6, rtol=0, msg=f"{model}.{n}")


def test_an_export_of_another_version_is_refused():
    run = _run(ScheduleSpec(name="serial"), steps=1)
    op = run.planned.graph.ops["train.logprob_prefix"]
    handle = run.backend.trainer.handle()
    stale = ExportedPrefix(None, "policy@0")
    assert handle.name != stale.version  # 3 updates later
    with pytest.raises(BackendError, match="prefill_once needs the version"):
        x = {"exported": stale, "weights": handle}
        run.backend.forwards.attach_prefix(op, run.backend.trainer, x)
