"""Passes keep the meaning of the step and remove exactly the redundant work."""

from __future__ import annotations

import random

import pytest

from rollplex.algos import build_step
from rollplex.graph.ir import Graph, Phase
from rollplex.graph.lineage import lineage
from rollplex.graph.passes import (
    DEDUP_PASSES,
    decompose_prefix,
    eliminate_dead_ops,
    reuse_across_phases,
    run_passes,
    share_group_prefix,
)
from rollplex.specs import MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec

LOGPROBS = ("reference.logprob.logprobs", "train.logprob.logprobs")


@pytest.mark.parametrize("trainable_vision", [False, True])
@pytest.mark.parametrize("use_reference", [False, True])
def test_passes_keep_lineage_of_every_logprob(trainable_vision: bool, use_reference: bool):
    model = MODEL_PRESETS["qwen2_5_vl_7b"].model_copy(update={"trainable_vision": trainable_vision})
    algo = AlgoSpec(use_reference=use_reference, kl_coef=0.04 if use_reference else 0.0)
    g = build_step(model, WORKLOAD_PRESETS["video"], algo)
    after, _ = run_passes(g, DEDUP_PASSES)
    before_l, after_l = lineage(g), lineage(after)
    checked = 0
    for name in LOGPROBS:
        if name in g.values:
            assert before_l[name] == after_l[name], name
            assert any(w == "policy@0" for w, _ in before_l[name])  # responses' sampler
            checked += 1
    assert checked == 1 + use_reference
    assert before_l["train.policy_loss.loss"] == after_l["train.policy_loss.loss"]


def test_decompose_prefix_splits_every_logprob(grpo_7b: Graph) -> None:
    g, changed = decompose_prefix(grpo_7b.copy())
    assert changed
    kinds = [op.kind for op in g]
    assert "logprob" not in kinds
    assert kinds.count("logprob_prefix") == kinds.count("logprob_response") == 2
    # The training prefix keeps its activations as an explicit boundary for backward.
    backward = g.ops["train.backward"]
    assert "train.logprob_prefix.saved" in backward.inputs.values()
    assert g.values["train.logprob_prefix.saved"].kind == "boundary"


def test_share_group_prefix_runs_prefix_once_per_prompt(grpo_7b: Graph) -> None:
    n, gsize = WORKLOAD_PRESETS["video"].prompts_per_step, WORKLOAD_PRESETS["video"].group_size
    g, _ = run_passes(grpo_7b, (decompose_prefix, share_group_prefix))
    for op in g:
        if op.kind in ("vision_encode", "logprob_prefix"):
            rows = g.values[op.inputs["features" if op.kind != "vision_encode" else "pixels"]]
            assert rows.shape[0] == n, op.name
        if op.kind == "logprob_response":
            assert op.attrs["group_size"] == gsize
            assert g.values[op.inputs["kv"]].shape[2] == n
    assert not any(op.kind == "expand_group" for op in g)


def test_reuse_shares_frozen_vision_only(grpo_7b: Graph) -> None:
    g, _ = run_passes(grpo_7b, DEDUP_PASSES)
    assert [op.phase for op in g if op.kind == "vision_encode"] == [Phase.ROLLOUT]

    model = MODEL_PRESETS["qwen2_5_vl_7b"].model_copy(update={"trainable_vision": True})
    trainable = build_step(model, WORKLOAD_PRESETS["video"], AlgoSpec())
    g2, _ = run_passes(trainable, DEDUP_PASSES)
    phases = [op.phase for op in g2 if op.kind == "vision_encode"]
    # Rollout and train read the same policy weights, but training needs gradients.
    assert Phase.TRAIN in phases and Phase.ROLLOUT in phases


def test_passes_are_idempotent(grpo_7b: Graph) -> None:
    once, _ = run_passes(grpo_7b, DEDUP_PASSES)
    for p in (share_group_prefix, reuse_across_phases, eliminate_dead_ops):
        _, changed = p(once.copy())
        assert not changed, p.__name__


def test_dead_ops_removed_but_sinks_kept(grpo_tiny: Graph) -> None:
    g = grpo_tiny.copy()
    del g.ops["train.policy_loss"].inputs["ref_logprobs"]  # nothing reads the reference now
    g.invalidate()
    out, changed = eliminate_dead_ops(g)
    assert changed
    assert not [op for op in out if op.phase is Phase.REFERENCE]
    assert "update.weight_sync" in out.ops and "update.optimizer_step" in out.ops


def test_passes_do_not_depend_on_names() -> None:
    """Renaming every op (in a permuted way) yields the same structure after passes."""
    g = build_step(MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"], AlgoSpec())
    names = list(g.ops)
    shuffled = names[:]
    random.Random(0).shuffle(shuffled)
    renamed = g.copy()
    renamed.ops = {f"op{shuffled.index(n)}": op for n, op in renamed.ops.items()}
    for new, op in renamed.ops.items():
        op.name = new
    renamed.invalidate()
    a, _ = run_passes(g, DEDUP_PASSES)
    b, _ = run_passes(renamed, DEDUP_PASSES)
    assert [op.kind for op in a.topo_order()] == [op.kind for op in b.topo_order()]
    assert sorted(v.shape for v in a.values.values()) == sorted(v.shape for v in b.values.values())
