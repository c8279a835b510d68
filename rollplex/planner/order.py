"""The static priority every schedule issues ops in.

Dependencies first; among ready ops the earlier phase (rollout, reference, train, update),
then the longer critical path to the step's end (upward rank, in predicted seconds), then
program order. Names never break ties: renaming ops never changes a plan (tests permute).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rollplex.graph.ir import Graph, Op, Phase, topological

PHASE_RANK = {Phase.ROLLOUT: 0, Phase.REFERENCE: 1, Phase.TRAIN: 2, Phase.UPDATE: 3}


def priority_order(graph: Graph, seconds: Callable[[Op], float]) -> list[Op]:
    ops = list(graph.ops.values())  # ops are numbered in program order from here on
    succ = graph.successors()
    rank = _upward_rank(graph, succ, seconds)
    key = [(PHASE_RANK[op.phase], -rank[i], i) for i, op in enumerate(ops)]  # i: no ties
    return [ops[i] for i in topological(succ, key.__getitem__)]


def _upward_rank(
    graph: Graph, succ: list[list[int]], seconds: Callable[[Op], float]
) -> list[float]:
    """Longest path (in predicted seconds) from each op to the end of the step."""
    ops = list(graph.ops.values())
    rank = [0.0] * len(ops)
    if all(j > i for i, after in enumerate(succ) for j in after):  # program order is topological
        order: Iterable[int] = range(len(ops) - 1, -1, -1)
    else:
        order = reversed(topological(succ))
    for i in order:
        after = succ[i]
        rank[i] = seconds(ops[i]) + (max([rank[j] for j in after]) if after else 0.0)
    return rank
