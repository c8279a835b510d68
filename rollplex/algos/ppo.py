"""PPO: a learned critic, GAE advantages, optional KL to a frozen reference.

The critic's value forward before training runs in the reference phase: like the
reference it scores the finished responses with weights that are frozen until this step's
update, needs no gradient, and its prefix can overlap decode. The critic then trains on
the returns next to the actor and gets its own optimizer step; only the policy is synced
to the rollout. Written verl-style (every model re-encodes per sample), so the dedup
passes have work to do. PPO usually samples once per prompt, but any group size works."""

from __future__ import annotations

from rollplex.graph.builder import StepBuilder
from rollplex.graph.ir import Graph, Phase
from rollplex.specs import AlgoSpec, ModelSpec, WorkloadSpec


def build_ppo(model: ModelSpec, workload: WorkloadSpec, algo: AlgoSpec) -> Graph:
    b = StepBuilder(model, workload)
    g = workload.group_size
    policy, critic = b.weights("policy"), b.weights("critic")
    ref = b.weights("ref") if algo.use_reference else None
    policy_adam, critic_adam = b.optimizer_state(policy), b.optimizer_state(critic)
    prompts = b.prompts()

    with b.phase(Phase.ROLLOUT):
        feats = b.vision_encode(prompts.pixels, b.vision_weights(policy))
        kv = b.prefix_prefill(feats, prompts.text, policy)
        responses, old_logprobs = b.decode(kv, policy, group_size=g)
        rewards = b.reward(responses, prompts.answers, group_size=g)

    with b.phase(Phase.REFERENCE):
        pixels = b.expand(prompts.pixels, g, name="reference.expand_pixels")
        text = b.expand(prompts.text, g, name="reference.expand_text")
        critic_feats = b.vision_encode(
            pixels, b.vision_weights(critic), name="reference.critic_vision_encode"
        )
        old_values = b.logprob(
            critic_feats, text, responses, critic, head="value", name="reference.critic"
        )["logprobs"]
        advantages, returns = b.gae(rewards, old_values, algo.gamma, algo.gae_lambda)
        ref_logprobs = None
        if ref is not None:
            ref_feats = b.vision_encode(pixels, b.vision_weights(ref))
            ref_logprobs = b.logprob(ref_feats, text, responses, ref)["logprobs"]

    with b.phase(Phase.TRAIN):
        pixels = b.expand(prompts.pixels, g, name="train.expand_pixels")
        text = b.expand(prompts.text, g, name="train.expand_text")
        actor_feats = b.vision_encode(pixels, b.vision_weights(policy))
        actor = b.logprob(actor_feats, text, responses, policy, train=True)
        loss = b.policy_loss(
            actor["logprobs"],
            old_logprobs,
            advantages,
            ref_logprobs,
            clip_eps=algo.clip_eps,
            kl_coef=algo.kl_coef,
        )
        policy_grads = b.backward(loss, policy, [actor["saved"]])

        critic_feats = b.vision_encode(
            pixels, b.vision_weights(critic), name="train.critic_vision_encode"
        )
        values = b.logprob(
            critic_feats, text, responses, critic, train=True, head="value", name="train.critic"
        )
        critic_loss = b.value_loss(values["logprobs"], returns, old_values)
        critic_grads = b.backward(critic_loss, critic, [values["saved"]], "train.critic_backward")

    with b.phase(Phase.UPDATE):
        new_policy, _ = b.optimizer_step(policy, policy_grads, policy_adam)
        b.weight_sync(new_policy)
        b.optimizer_step(critic, critic_grads, critic_adam, name="update.critic_optimizer_step")
    return b.build()
