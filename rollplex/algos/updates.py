"""PPO mini-batches and epochs, as verl's `update_policy` loops them.

`ppo_epochs` passes over mini-batches of `ppo_mini_batch_size` prompts, each update its own
ops (rows, forward, loss, backward, optimizer step) reading the version the previous update
wrote: only the first is on-policy. Old logprobs come from one detached forward at the
rollout's version. Data-parallel rules: `policy_updates`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollplex.graph.builder import Prompts, StepBuilder
from rollplex.graph.ir import Phase
from rollplex.specs import AlgoSpec


@dataclass(slots=True, frozen=True)
class MiniBatch:
    """Prompt rows [lo, hi) of one update, in epoch `epoch`."""

    epoch: int
    lo: int
    hi: int


def mini_batches(prompts: int, algo: AlgoSpec) -> list[MiniBatch]:
    """The updates of one step, in order: epochs x ceil(prompts / ppo_mini_batch_size).
    A last mini-batch may be smaller (verl's `DataProto.split` does the same); a mini-batch
    larger than the batch is refused, as verl's actor config does."""
    size = algo.ppo_mini_batch_size or prompts
    if size > prompts:
        raise ValueError(
            f"algo.ppo_mini_batch_size={size} exceeds the step's batch of "
            f"workload.prompts_per_step={prompts} prompts"
        )
    return [
        MiniBatch(epoch, lo, min(lo + size, prompts))
        for epoch in range(algo.ppo_epochs)
        for lo in range(0, prompts, size)
    ]


def old_logprob_forward(
    b: StepBuilder, prompts: Prompts, responses: str, policy: str, g: int, live: str | None = None
) -> str:
    """One detached forward at the rollout's version: the old logprobs of every update.
    `live` (the advantages, skip_zero_advantage): rows no update trains are not scored."""
    with b.phase(Phase.REFERENCE):
        name = "reference.old_logprob"
        out = b.per_sample_logprob(prompts, responses, policy, g, name=name, live=live)
    return out["logprobs"]


def one_update_logprobs(
    b: StepBuilder,
    algo: AlgoSpec,
    prompts: Prompts,
    responses: str,
    policy: str,
    g: int,
    rollout_logprobs: str,
    live: str | None = None,
) -> tuple[str | None, str | None]:
    """(old, rollout) logprobs of a one-update step's policy loss. Without rollout
    correction the rollout's are the old ones (or, where it returns none, the trainer's
    own). With it the rollout's feed the correction, and the old ones are the trainer's:
    its own, detached, for IS weights alone, or the old-logprob forward's where rejection
    must know every row's ratio before the training forward (micro-batches and data-parallel
    ranks weigh their terms by the kept tokens)."""
    rc = algo.rollout_correction
    if not rc.enabled:
        return rollout_logprobs, None
    old = None
    if rc.rejects:
        old = old_logprob_forward(b, prompts, responses, policy, g, live)
    return old, rollout_logprobs


def policy_updates(
    b: StepBuilder,
    updates: list[MiniBatch],
    prompts: Prompts,
    responses: str,
    policy: str,
    adam: str,
    g: int,
    old: str,
    advantages: str,
    ref_logprobs: str | None,
    skip_zero_advantage: bool = False,
    rollout_logprobs: str | None = None,
    **loss_attrs: float,
) -> str:
    """The policy's updates, one per mini-batch; returns the last version's weights.

    Data-parallel ranks each take the same share of every mini-batch (`select_rows`), as
    verl's workers do, so runs on different rank counts match only with one update. Logged
    loss metrics are the mean over the step's updates. `skip_zero_advantage`: each training
    forward reads its mini-batch's advantages, to skip the rows of all-0 groups.
    `rollout_logprobs`: the rollout engine's, for algo.rollout_correction."""
    weights, state = policy, adam
    for k, mb in enumerate(updates):
        with b.phase(Phase.TRAIN):
            part, take = _rows(b, prompts, mb, g, f"mini_batch_{k}")
            adv = take(advantages, "advantages")
            live = adv if skip_zero_advantage else None
            actor = b.per_sample_logprob(
                part, take(responses, "responses"), weights, g, True, live=live
            )
            loss = b.policy_loss(
                actor["logprobs"],
                take(old, "old_logprobs"),
                adv,
                take(ref_logprobs, "ref_logprobs") if ref_logprobs else None,
                rollout_logprobs=(
                    take(rollout_logprobs, "rollout_logprobs") if rollout_logprobs else None
                ),
                **loss_attrs,
            )
            grads = b.backward(loss, weights, [actor["saved"]])
        with b.phase(Phase.UPDATE):
            weights, state = b.optimizer_step(weights, grads, state)
    return weights


def critic_updates(
    b: StepBuilder,
    updates: list[MiniBatch],
    prompts: Prompts,
    responses: str,
    critic: str,
    adam: str,
    g: int,
    returns: str,
    old_values: str,
    clip_eps: float,
) -> str:
    """PPO's critic on the same mini-batches and epochs (verl's critic defaults to the
    actor's ppo_mini_batch_size and ppo_epochs); returns the last version's weights."""
    weights, state = critic, adam
    for k, mb in enumerate(updates):
        with b.phase(Phase.TRAIN):
            part, take = _rows(b, prompts, mb, g, f"critic_mini_batch_{k}")
            values = b.per_sample_logprob(
                part,
                take(responses, "responses"),
                weights,
                g,
                train=True,
                head="value",
                name=f"train.critic_{k}",
            )
            loss = b.value_loss(
                values["logprobs"],
                take(returns, "returns"),
                take(old_values, "old_values"),
                clip_eps=clip_eps,
            )
            grads = b.backward(loss, weights, [values["saved"]], f"train.critic_backward_{k}")
        with b.phase(Phase.UPDATE):
            weights, state = b.optimizer_step(
                weights, grads, state, name=f"update.critic_optimizer_step_{k}"
            )
    return weights


def _rows(b: StepBuilder, prompts: Prompts, mb: MiniBatch, g: int, tag: str):
    """The mini-batch's prompts, and a function taking its samples' rows of a value."""

    def take(value: str, what: str) -> str:
        return b.select_rows(value, mb.lo * g, mb.hi * g, f"train.{tag}.{what}")

    return b.select_prompts(prompts, mb.lo, mb.hi, tag), take
