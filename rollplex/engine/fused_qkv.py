"""The decode engine's q/k/v projections stacked into one weight per layer (one GEMM)."""

from __future__ import annotations

import torch


class FusedQKV:
    """Each decoder layer's q, k and v projection weights (and biases) stacked into one
    [q + 2 kv, hidden] matrix, so a decode step runs one GEMM where it ran three. At a
    decode step's few rows the narrow k/v GEMMs ran split-K kernels at about a third of
    HBM bandwidth (bench/results/gpu_decode/compiled.md).

    It is a copy, refreshed from the modules at every decode session's start (~1 GB at
    the 7B shape, about half a millisecond on an H200), not a view the parameters are rebound to:
    the trainer's parameters keep their own storage, which module.to, FSDP2 and
    safetensors assume. The planner prices it with the engine's workspace
    (ops/formulas/engines.py torch_engine_fused_qkv)."""

    def __init__(self, layers: torch.nn.ModuleList) -> None:
        self.layers = layers
        attn = layers[0].self_attn
        self.widths = tuple(p.weight.shape[0] for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        self.weights: list[torch.Tensor] = []
        self.biases: list[torch.Tensor | None] = []

    def _projections(self, layer: torch.nn.Module) -> tuple[torch.nn.Linear, ...]:
        attn = layer.self_attn
        return attn.q_proj, attn.k_proj, attn.v_proj

    def refresh(self) -> None:
        """Copy the modules' current q/k/v weights in; (re)allocate when their dtype,
        device or bias presence changed, which gives the stacked tensors new addresses
        (`addresses`, which the engine's graphs check)."""
        first = self._projections(self.layers[0])[0].weight
        stale = not self.weights or (
            self.weights[0].dtype != first.dtype or self.weights[0].device != first.device
        )
        with torch.no_grad():
            if stale:
                self.weights = [
                    torch.cat([p.weight for p in self._projections(layer)]) for layer in self.layers
                ]
                self.biases = [self._bias(layer) for layer in self.layers]
                return
            for layer, w, b in zip(self.layers, self.weights, self.biases, strict=True):
                torch.cat([p.weight for p in self._projections(layer)], out=w)
                if b is not None:
                    b.copy_(self._bias(layer))

    def _bias(self, layer: torch.nn.Module) -> torch.Tensor | None:
        projections = self._projections(layer)
        if all(p.bias is None for p in projections):
            return None
        parts = [
            p.weight.new_zeros(p.weight.shape[0]) if p.bias is None else p.bias for p in projections
        ]
        return torch.cat(parts)

    def tensors(self) -> list[torch.Tensor]:
        return [*self.weights, *(b for b in self.biases if b is not None)]

    def addresses(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for t in self.tensors())
