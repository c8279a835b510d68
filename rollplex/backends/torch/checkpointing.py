"""Activation checkpointing of the LLM's decoder layers: inside `checkpointed_layers`,
each layer run with grad keeps only its input and is recomputed in its backward.

A layer writes the prefix forward's KV cache as it runs; its recompute must see the K/V
the cache held before that forward, and must not write it again (`_ReplayCache`), which
transformers' own gradient checkpointing does not do (it drops a cache that layers write).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from rollplex.backends.torch.activations import SavedActivations
from rollplex.engine.prefix import Model


class _ReplayCache:
    """What a recomputed layer's attention sees in place of the cache: the K/V it held
    before the original forward, extended the way DynamicLayer.update extends it, and
    never written (transformers' own checkpointing drops a cache that layers write)."""

    def __init__(self, before: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        self.before = before

    def update(self, keys: torch.Tensor, values: torch.Tensor, *_: Any, **__: Any):
        if self.before is None:
            empty = torch.tensor([], dtype=keys.dtype, device=keys.device)
            return torch.cat([empty, keys], -2), torch.cat([empty, values], -2)
        k, v = self.before
        return torch.cat([k, keys], -2), torch.cat([v, values], -2)


_CACHE_KWARGS = ("past_key_values", "cache")  # transformers renamed it after 5.19


def _layer_kv(cache: Any, idx: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    layers = getattr(cache, "layers", None)
    if layers is None or idx >= len(layers) or not getattr(layers[idx], "is_initialized", False):
        return None
    return layers[idx].keys, layers[idx].values


def _checkpointed(
    inner: Any, idx: int, saved: SavedActivations, *args: Any, **kwargs: Any
) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return inner(*args, **kwargs)
    hidden = args[0] if args else kwargs.pop("hidden_states")
    rest = args[1:]
    key = next((k for k in _CACHE_KWARGS if kwargs.get(k) is not None), None)
    before = _layer_kv(kwargs[key], idx) if key else None
    calls = []

    def run(h: torch.Tensor) -> torch.Tensor:
        if not calls or key is None:  # the forward itself writes the cache
            calls.append(1)
            return inner(h, *rest, **kwargs)
        return inner(h, *rest, **{**kwargs, key: _ReplayCache(before)})

    saved.saved.append(hidden)  # what the checkpoint keeps: the layer's input
    # A decoder layer draws no random numbers (no dropout): no RNG state to save per call.
    return checkpoint(run, hidden, use_reentrant=False, preserve_rng_state=False)


@contextmanager
def checkpointed_layers(model: Model, saved: SavedActivations) -> Iterator[None]:
    """Inside the block, each LLM decoder layer run with grad keeps only its input (added
    to `saved`, for the runtime's accounting) and is recomputed in its backward."""
    wrapped = []
    for layer in model.model.language_model.layers:
        if "forward" in vars(layer):  # already checkpointed by an enclosing block
            continue
        idx = layer.self_attn.layer_idx
        layer.forward = partial(_checkpointed, layer.forward, idx, saved)
        wrapped.append(layer)
    try:
        yield
    finally:
        for layer in wrapped:
            del layer.forward
