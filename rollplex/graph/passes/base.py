"""Pass plumbing: a pass maps a graph to (new graph, changed); lint runs after each."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph

PassFn = Callable[[Graph], tuple[Graph, bool]]


@dataclass(slots=True)
class PassRecord:
    name: str
    changed: bool
    graph: Graph  # the graph after this pass


def run_passes(graph: Graph, passes: Sequence[PassFn]) -> tuple[Graph, list[PassRecord]]:
    """Apply passes in order on copies; the input graph is never mutated."""
    records = []
    for p in passes:
        graph, changed = p(graph.copy())
        lint(graph)
        records.append(PassRecord(p.__name__, changed, graph))
    return graph, records
