"""The rollout's prefill, exported as the training prefix forward (prefill_once).

The prefill keeps each layer's input and the prefix K/V (`ExportedPrefix`, taken by hooks,
so decode sees its usual state); the trainer `attach`es it, one replayed node per layer
whose backward recomputes that layer, so no second prefix forward runs and the gradients are
the checkpointed forward's. The export carries its weights version; a moved trainer refuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from rollplex.data.prompts import PromptBatch
from rollplex.engine.prefix import Model, PrefixState, cache_kv, prefix_forward
from rollplex.engine.riders import RiddenPrefix, RiderRows, rider_rows


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
        yield from r.rows.rope  # what each layer's recompute reads besides

    def moved(self, move: Callable[[Any], Any]) -> ExportedPrefix:
        """A copy whose values went through `move` (to host across the decode, and back
        before the attach, where the plan parks it). A tensor held in two places moves
        once and stays one tensor."""
        r = self.ridden
        if r is None:
            return ExportedPrefix(None, self.version)
        done: dict[int, Any] = {}

        def once(x: Any) -> Any:
            if id(x) not in done:
                done[id(x)] = move(x)
            return done[id(x)]

        rows = r.rows
        rows = RiderRows(
            once(rows.batch),
            once(rows.embeds),
            (once(rows.rope[0]), once(rows.rope[1])),
            once(rows.next_positions),
        )
        kv = [(once(k), once(v)) for k, v in r.kv]
        ridden = RiddenPrefix(rows, [once(x) for x in r.inputs], kv, once(r.hidden), r.alone)
        return ExportedPrefix(ridden, self.version)

    def release(self) -> None:
        """The plan frees it after the backward; the autograd graph holds what it needs."""
        self.ridden = None


def prefill_exported(
    model: Model, features: torch.Tensor, batch: PromptBatch, version: str, head: bool = True
) -> tuple[PrefixState, ExportedPrefix]:
    """(the decode's prefix state, the export) from one prefill over `batch`'s prompts with
    visual `features`, without autograd. The prefill is the rollout's own (`prefix_forward`,
    transformers' layers and attention kernels): hooks keep each decoder layer's input and
    the final norm's; the K/V are the cache's own tensors (the decode extends the cache by
    concatenation, so they stay as the prefill left them)."""
    lm = model.model.language_model
    inputs: list[torch.Tensor] = []
    last: list[torch.Tensor] = []

    def layer_input(_module, args, kwargs) -> None:
        inputs.append(args[0] if args else kwargs["hidden_states"])

    hooks = [layer.register_forward_pre_hook(layer_input, with_kwargs=True) for layer in lm.layers]
    hooks.append(lm.norm.register_forward_pre_hook(lambda _m, args: last.append(args[0])))
    try:
        state = prefix_forward(model, batch, features, grad=False, head=head)
    finally:
        for h in hooks:
            h.remove()
    if len(inputs) != len(lm.layers) or len(last) != 1:
        raise RuntimeError(f"prefill saw {len(inputs)} layer inputs, {len(last)} final norms")
    # rotary and mask for the recompute; the embeddings are the first layer's input (one
    # tensor: a second [prompts, prefix, hidden] copy would live until the backward)
    rows = rider_rows(model, batch, features.detach(), embeds=inputs[0])
    ridden = RiddenPrefix(rows, inputs, list(cache_kv(state.cache)), last[0])
    return state, ExportedPrefix(ridden, version)
