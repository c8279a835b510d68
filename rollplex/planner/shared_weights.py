"""Shared weights: what a colocated rollout's weight copy costs beyond training storage.

An aliasing rollout pays only the bytes of its TP shard that the GPU's FSDP shard does not
hold; an engine with its own copy pays the whole shard. The rollout layout is explicit on
the weight_sync (`attrs["layout"]`: algebra, replica or torch_tp), never guessed from sizes.
Details and the cache: docs/architecture.md (Weights).
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
from rollplex.weights.torch_rollout import rollout_sharing, torch_rollout_bytes

MAX_EXACT_GPUS = 64
COPY_KIND = "rollout_weights"  # the lifetimes' kind of a rollout copy's records
TOWERS = ("llm", "vision")
MASTER_ITEMSIZE = 4  # the FSDP2 trainer's float32 master shards, cast for the torch rollout
# The FSDP2 trainer's rollouts allocate their storage once (share.py's rebuild buffer and
# compute-dtype shard copy; the gathered full model): held all step, not dropped after
# the rollout as the algebra's rebuild buffer is.
HELD_LAYOUTS = ("torch_tp", "replica")


@dataclass(slots=True, frozen=True)
class GpuShare:
    """One tower's rollout shard on one GPU, in bytes."""

    full: int  # the shard: what a separate copy in this layout costs
    # beyond training storage: the rebuild buffer (the torch rollout's own compute-dtype
    # shard copy too)
    rebuild: int
    remote: int  # what each sync brings from other GPUs
    # what each sync moves within the GPU, counted so that twice it is the HBM traffic
    # (read + write): local bytes copied into rebuilt tensors, the masters' cast
    local_copy: int


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
    not computed (above `MAX_EXACT_GPUS` training GPUs: the whole TP shard is charged then,
    within a few percent of the algebra). As `rollplex weights` with its defaults
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


@functools.lru_cache(maxsize=128)
def torch_shared_weights(
    model: ModelSpec, train_gpus: int, train_tp: int, rollout_tp: int
) -> SharedWeights | None:
    """The FSDP2 shared torch rollout's per-GPU bytes (`rollout_sharing`: FSDP2 over
    `train_gpus` ranks, torch's TP plan of degree `rollout_tp`, in `model.dtype`, cast from
    float32 masters unless that is float32), each tower's `torch_rollout_bytes` evaluated
    on one decoder layer and one vision block, counted per class as `shared_weights`
    does. None when not computed: training TP, too many GPUs, or a TP degree torch's plan
    cannot split evenly (`LayoutError`)."""
    if train_tp != 1 or train_gpus > MAX_EXACT_GPUS or train_gpus % rollout_tp:
        return None
    one, layers = one_layer(model)
    try:
        sharing = rollout_sharing(one, train_gpus, rollout_tp, model.dtype)
    except LayoutError:
        return None
    cast, item = model.dtype != "float32", sharing.itemsize
    count = functools.partial(layer_count, layers)
    per_gpu: dict[str, list[GpuShare]] = {t: [] for t in TOWERS}
    for g in range(train_gpus):
        for t in TOWERS:
            b = torch_rollout_bytes(sharing, g, cast, count, (t,))
            shards = b["compute_copy_bytes"] + b["placed_bytes"]  # its compute copy (cast)
            recast = shards // item * (MASTER_ITEMSIZE + item) // 2  # read fp32, write it
            per_gpu[t].append(
                GpuShare(
                    full=b["shared_bytes"] + b["rebuild_bytes"],
                    rebuild=b["extra_bytes"],
                    remote=b["received_bytes"],
                    local_copy=b["local_copy_bytes"] + recast,
                )
            )
    return SharedWeights(sharing.layouts, {t: tuple(v) for t, v in per_gpu.items()})


def layout_weights(
    layout: str, model: ModelSpec, train_gpus: int, train_tp: int, rollout_tp: int
) -> SharedWeights | None:
    """`shared_weights` or `torch_shared_weights`, as the weight_sync's layout says."""
    if layout == "torch_tp":
        return torch_shared_weights(model, train_gpus, train_tp, rollout_tp)
    return shared_weights(model, train_gpus, train_tp, rollout_tp)


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


_LAYOUT: WeakKeyDictionary[Graph, tuple[dict, str]] = WeakKeyDictionary()


def weights_layout(graph: Graph) -> str:
    """How the graph's rollout holds its weights: "engine" (a fused `generate` rollout
    unless it reads the trainer's storage, `meta["own_weights"]` False, or a weight sync
    that loads into a copy of its own), "replica" (the FSDP2 trainer's
    gathered full model), else the aliasing layout its weight_sync names ("torch_tp", or
    the default "algebra"). Kept per graph while its producer index stands (every memory
    attempt of a search asks again)."""
    made = graph.producers()
    hit = _LAYOUT.get(graph)
    if hit is not None and hit[0] is made:
        return hit[1]
    layout = "algebra"
    for op in graph.ops.values():
        if op.kind == "generate" and op.meta.get("own_weights", True):
            layout = "engine"
            break
        if op.kind == "weight_sync":
            named = op.attrs.get("layout", "algebra")
            layout = named if op.attrs.get("mode") != "load" or named == "replica" else "engine"
            if layout != "algebra":
                break
    _LAYOUT[graph] = (made, layout)
    return layout


def holds_own_copy(graph: Graph) -> bool:
    """The rollout holds a copy of its own: an engine, or the gathered replica."""
    return weights_layout(graph) in ("engine", "replica")


def rollout_copy_bytes(
    model: ModelSpec,
    v: Value,
    train_gpus: int,
    train_tp: int,
    rollout_tp: int,
    aliased: bool,
    layout: str = "algebra",
) -> int:
    """Bytes per GPU of the rollout's copy of weights `v`: what the aliasing `layout` adds
    beyond training storage when `aliased`, else (or when that is not computed) the whole
    TP shard; the whole of `v` for a "replica" (a full model on every rank, whatever TP
    the plan decodes at)."""
    if layout == "replica":
        return v.nbytes
    full = math.ceil(v.nbytes / max(1, rollout_tp))
    if not aliased:
        return full
    towers = towers_of(model, v)
    shared = layout_weights(layout, model, train_gpus, train_tp, rollout_tp) if towers else None
    return full if shared is None or towers is None else shared.rebuild_bytes(towers)


def alias_sync_bytes(
    model: ModelSpec,
    v: Value,
    train_gpus: int,
    train_tp: int,
    rollout_tp: int,
    layout: str = "algebra",
) -> list[tuple[int, int]] | None:
    """Per training GPU, (bytes from other GPUs, bytes moved within the GPU) of one
    aliasing `weight_sync` of weights `v` in `layout`; None when that is not computed.
    The FSDP2 shared rollout refills every rebuilt tensor and recasts every shard at each
    sync, a frozen tower's too: "torch_tp" moves both towers whichever `v` holds."""
    towers = towers_of(model, v)
    if towers and layout == "torch_tp":
        towers = TOWERS
    shared = layout_weights(layout, model, train_gpus, train_tp, rollout_tp) if towers else None
    return None if shared is None or towers is None else shared.sync_bytes(towers)


def replica_sync_bytes(model: ModelSpec, train_gpus: int) -> list[tuple[int, int]]:
    """Per training GPU, (bytes from other GPUs, bytes moved within the GPU) of the FSDP2
    gathered replica's weight_sync (`rollout_sync=gather`): every float32 master of both
    towers is all-gathered (all but the local 1/N crosses the links) and cast into the
    full model (read float32, write the model's dtype)."""
    n = model.param_count()
    remote = n * MASTER_ITEMSIZE * (train_gpus - 1) // train_gpus
    return [(remote, n * (MASTER_ITEMSIZE + model.dtype_bytes) // 2)] * train_gpus


def rolls_out(dev: DevicePlan) -> bool:
    """The group runs rollout steps (a training pool's hand-over transfer does not count)."""
    return any(s.phase == Phase.ROLLOUT.value and s.kind != "transfer" for s in dev.steps)


def sharing_note(
    graph: Graph, model: ModelSpec, train_tp: int, devices: list[DevicePlan]
) -> str | None:
    """The plan's note on the rollout copy of a colocated aliasing rollout, in words (from
    the settled plan's rollout-copy slots)."""
    layout = weights_layout(graph)
    if layout in ("engine", "replica"):
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
        shared = layout_weights(layout, model, n, train_tp, dev.tp)
        if shared is None:
            continue
        added = shared.rebuild_bytes(towers) / 2**30
        if layout == "torch_tp":
            replica = sum(graph.values[v].nbytes for v in read) / 2**30
            return (
                f"rollout weights read from the FSDP2 shards (torch TP plan, FSDP {n} vs "
                f"rollout TP {dev.tp}, {model.dtype}): {added:.2f} GiB per GPU added (rebuilt "
                f"tensors and the rollout's own shard copy), against {replica:.2f} GiB for a "
                "full replica (rollout_sync=gather)"
            )
        return (
            f"rollout weights aliased in training storage (FSDP {n // train_tp} x TP "
            f"{train_tp} vs rollout TP {dev.tp}, {shared.layouts.rsplit(' ', 1)[-1]}): "
            f"{added:.2f} GiB per GPU rebuilt, against "
            f"{shared.full_bytes(towers) / 2**30:.2f} GiB for a separate copy in that layout"
        )
    return None
