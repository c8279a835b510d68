"""The training prefix with grad, as pieces (prefix_pieces.py): its own forward, each
decoder layer checkpointed (over the live prompts only, where it is given the advantages),
or the forward a ride or an export already ran, attached. The policy's trainer and PPO's
critic both train theirs so."""

from __future__ import annotations

from typing import Any

import torch

from rollplex.backends.torch.activations import SavedActivations
from rollplex.backends.torch.checkpointing import checkpointed_layers
from rollplex.backends.torch.prefix_pieces import as_pieces, cut_features
from rollplex.backends.torch.roles import capture_saved, feature_tokens, features_of
from rollplex.backends.torch.row_ranges import skipping_ranges
from rollplex.backends.torch.values import Features, Pixels
from rollplex.data.prompts import PromptBatch
from rollplex.engine.prefix import (
    Model,
    PrefixState,
    cache_kv,
    fork_cache,
    prefix_forward,
    prefix_positions,
    prefix_state,
)
from rollplex.engine.riders import RiddenPrefix, attach
from rollplex.engine.step import rotary_fn
from rollplex.ops.micro_batches import micro_ranges


def prefix_with_grad(
    model: Model, features: torch.Tensor, text: PromptBatch, head: bool
) -> tuple[PrefixState, SavedActivations]:
    """The prefix forward with grad over `text`'s rows, as one piece, and what it keeps."""
    state, upstream, saved = _forward_with_grad(model, features, text, head)
    return as_pieces(state, upstream), saved


def _forward_with_grad(
    model: Model, features: torch.Tensor, text: PromptBatch, head: bool
) -> tuple[PrefixState, list, SavedActivations]:
    """(the prefix forward with grad, the features' upstream edges, its checkpointed
    layers' inputs)."""
    saved = SavedActivations()
    visual, upstream = cut_features(features)
    with capture_saved(saved), checkpointed_layers(model, saved):
        state = prefix_forward(model, text, visual, grad=True, head=head)
    return state, upstream, saved


def live_prefix_with_grad(
    model: Model, features: Features, text: PromptBatch, head: bool, live: list[bool]
) -> tuple[PrefixState, SavedActivations]:
    """`prefix_with_grad` over the prompts `live` marks, in one forward, its outputs
    scattered into their rows of the whole batch's (`_ScatterRows`); the other rows hold
    zeros that nothing reads and no graph (`unread_prefix`)."""
    if all(live):
        return prefix_with_grad(model, features.values, text, head)
    rows = [i for i, alive in enumerate(live) if alive]
    if not rows:
        return as_pieces(unread_prefix(model, text, head)), SavedActivations()
    values = features.take(rows).values
    state, upstream, saved = _forward_with_grad(model, values, text.take(rows), head)
    index = torch.tensor(rows, device=values.device)

    def scatter(t: torch.Tensor) -> torch.Tensor:
        return _ScatterRows.apply(t, index, text.size)

    kv = [(scatter(k), scatter(v)) for k, v in cache_kv(state.cache)]
    last = scatter(state.last_logits if head else state.last_hidden)
    logits, hidden = (last, None) if head else (None, last)
    _, following = prefix_positions(model, text)
    whole = prefix_state(text, fork_cache(kv), following, hidden, logits)
    return as_pieces(whole, upstream), saved


def live_features(model: Model, pixels: Pixels, live: list[bool]) -> Features:
    """`features_of` over the prompts `live` marks, in one tower call, scattered into their
    rows of the whole batch's; the others' are zeros that nothing reads (their prefix does
    not run: `live_prefix_with_grad`)."""
    if all(live):
        return features_of(model, pixels)
    tokens = feature_tokens(model, pixels)
    rows = [i for i, alive in enumerate(live) if alive]
    if not rows:
        width = model.config.vision_config.out_hidden_size
        return Features(model.lm_head.weight.new_zeros(sum(tokens), width), tokens)
    encoded = features_of(model, pixels.take(rows)).values
    spans = [(sum(tokens[:r]), sum(tokens[: r + 1])) for r in rows]
    index = torch.cat([torch.arange(a, b, device=encoded.device) for a, b in spans])
    return Features(_ScatterRows.apply(encoded, index, sum(tokens)), tokens)


class _ScatterRows(torch.autograd.Function):
    """`x`'s rows at `index` of `rows` zero rows, whose backward keeps the index alone
    (autograd's index_copy keeps its source too: a copy of the live prompts' K/V)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
        ctx.save_for_backward(index)
        return x.new_zeros((rows, *x.shape[1:])).index_copy_(0, index, x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        return grad.index_select(0, index), None, None


def unread_prefix(model: Model, batch: PromptBatch, head: bool) -> PrefixState:
    """The prefix state of prompts whose groups train no row, which nothing reads (the
    response forward skips their groups): zeros for their K/V and last logits (or hidden
    state), positions as their forward's."""
    _, following = prefix_positions(model, batch)
    attn = model.model.language_model.layers[0].self_attn
    n, p = batch.input_ids.shape
    weight = model.lm_head.weight
    kv_shape = (n, attn.config.num_key_value_heads, p, attn.head_dim)
    kv = [
        (weight.new_zeros(kv_shape), weight.new_zeros(kv_shape))
        for _ in model.model.language_model.layers
    ]
    last_hidden = weight.new_zeros(n, weight.shape[1])
    logits = weight.new_zeros(n, weight.shape[0]) if head else None
    return prefix_state(batch, fork_cache(kv), following, last_hidden, logits)


def attached_with_grad(
    model: Model,
    ridden: RiddenPrefix,
    features: torch.Tensor,
    head: bool,
    micro_batches: int,
    live: list[bool] | None = None,
) -> tuple[PrefixState, SavedActivations]:
    """`prefix_with_grad`'s result from a ride or an export: its backward recomputes each
    layer from the input the ride kept, in `micro_batches` ranges of its rows; with `live`
    (per prompt), only the live prompts', cut as the response micro-batches cut them
    (`skipping_ranges`): a dead prompt's rows get no gradient, so nothing replays them."""
    rotary = rotary_fn(model.model.language_model.layers[0].self_attn)
    visual, upstream = cut_features(features)
    rows = ridden.rows.batch.size
    if live is None:
        pieces = micro_ranges(rows, micro_batches)
    else:
        pieces = [(lo, hi) for lo, hi, t in skipping_ranges(rows, micro_batches, live) if t]
    with capture_saved() as saved:  # the layer inputs the replay keeps, and the rest
        state = attach(model, rotary, ridden, visual, head, pieces)
    return as_pieces(state, upstream), saved
