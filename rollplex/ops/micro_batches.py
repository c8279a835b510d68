"""The trainer's micro-batches: how many a training forward runs in, and which rows each holds.

One rule, read by the planner (the count it carries and prices, the widths it pads to) and
by the torch trainer (the ranges it runs): a step's training tokens on one GPU over
`schedule.train_micro_tokens` give the count; a forward cuts its rows into that many
contiguous, near-equal ranges of whole units (a prompt's group on the prefix-shared path,
a sample on the per-sample path), so it runs at most one micro-batch per unit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rollplex.graph.ir import Graph, Op, Value


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
