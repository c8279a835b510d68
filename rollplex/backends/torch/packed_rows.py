"""Right-padded response rows [N, W] as one packed sequence of their real tokens [1, T].

A response forward pays every column it runs: rows padded to their longest (a long-tailed
step's longest is about twice its mean) spend most of the norms', projections' and MLP's
GEMMs on padding. Packed, those run on the T real tokens only; attention alone unpacks to
the padded layout it masks (shared_prefix_attention.py), a small share of the FLOPs. The
same removal as verl's `use_remove_padding`; exact, since every op but attention is per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True, eq=False)
class PackedRows:
    """Where the real tokens of a [rows, width] layout lie, in row-major order."""

    rows: int
    width: int
    index: torch.Tensor  # [T] flat positions (row * width + column) of the real tokens

    @classmethod
    def of(cls, valid: torch.Tensor) -> PackedRows:
        """The packing of `valid` [rows, width] (True on a row's real tokens)."""
        rows, width = valid.shape
        return cls(rows, width, valid.reshape(-1).nonzero().squeeze(1))

    @property
    def tokens(self) -> int:
        return int(self.index.shape[0])

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, width, ...] -> [1, T, ...]: the real tokens' entries (differentiable)."""
        return x.reshape(self.rows * self.width, *x.shape[2:]).index_select(0, self.index)[None]

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[1, T, ...] -> [rows, width, ...], zeros at the padding (differentiable)."""
        return _Unpack.apply(x, self.index, self.rows, self.width)


class _Unpack(torch.autograd.Function):
    """Scatter into zeros whose backward keeps the index alone: autograd's index_copy keeps
    its source too, a [T, H] copy of every unpacked activation until the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor, rows: int, width: int):
        ctx.save_for_backward(index)
        flat = x.new_zeros((rows * width, *x.shape[2:]))
        return flat.index_copy_(0, index, x[0]).view(rows, width, *x.shape[2:])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        flat = grad.reshape(-1, *grad.shape[2:])
        return flat.index_select(0, index)[None], None, None, None
