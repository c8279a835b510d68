"""WeightsSpec -> WeightSharing: picks the vision mode and the rollout rank map."""

from __future__ import annotations

from rollplex.specs.model import ModelSpec
from rollplex.specs.weights import WeightsSpec
from rollplex.weights.layouts import LayoutError, RolloutPlacement, TrainPlacement, train_blocks
from rollplex.weights.layouts import storage_order as _order
from rollplex.weights.params import Split, param_table
from rollplex.weights.sharing import WeightSharing, contiguous_ranks, strided_ranks

Replicas = tuple[tuple[int, ...], ...]


def vision_fits_tp(spec: ModelSpec, tp: int) -> bool:
    """vLLM's TP vision tower needs tp to divide its heads, widths and merger width."""
    v = spec.vision
    dims = (v.num_heads, v.hidden_size, v.intermediate_size, v.hidden_size * v.merge_factor)
    return all(d % tp == 0 for d in dims)


def aligned_ranks(spec: ModelSpec, train: TrainPlacement, tp: int) -> Replicas | None:
    """Each GPU becomes the rollout rank whose rows of a column-parallel weight (layer 0's
    gate_proj) its training shard holds; None if the ranks don't come out even."""
    name = "model.language_model.layers.0.mlp.gate_proj.weight"
    param = next(p for p in param_table(spec) if p.name == name)
    rollout = RolloutPlacement(tp, contiguous_ranks(train.world, tp))
    order = _order(param, Split.COLUMN, rollout, train)
    per = param.rows // tp
    want: dict[int, list[int]] = {r: [] for r in range(tp)}
    spare = []
    for g in range(train.world):
        blocks, _ = train_blocks(param, g, train, order, name)
        if not blocks or blocks[0].r0 // per != (blocks[-1].r1 - 1) // per:
            spare.append(g)  # holds nothing, or straddles two ranks
        else:
            want[blocks[0].r0 // per].append(g)
    reps = train.world // tp
    for r in range(tp):
        while len(want[r]) < reps and spare:
            want[r].append(spare.pop(0))
    if any(len(gpus) != reps for gpus in want.values()):
        return None
    return tuple(tuple(want[r][k] for r in range(tp)) for k in range(reps))


def build_sharing(spec: ModelSpec, ws: WeightsSpec) -> WeightSharing:
    """The algebra for `ws`; raises LayoutError (a ValueError) naming the parameter and
    the layouts when a placement cannot be served."""
    train = TrainPlacement(ws.train_fsdp, ws.train_tp, aliasing_storage=ws.storage == "aliasing")
    t, world = ws.rollout_tp, ws.world
    vision_tp = vision_fits_tp(spec, t) if ws.vision == "auto" else ws.vision == "tp"
    if isinstance(ws.rank_map, list):
        candidates = {"explicit": tuple(tuple(r) for r in ws.rank_map)}
    else:
        candidates = {
            "contiguous": contiguous_ranks(world, t),
            "strided": strided_ranks(world, t),
        }
        aligned = aligned_ranks(spec, train, t) if ws.rank_map in ("auto", "aligned") else None
        if aligned is not None:
            candidates["aligned"] = aligned
        elif ws.rank_map == "aligned":
            raise LayoutError(
                f"rank_map=aligned: the training shards of train fsdp={ws.train_fsdp} "
                f"tp={ws.train_tp} do not split evenly over rollout tp={t} ranks"
            )
        if ws.rank_map != "auto":
            candidates = {ws.rank_map: candidates[ws.rank_map]}
    best: tuple[int, WeightSharing] | None = None
    for label, replicas in candidates.items():
        rollout = RolloutPlacement(t, replicas, vision_tp)
        sharing = WeightSharing(spec, train, rollout, ws.dtype, ws.train_dtype)
        sharing.rank_map = label
        shared = sum(s.shared_bytes * n for g in range(world) for s, n in sharing.class_shares(g))
        if best is None or shared > best[0]:
            best = (shared, sharing)
    assert best is not None
    return best[1]
