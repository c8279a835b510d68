"""`rollplex graph`: build the step graph, run the passes, show what each pass saved."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rollplex.algos import build_step
from rollplex.graph.ir import Graph, Phase
from rollplex.graph.passes import DEDUP_PASSES, SPLIT_ONLY, run_passes
from rollplex.graph.serialize import stable_hash, to_json
from rollplex.ops.costs import CostContext, op_cost, prefix_flops
from rollplex.specs.run import RunSpec

log = logging.getLogger(__name__)


def phase_totals(graph: Graph, ctx: CostContext) -> dict[str, dict[str, float]]:
    out = {str(p): {"flops": 0.0, "bytes": 0.0, "prefix_flops": 0.0, "ops": 0} for p in Phase}
    for op in graph:
        c = op_cost(graph, op, ctx)
        row = out[str(op.phase)]
        row["flops"] += c.flops
        row["bytes"] += c.bytes
        row["prefix_flops"] += prefix_flops(graph, op, ctx)
        row["ops"] += 1
    return out


def _table(stages: list[tuple[str, Graph]], ctx: CostContext) -> str:
    lines = [
        f"{'after':<22}{'phase':<11}{'ops':>4}{'PFLOP':>10}{'prefix PFLOP':>14}{'TB moved':>10}"
    ]
    for label, g in stages:
        for phase, row in phase_totals(g, ctx).items():
            lines.append(
                f"{label:<22}{phase:<11}{row['ops']:>4}{row['flops'] / 1e15:>10.2f}"
                f"{row['prefix_flops'] / 1e15:>14.2f}{row['bytes'] / 1e12:>10.2f}"
            )
    return "\n".join(lines)


def run_graph(spec: RunSpec, out: Path) -> dict[str, Any]:
    graph = build_step(spec.model, spec.workload, spec.algo)
    ctx = CostContext(spec.model, spec.workload)
    split, _ = run_passes(graph, SPLIT_ONLY)  # prefix accounting of the verl step
    final, records = run_passes(graph, DEDUP_PASSES)
    print("ops per phase (after passes):")
    for phase in Phase:
        names = [op.name for op in final.phase_ops(phase)]
        print(f"  {phase:<10} {', '.join(names)}")
    stages = [("built (verl)", graph)] + [(r.name, r.graph) for r in records]
    print(_table(stages, ctx))
    (out / "graph.json").write_text(to_json(final, indent=1))
    (out / "graph_before_passes.json").write_text(to_json(graph, indent=1))

    def total(g: Graph, key: str, phases=tuple(Phase)) -> float:
        t = phase_totals(g, ctx)
        return sum(t[str(p)][key] for p in phases)

    ref_train = (Phase.REFERENCE, Phase.TRAIN)
    shared = next(r.graph for r in records if r.name == "share_group_prefix")
    before = total(split, "prefix_flops", ref_train)
    after = total(final, "prefix_flops", ref_train)
    summary = {
        "graph_hash": stable_hash(final),
        "ops_before_passes": len(graph),
        "ops_after_passes": len(final),
        "total_flops_before_passes": total(graph, "flops"),
        "total_flops_after_passes": total(final, "flops"),
        "prefix_flops_before_passes": before,
        "prefix_flops_after_passes": after,
        "prefix_flops_after_share_group_prefix": total(shared, "prefix_flops", ref_train),
        "ref_train_prefix_reduction": before / after if after else None,
        "params_total": spec.model.param_count(),
        "params_trainable": spec.model.trainable_param_count(),
    }
    print(
        f"reference+train prefix FLOPs: {before / 1e15:.2f} -> {after / 1e15:.2f} PFLOP "
        f"({summary['ref_train_prefix_reduction']:.2f}x less); run folder: {out}"
    )
    return summary
