"""Per-op costs of the rollout side on one GPU: vision, prefix prefill, decode and the
engines' whole rollouts (`generate`), and the KV pools and workspaces the engines hold.
The scoring and training ops' costs, and the kind -> cost table, are ops/costs.py's."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from rollplex.graph.ir import Graph, Op, Value
from rollplex.ops import formulas as F
from rollplex.ops.cost_context import CostContext
from rollplex.ops.formulas import Cost
from rollplex.specs import ModelSpec, WorkloadSpec


def decode_steps(graph: Graph, op: Op, ctx: CostContext) -> int:
    """Decode steps a rank runs: until the step's longest response ends, over every sample
    of the op on all ranks (a synchronous step waits for it); `generate` too."""
    return _rank_decode(graph, op, ctx).steps


def _rank_decode(graph: Graph, op: Op, ctx: CostContext) -> F.DecodeRollout:
    """One rank's share of a decode (or generate) op's rows, decoding as long as the op's
    longest sample (all of its rows, every rank) runs."""
    rows = _prompt_rows(graph, op)
    group = op.attrs["group_size"]
    return _decode(ctx.model, ctx.workload, int(ctx.per_rank(rows)), group, ctx.tp, rows * group)


@lru_cache(maxsize=64)
def _decode(
    model: ModelSpec, workload: WorkloadSpec, prompts: int, group: int, tp: int, samples: int
):
    return F.decode_rollout(model, workload, prompts, group, tp, step_samples=samples)


def prefix_tokens(ins: dict[str, Value]) -> int:
    return ins["features"].shape[1] + ins["text"].shape[1]


def vision_grid(pixels: Value) -> dict:
    """The vision formulas' layout arguments from a (rows, t, h, w, patch_dim) pixels value."""
    _, t, h, w, _ = pixels.shape
    return {"temporal_patches": t, "grid_hw": (h, w)}


def patches(pixels: Value) -> int:
    _, t, h, w, _ = pixels.shape
    return t * h * w


def vision_cost(g: Graph, op: Op, ctx: CostContext) -> Cost:
    px = g.values[op.inputs["pixels"]]
    rows = ctx.per_rank(px.shape[0])
    return F.vision_encode(ctx.model, rows, patches(px), ctx.tp, **vision_grid(px))


def prefill_cost(g: Graph, op: Op, ctx: CostContext) -> Cost:
    ins = g.inputs_of(op)
    rows = ctx.per_rank(ins["features"].shape[0])
    cost = F.prefix_prefill(ctx.model, rows, prefix_tokens(ins), ctx.tp)
    if "exported" not in op.outputs:
        return cost
    # prefill_once: it also keeps each layer's input and K/V for the training backward
    kept = g.values[op.outputs["exported"]].nbytes / ctx.dp
    return cost + Cost(bytes_written=kept, persistent_bytes=kept)


def _prompt_rows(g: Graph, op: Op) -> int:
    if op.kind == "generate":
        return g.values[op.inputs["text"]].shape[0]
    return g.values[op.inputs["kv"]].shape[2]


def generate_cost(g: Graph, op: Op, ctx: CostContext) -> Cost:
    """vision + prefill of each prompt once (the engine's prefix cache serves the G
    samples), then the decode."""
    ins = g.inputs_of(op)
    px, text = ins["pixels"], ins["text"]
    rows = ctx.per_rank(px.shape[0])
    visual = ctx.workload.visual_tokens(ctx.model.vision)
    cost = F.vision_encode(ctx.model, rows, px.shape[1], ctx.tp)
    cost += F.prefix_prefill(ctx.model, rows, visual + text.shape[1], ctx.tp)
    group = op.attrs["group_size"]
    dec = _rank_decode(g, op, ctx)
    # The engine allocates its KV pool whole (in place of `decode_rollout`'s expected-peak
    # response KV); the largest step's activations come on top of it.
    first = F.decode_step(ctx.model, rows * group, visual + text.shape[1], ctx.tp)
    work = max(cost.transient_bytes, first.transient_bytes)
    return replace(cost + dec.cost, transient_bytes=engine_kv_pool(g, op, ctx) + work)


def engine_kv_pool(g: Graph, op: Op, ctx: CostContext, at_cap: bool = False) -> float:
    """The KV pool a `generate` op's engine holds on one GPU (`F.engine_kv_pool`): the
    expected need, or with `at_cap` the size at which nothing is ever preempted."""
    rows = int(ctx.per_rank(g.values[op.inputs["text"]].shape[0]))
    return F.engine_kv_pool(
        ctx.model, ctx.workload, rows, op.attrs["group_size"], ctx.tp, at_cap=at_cap
    )


def decode_cost(g: Graph, op: Op, ctx: CostContext) -> Cost:
    ins = g.inputs_of(op)
    rows = int(ctx.per_rank(ins["kv"].shape[2]))
    cost = _rank_decode(g, op, ctx).cost
    if "kept" in op.outputs:
        # decode once: each step also writes each layer's output of its rows (a column of
        # the kept buffer, at the cap). The torch engine's buffer is its workspace's, kept
        # across steps: planner/lifetimes.py holds it all step.
        kept = g.values[op.outputs["kept"]].nbytes / ctx.dp
        cost += Cost(bytes_written=kept, persistent_bytes=kept)
    if not op.meta.get("static_kv"):
        return cost
    # The torch engine's static workspace (at the cap, in place of the expected peak of
    # live response K/V), plus the largest step's activations on top of it.
    first = F.decode_step(ctx.model, rows * op.attrs["group_size"], ins["kv"].shape[3], ctx.tp)
    return replace(cost, transient_bytes=static_kv(g, op, ctx) + first.transient_bytes)


def static_kv(g: Graph, op: Op, ctx: CostContext) -> float:
    """The workspace a `decode` op with `meta["static_kv"]` (the torch engine) holds: its
    static buffers and its stacked q/k/v weights. Priced in the SDPA layout: the split
    layout the engine picks for few prompts on CUDA (engine_attention) holds the same K/V
    without the mask, so this bounds it by a few MB."""
    kv = g.values[op.inputs["kv"]]
    rows = int(ctx.per_rank(kv.shape[2]))
    cap = g.values[op.outputs["responses"]].shape[1]
    buffers = F.torch_engine_workspace(
        ctx.model, rows, op.attrs["group_size"], kv.shape[3], cap, ctx.tp
    )
    return buffers + F.torch_engine_fused_qkv(ctx.model)
