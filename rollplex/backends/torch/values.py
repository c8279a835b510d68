"""The row-wise values the torch backend keeps in the executor's environment: pixels,
features, responses, logprobs and the loss. They can be cut into row chunks and merged back
(rows.py for prompts and prefix states); what a training forward keeps for its backward is
activations.py's, and the holders of in-place state (weights, optimizer state, gradients)
are handles.py's. `tensors()` is what accounting counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from rollplex.backends.torch.activations import MicroBatches
from rollplex.data.prompts import PromptBatch


@dataclass(slots=True)
class Pixels:
    """Each prompt's visuals (its images, or its video) as one vision-tower input."""

    values: torch.Tensor  # [sum patches, D], prompts in order
    grid: torch.Tensor  # [visuals, 3] (t, h, w) in patches, prompts in order
    counts: list[int]  # visuals per prompt

    @staticmethod
    def of(batch: PromptBatch) -> Pixels:
        return Pixels(*batch.visual_rows())

    @property
    def rows(self) -> int:
        return len(self.counts)

    def _grids(self) -> list[torch.Tensor]:
        return list(self.grid.split(self.counts))

    def _spans(self) -> list[int]:
        return [int(g.prod(-1).sum()) for g in self._grids()]

    def select(self, lo: int, hi: int) -> Pixels:
        spans, visuals = self._spans(), self.counts
        a, b = sum(spans[:lo]), sum(spans[:hi])
        va, vb = sum(visuals[:lo]), sum(visuals[:hi])
        return Pixels(self.values[a:b], self.grid[va:vb], visuals[lo:hi])

    def take(self, rows: list[int]) -> Pixels:
        """Prompts `rows`' visuals, in that order."""
        parts, grids = self.values.split(self._spans()), self._grids()
        return Pixels(
            torch.cat([parts[r] for r in rows]),
            torch.cat([grids[r] for r in rows]),
            [self.counts[r] for r in rows],
        )

    def repeat(self, g: int) -> Pixels:
        parts, grids = self.values.split(self._spans()), self._grids()
        return Pixels(
            torch.cat([p for p in parts for _ in range(g)]),
            torch.cat([x for x in grids for _ in range(g)]),
            [c for c in self.counts for _ in range(g)],
        )

    @staticmethod
    def merge(parts: Sequence[Pixels]) -> Pixels:
        return Pixels(
            torch.cat([p.values for p in parts]),
            torch.cat([p.grid for p in parts]),
            [c for p in parts for c in p.counts],
        )


@dataclass(slots=True)
class Features:
    values: torch.Tensor  # [sum visual tokens, H], prompts in order
    tokens: list[int]  # visual tokens per row

    @property
    def rows(self) -> int:
        return len(self.tokens)

    def select(self, lo: int, hi: int) -> Features:
        a, b = sum(self.tokens[:lo]), sum(self.tokens[:hi])
        return Features(self.values[a:b], self.tokens[lo:hi])

    def take(self, rows: list[int]) -> Features:
        """Prompts `rows`' features, in that order."""
        parts = self.values.split(self.tokens)
        return Features(torch.cat([parts[r] for r in rows]), [self.tokens[r] for r in rows])

    def repeat(self, g: int) -> Features:
        parts = self.values.split(self.tokens)
        return Features(
            torch.cat([p for p in parts for _ in range(g)]),
            [t for t in self.tokens for _ in range(g)],
        )

    @staticmethod
    def merge(parts: Sequence[Features]) -> Features:
        return Features(torch.cat([p.values for p in parts]), [t for p in parts for t in p.tokens])


@dataclass(slots=True)
class Responses:
    tokens: torch.Tensor  # [S, R] long, right-padded
    lengths: torch.Tensor  # [S]


@dataclass(slots=True)
class TokenLogprobs:
    values: torch.Tensor  # [S, R] fp32, 0 on padding; with grad in training
    mask: torch.Tensor  # [S, R] bool, True on response tokens


class MicroLogprobs(TokenLogprobs):
    """A training forward's logprobs run in micro-batches (micro.py): `values` detached,
    each micro-batch's logprobs with grad in `micro`. Not a dataclass field, so whatever
    treats logprobs as rows of their fields (hand-overs, row cuts) sees values and mask.
    `entropy` [S, R] (detached, 0 on padding): the policy's per-token entropy from the same
    logits, for the loss's entropy metric and term; None when the forward did not compute it."""

    __slots__ = ("entropy", "micro")

    def __init__(
        self,
        values: torch.Tensor,
        mask: torch.Tensor,
        micro: MicroBatches | None = None,
        entropy: torch.Tensor | None = None,
    ) -> None:
        super().__init__(values, mask)
        self.micro = micro
        self.entropy = entropy

    def tensors(self) -> Iterator[torch.Tensor]:
        """Its own tensors (the micro-batches' kept activations are the `saved` value's)."""
        yield from (self.values, self.mask)
        if self.entropy is not None:
            yield self.entropy
        if self.micro is not None:
            yield from self.micro.logprobs
            yield from self.micro.entropy


@dataclass(slots=True)
class Loss:
    value: torch.Tensor  # 0-dim, with grad unless `terms` carry it
    metrics: dict[str, torch.Tensor]
    # micro-batched: each micro-batch's share of `value`, with grad, and their forwards; a
    # term is a callable making it when its forward runs in the backward (recompute mode)
    terms: list[Any] | None = None
    micro: MicroBatches | None = None
    # fused mode (schedule.train_micro_fused): `value` and `metrics` hold placeholders that
    # this fills in place once the backward has run every micro-batch's forward
    finish: Any = None

    def tensors(self) -> Iterator[torch.Tensor]:
        yield self.value
        yield from (t for t in self.terms or () if isinstance(t, torch.Tensor))

    def scaled(self, factor: torch.Tensor, metrics: MetricsMap | None = None) -> Loss:
        """The same loss times `factor` (its terms too), its metrics mapped by `metrics`
        (as they are if None). A fused loss's value and metrics are known only after the
        backward: the scaled loss's are filled in then, from its own."""
        terms = None if self.terms is None else [_times(t, factor) for t in self.terms]
        factor = factor.to(self.value.dtype)
        remap = metrics or _same
        if self.finish is None:
            return Loss(self.value * factor, remap(self.metrics), terms, self.micro)
        blank = {k: torch.zeros_like(v) for k, v in self.metrics.items()}
        out = Loss(torch.zeros_like(self.value), blank, terms, self.micro)
        out.finish = partial(_fill_scaled, self, out, factor, remap)
        return out


MetricsMap = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def _same(metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return metrics


def _fill_scaled(source: Loss, out: Loss, factor: torch.Tensor, remap: MetricsMap) -> None:
    """After a fused backward: `out`'s value and metrics from `source`'s, now filled in."""
    source.finish()
    out.value.copy_(source.value * factor)
    for k, v in remap(source.metrics).items():
        out.metrics[k].copy_(v)


def _times(term: Any, factor: torch.Tensor) -> Any:
    if callable(term):
        return lambda: term() * factor
    return term * factor
