"""Pass plumbing: a pass maps a graph to (new graph, changed); lint runs on the input and
after each pass, so even an empty pass list hands on only a linted graph."""

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
    """Lint `graph`, then apply passes in order on copies, linting each result; the input
    graph is never mutated."""
    lint(graph)
    records = []
    for p in passes:
        graph, changed = p(graph.copy())
        lint(graph)
        records.append(PassRecord(p.__name__, changed, graph))
    return graph, records
