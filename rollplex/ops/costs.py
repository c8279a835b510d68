"""Per-op costs on one GPU: the registry's op kinds bound to the pure formulas.

Sizes come from the graph (row counts, prefix lengths from value shapes), so a pass that
shares a prefix across a group or merges phases changes the cost automatically. Dynamic
response lengths come from the workload's distribution: the expected width each scoring
path pads its rows to (response_width.py). Rows split over `dp` data-parallel ranks;
weights over `tp`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from rollplex.graph.ir import DTYPE_BYTES, Graph, Op, Value
from rollplex.graph.schema import get_kind
from rollplex.ops import formulas as F
from rollplex.ops import response_width as W
from rollplex.ops.formulas import Cost
from rollplex.ops.formulas.llm import lm_head_forward
from rollplex.ops.micro_batches import behind_saved, trained_units
from rollplex.specs import ModelSpec, WorkloadSpec


@dataclass(slots=True, frozen=True)
class CostContext:
    """Everything a formula needs besides the op: specs and the parallel layout."""

    model: ModelSpec
    workload: WorkloadSpec
    tp: int = 1
    dp: int = 1  # data-parallel ranks sharing the rows of a batch
    shards: int = 1  # FSDP shards of trainable state
    checkpointing: bool = True
    # the training forward over responses runs without grad and again in the backward
    # (schedule.train_micro_recompute): it keeps nothing, the backward pays a forward
    recompute_forward: bool = False
    # the training forward over responses runs inside the backward, per micro-batch, with
    # its backward (schedule.train_micro_fused, verl's): the forward step does nothing,
    # the backward pays the forward once
    fused_forward: bool = False
    # the trainer's micro-batches of a step (`planner.sizing.train_micro_batches`): its
    # forwards with grad and their backward run in these, each padded to its own longest
    # response, so rows run together (and the width they pay for) follow from it
    micro_batches: int = 1

    def per_rank(self, rows: int) -> float:
        return math.ceil(rows / self.dp)


def op_cost(graph: Graph, op: Op, ctx: CostContext) -> Cost:
    """The cost of `op` on one GPU under `ctx`."""
    return _COSTS[op.kind](graph, op, ctx)


def cost_key(graph: Graph, op: Op) -> tuple:
    """Everything the cost functions here read of `op` and its graph, as a hashable key: ops
    with equal keys cost the same under every context, so the planner prices the K copies of
    one step once. A cost function that starts reading more of the graph must add it here."""
    # Attributes by repr: equal reprs are equal attributes (a different order only misses).
    key = (op.kind, op.phase, repr(op.attrs), tuple(op.outputs), _ports(graph, op))
    if op.kind != "backward":
        return key
    # `_backward` also reads each forward behind a saved input (once, in port order) and the
    # vision encoder feeding it when that trains the same weights.
    weights, forwards = op.inputs["weights"], {}
    for port, v in op.inputs.items():
        fwd = behind_saved(graph, v) if port.startswith("saved") else None
        if fwd is None or fwd.name in forwards:
            continue
        vision = graph.producer(fwd.inputs["features"]) if "features" in fwd.inputs else None
        trained = (
            vision is not None
            and vision.kind == "vision_encode"
            and vision.inputs["weights"] == weights
        )
        pixels = graph.values[vision.inputs["pixels"]].shape if trained and vision else None
        forwards[fwd.name] = (fwd.kind, _ports(graph, fwd), pixels)
    return (*key, tuple(forwards.values()))


def _ports(graph: Graph, op: Op) -> tuple:
    values = graph.values
    return tuple([(p, (v := values[n]).shape, v.dtype, v.kind) for p, n in op.inputs.items()])


def prefix_flops(graph: Graph, op: Op, ctx: CostContext) -> float:
    """FLOPs of response-independent work in `op`: prefix ops whole, and the part of a
    backward that differentiates prefix forwards (vision and logprob_prefix)."""
    if get_kind(op.kind).prefix:
        return op_cost(graph, op, ctx).flops
    if op.kind == "backward":
        return _backward(graph, op, ctx, prefix_only=True).flops
    return 0.0


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


def _prefix_tokens(ins: dict[str, Value]) -> int:
    return ins["features"].shape[1] + ins["text"].shape[1]


def _trained_tokens(ctx: CostContext, fwd: Op, ins: dict[str, Value]) -> int:
    """Columns per row of a forward with grad (`fwd`'s inputs `ins`), run in the trainer's
    micro-batches: of whole prompts' groups (response part) or of samples (full)."""
    units, per_unit = trained_units(ins, ctx.dp)
    return W.trimmed_width(ctx.workload.response_length, units, ctx.micro_batches, per_unit)


def _scored_tokens(ctx: CostContext, op: Op, ins: dict[str, Value], part: str) -> int:
    """Columns per row of a logprob forward (`part`: response or full): trimmed per
    micro-batch with grad; without, its rows' longest (response_width.py)."""
    if "saved" in op.outputs:
        return _trained_tokens(ctx, op, ins)
    lengths = ctx.workload.response_length
    return W.longest_width(lengths, ctx.per_rank(ins["responses"].shape[0]))


def _grid(pixels: Value) -> dict:
    """The vision formulas' layout arguments from a (rows, t, h, w, patch_dim) pixels value."""
    _, t, h, w, _ = pixels.shape
    return {"temporal_patches": t, "grid_hw": (h, w)}


def _patches(pixels: Value) -> int:
    _, t, h, w, _ = pixels.shape
    return t * h * w


def _vision(g: Graph, op: Op, ctx: CostContext) -> Cost:
    px = g.values[op.inputs["pixels"]]
    rows = ctx.per_rank(px.shape[0])
    return F.vision_encode(ctx.model, rows, _patches(px), ctx.tp, **_grid(px))


def _prefill(g: Graph, op: Op, ctx: CostContext) -> Cost:
    ins = g.inputs_of(op)
    rows = ctx.per_rank(ins["features"].shape[0])
    cost = F.prefix_prefill(ctx.model, rows, _prefix_tokens(ins), ctx.tp)
    if "exported" not in op.outputs:
        return cost
    # prefill_once: it also keeps each layer's input and K/V for the training backward
    kept = g.values[op.outputs["exported"]].nbytes / ctx.dp
    return cost + Cost(bytes_written=kept, persistent_bytes=kept)


def _attach(g: Graph, op: Op, ctx: CostContext) -> Cost:
    """attach_prefix: no forward; the exported K/V copied into the trainer's cache and the
    LM head over each row's last prefix position."""
    rows = ctx.per_rank(g.values[op.inputs["text"]].shape[0])
    kv = g.values[op.outputs["kv"]].nbytes / ctx.dp
    copy = Cost(bytes_read=kv, bytes_written=kv, persistent_bytes=kv)
    return copy + lm_head_forward(ctx.model, rows, 1, ctx.tp)


def _attach_response(g: Graph, op: Op, ctx: CostContext) -> Cost:
    """attach_response (decode once): no layer forward; the LM head and logprobs over the
    trained columns of each row, from the decode's kept final-norm inputs."""
    ins = g.inputs_of(op)
    rows = ctx.per_rank(ins["responses"].shape[0])
    return lm_head_forward(ctx.model, rows, _trained_tokens(ctx, op, ins), ctx.tp)


def _prompt_rows(g: Graph, op: Op) -> int:
    if op.kind == "generate":
        return g.values[op.inputs["text"]].shape[0]
    return g.values[op.inputs["kv"]].shape[2]


def _generate(g: Graph, op: Op, ctx: CostContext) -> Cost:
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


def _decode_cost(g: Graph, op: Op, ctx: CostContext) -> Cost:
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


def _logprob(part: str):
    def cost(g: Graph, op: Op, ctx: CostContext) -> Cost:
        ins = g.inputs_of(op)
        grad = "saved" in op.outputs
        if ctx.fused_forward and grad and part != "prefix":
            return Cost()  # it runs in the backward step (`_backward`)
        if part == "response":
            rows, prefix = ctx.per_rank(ins["responses"].shape[0]), ins["kv"].shape[3]
        else:
            rows, prefix = ctx.per_rank(ins["features"].shape[0]), _prefix_tokens(ins)
        tokens = 0 if part == "prefix" else _scored_tokens(ctx, op, ins, part)
        cost = F.logprob(
            ctx.model,
            rows,
            prefix,
            tokens,
            part,
            ctx.tp,
            grad=grad,
            checkpointing=ctx.checkpointing,
        )
        if "exported" not in op.outputs:
            return cost
        kept = g.values[op.outputs["exported"]].nbytes / ctx.dp  # prefill_once (a critic)
        return cost + Cost(bytes_written=kept, persistent_bytes=kept)

    return cost


def _expand(g: Graph, op: Op, ctx: CostContext) -> Cost:
    ins = g.inputs_of(op)
    x = ins["x"]
    out = x.nbytes * op.attrs["group_size"] / ctx.dp
    return Cost(bytes_read=x.nbytes / ctx.dp, bytes_written=out, persistent_bytes=out)


def _select(g: Graph, op: Op, ctx: CostContext) -> Cost:
    """A mini-batch's rows: a copy of hi - lo of the input's rows (a view where it can)."""
    x = g.inputs_of(op)["x"]
    out = x.nbytes * (op.attrs["hi"] - op.attrs["lo"]) / max(1, x.shape[0]) / ctx.dp
    return Cost(bytes_read=out, bytes_written=out, persistent_bytes=out)


def _reward(g: Graph, op: Op, ctx: CostContext) -> Cost:
    ins = g.inputs_of(op)
    rows = ctx.per_rank(ins["responses"].shape[0])
    lengths = ctx.workload.response_length
    if "weights" in ins:  # a learned reward model scores prefix + response
        # No runtime runs one yet: priced as a no-grad full forward, to its rows' longest.
        prefix = _prefix_tokens(ins) if "features" in ins else 0
        tokens = W.longest_width(lengths, rows)
        return F.logprob(ctx.model, rows, prefix, tokens, "full", ctx.tp)
    return F.reward(rows, W.mean_width(lengths))  # each row's own tokens


def _advantage(g: Graph, op: Op, ctx: CostContext) -> Cost:
    ins = g.inputs_of(op)
    rows = ctx.per_rank(ins["rewards"].shape[0])
    # GAE runs over the [rows, cap] values
    tokens = W.cap_width(ctx.workload.response_length) if "values" in ins else 1
    return F.advantage(rows, op.attrs.get("group_size", 1), tokens)


def _combine(g: Graph, op: Op, ctx: CostContext) -> Cost:
    ins = g.inputs_of(op)
    rows = ctx.per_rank(next(iter(ins.values())).shape[0])
    return Cost(
        flops=2 * rows * len(ins),
        bytes_read=4 * rows * len(ins),
        bytes_written=4 * rows,
        persistent_bytes=4 * rows,
    )


def _loss(g: Graph, op: Op, ctx: CostContext) -> Cost:
    ins = g.inputs_of(op)
    first = next(iter(ins.values()))
    # elementwise over [rows, cap]: each micro-batch's values are padded back to the cap
    elems = ctx.per_rank(first.shape[0]) * W.cap_width(ctx.workload.response_length)
    read = elems * 4 * len(ins)
    return Cost(flops=20 * elems, bytes_read=read, bytes_written=4, persistent_bytes=4)


def _backward(g: Graph, op: Op, ctx: CostContext, prefix_only: bool = False) -> Cost:
    """Backward of every forward whose kept activations it reads (one or two parts), plus
    the vision tower's when it trains and fed those forwards."""
    total, seen = Cost(), set()
    weights = op.inputs["weights"]
    for port, v in op.inputs.items():
        fwd = behind_saved(g, v) if port.startswith("saved") else None
        if fwd is None or fwd.name in seen:
            continue
        seen.add(fwd.name)
        ins = g.inputs_of(fwd)
        # a prefix_prefill's `exported` (prefill_once) is the prefix forward's saved inputs
        part = {"logprob": "full", "logprob_prefix": "prefix", "prefix_prefill": "prefix"}.get(
            fwd.kind, "response"
        )
        if prefix_only and part != "prefix":
            continue
        if part == "response":
            rows, prefix = ins["responses"].shape[0], ins["kv"].shape[3]
        else:
            rows, prefix = ins["features"].shape[0], _prefix_tokens(ins)
        # the micro-batches' forwards it differentiates (and runs again) were trimmed
        tokens = 0 if part == "prefix" else _trained_tokens(ctx, fwd, ins)
        back = F.backward(
            ctx.model,
            ctx.per_rank(rows),
            prefix,
            tokens,
            part,
            ctx.tp,
            checkpointing=ctx.checkpointing,
            shards=ctx.shards,
        )
        again = ctx.recompute_forward or ctx.fused_forward
        if again and part != "prefix" and fwd.kind != "attach_response":  # decode once: none
            # The forward again, with grad, before its micro-batch's backward: what it
            # keeps lives beside that backward's scratch, not in an output.
            again = F.logprob(
                ctx.model, ctx.per_rank(rows), prefix, tokens, part, ctx.tp,
                grad=True, checkpointing=ctx.checkpointing,
            )  # fmt: skip
            kept = again.persistent_bytes
            written = max(0.0, again.bytes_written - kept)  # its kept inputs: counted below
            both = back + replace(again, persistent_bytes=0.0, bytes_written=written)
            back = replace(both, transient_bytes=both.transient_bytes + kept)
        total += back
        vision = g.producer(fwd.inputs["features"]) if "features" in fwd.inputs else None
        if (
            vision is not None
            and vision.kind == "vision_encode"
            and vision.inputs["weights"] == weights
        ):
            px = g.values[vision.inputs["pixels"]]
            total += F.vision_backward(
                ctx.model,
                ctx.per_rank(px.shape[0]),
                _patches(px),
                ctx.tp,
                checkpointing=ctx.checkpointing,
                shards=ctx.shards,
                **_grid(px),
            )
    return total


def _optimizer(g: Graph, op: Op, ctx: CostContext) -> Cost:
    ins = g.inputs_of(op)
    grads = ins["grads"]
    return F.optimizer_step(
        ctx.model, ins["weights"].shape[0], ctx.shards, DTYPE_BYTES[grads.dtype]
    )


def _sync(g: Graph, op: Op, ctx: CostContext) -> Cost:
    ins = g.inputs_of(op)
    aliased = 1.0 if op.attrs.get("mode") == "alias" else 0.0
    return F.weight_sync(ins["weights"].nbytes, tp=ctx.tp, aliased_fraction=aliased)


_COSTS = {
    "vision_encode": _vision,
    "prefix_prefill": _prefill,
    "decode": _decode_cost,
    "generate": _generate,
    "logprob": _logprob("full"),
    "logprob_prefix": _logprob("prefix"),
    "logprob_response": _logprob("response"),
    "attach_prefix": _attach,
    "attach_response": _attach_response,
    "expand_group": _expand,
    "select_rows": _select,
    "reward": _reward,
    "advantage": _advantage,
    "combine_rewards": _combine,
    "policy_loss": _loss,
    "value_loss": _loss,
    "backward": _backward,
    "optimizer_step": _optimizer,
    "weight_sync": _sync,
}
