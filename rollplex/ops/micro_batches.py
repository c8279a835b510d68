"""Micro-batches: how many a forward runs in, and which rows each holds.

One rule, read by the planner (the count it carries and prices, the widths it pads to) and
by the runtime (the ranges it runs). The trainer's: a step's training tokens on one GPU over
`schedule.train_micro_tokens` give the count; a forward cuts its rows into that many
contiguous, near-equal ranges of whole units (a prompt's group on the prefix-shared path,
a sample on the per-sample path), so it runs at most one micro-batch per unit. The other
forwards (vision, prefix forwards, scoring without grad: `op_micro_batches`) are cut the
same way by the runtime's dispatch, each by its own tokens, so each one's scratch is that
of its largest range.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rollplex.graph.ir import Graph, Op, Phase, Value

# Forwards the runtime's dispatch runs in row micro-batches of its own (outside the
# trainer's: its forwards with grad over responses follow `train_micro_batches`).
OP_MICRO_KINDS = frozenset(
    {"vision_encode", "prefix_prefill", "logprob_prefix", "logprob_response", "logprob"}
)


def micro_batch_count(tokens: float, micro_tokens: int) -> int:
    """Micro-batches of at most `micro_tokens` tokens that `tokens` need: at least one."""
    if micro_tokens < 1:
        raise ValueError(f"schedule.train_micro_tokens must be >= 1, got {micro_tokens}")
    return max(1, math.ceil(tokens / micro_tokens))


def micro_ranges(units: int, count: int) -> list[tuple[int, int]]:
    """`count` contiguous, near-equal ranges of `units`, each at least one unit (a count
    above the units gives one unit each)."""
    if count < 1:
        raise ValueError(f"train micro-batch count must be >= 1, got {count}")
    if units < 1:
        raise ValueError(f"no rows to cut into micro-batches ({units})")
    n = min(count, units)
    return [(units * i // n, units * (i + 1) // n) for i in range(n)]


def micro_batches_run(units: int, count: int) -> int:
    """How many micro-batches a forward over `units` runs at the plan's `count`."""
    return len(micro_ranges(units, count))


def op_units(graph: Graph, op: Op, response_tokens: float) -> tuple[int, float] | None:
    """(units, tokens per unit) the runtime cuts forward `op` at, or None where it runs
    whole: not a forward of `OP_MICRO_KINDS`, a forward that exports its activations
    (prefill_once: one export for all rows), or the trainer's forward over responses (its
    own micro-batches). Units are rows: a prompt's visuals, a prompt's prefix, a sample, or
    a prompt's group on its shared prefix K/V. Tokens are the sequence its activations
    scale with: the vision tower's patches; the prefix positions; a response forward's
    context plus `response_tokens` (the mean response) per sample."""
    if op.kind not in OP_MICRO_KINDS or "exported" in op.outputs:
        return None
    if op.phase is Phase.TRAIN and op.kind in ("logprob", "logprob_response"):
        return None
    ins = graph.inputs_of(op)
    if op.kind == "vision_encode":
        rows, t, h, w, _ = ins["pixels"].shape
        return rows, t * h * w
    if "kv" in ins:  # logprob_response: a prompt's G responses read its K/V
        prompts, positions = ins["kv"].shape[2], ins["kv"].shape[3]
        group = max(1, ins["responses"].shape[0] // max(1, prompts))
        return prompts, group * (positions + response_tokens)
    prefix = ins["features"].shape[1] + ins["text"].shape[1]
    if "responses" in ins:  # the per-sample forward (verl's)
        return ins["responses"].shape[0], prefix + response_tokens
    return ins["features"].shape[0], prefix


def op_micro_batches(
    graph: Graph,
    op: Op,
    dp: int,
    micro_tokens: int,
    response_tokens: float,
    tp: int = 1,
    trainer: int = 1,
) -> int:
    """The micro-batches one of `dp` ranks runs `op` in: its units' tokens over
    `micro_tokens`, at most one per unit; 1 where it runs whole (`op_units`), and for a
    rollout forward on a TP group of `tp` > 1 (its members gather their rows into one
    call: backends/fsdp/share.py). A training prefix forward with grad runs in at least
    the trainer's `trainer` micro-batches: its backward then runs one of them at a time
    (backends/torch/prefix_pieces.py), priced at the trainer's share."""
    shape = op_units(graph, op, response_tokens)
    if shape is None or (op.phase is Phase.ROLLOUT and tp > 1):
        return 1
    units = math.ceil(shape[0] / max(1, dp))
    count = micro_batch_count(units * shape[1], micro_tokens)
    if op.phase is Phase.TRAIN and op.kind == "logprob_prefix" and "saved" in op.outputs:
        count = max(count, trainer)
    return micro_batches_run(units, count)


def largest_share(units: int, count: int) -> float:
    """The largest of `micro_ranges(units, count)`'s share of the units: the part of an
    op's scratch that one micro-batch holds at its peak (not the average)."""
    return max(hi - lo for lo, hi in micro_ranges(units, count)) / units


def trained_units(ins: Mapping[str, Value], dp: int) -> tuple[int, int]:
    """(units per data-parallel rank, rows per unit) of a training forward with grad, from
    its inputs `ins`: whole prompts' groups (`logprob_response`: its prefix K/V has one row
    per prompt) or samples (the per-sample `logprob`). Ranks take equal, contiguous slices
    (planner/pools.py)."""
    rows = ins["responses"].shape[0]
    if "kv" not in ins:
        return math.ceil(rows / max(1, dp)), 1
    prompts = ins["kv"].shape[2]
    return math.ceil(prompts / max(1, dp)), max(1, rows // max(1, prompts))


def trained_forward(graph: Graph, op: Op) -> Op | None:
    """The forward with grad whose micro-batches `op` runs in: `op` itself when it is one
    (it scores responses and keeps `saved`, or attaches a decode's: decode_once), a
    backward's forward behind its saved inputs."""
    if _scores_with_grad(op):
        return op
    if op.kind != "backward":
        return None
    for port, v in op.inputs.items():
        fwd = behind_saved(graph, v) if port.startswith("saved") else None
        if fwd is not None and _scores_with_grad(fwd):
            return fwd
    return None


def _scores_with_grad(op: Op) -> bool:
    return op.kind == "attach_response" or ("saved" in op.outputs and "responses" in op.inputs)


def behind_saved(graph: Graph, value: str) -> Op | None:
    """The training forward a backward's saved input `value` stands for: its producer, or,
    for a decode's `kept` outputs (graph/passes/decode_once.py), the `attach_response` that
    reads them in place of the response forward."""
    fwd = graph.producer(value)
    if fwd is None or fwd.kind != "decode" or fwd.outputs.get("kept") != value:
        return fwd
    return next((op for op in graph.consumers(value) if op.kind == "attach_response"), fwd)
