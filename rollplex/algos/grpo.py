"""GRPO: G samples per prompt, group-normalised rewards as advantages, optional KL to a
frozen reference. Written the way verl runs it: the reference and training phases
recompute vision and prefix per sample. The dedup passes remove that redundancy."""

from __future__ import annotations

from rollplex.algos.updates import (
    mini_batches,
    old_logprob_forward,
    one_update_logprobs,
    policy_updates,
)
from rollplex.graph.builder import StepBuilder
from rollplex.graph.ir import Graph, Phase
from rollplex.specs import AlgoSpec, ModelSpec, WorkloadSpec
from rollplex.specs.algo import TOKEN_WHITENED


def build_grpo(
    model: ModelSpec, workload: WorkloadSpec, algo: AlgoSpec, estimator: str = "grpo"
) -> Graph:
    """`estimator` names the advantage: "grpo" (group-normalised), "rloo" (leave-one-out)
    or "reinforce_plus_plus_baseline" (group-centred, whitened over the batch's tokens)."""
    b = StepBuilder(model, workload)
    g = workload.group_size
    updates = mini_batches(workload.prompts_per_step, algo)  # refuses a bad size first
    policy = b.weights("policy")
    ref = b.weights("ref") if algo.use_reference else None
    adam = b.optimizer_state(policy)
    prompts = b.prompts()

    with b.phase(Phase.ROLLOUT):
        responses, old_logprobs = b.rollout(prompts, policy, g)
        rewards = b.reward(responses, prompts.answers, group_size=g)
        whitened = estimator in TOKEN_WHITENED  # it reads the responses' lengths
        advantages = b.advantage(
            rewards, estimator, group_size=g, responses=responses if whitened else None
        )
    # what the training forwards read to skip all-0 groups (algo.skip_zero_advantage)
    live = advantages if algo.skip_zero_advantage else None

    ref_logprobs = None
    if ref is not None:
        with b.phase(Phase.REFERENCE):
            ref_logprobs = b.per_sample_logprob(prompts, responses, ref, g)["logprobs"]

    if len(updates) > 1:  # PPO mini-batches and epochs (updates.py)
        old = old_logprob_forward(b, prompts, responses, policy, g, live)
        last = policy_updates(
            b, updates, prompts, responses, policy, adam, g, old, advantages, ref_logprobs,
            skip_zero_advantage=live is not None, clip_eps=algo.clip_eps,
            kl_coef=algo.kl_coef, entropy_coeff=algo.entropy_coeff,
            rollout_logprobs=old_logprobs if algo.rollout_correction.enabled else None,
        )  # fmt: skip
        with b.phase(Phase.UPDATE):
            b.weight_sync(last)
        return b.build()

    old, rollout_logprobs = one_update_logprobs(
        b, algo, prompts, responses, policy, g, old_logprobs, live
    )
    with b.phase(Phase.TRAIN):
        actor = b.per_sample_logprob(prompts, responses, policy, g, train=True, live=live)
        loss = b.policy_loss(
            actor["logprobs"],
            old,
            advantages,
            ref_logprobs,
            rollout_logprobs=rollout_logprobs,
            clip_eps=algo.clip_eps,
            entropy_coeff=algo.entropy_coeff,
            kl_coef=algo.kl_coef,
        )
        grads = b.backward(loss, policy, [actor["saved"]])

    with b.phase(Phase.UPDATE):
        new_policy, _ = b.optimizer_step(policy, grads, adam)
        b.weight_sync(new_policy)
    return b.build()
