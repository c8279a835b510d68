"""Training micro-batches: the step's training forward and backward in the plan's count.

Each micro-batch has its own autograd graph (layers checkpointed) ending at detached leaves
cut from the shared prefix forward; the loss is one weighted term per micro-batch, and the
backward runs them one by one, then the shared forward once. The kept, recompute and fused
modes: docs/architecture.md (Training).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rollplex.backends.torch.activations import Boundary, MicroBatches, SavedActivations, Scored
from rollplex.backends.torch.checkpointing import checkpointed_layers
from rollplex.backends.torch.roles import capture_saved, masked_logprobs
from rollplex.backends.torch.row_ranges import GROUPS, live_units, skipping_ranges
from rollplex.backends.torch.rows import prefix_rows
from rollplex.backends.torch.trim import trimmed
from rollplex.backends.torch.values import MicroLogprobs, Responses
from rollplex.engine.prefix import Model, PrefixState


def forward_micro_batches(
    model: Model,
    ranges: list[tuple[int, int, bool]],
    rows_per_unit: int,
    forward: Callable[[int, int, Boundary], Scored],
    recompute: bool = False,
    fused: Responses | None = None,
    entropy: bool = False,
    width: int = 0,
    skips: bool = False,
) -> MicroBatches:
    """`forward(lo, hi, boundary)` with grad over each trained range (lo, hi, True) of units
    (prompts or samples), every decoder layer checkpointed; it returns the [rows, R]
    outputs of units [lo, hi), which are sample rows [lo * rows_per_unit, hi *
    rows_per_unit). An untrained range runs nothing, here or in the backward: its values
    are zeros of `width` columns. With `recompute` it runs without grad here, keeping
    nothing, and again with grad inside the backward, one micro-batch at a time
    (`MicroBatches.redo`). `fused` (the responses, in fused mode): nothing runs here; each
    micro-batch's values are zeros until its redo in the backward. `entropy`: `forward`
    returns (logprobs, entropy) (fused mode needs to know beforehand). `skips`: the ranges
    came from the advantages (the loss logs how many rows trained)."""
    micro = MicroBatches(fused=fused is not None, skips=skips)

    def run(k: int) -> tuple[Scored, SavedActivations]:
        lo, hi, _ = ranges[k]
        saved = SavedActivations()
        with torch.enable_grad(), capture_saved(saved), checkpointed_layers(model, saved):
            return forward(lo, hi, micro.boundary), saved

    def zeros(n: int, device: torch.device) -> Scored:
        empty = torch.zeros(n, width, dtype=torch.float32, device=device)
        return (empty, empty.clone()) if entropy else empty

    for k, (lo, hi, trains) in enumerate(ranges):
        rows = (lo * rows_per_unit, hi * rows_per_unit)
        if not trains:
            device = fused.tokens.device if fused is not None else _device(model)
            micro.add(rows, zeros(rows[1] - rows[0], device), SavedActivations(), trained=False)
            continue
        if fused is not None:
            micro.add(rows, zeros(rows[1] - rows[0], fused.tokens.device), SavedActivations())
            continue
        if not recompute:
            micro.add(rows, *run(k))
            continue
        with torch.no_grad():  # its cuts of the shared forward are not the backward's
            micro.add(rows, forward(lo, hi, Boundary()), SavedActivations())

    def redo(k: int) -> torch.Tensor:
        """Micro-batch k's forward with grad: its logprobs (its entropy into micro.entropy)."""
        out, micro.saved[k] = run(k)
        micro.set(k, out)
        lo, hi = micro.rows[k]
        if micro.sink is not None:  # fused: the values the forward step left as zeros
            micro.sink[lo:hi].copy_(micro.logprobs[k].detach())
        if micro.entropy_sink is not None:
            micro.entropy_sink[lo:hi].copy_(micro.entropy[k].detach())
        return micro.logprobs[k]

    micro.redo = redo if recompute or fused is not None else None
    return micro


def _device(model: Model) -> torch.device:
    return next(model.parameters()).device


def micro_logprobs(
    micro: MicroBatches, responses: Responses
) -> tuple[MicroLogprobs, SavedActivations]:
    """The micro-batches' outputs as one value (detached; the graphs stay in `micro`) and
    what they keep for backward, as the graph's `logprobs` and `saved` values."""
    out = masked_logprobs(micro.values(), responses)
    entropy = micro.entropy_values()
    if micro.fused:
        micro.sink, micro.entropy_sink = out.values, entropy
    value = MicroLogprobs(out.values, out.mask, micro, entropy)
    return value, SavedActivations(parts=list(micro.saved))


def response_micro_batches(
    model: Model,
    prefix: PrefixState,
    responses: Responses,
    group_size: int,
    count: int,
    score: Callable[[PrefixState, torch.Tensor, torch.Tensor, slice], Scored],
    recompute: bool = False,
    fused: bool = False,
    entropy: bool = False,
    advantages: torch.Tensor | None = None,
) -> tuple[MicroLogprobs, SavedActivations]:
    """The training forward over responses on a group-shared prefix, in `count`
    micro-batches of whole prompts' groups: `score(state, tokens, lengths, rows)` gives the
    [rows, R] outputs of sample rows `rows` on `state`, their prompts' prefix rows (one per
    prompt: the group's G responses share its K/V, never repeated). With `entropy`, `score`
    returns (logprobs, entropy) and the value carries the entropy too. `advantages` [S]:
    prompts whose rows' are all 0 are not trained (`skipping_ranges`)."""

    def forward(lo: int, hi: int, boundary: Boundary) -> Scored:
        rows = slice(lo * group_size, hi * group_size)
        state = prefix_rows(prefix, lo, hi, boundary)
        tokens, lengths = responses.tokens[rows], responses.lengths[rows]
        return trimmed(lambda t: score(state, t, lengths, rows), tokens, lengths)

    units = (prefix.rows, group_size, GROUPS)
    return _scored_units(
        model, units, count, forward, responses, recompute, fused, entropy, advantages
    )


def sample_micro_batches(
    model: Model,
    features: Any,
    text: Any,
    responses: Responses,
    count: int,
    score: Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor, slice], Scored],
    recompute: bool = False,
    fused: bool = False,
    entropy: bool = False,
    advantages: torch.Tensor | None = None,
) -> tuple[MicroLogprobs, SavedActivations]:
    """The per-sample (verl's) training forward in `count` micro-batches of whole samples:
    `score(text, visual, tokens, lengths, rows)` gives the [rows, R] outputs of samples
    `rows` from their prompts and visual features (`features`: Features); `entropy` as in
    response_micro_batches. `advantages` [S]: samples whose advantage is 0 are not
    trained."""

    def forward(lo: int, hi: int, boundary: Boundary) -> Scored:
        a, b = sum(features.tokens[:lo]), sum(features.tokens[:hi])
        rows = slice(lo, hi)
        visual = boundary.cut(features.values, a, b)
        tokens, lengths = responses.tokens[rows], responses.lengths[rows]
        return trimmed(
            lambda t: score(text.select(lo, hi), visual, t, lengths, rows), tokens, lengths
        )

    units = (features.rows, 1, "samples")
    return _scored_units(
        model, units, count, forward, responses, recompute, fused, entropy, advantages
    )


def _scored_units(
    model: Model,
    units: tuple[int, int, str],
    count: int,
    forward: Callable[[int, int, Boundary], Scored],
    responses: Responses,
    recompute: bool,
    fused: bool,
    entropy: bool,
    advantages: torch.Tensor | None,
) -> tuple[MicroLogprobs, SavedActivations]:
    """`forward` over `units` (count, rows each, what they are) in the plan's `count`
    micro-batches, the dead ones (all-0 `advantages`) skipped, as the graph's value."""
    n, rows_per_unit, what = units
    ranges = skipping_ranges(n, count, live_units(advantages, n, rows_per_unit), what)
    micro = forward_micro_batches(
        model,
        ranges,
        rows_per_unit,
        forward,
        recompute,
        responses if fused else None,
        entropy,
        responses.tokens.shape[1],
        advantages is not None,
    )
    return micro_logprobs(micro, responses)
