"""prefill_once: the rollout's prefix prefill stands in for the training prefix forward.

On-policy, the first update's training prefix forward runs the very weights and inputs the
rollout prefilled with; with checkpointed layers its backward needs only each layer's input
and the prefix K/V, which the prefill exports (`prefix_prefill.exported`). The training
forward becomes an `attach_prefix`. When it applies: `prefill_once`.
"""

from __future__ import annotations

from rollplex.graph.ir import Graph, Op, Phase, Value, ValueKind


def prefill_once(graph: Graph) -> tuple[Graph, bool]:
    """Run only for roles that both declare `activation_export` (jobs/pipeline.py).

    A pair (source P, training prefix T) is rewritten only when T reads the very weights
    value and version P reads (a later PPO update or an off-policy step does not) and P's
    features and text values (a trained vision tower gives T its own). PPO's critic pairs
    the same way with its reference-phase prefix forward (critic@0). Whether the held bytes
    are worth the saved forward is the planner's call: the pipeline plans with and without.
    """
    prefills = [op for op in graph if _is_source(op)]
    changed = False
    for train in list(graph):
        if not _is_training_prefix(train):
            continue
        source = next((p for p in prefills if same_prefix(graph, p, train)), None)
        if source is not None:
            _rewrite(graph, source, train)
            changed = True
    if not changed:
        return graph, False
    return Graph(graph.values.values(), graph.ops.values()), True


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
    w_pre, w_train = prefill.inputs["weights"], train.inputs["weights"]
    if w_pre != w_train:
        return False
    version = graph.values[w_pre].version
    if version is None or version != graph.values[w_train].version:
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
    # plan counts them twice (conservative by one prefix K/V, during the rollout only)
    exported = Value(
        f"{prefill.name}.exported",
        (layers, rows, prefix, width + 2 * kv_dim),
        saved.dtype,
        ValueKind.BOUNDARY,
        graph.values[prefill.inputs["weights"]].version,
    )
    if exported.name not in graph.values:  # one export serves every training prefix
        graph.add_value(exported)
        prefill.outputs["exported"] = exported.name
    for reader in graph.consumers(saved.name):
        reader.inputs = {
            p: exported.name if v == saved.name else v for p, v in reader.inputs.items()
        }
    del graph.values[saved.name]
    attach = Op(
        train.name,  # the same name: plans, traces and tests keep finding the training prefix
        "attach_prefix",
        train.phase,
        {
            "features": train.inputs["features"],
            "text": train.inputs["text"],
            "exported": exported.name,
            "weights": train.inputs["weights"],
        },
        {"kv": train.outputs["kv"]},
        {"head": train.attrs.get("head", "lm")},
        {**train.meta, "prefill_once": prefill.name},
    )
    graph.ops[train.name] = attach
    graph.invalidate()
