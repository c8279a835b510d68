"""Graph-to-graph passes. Each returns (graph, changed); lint runs after every pass."""

from rollplex.graph.passes.base import PassFn, PassRecord, run_passes
from rollplex.graph.passes.decompose_prefix import decompose_prefix
from rollplex.graph.passes.eliminate_dead_ops import eliminate_dead_ops
from rollplex.graph.passes.reuse_across_phases import reuse_across_phases
from rollplex.graph.passes.share_group_prefix import share_group_prefix
from rollplex.graph.passes.skip_dead_prefix import skip_dead_prefix

#: decompose_prefix alone keeps verl's per-sample work; the rest deduplicate it.
DEDUP_PASSES: tuple[PassFn, ...] = (
    decompose_prefix,
    share_group_prefix,
    reuse_across_phases,
    skip_dead_prefix,
    eliminate_dead_ops,
)
SPLIT_ONLY: tuple[PassFn, ...] = (decompose_prefix, skip_dead_prefix, eliminate_dead_ops)

__all__ = [
    "DEDUP_PASSES",
    "SPLIT_ONLY",
    "PassFn",
    "PassRecord",
    "decompose_prefix",
    "eliminate_dead_ops",
    "reuse_across_phases",
    "run_passes",
    "share_group_prefix",
    "skip_dead_prefix",
]
