"""Per-layer prefix K/V held as given, as a prefix state's cache (`cache_kv` reads it as it
reads a DynamicCache's, which would copy the tensors in)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(slots=True, frozen=True)
class LayerKV:
    keys: torch.Tensor
    values: torch.Tensor


@dataclass(slots=True, frozen=True)
class KVRows:
    """Per-layer K/V of some prompt rows (a micro-batch's prefix K/V live until its
    backward). Read-only: a response forward attends to it, never appends."""

    layers: list[LayerKV]
    # a training prefix's PrefixPieces (prefix_pieces.py, which builds on this module):
    # the pieces' graphs behind these K/V, which `join_pieces` flattens
    pieces: Any = None


def kv_rows(kv: list[tuple[torch.Tensor, torch.Tensor]], pieces: Any) -> Any:
    """Per-layer K/V as a prefix state's cache, uncopied (typed Any: PrefixState's cache
    is a DynamicCache, and this is read through `cache_kv` only)."""
    return KVRows([LayerKV(k, v) for k, v in kv], pieces)
