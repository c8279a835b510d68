"""What the executor takes from a plan before it runs it: memory effects keyed by issue
position, and where it cannot follow the plan (issue position, message).

`plan_effects`: alloc-before and free-after lists, moved (and reported) only where a read in
the executed order forbids the plan's place. `unpartitioned_streams` / `partition_notes`:
the SM partitions that run as plain streams, and what each one that runs got.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollplex.graph.ir import Graph
from rollplex.planner.plan import MemAction, Plan, Step

COPY_KINDS = frozenset({"offload", "onload", "transfer"})
Moved = list[tuple[int, str]]  # (issue position, what the runtime did instead, and why)


def plan_effects(
    plan: Plan, graph: Graph, order: list[Step], pooled: Any = None
) -> tuple[dict[int, list[str]], dict[int, list[str]], Moved]:
    """(allocs, frees, moves) for steps issued in `order`; `pooled`: this rank's PoolSteps."""
    pos = {s.index: k for k, s in enumerate(order)}
    first: dict[str, int] = {}  # value -> first / last issue position that reads it
    last: dict[str, int] = {}
    for k, s in enumerate(order):
        op = graph.ops.get(s.op)
        names = [s.op] if s.kind == "offload" else []
        if op is not None and s.kind not in COPY_KINDS:
            names = list(op.inputs.values())
        if pooled is not None and s.index in pooled.transfers:
            names = pooled.sends(s)  # a hand-over reads what it sends
        for v in names:
            first.setdefault(v, k)
            last[v] = k
    allocs: dict[int, list[str]] = {}
    frees: dict[int, list[str]] = {}
    moved: Moved = []
    copied = {s.op for s in order if s.kind in ("offload", "onload")}
    for i, d in enumerate(plan.devices):
        if pooled is not None and i != pooled.pools.device:
            continue  # another pool's memory, in another process
        for e in d.effects:
            if e.value not in graph.values or e.at not in pos:
                continue  # scratch, a rollout TP copy (aliased here): nothing to hold
            k = pos[e.at]
            if e.action is MemAction.ALLOC and e.value not in copied:  # else: its onload
                at = k
                if graph.values[e.value].external and first.get(e.value, k) < k:
                    at = first[e.value]
                    moved.append((k, (
                        f"alloc of '{e.value}' planned before '{order[k].name}' moved before "
                        f"'{order[at].name}', which reads it earlier in the order executed"
                    )))  # fmt: skip
                allocs.setdefault(at, []).append(e.value)
            elif e.action is MemAction.FREE:
                if order[k].kind == "offload" and order[k].op == e.value:
                    continue  # the offload's own release: the move takes the device copy
                at = max(k, last.get(e.value, k))
                if at != k:
                    moved.append((k, (
                        f"free of '{e.value}' planned after '{order[k].name}' moved after "
                        f"'{order[at].name}', which reads it later in the order executed (a "
                        "plan defect, or streams the plan overlaps issued one after another)"
                    )))  # fmt: skip
                frees.setdefault(at, []).append(e.value)
    return allocs, frees, moved


def partition_starts(plan: Plan, pos: dict[int, int]) -> dict[str, tuple[int, float]]:
    """'<device group>:<stream>' -> (its first issue position, its SM fraction), for each
    SM-partitioned stream with a step issued here."""
    out: dict[str, tuple[int, float]] = {}
    for d in plan.devices:
        for st in d.streams:
            first = min((pos[i] for i in st.steps if i in pos), default=None)
            if st.partition is not None and first is not None:
                out[f"{d.name}:{st.name}"] = (first, st.partition)
    return out


def unpartitioned_streams(
    plan: Plan, pos: dict[int, int], why: Mapping[str, str] | None = None
) -> Moved:
    """Each SM-partitioned stream in `why` ('<group>:<stream>' -> the reason it runs as a
    plain stream; None: every one, green contexts not set up), at its first issue position."""
    out: Moved = []
    for name, (first, fraction) in partition_starts(plan, pos).items():
        if why is not None and name not in why:
            continue  # it runs on its green context
        reason = "green contexts are not set up" if why is None else why[name]
        out.append((first, (
            f"stream '{name}' is planned on an SM partition ({fraction:.0%} of the SMs) "
            f"but runs as a plain CUDA stream: {reason}"
        )))  # fmt: skip
    return out


def partition_notes(plan: Plan, pos: dict[int, int], got: Mapping[str, str]) -> dict[int, str]:
    """Issue position of each partitioned stream's first step -> `got[stream]` (what the
    '<group>:<stream>' got, e.g. its green context's SMs), for the streams in `got`."""
    return {k: got[name] for name, (k, _) in partition_starts(plan, pos).items() if name in got}
