"""Transfers between device groups (disaggregated pools): who sends what to whom.

`weight_bytes`/`weight_routes`: from the layout algebra, the bytes of each rollout rank's TP
shard that each training GPU holds, as rank-to-rank `Route`s. Rollout outputs move by row
ranges. A transfer takes as long as its busiest GPU; above `MAX_EXACT_GPUS` it is unrouted.
"""

from __future__ import annotations

import functools

from rollplex.graph.ir import Graph, Phase
from rollplex.planner.plan import Route
from rollplex.planner.shared_weights import MAX_EXACT_GPUS, layer_count, one_layer
from rollplex.specs import ModelSpec
from rollplex.weights.build import vision_fits_tp
from rollplex.weights.layouts import (
    Block,
    LayoutError,
    RolloutPlacement,
    TrainPlacement,
    rollout_blocks,
    storage_order,
    train_blocks,
)
from rollplex.weights.params import Split, param_table, rollout_tensors
from rollplex.weights.sharing import DTYPE_BYTES, contiguous_ranks

Matrix = tuple[tuple[int, ...], ...]  # [training GPU][rollout TP rank] -> bytes


@functools.lru_cache(maxsize=256)
def weight_bytes(
    model: ModelSpec, towers: tuple[str, ...], train_gpus: int, train_tp: int, rollout_tp: int
) -> tuple[Matrix, ...] | None:
    """Per training TP rank j0 (the pattern of replicas k with k mod train_tp == j0),
    the bytes of rollout rank r's shard of `towers` that training GPU g sends; None if
    not computed."""
    if train_gpus > MAX_EXACT_GPUS or train_gpus % train_tp or model.dtype not in DTYPE_BYTES:
        return None
    one, layers = one_layer(model)
    train = TrainPlacement(train_gpus // train_tp, train_tp, aliasing_storage=False)
    vision_tp = vision_fits_tp(model, rollout_tp)
    rollout = RolloutPlacement(rollout_tp, contiguous_ranks(rollout_tp, rollout_tp), vision_tp)
    params = {p.name: p for p in param_table(one)}
    size = DTYPE_BYTES[model.dtype]
    out = [[[0] * rollout_tp for _ in range(train_gpus)] for _ in range(train_tp)]
    try:
        for t in rollout_tensors(one, vision_tp):
            if t.tower not in towers:
                continue
            n = layer_count(layers, t.name) * size
            where = f"{t.name} [train fsdp={train.fsdp} tp={train_tp}; rollout tp={rollout_tp}]"
            shards = [rollout_blocks(t, r, rollout.tp_for(t), where) for r in range(rollout_tp)]
            for name in t.params:
                p = params[name]
                order = storage_order(p, t.split, rollout, train)
                split = train_tp > 1 and p.tower == "llm" and p.train_split is not Split.REPLICATED
                mine = [_rects(x, name) for x in shards]
                for g in range(train_gpus):
                    chunk = _rects(train_blocks(p, g, train, order, where)[0], name)
                    for r, x in enumerate(mine):
                        e = _overlap(x, chunk) * n
                        if not e:
                            continue
                        for j0 in range(train_tp):
                            if split or g % train_tp == j0:
                                out[j0][g][r] += e
    except LayoutError:
        return None
    return tuple(tuple(tuple(row) for row in m) for m in out)


Rect = tuple[int, int, int, int]  # rows [r0, r1) x cols [c0, c1) of one parameter


def _rects(blocks: tuple[Block, ...], param: str) -> list[Rect]:
    return [(b.r0, b.r1, b.c0, b.c1) for b in blocks if b.param == param]


def _overlap(x: list[Rect], chunk: list[Rect]) -> int:
    """Elements two sets of one parameter's rectangles share (`algebra.overlap`, without
    its per-block parameter checks: this loop runs GPUs x ranks x parameters times)."""
    total = 0
    for r0, r1, c0, c1 in x:
        for a0, a1, d0, d1 in chunk:
            rows = min(r1, a1) - max(r0, a0)
            if rows > 0:
                cols = min(c1, d1) - max(c0, d0)
                if cols > 0:
                    total += rows * cols
    return total


def weight_routes(
    mats: tuple[Matrix, ...], train_ranks: list[int], rollout_ranks: list[int], rollout_tp: int
) -> list[Route]:
    """Every (training GPU -> rollout GPU) route; replica k is rollout_ranks[k t_r:(k+1) t_r]."""
    routes = []
    for k in range(len(rollout_ranks) // rollout_tp):
        m = mats[k % len(mats)]
        for g, src in enumerate(train_ranks):
            for r in range(rollout_tp):
                if m[g][r]:
                    routes.append(Route(src, rollout_ranks[k * rollout_tp + r], m[g][r]))
    return routes


def output_routes(
    nbytes: int, rollout_ranks: list[int], rollout_tp: int, train_ranks: list[int]
) -> list[Route]:
    """The rollout's outputs (`nbytes` in all, split by rows) to the trainers."""
    d, t = max(1, len(rollout_ranks) // rollout_tp), len(train_ranks)
    routes = []
    for k in range(d):
        for g, dst in enumerate(train_ranks):
            # rows [k t, (k+1) t) and [g d, (g+1) d) in units of 1 / (d t) of the batch
            ov = min((k + 1) * t, (g + 1) * d) - max(k * t, g * d)
            if ov > 0:
                src = rollout_ranks[k * rollout_tp + g % rollout_tp]
                routes.append(Route(src, dst, nbytes * ov // (d * t)))
    return routes


def busiest_bytes(routes: list[Route]) -> int:
    """The most bytes one GPU sends or receives."""
    load: dict[tuple[str, int], int] = {}
    for r in routes:
        load[("send", r.src)] = load.get(("send", r.src), 0) + r.nbytes
        load[("recv", r.dst)] = load.get(("recv", r.dst), 0) + r.nbytes
    return max(load.values(), default=0)


def handover_values(graph: Graph) -> list[str]:
    """Values rollout ops make that later phases read: what a disaggregated hand-over moves
    from the rollout pool to the trainers (sized, held and sent alike)."""
    made = {v for op in graph if op.phase is Phase.ROLLOUT for v in op.outputs.values()}
    used = {v for op in graph if op.phase is not Phase.ROLLOUT for v in op.inputs.values()}
    return sorted(made & used)
