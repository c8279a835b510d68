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
from collections.abc import Callable, Iterable

from rollplex.graph.ir import Graph, Op, Phase

PHASE_RANK = {Phase.ROLLOUT: 0, Phase.REFERENCE: 1, Phase.TRAIN: 2, Phase.UPDATE: 3}


def upward_rank(graph: Graph, seconds: Callable[[Op], float]) -> dict[str, float]:
    """Longest path (in predicted seconds) from each op to the end of the step."""
    ops = list(graph.ops.values())
    rank = _upward_rank(graph, ops, _successors(graph, ops), seconds)
    return {op.name: r for op, r in zip(ops, rank, strict=True)}


def priority_order(graph: Graph, seconds: Callable[[Op], float]) -> list[Op]:
    ops = list(graph.ops.values())  # ops are numbered in program order from here on
    succ = _successors(graph, ops)
    rank = _upward_rank(graph, ops, succ, seconds)
    key = [(PHASE_RANK[op.phase], -rank[i], i) for i, op in enumerate(ops)]  # i: no ties
    waits = [0] * len(ops)
    for after in succ:
        for j in after:
            waits[j] += 1
    ready = [key[i] for i, w in enumerate(waits) if w == 0]
    heapq.heapify(ready)
    out: list[Op] = []
    while ready:
        i = heapq.heappop(ready)[2]
        out.append(ops[i])
        for j in succ[i]:
            waits[j] -= 1
            if waits[j] == 0:
                heapq.heappush(ready, key[j])
    return out


def _upward_rank(
    graph: Graph, ops: list[Op], succ: list[list[int]], seconds: Callable[[Op], float]
) -> list[float]:
    rank = [0.0] * len(ops)
    if all(j > i for i, after in enumerate(succ) for j in after):  # program order is topological
        order: Iterable[int] = range(len(ops) - 1, -1, -1)
    else:
        index = {op.name: i for i, op in enumerate(ops)}
        order = [index[op.name] for op in reversed(graph.topo_order())]
    for i in order:
        after = succ[i]
        rank[i] = seconds(ops[i]) + (max([rank[j] for j in after]) if after else 0.0)
    return rank


def _successors(graph: Graph, ops: list[Op]) -> list[list[int]]:
    """The ops (by program index) that read each op's outputs, each once."""
    index = {op.name: i for i, op in enumerate(ops)}
    made = graph.producers()
    succ: list[list[int]] = [[] for _ in ops]
    for j, op in enumerate(ops):
        for v in op.inputs.values():
            src = made.get(v)
            if src is not None:
                after = succ[index[src.name]]
                if not after or after[-1] != j:  # an op reading two outputs of one producer
                    after.append(j)
    return succ
