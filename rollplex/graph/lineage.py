"""Which (weights version, external input) pairs reach a value.

(w, x) reaches v when input x flows into an op that reads weights version w, whose result
flows on into v; external data stamped with a version starts as (w, x). Passes that keep a
step's meaning keep these sets for every logprob; the on-policy lint reads them.
"""

from __future__ import annotations

from rollplex.graph.ir import Graph, ValueKind

Pair = tuple[str | None, str]


def lineage(graph: Graph) -> dict[str, frozenset[Pair]]:
    """value name -> pairs that reach it; computed once in topological order."""
    tags: dict[str, frozenset[Pair]] = {}
    for v in graph.values.values():
        if v.external and v.kind is not ValueKind.WEIGHTS:
            tags[v.name] = frozenset({(v.version, v.name)})
    for op in graph.topo_order():
        ins = graph.inputs_of(op)
        versions = [v.version for v in ins.values() if v.kind is ValueKind.WEIGHTS]
        data: set[Pair] = set()
        for v in ins.values():
            data |= tags.get(v.name, frozenset())
        reached = set(data)
        for w in versions:
            reached |= {(w, x) for _, x in data}
        for out in op.outputs.values():
            tags[out] = frozenset(reached)
    return tags
