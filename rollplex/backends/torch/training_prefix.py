"""The training prefix with grad, as pieces (prefix_pieces.py): its own forward, each
decoder layer checkpointed (over the live prompts only, where it is given the advantages),
or the forward a ride or an export already ran, attached. The policy's trainer and PPO's
critic both train theirs so."""

from __future__ import annotations

import torch

from rollplex.backends.torch.checkpointing import checkpointed_layers
from rollplex.backends.torch.prefix_pieces import as_pieces, cut_features, join_pieces
from rollplex.backends.torch.roles import capture_saved
from rollplex.backends.torch.row_ranges import skipping_ranges
from rollplex.backends.torch.values import Features, SavedActivations
from rollplex.data.prompts import PromptBatch
from rollplex.engine.prefix import (
    Model,
    PrefixState,
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
    saved = SavedActivations()
    visual, upstream = cut_features(features)
    with capture_saved(saved), checkpointed_layers(model, saved):
        state = prefix_forward(model, text, visual, grad=True, head=head)
    return as_pieces(state, upstream), saved


def live_prefix_with_grad(
    model: Model, features: Features, text: PromptBatch, head: bool, live: list[bool]
) -> tuple[PrefixState, SavedActivations]:
    """`prefix_with_grad` over the prompts `live` marks, each contiguous run of them a
    piece of its own; the others' rows are `unread_prefix` (no forward, no graph, nothing
    saved), joined in row order."""
    if all(live):
        return prefix_with_grad(model, features.values, text, head)
    parts, saved = [], []
    for lo, hi, trained in skipping_ranges(text.size, 1, live):
        rows = text.select(lo, hi)
        if trained:
            state, kept = prefix_with_grad(model, features.select(lo, hi).values, rows, head)
            parts.append(state)
            saved.append(kept)
        else:
            parts.append(as_pieces(unread_prefix(model, rows, head)))
    return join_pieces(parts), SavedActivations.merge(saved)


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
