"""PPO mini-batches and epochs, as verl's `update_policy` loops them.

verl cuts the step's batch, in order, into mini-batches of `ppo_mini_batch_size` prompts
(times the group size in samples), and runs `ppo_epochs` passes over the same cut (its
`shuffle` defaults to false), one optimizer step per mini-batch. Here each update is its
own ops: rows selected, the forward with grad, the loss, the backward and the optimizer
step. Update k reads the weights version update k-1 wrote (`policy@k`), so only the first
update reads the rollout's version: it alone is on-policy, and only its forward may reuse
rollout work (lint rule 6, graph/invariants.py, holds every update's gradient path to the
version its optimizer step updates).

Old logprobs come from one detached forward at the rollout's version, before any update
(verl's `compute_log_prob`): for the first update they equal its own logprobs (ratio 1);
the later updates read them while their weights have moved, so the ratio leaves 1 and the
clip engages. With one update (the defaults) the builders keep the single-update graph.

Data-parallel ranks (FSDP2) each hold a contiguous share of the batch and take the same
share of every mini-batch (`select_rows`, runtime/role_free.py), as verl's workers split
their own rows into ppo_mini_batch_size / dp: a mini-batch's prompts then depend on the
rank count, so runs on different rank counts match only with one update. The logged loss
metrics are the mean over the step's updates (verl's `reduce_metrics` over micro-batches;
its `actor/pg_loss` alone is a sum over mini-batches, ours a mean).
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
    b: StepBuilder, prompts: Prompts, responses: str, policy: str, g: int
) -> str:
    """One detached forward at the rollout's version: the old logprobs of every update."""
    with b.phase(Phase.REFERENCE):
        out = b.per_sample_logprob(prompts, responses, policy, g, name="reference.old_logprob")
    return out["logprobs"]


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
    **loss_attrs: float,
) -> str:
    """The policy's updates, one per mini-batch; returns the last version's weights."""
    weights, state = policy, adam
    for k, mb in enumerate(updates):
        with b.phase(Phase.TRAIN):
            part, take = _rows(b, prompts, mb, g, f"mini_batch_{k}")
            actor = b.per_sample_logprob(part, take(responses, "responses"), weights, g, True)
            loss = b.policy_loss(
                actor["logprobs"],
                take(old, "old_logprobs"),
                take(advantages, "advantages"),
                take(ref_logprobs, "ref_logprobs") if ref_logprobs else None,
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
