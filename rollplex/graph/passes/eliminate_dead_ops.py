"""eliminate_dead_ops: drop ops whose outputs nothing reads.

Sinks are kept: the optimizer step and the weight sync (their outputs leave the step),
and any op whose `meta["keep"]` is set. Always valid: a removed op influenced nothing.
"""

from __future__ import annotations

from rollplex.graph.ir import Graph

SINK_KINDS = frozenset({"optimizer_step", "weight_sync"})


def eliminate_dead_ops(graph: Graph) -> tuple[Graph, bool]:
    ops = list(graph.ops.values())
    removed = False
    while True:
        used = {v for op in ops for v in op.inputs.values()}
        dead = [
            op
            for op in ops
            if op.kind not in SINK_KINDS
            and not op.meta.get("keep")
            and not any(v in used for v in op.outputs.values())
        ]
        if not dead:
            break
        removed = True
        ops = [op for op in ops if op not in dead]
    if not removed:
        return graph, False
    live = {v for op in ops for v in (*op.inputs.values(), *op.outputs.values())}
    return Graph([v for v in graph.values.values() if v.name in live], ops), True
