"""Parallelism-aware weight sharing: the layout algebra between training and rollout.

For every rollout tensor on every GPU: which bytes the GPU's training storage already holds,
and whether the rollout can read them in place. `build_sharing(model_spec, weights_spec)`;
`rebuild.shard_homes`, `rebuild.rebuild_plan`; `report.tally`. The algebra, its classes and
limits: docs/architecture.md (Weights).
"""

from rollplex.weights.build import aligned_ranks, build_sharing, vision_fits_tp
from rollplex.weights.layouts import (
    Block,
    LayoutError,
    RolloutPlacement,
    TrainPlacement,
)
from rollplex.weights.params import (
    Param,
    RolloutTensor,
    Split,
    param_table,
    rollout_tensors,
    torch_rollout_tensors,
)
from rollplex.weights.rebuild import Copy, Home, rebuild_plan, shard_homes
from rollplex.weights.report import SharingReport, Tally, tally
from rollplex.weights.sharing import (
    ByteRun,
    Kind,
    Placement,
    Share,
    WeightSharing,
    contiguous_ranks,
    strided_ranks,
)

__all__ = [
    "Block",
    "ByteRun",
    "Copy",
    "Home",
    "Kind",
    "LayoutError",
    "Param",
    "Placement",
    "RolloutPlacement",
    "RolloutTensor",
    "Share",
    "SharingReport",
    "Split",
    "Tally",
    "TrainPlacement",
    "WeightSharing",
    "aligned_ranks",
    "build_sharing",
    "contiguous_ranks",
    "param_table",
    "rebuild_plan",
    "rollout_tensors",
    "shard_homes",
    "strided_ranks",
    "tally",
    "torch_rollout_tensors",
    "vision_fits_tp",
]
