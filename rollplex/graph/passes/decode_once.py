"""decode_once: the rollout's decode stands in for the training response forward.

On-policy, the first update's training forward over the responses runs the very weights the
decode sampled them with, over the very tokens the decode fed; with checkpointed layers its
backward needs only each layer's input per response token (and the prefix K/V, which the
training prefix provides), which the decode keeps (`decode.kept`, engine/decoded.py). The
training response forward becomes an `attach_response`. When it applies: `decode_once`.
"""

from __future__ import annotations

from rollplex.graph.ir import Graph, Op, Phase, Value, ValueKind


def decode_once(graph: Graph) -> tuple[Graph, bool]:
    """Run only for roles that both declare `activation_export` (jobs/pipeline.py).

    A pair (decode D, training response forward T) is rewritten only when T scores D's own
    responses with the very weights value and version D decoded with (a later PPO update, a
    second epoch or an off-policy step does not) and with the LM head (PPO's critic reads
    other weights: it keeps its forward). Whether the held bytes are worth the saved forward
    is the planner's call: the pipeline plans with and without."""
    decodes = [op for op in graph if op.kind == "decode"]
    changed = False
    for train in list(graph):
        if not _is_training_response(train):
            continue
        source = next((d for d in decodes if same_response(graph, d, train)), None)
        if source is not None:
            _rewrite(graph, source, train)
            changed = True
    if not changed:
        return graph, False
    return Graph(graph.values.values(), graph.ops.values()), True


def _is_training_response(op: Op) -> bool:
    return (
        op.kind == "logprob_response"
        and op.phase is Phase.TRAIN
        and "saved" in op.outputs
        and op.attrs.get("head", "lm") == "lm"
    )


def same_response(graph: Graph, decode: Op, train: Op) -> bool:
    """`decode` computed what `train`'s forward would: `train` scores `decode`'s responses,
    in its groups, with the same weights value and version."""
    w_dec, w_train = decode.inputs["weights"], train.inputs["weights"]
    if w_dec != w_train:
        return False
    version = graph.values[w_dec].version
    if version is None or version != graph.values[w_train].version:
        return False
    same_rows = train.inputs["responses"] == decode.outputs["responses"]
    return same_rows and train.attrs.get("group_size") == decode.attrs.get("group_size")


def _rewrite(graph: Graph, decode: Op, train: Op) -> None:
    """`decode` gains `kept`; `train` becomes an `attach_response` reading it; whatever read
    `train`'s saved activations (the backward) reads `kept` instead."""
    saved = graph.values[train.outputs["saved"]]
    # each layer's output of every response token, [layers, rows, R, width] as the forward's
    # saved inputs (the decode keeps R-1 columns: the last token is never fed)
    kept = Value(
        f"{decode.name}.kept",
        saved.shape,
        saved.dtype,
        ValueKind.BOUNDARY,
        graph.values[decode.inputs["weights"]].version,
    )
    if kept.name not in graph.values:  # one decode's outputs serve every training forward
        graph.add_value(kept)
        decode.outputs["kept"] = kept.name
    for reader in graph.consumers(saved.name):
        reader.inputs = {p: kept.name if v == saved.name else v for p, v in reader.inputs.items()}
    del graph.values[saved.name]
    attach = Op(
        train.name,  # the same name: plans, traces and tests keep finding the training forward
        "attach_response",
        train.phase,
        {
            "kv": train.inputs["kv"],
            "responses": train.inputs["responses"],
            "kept": kept.name,
            "weights": train.inputs["weights"],
        },
        {"logprobs": train.outputs["logprobs"]},
        dict(train.attrs),
        {**train.meta, "decode_once": decode.name},
    )
    graph.ops[train.name] = attach
    graph.invalidate()
