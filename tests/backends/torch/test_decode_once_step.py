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
# within 1e-6 of its largest element). Adam's first step is lr * g / (|g| + eps): an element
# whose gradient is near eps (1e-8) turns a 1e-10 rounding difference into ~1e-5 of its
# step, and how many such elements there are depends on the CPU's kernels (measured, 3
# steps of lr 1e-3: at most 5.8e-6 apart on an AVX-512 machine, 5.4e-5 on an AVX2 one, at
# one element of RLOO's o_proj). So each parameter is held as a whole, to 0.1% of how far
# it moved (worst measured 2.1e-4), and each element to a tenth of one step.
MOVED_SHARE, ELEMENT_ATOL = 1e-3, 1e-4
# k_proj's bias adds q.b to every score of a query, which softmax ignores: its exact gradient
# is 0, so Adam's step for it is the sign of rounding noise. It is left out.
NOISE_ONLY = "self_attn.k_proj.bias"


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
    starts = {"trainer": initial_params()}
    if algo == "ppo":  # the critic as built, before any step
        fresh = _run(schedule, steps=0, algo=ALGOS[algo]).backend.critic.model
        starts["critic"] = {n: p.detach().clone() for n, p in fresh.named_parameters()}
    for model, start in starts.items():
        a = dict(getattr(separate.backend, model).model.named_parameters())
        b = dict(getattr(once.backend, model).model.named_parameters())
        # it trained, response layers included
        assert all(not torch.equal(a[n], start[n]) for n in a if "layers.1.mlp" in n)
        for n in (n for n in a if not n.endswith(NOISE_ONLY)):
            moved = float((a[n] - start[n]).norm())
            assert float((b[n] - a[n]).norm()) <= MOVED_SHARE * moved, f"{model}.{n}"
            torch.testing.assert_close(b[n], a[n], atol=ELEMENT_ATOL, rtol=0, msg=f"{model}.{n}")
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
