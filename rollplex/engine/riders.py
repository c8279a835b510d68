"""Prefix rows that ride a decode step: the training phase's prefix forward in the same
GEMMs as the decode rows (one weight read serves both), then made differentiable (`attach`).
`prefix_layer` is the one layer function for the ride and for its recompute."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from rollplex.data.prompts import PromptBatch
from rollplex.engine.cache import SharedPrefixKV
from rollplex.engine.prefix import (
    Model,
    PrefixState,
    fork_cache,
    prefix_embeds,
    prefix_positions,
    prefix_state,
)
from rollplex.engine.step import DecodeStep, keep_column

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) as the model's rotary embedding gives


@dataclass(slots=True)
class RiderRows:
    """One chunk of prompts' prefix rows, ready to ride: the decoder's inputs."""

    batch: PromptBatch
    embeds: torch.Tensor  # [c, P, H] token + visual embeddings, no grad
    rope: Rope  # rotary of their M-RoPE positions
    next_positions: torch.Tensor  # [c] position of the first response token


@dataclass(slots=True)
class RiddenPrefix:
    """What a ride computed for its rows, without autograd."""

    rows: RiderRows
    inputs: list[torch.Tensor]  # each layer's input hidden [c, P, H]
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # each layer's K/V [c, Hkv, P, D]
    hidden: torch.Tensor  # the last layer's output [c, P, H] (before the final norm)
    alone: bool = False  # the decode had finished: the rows ran by themselves


@dataclass(slots=True)
class Decoding:
    """The decode part of a ridden layer: its hidden [B, G, H] and rotary, and how its
    queries/keys/values are attended (cache write + attention over the shared prefix)."""

    hidden: torch.Tensor
    rope: Rope
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def rider_rows(
    model: Model, batch: PromptBatch, features: torch.Tensor, embeds: torch.Tensor | None = None
) -> RiderRows:
    """The decoder inputs of `batch`'s prefixes, as `prefix_forward` builds them; `embeds`:
    those a prefill already built (its first layer's input), not built again."""
    with torch.no_grad():
        if embeds is None:
            embeds = prefix_embeds(model, batch, features)
        positions, following = prefix_positions(model, batch)
        rope = model.model.language_model.rotary_emb(embeds, positions)
    return RiderRows(batch, embeds, rope, following)


def prefix_layer(
    layer: torch.nn.Module,
    rotary: Callable,
    hidden: torch.Tensor,
    rope: Rope,
    decoding: Decoding | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One decoder layer over prefix rows `hidden` [c, P, H], with `decoding`'s rows in
    the same GEMMs when given: (prefix out, K, V, decode out).

    The prompts are right-padded, so plain causal attention is exact on every valid token
    (its keys are all valid); a padded position's output is read by nothing (the response
    attends to the valid prefix only). Without an explicit [c, 1, P, P] mask SDPA may take
    its flash kernel, which takes none; with one it must pick a kernel that reads the mask,
    and its math fallback holds a [c, heads, P, P] score matrix (GiBs at 4k-token video
    prefixes, in the backward's recompute)."""
    attn = layer.self_attn
    d = attn.head_dim
    c, p, width = hidden.shape
    parts = [hidden.reshape(c * p, width)]
    if decoding is not None:
        b, g, _ = decoding.hidden.shape
        parts.insert(0, decoding.hidden.reshape(b * g, width))
    lead = parts[0].shape[0] if decoding is not None else 0  # decode rows come first
    flat = torch.cat(parts) if len(parts) > 1 else parts[0]
    x = layer.input_layernorm(flat)
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)

    def heads(t: torch.Tensor, lo: int, shape: tuple[int, int]) -> torch.Tensor:
        rows = shape[0] * shape[1]
        return t[lo : lo + rows].view(*shape, -1, d).transpose(1, 2)

    qp, kp, vp = (heads(t, lead, (c, p)) for t in (q, k, v))
    qp, kp = rotary(qp, kp, *rope)
    out = F.scaled_dot_product_attention(
        qp, kp, vp, is_causal=True, scale=getattr(attn, "scaling", d**-0.5), enable_gqa=True
    )
    outs = [out.transpose(1, 2).reshape(c * p, -1)]
    if decoding is not None:
        qd, kd, vd = (heads(t, 0, (b, g)) for t in (q, k, v))
        qd, kd = rotary(qd, kd, *decoding.rope)
        outs.insert(0, decoding.attend(qd, kd, vd).reshape(b * g, -1))
    h = flat + attn.o_proj(torch.cat(outs) if len(outs) > 1 else outs[0])
    h = h + layer.mlp(layer.post_attention_layernorm(h))
    dec = h[:lead].view(b, g, width) if decoding is not None else None
    return h[lead:].view(c, p, width), kp, vp, dec


def ride_step(
    forward: DecodeStep,
    cache: SharedPrefixKV,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    step: torch.Tensor,
    kv_len: int,
    rows: RiderRows,
    kept: torch.Tensor | None = None,
) -> tuple[torch.Tensor, RiddenPrefix]:
    """`DecodeStep.__call__` with `rows` riding: (decode logits [rows, V], the ride).

    A decode step of a few hundred rows reads every weight once and does little with it;
    the prefix forward reads the same weights (same version: the plan proves it, the
    dispatch checks it). So the prefix rows of one chunk are concatenated to the decode rows
    in front of every projection and MLP of every layer (chunked-prefill style); only
    attention is per part: the decode rows over the shared-prefix cache, the prefix rows
    causally over their own prompt. No autograd: the ride keeps each layer's input (what an
    activation checkpoint keeps), K/V and the last hidden state. `kept`: the decode rows'
    layer outputs, as `DecodeStep.__call__` keeps them (decode once)."""
    lm = forward.model.model.language_model
    b, g = cache.prompts, cache.group_size
    h = lm.embed_tokens(tokens).view(b, g, -1)
    rope = lm.rotary_emb(h, positions.view(1, b, g).expand(3, b, g))  # text positions
    slots = cache.slots(step)
    hp, inputs, kv = rows.embeds, [], []
    for i, layer in enumerate(lm.layers):

        def attend(q, k, v, i: int = i, layer: torch.nn.Module = layer) -> torch.Tensor:
            # as the unridden step attends: a ride leaves the decode's draws as they are
            return forward.attend(cache, i, layer, q, k, v, slots, kv_len)

        inputs.append(hp)
        if kept is not None and i:
            keep_column(kept[i - 1], step, h)
        hp, k, v, h = prefix_layer(layer, forward.rotary, hp, rows.rope, Decoding(h, rope, attend))
        kv.append((k, v))
    if kept is not None:
        keep_column(kept[-1], step, h)
    logits = forward.model.lm_head(lm.norm(h)).view(b * g, -1)
    return logits, RiddenPrefix(rows, inputs, kv, hp)


def ride_alone(model: Model, rotary: Callable, rows: RiderRows) -> RiddenPrefix:
    """The ride's computation with no decode rows (the decode had finished)."""
    h, inputs, kv = rows.embeds, [], []
    with torch.no_grad():
        for layer in model.model.language_model.layers:
            inputs.append(h)
            h, k, v, _ = prefix_layer(layer, rotary, h, rows.rope)
            kv.append((k, v))
    return RiddenPrefix(rows, inputs, kv, h, alone=True)


# a layer's row ranges for its backward's recompute (None: all rows at once)
Pieces = list[tuple[int, int]] | None


class _Replayed(torch.autograd.Function):
    """A layer whose forward already ran (in a ride): returns its outputs; the backward
    recomputes the layer from its saved input and backpropagates through it, the
    parameters' gradients accumulating as in any backward. With `pieces` (row ranges) it
    recomputes and backpropagates one range at a time, so it holds one range's
    activations: `run(x, lo, hi)` is then the layer over rows [lo, hi) of the input."""

    @staticmethod
    def forward(ctx: Any, run: Callable, pieces: Pieces, x: torch.Tensor, *outputs: torch.Tensor):
        ctx.run, ctx.pieces = run, pieces
        ctx.save_for_backward(x)
        return tuple(t.detach() for t in outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor):
        (x,) = ctx.saved_tensors
        if ctx.pieces is None:
            return (None, None, _layer_backward(ctx.run, x, grads), *(None for _ in grads))
        covered = sum(hi - lo for lo, hi in ctx.pieces) == x.shape[0]
        # rows no piece covers (prompts whose groups did not train) get no gradient
        grad_x = torch.empty_like(x) if covered else torch.zeros_like(x)
        for lo, hi in ctx.pieces:
            part = [None if g is None else g[lo:hi] for g in grads]
            run = partial(ctx.run, lo=lo, hi=hi)
            grad_x[lo:hi] = _layer_backward(run, x[lo:hi], part)
        return (None, None, grad_x, *(None for _ in grads))


def _layer_backward(
    run: Callable, x: torch.Tensor, grads: Sequence[torch.Tensor | None]
) -> torch.Tensor | None:
    """The gradient at `x` of `run(x)`'s outputs against `grads`, run again with grad (the
    parameters' gradients accumulate on the way)."""
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        outs = run(x)
        pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if g is not None]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return x.grad


def replay(run: Callable, x: torch.Tensor, *outputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`outputs`, computed already from `x` without autograd, as a differentiable function
    of `x` whose backward recomputes `run(x)` (a `_Replayed` node: a checkpointed layer
    whose forward ran elsewhere)."""
    return _Replayed.apply(run, None, x, *outputs)


def attach(
    model: Model,
    rotary: Callable,
    ridden: RiddenPrefix,
    features: torch.Tensor,
    head: bool,
    pieces: Pieces = None,
) -> PrefixState:
    """A differentiable PrefixState from a ride: a chain of `_Replayed` nodes, one a layer,
    whose forward returns what the ride computed and whose backward recomputes that layer
    from its saved input (as a checkpointed layer does). So the training step's forward
    happens inside the decode window, its backward where the plan puts it, and the
    gradients are those of the separate prefix forward up to the rounding of bigger GEMMs.
    The embeddings are recomputed with grad (a lookup and a scatter), so gradients reach
    the vision features when those carry grad. `pieces` (row ranges of the prompts): each
    layer's backward recomputes them one at a time (the trainer's micro-batches)."""
    rows = ridden.rows
    batch = rows.batch
    lm = model.model.language_model
    with torch.enable_grad():
        h = prefix_embeds(model, batch, features)
        kv = []
        ends = [*ridden.inputs[1:], ridden.hidden]
        for layer, (k, v), out in zip(lm.layers, ridden.kv, ends, strict=True):

            def run(
                x: torch.Tensor, layer: torch.nn.Module = layer, lo: int = 0, hi: int | None = None
            ) -> tuple[torch.Tensor, ...]:
                rope = rows.rope if hi is None else (rows.rope[0][lo:hi], rows.rope[1][lo:hi])
                return prefix_layer(layer, rotary, x, rope)[:3]

            h, k, v = _Replayed.apply(run, pieces, h, out, k, v)
            kv.append((k, v))
        idx = torch.arange(batch.size, device=h.device)
        last_hidden = lm.norm(h[idx, batch.lengths - 1])
        last_logits = model.lm_head(last_hidden) if head else None
    return prefix_state(batch, fork_cache(kv), rows.next_positions, last_hidden, last_logits)
