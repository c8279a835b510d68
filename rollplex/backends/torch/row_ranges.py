"""Which rows a training or scoring forward runs: the plan's micro-batch ranges, and those
ranges over the units whose advantages are not all 0 (algo.skip_zero_advantage: a unit
whose rows' are all exactly 0 adds exactly 0 to the gradient, and nothing reads its
logprobs; docs/architecture.md, Training)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from rollplex.backends.torch.logprob import response_mask
from rollplex.backends.torch.values import Responses, TokenLogprobs
from rollplex.ops.micro_batches import micro_ranges

log = logging.getLogger(__name__)
_WARNED: set[tuple[int, int, str]] = set()
GROUPS = "prompts (a group shares its prefix)"


def planned_ranges(units: int, count: int, what: str) -> list[tuple[int, int]]:
    """`micro_ranges`, saying once in the run log when the plan's count exceeds the units
    (a micro-batch holds at least one of `what`; the plan counts at most its units per
    rank, so a plan made for another split or batch can exceed them)."""
    if count > units and (units, count, what) not in _WARNED:
        _WARNED.add((units, count, what))
        log.warning(
            "the plan's %d training micro-batches exceed this step's %d %s: running %d",
            count,
            units,
            what,
            units,
        )
    return micro_ranges(units, count)


def live_units(advantages: torch.Tensor | None, units: int, rows_per_unit: int) -> list[bool]:
    """Per unit (a prompt's group of rows, or one sample): whether any of its rows has a
    nonzero advantage. A unit whose rows' are all exactly 0 adds exactly 0 to a gradient
    with no KL or entropy term (AlgoSpec.skip_zero_advantage says when that holds)."""
    if advantages is None:
        return [True] * units
    if advantages.shape[0] != units * rows_per_unit:
        raise ValueError(
            f"{tuple(advantages.shape)} advantages for {units} units of {rows_per_unit} rows"
        )
    return (advantages.detach().reshape(units, -1) != 0).any(dim=1).tolist()


def live_prompts(advantages: torch.Tensor, prompts: int) -> list[bool]:
    """`live_units` of `prompts` prompts, each with its share of the advantages' rows (a
    prefix op's: its group's samples)."""
    return live_units(advantages, prompts, advantages.shape[0] // prompts)


def skipping_ranges(
    units: int, count: int, live: list[bool], what: str = GROUPS
) -> list[tuple[int, int, bool]]:
    """(lo, hi, trained) ranges covering units [0, units) in order: the live units cut as
    `planned_ranges` cuts a batch of them (so no micro-batch is larger than the plan's),
    each split where dead units interrupt it (micro-batches stay contiguous rows, their
    prefix K/V uncopied); the dead units between, as untrained ranges."""
    alive = [u for u in range(units) if live[u]]
    # fewer live units than the plan's count is the skip, not a plan made for another batch:
    # only the whole batch may warn (planned_ranges)
    if len(alive) == units:
        cuts = planned_ranges(units, count, what)
    else:
        cuts = micro_ranges(len(alive), count) if alive else []
    trained: list[tuple[int, int]] = []
    for a, b in cuts:
        start = prev = alive[a]
        for u in alive[a + 1 : b]:
            if u != prev + 1:
                trained.append((start, prev + 1))
                start = u
            prev = u
        trained.append((start, prev + 1))
    out, at = [], 0
    for lo, hi in trained:
        if lo > at:
            out.append((at, lo, False))
        out.append((lo, hi, True))
        at = hi
    if at < units:
        out.append((at, units, False))
    return out


def scored_live_runs(
    live: list[bool],
    rows_per_unit: int,
    responses: Responses,
    score: Callable[[int, int], TokenLogprobs],
) -> TokenLogprobs:
    """A no-grad scorer's logprobs [S, R] over units whose rows are `responses`': `score(lo,
    hi)` on each maximal run of live units [lo, hi), 0 on the dead units' rows (their
    mask is still the responses')."""
    width = responses.tokens.shape[1]
    parts = []
    for lo, hi, trains in skipping_ranges(len(live), 1, live):
        if trains:
            parts.append(score(lo, hi).values)
            continue
        n = (hi - lo) * rows_per_unit
        parts.append(torch.zeros(n, width, dtype=torch.float32, device=responses.tokens.device))
    return TokenLogprobs(torch.cat(parts), response_mask(responses.lengths, width))
