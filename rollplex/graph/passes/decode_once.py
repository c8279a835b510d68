"""decode_once: the rollout's decode stands in for the training response forward.

On-policy, the first update's training forward over the responses runs the very weights the
decode sampled them with, over the very tokens the decode fed; with checkpointed layers its
backward needs only each layer's input per response token (and the prefix K/V, which the
training prefix provides), which the decode keeps (`decode.kept`, engine/decoded.py). The
training response forward becomes an `attach_response`. When it applies: `decode_once`.
"""

from __future__ import annotations

from rollplex.graph.ir import Graph, Op, Phase, Value, ValueKind
from rollplex.graph.passes.reuse import hand_over, rewrite_pairs, same_weights


def decode_once(graph: Graph) -> tuple[Graph, bool]:
    """Run only for roles that both declare `activation_export` (jobs/pipeline.py).

    A pair (decode D, training response forward T) is rewritten only when T scores D's own
    responses with the very weights value and version D decoded with (a later PPO update, a
    second epoch or an off-policy step does not) and with the LM head (PPO's critic reads
    other weights: it keeps its forward). Whether the held bytes are worth the saved forward
    is the planner's call: the pipeline plans with and without."""
    decodes = [op for op in graph if op.kind == "decode"]
    return rewrite_pairs(graph, decodes, _is_training_response, same_response, _rewrite)


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
    if not same_weights(graph, decode, train):
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
    hand_over(graph, decode, "kept", kept, saved)  # one decode serves every forward
    attach = Op(
        train.name,  # the same name: plans, traces and tests keep finding the training forward
        "attach_response",
        train.phase,
        {
            "kv": train.inputs["kv"],
            "responses": train.inputs["responses"],
            "kept": kept.name,
            "weights": train.inputs["weights"],
        }
        | {p: v for p, v in train.inputs.items() if p == "advantages"},
        {"logprobs": train.outputs["logprobs"]},
        dict(train.attrs),
        {**train.meta, "decode_once": decode.name},
    )
    graph.ops[train.name] = attach
    graph.invalidate()
