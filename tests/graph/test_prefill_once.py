"""prefill_once (graph/passes/prefill_once.py): the rollout's prefill stands in for the
training prefix forward exactly where the graph proves they compute the same thing (same
weights value and version, same features and tokens), and nowhere else: not for a later
update (a second epoch reads the optimizer step's weights), not off-policy (the rollout
read an older version), not with a trained vision tower. PPO's critic attaches its own
no-grad forward of old values (the reference phase, same critic weights)."""

from __future__ import annotations

import pytest

from rollplex.algos import build_step
from rollplex.graph.builder import StepBuilder
from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph, Phase, ValueKind
from rollplex.graph.passes import DEDUP_PASSES, SPLIT_ONLY, run_passes
from rollplex.graph.passes.prefill_once import prefill_once
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ModelSpec, WorkloadSpec

MODELS = ["tiny", "qwen2_5_vl_3b", "qwen2_5_vl_7b"]
WORKLOADS = ["image", "video"]


def _dedup(graph: Graph) -> Graph:
    return run_passes(graph, DEDUP_PASSES)[0]


def _once(graph: Graph) -> tuple[Graph, bool]:
    out, changed = prefill_once(graph.copy())
    return lint(out), changed


def _ops(graph: Graph, kind: str, phase: Phase | None = None) -> list:
    return [op for op in graph if op.kind == kind and (phase is None or op.phase is phase)]


@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo"])
@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("model", MODELS)
def test_the_first_update_reads_the_rollouts_prefill(model, workload, algo):
    spec, load = MODEL_PRESETS[model], WORKLOAD_PRESETS[workload]
    before = _dedup(build_step(spec, load, AlgoSpec(name=algo)))
    after, changed = _once(before)
    assert changed
    (prefill,) = _ops(after, "prefix_prefill")
    attaches = {op.name: op for op in _ops(after, "attach_prefix")}
    attach = attaches.pop("train.logprob_prefix")
    exported = after.values[prefill.outputs["exported"]]
    # the policy's training prefix, no longer a forward
    assert attach.phase is Phase.TRAIN
    assert attach.inputs["exported"] == exported.name
    policy_w = after.values[prefill.inputs["weights"]]
    assert attach.inputs["weights"] == prefill.inputs["weights"]
    assert exported.version == policy_w.version == "policy@0"
    assert exported.kind is ValueKind.BOUNDARY
    assert not _ops(after, "logprob_prefix", Phase.TRAIN)  # no training prefix forward left
    if algo == "ppo":  # the critic's: from its own no-grad forward of old values, critic@0
        critic = attaches.pop("train.critic_prefix")
        source = after.ops["reference.critic_prefix"]
        assert critic.inputs["exported"] == source.outputs["exported"]
        assert critic.inputs["weights"] == source.inputs["weights"] == "critic.weights"
        assert after.values[critic.inputs["exported"]].version == "critic@0"
        (ref,) = [
            op for op in _ops(after, "logprob_prefix") if op.name == "reference.logprob_prefix"
        ]
        assert "exported" not in ref.outputs  # the frozen reference trains nothing
    assert not attaches
    # every layer's input and K/V over every prompt's prefix, and one slot more: the last
    # layer's output and the rotary the replay reads (ExportedPrefix.tensors)
    saved = before.values[before.ops["train.logprob_prefix"].outputs["saved"]]
    kv = before.values[prefill.outputs["kv"]]
    layers, rows, prefix, width = saved.shape
    assert exported.shape == (layers + 1, rows, prefix, width + 2 * kv.shape[4])
    assert exported.nbytes == (saved.nbytes + kv.nbytes) * (layers + 1) // layers
    # the backward reads the export in place of the forward's saved activations
    (policy_backward,) = [op for op in _ops(after, "backward") if op.name == "train.backward"]
    assert exported.name in policy_backward.inputs.values()
    assert saved.name not in after.values
    # nothing else changed: the same ops but one, the same response forward
    assert [op.name for op in before] == [op.name for op in after]
    assert after.ops["train.logprob_response"].inputs == before.ops["train.logprob_response"].inputs


def _two_updates(spec: ModelSpec, load: WorkloadSpec) -> Graph:
    """GRPO with a second update on the same rollout (a second PPO epoch): its forward reads
    the first optimizer step's weights (policy@1)."""
    b = StepBuilder(spec, load)
    g = load.group_size
    policy = b.weights("policy")
    adam = b.optimizer_state(policy)
    prompts = b.prompts()
    with b.phase(Phase.ROLLOUT):
        responses, old = b.rollout(prompts, policy, g)
        adv = b.advantage(b.reward(responses, prompts.answers, group_size=g), "grpo", g)
    weights, state = policy, adam
    for epoch in range(2):
        with b.phase(Phase.TRAIN):
            actor = b.per_sample_logprob(
                prompts, responses, weights, g, train=True, name=f"train.epoch{epoch}"
            )
            loss = b.policy_loss(actor["logprobs"], old, adv, name=f"train.loss{epoch}")
            grads = b.backward(loss, weights, [actor["saved"]], f"train.backward{epoch}")
        with b.phase(Phase.UPDATE):
            weights, state = b.optimizer_step(weights, grads, state, f"update.step{epoch}")
    with b.phase(Phase.UPDATE):
        b.weight_sync(weights)
    return b.build()


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("model", MODELS)
def test_a_later_update_keeps_its_forward(model, workload):
    spec, load = MODEL_PRESETS[model], WORKLOAD_PRESETS[workload]
    before = _dedup(_two_updates(spec, load))
    forwards = _ops(before, "logprob_prefix", Phase.TRAIN)
    assert [before.values[op.inputs["weights"]].version for op in forwards] == [
        "policy@0",
        "policy@1",
    ]
    after, changed = _once(before)
    assert changed
    (attach,) = _ops(after, "attach_prefix")
    (kept,) = _ops(after, "logprob_prefix", Phase.TRAIN)
    assert attach.name == forwards[0].name  # the first update: the rollout's version
    assert kept.name == forwards[1].name and kept.inputs == forwards[1].inputs
    assert "saved" in kept.outputs  # the second keeps its forward and its activations


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("model", MODELS)
def test_an_off_policy_rollout_is_left_alone(model, workload):
    """The rollout decodes with an older policy (a stale weights value): the training
    forward reads other weights, so nothing is reused. (lint refuses such a step as not
    on-policy; the pass, run on it anyway, must not make it look like one.)"""
    graph = _dedup(build_step(MODEL_PRESETS[model], WORKLOAD_PRESETS[workload], AlgoSpec()))
    current = graph.values["policy.weights"]
    stale = current.clone(name="policy.stale", version="policy@-1")
    graph.add_value(stale)
    for op in graph:
        if op.phase is Phase.ROLLOUT and op.inputs.get("weights") == current.name:
            op.inputs["weights"] = stale.name
    graph.invalidate()
    after, changed = prefill_once(graph)
    assert not changed and not _ops(after, "attach_prefix")


def test_a_trained_vision_tower_keeps_the_training_forward():
    spec = MODEL_PRESETS["tiny"].model_copy(update={"trainable_vision": True})
    graph = _dedup(build_step(spec, WORKLOAD_PRESETS["tiny"], AlgoSpec()))
    train = graph.ops["train.logprob_prefix"]
    (prefill,) = _ops(graph, "prefix_prefill")
    assert train.inputs["features"] != prefill.inputs["features"]  # its own, with grad
    assert not _once(graph)[1]


def test_verls_unsplit_forward_is_left_alone():
    graph = run_passes(
        build_step(MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"], AlgoSpec()),
        SPLIT_ONLY,  # split, but per sample: the training prefix reads expanded rows
    )[0]
    assert not _once(graph)[1]
