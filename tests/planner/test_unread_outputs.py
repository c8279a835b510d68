"""Outputs nobody reads: a value that a segmented or chunked op writes lives until that op's
last piece ends (planner/lifetimes.py), so no slot reuses its bytes while it is written.

The audit's case (a custom GRPO that leaves the rollout's logprobs unread) at the shapes
it failed at, then a property over random lint-valid steps planned by every schedule."""

from __future__ import annotations

import random

import pytest

from rollplex.graph.builder import StepBuilder
from rollplex.graph.ir import Graph, Phase
from rollplex.jobs.pipeline import plan_step
from rollplex.planner.plan import dump_plan
from rollplex.planner.validate import load_plan, validate_plan
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ModelSpec,
    ScheduleSpec,
    WorkloadSpec,
)
from tests.planner.random_steps import TINY, random_case, random_schedules

RANDOM_GRAPHS = 150


def grpo_without_old_logprobs(model: ModelSpec, workload: WorkloadSpec) -> Graph:
    """GRPO whose loss takes the actor's own logprobs as the old ones (ratio 1): the
    decode's logprobs are made and never read."""
    b = StepBuilder(model, workload)
    g = workload.group_size
    policy, ref = b.weights("policy"), b.weights("ref")
    adam = b.optimizer_state(policy)
    prompts = b.prompts()
    with b.phase(Phase.ROLLOUT):
        responses, _ = b.rollout(prompts, policy, g)
        advantages = b.advantage(b.reward(responses, prompts.answers, group_size=g), "grpo", g)
    with b.phase(Phase.REFERENCE):
        ref_logprobs = b.per_sample_logprob(prompts, responses, ref, g)["logprobs"]
    with b.phase(Phase.TRAIN):
        actor = b.per_sample_logprob(prompts, responses, policy, g, train=True)
        loss = b.policy_loss(actor["logprobs"], actor["logprobs"], advantages, ref_logprobs)
        grads = b.backward(loss, policy, [actor["saved"]])
    with b.phase(Phase.UPDATE):
        new_policy, _ = b.optimizer_step(policy, grads, adam)
        b.weight_sync(new_policy)
    return b.build()


AUDIT_CASES = [
    ("tiny", WORKLOAD_PRESETS["tiny"], "auto"),
    ("tiny", WORKLOAD_PRESETS["tiny"], "piggyback"),
    *[
        (
            "qwen2_5_vl_3b",
            WORKLOAD_PRESETS[w].model_copy(update={"prompts_per_step": n}),
            "piggyback",
        )
        for w, n in (("image", 4), ("image", 8), ("video", 4), ("video", 16))
    ],
]


@pytest.mark.parametrize(("model", "workload", "overlap"), AUDIT_CASES)
def test_audit_unread_rollout_logprobs_plan(model: str, workload: WorkloadSpec, overlap: str):
    spec = MODEL_PRESETS[model]
    graph = grpo_without_old_logprobs(spec, workload)
    r = plan_step(
        spec, workload, AlgoSpec(), HARDWARE_PRESETS["h200"],
        ScheduleSpec(name="rollplex", overlap=overlap), graph=graph,
    )  # fmt: skip
    dev = r.plan.devices[0]
    # The unread logprobs live until the decode's last segment ends, whatever reads nothing.
    slot = next(s for s in dev.slots if s.value == "rollout.decode.logprobs")
    decode = [s for s in dev.steps if s.op == "rollout.decode"]
    assert max(s.end_s for s in decode) <= max(s.end_s for s in dev.steps if s.index == slot.last)
    validate_plan(r.plan, r.graph)


def test_segmented_decode_exercised():
    """The audit's case cuts the decode into segments (else it tests nothing new)."""
    spec, workload = MODEL_PRESETS["qwen2_5_vl_3b"], AUDIT_CASES[2][1]
    r = plan_step(
        spec, workload, AlgoSpec(), HARDWARE_PRESETS["h200"],
        ScheduleSpec(name="rollplex", overlap="piggyback"),
        graph=grpo_without_old_logprobs(spec, workload),
    )  # fmt: skip
    assert len([s for s in r.plan.all_steps() if s.op == "rollout.decode"]) > 1


def test_random_steps_with_unread_outputs_always_validate():
    """RANDOM_GRAPHS seeded steps (tiny model), each planned by every schedule with random
    knobs and roles, on one or two GPUs: every plan validates, also after a JSON round trip.
    The generator must reach what the bug needed: unread outputs, segmented decodes and
    chunked prefix ops."""
    unread = segmented = chunked = 0
    for seed in range(RANDOM_GRAPHS):
        case = random_case(seed)
        rng = random.Random(seed)
        hardware = HARDWARE_PRESETS[rng.choice(["h200", "h200x2"])]
        unread += bool(case.unread)
        for schedule in random_schedules(rng, hardware.num_gpus):
            r = plan_step(
                TINY, case.workload, AlgoSpec(), hardware, schedule, graph=case.graph,
                passes=case.passes, rollout=case.rollout, trainer=case.trainer,
                enforce_budget=False,
            )  # fmt: skip
            load_plan(dump_plan(r.plan), r.graph, budget=False)
            kinds = {r.graph.ops[s.op].kind for s in r.plan.all_steps() if s.chunks > 1}
            segmented += bool(kinds & {"decode", "generate"})
            chunked += bool(kinds - {"decode", "generate"})
    assert unread > RANDOM_GRAPHS // 2 and segmented > 50 and chunked > 50
