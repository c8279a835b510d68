"""What the executor reads from a plan once, besides its memory effects (plan_effects.py):
the micro-batch counts it hands the backend, the values each device group accounts for,
which external values start a step on host, and which are persistent (weights, optimizer
state) and which of those no copy moves."""

from __future__ import annotations

from collections.abc import Sequence

from rollplex.graph.ir import Graph, ValueKind
from rollplex.planner.plan import Plan, Step
from rollplex.runtime.accounting import ExecutionError
from rollplex.runtime.plan_effects import COPY_KINDS


def plan_micro_batches(plan: Plan) -> int:
    """The training micro-batch count the plan was sized with (1 for a plan that has
    none: the whole step in one forward and backward)."""
    count = plan.meta.get("train_micro_batches", 1)
    if not isinstance(count, int) or count < 1:
        raise ExecutionError(
            f"plan meta train_micro_batches={count!r}: expected an integer >= 1 "
            "(planned from schedule.train_micro_tokens)"
        )
    return count


def plan_op_micro_batches(plan: Plan) -> dict[str, int]:
    """op -> the micro-batches the plan priced it in (planner/api.py `op_micro_counts`),
    for the forwards outside the trainer's that run in more than one."""
    counts = plan.meta.get("op_micro_batches", {})
    if not isinstance(counts, dict) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts.values()
    ):
        raise ExecutionError(f"plan meta op_micro_batches={counts!r}: expected op -> integer >= 1")
    return dict(counts)


def owned_values(
    plan: Plan, graph: Graph, order: Sequence[Step], dev_of: dict[int, int]
) -> dict[int, set[str]]:
    """Value (and op, for carries) names each device group accounts for."""
    owned: dict[int, set[str]] = {
        i: {sl.value for sl in d.slots} for i, d in enumerate(plan.devices)
    }
    for s in order:
        op = graph.ops.get(s.op)
        if op is not None:
            owned[dev_of[s.index]].add(op.name)
    return owned


def initial_host(graph: Graph, order: Sequence[Step]) -> set[str]:
    """External values a step starts with on host: host data, and those whose first copy
    is an onload."""
    first: dict[str, str] = {}
    for s in order:
        if s.kind in ("offload", "onload"):
            first.setdefault(s.op, s.kind)
    return {
        v.name
        for v in graph.values.values()
        if v.external and (v.kind is ValueKind.HOST_DATA or first.get(v.name) == "onload")
    }


def persistent_values(graph: Graph) -> frozenset[str]:
    """The external weights and optimizer state: the backend's model and optimizer hold
    them across steps, so a planned free leaves them resident in truth."""
    kinds = (ValueKind.WEIGHTS, ValueKind.OPTIMIZER_STATE)
    return frozenset(v.name for v in graph.values.values() if v.external and v.kind in kinds)


def unmoved_values(persistent: frozenset[str], order: Sequence[Step]) -> frozenset[str]:
    """The persistent values no copy moves. They are never freed while a stream may read
    them, so they need no record_stream: thousands of tensors before every op (~3 ms a
    step on the 3B H100 trace) for blocks the allocator never reuses."""
    copied = {s.op for s in order if s.kind in COPY_KINDS}
    return persistent - copied
