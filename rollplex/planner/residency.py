"""Residency: fit each device group's plan into its HBM budget, then fix the slots.

While the arenas exceed the budget, a tensor with a long stretch without use moves to host
over the copy stream for that stretch (optimizer state, frozen weights, boundaries made in
the decode window), with its onload just in time: the largest, or the smallest that covers
the overage, whichever settles faster. Where no such plan fits, onloads wait until the peak
they were moved for has passed (late onloads). Optimizer state moves only in the share the
overage needs, and each plan compared gets its write-backs at the next step's start where
they fit (write_backs.py). If nothing more can move, planning fails saying by how much its
closest plan misses and what is resident at that plan's peak.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from rollplex.graph.ir import Graph
from rollplex.planner.happens_before import side_windows
from rollplex.planner.lifetimes import (
    MAIN_LANE,
    Lifetime,
    device_lifetimes,
    hold_for_handover,
    positions,
)
from rollplex.planner.memory import MemoryAssignment, assign
from rollplex.planner.memory.nesting import assign_nested
from rollplex.planner.memory.records import lower_bound, peak_position
from rollplex.planner.offloads import (
    PARTIAL_STEPS,
    apply_offloads,
    idle_at_peak,
    may_move,
    offload,
    offload_order,
    partial_share,
    peak_end,
)
from rollplex.planner.plan import (
    DevicePlan,
    MemAction,
    MemoryEffect,
    Plan,
    Slot,
)
from rollplex.planner.simulate import replay
from rollplex.planner.sizing import DeviceSizer
from rollplex.planner.write_backs import write_backs_at_start

GIB = 1 << 30


class PlanOverBudget(ValueError):
    """The plan cannot fit the HBM budget, even with offloads. `summary`: where, how much
    and the budget, for a caller that reports the miss beside another plan; `account`: the
    summary with the miss and the residents at the peak, without the advice."""

    def __init__(self, message: str, summary: str | None = None, account: str = "") -> None:
        super().__init__(message)
        self.summary = summary or message
        self.account = account or self.summary


@dataclass(slots=True)
class Memory:
    """What `settle_memory` needs to know about the run."""

    graph: Graph  # the graph the plan runs (its ops name what each step reads and makes)
    sizers: dict[str, DeviceSizer]
    host_link_gbps: float
    strategy: str
    budget_bytes: int
    rollout_copies: bool = True
    allow_offload: bool = True
    write_back: str = "auto"  # ScheduleSpec.write_back: "step_end" keeps verl's order
    offload_in_part: bool = True  # ScheduleSpec.offload_in_part: false moves state whole


# First moves the covering rule tries, smallest covering tensor first
COVERING_TRIES = 3


def settle_memory(plan: Plan, mem: Memory, interference=None, closest: bool = False) -> Plan:
    """Fit `plan` in place. What moves is chosen tensor by tensor, by two rules: the
    largest one idle at the peak, and one that covers the overage alone, tried from the
    smallest up (cheaper copies, but an onload the next step's first op waits for can cost
    more than a larger one the decode hides). The fastest fitting result is kept; on a tie,
    the first. Only if none fits are the rules tried again with late onloads: an onload
    that just in time would land before the peak waits until the peak has passed, exposing
    its copy (verl's optimizer offload: AdamW's state comes back after the backward). If
    still none fits, the plan kept is the one with the lower peak. The late rules run only
    where they may fit (`_late_onloads_may_fit`: scoring a candidate needs no more), or
    with `closest`, for a final plan whose error should name its closest miss."""
    start = _settle(plan, mem, interference, covering=False)
    if start is None:  # nothing moved: every rule's plan is this one
        return plan
    best = _best_rule(plan, start, mem, interference, late_onloads=False)
    if not best.fits_budget and (closest or _late_onloads_may_fit(plan, mem)):
        late = start.clone()
        _settle(late, mem, interference, covering=False, late_onloads=True)
        if late.fits_budget:  # the covering rules only ever try to be faster than it
            best = _best_rule(late, start, mem, interference, late_onloads=True)
            best.notes.append(_late_note(best, mem))
        elif late.peak_bytes_per_gpu < plan.peak_bytes_per_gpu:
            best = late  # the closest miss: the error names what really stays at the peak
    if best is not plan:
        _note_parts(best)
        _take(plan, best)
    return plan


def _note_parts(plan: Plan) -> None:
    """A note for each value whose copies move only part of it (`partial_share`)."""
    for dev in plan.devices:
        for s in dev.steps:
            if s.kind != "offload" or s.share >= 1:
                continue
            note = f"offload in part: '{s.op}' moves {round(s.share * PARTIAL_STEPS)}/"
            if any(n.startswith(note) for n in plan.notes):
                continue
            sizes = [sl.size for sl in dev.slots if sl.value == s.op]  # moved parts, then kept
            moved, size = sizes[0], sizes[0] + sizes[-1]
            plan.notes.append(
                f"{note}{PARTIAL_STEPS} of its {_size(size)} to host ({_size(moved)}), the "
                "rest stays resident: what the budget needs (schedule.offload_in_part)"
            )


def _with_write_backs(plan: Plan, mem: Memory, interference) -> Plan:
    """`plan`, or (`write_back=auto`, a plan that fits) with its write-backs at the next
    step's start where that fits and is faster (write_backs.py)."""
    if mem.write_back != "auto" or not plan.fits_budget:
        return plan
    return write_backs_at_start(plan, mem.graph, interference, lambda p, d: _fix_slots(p, d, mem))


def _fix_slots(plan: Plan, dev: DevicePlan, mem: Memory) -> int:
    """Settle `dev`'s slots as they are (no moves); its peak position."""
    lives = _lifetimes(plan, dev, mem)
    result, lives = _assign(dev, lives, mem)
    _finish(dev, lives, result, mem)
    return peak_position([lf.record for lf in lives])


def _take(plan: Plan, other: Plan) -> None:
    """Make `plan` (which callers hold) the plan `other` is, field by field."""
    for f in fields(Plan):
        setattr(plan, f.name, getattr(other, f.name))


def _late_note(plan: Plan, mem: Memory) -> str:
    """What a plan with late onloads waits for: each onload whose first reader starts as
    it ends, and the copy seconds of those."""
    waited: dict[str, float] = {}
    for dev in plan.devices:
        for on in (s for s in dev.steps if s.kind == "onload"):
            readers = [
                s
                for s in dev.steps
                if (op := mem.graph.ops.get(s.op)) and on.op in op.inputs.values()
            ]
            if readers and min(r.start_s for r in readers) <= on.end_s + 1e-9:
                waited[on.op] = waited.get(on.op, 0.0) + on.end_s - on.start_s
    names = ", ".join(f"{v} ({t:.2f} s)" for v, t in waited.items()) or "nothing"
    return (
        f"late onloads: no plan with just-in-time onloads fits {_size(mem.budget_bytes)}; "
        f"moved tensors come back after the peak they were moved for, and the step waits "
        f"for the copies of {names}"
    )


def _late_onloads_may_fit(plan: Plan, mem: Memory) -> bool:
    """Whether late onloads could fit `plan`: on each device over budget, what may move and
    is idle at its peak (`offloads.idle_at_peak`) adds up to at least the miss, and one of
    those came back (was onloaded) before the peak."""
    for dev in plan.devices:
        if dev.peak_bytes <= mem.budget_bytes:
            continue
        lives = _lifetimes(plan, dev, mem)
        peak = peak_position([lf.record for lf in lives])
        movable = [lf for lf in lives if may_move(mem.graph, lf)]
        idle = idle_at_peak(dev, movable, peak, mem.graph)
        _, begin, _, _ = positions(dev)
        onloaded = {s.op: begin[s.index] for s in dev.steps if s.kind == "onload"}
        if sum(lf.record.size for lf in idle) < dev.peak_bytes - mem.budget_bytes:
            return False
        if not any(onloaded.get(lf.value) == lf.record.first for lf in idle):
            return False
    return True


def _best_rule(plan: Plan, start: Plan, mem: Memory, interference, late_onloads: bool) -> Plan:
    """`plan` (settled by the largest-first rule) or the fastest fitting covering rule's
    plan, each settled from `start`, and each with its write-backs at the next step's
    start where they fit (`_with_write_backs`): a rule that moves more can win by them."""
    best = _with_write_backs(plan, mem, interference)
    for first in range(COVERING_TRIES):
        trial = start.clone()
        if _settle(trial, mem, interference, True, first, late_onloads) is None:
            break  # no covering tensor left to start from
        trial = _with_write_backs(trial, mem, interference)
        if trial.fits_budget and (not best.fits_budget or _faster(trial, best)):
            best = trial
    return best


def _faster(a: Plan, b: Plan) -> bool:
    """`a` is faster than `b`, or as fast with less copy time: a write-back beside the
    step's first ops hides its copy, and of two plans that hide theirs, the one moving
    fewer bytes over the host link each step wins."""
    if a.step_time_s < b.step_time_s * (1 - 1e-9):
        return True
    return a.step_time_s <= b.step_time_s * (1 + 1e-9) and _copy_s(a) < _copy_s(b) * (1 - 1e-9)


def _copy_s(plan: Plan) -> float:
    return sum(s.solo_s for s in plan.all_steps() if s.kind in ("offload", "onload"))


def _settle(
    plan: Plan,
    mem: Memory,
    interference,
    covering: bool,
    first: int = 0,
    late_onloads: bool = False,
) -> Plan | None:
    """Fit `plan` in place under one rule, its first move on each device the rule's
    `first`-th choice (then its best); return a copy of it from before its first move (for
    the other rules to start from), or None when nothing moved. With `late_onloads`, a
    moved tensor comes back only after the peak it was moved for."""
    replay(plan, interference)
    before: Plan | None = None
    for dev in plan.devices:
        tried: set[str] = set()
        while True:
            lives = _lifetimes(plan, dev, mem)
            result, lives = _assign(dev, lives, mem)
            if result.total_bytes <= mem.budget_bytes or not mem.allow_offload:
                break
            need = result.total_bytes - mem.budget_bytes if covering else None
            order = offload_order(dev, lives, tried, mem.graph, need)
            pick = first if not tried else 0
            if len(order) <= pick or (pick and order[pick].record.size < need):
                break  # no such first choice (a later one must cover the overage alone)
            victim = order[pick]
            if before is None:
                before = plan.clone()
            tried.add(victim.value)
            after_s = peak_end(dev, lives) if late_onloads else None
            share = partial_share(victim, need) if mem.offload_in_part else 1.0
            offload(plan, dev, victim, mem.graph, mem.host_link_gbps, after_s, share)
            replay(plan, interference)
        _finish(dev, lives, result, mem)
    if before is not None:  # a later group's offloads may shift this one's times
        replay(plan, interference)
    return before


def settled_time(plan: Plan, mem: Memory, interference=None) -> tuple[float, bool]:
    """(step time, fits the budget) as `settle_memory` would leave the plan, for scoring
    candidate plans cheaply: when each group's tensors fit the budget even unshared (no
    strategy packs worse than giving every tensor its own bytes), settling moves nothing,
    so no offsets need assigning. Otherwise the plan is settled; one that misses is put
    back as it was, so that a final `settle_memory(closest=True)` can find its closest miss."""
    replay(plan, interference)
    for dev in plan.devices:
        if _fits_unshared(dev, mem):
            continue  # no lifetimes needed: even the sum of everything fits
        if sum(lf.record.size for lf in _lifetimes(plan, dev, mem)) > mem.budget_bytes:
            before = plan.clone()
            settle_memory(plan, mem, interference)
            seconds, fits = plan.step_time_s, plan.fits_budget
            if not fits:
                _take(plan, before)
            return seconds, fits
    return plan.step_time_s, True


def unshared_time(plan: Plan, mem: Memory, interference=None) -> float | None:
    """The replayed step time when every group's tensors fit the budget unshared (then
    `settled_time` gives it too, and settling would move nothing); None otherwise. For a
    plan that is only scored: it reads nothing but the steps' times and scratch."""
    replay(plan, interference)
    if all(_fits_unshared(dev, mem) for dev in plan.devices):
        return plan.step_time_s
    return None


def _fits_unshared(dev: DevicePlan, mem: Memory) -> bool:
    bound = mem.sizers[dev.name].size_bound() + sum(s.scratch_bytes for s in dev.steps)
    return bound <= mem.budget_bytes


def _assign(
    dev: DevicePlan, lives: list[Lifetime], mem: Memory
) -> tuple[MemoryAssignment, list[Lifetime]]:
    """Offsets for `lives`, side streams' arenas nested in the compute stream's over their
    windows (`memory/nesting.py`); nested records move to the compute lane."""
    records = [lf.record for lf in lives]
    lanes = {r.lane for r in records} - {MAIN_LANE}
    if not lanes:
        return assign(records, mem.strategy), lives
    _, begin, until, end = positions(dev)
    windows = side_windows(dev, lanes, begin, until, end, MAIN_LANE)
    result, lane_of = assign_nested(records, lambda rs: assign(rs, mem.strategy), windows)
    moved = [
        lf
        if lf.record.lane == lane
        else Lifetime(replace(lf.record, lane=lane), lf.value, lf.kind, lf.first_step, lf.last_step)
        for lf, lane in zip(lives, lane_of, strict=True)
    ]
    return result, moved


def check_budget(plan: Plan) -> None:
    """Raise PlanOverBudget naming the device, the miss and the residents at the peak."""
    for dev in plan.devices:
        if dev.peak_bytes <= dev.budget_bytes:
            continue
        miss = dev.peak_bytes - dev.budget_bytes
        top = [s for s in dev.live_at_peak() if s.size][:6]
        resident = ", ".join(f"{s.value} {_size(s.size)}" for s in top)
        summary = (
            f"plan '{plan.schedule}' on '{dev.name}' needs {_size(dev.peak_bytes)} per "
            f"GPU but the budget is {_size(dev.budget_bytes)}"
        )
        account = (
            f"{summary}: it misses by {_size(miss)} after offloading what could move. "
            f"Largest residents at the peak: {resident}."
        )
        raise PlanOverBudget(
            f"{account} Use more GPUs, a larger rollout TP, fewer prompts per step, "
            f"smaller train_micro_tokens (which bounds an op's scratch, not a training "
            f"forward's saved activations: every micro-batch's wait for the backward) or "
            f"schedule.train_micro_fused=true (forward and backward per micro-batch, as verl "
            f"runs them: one micro-batch's saved activations at a time).",
            summary,
            account,
        )


def _size(nbytes: int) -> str:
    """Bytes in GiB to one decimal, or in MiB or KiB where GiB would read 0.0 (a CPU
    model's budget)."""
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20)):
        if nbytes >= scale * 0.05:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes / 1024:.1f} KiB"


def _lifetimes(plan: Plan, dev: DevicePlan, mem: Memory) -> list[Lifetime]:
    lives = device_lifetimes(mem.graph, dev, mem.sizers[dev.name], mem.rollout_copies)
    if plan.transfers:
        steps = {s.index: s for d in plan.devices for s in d.steps}
        lives = hold_for_handover(mem.graph, dev, steps, plan.transfers, lives)
    return apply_offloads(dev, lives)


def _finish(dev: DevicePlan, lives: list[Lifetime], result, mem: Memory) -> None:
    dev.budget_bytes = mem.budget_bytes
    dev.arena_bytes = dict(result.arena_sizes)
    dev.peak_bytes = result.total_bytes
    dev.lower_bound_bytes = lower_bound([lf.record for lf in lives])
    dev.slots, dev.effects = [], []
    slots, effects, alloc, free = dev.slots, dev.effects, MemAction.ALLOC, MemAction.FREE
    for lf, off in zip(lives, result.offsets, strict=True):
        r = lf.record
        slots.append(
            Slot(lf.value, r.size, lf.first_step, lf.last_step, r.lane, off, value_kind=lf.kind)
        )
        effects.append(MemoryEffect(alloc, lf.value, lf.first_step, r.size, r.lane, off))
        effects.append(MemoryEffect(free, lf.value, lf.last_step, r.size, r.lane, off))
    size_of: dict[str, int] = {}  # a value's first slot gives the bytes it moves
    for sl in dev.slots:
        size_of.setdefault(sl.value, sl.size)
    for s in dev.steps:
        if s.kind in ("offload", "onload"):
            size = size_of.get(s.op, 0)
            dev.effects.append(MemoryEffect(MemAction(s.kind), s.op, s.index, size, s.stream))
