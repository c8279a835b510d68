"""lint rejects each broken invariant with an error naming the op or value at fault."""

from __future__ import annotations

import itertools

import pytest

from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph, GraphError, Op, Phase, Value, ValueKind


def test_valid_graph_passes(grpo_7b: Graph) -> None:
    assert lint(grpo_7b) is grpo_7b


def test_cycle_is_named(grpo_tiny: Graph) -> None:
    g = grpo_tiny.copy()
    # Make the rollout's prefill read the train loss: decode -> ... -> loss -> prefill.
    g.ops["rollout.prefix_prefill"].inputs["features"] = "train.vision_encode.features"
    g.ops["train.vision_encode"].inputs["pixels"] = "rollout.advantage.advantages"
    g.invalidate()
    with pytest.raises(GraphError, match="cycle") as err:
        lint(g)
    assert "op '" in str(err.value)


def test_two_producers(grpo_tiny: Graph) -> None:
    g = grpo_tiny.copy()
    g.ops["reference.vision_encode"].outputs["features"] = "train.vision_encode.features"
    with pytest.raises(GraphError, match="two producers") as err:
        lint(g)
    assert err.value.where == "value 'train.vision_encode.features'"


def test_unproduced_input(grpo_tiny: Graph) -> None:
    g = grpo_tiny.copy()
    g.add_value(Value("ghost", (16, 16), "float32", ValueKind.ACTIVATION))
    g.ops["train.policy_loss"].inputs["old_logprobs"] = "ghost"
    with pytest.raises(GraphError, match="nothing produces") as err:
        lint(g)
    assert err.value.where == "op 'train.policy_loss'"


def test_dtype_mismatch(grpo_tiny: Graph) -> None:
    g = grpo_tiny.copy()
    g.values["rollout.decode.responses"].dtype = "float32"
    with pytest.raises(GraphError, match="expects dtype int64") as err:
        lint(g)
    assert "rollout.decode" in err.value.where


def test_shape_mismatch_along_edge(grpo_tiny: Graph) -> None:
    g = grpo_tiny.copy()
    adv = g.values["rollout.advantage.advantages"]
    adv.shape = (adv.shape[0] + 1,)
    with pytest.raises(GraphError, match="shape mismatch"):
        lint(g)


def test_stale_policy_version(grpo_tiny: Graph) -> None:
    g = grpo_tiny.copy()
    # The rollout sampled with last step's weights: every derived value is policy@-1.
    g.add_value(
        Value(
            "policy.weights.old",
            g.values["policy.weights"].shape,
            "float32",
            ValueKind.WEIGHTS,
            "policy@-1",
            external=True,
        )
    )
    g.ops["rollout.decode"].inputs["weights"] = "policy.weights.old"
    for v in ("rollout.decode.responses", "rollout.decode.logprobs"):
        g.values[v].version = "policy@-1"
    with pytest.raises(GraphError, match="stale policy") as err:
        lint(g)
    assert err.value.where.startswith("op 'train.")


def test_stale_rollout_cannot_be_relabelled_fresh() -> None:
    """Prefill with fresh weights, decode with last step's: the builder stamps the decode's
    outputs with its first policy input (the fresh kv), but lineage still sees policy@-1."""
    from rollplex.graph.builder import StepBuilder
    from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS

    b = StepBuilder(MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"])
    policy = b.weights("policy")
    w = b.graph.values[policy]
    b.graph.add_value(Value("policy.old", w.shape, w.dtype, ValueKind.WEIGHTS, "policy@-1", True))
    adam = b.optimizer_state(policy)
    prompts = b.prompts()
    g = 2
    with b.phase(Phase.ROLLOUT):
        feats = b.vision_encode(prompts.pixels, b.vision_weights(policy))
        kv = b.prefix_prefill(feats, prompts.text, policy)
        responses, old = b.decode(kv, "policy.old", group_size=g)
        advantages = b.advantage(b.reward(responses, prompts.answers, group_size=g), "grpo", g)
    assert b.graph.values[old].version == "policy@0"  # the stamp alone would let it through
    with b.phase(Phase.TRAIN):
        actor = b.per_sample_logprob(prompts, responses, policy, g, train=True)
        loss = b.policy_loss(actor["logprobs"], old, advantages, None, clip_eps=0.2, kl_coef=0)
        grads = b.backward(loss, policy, [actor["saved"]])
    with b.phase(Phase.UPDATE):
        b.optimizer_step(policy, grads, adam)
    with pytest.raises(GraphError, match=r"policy@-1.*stale policy") as err:
        b.build()
    assert err.value.where.startswith("op 'train.")


def test_unknown_port_and_kind() -> None:
    g = Graph(
        [Value("x", (2, 3, 4), "float32", ValueKind.HOST_DATA, external=True)],
        [Op("bad", "no_such_kind", Phase.ROLLOUT, {"pixels": "x"}, {})],
    )
    with pytest.raises(GraphError, match="unknown"):
        lint(g)


def test_missing_required_input(grpo_tiny: Graph) -> None:
    g = grpo_tiny.copy()
    del g.ops["rollout.decode"].inputs["weights"]
    with pytest.raises(GraphError, match="required input 'weights'"):
        lint(g)


def test_find_cycle_names_exactly_the_ops_on_it(grpo_tiny: Graph) -> None:
    g = grpo_tiny.copy()
    assert g.find_cycle() is None
    g.ops["rollout.prefix_prefill"].inputs["features"] = "train.vision_encode.features"
    g.ops["train.vision_encode"].inputs["pixels"] = "rollout.advantage.advantages"
    g.invalidate()
    cycle = g.find_cycle()
    assert cycle[0] == cycle[-1] and len(set(cycle)) == len(cycle) - 1
    made = g.producers()
    for a, b in itertools.pairwise(cycle):  # every hop is a real edge
        assert any(made.get(v) is g.ops[a] for v in g.ops[b].inputs.values()), (a, b)
    assert {"rollout.prefix_prefill", "train.vision_encode"} <= set(cycle)
