"""Whether the plan takes the rollout's activations in place of a training forward: prefill
once (graph/passes/prefill_once.py) and decode once (graph/passes/decode_once.py). Each is
planned with and without, and kept when it fits and is predicted faster; the reason it was
not taken goes into the plan's notes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph
from rollplex.graph.passes.decode_once import decode_once
from rollplex.graph.passes.prefill_once import prefill_once
from rollplex.planner.api import plan_graph
from rollplex.planner.cost_model import CostModel
from rollplex.planner.interference import InterferenceModel
from rollplex.planner.plan import Plan
from rollplex.planner.residency import PlanOverBudget
from rollplex.specs import HardwareSpec, ModelSpec, ScheduleSpec, WorkloadSpec


@dataclass(frozen=True, slots=True)
class Reuse:
    """One reuse: its pass, the output port that holds the activations, and its notes."""

    name: str  # "prefill once", as the notes and the schedule option say it
    rewrite: Callable[[Graph], tuple[Graph, bool]]
    port: str  # the rollout op's output holding the activations for the backward
    rows: str  # what stays on the rollout's GPUs (why the rollout runs at the training TP)
    holding: str  # what the plan holds, for the note when it does not fit
    held_for: str  # how long, for the note when it is slower
    stands_in: str  # what replaces what, for the note when it is taken
    held_what: str
    engine_held: bool = False  # in the decode engine's workspace: a host copy frees nothing


PREFILL_ONCE = Reuse(
    "prefill once",
    prefill_once,
    "exported",
    "exported rows",
    "holding the exported activations across the decode",
    "across the decode",
    "the rollout's prefill is the training prefix forward",
    "layer inputs and K/V from the prefill to the backward",
)
DECODE_ONCE = Reuse(
    "decode once",
    decode_once,
    "kept",
    "kept rows",
    "holding the decode's layer outputs all step (in the engine's workspace)",
    "all step",
    "the rollout's decode is the training response forward",
    "layer outputs all step in the engine's workspace",
    engine_held=True,
)
REUSES = (PREFILL_ONCE, DECODE_ONCE)  # in the order the pipeline tries them


def plan_reuse(
    reuse: Reuse,
    after: Graph,
    best: Plan,
    model: ModelSpec,
    workload: WorkloadSpec,
    hardware: HardwareSpec,
    schedule: ScheduleSpec,
    cost_model: CostModel | None,
    interference: InterferenceModel | None,
) -> tuple[Graph, Plan] | None:
    """(graph, plan) with `reuse` applied, when that plan fits and is predicted faster than
    `best` or `best` misses the budget (it saves a training forward and its saved
    activations, and holds the rollout's from the rollout op to the backward); else None,
    with the reason in `best.notes`. The held rows stay where the rollout made them, so
    the rollout runs at the training TP degree."""
    once, changed = reuse.rewrite(after.copy())
    if not changed:
        return None
    lint(once)
    tp = schedule.parallel.train_tp
    if schedule.parallel.rollout_tp not in (None, tp):
        best.notes.append(
            f"{reuse.name} not planned: rollout TP {schedule.parallel.rollout_tp}"
            f" differs from training TP {tp} (the {reuse.rows} stay put)"
        )
        return None
    parallel = schedule.parallel.model_copy(update={"rollout_tp": tp})
    try:
        plan = plan_graph(
            once, model, workload, hardware, schedule.model_copy(update={"parallel": parallel}),
            cost_model, interference, True,
        )  # fmt: skip
    except PlanOverBudget:
        best.notes.append(f"{reuse.name} not taken: {reuse.holding} does not fit the memory budget")
        return None
    held = [op.outputs[reuse.port] for op in once if reuse.port in op.outputs]
    gib = sum(once.values[v].nbytes for v in held) / plan.devices[0].dp / 2**30
    moved = [s.op for d in plan.devices for s in d.steps if s.kind == "offload" and s.op in held]
    if reuse.engine_held and moved:
        best.notes.append(
            f"{reuse.name} not taken: it fits only by offloading {moved[0]}, which lives in "
            "the decode engine's workspace"
        )
        return None
    if best.fits_budget and plan.step_time_s >= best.step_time_s:
        best.notes.append(
            f"{reuse.name} not taken: step {plan.step_time_s * 1e3:.1f} ms against "
            f"{best.step_time_s * 1e3:.1f} ms (it holds {gib:.2f} GiB {reuse.held_for})"
        )
        return None
    against = "" if best.fits_budget else " over the budget"
    taken = (
        f"{reuse.name}: {reuse.stands_in}, step {plan.step_time_s * 1e3:.1f} ms against "
        f"{best.step_time_s * 1e3:.1f} ms{against}, holding {gib:.2f} GiB of {reuse.held_what}"
    )
    earlier = [n for n in best.notes if n.startswith(tuple(f"{r.name}: " for r in REUSES))]
    plan.notes[:0] = [*earlier, taken]  # the reuses taken before this one keep their notes
    return once, plan
