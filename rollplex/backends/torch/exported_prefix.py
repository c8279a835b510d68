"""The rollout's prefill, exported as the training prefix forward (prefill_once).

On-policy, the first update's training prefix forward runs the rollout's weights version
over the rollout's tokens. With every decoder layer checkpointed, its backward needs each
layer's input and the prefix K/V; the prefill computes those. So the prefill runs the
layer function the rides use (`engine/riders.py`: `prefix_layer`, no autograd) and keeps
them: `ExportedPrefix`. The decode reads a copy of its K/V; the trainer `attach`es the
export (one `_Replayed` node a layer, whose backward recomputes that layer from its kept
input and backpropagates through it), so no second prefix forward runs and the gradients
are those of the separate checkpointed forward (tests/backends/torch/test_prefill_once.py).

The export carries the weights version that computed it: the runtime refuses to attach it
to a trainer whose weights have moved on (runtime/dispatch.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from rollplex.backends.torch.engine.riders import RiddenPrefix, ride_alone, rider_rows
from rollplex.backends.torch.engine.step import rotary_fn
from rollplex.backends.torch.prefix import Model, PrefixState, fork_cache, prefix_state
from rollplex.data.prompts import PromptBatch


@dataclass(slots=True)
class ExportedPrefix:
    """What a prefill hands the trainer: each layer's input and K/V, the last layer's
    output (`ridden`), and the weights version that computed them."""

    ridden: RiddenPrefix | None
    version: str

    def tensors(self) -> Iterator[torch.Tensor]:
        r = self.ridden
        if r is None:
            return
        yield from r.inputs  # inputs[0] is the rows' embeddings
        for k, v in r.kv:
            yield from (k, v)
        yield r.hidden
        yield from (*r.rows.rope, r.rows.mask)  # what each layer's recompute reads besides

    def release(self) -> None:
        """The plan frees it after the backward; the autograd graph holds what it needs."""
        self.ridden = None


def prefill_exported(
    model: Model, features: torch.Tensor, batch: PromptBatch, version: str, head: bool = True
) -> tuple[PrefixState, ExportedPrefix]:
    """(the decode's prefix state, the export) from one prefill over `batch`'s prompts with
    visual `features`, without autograd."""
    rows = rider_rows(model, batch, features.detach())
    ridden = ride_alone(model, rotary_fn(model.model.language_model.layers[0].self_attn), rows)
    with torch.no_grad():
        idx = torch.arange(batch.size, device=ridden.hidden.device)
        last_hidden = model.model.language_model.norm(ridden.hidden[idx, batch.lengths - 1])
        last_logits = model.lm_head(last_hidden) if head else None
        cache = fork_cache([(k, v) for k, v in ridden.kv])  # the decode's own copy
    state = prefix_state(batch, cache, rows.next_positions, last_hidden, last_logits)
    return state, ExportedPrefix(ridden, version)
