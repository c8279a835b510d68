"""Random lint-valid RL steps for property tests: custom GRPO/PPO-like graphs that leave
some outputs unread (the rollout's logprobs, a reference's scores, an extra reward, a
critic's old values), over random workloads, roles and schedule knobs. Seeded: one
`random.Random` decides everything, so a failing case is replayed by its seed."""

from __future__ import annotations

import random
from dataclasses import dataclass

from rollplex.graph.builder import StepBuilder
from rollplex.graph.ir import Graph, Phase
from rollplex.graph.passes import DEDUP_PASSES, SPLIT_ONLY, PassFn
from rollplex.specs import (
    MODEL_PRESETS,
    ModelSpec,
    ResponseLengthSpec,
    ScheduleSpec,
    WorkloadSpec,
)
from rollplex.specs.roles import (
    FSDP_TRAINER,
    TORCH_ROLLOUT,
    TORCH_SCORER,
    VLLM_ROLLOUT,
    RoleCapabilities,
)

TINY = MODEL_PRESETS["tiny"]


@dataclass(slots=True)
class StepCase:
    seed: int
    graph: Graph
    workload: WorkloadSpec
    unread: list[str]  # outputs the step makes and nobody reads
    passes: tuple[PassFn, ...] | None  # None: the schedule's own
    rollout: RoleCapabilities | None
    trainer: RoleCapabilities | None


def random_workload(rng: random.Random) -> WorkloadSpec:
    dist = rng.choice(["fixed", "uniform", "lognormal"])
    mean = rng.randint(2, 24)
    length = ResponseLengthSpec(
        distribution=dist,
        mean=mean,
        min=rng.randint(1, mean),
        max=rng.randint(2 * mean, 4 * mean) if dist != "fixed" else mean,
        sigma=rng.uniform(0.2, 1.0),
    )
    return WorkloadSpec(
        name="random",
        prompts_per_step=rng.randint(1, 12),
        group_size=rng.randint(1, 4),
        frames=rng.randint(1, 3),
        height=28 * rng.randint(1, 3),
        width=28 * rng.randint(1, 3),
        text_tokens=rng.randint(1, 48),
        response_length=length,
    )


def random_step(rng: random.Random, model: ModelSpec, workload: WorkloadSpec) -> tuple:
    """(graph, unread outputs): a GRPO or PPO-shaped step with random parts left unread."""
    b = StepBuilder(model, workload)
    g = workload.group_size
    ppo = rng.random() < 0.3
    policy = b.weights("policy")
    ref = b.weights("ref") if rng.random() < 0.6 else None
    critic = b.weights("critic") if ppo else None
    adam = b.optimizer_state(policy)
    prompts = b.prompts()
    unread: list[str] = []

    with b.phase(Phase.ROLLOUT):
        responses, old_logprobs = b.rollout(prompts, policy, g)
        rewards = b.reward(responses, prompts.answers, group_size=g)
        if rng.random() < 0.3:  # a second rule reward nobody reads
            unread.append(b.reward(responses, prompts.answers, group_size=g))
        if not ppo:
            advantages = b.advantage(rewards, rng.choice(["grpo", "rloo"]), group_size=g)

    ref_logprobs = old_values = returns = None
    with b.phase(Phase.REFERENCE):
        if ref is not None:
            ref_logprobs = b.per_sample_logprob(prompts, responses, ref, g)["logprobs"]
        if critic is not None:
            old_values = b.per_sample_logprob(
                prompts, responses, critic, g, head="value", name="reference.critic"
            )["logprobs"]
            advantages, returns = b.gae(rewards, old_values, 1.0, 0.95)

    with b.phase(Phase.TRAIN):
        actor = b.per_sample_logprob(prompts, responses, policy, g, train=True)
        old = old_logprobs
        if rng.random() < 0.5:  # the audit's case: the rollout's logprobs go unread
            old, unread = actor["logprobs"], [*unread, old_logprobs]
        use_ref = ref_logprobs is not None and rng.random() < 0.6
        if ref_logprobs is not None and not use_ref:
            unread.append(ref_logprobs)
        loss = b.policy_loss(actor["logprobs"], old, advantages, ref_logprobs if use_ref else None)
        grads = b.backward(loss, policy, [actor["saved"]])
        if critic is not None:
            values = b.per_sample_logprob(
                prompts, responses, critic, g, train=True, head="value", name="train.critic"
            )
            keep_old = rng.random() < 0.5
            if not keep_old:
                unread.append(old_values)
            critic_loss = b.value_loss(
                values["logprobs"], returns, old_values if keep_old else None
            )
            critic_grads = b.backward(critic_loss, critic, [values["saved"]], "train.critic_bwd")

    with b.phase(Phase.UPDATE):
        new_policy, _ = b.optimizer_step(policy, grads, adam)
        b.weight_sync(new_policy)
        if critic is not None:
            b.optimizer_step(critic, critic_grads, b.optimizer_state(critic), "update.critic_opt")
    return b.build(), unread


def random_case(seed: int, model: ModelSpec = TINY) -> StepCase:
    rng = random.Random(seed)
    workload = random_workload(rng)
    graph, unread = random_step(rng, model, workload)
    # No passes keeps every unread output (dead-op elimination would drop whole ops).
    passes = rng.choice([(), (), SPLIT_ONLY, DEDUP_PASSES, None])
    rollout = rng.choice([None, TORCH_ROLLOUT, VLLM_ROLLOUT])
    trainer = rng.choice([None, TORCH_SCORER, FSDP_TRAINER])
    return StepCase(seed, graph, workload, unread, passes, rollout, trainer)


def random_schedules(rng: random.Random, gpus: int) -> list[ScheduleSpec]:
    """One schedule of each kind (and each rollplex overlap mode), random knobs; chunks
    small enough that prefix work is cut into pieces and the decode into segments."""

    def knobs() -> dict:
        return {
            "chunk_tokens": rng.choice([16, 64, 256, 8192]),
            "train_micro_tokens": rng.choice([32, 512, 16384]),
            "train_micro_recompute": rng.random() < 0.3,
            "memory_strategy": rng.choice(["naive", "greedy_by_size"]),
        }

    out = [
        ScheduleSpec(name="serial", dedup=False, **knobs()),
        ScheduleSpec(name="serial", **knobs()),
    ]
    for overlap in ("auto", "piggyback", "streams", "sm_partition"):
        out.append(ScheduleSpec(name="rollplex", overlap=overlap, overlap_min_gain=0.0, **knobs()))
    # the ride again without prefill once, which leaves it a prefix forward to ride (auto
    # seldom rides: a ride pays its launches and an eager decode step)
    out.append(ScheduleSpec(name="rollplex", overlap="piggyback", prefill_once=False, **knobs()))
    if gpus > 1:
        out.append(ScheduleSpec(name="disaggregated", **knobs()))
    return out
