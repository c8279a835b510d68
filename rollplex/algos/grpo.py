"""GRPO: G samples per prompt, group-normalised rewards as advantages, optional KL to a
frozen reference. Written the way verl runs it: the reference and training phases
recompute vision and prefix per sample. The dedup passes remove that redundancy."""

from __future__ import annotations

from rollplex.graph.builder import StepBuilder
from rollplex.graph.ir import Graph, Phase
from rollplex.specs import AlgoSpec, ModelSpec, WorkloadSpec


def build_grpo(
    model: ModelSpec, workload: WorkloadSpec, algo: AlgoSpec, estimator: str = "grpo"
) -> Graph:
    """`estimator` names the advantage: "grpo" (group-normalised) or "rloo" (leave-one-out)."""
    b = StepBuilder(model, workload)
    g = workload.group_size
    policy = b.weights("policy")
    ref = b.weights("ref") if algo.use_reference else None
    adam = b.optimizer_state(policy)
    prompts = b.prompts()

    with b.phase(Phase.ROLLOUT):
        feats = b.vision_encode(prompts.pixels, b.vision_weights(policy))
        kv = b.prefix_prefill(feats, prompts.text, policy)
        responses, old_logprobs = b.decode(kv, policy, group_size=g)
        rewards = b.reward(responses, prompts.answers, group_size=g)
        advantages = b.advantage(rewards, estimator, group_size=g)

    ref_logprobs = None
    if ref is not None:
        with b.phase(Phase.REFERENCE):
            pixels = b.expand(prompts.pixels, g, name="reference.expand_pixels")
            text = b.expand(prompts.text, g, name="reference.expand_text")
            ref_feats = b.vision_encode(pixels, b.vision_weights(ref))
            ref_logprobs = b.logprob(ref_feats, text, responses, ref)["logprobs"]

    with b.phase(Phase.TRAIN):
        pixels = b.expand(prompts.pixels, g, name="train.expand_pixels")
        text = b.expand(prompts.text, g, name="train.expand_text")
        train_feats = b.vision_encode(pixels, b.vision_weights(policy))
        actor = b.logprob(train_feats, text, responses, policy, train=True)
        loss = b.policy_loss(
            actor["logprobs"],
            old_logprobs,
            advantages,
            ref_logprobs,
            clip_eps=algo.clip_eps,
            kl_coef=algo.kl_coef,
        )
        grads = b.backward(loss, policy, [actor["saved"]])

    with b.phase(Phase.UPDATE):
        new_policy, _ = b.optimizer_step(policy, grads, adam)
        b.weight_sync(new_policy)
    return b.build()
