"""serial: every phase back to back on all GPUs, as verl runs a colocated step.

One compute stream issues the ops in priority order; nothing overlaps. On the raw graph it
is verl's step; on the deduplicated graph, the baseline that isolates what overlap buys
(a split forward runs packed again: splitting pays only when the prefix moves).
"""

from __future__ import annotations

from collections.abc import Callable

from rollplex.graph.ir import Op
from rollplex.planner.plan import Plan
from rollplex.planner.schedules.common import (
    CachedTimer,
    PlanningContext,
    colocated,
    ordered,
    packed_notes,
    packed_order,
    serial_timings,
)


def plan_serial(
    ctx: PlanningContext,
    label: str = "serial",
    timer: CachedTimer | None = None,
    order: list[Op] | None = None,
    evaluate: Callable[[Plan], float] | None = None,
) -> Plan:
    """`label` names the schedule in the plan (rollplex returns this plan when overlap
    gains nothing, and passes the timer and priority order it already has). `evaluate`,
    the registry's common argument, is unused: serial has one candidate."""
    pb, dev, timer = colocated(ctx, label, timer)
    order, packed = packed_order(ctx, order if order is not None else ordered(ctx, timer))
    timings = serial_timings(timer, order, packed)
    for op in order:
        t = timings.get(op.name) or timer(op)
        pb.add(dev, 0, op, t.seconds, t.rate_class, scratch_bytes=t.scratch_bytes)
    pb.plan.notes += packed_notes(packed)
    return pb.plan
