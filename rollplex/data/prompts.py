"""Prompt records: one encoded prompt, and a right-padded batch of them.

A prompt holds images or one video, never both, so features concatenated row by row fill the
batch's visual positions in order. Right padding keeps every prefix query attending to a key
(no NaN in padded rows); each row's last prefix token is then at `lengths - 1`. Pixels are
kept per kind, as transformers' forward takes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

TEXT, IMAGE, VIDEO = 0, 1, 2  # mm_token_type_ids values


@dataclass(slots=True)
class PromptInputs:
    """One prompt: token ids with visual placeholders, and its images' or video's patches."""

    input_ids: torch.Tensor  # [L] long: vision_start, N x pad, vision_end, ... text
    pixel_values: torch.Tensor | None  # [image patches, D]; None without images
    image_grid_thw: torch.Tensor | None  # [images, 3] long: (t, h, w) in patches
    mm_token_type_ids: torch.Tensor  # [L] int: 1 at image tokens, 2 at video, 0 at text
    pixel_values_videos: torch.Tensor | None = None  # [video patches, D]
    video_grid_thw: torch.Tensor | None = None  # [1, 3] long
    second_per_grid_ts: torch.Tensor | None = None  # [1] float: seconds per temporal patch

    @property
    def images(self) -> int:
        return 0 if self.image_grid_thw is None else int(self.image_grid_thw.view(-1, 3).shape[0])

    @property
    def videos(self) -> int:
        return 0 if self.video_grid_thw is None else int(self.video_grid_thw.view(-1, 3).shape[0])


@dataclass(slots=True)
class PromptBatch:
    """B prompts, right-padded to the longest one; pixels of each kind in prompt order."""

    input_ids: torch.Tensor  # [B, P] long, pad after each prompt
    attention_mask: torch.Tensor  # [B, P] long, 1 on valid tokens
    mm_token_type_ids: torch.Tensor  # [B, P] int
    pixel_values: torch.Tensor  # [sum image patches, D], prompts in batch order
    image_grid_thw: torch.Tensor  # [images, 3] long
    lengths: torch.Tensor  # [B] long, valid tokens per prompt
    image_counts: torch.Tensor  # [B] long, images per prompt
    pixel_values_videos: torch.Tensor  # [sum video patches, D]
    video_grid_thw: torch.Tensor  # [videos, 3] long
    second_per_grid_ts: torch.Tensor  # [videos] float32
    video_counts: torch.Tensor  # [B] long, videos per prompt (0 or 1)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def patches_per_prompt(self) -> list[int]:
        """Patches of each prompt's visuals (images and video together)."""
        img = _per_row(self.image_grid_thw.prod(-1), self.image_counts)
        vid = _per_row(self.video_grid_thw.prod(-1), self.video_counts)
        return [int(a + b) for a, b in zip(img, vid, strict=True)]

    def to(self, device: torch.device | str) -> PromptBatch:
        return PromptBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def select(self, lo: int, hi: int) -> PromptBatch:
        """Prompts lo..hi-1 (pixels included; empty pixels stay empty)."""
        return self.take(list(range(lo, hi)))

    def repeat(self, g: int) -> PromptBatch:
        """Each prompt g times in a row (prompt b -> rows b*g .. b*g+g-1), pixels included."""
        return self.take([b for b in range(self.size) for _ in range(g)])

    def text_only(self) -> PromptBatch:
        """The same prompts without pixels (grids and counts kept: positions need them)."""
        return replace(
            self,
            pixel_values=self.pixel_values[:0],
            pixel_values_videos=self.pixel_values_videos[:0],
        )

    def visual_rows(self) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Every prompt's visuals in row order, as one vision-tower input: (patches [N, D],
        grids [visuals, 3], visuals per prompt). Features of that tower call, in order,
        fill the batch's visual tokens row by row. A batch of one modality is already in
        that order: its tensors are returned as they are (a copy of a dense video step's
        patches costs ~0.1 s of host time every step)."""
        counts = (self.image_counts + self.video_counts).tolist()
        if self.pixel_values.dtype == self.pixel_values_videos.dtype:  # else cat promotes
            if not int(self.video_counts.sum()):
                return self.pixel_values, self.image_grid_thw, counts
            if not int(self.image_counts.sum()):
                return self.pixel_values_videos, self.video_grid_thw, counts
        pix = _split_rows(self.pixel_values, self.image_grid_thw, self.image_counts)
        vid = _split_rows(self.pixel_values_videos, self.video_grid_thw, self.video_counts)
        values, grids = [], []
        for (ip, ig), (vp, vg) in zip(pix, vid, strict=True):
            values += [ip, vp]
            grids += [ig, vg]
        return torch.cat(values), torch.cat(grids), counts

    def take(self, rows: list[int]) -> PromptBatch:
        """Prompts `rows`, in that order (pixels included)."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.input_ids.device)
        pix, igrid = _take_visuals(self.pixel_values, self.image_grid_thw, self.image_counts, rows)
        vid, vgrid = _take_visuals(
            self.pixel_values_videos, self.video_grid_thw, self.video_counts, rows
        )
        vid_rows = _visual_index(self.video_counts, rows)
        return PromptBatch(
            input_ids=self.input_ids[idx],
            attention_mask=self.attention_mask[idx],
            mm_token_type_ids=self.mm_token_type_ids[idx],
            pixel_values=pix,
            image_grid_thw=igrid,
            lengths=self.lengths[idx],
            image_counts=self.image_counts[idx],
            pixel_values_videos=vid,
            video_grid_thw=vgrid,
            second_per_grid_ts=self.second_per_grid_ts[vid_rows],
            video_counts=self.video_counts[idx],
        )


def _per_row(values: torch.Tensor, counts: torch.Tensor) -> list[torch.Tensor]:
    """Sum of `values` (one per visual) over each row's visuals."""
    parts = values.split(counts.tolist())
    return [p.sum() for p in parts]


def _visual_index(counts: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Indices of the visuals of `rows`, in that order."""
    starts = [0, *counts.cumsum(0).tolist()]
    idx = [i for r in rows for i in range(starts[r], starts[r + 1])]
    return torch.tensor(idx, dtype=torch.long, device=counts.device)


def _split_rows(
    pixels: torch.Tensor, grid: torch.Tensor, counts: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(patches, grids) of each row. Text-only batches have no pixels: each row gets an
    empty slice (the split sizes then say what the pixels would have held)."""
    grids = grid.split(counts.tolist())
    if pixels.shape[0] == 0:
        return [(pixels, g) for g in grids]
    sizes = [int(g.prod(-1).sum()) for g in grids]
    return list(zip(pixels.split(sizes), grids, strict=True))


def _take_visuals(
    pixels: torch.Tensor, grid: torch.Tensor, counts: torch.Tensor, rows: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    per_row = _split_rows(pixels, grid, counts)
    picked = [per_row[r] for r in rows]
    if not picked:
        return pixels[:0], grid[:0]
    return torch.cat([p for p, _ in picked]), torch.cat([g for _, g in picked])


def collate_prompts(prompts: Sequence[PromptInputs], pad_id: int) -> PromptBatch:
    """Right-pad prompts into one batch; raises ValueError on a prompt whose placeholders
    and visuals disagree, or one that holds both images and a video."""
    if not prompts:
        raise ValueError("collate_prompts needs at least one prompt")
    for i, p in enumerate(prompts):
        _check_prompt(i, p)
    width_d = next(
        (
            int(t.shape[-1])
            for p in prompts
            for t in (p.pixel_values, p.pixel_values_videos)
            if t is not None
        ),
        0,
    )
    empty = torch.zeros((0, width_d), dtype=torch.float32)
    no_grid = torch.zeros((0, 3), dtype=torch.long)
    lengths = torch.tensor([int(p.input_ids.numel()) for p in prompts], dtype=torch.long)
    b, width = len(prompts), int(lengths.max())
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    mm_types = torch.zeros((b, width), dtype=torch.int32)
    for i, p in enumerate(prompts):
        input_ids[i, : p.input_ids.numel()] = p.input_ids
        mm_types[i, : p.input_ids.numel()] = p.mm_token_type_ids
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    images = [p for p in prompts if p.images]
    videos = [p for p in prompts if p.videos]
    return PromptBatch(
        input_ids=input_ids,
        attention_mask=mask,
        mm_token_type_ids=mm_types,
        pixel_values=torch.cat([empty, *(p.pixel_values for p in images)]),
        image_grid_thw=torch.cat([no_grid, *(p.image_grid_thw.view(-1, 3) for p in images)]).long(),
        lengths=lengths,
        image_counts=torch.tensor([p.images for p in prompts], dtype=torch.long),
        pixel_values_videos=torch.cat([empty, *(p.pixel_values_videos for p in videos)]),
        video_grid_thw=torch.cat([no_grid, *(p.video_grid_thw.view(-1, 3) for p in videos)]).long(),
        second_per_grid_ts=torch.cat([torch.zeros(0), *(_seconds(p).float() for p in videos)]),
        video_counts=torch.tensor([p.videos for p in prompts], dtype=torch.long),
    )


def _seconds(p: PromptInputs) -> torch.Tensor:
    if p.second_per_grid_ts is None:
        return torch.ones(p.videos)
    return p.second_per_grid_ts.view(-1)


def _check_prompt(i: int, p: PromptInputs) -> None:
    if p.images and p.videos:
        raise ValueError(f"prompt {i}: holds images and a video; a prompt holds one kind")
    if p.videos > 1:
        raise ValueError(f"prompt {i}: holds {p.videos} videos; a prompt holds at most one")
    for kind, grid, pixels, code in (
        ("image", p.image_grid_thw, p.pixel_values, IMAGE),
        ("video", p.video_grid_thw, p.pixel_values_videos, VIDEO),
    ):
        patches = 0 if grid is None else int(grid.view(-1, 3).prod(-1).sum())
        have = 0 if pixels is None else int(pixels.shape[0])
        if patches != have:
            raise ValueError(f"prompt {i}: {kind} grids hold {patches} patches, pixels {have}")
        tokens = int((p.mm_token_type_ids == code).sum())
        if bool(tokens) != bool(patches):
            raise ValueError(f"prompt {i}: {tokens} {kind} tokens for {patches} patches")
