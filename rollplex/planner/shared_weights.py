"""Shared weights: what a colocated rollout's weight copy costs beyond training storage.

A rollout that aliases the trainer's weights (a torch rollout: `weight_sync` mode
"alias") reads, on every GPU, the bytes of its tensor-parallel shard that the GPU's FSDP
shard already holds in place, and needs its own memory only for the rest: the rebuild
buffer of `rollplex.weights` (the layout algebra). An engine that holds its own copy
(weight_sync mode "load", or a fused `generate` rollout such as vLLM's) pays the whole
shard. Per GPU and per tower (LLM, vision) this module gives, from the algebra for the
plan's layouts (training: FSDP over the training GPUs / train TP, with the aliasing
storage layout; rollout: TP t_r colocated on the same GPUs, the best rank map, vision
split when t_r divides it), the most any GPU rebuilds, and what a rebuild moves: bytes
from other GPUs and bytes copied from local storage that cannot be read in place.

The algebra costs O(GPUs x parameter classes) per layout, so it is computed once per
(model, layouts) and kept (the planner tries several rollout TP degrees per plan, and
plans many times per sweep). Above `MAX_EXACT_GPUS` training GPUs it is not computed
and the whole TP shard (v.nbytes / t_r) is charged, as for an engine: a GPU then holds at
most t_r / GPUs of an LLM shard, so that is within a few percent of the algebra (a vision
tower that vLLM replicates, when t_r does not divide it, is undercounted there). So is a
layout the algebra cannot serve, and weights whose size matches no tower.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

from rollplex.graph.ir import Graph, Phase, Value
from rollplex.planner.plan import DevicePlan
from rollplex.specs import ModelSpec
from rollplex.weights.build import aligned_ranks, vision_fits_tp
from rollplex.weights.layouts import LayoutError, RolloutPlacement, TrainPlacement
from rollplex.weights.sharing import WeightSharing, contiguous_ranks, strided_ranks

MAX_EXACT_GPUS = 64
COPY_KIND = "rollout_weights"  # the lifetimes' kind of a rollout copy's records
TOWERS = ("llm", "vision")


@dataclass(slots=True, frozen=True)
class GpuShare:
    """One tower's rollout shard on one GPU, in bytes."""

    full: int  # the shard: what a separate copy costs
    rebuild: int  # beyond training storage: the rebuild buffer
    remote: int  # of the rebuild, what comes from other GPUs on each sync
    local_copy: int  # of the rebuild, what local training storage holds (copied, not aliased)


@dataclass(slots=True, frozen=True)
class SharedWeights:
    """Per tower, one `GpuShare` per training GPU (index = GPU)."""

    layouts: str
    per_gpu: dict[str, tuple[GpuShare, ...]]
    _rebuild: dict[tuple[str, ...], int] = field(default_factory=dict, compare=False)

    def rebuild_bytes(self, towers: tuple[str, ...]) -> int:
        """The most any GPU holds beyond training storage for these towers."""
        out = self._rebuild.get(towers)
        if out is None:
            n = len(self.per_gpu[towers[0]])
            out = max(sum(self.per_gpu[t][g].rebuild for t in towers) for g in range(n))
            self._rebuild[towers] = out
        return out

    def full_bytes(self, towers: tuple[str, ...]) -> int:
        """The most any GPU would hold as a separate copy in the rollout layout."""
        n = len(self.per_gpu[towers[0]])
        return max(sum(self.per_gpu[t][g].full for t in towers) for g in range(n))

    def sync_bytes(self, towers: tuple[str, ...]) -> list[tuple[int, int]]:
        """Per GPU, (bytes from other GPUs, bytes copied locally) of one rebuild."""
        n = len(self.per_gpu[towers[0]])
        return [
            (
                sum(self.per_gpu[t][g].remote for t in towers),
                sum(self.per_gpu[t][g].local_copy for t in towers),
            )
            for g in range(n)
        ]


@functools.lru_cache(maxsize=128)
def shared_weights(
    model: ModelSpec, train_gpus: int, train_tp: int, rollout_tp: int
) -> SharedWeights | None:
    """The algebra's per-GPU bytes for a rollout of TP `rollout_tp` colocated with
    training on `train_gpus` GPUs (FSDP `train_gpus / train_tp`, TP `train_tp`); None when
    not computed (see the module docstring). As `rollplex weights` with its defaults
    (`build_sharing`: aliasing storage, vision split when it can be, the rank map that
    shares the most bytes), evaluated on one decoder layer and one vision block: FSDP2
    shards every parameter on its own, so each layer of a class shares alike, and the
    class's bytes are the one layer's times the layer count."""
    if train_gpus > MAX_EXACT_GPUS or train_gpus % train_tp or train_gpus % rollout_tp:
        return None
    one, layers = one_layer(model)
    train = TrainPlacement(train_gpus // train_tp, train_tp, aliasing_storage=True)
    vision_tp = vision_fits_tp(model, rollout_tp)
    candidates = [contiguous_ranks(train_gpus, rollout_tp), strided_ranks(train_gpus, rollout_tp)]
    best: tuple[int, SharedWeights] | None = None
    try:
        aligned = aligned_ranks(one, train, rollout_tp)
        for replicas in dict.fromkeys([*candidates, *([aligned] if aligned else [])]):
            rollout = RolloutPlacement(rollout_tp, replicas, vision_tp)
            sharing = WeightSharing(one, train, rollout, model.dtype, model.dtype)
            shared, tally = _tally(sharing, layers)
            if best is None or shared > best[0]:  # ties: the first, as build_sharing
                best = (shared, tally)
    except LayoutError:
        return None
    return best[1] if best else None


def one_layer(model: ModelSpec) -> tuple[ModelSpec, dict[str, int]]:
    """`model` with one decoder layer and one vision block, and how many times each
    layer class (`.layers.` / `.blocks.` in a tensor's name) stands in the real model."""
    vision = model.vision.model_copy(update={"depth": 1, "fullatt_block_indexes": ()})
    one = model.model_copy(update={"num_layers": 1, "vision": vision})
    return one, {"layers": model.num_layers, "blocks": model.vision.depth}


def layer_count(layers: dict[str, int], tensor: str) -> int:
    return next((k for key, k in layers.items() if f".{key}." in tensor), 1)


def _tally(sharing: WeightSharing, layers: dict[str, int]) -> tuple[int, SharedWeights]:
    """(shared bytes over all GPUs, per-tower bytes per GPU) of `sharing`, each layer
    class counted `layers[...]` times."""
    per_gpu: dict[str, list[GpuShare]] = {t: [] for t in TOWERS}
    shared = 0
    for g in range(sharing.world):
        sums = {t: [0, 0, 0, 0] for t in TOWERS}
        for sh, _ in sharing.class_shares(g):
            n = layer_count(layers, sh.tensor)
            acc = sums[sharing.tensors[sh.tensor].tower]
            acc[0] += sh.nbytes * n
            acc[1] += sh.rebuild_bytes * n
            acc[2] += sh.remote_bytes * n
            acc[3] += (sh.local_bytes - sh.shared_bytes) * n
            shared += sh.shared_bytes * n
        for t in TOWERS:
            per_gpu[t].append(GpuShare(*sums[t]))
    return shared, SharedWeights(sharing.layouts, {t: tuple(v) for t, v in per_gpu.items()})


def towers_of(model: ModelSpec, v: Value) -> tuple[str, ...] | None:
    """Which towers a weights value holds, from its parameter count (the graph builder
    keeps a frozen vision tower in a value of its own); None if it matches none."""
    if len(v.shape) != 1 or v.dtype != model.dtype:
        return None
    llm, vision = model.llm_param_count(), model.vision.param_count()
    return {llm: ("llm",), vision: ("vision",), llm + vision: TOWERS}.get(v.shape[0])


_OWN: WeakKeyDictionary[Graph, tuple[dict, bool]] = WeakKeyDictionary()


def holds_own_copy(graph: Graph) -> bool:
    """The rollout is an engine with its own weights: a fused `generate` rollout (unless
    it reads the trainer's storage, `meta["own_weights"]` False), or a weight sync that
    loads into the engine instead of aliasing. Kept per graph while its
    producer index stands (every memory attempt of a search asks again)."""
    made = graph.producers()
    hit = _OWN.get(graph)
    if hit is not None and hit[0] is made:
        return hit[1]
    own = any(
        (op.kind == "generate" and op.meta.get("own_weights", True))
        or (op.kind == "weight_sync" and op.attrs.get("mode") == "load")
        for op in graph.ops.values()
    )
    _OWN[graph] = (made, own)
    return own


def rollout_copy_bytes(
    model: ModelSpec, v: Value, train_gpus: int, train_tp: int, rollout_tp: int, aliased: bool
) -> int:
    """Bytes per GPU of the rollout's copy of weights `v`: the algebra's rebuild bytes when
    `aliased`, else (or when the algebra does not answer) the whole TP shard."""
    full = math.ceil(v.nbytes / max(1, rollout_tp))
    if not aliased:
        return full
    towers = towers_of(model, v)
    shared = shared_weights(model, train_gpus, train_tp, rollout_tp) if towers else None
    return full if shared is None or towers is None else shared.rebuild_bytes(towers)


def alias_sync_bytes(
    model: ModelSpec, v: Value, train_gpus: int, train_tp: int, rollout_tp: int
) -> list[tuple[int, int]] | None:
    """Per training GPU, (bytes from other GPUs, bytes copied from local storage) that an
    aliasing `weight_sync` of weights `v` moves into the rebuild buffer; None when the
    algebra does not answer."""
    towers = towers_of(model, v)
    shared = shared_weights(model, train_gpus, train_tp, rollout_tp) if towers else None
    return None if shared is None or towers is None else shared.sync_bytes(towers)


def rolls_out(dev: DevicePlan) -> bool:
    """The group runs rollout steps (a training pool's hand-over transfer does not count)."""
    return any(s.phase == Phase.ROLLOUT.value and s.kind != "transfer" for s in dev.steps)


def sharing_note(
    graph: Graph, model: ModelSpec, train_tp: int, devices: list[DevicePlan]
) -> str | None:
    """The plan's note on the rollout copy of a colocated aliasing rollout, in words (from
    the settled plan's rollout-copy slots)."""
    if holds_own_copy(graph):
        return None
    for dev in devices:
        if dev.name == "rollout" or not rolls_out(dev):
            continue  # a pool holds its own copy; a training pool none
        read = {s.value.split("@rollout")[0] for s in dev.slots if s.value_kind == COPY_KIND}
        towers = tuple(
            dict.fromkeys(t for v in sorted(read) for t in towers_of(model, graph.values[v]) or ())
        )
        if not towers:
            continue
        n = len(dev.ranks)
        shared = shared_weights(model, n, train_tp, dev.tp)
        if shared is None:
            continue
        return (
            f"rollout weights aliased in training storage (FSDP {n // train_tp} x TP "
            f"{train_tp} vs rollout TP {dev.tp}, {shared.layouts.rsplit(' ', 1)[-1]}): "
            f"{shared.rebuild_bytes(towers) / 2**30:.2f} GiB per GPU rebuilt, against "
            f"{shared.full_bytes(towers) / 2**30:.2f} GiB for a separate copy in that layout"
        )
    return None
