"""decompose_prefix: split every full `logprob` into `logprob_prefix` + `logprob_response`.

Valid because the decoder is causal: prefix hidden states and K/V do not depend on the
response. The response part reads the prefix K/V (the `boundary`, which training's backward
also consumes); the logprob output keeps its name, so consumers are untouched.
"""

from __future__ import annotations

from rollplex.graph.ir import Graph, Op, Value, ValueKind


def decompose_prefix(graph: Graph) -> tuple[Graph, bool]:
    changed = False
    for op in list(graph.ops.values()):
        if op.kind != "logprob":
            continue
        changed = True
        _split(graph, op)
    return Graph(graph.values.values(), graph.ops.values()), changed


def _split(graph: Graph, op: Op) -> None:
    feats = graph.values[op.inputs["features"]]
    text = graph.values[op.inputs["text"]]
    resp = graph.values[op.inputs["responses"]]
    logp = graph.values[op.outputs["logprobs"]]
    rows, prefix = feats.shape[0], feats.shape[1] + text.shape[1]
    train = "saved" in op.outputs
    pre_name, resp_name = f"{op.name}_prefix", f"{op.name}_response"

    kv_kind = ValueKind.BOUNDARY if train else ValueKind.KV_CACHE
    kv = Value(f"{pre_name}.kv", _kv_shape(op, rows, prefix), feats.dtype, kv_kind, logp.version)
    graph.add_value(kv)
    pre_out = {"kv": kv.name}
    resp_out = {"logprobs": logp.name}
    if train:
        saved = graph.values.pop(op.outputs["saved"])
        layers, _, _, width = saved.shape
        graph.add_value(
            Value(
                f"{pre_name}.saved",
                (layers, rows, prefix, width),
                saved.dtype,
                ValueKind.BOUNDARY,
                saved.version,
            )
        )
        graph.add_value(
            Value(
                f"{resp_name}.saved",
                (layers, resp.shape[0], resp.shape[1], width),
                saved.dtype,
                ValueKind.ACTIVATION,
                saved.version,
            )
        )
        pre_out["saved"], resp_out["saved"] = f"{pre_name}.saved", f"{resp_name}.saved"
        for consumer in graph.consumers(saved.name):
            _replace_input(consumer, saved.name, [pre_out["saved"], resp_out["saved"]])

    attrs = {"head": op.attrs.get("head", "lm"), "kv_layout": op.attrs["kv_layout"]}
    pre = Op(
        pre_name,
        "logprob_prefix",
        op.phase,
        {"features": feats.name, "text": text.name, "weights": op.inputs["weights"]},
        pre_out,
        dict(attrs),
        {"split_from": op.name},
    )
    post_in = {"kv": kv.name, "responses": resp.name, "weights": op.inputs["weights"]}
    if "advantages" in op.inputs:  # rows the response part skips (skip_zero_advantage)
        post_in["advantages"] = op.inputs["advantages"]
    post = Op(
        resp_name,
        "logprob_response",
        op.phase,
        post_in,
        resp_out,
        {**attrs, "group_size": 1},
        {"split_from": op.name},
    )
    order = list(graph.ops.values())
    i = order.index(op)
    graph.ops = {o.name: o for o in (*order[:i], pre, post, *order[i + 1 :])}


def _kv_shape(op: Op, rows: int, prefix: int) -> tuple[int, ...]:
    layers, kv_dim = op.attrs["kv_layout"]  # set by the builder from the ModelSpec
    return (layers, 2, rows, prefix, kv_dim)


def _replace_input(op: Op, old: str, new: list[str]) -> None:
    ports = [p for p, v in op.inputs.items() if v == old]
    for p in ports:
        del op.inputs[p]
    prefix = ports[0].rsplit("_", 1)[0]
    start = len([p for p in op.inputs if p.startswith(prefix + "_")])
    for j, v in enumerate(new):
        op.inputs[f"{prefix}_{start + j}"] = v
