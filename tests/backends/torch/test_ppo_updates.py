"""PPO mini-batches and epochs run by the runtime and the torch trainer, against verl's
`dp_actor.update_policy` loop re-derived by hand on the same fixed tensors:

    old = forward without grad at the rollout's version      (compute_log_prob)
    mini_batches = batch.split(ppo_mini_batch_size * n)      (in order, no shuffle)
    for epoch in range(ppo_epochs):
        for mb in mini_batches:
            loss(forward(mb), old[mb], advantages[mb], ref[mb]); backward; optimizer step

Only the first update is on-policy (ratio 1, no clip); the later ones see moved weights.
"""

from __future__ import annotations

import math

import pytest
import torch

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.runtime.dispatch import RoleDispatch
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

MODEL = MODEL_PRESETS["tiny"]
WORKLOAD = WORKLOAD_PRESETS["tiny"]  # 4 prompts x 4 samples
CPU = HARDWARE_PRESETS["cpu"]
VERL = ScheduleSpec(name="serial", dedup=False)  # per-sample forwards, as verl runs them
LR = 3e-3  # large enough that one Adam step moves the ratio past the clip on some tokens


def _algo(mini: int | None, epochs: int, name: str = "grpo") -> AlgoSpec:
    return AlgoSpec(
        name=name,
        lr=LR,
        critic_lr=LR,
        use_reference=True,
        kl_coef=0.04,
        ppo_mini_batch_size=mini,
        ppo_epochs=epochs,
    )


class Recorder:
    """Wraps a backend: every op's inputs and outputs, and each update's loss inputs,
    metrics and gradients."""

    def __init__(self, backend: RoleDispatch) -> None:
        self.ops: dict[str, tuple[dict, dict]] = {}
        self.updates: list[dict] = []
        run_op, loss, backward = backend.run_op, backend.trainer.loss, backend.trainer.backward
        trainer = backend.trainer

        def record_op(op, inputs, chunk, carry):
            res = run_op(op, inputs, chunk, carry)
            self.ops[op.name] = (inputs, res.outputs)
            return res

        def record_loss(logprobs, old, advantages, ref, **attrs):
            out = loss(logprobs, old, advantages, ref, **attrs)
            log_ratio = (logprobs.values.detach() - old.values)[logprobs.mask]
            self.updates.append({"metrics": out.metrics, "log_ratio": log_ratio})
            return out

        def record_backward(value):
            grads = backward(value)
            self.updates[-1]["grads"] = [p.grad.detach().clone() for p in trainer.params]
            return grads

        backend.run_op = record_op
        trainer.loss, trainer.backward = record_loss, record_backward


def _reward(responses, answers, group_size):  # varied rewards: nonzero advantages
    return (responses.tokens[:, 0] % 2).float()


def _run(algo: AlgoSpec, schedule: ScheduleSpec = VERL, model=MODEL):
    planned = plan_step(model, WORKLOAD, algo, CPU, schedule)
    backend = compose(StepConfig(model, algo, seed=0, max_new_tokens=4))
    if not algo.use_reference:  # no reference role at all (a training pool has none)
        backend.reference = None
    backend._reward = _reward
    rec = Recorder(backend)
    rec.planned = planned
    rec.executor = Executor(planned.plan, planned.graph, backend, [])
    result = rec.executor.run_step(0, TaskData(model, WORKLOAD, seed=0).step(0))
    return backend, rec, result


@pytest.fixture(scope="module")
def two_epochs():
    return _run(_algo(1, 2))


@pytest.mark.parametrize(("mini", "epochs"), [(1, 2), (3, 2), (2, 1), (4, 3), (None, 1)])
def test_optimizer_steps_are_epochs_times_mini_batches(mini, epochs) -> None:
    backend, rec, _ = _run(_algo(mini, epochs))
    n = WORKLOAD.prompts_per_step
    want = epochs * math.ceil(n / (mini or n))
    assert backend.trainer.counter.n == want  # the version after the step
    assert len(rec.updates) == want


def test_ratio_leaves_one_from_the_second_update_on(two_epochs) -> None:
    _, rec, _ = two_epochs
    first, *later = rec.updates
    # on-policy: old logprobs from the rollout's version, the same weights
    assert first["log_ratio"].abs().max() < 1e-5
    assert first["metrics"]["clip_frac"] == 0 and first["metrics"]["clip_frac_lower"] == 0
    for k, u in enumerate(later, 1):
        assert u["log_ratio"].abs().max() > 1e-3, f"update {k}"
    assert max(u["metrics"]["clip_frac"] for u in later) > 0  # the clip engages


def test_logged_metrics_are_the_mean_over_updates(two_epochs) -> None:
    _, rec, result = two_epochs
    for key in ("clip_frac", "clip_frac_lower", "ppo_kl", "pg_loss", "kl"):
        mean = torch.stack([u["metrics"][key] for u in rec.updates]).mean()
        assert result.metrics[key] == pytest.approx(float(mean), abs=1e-6), key
    assert result.metrics["clip_frac"] > 0


def test_first_update_is_todays_single_update(two_epochs) -> None:
    """The first update's gradients are those of the on-policy loss (old = the forward's
    own logprobs, detached: today's single update, verl's `on_policy` branch) on its rows."""
    _backend, rec, _ = two_epochs
    fresh = compose(StepConfig(MODEL, _algo(1, 2), seed=0, max_new_tokens=4)).trainer
    inputs, _ = rec.ops["train.policy_loss"]
    x_feat, _ = rec.ops["train.vision_encode"]
    x_lp, _ = rec.ops["train.logprob"]
    lp, _ = fresh.logprob(fresh.vision_encode(x_feat["pixels"]), x_lp["text"], x_lp["responses"])
    old = type(lp)(lp.values.detach(), lp.mask)
    ref = inputs["ref_logprobs"]
    loss = fresh.loss(lp, old, inputs["advantages"], ref, clip_eps=0.2, kl_coef=0.04)
    fresh.backward(loss)
    for got, want in zip(rec.updates[0]["grads"], (p.grad for p in fresh.params), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_runtime_equals_verls_loop_by_hand(two_epochs) -> None:
    """The same fixed tensors (the step's prompts, responses, advantages and reference
    logprobs), pushed through verl's loop by hand with a fresh trainer of the same seed,
    end at the weights the runtime's graph made."""
    backend, rec, _ = two_epochs
    algo = _algo(1, 2)
    hand = compose(StepConfig(MODEL, algo, seed=0, max_new_tokens=4))
    trainer, values = hand.trainer, hand.values
    g, n = WORKLOAD.group_size, WORKLOAD.prompts_per_step
    pixels = rec.ops["rollout.vision_encode"][0]["pixels"]
    text = rec.ops["rollout.prefix_prefill"][0]["text"]
    responses = rec.ops["rollout.decode"][1]["responses"]
    advantages = rec.ops["rollout.advantage"][1]["advantages"]
    ref = rec.ops["reference.logprob"][1]["logprobs"]
    scorer = trainer.scorer()
    rep = values.repeat
    old = scorer.logprob(scorer.vision_encode(rep(pixels, g)), rep(text, g), responses)
    size = algo.ppo_mini_batch_size
    for _ in range(algo.ppo_epochs):
        for lo in range(0, n, size):
            hi = min(lo + size, n)

            def rows(v, lo=lo, hi=hi):
                return values.select(v, lo * g, hi * g)

            feats = trainer.vision_encode(rep(values.select(pixels, lo, hi), g))
            lp, _ = trainer.logprob(feats, rep(values.select(text, lo, hi), g), rows(responses))
            loss = trainer.loss(lp, rows(old), rows(advantages), rows(ref), clip_eps=0.2,
                                kl_coef=0.04)  # fmt: skip
            trainer.optimizer_step(trainer.backward(loss))
    assert trainer.counter.n == backend.trainer.counter.n == 8
    for (name, p), q in zip(trainer.model.named_parameters(), backend.trainer.model.parameters(),
                            strict=True):  # fmt: skip
        assert torch.equal(p, q), name


@pytest.mark.parametrize("schedule", [VERL, ScheduleSpec(name="rollplex")])
@pytest.mark.parametrize("trainable_vision", [False, True])
def test_without_a_reference_model(trainable_vision: bool, schedule: ScheduleSpec) -> None:
    """Without a reference role, the old-logprob forward and its frozen tower run on the
    trainer's scorer."""
    algo = _algo(2, 2).model_copy(update={"use_reference": False, "kl_coef": 0.0})
    model = MODEL.model_copy(update={"trainable_vision": trainable_vision})
    backend, rec, _ = _run(algo, schedule, model)
    assert backend.reference is None and backend.trainer.counter.n == 4
    assert rec.updates[0]["log_ratio"].abs().max() < 1e-5
    assert rec.updates[-1]["log_ratio"].abs().max() > 1e-3


def test_ppo_critic_loops_with_the_actor() -> None:
    backend, _rec, result = _run(_algo(2, 2, name="ppo"))
    assert backend.trainer.counter.n == 4 and backend.critic.counter.n == 4
    assert result.metrics["clip_frac"] > 0 and math.isfinite(result.metrics["vf_loss"])


@pytest.mark.parametrize("overlap", ["piggyback", "streams"])
def test_overlapped_schedules_equal_serial_bit_for_bit(two_epochs, overlap) -> None:
    """The mini-batched step keeps Rollplex's promise: the overlapped schedule trains the
    same weights as the serial one with the same dedup."""
    serial, _, serial_result = _run(_algo(1, 2), ScheduleSpec(name="serial"))
    rollplex, rec, result = _run(_algo(1, 2), ScheduleSpec(name="rollplex", overlap=overlap))
    # the old-logprob prefix reads the decode's version: it overlaps decode, as planned
    old = next(s for s in rec.planned.plan.devices[0].steps if s.name.startswith(
        "reference.old_logprob_prefix"))  # fmt: skip
    assert old.corun.value == overlap
    assert not [m for ms in rec.executor.deviations.values() for m in ms if "old_logprob" in m]
    for p, q in zip(serial.trainer.params, rollplex.trainer.params, strict=True):
        assert torch.equal(p, q)
    assert serial_result.metrics == result.metrics


def test_a_data_parallel_rank_takes_its_share_of_each_mini_batch() -> None:
    """verl's per-rank split: each of W ranks holds a contiguous 1/W of the batch and cuts
    ppo_mini_batch_size / W of it per update; a window that cannot fall on whole local
    rows is refused by name."""
    from rollplex.backends.base import BackendError
    from rollplex.backends.torch.rows import TorchValues
    from rollplex.backends.torch.values import Responses, TokenLogprobs
    from rollplex.graph.ir import Op, Phase
    from rollplex.runtime.role_free import RoleFreeOps

    class Dispatch:
        values = TorchValues()

    ops = RoleFreeOps(Dispatch())

    def select(lo: int, hi: int, value):
        attrs = {"lo": lo, "hi": hi, "rows": 16}
        op = Op("train.mini_batch_1.x", "select_rows", Phase.TRAIN, {"x": "a"}, {"y": "b"}, attrs)
        return ops.run(op, {"x": value})["y"]

    whole, half = torch.arange(16.0), torch.arange(8.0)
    assert torch.equal(select(8, 16, whole), whole[8:16])  # one process: the window itself
    assert torch.equal(select(8, 16, half), half[4:8])  # one of 2 ranks: its half of it
    tokens = torch.arange(32).view(8, 4)
    got = select(4, 8, Responses(tokens, torch.arange(8)))
    assert torch.equal(got.tokens, tokens[2:4]) and torch.equal(got.lengths, torch.arange(2, 4))
    lp = select(4, 8, TokenLogprobs(tokens.float(), tokens > 3))
    assert torch.equal(lp.values, tokens[2:4].float()) and torch.equal(lp.mask, tokens[2:4] > 3)
    with pytest.raises(BackendError, match=r"train.mini_batch_1.x.*algo.ppo_mini_batch_size"):
        select(4, 8, torch.arange(6.0))  # 6 local rows: the window is 1.5 rows
    with pytest.raises(BackendError, match="cannot count the rows of a str"):
        select(0, 8, "not rows")
