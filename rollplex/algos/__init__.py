"""Graph builders, one short function per algorithm: (model, workload, algo) -> Graph."""

from __future__ import annotations

from collections.abc import Callable

from rollplex.algos.grpo import build_grpo
from rollplex.algos.ppo import build_ppo
from rollplex.algos.reinforce_pp import build_reinforce_pp_baseline
from rollplex.algos.rloo import build_rloo
from rollplex.graph.ir import Graph
from rollplex.specs import AlgoSpec, ModelSpec, WorkloadSpec

Builder = Callable[[ModelSpec, WorkloadSpec, AlgoSpec], Graph]
ALGORITHMS: dict[str, Builder] = {
    "grpo": build_grpo,
    "ppo": build_ppo,
    "rloo": build_rloo,
    "reinforce_plus_plus_baseline": build_reinforce_pp_baseline,
}


def build_step(model: ModelSpec, workload: WorkloadSpec, algo: AlgoSpec) -> Graph:
    """The step graph of `algo.name`, before any pass."""
    return ALGORITHMS[algo.name](model, workload, algo)
