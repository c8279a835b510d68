"""PPO: a learned critic, GAE advantages, optional KL to a frozen reference.

The critic's value forward runs in the reference phase (frozen weights, no gradient, its
prefix may overlap decode); the critic trains beside the actor with its own optimizer step,
and only the policy is synced to the rollout. Written verl-style, so the dedup passes have
work to do.
"""

from __future__ import annotations

from rollplex.algos.updates import (
    critic_updates,
    mini_batches,
    old_logprob_forward,
    one_update_logprobs,
    policy_updates,
)
from rollplex.graph.builder import StepBuilder
from rollplex.graph.ir import Graph, Phase
from rollplex.specs import AlgoSpec, ModelSpec, WorkloadSpec


def build_ppo(model: ModelSpec, workload: WorkloadSpec, algo: AlgoSpec) -> Graph:
    b = StepBuilder(model, workload)
    g = workload.group_size
    updates = mini_batches(workload.prompts_per_step, algo)  # refuses a bad size first
    policy, critic = b.weights("policy"), b.weights("critic")
    ref = b.weights("ref") if algo.use_reference else None
    policy_adam, critic_adam = b.optimizer_state(policy), b.optimizer_state(critic)
    prompts = b.prompts()

    with b.phase(Phase.ROLLOUT):
        responses, old_logprobs = b.rollout(prompts, policy, g)
        rewards = b.reward(responses, prompts.answers, group_size=g)

    with b.phase(Phase.REFERENCE):
        old_values = b.per_sample_logprob(
            prompts, responses, critic, g, head="value", name="reference.critic"
        )["logprobs"]
        ref_logprobs = None
        if ref is not None:
            ref_logprobs = b.per_sample_logprob(prompts, responses, ref, g)["logprobs"]
        kl_in_reward = algo.kl_in_reward and ref_logprobs is not None
        if kl_in_reward:  # reward_t -= kl_coef * (old_t - ref_t) before GAE
            advantages, returns = b.gae(
                rewards,
                old_values,
                algo.gamma,
                algo.gae_lambda,
                kl=(old_logprobs, ref_logprobs, algo.kl_coef),
            )
        else:
            advantages, returns = b.gae(rewards, old_values, algo.gamma, algo.gae_lambda)

    if len(updates) > 1:  # PPO mini-batches and epochs (updates.py)
        old = old_logprob_forward(b, prompts, responses, policy, g)
        last = policy_updates(
            b, updates, prompts, responses, policy, policy_adam, g, old, advantages,
            None if kl_in_reward else ref_logprobs,
            clip_eps=algo.clip_eps, kl_coef=0.0 if kl_in_reward else algo.kl_coef,
            entropy_coeff=algo.entropy_coeff,
            rollout_logprobs=old_logprobs if algo.rollout_correction.enabled else None,
        )  # fmt: skip
        with b.phase(Phase.UPDATE):
            b.weight_sync(last)
        critic_updates(
            b, updates, prompts, responses, critic, critic_adam, g, returns, old_values,
            algo.value_clip,
        )  # fmt: skip
        return b.build()

    old, rollout_logprobs = one_update_logprobs(
        b, algo, prompts, responses, policy, g, old_logprobs
    )
    with b.phase(Phase.TRAIN):
        actor = b.per_sample_logprob(prompts, responses, policy, g, train=True)
        # with kl_in_reward a loss KL term too only if kl_loss_coef asks (verl's use_kl_loss)
        loss_kl = algo.kl_loss_coef if kl_in_reward else algo.kl_coef
        loss = b.policy_loss(
            actor["logprobs"],
            old,
            advantages,
            None if kl_in_reward and not loss_kl else ref_logprobs,
            rollout_logprobs=rollout_logprobs,
            clip_eps=algo.clip_eps,
            entropy_coeff=algo.entropy_coeff,
            kl_coef=loss_kl or 0.0,
        )
        policy_grads = b.backward(loss, policy, [actor["saved"]])

        values = b.per_sample_logprob(
            prompts, responses, critic, g, train=True, head="value", name="train.critic"
        )
        critic_loss = b.value_loss(
            values["logprobs"], returns, old_values, clip_eps=algo.value_clip
        )
        critic_grads = b.backward(critic_loss, critic, [values["saved"]], "train.critic_backward")

    with b.phase(Phase.UPDATE):
        new_policy, _ = b.optimizer_step(policy, policy_grads, policy_adam)
        b.weight_sync(new_policy)
        b.optimizer_step(critic, critic_grads, critic_adam, name="update.critic_optimizer_step")
    return b.build()
