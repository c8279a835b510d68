"""RLOO: G samples per prompt; each sample's baseline is the mean reward of the other
G - 1 (leave-one-out), so it needs G >= 2. Usually run without a reference; the KL (when
`use_reference`) goes into the loss as in GRPO. The step is GRPO's with another advantage
estimator, written verl-style: the dedup passes remove the per-sample prefix work."""

from __future__ import annotations

from rollplex.algos.grpo import build_grpo
from rollplex.graph.ir import Graph
from rollplex.specs import AlgoSpec, ModelSpec, WorkloadSpec


def build_rloo(model: ModelSpec, workload: WorkloadSpec, algo: AlgoSpec) -> Graph:
    g = workload.group_size
    if g < 2:
        raise ValueError(f"RLOO needs group_size >= 2 for a leave-one-out baseline, got {g}")
    return build_grpo(model, workload, algo, estimator="rloo")
