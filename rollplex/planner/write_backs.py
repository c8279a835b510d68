"""Write-backs at the next step's start: a trained value's offload after its last use
(AdamW's state after the optimizer step) ends the step with nothing beside it, so each is
tried at the next step's start instead, beside the step's first ops, and kept where the
plan still fits and gets faster. Residency (residency.py) applies it to every plan it
compares. Why the copy may run there: docs/architecture.md (Residency).
"""

from __future__ import annotations

from collections.abc import Callable

from rollplex.graph.ir import Graph
from rollplex.planner.lifetimes import positions
from rollplex.planner.offloads import wait_for, write_back_at_start
from rollplex.planner.plan import DevicePlan, Plan, Step
from rollplex.planner.simulate import replay
from rollplex.planner.sizing import PERSISTENT

START_WAITS = 2  # ops a write-back at the step's start may hold back until it ends
COPIES = ("offload", "onload", "transfer")


def write_backs_at_start(
    plan: Plan, graph: Graph, interference, fix_slots: Callable[[Plan, DevicePlan], int]
) -> Plan:
    """`plan` with each end write-back (`end_write_backs`) issued at the next step's start
    instead, one at a time, where the plan still fits and gets faster: the copy then runs
    beside the step's first ops, and the value stays resident over them. Where the value
    and those ops together miss the budget, the op that starts at the peak waits for the
    copy (`START_WAITS` times at most): the step then pays the rest of the copy there,
    and still less than all of it at its end. `fix_slots` settles a device's slots as the
    plan stands and returns its peak position."""
    best = plan
    for d, dev in enumerate(plan.devices):
        for step in end_write_backs(dev, graph):
            trial = best.clone()
            tdev = trial.devices[d]
            copy = next(s for s in tdev.steps if s.index == step.index)
            write_back_at_start(tdev, copy)
            waiters: list[str] = []
            for _ in range(START_WAITS + 1):
                replay(trial, interference)
                peaks = [fix_slots(trial, other) for other in trial.devices]
                waiter = None if trial.fits_budget else _starts_at(tdev, peaks[d], copy)
                if waiter is None:
                    break
                wait_for(trial, waiter, copy)
                waiters.append(waiter.name)
            if trial.fits_budget and trial.step_time_s < best.step_time_s * (1 - 1e-9):
                verb = "waits" if len(waiters) == 1 else "wait"
                held = f"; {', '.join(waiters)} {verb} for it to fit" if waiters else ""
                trial.notes.append(
                    f"write-back at the next step's start: '{step.op}' ({copy.solo_s * 1e3:.1f} ms "
                    f"of copy) goes to host beside the step's first ops, not after its last "
                    f"use{held}"
                )
                best = trial
    return best


def end_write_backs(dev: DevicePlan, graph: Graph) -> list[Step]:
    """The offloads that write a trained value (AdamW's state, trained weights) back after
    its last use, with copy time to pay: each is the value's last copy and the step's end
    waits for it, where nothing else runs (0.67 s of a 9.3 s step at 3B on an H100)."""
    last: dict[str, Step] = {}
    for s in sorted(dev.steps, key=lambda s: (s.start_s, s.index)):
        if s.kind in ("offload", "onload"):
            last[s.op] = s
    persistent = {k.value for k in PERSISTENT}
    return [
        s
        for s in last.values()
        if s.kind == "offload"
        and s.solo_s > 0
        and s.waits
        and (v := graph.values.get(s.op)) is not None
        and v.kind.value in persistent
    ]


def _starts_at(dev: DevicePlan, peak: int, copy: Step) -> Step | None:
    """The op (not a copy) that starts at position `peak` while `copy` still runs."""
    steps, begin, _, _ = positions(dev)
    return next(
        (
            s
            for s in steps
            if begin[s.index] == peak
            and s.kind not in COPIES
            and s.start_s < copy.end_s
            and copy.signals not in s.waits
        ),
        None,
    )
