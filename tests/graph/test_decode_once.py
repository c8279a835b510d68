"""decode_once (graph/passes/decode_once.py): the rollout's decode stands in for the training
response forward exactly where the graph proves they compute the same thing (the decode's
own responses, same weights value and version, the LM head), and nowhere else: not for a
later update (a second epoch reads the optimizer step's weights), not off-policy (the
rollout read an older version), not for PPO's critic (other weights), not for the
reference (frozen weights), not for verl's unsplit per-sample forward."""

from __future__ import annotations

import pytest

from rollplex.algos import build_step
from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph, Phase, ValueKind
from rollplex.graph.passes import SPLIT_ONLY, run_passes
from rollplex.graph.passes.decode_once import decode_once
from rollplex.graph.passes.prefill_once import prefill_once
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec
from tests.graph.test_prefill_once import MODELS, WORKLOADS, _dedup, _ops, _two_updates


def _once(graph: Graph) -> tuple[Graph, bool]:
    out, changed = decode_once(graph.copy())
    return lint(out), changed


@pytest.mark.parametrize("with_prefill_once", [False, True])
@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo"])
@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("model", MODELS)
def test_the_first_update_reads_the_rollouts_decode(model, workload, algo, with_prefill_once):
    spec, load = MODEL_PRESETS[model], WORKLOAD_PRESETS[workload]
    before = _dedup(build_step(spec, load, AlgoSpec(name=algo)))
    if with_prefill_once:
        before = lint(prefill_once(before)[0])
    after, changed = _once(before)
    assert changed
    (decode,) = _ops(after, "decode")
    (attach,) = _ops(after, "attach_response")  # the policy's only: the critic keeps its own
    assert attach.name == "train.logprob_response" and attach.phase is Phase.TRAIN
    kept = after.values[decode.outputs["kept"]]
    assert attach.inputs["kept"] == kept.name
    assert attach.inputs["weights"] == decode.inputs["weights"] == "policy.weights"
    assert kept.version == after.values["policy.weights"].version == "policy@0"
    assert kept.kind is ValueKind.BOUNDARY
    train = before.ops["train.logprob_response"]
    assert attach.inputs["kv"] == train.inputs["kv"]  # the training prefix (or its attach)
    assert attach.inputs["responses"] == decode.outputs["responses"]
    assert attach.outputs == {"logprobs": train.outputs["logprobs"]}
    assert attach.attrs == train.attrs
    # every layer's output of every response token, as the forward's saved inputs
    saved = before.values[train.outputs["saved"]]
    assert kept.shape == saved.shape and kept.nbytes == saved.nbytes
    (backward,) = [op for op in _ops(after, "backward") if op.name == "train.backward"]
    assert kept.name in backward.inputs.values()
    assert saved.name not in after.values
    if algo == "ppo":  # the critic scores with its own weights: its forward stays
        critic = after.ops["train.critic_response"]
        assert critic.kind == "logprob_response" and "saved" in critic.outputs
    for op in _ops(after, "logprob_response", Phase.REFERENCE):
        assert op == before.ops[op.name]
    assert [op.name for op in before] == [op.name for op in after]


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("model", MODELS)
def test_a_later_update_keeps_its_forward(model, workload):
    spec, load = MODEL_PRESETS[model], WORKLOAD_PRESETS[workload]
    before = _dedup(_two_updates(spec, load))
    forwards = _ops(before, "logprob_response", Phase.TRAIN)
    assert [before.values[op.inputs["weights"]].version for op in forwards] == [
        "policy@0",
        "policy@1",
    ]
    after, changed = _once(before)
    assert changed
    (attach,) = _ops(after, "attach_response")
    (kept,) = _ops(after, "logprob_response", Phase.TRAIN)
    assert attach.name == forwards[0].name  # the first update: the rollout's version
    assert kept.name == forwards[1].name and kept.inputs == forwards[1].inputs
    assert "saved" in kept.outputs  # the second keeps its forward and its activations


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("model", MODELS)
def test_an_off_policy_rollout_is_left_alone(model, workload):
    """The rollout decodes with an older policy (a stale weights value): the training
    forward reads other weights, so nothing is reused."""
    graph = _dedup(build_step(MODEL_PRESETS[model], WORKLOAD_PRESETS[workload], AlgoSpec()))
    current = graph.values["policy.weights"]
    stale = current.clone(name="policy.stale", version="policy@-1")
    graph.add_value(stale)
    for op in graph:
        if op.phase is Phase.ROLLOUT and op.inputs.get("weights") == current.name:
            op.inputs["weights"] = stale.name
    graph.invalidate()
    after, changed = decode_once(graph)
    assert not changed and not _ops(after, "attach_response")
    assert "kept" not in _ops(after, "decode")[0].outputs


def test_a_same_named_weights_value_of_another_version_is_left_alone():
    graph = _dedup(build_step(MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"], AlgoSpec()))
    graph.values["policy.weights"] = graph.values["policy.weights"].clone(version=None)
    assert not decode_once(graph)[1]


def test_verls_unsplit_forward_is_left_alone():
    graph = run_passes(
        build_step(MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"], AlgoSpec()),
        SPLIT_ONLY,  # split, but per sample: the training response reads expanded rows
    )[0]
    assert not _once(graph)[1]
