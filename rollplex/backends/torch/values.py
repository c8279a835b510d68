"""The objects the torch backend keeps in the executor's environment, one per graph value.

Row-wise values can be cut into row chunks and merged back (rows.py for prompts and prefix
states); holders of in-place state carry a version or a release hook, so the runtime can check
what an op read and really free what the plan frees. `tensors()` is what accounting counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn

from rollplex.backends.base import BackendError, version_name
from rollplex.backends.torch.host_memory import move
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


@dataclass(slots=True)
class SavedActivations:
    """The tensors autograd keeps for the backward of one forward (captured with
    saved_tensors_hooks, plus the inputs of checkpointed layers), so the accounting sees
    what training really holds; `parts` are micro-batches', released one by one."""

    saved: list[torch.Tensor] = field(default_factory=list)
    parts: list[SavedActivations] = field(default_factory=list)

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.saved
        for p in self.parts:
            yield from p.tensors()

    def release(self) -> None:
        self.saved.clear()
        for p in self.parts:
            p.release()

    @staticmethod
    def merge(parts: Sequence[SavedActivations]) -> SavedActivations:
        return SavedActivations(
            [t for p in parts for t in p.saved], [q for p in parts for q in p.parts]
        )


# a micro-batch forward's outputs: [rows, R], or ([rows, R] logprobs, [rows, R] entropy)
Scored = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


@dataclass(slots=True, eq=False)
class Boundary:
    """Outputs of a forward shared by the micro-batches, and the leaves each one reads.

    `cut` hands out rows of a source as a detached leaf; each micro-batch's backward stops
    there and leaves its gradient on the leaf. `backward` then joins the leaves' gradients
    (in row order; rows no leaf covers, or whose leaf got none, a skipped micro-batch's,
    take 0) and backpropagates them once through the shared forward."""

    sources: list[torch.Tensor] = field(default_factory=list)
    leaves: list[list[tuple[int, torch.Tensor]]] = field(default_factory=list)  # (lo, leaf)

    def cut(self, source: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        if not source.requires_grad:
            return source[lo:hi]
        leaf = source[lo:hi].detach().requires_grad_()
        for i, s in enumerate(self.sources):
            if s is source:
                self.leaves[i].append((lo, leaf))
                return leaf
        self.sources.append(source)
        self.leaves.append([(lo, leaf)])
        return leaf

    def backward(self) -> None:
        sources, grads = [], []
        for source, leaves in zip(self.sources, self.leaves, strict=True):
            got = [(lo, x.grad) for lo, x in leaves if x.grad is not None]
            if not got:
                continue
            sources.append(source)
            grads.append(_rows_grad(source, got))
        self.sources, self.leaves = [], []
        if sources:
            torch.autograd.backward(sources, grads)


def _rows_grad(source: torch.Tensor, got: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """The gradient of `source` from its leaves' (first row, grad): each in its rows, 0 in
    rows no leaf covers. Leaves covering it whole, in order, are joined without a copy of
    zeros (every micro-batch trained)."""
    got.sort(key=lambda x: x[0])
    at = 0
    for lo, g in got:
        if lo != at:
            break
        at += g.shape[0]
    else:
        if at == source.shape[0]:
            return torch.cat([g for _, g in got]) if len(got) > 1 else got[0][1]
    grad = torch.zeros_like(source)
    for lo, g in got:
        grad[lo : lo + g.shape[0]] = g
    return grad


@dataclass(slots=True, eq=False)
class MicroBatches:
    """One training forward cut into micro-batches of sample rows."""

    rows: list[tuple[int, int]] = field(default_factory=list)  # sample rows [lo, hi)
    logprobs: list[torch.Tensor] = field(default_factory=list)  # [hi - lo, R], with grad
    saved: list[SavedActivations] = field(default_factory=list)  # kept for each backward
    boundary: Boundary = field(default_factory=Boundary)
    # recompute mode: the forward ran without grad, and redo(k) runs micro-batch k's again
    # with grad (in the backward, one at a time), returning its outputs
    redo: Callable[[int], torch.Tensor] | None = None
    # fused mode: the forward step ran nothing; redo(k) writes its rows' values into `sink`
    fused: bool = False
    sink: torch.Tensor | None = None
    # the policy's per-token entropy [hi - lo, R] beside each micro-batch's logprobs, when
    # the forward returns (logprobs, entropy) (empty otherwise); with grad only when the
    # loss has an entropy term. Fused mode fills `entropy_sink` as it does `sink`.
    entropy: list[torch.Tensor] = field(default_factory=list)
    entropy_sink: torch.Tensor | None = None
    # False for rows that no forward or backward ran (algo.skip_zero_advantage): every row's
    # advantage is 0, so their gradient is; their logprobs and entropy hold 0. `skips`: the
    # forward was given the advantages (the loss then logs `trained_rows`)
    trained: list[bool] = field(default_factory=list)
    skips: bool = False

    def add(
        self, rows: tuple[int, int], out: Scored, saved: SavedActivations, trained: bool = True
    ) -> None:
        self.rows.append(rows)
        logprobs, entropy = out if isinstance(out, tuple) else (out, None)
        self.logprobs.append(logprobs)
        if entropy is not None:
            self.entropy.append(entropy)
        self.saved.append(saved)
        self.trained.append(trained)

    def trained_count(self) -> tuple[int, int]:
        """(rows trained, rows) of this forward."""
        sizes = [hi - lo for lo, hi in self.rows]
        return sum(n for n, t in zip(sizes, self.trained, strict=True) if t), sum(sizes)

    def trained_rows(self) -> torch.Tensor | None:
        """[S] bool: the rows whose forward and backward run; None where every row's does."""
        if all(self.trained):
            return None
        device = self.logprobs[0].device
        return torch.cat(
            [
                torch.full((hi - lo,), t, dtype=torch.bool, device=device)
                for (lo, hi), t in zip(self.rows, self.trained, strict=True)
            ]
        )

    def set(self, k: int, out: Scored) -> None:
        """Micro-batch `k`'s outputs from its forward run again (recompute, fused)."""
        self.logprobs[k], entropy = out if isinstance(out, tuple) else (out, None)
        if entropy is not None:
            self.entropy[k] = entropy

    def release(self, k: int) -> None:
        """Drop micro-batch `k`'s graph and kept activations (after its backward)."""
        self.logprobs[k] = self.logprobs[k].detach()
        if self.entropy:
            self.entropy[k] = self.entropy[k].detach()
        self.saved[k].release()

    def values(self) -> torch.Tensor:
        return torch.cat([x.detach() for x in self.logprobs])

    def entropy_values(self) -> torch.Tensor | None:
        return torch.cat([x.detach() for x in self.entropy]) if self.entropy else None


class VersionCounter:
    """The version a set of parameters holds now; in-place updates bump it."""

    __slots__ = ("n",)

    def __init__(self, n: int = 0) -> None:
        self.n = n


@dataclass(slots=True, eq=False)
class WeightsHandle:
    """One graph weights value: the parameters of `model` as of `version`. The module is
    updated in place, so a handle whose version is behind the counter reads weights that
    are no longer the ones it names: `check` refuses that."""

    model: str  # "policy", "ref", "vision"
    module: nn.Module  # what runs the forward
    params: tuple[nn.Parameter, ...]  # the part this value names
    version: int
    live: VersionCounter

    @property
    def name(self) -> str:
        return version_name(self.model, self.version)

    def check(self, op: str) -> str:
        if self.version != self.live.n:
            raise BackendError(
                f"op '{op}' reads {self.name}, but the parameters were updated in place to "
                f"{version_name(self.model, self.live.n)}: it would read the wrong weights"
            )
        return self.name

    def tensors(self) -> Iterator[torch.Tensor]:
        return iter(self.params)

    def move_to(self, device: torch.device | str) -> WeightsHandle:
        # Tagged with the version the parameters hold now: an offload at the version of
        # the last one (frozen weights, every step) finds its host copy current.
        tag = (self.model, self.live.n)
        for p in self.params:  # in place: every alias of these parameters moves with them
            p.data = move(p.data, device, p, tag=tag)
        return self


@dataclass(slots=True, eq=False)
class OptimizerHandle:
    """The optimizer state the plan calls `<model>.adam`: the moments and, for a bf16/fp16
    model, the float32 master weights (the planner prices both: 12 bytes a parameter)."""

    optimizer: torch.optim.Optimizer
    masters: tuple[torch.Tensor, ...] = ()
    MOVES_IN_PART: ClassVar[bool] = True  # move_to takes a share (rows.TorchValues.move)

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.masters
        for st in self.optimizer.state.values():
            yield from (v for v in st.values() if isinstance(v, torch.Tensor))

    def move_to(self, device: torch.device | str, share: float = 1.0) -> OptimizerHandle:
        """Move the state to `device` in place; with `share` < 1 only its first tensors
        (masters, then each parameter's moments, in the optimizer's order) that hold that
        share of its bytes: an offload and its onload pick the same ones, since the
        optimizer step, which makes AdamW's state, comes after both."""
        parts = list(self._parts())
        total, moved = sum(t.nbytes for t, _ in parts), 0
        for t, put in parts:
            if share < 1 and moved >= share * total:
                break
            moved += t.nbytes
            put(t, device)
        return self

    def _parts(self) -> Iterator[tuple[torch.Tensor, Callable[[torch.Tensor, Any], None]]]:
        """Each tensor of the state, and how to move it in place."""
        for m in self.masters:  # in place: the optimizer keys its state by these tensors

            def put_master(t: torch.Tensor, device: Any, m: torch.Tensor = m) -> None:
                m.data = move(t, device, m)

            yield m.data, put_master
        for param, st in self.optimizer.state.items():
            for k, v in st.items():
                # Adam's `step` counter stays where torch keeps it (a scalar).
                if isinstance(v, torch.Tensor) and v.dim() > 0:

                    def put(t: torch.Tensor, device: Any, st=st, k=k, param=param) -> None:
                        st[k] = move(t, device, param, k)

                    yield v, put


@dataclass(slots=True, eq=False)
class GradsHandle:
    """The gradients backward left on the parameters; `release` frees them."""

    params: tuple[nn.Parameter, ...]

    def tensors(self) -> Iterator[torch.Tensor]:
        return (p.grad for p in self.params if p.grad is not None)

    def release(self) -> None:
        for p in self.params:
            p.grad = None

    def move_to(self, device: torch.device | str) -> GradsHandle:
        for p in self.params:
            if p.grad is not None:
                p.grad = move(p.grad, device, p, "grad")
        return self
