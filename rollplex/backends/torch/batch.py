"""Prompt records: one encoded prompt, and a right-padded batch of them.

Right padding (valid tokens first, pad after) keeps every query row of the prefix
forward attending to at least one key, so padded rows never turn into NaN that could
leak into gradients; the price is that each row's last prefix token sits at its own
index (`lengths - 1`), which the engine gathers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch


@dataclass(slots=True)
class PromptInputs:
    """One prompt: text with image placeholders, and the image's patches."""

    input_ids: torch.Tensor  # [L] long: vision_start, N x image, vision_end, question
    pixel_values: torch.Tensor  # [patches, C*T*p*p] from the image processor
    image_grid_thw: torch.Tensor  # [1, 3] long: (t, h, w) in patches
    mm_token_type_ids: torch.Tensor  # [L] int: 1 at image tokens, 0 at text


@dataclass(slots=True)
class PromptBatch:
    """B prompts, right-padded to the longest one."""

    input_ids: torch.Tensor  # [B, P] long, pad after each prompt
    attention_mask: torch.Tensor  # [B, P] long, 1 on valid tokens
    mm_token_type_ids: torch.Tensor  # [B, P] int
    pixel_values: torch.Tensor  # [sum patches, D], prompts in batch order
    image_grid_thw: torch.Tensor  # [B, 3] long, one image per prompt
    lengths: torch.Tensor  # [B] long, valid tokens per prompt

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def patches_per_prompt(self) -> list[int]:
        return self.image_grid_thw.prod(-1).tolist()

    def to(self, device: torch.device | str) -> PromptBatch:
        return PromptBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def collate_prompts(prompts: Sequence[PromptInputs], pad_id: int) -> PromptBatch:
    """Right-pad prompts into one batch (one image per prompt)."""
    if not prompts:
        raise ValueError("collate_prompts needs at least one prompt")
    lengths = torch.tensor([int(p.input_ids.numel()) for p in prompts], dtype=torch.long)
    b, width = len(prompts), int(lengths.max())
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    mm_types = torch.zeros((b, width), dtype=torch.int32)
    for i, p in enumerate(prompts):
        input_ids[i, : p.input_ids.numel()] = p.input_ids
        mm_types[i, : p.input_ids.numel()] = p.mm_token_type_ids
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    return PromptBatch(
        input_ids=input_ids,
        attention_mask=mask,
        mm_token_type_ids=mm_types,
        pixel_values=torch.cat([p.pixel_values for p in prompts]),
        image_grid_thw=torch.cat([p.image_grid_thw.view(-1, 3) for p in prompts]).long(),
        lengths=lengths,
    )
