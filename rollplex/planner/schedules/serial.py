"""serial: every phase back to back on all GPUs, as verl runs a colocated step.

One compute stream issues the ops in priority order; nothing overlaps. Run on the raw
graph it recomputes vision and prefix per sample and per phase (verl); run on the
deduplicated graph it is the strong baseline that isolates what overlap itself buys.
"""

from __future__ import annotations

from collections.abc import Callable

from rollplex.planner.plan import Plan
from rollplex.planner.schedules.common import PlanningContext, colocated, ordered


def plan_serial(ctx: PlanningContext, evaluate: Callable[[Plan], float] | None = None) -> Plan:
    """One candidate, so `evaluate` (the registry's common signature) is not needed."""
    pb, dev, timer = colocated(ctx, "serial")
    for op in ordered(ctx, timer):
        t = timer(op)
        pb.add(dev, 0, op, t.seconds, t.rate_class, scratch_bytes=t.scratch_bytes)
    return pb.plan
