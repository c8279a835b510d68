"""Whether the plan takes decode_once (graph/passes/decode_once.py): planned with and
without, kept when it fits and is predicted faster (as jobs/pipeline.py does prefill_once)."""

from __future__ import annotations

from rollplex.graph.invariants import lint
from rollplex.graph.ir import Graph
from rollplex.graph.passes.decode_once import decode_once
from rollplex.planner.api import plan_graph
from rollplex.planner.cost_model import CostModel
from rollplex.planner.interference import InterferenceModel
from rollplex.planner.plan import Plan
from rollplex.planner.residency import PlanOverBudget
from rollplex.specs import HardwareSpec, ModelSpec, ScheduleSpec, WorkloadSpec


def plan_decode_once(
    after: Graph,
    best: Plan,
    model: ModelSpec,
    workload: WorkloadSpec,
    hardware: HardwareSpec,
    schedule: ScheduleSpec,
    cost_model: CostModel | None,
    interference: InterferenceModel | None,
) -> tuple[Graph, Plan] | None:
    """(graph, plan) with the rollout's decode as the training response forward, when that
    plan fits and is predicted faster than `best` (it saves the response forward, and holds
    each layer's output of every response token, at the cap, from the decode to the
    backward); else None, with the reason in `best.notes`. The kept rows stay where the
    decode made them, so the rollout runs at the training TP degree."""
    once, changed = decode_once(after.copy())
    if not changed:
        return None
    lint(once)
    tp = schedule.parallel.train_tp
    if schedule.parallel.rollout_tp not in (None, tp):
        best.notes.append(
            f"decode once not planned: rollout TP {schedule.parallel.rollout_tp}"
            f" differs from training TP {tp} (the kept rows stay put)"
        )
        return None
    parallel = schedule.parallel.model_copy(update={"rollout_tp": tp})
    try:
        plan = plan_graph(
            once, model, workload, hardware, schedule.model_copy(update={"parallel": parallel}),
            cost_model, interference, True,
        )  # fmt: skip
    except PlanOverBudget:
        best.notes.append(
            "decode once not taken: holding the decode's layer outputs until the backward "
            "does not fit the memory budget"
        )
        return None
    kept = [op.outputs["kept"] for op in once if "kept" in op.outputs]
    gib = sum(once.values[v].nbytes for v in kept) / plan.devices[0].dp / 2**30
    moved = [s.op for d in plan.devices for s in d.steps if s.kind == "offload" and s.op in kept]
    if moved:  # the buffer is the engine's workspace: a host copy would free nothing
        best.notes.append(
            f"decode once not taken: it fits only by offloading {moved[0]}, which lives in "
            "the decode engine's workspace"
        )
        return None
    if plan.step_time_s >= best.step_time_s:
        best.notes.append(
            f"decode once not taken: step {plan.step_time_s * 1e3:.1f} ms against "
            f"{best.step_time_s * 1e3:.1f} ms (it holds {gib:.2f} GiB until the backward)"
        )
        return None
    kept_note = (
        f"decode once: the rollout's decode is the training response forward, step "
        f"{plan.step_time_s * 1e3:.1f} ms against {best.step_time_s * 1e3:.1f} ms, holding "
        f"{gib:.2f} GiB of layer outputs from the decode to the backward"
    )
    # the passes taken before this one (prefill once) keep their notes, in order
    taken = [n for n in best.notes if n.startswith("prefill once: ")]
    plan.notes[:0] = [*taken, kept_note]
    return once, plan
