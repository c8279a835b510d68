"""prefill_once: the rollout's prefix prefill stands in for the training prefix forward.

On-policy, the first update's training prefix forward runs the very weights and inputs the
rollout prefilled with; with checkpointed layers its backward needs only each layer's input
and the prefix K/V, which the prefill exports (`prefix_prefill.exported`). The training
forward becomes an `attach_prefix`. When it applies: `prefill_once`.
"""

from __future__ import annotations

from rollplex.graph.ir import Graph, Op, Phase, Value, ValueKind
from rollplex.graph.passes.reuse import hand_over, rewrite_pairs, same_weights


def prefill_once(graph: Graph) -> tuple[Graph, bool]:
    """Run only for roles that both declare `activation_export` (jobs/pipeline.py).

    A pair (source P, training prefix T) is rewritten only when T reads the very weights
    value and version P reads (a later PPO update or an off-policy step does not) and P's
    features and text values (a trained vision tower gives T its own). PPO's critic pairs
    the same way with its reference-phase prefix forward (critic@0). Whether the held bytes
    are worth the saved forward is the planner's call: the pipeline plans with and without.
    """
    sources = [op for op in graph if _is_source(op)]
    return rewrite_pairs(graph, sources, _is_training_prefix, same_prefix, _rewrite)


def _is_source(op: Op) -> bool:
    """A no-grad prefix forward: the rollout's prefill, or a reference-phase logprob_prefix
    (PPO's critic scores old values there with the weights its training forward reads)."""
    if op.kind == "prefix_prefill":
        return True
    return op.kind == "logprob_prefix" and op.phase is Phase.REFERENCE and "saved" not in op.outputs


def _is_training_prefix(op: Op) -> bool:
    return op.kind == "logprob_prefix" and op.phase is Phase.TRAIN and "saved" in op.outputs


def same_prefix(graph: Graph, prefill: Op, train: Op) -> bool:
    """`prefill` computes what `train`'s forward would: same weights value and version,
    same features and text values."""
    if not same_weights(graph, prefill, train):
        return False
    return all(prefill.inputs[p] == train.inputs[p] for p in ("features", "text"))


def _rewrite(graph: Graph, prefill: Op, train: Op) -> None:
    """`prefill` gains `exported`; `train` becomes an `attach_prefix` reading it; whatever
    read `train`'s saved activations (the backward) reads `exported` instead."""
    saved = graph.values[train.outputs["saved"]]
    kv = graph.values[prefill.outputs["kv"]]
    layers, rows, prefix, width = saved.shape
    kv_dim = kv.shape[4]
    # each layer's input [rows, prefix, width] and its K and V [rows, prefix, kv_dim]; the
    # torch export's K/V are the rollout cache's own tensors, so while that cache lives the
    # plan counts them twice (conservative by one prefix K/V, during the rollout only). One
    # slot more holds the last layer's output (width) and the rotary cos and sin the replay
    # reads (2 x head_dim <= 2 x kv_dim): ExportedPrefix.tensors
    exported = Value(
        f"{prefill.name}.exported",
        (layers + 1, rows, prefix, width + 2 * kv_dim),
        saved.dtype,
        ValueKind.BOUNDARY,
        graph.values[prefill.inputs["weights"]].version,
    )
    hand_over(graph, prefill, "exported", exported, saved)  # one export serves every prefix
    # the rows its response part skips (skip_zero_advantage): their prefix is not replayed
    reads = [
        c.inputs["advantages"]
        for c in graph.consumers(train.outputs["kv"])
        if "advantages" in c.inputs
    ]
    live = {"advantages": reads[0]} if reads else {}
    attach = Op(
        train.name,  # the same name: plans, traces and tests keep finding the training prefix
        "attach_prefix",
        train.phase,
        {
            "features": train.inputs["features"],
            "text": train.inputs["text"],
            "exported": exported.name,
            "weights": train.inputs["weights"],
        }
        | live,
        {"kv": train.outputs["kv"]},
        {"head": train.attrs.get("head", "lm")},
        {**train.meta, "prefill_once": prefill.name},
    )
    graph.ops[train.name] = attach
    graph.invalidate()
