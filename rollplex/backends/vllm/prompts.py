"""What the vLLM rollout takes: token ids plus the raw media, as `vllm.TokensPrompt` dicts.

vLLM runs the vision tower and prefill itself, so `vision_encode` and `prefix_prefill` only
assemble requests. vLLM 0.32 re-expands an already expanded token-id prompt (4 pads became
7), so each run of pads is collapsed to one here and vLLM's processor expands it back to N.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rollplex.backends.base import BackendError
from rollplex.data.prompt_media import Media


def multi_modal_data(media: Media, row: int) -> dict[str, Any]:
    """vLLM's `multi_modal_data` of one prompt of `media`."""
    out: dict[str, Any] = {}
    if media.images[row]:
        out["image"] = list(media.images[row])
    video = media.video(row)
    if video:
        frames = np.stack([np.asarray(f.convert("RGB")) for f in video])
        n = len(video)
        # vLLM wants metadata with raw frames; these are all the frames, none to sample
        meta = {
            "total_num_frames": n,
            "fps": media.fps,
            "duration": n / media.fps,
            "video_backend": "rollplex",
            "frames_indices": list(range(n)),
            "do_sample_frames": False,
        }
        out["video"] = (frames, meta)
    return out


@dataclass(slots=True, frozen=True)
class VllmPrompts:
    """One request body per prompt; G samples of each are added at decode."""

    prompts: tuple[dict[str, Any], ...]

    @property
    def rows(self) -> int:
        return len(self.prompts)


def token_rows(text: Any) -> list[list[int]]:
    """Each prompt's valid token ids: from a right-padded batch (`input_ids` + `lengths`,
    like the torch backend's PromptBatch) or a sequence of id lists / 1-D tensors."""
    if hasattr(text, "input_ids") and hasattr(text, "lengths"):
        ids, lengths = text.input_ids, text.lengths.tolist()
        return [ids[i, :n].tolist() for i, n in enumerate(lengths)]
    if isinstance(text, Sequence):
        return [t.tolist() if isinstance(t, torch.Tensor) else [int(x) for x in t] for t in text]
    raise BackendError(f"prompt text is {type(text).__name__}: expected a batch or id lists")


def collapse_runs(ids: list[int], pads: frozenset[int]) -> list[int]:
    """`ids` with each run of one placeholder id (image or video pad) cut to one token."""
    return [t for i, t in enumerate(ids) if t not in pads or i == 0 or ids[i - 1] != t]


def build_prompts(media: Media, text: Any, pads: frozenset[int] = frozenset()) -> VllmPrompts:
    """Requests for prompts `text` with `media`; `pads`: the placeholder ids to collapse."""
    rows = [collapse_runs(ids, pads) for ids in token_rows(text)]
    if len(rows) != media.rows:
        raise BackendError(f"{len(rows)} prompts but media for {media.rows}")
    out = []
    for i, ids in enumerate(rows):
        prompt: dict[str, Any] = {"prompt_token_ids": ids}
        if data := multi_modal_data(media, i):
            prompt["multi_modal_data"] = data
        out.append(prompt)
    return VllmPrompts(tuple(out))
