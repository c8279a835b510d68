"""`Cost`: the roofline inputs of one op on one GPU, and the tensor-parallel split rules.

TP follows Megatron (heads, SwiGLU columns/rows and vocab rows split: per-GPU FLOPs and
weight bytes are totals / `tp`), except K/V heads (never below one per GPU: `kv_fraction`)
and hidden-width activations (replicated, no sequence parallelism). TP communication is
`tp_allreduce_bytes`, not part of `Cost`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollplex.specs.model import ModelSpec

LOGPROB_BYTES = 4  # fp32 per-token logprob (or int32 token id) an op hands on
FP32 = 4


@dataclass(slots=True, frozen=True)
class Cost:
    """What one op costs on one GPU. Bytes are HBM traffic or residency, per GPU."""

    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    weight_bytes: float = 0.0  # part of bytes_read that reads weights (shareable by piggybacking)
    persistent_bytes: float = 0.0  # outputs that outlive the op
    transient_bytes: float = 0.0  # peak scratch inside the op, freed at its end

    def __post_init__(self) -> None:
        # Fast path (a plan builds millions of Costs): every field finite and >= 0 (NaN
        # fails both comparisons); the loop below names the first field that is not.
        if (
            0 <= self.flops < math.inf
            and 0 <= self.bytes_read < math.inf
            and 0 <= self.bytes_written < math.inf
            and 0 <= self.weight_bytes < math.inf
            and 0 <= self.persistent_bytes < math.inf
            and 0 <= self.transient_bytes < math.inf
            and self.weight_bytes <= self.bytes_read * (1 + 1e-9)
        ):
            return
        for name in self.__slots__:
            value = getattr(self, name)
            if not value >= 0 or math.isinf(value):  # also rejects NaN
                raise ValueError(f"Cost.{name} must be finite and >= 0, got {value}")
        if self.weight_bytes > self.bytes_read * (1 + 1e-9):
            raise ValueError("Cost.weight_bytes is part of bytes_read and cannot exceed it")

    def __add__(self, other: Cost) -> Cost:
        """Ops run one after another: work and outputs add up, scratch peaks at the larger."""
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(
            flops=self.flops + other.flops,
            bytes_read=self.bytes_read + other.bytes_read,
            bytes_written=self.bytes_written + other.bytes_written,
            weight_bytes=self.weight_bytes + other.weight_bytes,
            persistent_bytes=self.persistent_bytes + other.persistent_bytes,
            transient_bytes=max(self.transient_bytes, other.transient_bytes),
        )

    def __radd__(self, other: object) -> Cost:
        if other == 0:  # lets sum(costs) start from 0
            return self
        return NotImplemented

    def scaled(self, k: float) -> Cost:
        """`k` runs of this op one after another (`x.scaled(2) == x + x`); scratch is reused."""
        if k < 0:
            raise ValueError(f"scale must be >= 0, got {k}")
        return Cost(
            flops=self.flops * k,
            bytes_read=self.bytes_read * k,
            bytes_written=self.bytes_written * k,
            weight_bytes=self.weight_bytes * k,
            persistent_bytes=self.persistent_bytes * k,
            transient_bytes=self.transient_bytes if k > 0 else 0.0,
        )

    @property
    def bytes(self) -> float:
        """All HBM traffic: reads plus writes."""
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte of traffic (inf for traffic-free compute)."""
        if self.bytes == 0:
            return math.inf if self.flops > 0 else 0.0
        return self.flops / self.bytes


def check_tp(tp: int) -> None:
    if tp < 1 or int(tp) != tp:
        raise ValueError(f"tp must be a positive integer, got {tp}")


def kv_fraction(num_kv_heads: int, tp: int) -> float:
    """Share of the KV heads one GPU holds: 1/tp, but never less than one head."""
    check_tp(tp)
    return max(1 / tp, 1 / num_kv_heads)


def tp_allreduce_bytes(model: ModelSpec, tokens: float, tp: int, *, vision: bool = False) -> float:
    """Bytes each GPU sends for one forward's TP all-reduces (ring: 2(tp-1)/tp of the data).

    Two all-reduces of the hidden state per layer (after attention and after the MLP); a
    backward moves the same again. Zero without TP.
    """
    check_tp(tp)
    if vision:
        width, layers = model.vision.hidden_size, model.vision.depth
    else:
        width, layers = model.hidden_size, model.num_layers
    return 2 * layers * tokens * width * model.dtype_bytes * 2 * (tp - 1) / tp
