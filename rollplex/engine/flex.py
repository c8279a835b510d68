"""Split-KV decode attention over the shared-prefix cache with torch's FlexAttention
(attention="flex"): a static BlockMask of the cache's visibility, so one CUDA graph serves
every step. An option, not the default (bench/results/gpu_decode/)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from rollplex.ops.formulas.engines import ENGINE_FLEX_BLOCK

BLOCK = ENGINE_FLEX_BLOCK  # FlexAttention's KV block: the cache length is a multiple of it

_compiled: Callable | None = None


def flex_call() -> Callable:
    """flex_attention, compiled once per process (static shapes; raised recompile limit
    since each workspace shape, one per row bucket and model, compiles its own kernel)."""
    global _compiled
    if _compiled is None:
        import torch._dynamo

        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, 64)
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 1024)
        _compiled = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    return _compiled


class FlexMask:
    """The BlockMask of one cache shape, updated in place.

    SDPA runs a decode step over this layout on one query block per (prompt, K/V head), a
    handful of thread blocks at 8 rows; FlexAttention's decoding kernel splits the keys
    across the SMs (flash-decoding), packs a K/V head's query heads into one tile, and skips
    the blocks its BlockMask leaves out without reading them. Row g of prompt b sees the
    prompt's valid prefix and its own response slots written so far. A prefix block all of
    whose keys are valid is *full* (no mask evaluated); the prefix's last block and the
    response blocks are *partial* (`mask_mod` per element); the padding between is skipped.
    `load` rewrites the block lists for new prompts, and `open_through` (inside a captured
    step) truncates each prompt's partial list to the blocks written so far. Measured on an
    H200 it beats cuDNN SDPA at the 3B shape's small batches and loses at 7B and at 256 rows.
    """

    def __init__(
        self,
        prompts: int,
        group_size: int,
        prefix_cap: int,
        length: int,
        device: torch.device,
    ) -> None:
        if length % BLOCK:
            raise ValueError(f"cache length {length} must be a multiple of {BLOCK}")
        self.group_size, self.prefix_cap, self.length = group_size, prefix_cap, length
        blocks = length // BLOCK
        i32 = dict(dtype=torch.int32, device=device)
        self.prefix_lengths = torch.zeros(prompts, dtype=torch.long, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)  # last step written
        self._partial = torch.zeros((prompts, 1, 1, blocks), **i32)  # candidate partial blocks
        self._partial_count = torch.zeros((prompts, 1, 1), **i32)  # all of them (steps left)
        self._block = torch.arange(blocks, device=device)
        self.mask = BlockMask.from_kv_blocks(
            torch.zeros((prompts, 1, 1), **i32),
            torch.zeros((prompts, 1, 1, blocks), **i32),
            torch.zeros((prompts, 1, 1), **i32),
            torch.zeros((prompts, 1, 1, blocks), **i32),
            BLOCK_SIZE=(BLOCK, BLOCK),
            mask_mod=self._mask_mod(),
            seq_lengths=(group_size, length),
            compute_q_blocks=False,  # forward only
        )

    def tensors(self) -> list[torch.Tensor]:
        """What it allocates: its own state and the BlockMask's block lists."""
        m = self.mask
        mine = [self.prefix_lengths, self.step, self._partial, self._partial_count, self._block]
        return [*mine, m.kv_num_blocks, m.kv_indices, m.full_kv_num_blocks, m.full_kv_indices]

    def _mask_mod(self) -> Callable:
        lengths, step = self.prefix_lengths, self.step
        cap, g = self.prefix_cap, self.group_size

        def visible(b, h, q, kv):
            rel = kv - cap
            own = (rel >= 0) & (rel % g == q) & (rel // g <= step)
            return (kv < lengths[b]) | own

        return visible

    def load(self, lengths: torch.Tensor) -> None:
        """Prompt b's prefix holds `lengths[b]` valid keys (padding prompts: 0)."""
        n = lengths.shape[0]
        self.prefix_lengths.zero_()
        self.prefix_lengths[:n] = lengths.to(self.prefix_lengths.device)
        p = self.prefix_lengths[:, None]
        start, end = self._block * BLOCK, (self._block + 1) * BLOCK
        full = end <= p  # every key of the block is valid prefix
        partial = ~full & ((start < p) | (end > self.prefix_cap))
        self._fill(self.mask.full_kv_num_blocks, self.mask.full_kv_indices, full)
        self._fill(self._partial_count, self._partial, partial)
        self.open_through(torch.zeros_like(self.step))

    def _fill(self, count: torch.Tensor, indices: torch.Tensor, chosen: torch.Tensor) -> None:
        """Write the ascending block ids where `chosen` [prompts, blocks] holds."""
        count.copy_(chosen.sum(-1, dtype=torch.int32)[:, None, None])
        order = torch.sort(torch.where(chosen, self._block, self._block.numel()), -1).values
        indices.copy_(order.clamp(max=self._block.numel() - 1).to(torch.int32)[:, None, None])

    def open_through(self, step: torch.Tensor) -> None:
        """Visit the partial blocks up to the one holding response step `step`'s slots (a
        device tensor, so a captured graph replays it)."""
        self.step.copy_(step.reshape(()))
        last = (self.prefix_cap + (self.step + 1) * self.group_size - 1) // BLOCK
        within = (self._partial <= last) & (self._block < self._partial_count[..., None])
        self.mask.kv_num_blocks.copy_(within.sum(-1, dtype=torch.int32))
        self.mask.kv_indices.copy_(self._partial)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: FlexMask, scale: float
) -> torch.Tensor:
    """q [prompts, heads, G, D] over the cache's K/V [prompts, kv_heads, length, D]. Off
    CUDA flex_attention runs its eager reference, which the CPU tests compare with SDPA."""
    call = flex_call() if q.is_cuda else flex_attention
    return call(q, k, v, block_mask=mask.mask, scale=scale, enable_gqa=True)
