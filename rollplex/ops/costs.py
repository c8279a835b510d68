"""Per-op costs on one GPU: the registry's op kinds bound to the pure formulas (the
rollout side's in rollout_costs.py, the scoring and training ops' here).

Sizes come from the graph (row counts, prefix lengths from value shapes), so a pass that
shares a prefix across a group or merges phases changes the cost automatically. Dynamic
response lengths come from the workload's distribution: the expected width each scoring
path pads its rows to (response_width.py). Rows split over `dp` data-parallel ranks;
weights over `tp`.
"""

from __future__ import annotations

from dataclasses import replace

from rollplex.graph.ir import DTYPE_BYTES, Graph, Op, Value
from rollplex.graph.schema import get_kind
from rollplex.ops import formulas as F
from rollplex.ops import response_width as W
from rollplex.ops.cost_context import CostContext
from rollplex.ops.formulas import Cost
from rollplex.ops.formulas.llm import lm_head_forward
from rollplex.ops.micro_batches import behind_saved, trained_units
from rollplex.ops.rollout_costs import (
    decode_cost,
    generate_cost,
    patches,
    prefill_cost,
    prefix_tokens,
    vision_cost,
    vision_grid,
)


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
    # `_backward` also reads each forward behind a saved input (once, in port order), the
    # vision encoder feeding it when that trains the same weights, and its loss's entropy.
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
    return (*key, tuple(forwards.values()), _entropy_grad(graph, op))


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


# forwards whose response tokens run packed (schedule.pack_responses), verl's full one too
PACKED_FORWARDS = ("logprob_response", "attach_response", "logprob")


def _trained_tokens(ctx: CostContext, fwd: Op, ins: dict[str, Value]) -> int:
    """Columns per row of a forward with grad (`fwd`'s inputs `ins`), run in the trainer's
    micro-batches: of whole prompts' groups (response part) or of samples (full); a
    packed response part pays each row's own tokens."""
    if ctx.packed_responses and fwd.kind in PACKED_FORWARDS:
        return W.mean_width(ctx.workload.response_length)
    units, per_unit = trained_units(ins, ctx.dp)
    return W.trimmed_width(ctx.workload.response_length, units, ctx.micro_batches, per_unit)


def _scored_tokens(ctx: CostContext, op: Op, ins: dict[str, Value], part: str) -> int:
    """Columns per row of a logprob forward (`part`: response or full): trimmed per
    micro-batch with grad; without, its rows' longest (response_width.py)."""
    if "saved" in op.outputs:
        return _trained_tokens(ctx, op, ins)
    lengths = ctx.workload.response_length
    if ctx.packed_responses and part in ("response", "full"):
        return W.mean_width(lengths)
    return W.longest_width(lengths, ctx.per_rank(ins["responses"].shape[0]))


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
    tokens = _trained_tokens(ctx, op, ins)
    return lm_head_forward(ctx.model, rows, tokens, ctx.tp, "forward", ctx.run_share)


def _logprob(part: str):
    def cost(g: Graph, op: Op, ctx: CostContext) -> Cost:
        ins = g.inputs_of(op)
        grad = "saved" in op.outputs
        if ctx.fused_forward and grad and part != "prefix":
            return Cost()  # it runs in the backward step (`_backward`)
        if part == "response":
            rows, prefix = ctx.per_rank(ins["responses"].shape[0]), ins["kv"].shape[3]
        else:
            rows, prefix = ctx.per_rank(ins["features"].shape[0]), prefix_tokens(ins)
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
            run_share=ctx.run_share,
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
        prefix = prefix_tokens(ins) if "features" in ins else 0
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
    entropy_grad = _entropy_grad(g, op)
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
            rows, prefix = ins["features"].shape[0], prefix_tokens(ins)
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
            run_share=ctx.run_share,
            entropy_grad=entropy_grad,
            layer_major="exported" in fwd.outputs,  # its saved inputs are an export
        )
        again = ctx.recompute_forward or ctx.fused_forward
        if again and part != "prefix" and fwd.kind != "attach_response":  # decode once: none
            # The forward again, with grad, before its micro-batch's backward: what it
            # keeps lives beside that backward's scratch, not in an output.
            again = F.logprob(
                ctx.model, ctx.per_rank(rows), prefix, tokens, part, ctx.tp,
                grad=True, checkpointing=ctx.checkpointing, run_share=ctx.run_share,
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
                patches(px),
                ctx.tp,
                checkpointing=ctx.checkpointing,
                shards=ctx.shards,
                **vision_grid(px),
            )
    return total


def _entropy_grad(g: Graph, op: Op) -> bool:
    """Whether backward `op`'s loss has an entropy term (its policy_loss's entropy_coeff)."""
    loss = g.producer(op.inputs["loss"]) if "loss" in op.inputs else None
    return bool(loss is not None and loss.attrs.get("entropy_coeff"))


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
    "vision_encode": vision_cost,
    "prefix_prefill": prefill_cost,
    "decode": decode_cost,
    "generate": generate_cost,
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
