"""REINFORCE++-baseline (arXiv 2501.03262; verl's adv_estimator=reinforce_plus_plus_baseline):
G samples per prompt, each reward less its group's mean, then whitened over every response
token of the batch, so that the advantage's scale is the batch's, not each group's. No
critic. The step is GRPO's with that estimator (algos/grpo.py)."""

from __future__ import annotations

from rollplex.algos.grpo import build_grpo
from rollplex.graph.ir import Graph
from rollplex.specs import AlgoSpec, ModelSpec, WorkloadSpec


def build_reinforce_pp_baseline(model: ModelSpec, workload: WorkloadSpec, algo: AlgoSpec) -> Graph:
    return build_grpo(model, workload, algo, estimator="reinforce_plus_plus_baseline")
