"""Topological order and cycle check on a ~6k-op graph: hand-written Kahn vs networkx.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python bench/graph_ordering.py

The graph is 455 copies of the deduplicated 7B GRPO step (tests/planner/conftest.py's
`replicated`), in program order and reversed (producers after their consumers).
"""

from __future__ import annotations

import contextlib
import statistics
import time

import networkx as nx

from rollplex.graph.invariants import lint
from tests.planner.conftest import replicated
from tests.planner.test_scaling import as_networkx, reversed_program


def median_ms(f, repeats: int = 5) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def main() -> None:
    base = replicated(455)
    print(f"{len(base.ops)} ops\n")
    print("| graph | what | median ms |\n|---|---|---|")
    for label, g in (("program order", base), ("reversed", reversed_program(base))):
        rows = {
            "Graph.topo_order (hand Kahn)": g.topo_order,
            "networkx: DiGraph + lexicographical_topological_sort": lambda g=g: list(
                nx.lexicographical_topological_sort(
                    d := as_networkx(g), key=lambda n: d.nodes[n]["index"]
                )
            ),
            "Graph.find_cycle (hand Kahn)": g.find_cycle,
            "networkx: DiGraph + find_cycle": lambda g=g: _nx_cycle(g),
            "lint (whole)": lambda g=g: lint(g),
        }
        for what, f in rows.items():
            print(f"| {label} | {what} | {median_ms(f):.1f} |")


def _nx_cycle(g) -> None:
    with contextlib.suppress(nx.NetworkXNoCycle):
        nx.find_cycle(as_networkx(g))


if __name__ == "__main__":
    main()
