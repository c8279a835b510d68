"""The training prefix's outputs over per-piece graphs, and its backward a piece at a time
(docs/architecture.md, Training: "The prefix's backward in pieces").

A training prefix forward runs in pieces of prompts (the plan's micro-batches, or a ride's
chunks), each with its own autograd graph. What it hands on (each layer's K/V, the last
position's logits or hidden state) is joined in row order without autograd, as the outputs
of one node (`_Joined`); the response micro-batches' backward reaches that node (through a
`Boundary`), and its backward drives each piece's graph from the joined gradients in a
call of its own. One call over every piece (a differentiable cat) holds, in autograd's
input buffers, a gradient-sized sum for each parameter that more than one piece reads
until the last piece has reached it: a second copy of the gradients. Visual features with
grad (a trained tower) are cut the same way and backpropagated once, after the pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from rollplex.backends.torch.kv_rows import kv_rows
from rollplex.engine.prefix import PrefixState, cache_kv


@dataclass(slots=True, eq=False)
class PieceGraph:
    """One piece's graph: its rows of the joined outputs, and the edge each output's rows
    came from (None where that output has no graph)."""

    rows: tuple[int, int]
    edges: list[GradientEdge | None]
    # (features with grad, the detached leaf the piece read in their place)
    upstream: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class PrefixPieces:
    """The pieces' graphs of a joined training prefix, whose outputs run in the order
    [K0, V0, K1, V1, ..., last]."""

    pieces: list[PieceGraph]

    def backward(self, grads: Sequence[torch.Tensor | None]) -> None:
        """Each piece's graph from the joined outputs' gradients (last piece first), in a
        call of its own; then the features' graph once. Runs once: it lets go of them."""
        pieces, self.pieces = self.pieces, []
        upstream: list[tuple[torch.Tensor, torch.Tensor]] = []
        for piece in reversed(pieces):
            lo, hi = piece.rows
            pairs = [
                (edge, grad[lo:hi])
                for edge, grad in zip(piece.edges, grads, strict=True)
                if edge is not None and grad is not None
            ]
            if pairs:
                torch.autograd.backward([e for e, _ in pairs], [g for _, g in pairs])
            upstream += [(t, leaf.grad) for t, leaf in piece.upstream if leaf.grad is not None]
        if upstream:
            torch.autograd.backward([t for t, _ in upstream], [g for _, g in upstream])


class _Joined(torch.autograd.Function):
    """The pieces' outputs, joined without autograd, as outputs of one node whose backward
    drives each piece's graph in a call of its own (nested in the backward that reaches
    it, so hooks that wait for that backward's end, FSDP2's root reduce-scatter among
    them, see every piece's gradients)."""

    @staticmethod
    def forward(ctx: Any, pieces: PrefixPieces, _anchor: torch.Tensor, *joined: torch.Tensor):
        ctx.pieces = pieces
        return tuple(t.view_as(t) for t in joined)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None):
        with torch.enable_grad():
            ctx.pieces.backward(grads)
        return (None, None, *(None for _ in grads))


def _joined(outputs: list[torch.Tensor], pieces: PrefixPieces) -> list[torch.Tensor]:
    """`outputs` (no graph) as `_Joined`'s; where none of them had one, as they are."""
    if not any(e is not None for p in pieces.pieces for e in p.edges):
        return outputs
    # an input with grad gives the node's outputs theirs
    anchor = torch.empty(0, device=outputs[0].device, requires_grad=True)
    return list(_Joined.apply(pieces, anchor, *outputs))


def cut_features(features: torch.Tensor) -> tuple[torch.Tensor, list]:
    """(what a piece's forward reads, its `upstream`): features with grad as a detached
    leaf, so that each piece's backward stops there and the tower's runs once."""
    if not features.requires_grad:
        return features, []
    leaf = features.detach().requires_grad_()
    return leaf, [(features, leaf)]


def _outputs(state: PrefixState) -> list[torch.Tensor]:
    last = state.last_logits if state.last_logits is not None else state.last_hidden
    if last is None:
        raise ValueError("a prefix state without last_logits or last_hidden")
    return [t for pair in cache_kv(state.cache) for t in pair] + [last]


def _state(state: PrefixState, outputs: list[torch.Tensor], pieces: PrefixPieces) -> PrefixState:
    *kv, last = _joined(outputs, pieces)
    deferred = state.last_logits is None
    return replace(
        state,
        cache=kv_rows(list(zip(kv[::2], kv[1::2], strict=True)), pieces),
        last_logits=None if deferred else last,
        last_hidden=last if deferred else None,
    )


def as_pieces(state: PrefixState, upstream: list | None = None) -> PrefixState:
    """A prefix state made with grad, as one piece: its outputs (sharing their storage)
    the outputs of a node that drives its graph in a backward call of its own."""
    outs = _outputs(state)
    edges = [get_gradient_edge(t) if t.requires_grad else None for t in outs]
    piece = PieceGraph((0, state.rows), edges, list(upstream or []))
    return _state(state, [t.detach() for t in outs], PrefixPieces([piece]))


def pieces_of(state: PrefixState) -> PrefixPieces | None:
    return getattr(state.cache, "pieces", None)


def join_pieces(parts: Sequence[PrefixState], head: nn.Module | None = None) -> PrefixState:
    """Parts made by `as_pieces` (or joined already), in row order, as one state: their
    outputs concatenated without autograd, their pieces' rows offset, one node over all.
    Parts that deferred the LM head get it here, on all rows at once (a graph over the
    joined hidden state), when `head` is given; without it the joined state defers it too."""
    owned = [pieces_of(p) for p in parts]
    if any(own is None for own in owned):
        raise ValueError("join_pieces: a part was not made by as_pieces")
    pieces, offset = [], 0
    for part, own in zip(parts, owned, strict=True):
        for p in own.pieces:  # type: ignore[union-attr]
            pieces.append(replace(p, rows=(p.rows[0] + offset, p.rows[1] + offset)))
        offset += part.rows
    columns = zip(*(_outputs(p) for p in parts), strict=True)
    outputs = [torch.cat([t.detach() for t in col]) for col in columns]
    state = _state(parts[0], outputs, PrefixPieces(pieces))

    def cat(name: str) -> torch.Tensor:
        return torch.cat([getattr(p, name) for p in parts])

    state = replace(
        state,
        attention_mask=cat("attention_mask"),
        next_positions=cat("next_positions"),
        rope_deltas=cat("rope_deltas"),
        lengths=cat("lengths"),
    )
    if state.last_logits is None and head is not None:
        with torch.enable_grad():
            state = replace(state, last_logits=head(state.last_hidden), last_hidden=None)
    return state
