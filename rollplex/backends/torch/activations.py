"""What a training forward keeps for its backward: the tensors autograd saves
(`SavedActivations`), the leaves its micro-batches read of a shared forward (`Boundary`),
and the micro-batches themselves (`MicroBatches`), released one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch


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
