"""Parallelism-aware weight sharing: the layout algebra between training and rollout.

Training (FSDP2 of degree d_t, optionally TP t_t) and rollout (vLLM TP t_r, colocated on
the same GPUs) hold the same weights in different layouts. For every rollout tensor on
every GPU the algebra answers which of its bytes the GPU's training storage (the bf16
compute copy) already holds, and whether the rollout can read them in place.

Coordinates. Every tensor is a 2-D matrix (rows = dim 0, cols = the rest). A rank-local
tensor in either layout is a sequence of `Block`s (rows x cols of one transformers
parameter, or padding), stored one after the other, each row-major. The training side is
`layouts.train_blocks` (FSDP2's real `torch.chunk` sharding of dim 0, with its padding, on
top of the TP shard); the rollout side is `layouts.rollout_blocks` (vLLM's fused
`qkv_proj` = [q_r; k_r; v_r] with KV heads replicated when t_r > KV heads, `gate_up_proj`
= [gate_r; up_r], row-parallel o/down/proj, vocab-parallel embed/lm_head padded to 64
rows, replicated norms and row-parallel biases, the vision tower split or replicated).

The classes, per (rollout tensor, GPU); `Share.shared_bytes` is what costs no memory:
- identical: the rollout tensor is one contiguous byte range of one local training shard
  (`Share.host`, `host_offset`): it is that shard, or a slice of it, reshaped. All shared.
- view: every byte is local and the tensor is a view with strides, either a 2-D
  sub-block of one shard (`host`, `strides`), or a fused tensor whose parts are several
  shards that the trainer allocates adjacently in rollout order (`placements`: each
  shard's byte offset inside the fused buffer). All shared.
- partial: some local shards are contiguous byte ranges of the rollout tensor: the
  trainer allocates them inside the rollout tensor's buffer (`placements`) and only the
  holes between them are rebuilt (from other GPUs, or from local bytes that are not
  contiguous). Shared = the placed shards' bytes.
- incompatible: no local shard is a contiguous range of the tensor (e.g. a row-parallel
  block whose rows interleave with bytes other GPUs hold, or a dtype cast); the tensor is
  rebuilt whole into the rebuild buffer. `local_bytes` of it can still be copied locally.
FSDP2 padding is not part of any of these: it belongs to the all-gather input and can
live anywhere (the trainer pads while copying in).

The training storage layout is chosen to maximise aliasing (`TrainPlacement.aliasing_storage`):
fused parts are placed adjacently; a row-parallel weight is stored as its rollout column
blocks stacked (so FSDP2's dim-0 chunks are row ranges of one rollout rank's block; when
d_t = t_r that is exactly FSDP2's `Shard(1)`); transformers' fused vision qkv is stored
[q_0; k_0; v_0; q_1; ...] by rollout rank. The rollout rank map is chosen so that each
GPU is the rank whose rows its FSDP chunk holds (`build.aligned_ranks`, `strided_ranks`).

Limits that no layout removes: a GPU holds 1/(d_t * t_t) of each sharded tensor and the
rollout needs 1/t_r, so at most t_r / (d_t * t_t) of it can be local; a training TP
column block of a row-parallel weight is never contiguous in a wider rollout column block.

Public API: `build_sharing(model_spec, weights_spec) -> WeightSharing`; then
`WeightSharing.share(tensor, gpu) -> Share`, `.runs(tensor, gpu) -> [ByteRun]`,
`.train_shard(param, gpu)`, `.rollout_shard(tensor, gpu)`, `.tensors`, `.params`;
`rebuild.shard_homes(sharing, gpu)` (where the trainer allocates each local shard) and
`rebuild.rebuild_plan(sharing, tensor, gpu) -> [Copy]` (what weight_sync copies, from
which GPU); `report.tally(sharing) -> SharingReport` for the totals.

The torch rollout (`backend.fsdp.rollout_sync=share`) uses the same algebra with its own
tensors (`torch_rollout_tensors`: transformers' parameters, unfused, torch's TP plan);
`torch_rollout.py` builds that pair of layouts and predicts each rank's aliased, rebuilt
and received bytes (`torch_rollout_bytes`), which backends/fsdp/share.py then holds and
the planner charges that rollout (planner/shared_weights.py `torch_shared_weights`).
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
