"""reuse_across_phases: compute an op once when another phase computes the same thing.

Same kind, attributes and input values (hence the same weights version, e.g. the frozen
tower or reference): the later op goes and its outputs are renamed to the earlier op's.
Never merged: a train-phase op reading weights this step updates (it needs its autograd
graph).
"""

from __future__ import annotations

import json

from rollplex.graph.ir import Graph, Op, Phase


def reuse_across_phases(graph: Graph) -> tuple[Graph, bool]:
    trained = {op.inputs["weights"] for op in graph.ops.values() if op.kind == "optimizer_step"}
    seen: dict[str, Op] = {}
    rename: dict[str, str] = {}
    keep: list[Op] = []
    for op in graph.topo_order():
        op.inputs = {p: rename.get(v, v) for p, v in op.inputs.items()}
        needs_grad = op.phase is Phase.TRAIN and any(v in trained for v in op.inputs.values())
        key = _signature(op)
        first = seen.get(key)
        if first is None or needs_grad or op.kind in ("optimizer_step", "weight_sync"):
            seen.setdefault(key, op)
            keep.append(op)
            continue
        for port, v in op.outputs.items():
            rename[v] = first.outputs[port]
    if not rename:
        return graph, False
    live = {v for op in keep for v in (*op.inputs.values(), *op.outputs.values())}
    order = {name: i for i, name in enumerate(graph.ops)}
    keep.sort(key=lambda o: order[o.name])
    return Graph([v for v in graph.values.values() if v.name in live], keep), True


def _signature(op: Op) -> str:
    return json.dumps([op.kind, sorted(op.inputs.items()), op.attrs], sort_keys=True, default=str)
