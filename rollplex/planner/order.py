"""The static priority every schedule issues ops in.

Policy, in order:
1. dependencies first (a topological order of the graph);
2. among ready ops, the earlier phase (rollout, reference, train, update), because a
   synchronous step cannot finish a phase before the previous one has produced its data;
3. then the longer critical path to the end of the step (upward rank, in predicted
   seconds), so work that gates more later work starts first;
4. then program order — the order the algorithm wrote its ops in.
Names never break ties, so renaming ops never changes a plan (tests permute names).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from rollplex.graph.ir import Graph, Op, Phase

PHASE_RANK = {Phase.ROLLOUT: 0, Phase.REFERENCE: 1, Phase.TRAIN: 2, Phase.UPDATE: 3}


def upward_rank(graph: Graph, seconds: Callable[[Op], float]) -> dict[str, float]:
    """Longest path (in predicted seconds) from each op to the end of the step."""
    rank: dict[str, float] = {}
    g = graph.nx
    for op in reversed(graph.topo_order()):
        succ = [rank[s] for s in g.successors(op.name)]
        rank[op.name] = seconds(op) + (max(succ) if succ else 0.0)
    return rank


def priority_order(graph: Graph, seconds: Callable[[Op], float]) -> list[Op]:
    g = graph.nx
    rank = upward_rank(graph, seconds)
    index = {name: i for i, name in enumerate(graph.ops)}
    indeg = {n: g.in_degree(n) for n in g.nodes}

    def key(name: str) -> tuple[int, float, int]:
        return (PHASE_RANK[graph.ops[name].phase], -rank[name], index[name])

    ready = [(*key(n), n) for n, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    out: list[Op] = []
    while ready:
        *_, name = heapq.heappop(ready)
        out.append(graph.ops[name])
        for s in g.successors(name):
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (*key(s), s))
    return out
