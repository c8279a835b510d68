"""The training prefix with grad, as pieces (prefix_pieces.py): its own forward, each
decoder layer checkpointed, or the forward a ride or an export already ran, attached. The
policy's trainer and PPO's critic both train theirs so."""

from __future__ import annotations

import torch

from rollplex.backends.torch.checkpointing import checkpointed_layers
from rollplex.backends.torch.prefix_pieces import as_pieces, cut_features
from rollplex.backends.torch.roles import capture_saved
from rollplex.backends.torch.row_ranges import skipping_ranges
from rollplex.backends.torch.values import SavedActivations
from rollplex.data.prompts import PromptBatch
from rollplex.engine.prefix import Model, PrefixState, prefix_forward
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
