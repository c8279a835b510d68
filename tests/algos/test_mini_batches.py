"""PPO mini-batches and epochs in the step graph (algos/updates.py), against verl's loop
structure (`dp_actor.update_policy`: `data.split(ppo_mini_batch_size)` once, then
`for epoch: for mini_batch: ...; optimizer_step`): one optimizer step per mini-batch per
epoch, update k reading the version update k-1 wrote, only the first on-policy."""

from __future__ import annotations

import itertools
import math

import pytest
from pydantic import ValidationError

from rollplex.algos import ALGORITHMS, build_step
from rollplex.algos.updates import mini_batches
from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph, GraphError, Phase, version_model
from rollplex.graph.passes import DEDUP_PASSES, run_passes
from rollplex.graph.serialize import to_json
from rollplex.jobs.pipeline import plan_step
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

PRESETS = {"7b": ("qwen2_5_vl_7b", "video"), "tiny": ("tiny", "tiny")}
# (ppo_mini_batch_size as a fraction of the batch or None, epochs)
SHAPES = [(None, 2), (0.25, 1), (0.5, 2), (0.75, 2)]


def _specs(preset: str, trainable_vision: bool = False):
    model_name, workload_name = PRESETS[preset]
    model = MODEL_PRESETS[model_name].model_copy(update={"trainable_vision": trainable_vision})
    return model, WORKLOAD_PRESETS[workload_name]


def _algo(name: str, prompts: int, fraction: float | None, epochs: int, **kw) -> AlgoSpec:
    size = None if fraction is None else max(1, int(prompts * fraction))
    return AlgoSpec(name=name, ppo_mini_batch_size=size, ppo_epochs=epochs, **kw)


def _steps(g: Graph, model: str = "policy"):
    return [
        op
        for op in g
        if op.kind == "optimizer_step"
        and version_model(g.values[op.inputs["weights"]].version) == model
    ]


def _rollout_version(g: Graph) -> str:
    decode = next(op for op in g if op.kind in ("decode", "generate"))
    return g.values[decode.inputs["weights"]].version


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_one_update_per_mini_batch_per_epoch(algo: str, shape, preset: str) -> None:
    model, workload = _specs(preset)
    n, g_size = workload.prompts_per_step, workload.group_size
    spec = _algo(algo, n, *shape)
    size = spec.ppo_mini_batch_size or n
    want = spec.ppo_epochs * math.ceil(n / size)
    for g in (before := build_step(model, workload, spec), run_passes(before, DEDUP_PASSES)[0]):
        models = ("policy", "critic") if algo == "ppo" else ("policy",)
        for m in models:
            steps = _steps(g, m)
            assert len(steps) == want, m
            # a chain: update k reads m@k, the version update k-1 wrote
            assert [g.values[s.inputs["weights"]].version for s in steps] == [
                f"{m}@{k}" for k in range(want)
            ]
            for a, b in itertools.pairwise(steps):
                assert b.inputs["weights"] == a.outputs["weights"]
        sync = next(op for op in g if op.kind == "weight_sync")
        assert g.values[sync.inputs["weights"]].version == f"policy@{want}"
    # the policy's loss windows: verl's split, the same cut every epoch, in order
    losses = [op for op in before if op.kind == "policy_loss"]
    windows = [
        (before.ops[_producer(before, op.inputs["advantages"])].attrs["lo"] // g_size)
        for op in losses
    ]
    assert windows == [mb.lo for mb in mini_batches(n, spec)]
    assert windows == list(range(0, n, size)) * spec.ppo_epochs


def _producer(g: Graph, value: str) -> str:
    return next(op.name for op in g if value in op.outputs.values())


@pytest.mark.parametrize("trainable_vision", [False, True])
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_only_the_first_update_reads_the_rollouts_version(algo: str, trainable_vision) -> None:
    model, workload = _specs("tiny", trainable_vision)
    spec = _algo(algo, workload.prompts_per_step, 0.5, 2)
    for g in (before := build_step(model, workload, spec), run_passes(before, DEDUP_PASSES)[0]):
        rollout = _rollout_version(g)
        train = [
            op
            for op in g
            if op.phase is Phase.TRAIN
            and "weights" in op.inputs
            and version_model(g.values[op.inputs["weights"]].version) == "policy"
        ]
        on_policy = {op.name for op in train if g.values[op.inputs["weights"]].version == rollout}
        first = _steps(g, "policy")[0]
        assert g.values[first.inputs["weights"]].version == rollout
        assert on_policy and on_policy == _feeding(g, first.inputs["grads"]) & on_policy
        # old logprobs: one detached forward at the rollout's version, read by every loss
        old = [
            op
            for op in g
            if op.phase is Phase.REFERENCE
            and op.name.startswith("reference.old_logprob")
            and op.kind in ("logprob", "logprob_response")
        ]
        assert len(old) == 1 and "saved" not in old[0].outputs
        assert g.values[old[0].inputs["weights"]].version == rollout


def _feeding(g: Graph, value: str) -> set[str]:
    """Names of the ops upstream of `value`."""
    made = {v: op for op in g for v in op.outputs.values()}
    out, stack = set(), [value]
    while stack:
        op = made.get(stack.pop())
        if op is not None and op.name not in out:
            out.add(op.name)
            stack.extend(op.inputs.values())
    return out


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_defaults_keep_the_single_update_graph(algo: str, preset: str) -> None:
    model, workload = _specs(preset)
    base = build_step(model, workload, AlgoSpec(name=algo))
    whole = AlgoSpec(name=algo, ppo_mini_batch_size=workload.prompts_per_step, ppo_epochs=1)
    assert to_json(build_step(model, workload, whole)) == to_json(base)
    assert len(_steps(base)) == 1
    assert not any(op.kind == "select_rows" for op in base)


def _rewired(update: int) -> Graph:
    """Two whole-batch epochs, prefix shared per prompt; update `update`'s training
    response forward reads the rollout's prefill K/V (what a prefill-once pass does)."""
    model, workload = _specs("tiny")
    spec = AlgoSpec(name="grpo", ppo_mini_batch_size=workload.prompts_per_step, ppo_epochs=2)
    g, _ = run_passes(build_step(model, workload, spec), DEDUP_PASSES)
    kv = next(op.outputs["kv"] for op in g if op.kind == "prefix_prefill")
    op = [op for op in g if op.kind == "logprob_response" and op.phase is Phase.TRAIN][update]
    assert g.values[kv].shape == g.values[op.inputs["kv"]].shape
    op.inputs["kv"] = kv
    return g


def test_lint_refuses_rollout_work_in_a_later_update() -> None:
    lint(_rewired(0))  # the first update reads the rollout's version: reuse is sound
    with pytest.raises(GraphError, match=r"prefix_prefill.*policy@0.*policy@1"):
        lint(_rewired(1))


def test_invalid_values_are_refused_by_name() -> None:
    model, workload = _specs("tiny")
    n = workload.prompts_per_step
    with pytest.raises(ValueError, match=rf"algo.ppo_mini_batch_size={n + 1} exceeds"):
        build_step(model, workload, AlgoSpec(ppo_mini_batch_size=n + 1))
    for field, value in (("ppo_epochs", 0), ("ppo_mini_batch_size", 0), ("ppo_epochs", -1)):
        with pytest.raises(ValidationError, match=field):
            AlgoSpec(**{field: value})
    # a mini-batch that does not divide the batch is verl's too: the last one is smaller
    assert [(m.lo, m.hi) for m in mini_batches(5, AlgoSpec(ppo_mini_batch_size=2))] == [
        (0, 2),
        (2, 4),
        (4, 5),
    ]


@pytest.mark.parametrize("schedule", ["serial", "rollplex", "disaggregated"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_planner_prices_every_update(schedule: str, preset: str) -> None:
    """Each update's forward, backward and optimizer step is planned and priced: two epochs
    of the same cut cost twice one epoch's training, and the old-logprob forward is priced
    once."""
    model, workload = _specs(preset)
    hw = HARDWARE_PRESETS["cpu" if preset == "tiny" else "h200x8"]
    if schedule == "disaggregated" and preset == "tiny":
        pytest.skip("a disaggregated plan needs two device groups")
    n = workload.prompts_per_step
    seconds = {}
    for epochs in (1, 2):
        spec = AlgoSpec(name="grpo", ppo_mini_batch_size=max(1, n // 2), ppo_epochs=epochs)
        planned = plan_step(model, workload, spec, hw, ScheduleSpec(name=schedule))
        steps = [s for d in planned.plan.devices for s in d.steps]
        kinds = [s.kind for s in steps]
        assert kinds.count("optimizer_step") == 2 * epochs
        assert kinds.count("backward") == 2 * epochs
        seconds[epochs] = {
            k: sum(s.end_s - s.start_s for s in steps if s.kind == k and s.phase != "reference")
            for k in ("backward", "optimizer_step")
        }
    for kind, one in seconds[1].items():
        assert one > 0
        assert seconds[2][kind] == pytest.approx(2 * one, rel=0.05), kind


@pytest.mark.parametrize("overlap", ["piggyback", "streams"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_only_the_rollouts_version_overlaps_decode(preset: str, overlap: str) -> None:
    """What the rollplex schedule runs beside decode reads the rollout's weights version
    (policy@0): an update's forward at policy@k waits for update k-1's optimizer step."""
    model, _ = _specs(preset)
    workload = WORKLOAD_PRESETS["tiny" if preset == "tiny" else "image"]
    hw = HARDWARE_PRESETS["cpu" if preset == "tiny" else "h200x8"]
    n = workload.prompts_per_step
    spec = AlgoSpec(name="grpo", ppo_mini_batch_size=max(1, n // 2), ppo_epochs=2)
    planned = plan_step(model, workload, spec, hw, ScheduleSpec(name="rollplex", overlap=overlap))
    steps = [s for d in planned.plan.devices for s in d.steps]
    beside = [s for s in steps if s.corun.value != "none"]
    assert any(s.name.startswith("reference.old_logprob") for s in beside)
    versions = {s.weights_version for s in beside if version_model(s.weights_version) == "policy"}
    assert versions == {"policy@0"}
    assert {s.weights_version for s in steps if s.phase == "train"} >= {"policy@1", "policy@3"}
