"""A baseline's memory options: what its framework offers, chosen by the planner when the
plain plan does not fit, and recorded on the plan.

verl's options: host offload (residency), gradient checkpointing (always priced), and
forward+backward per micro-batch (`schedule.train_micro_fused`). `variants` lists the
schedules to try, cheapest first; `choose` keeps the fastest that fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from rollplex.graph.ir import Graph, ValueKind
from rollplex.planner.plan import Plan
from rollplex.specs import ScheduleSpec

GIB = 1 << 30
OFFLOAD_NAMES = {
    ValueKind.OPTIMIZER_STATE: "optimizer-state offload",
    ValueKind.WEIGHTS: "parameter offload",
}
CHECKPOINTING = "gradient checkpointing"
ONE_MICRO_BATCH = "forward and backward per micro-batch (one micro-batch's activations)"
RECOMPUTED_MICRO_BATCH = (
    "each micro-batch's forward rerun in its backward (one micro-batch's activations)"
)
LOSS_KINDS = ("policy_loss", "value_loss")  # the readers a fused forward's values may have

T = TypeVar("T")


@dataclass(slots=True, frozen=True)
class Variant:
    """One schedule to try and the options it turns on beyond the plain plan."""

    options: tuple[str, ...]
    schedule: ScheduleSpec


def variants(schedule: ScheduleSpec) -> list[Variant]:
    """A baseline's: the plain schedule, then forward and backward per micro-batch (verl's
    option). Offload is not a variant: residency offloads by itself when a plan misses its
    budget."""
    return [Variant((), schedule), *fallbacks(schedule, recompute=False)]


def fallbacks(schedule: ScheduleSpec, recompute: bool = True) -> list[Variant]:
    """What holds one micro-batch's activations at a time in place of all of them, cheapest
    first: forward and backward per micro-batch, then (`recompute`) each forward run again
    inside the backward, one more forward pass, for a graph that fused mode refuses
    (`check_fused`). None where `schedule` already holds one micro-batch's."""
    if schedule.train_micro_recompute or schedule.train_micro_fused:
        return []
    fused = Variant((ONE_MICRO_BATCH,), schedule.model_copy(update={"train_micro_fused": True}))
    if not recompute:
        return [fused]
    redo = schedule.model_copy(update={"train_micro_recompute": True})
    return [fused, Variant((RECOMPUTED_MICRO_BATCH,), redo)]


def check_fused(graph: Graph) -> None:
    """Fused micro-batches defer the training forward's values to the backward: refuse a
    graph in which anything but a loss reads them, naming the reader."""
    readers: dict[str, list[str]] = {}
    for op in graph:
        for v in op.inputs.values():
            readers.setdefault(v, []).append(op)
    for op in graph:
        if "saved" not in op.outputs or op.kind == "logprob_prefix":
            continue
        for port, v in op.outputs.items():
            if port == "saved":
                continue
            for r in readers.get(v, []):
                if r.kind not in LOSS_KINDS:
                    raise ValueError(
                        f"schedule.train_micro_fused: op '{r.name}' ({r.kind}) reads "
                        f"'{v}' of training forward '{op.name}', which a fused step computes "
                        "only inside the backward; use schedule.train_micro_recompute"
                    )


def choose(candidates: Sequence[tuple[Variant, T]], plan_of: Callable[[T], Plan]) -> int:
    """Index of the fastest candidate whose plan fits its budget; if none fits, of the one
    with the smallest peak (the baseline is then reported as not fitting, needing that)."""
    if not candidates:
        raise ValueError("no memory-option variant was planned")
    plans = [plan_of(c) for _, c in candidates]
    fitting = [i for i, p in enumerate(plans) if p.fits_budget]
    if fitting:
        return min(fitting, key=lambda i: (plans[i].step_time_s, i))
    return min(range(len(plans)), key=lambda i: (plans[i].peak_bytes_per_gpu, i))


def applied(plan: Plan, graph: Graph, chosen: Sequence[str] = ()) -> list[str]:
    """The memory options `plan` uses: its offloads by what they move, checkpointing (the
    trainer's, always), and `chosen` (the variant's)."""
    moved = []
    for d in plan.devices:
        for s in d.steps:
            if s.kind == "offload" and s.op in graph.values:
                name = OFFLOAD_NAMES.get(graph.values[s.op].kind)
                if name and name not in moved:
                    moved.append(name)
    boundary = any(
        s.kind == "offload" and s.op in graph.values and s.op not in _persistent(graph)
        for d in plan.devices
        for s in d.steps
    )
    out = sorted(moved) + ([CHECKPOINTING] if _trains(graph) else []) + list(chosen)
    if boundary:
        out.append("activation offload")
    return out


def record(plan: Plan, graph: Graph, chosen: Sequence[str]) -> None:
    """Write the options on the plan: `meta["memory_options"]` and a note."""
    options = applied(plan, graph, chosen)
    plan.meta["memory_options"] = options
    if options:
        plan.notes.append("memory options: " + ", ".join(options))


def needs_note(plan: Plan) -> str:
    """ "does not fit (needs X GiB)" for a plan over its budget."""
    dev = max(plan.devices, key=lambda d: d.peak_bytes - d.budget_bytes)
    return (
        f"does not fit (needs {dev.peak_bytes / GIB:.1f} GiB per GPU on '{dev.name}', "
        f"budget {dev.budget_bytes / GIB:.1f} GiB)"
    )


def _persistent(graph: Graph) -> set[str]:
    return {n for n, v in graph.values.items() if v.kind in OFFLOAD_NAMES}


def _trains(graph: Graph) -> bool:
    return any(op.kind == "backward" for op in graph)
