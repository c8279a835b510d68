"""A static K/V cache that stores each prompt's prefix once for its G rows
(`SharedPrefixKV`); under attention="split" each row's responses sit apart (`RowResponses`)."""

from __future__ import annotations

import torch

from rollplex.engine.flex import BLOCK, FlexMask
from rollplex.ops.formulas.engines import ENGINE_MASK_ALIGN, EngineAttention

Attention = EngineAttention
ALIGN = ENGINE_MASK_ALIGN  # SDPA's memory-efficient kernel wants the mask's rows aligned


def round_up(x: int, to: int) -> int:
    return -(-x // to) * to


class RowResponses:
    """Under "split": each row's own response K/V per layer, [prompts, kv_heads, G,
    steps, head_dim], the step written at its index; the prompts' valid prefix lengths
    and the step attended at (device tensors, so a captured graph replays them)."""

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        prompts: int,
        group_size: int,
        steps: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (prompts, kv_heads, group_size, steps, head_dim)
        self.steps = steps
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.prefix_lengths = torch.zeros(prompts, dtype=torch.long, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)

    def tensors(self) -> list[torch.Tensor]:
        return [*self.keys, *self.values, self.prefix_lengths, self.step]


class SharedPrefixKV:
    """The static buffers of one (prompts, G, prefix_cap, response slots) shape.

    Per layer one buffer [prompts, kv_heads, length, head_dim] in the model's dtype: a
    prompt's prefix K/V in [0, prefix_cap) (right-padded, pads masked), then its G rows'
    response K/V step-major, row g's token at step s at `prefix_cap + s * G + g`. So the
    prefix is stored and read once per prompt; a group is one SDPA call (the prompt as the
    batch, G rows x query heads of a K/V head as the query length), no K/V repeated over
    the group or the GQA heads; and step s's entries end at `prefix_cap + (s + 1) * G`, so
    `kv_len` slices off the slots no row has written yet.

    "sdpa" reads an additive mask [prompts, 1, rep * G, length]: query row r * G + g sees
    the prompt's valid prefix and row g's own slots, opened one slot per row each step
    (`open_step`, in place, so a captured graph replays it). Masked entries hold finfo.min,
    not -inf: a padding prompt with no valid key averages finite values instead of NaN.
    "flex" keeps a BlockMask of the same visibility (flex.py), opened the same way.
    "split" keeps only the prefix here ([prompts, kv_heads, prefix_cap, head_dim]) and each
    row's responses in `RowResponses`; its attention needs no mask tensor."""

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        q_per_kv: int,
        prompts: int,
        group_size: int,
        prefix_cap: int,
        response_slots: int,
        dtype: torch.dtype,
        device: torch.device,
        attention: Attention = "sdpa",
    ) -> None:
        if prefix_cap % ALIGN:
            raise ValueError(f"prefix_cap={prefix_cap} must be a multiple of {ALIGN}")
        self.prompts, self.group_size, self.prefix_cap = prompts, group_size, prefix_cap
        self.attention = attention
        if attention == "split":  # the prefix only; responses in `split`
            self.length = prefix_cap
        else:
            align = BLOCK if attention == "flex" else ALIGN
            self.length = round_up(prefix_cap + group_size * response_slots, align)
        shape = (prompts, kv_heads, self.length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.blocked = torch.finfo(dtype).min
        self.flex: FlexMask | None = None
        self.mask: torch.Tensor | None = None
        self.split: RowResponses | None = None
        self._aux: list[torch.Tensor] = []
        if attention == "split":
            self.split = RowResponses(
                layers, kv_heads, head_dim, prompts, group_size, response_slots, dtype, device
            )
            return
        self._group = torch.arange(group_size, device=device)
        if attention == "flex":
            self.flex = FlexMask(prompts, group_size, prefix_cap, self.length, device)
            self._aux = [self._group]
            return
        q = q_per_kv * group_size
        self.mask = torch.full(
            (prompts, 1, q, self.length), self.blocked, dtype=dtype, device=device
        )
        self._query_row = torch.arange(q, device=device) % group_size  # query r*G+g -> row g
        # index_put_ of a Python scalar copies a host tensor in: not allowed in a CUDA graph
        self._open = torch.zeros((), dtype=dtype, device=device)
        self._aux = [self._group, self._query_row, self._open]

    def load(self, kv: list[tuple[torch.Tensor, torch.Tensor]], lengths: torch.Tensor) -> None:
        """Copy each prompt's prefix K/V [B, kv_heads, P, head_dim] in (B <= prompts, P <=
        prefix_cap) and reset the mask to its valid prefix positions (`lengths` [B])."""
        b, p = kv[0][0].shape[0], kv[0][0].shape[2]
        if b > self.prompts or p > self.prefix_cap:
            raise ValueError(f"prefix of {b} prompts x {p} tokens exceeds the cache's shape")
        for (k, v), kb, vb in zip(kv, self.keys, self.values, strict=True):
            kb[:b, :, :p].copy_(k)
            vb[:b, :, :p].copy_(v)
        if self.flex is not None:
            self.flex.load(lengths)
            return
        if self.split is not None:
            self.split.prefix_lengths.zero_()  # padding prompts: no valid prefix key
            self.split.prefix_lengths[:b] = lengths.to(self.split.prefix_lengths.device)
            return
        self.mask.fill_(self.blocked)
        valid = torch.arange(p, device=lengths.device)[None, :] < lengths[:, None]
        prefix = self.mask[:b, :, :, :p]
        prefix.masked_fill_(valid.to(self.mask.device)[:, None, None, :], 0.0)

    def slots(self, step: torch.Tensor) -> torch.Tensor:
        """[G] buffer positions the rows write at response step `step` (a device tensor);
        under "split", the step's index [1] in every row's own buffer."""
        if self.split is not None:
            return step.reshape(1)
        return self.prefix_cap + step * self.group_size + self._group

    def open_step(self, step: torch.Tensor) -> None:
        """Let each row see its own slot of response step `step`."""
        if self.flex is not None:
            self.flex.open_through(step)
            return
        if self.split is not None:
            self.split.step.copy_(step.reshape(()))
            return
        cols = self.prefix_cap + step * self.group_size + self._query_row
        rows = torch.arange(self._query_row.shape[0], device=cols.device)
        self.mask[:, 0, rows, cols] = self._open

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """K/V [prompts, kv_heads, G, head_dim] of one step into `slots`."""
        if self.split is not None:
            self.split.keys[layer].index_copy_(3, slots, k.unsqueeze(3))
            self.split.values[layer].index_copy_(3, slots, v.unsqueeze(3))
            return
        self.keys[layer].index_copy_(2, slots, k)
        self.values[layer].index_copy_(2, slots, v)

    def kv_len(self, steps_written: int) -> int:
        """Buffer length covering the slots of response steps [0, steps_written); the whole
        buffer under flex, whose BlockMask skips the unwritten blocks instead; under
        "split", the response steps each row's buffer is read over."""
        if self.split is not None:
            return min(self.split.steps, steps_written)
        if self.flex is not None:
            return self.length
        return min(self.length, round_up(self.prefix_cap + steps_written * self.group_size, ALIGN))

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the cache allocates (ops/formulas/engines.py prices them)."""
        mine = [self.mask] if self.mask is not None else []
        mine += self.flex.tensors() if self.flex is not None else []
        mine += self.split.tensors() if self.split is not None else []
        return [*self.keys, *self.values, *mine, *self._aux]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())
