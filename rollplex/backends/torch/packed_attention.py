"""Causal attention over packed per-sample sequences (verl's full forward, packed).

verl's full forward runs [prefix_i ; response_i] per sample; packed (packed_rows.py), its
norms, projections and MLP run on the samples' real tokens only, as verl's
`use_remove_padding` runs them. Attention unpacks q/k/v to the padded [rows, width] layout
and attends causally: rows are right-padded, so a real query sees real keys only (a padded
key follows every real query of its row), and what padded queries compute is dropped when
the output is packed again. No [rows, width, width] mask is built or kept. It reaches
transformers as a `PackedCausal` attention mask, routed by shared_prefix_attention.py's
dispatcher (`use_shared_prefix`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rollplex.backends.torch.packed_rows import PackedRows


@dataclass(slots=True, eq=False)
class PackedCausal:
    """The decoder's attention mask for packed right-padded rows: where the real tokens are."""

    packing: PackedRows

    @classmethod
    def of(cls, valid: torch.Tensor) -> PackedCausal:
        """For right-padded rows whose real tokens are `valid` [rows, width] (a prefix of
        each row: checked, since causal attention alone masks nothing else)."""
        width = valid.shape[1]
        lengths = valid.sum(1, keepdim=True)
        if not bool((valid == (torch.arange(width, device=valid.device) < lengths)).all()):
            raise ValueError("packed causal attention needs right-padded rows")
        return cls(PackedRows.of(valid))

    def masks(self) -> dict[str, PackedCausal]:
        """The decoder's `attention_mask` argument, keyed by layer type (as SharedPrefix)."""
        return {"full_attention": self, "sliding_attention": self}


def packed_causal_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: PackedCausal,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract on packed rows: q [1, H, T, D] and k/v
    [1, Hkv, T, D] in, [1, T, H, D] out."""
    if dropout or sliding_window:
        raise ValueError(
            "packed causal attention has no dropout or sliding window "
            f"(attention_dropout={dropout}, sliding_window={sliding_window})"
        )
    packing = attention_mask.packing
    q, k, v = (packing.unpack(x.transpose(1, 2)).transpose(1, 2) for x in (query, key, value))
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=scaling, enable_gqa=True
    )
    return packing.pack(out.transpose(1, 2)), None
