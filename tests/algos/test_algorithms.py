"""Every algorithm builds a linted, on-policy step, and the dedup passes keep its meaning
while running each prefix once per prompt instead of once per sample."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rollplex.algos import ALGORITHMS, build_step
from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph, GraphError, Op, Phase, Value, ValueKind, version_model
from rollplex.graph.lineage import lineage
from rollplex.graph.passes import DEDUP_PASSES, SPLIT_ONLY, run_passes
from rollplex.graph.serialize import from_json, stable_hash, to_json
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec

PRESETS = {"7b": ("qwen2_5_vl_7b", "video"), "tiny": ("tiny", "tiny")}
# Ports whose values the passes must keep (a train logprob's `saved` is split by design).
TRACKED = {
    "logprob": "logprobs",
    "reward": "rewards",
    "advantage": "advantages",
    "policy_loss": "loss",
    "value_loss": "loss",
}
PREFIX_ROWS = {"vision_encode": "pixels", "logprob_prefix": "features"}
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_algorithm.py"


def _build(
    algo: str, use_reference: bool, trainable_vision: bool, preset: str = "7b", group_size=None
) -> Graph:
    model_name, workload_name = PRESETS[preset]
    model = MODEL_PRESETS[model_name].model_copy(update={"trainable_vision": trainable_vision})
    workload = WORKLOAD_PRESETS[workload_name]
    if group_size is not None:
        workload = workload.model_copy(update={"group_size": group_size})
    spec = AlgoSpec(name=algo, use_reference=use_reference, kl_coef=0.04 * use_reference)
    return build_step(model, workload, spec)


def _reads(graph: Graph, op_kind: str, weights: str) -> list[str]:
    return [op.name for op in graph if op.kind == op_kind and op.inputs["weights"] == weights]


def test_registry_covers_the_algo_spec() -> None:
    assert set(ALGORITHMS) == set(AlgoSpec.model_fields["name"].annotation.__args__)


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("trainable_vision", [False, True])
@pytest.mark.parametrize("use_reference", [False, True])
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_builds_and_lints(algo: str, use_reference: bool, trainable_vision: bool, preset: str):
    g = _build(algo, use_reference, trainable_vision, preset)
    assert lint(g) is g
    assert stable_hash(from_json(to_json(g))) == stable_hash(g)  # attrs are plain data
    assert bool(_reads(g, "logprob", "ref.weights")) == use_reference
    # A frozen tower is one shared value; a trained one is part of each model's weights.
    assert ("vision.weights" in g.values) != trainable_vision
    (estimator,) = {op.attrs["estimator"] for op in g if op.kind == "advantage"}
    assert estimator == {"ppo": "gae"}.get(algo, algo)
    # The rollout gets exactly the one new policy.
    (sync,) = [op for op in g if op.kind == "weight_sync"]
    assert g.values[sync.inputs["weights"]].version == "policy@1"
    after, _ = run_passes(g, DEDUP_PASSES)  # lints after every pass
    n = WORKLOAD_PRESETS[PRESETS[preset][1]].prompts_per_step
    assert set(_prefix_rows(after).values()) == {n}  # every prefix once per prompt


@pytest.mark.parametrize("trainable_vision", [False, True])
@pytest.mark.parametrize("use_reference", [False, True])
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_dedup_keeps_lineage(algo: str, use_reference: bool, trainable_vision: bool) -> None:
    g = _build(algo, use_reference, trainable_vision)
    after, _ = run_passes(g, DEDUP_PASSES)
    before_l, after_l = lineage(g), lineage(after)
    tracked = [op.outputs[TRACKED[op.kind]] for op in g if op.kind in TRACKED]
    assert len(tracked) == 4 + use_reference + 3 * (algo == "ppo")  # + 2 critic, value_loss
    for name in tracked:
        assert name in after.values, f"{name} was renamed or dropped"
        assert before_l[name] == after_l[name], name
    # Every loss still depends on what the rollout's policy sampled.
    for op in g:
        if op.kind in ("policy_loss", "value_loss"):
            assert any(w == "policy@0" for w, _ in after_l[op.outputs["loss"]]), op.name


def _prefix_rows(graph: Graph) -> dict[str, int]:
    return {
        op.name: graph.values[op.inputs[PREFIX_ROWS[op.kind]]].shape[0]
        for op in graph
        if op.kind in PREFIX_ROWS
    }


@pytest.mark.parametrize("trainable_vision", [False, True])
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_dedup_divides_prefix_rows_by_group_size(algo: str, trainable_vision: bool) -> None:
    workload = WORKLOAD_PRESETS["video"]
    n, gsize = workload.prompts_per_step, workload.group_size
    g = _build(algo, True, trainable_vision)
    split = _prefix_rows(run_passes(g, SPLIT_ONLY)[0])  # verl's per-sample work, split
    dedup = _prefix_rows(run_passes(g, DEDUP_PASSES)[0])
    assert gsize > 1 and dedup and set(dedup) <= set(split)
    for name, rows in split.items():
        assert rows == (n if name.startswith("rollout.") else n * gsize), name
        if name in dedup:
            assert dedup[name] == n, name
        else:  # merged into another phase's identical op: only a frozen tower allows that
            assert not trainable_vision and name.endswith("vision_encode"), name
    later = [name for name in split if not name.startswith("rollout.")]
    assert sum(split[k] for k in later) >= gsize * sum(dedup.get(k, 0) for k in later)
    if not trainable_vision:  # one vision pass per step, shared by every model
        assert [k for k in dedup if k.endswith("vision_encode")] == ["rollout.vision_encode"]


def test_ppo_with_one_sample_per_prompt() -> None:
    g = _build("ppo", True, False, group_size=1)
    after, _ = run_passes(g, DEDUP_PASSES)
    assert set(_prefix_rows(after).values()) == {WORKLOAD_PRESETS["video"].prompts_per_step}
    assert not any(op.kind == "expand_group" for op in after)


def test_rloo_needs_a_group() -> None:
    with pytest.raises(ValueError, match="group_size >= 2"):
        _build("rloo", False, False, group_size=1)


@pytest.mark.parametrize("trainable_vision", [False, True])
def test_ppo_critic_trains_with_its_own_optimizer_step(trainable_vision: bool) -> None:
    for g in (before := _build("ppo", True, trainable_vision), run_passes(before, DEDUP_PASSES)[0]):
        steps = {op.inputs["weights"]: op for op in g if op.kind == "optimizer_step"}
        assert set(steps) == {"policy.weights", "critic.weights"}
        loss_kind = {}
        for weights, step in steps.items():
            assert g.values[step.outputs["weights"]].version == f"{weights.split('.')[0]}@1"
            backward = g.producer(step.inputs["grads"])
            assert backward.kind == "backward" and backward.inputs["weights"] == weights
            loss_kind[weights] = g.producer(backward.inputs["loss"]).kind
        assert loss_kind == {"policy.weights": "policy_loss", "critic.weights": "value_loss"}
        # The critic's value head feeds GAE (inference) and its own training forward.
        heads = {
            op.phase: op.attrs["head"]
            for op in g
            if op.kind.startswith("logprob") and op.inputs["weights"] == "critic.weights"
        }
        assert heads == {Phase.REFERENCE: "value", Phase.TRAIN: "value"}
        (gae,) = [op for op in g if op.kind == "advantage"]
        assert g.producer(gae.inputs["values"]).inputs["weights"] == "critic.weights"
        (value_loss,) = [op for op in g if op.kind == "value_loss"]
        assert value_loss.inputs["returns"] == gae.outputs["returns"]


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_train_ops_read_only_the_current_policy(algo: str) -> None:
    for g in (before := _build(algo, True, True), run_passes(before, DEDUP_PASSES)[0]):
        for op in g:
            if op.phase in (Phase.TRAIN, Phase.UPDATE) and op.kind != "weight_sync":
                versions = {v.version for v in g.inputs_of(op).values()}
                assert {v for v in versions if version_model(v) == "policy"} <= {"policy@0"}


def test_stale_critic_is_rejected() -> None:
    g = _build("ppo", False, False).copy()
    w = g.values["critic.weights"]
    g.add_value(Value("critic.weights.old", w.shape, w.dtype, ValueKind.WEIGHTS, "critic@-1", True))
    g.ops["train.critic"].inputs["weights"] = "critic.weights.old"
    g.invalidate()
    with pytest.raises(GraphError, match="stale policy") as err:
        lint(g)
    assert err.value.where == "op 'train.critic'"


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_dedup_passes_are_idempotent(algo: str) -> None:
    once, _ = run_passes(_build(algo, True, False), DEDUP_PASSES)
    _, records = run_passes(once, DEDUP_PASSES)
    assert not any(r.changed for r in records), [r.name for r in records if r.changed]


def test_combine_rewards_needs_one_coef_per_reward() -> None:
    g = _build("grpo", False, False, "tiny").copy()
    rewards = g.values[g.ops["rollout.advantage"].inputs["rewards"]]
    g.add_value(Value("mixed", rewards.shape, "float32", ValueKind.ACTIVATION))
    mix = Op(
        "rollout.mix",
        "combine_rewards",
        Phase.ROLLOUT,
        {"rewards_0": rewards.name},
        {"rewards": "mixed"},
        {"coefs": [0.5]},
    )
    g.add_op(mix)
    lint(g)
    mix.attrs["coefs"] = [1.0, 0.5]
    with pytest.raises(GraphError, match="1 rewards inputs but 2 coefs"):
        lint(g)


def test_custom_algorithm_keeps_reward_model_lineage() -> None:
    spec = importlib.util.spec_from_file_location("custom_algorithm", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    g = example.build_grpo_with_reward_model(
        MODEL_PRESETS["qwen2_5_vl_7b"], WORKLOAD_PRESETS["video"], AlgoSpec()
    )
    lint(g)
    after, _ = run_passes(g, DEDUP_PASSES)
    before_l, after_l = lineage(g), lineage(after)
    (mix,) = [op for op in g if op.kind == "combine_rewards"]
    learned = g.ops[g.producer(mix.inputs["rewards_1"]).name]
    assert learned.inputs["weights"] == "rm.weights" and "features" in learned.inputs
    for name in (learned.outputs["rewards"], mix.outputs["rewards"], "train.policy_loss.loss"):
        assert before_l[name] == after_l[name], name
        # The reward model scored the prompt's pixels and the policy's responses.
        assert {("rm@0", "prompts.pixels"), ("policy@0", "prompts.text")} <= after_l[name]


def test_custom_algorithm_example_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--model", "tiny", "--workload", "tiny"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "lint ok" in text
    before, after = text.split("after DEDUP_PASSES")
    assert all(p.value in before and p.value in after for p in Phase)  # ops per phase
    assert "combine_rewards" in before and "combine_rewards" in after
    # The reward model still reads features, but vision runs once, per prompt.
    n = WORKLOAD_PRESETS["tiny"].prompts_per_step
    assert before.count("vision_encode[") == 4 and after.count("vision_encode[") == 1
    assert f"vision_encode[{n}]" in after
    per_sample, deduped = (int(x) for x in re.findall(r"(\d+) per-sample -> (\d+)", text)[0])
    assert deduped * WORKLOAD_PRESETS["tiny"].group_size <= per_sample
