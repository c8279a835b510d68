"""decode_once through real plans and the executor (tiny model on CPU, torch roles): the
plan reuses the rollout's decode as the training response forward, no training response
forward runs, and K steps train what the same schedule without it trains (GRPO, RLOO, and
PPO, whose critic keeps its own response forward), with the same metrics; a decode's kept
outputs are attached only at the weights version that decoded them."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.base import BackendError
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.engine.decoded import DecodedOutputs
from rollplex.runtime.dispatch import RoleDispatch
from rollplex.specs import AlgoSpec, ScheduleSpec
from tests.backends.torch.test_prefill_once_step import PPO, _run
from tests.runtime.conftest import ALGO, initial_params

RLOO = AlgoSpec(name="rloo", lr=1e-3)
ALGOS = {"grpo": ALGO, "rloo": RLOO, "ppo": PPO}
# fp32: the replay's forward values are the decode's (test_decode_once.py: every gradient
# within 1e-6 of its largest element). Adam divides each gradient element by its own
# magnitude (+ eps 1e-8), so an element whose gradient is near eps turns a 1e-11 rounding
# difference into ~1e-3 of its step: measured, 3 steps of lr 1e-3 differ by <= 5.8e-6
# (0.6% of one step; prefill_once, whose forward is the same kernels, differs by 0).
TOL = {"atol": 2e-5, "rtol": 0}


@pytest.fixture(autouse=True)
def _rewards_that_vary(monkeypatch):
    """The tiny model never answers right: rewards from its tokens instead, so advantages
    (and the policy gradient) are not zero."""

    def reward(self, responses, answers, group_size):
        return (responses.tokens[:, 0] % 5).float() / 4

    monkeypatch.setattr(RoleDispatch, "_reward", reward)


@pytest.mark.parametrize(
    "schedule",
    [ScheduleSpec(name="serial"), ScheduleSpec(name="rollplex", overlap="streams")],
    ids=["serial", "rollplex_streams"],
)
@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo"])
def test_k_steps_train_what_the_response_forward_trains(schedule, algo, monkeypatch):
    if algo == "ppo" and schedule.name == "rollplex":
        pytest.skip("PPO's policy/critic pairing is covered on the serial schedule")
    forwards = []
    real = TorchTrainer.logprob_response

    def counted(self, *args, **kwargs):
        forwards.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TorchTrainer, "logprob_response", counted)
    once = _run(schedule, algo=ALGOS[algo])
    kinds = {op.name: op.kind for op in once.planned.graph}
    assert kinds["train.logprob_response"] == "attach_response"
    assert "decode_once" in [p.name for p in once.planned.passes]
    assert not forwards  # no training response forward ran, in any of the 3 steps
    separate = _run(schedule.model_copy(update={"decode_once": False}), algo=ALGOS[algo])
    assert kinds.keys() == {op.name for op in separate.planned.graph}
    assert separate.planned.graph.ops["train.logprob_response"].kind == "logprob_response"
    assert len(forwards) == 3
    models = ("trainer", "critic") if algo == "ppo" else ("trainer",)
    start = initial_params()
    for model in models:
        a = dict(getattr(separate.backend, model).model.named_parameters())
        b = dict(getattr(once.backend, model).model.named_parameters())
        if model == "trainer":  # it trained, response layers included
            assert all(not torch.equal(a[n], start[n]) for n in a if "layers.1.mlp" in n)
        for n in a:
            torch.testing.assert_close(b[n], a[n], **TOL, msg=f"{model}.{n}")
    for r_once, r_sep in zip(once.results, separate.results, strict=True):
        assert r_once.metrics.keys() == r_sep.metrics.keys()
        for k, v in r_sep.metrics.items():
            assert float(r_once.metrics[k]) == pytest.approx(float(v), rel=1e-4, abs=1e-6), k
        assert not any(m.deviations for m in r_once.steps)
    # the kept outputs, held all step in the engine's workspace, stay inside the plan's peak
    planned = once.planned.plan.devices[0].peak_bytes
    assert 0 < max(m.resident_bytes for r in once.results for m in r.steps) <= planned


def test_a_decode_of_another_version_is_refused():
    run = _run(ScheduleSpec(name="serial"), steps=1)
    op = run.planned.graph.ops["train.logprob_response"]
    handle = run.backend.trainer.handle()
    stale = DecodedOutputs(None, 0, 0, "policy@0")
    assert handle.name != stale.version  # an update later
    x = {"kept": stale, "weights": handle, "kv": None, "responses": None}
    with pytest.raises(BackendError, match="decode_once needs the version"):
        run.backend.forwards.attach_response(op, run.backend.trainer, x)
