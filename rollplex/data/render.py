"""Render a data sample into model inputs: the user turn through a template and the
tokenizer's own chat template, visual placeholders expanded, pixels from the processor.

As Qwen2.5-VL's processor and verl/EasyR1 lay it out: "{problem}" replaced in `template`,
`<image>`/`<video>` become content parts, each pad repeated per merged patch. Video frames
follow qwen-vl-utils (`video_frames_to_patches`: no torchvision needed).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from rollplex.data.prompts import IMAGE, VIDEO, PromptBatch, PromptInputs, collate_prompts
from rollplex.specs.model import ModelSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rollplex.data.sample import RowMedia, Sample

# qwen-vl-utils' video defaults, in units of one merged token (28 x 28 pixels for Qwen).
VIDEO_MIN_TOKENS = 128
VIDEO_MAX_TOKENS = 768
VIDEO_TOTAL_TOKENS = 24576
VIDEO_FPS = 2.0
_PLACEHOLDER = re.compile(r"(<image>|<video>)")


class RenderError(ValueError):
    """A sample (named by uid) or a renderer setting that cannot be rendered."""


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen's resize rule (qwen-vl-utils, transformers): both sides multiples of `factor`,
    the area within [min_pixels, max_pixels], the aspect ratio kept as closely as it can."""
    if max(height, width) / min(height, width) > 200:
        raise RenderError(f"aspect ratio of {height}x{width} exceeds 200")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def video_frames_to_patches(
    frames: Sequence[Image.Image], processor: Any, height: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames -> (pixel_values_videos [t*h*w/p^2, C*T*p*p], video_grid_thw [1, 3]).

    Frames are resized to height x width (multiples of patch * merge) with the processor's
    resampling, padded to a multiple of the temporal patch by repeating the last, and
    normalised by the image processor (each frame alone, with resizing off); patch k of a
    frame then sits at row k of its output, so Qwen's video layout is the image layout with
    T consecutive frames in the temporal slot."""
    t_patch, p = processor.temporal_patch_size, processor.patch_size
    frames = [f.convert("RGB").resize((width, height), processor.resample) for f in frames]
    frames += [frames[-1]] * (-len(frames) % t_patch)
    out = processor(images=frames, do_resize=False, return_tensors="pt")["pixel_values"]
    per_frame = (height // p) * (width // p)
    c = out.shape[1] // (t_patch * p * p)
    # [frames, patches, C, T, p, p] -> the first temporal copy of each frame
    single = out.view(len(frames), per_frame, c, t_patch, p, p)[:, :, :, 0]
    grid_t = len(frames) // t_patch
    # [grid_t, T, patches, C, p, p] -> [grid_t, patches, C, T, p, p]
    video = single.view(grid_t, t_patch, per_frame, c, p, p).permute(0, 2, 3, 1, 4, 5)
    grid = torch.tensor([[grid_t, height // p, width // p]], dtype=torch.long)
    return video.reshape(grid_t * per_frame, c * t_patch * p * p).contiguous(), grid


class PromptRenderer:
    """Samples -> PromptInputs / PromptBatch for a model's tokenizer and processor."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        image_processor: Any,
        model: ModelSpec,
        template: str = "{problem}",
        system_prompt: str | None = None,
        max_pixels: int | None = None,
        video_max_pixels: int | None = None,
        *,
        video_min_pixels: int | None = None,
        video_fps: float = VIDEO_FPS,
    ) -> None:
        if "{problem}" not in template:
            raise RenderError(f"template {template!r} has no '{{problem}}' to put the problem in")
        if not getattr(tokenizer, "chat_template", None):
            raise RenderError("the tokenizer has no chat_template (tokenizer_config.json)")
        v, proc = model.vision, image_processor
        ours = (proc.patch_size, proc.merge_size, proc.temporal_patch_size)
        theirs = (v.patch_size, v.spatial_merge_size, v.temporal_patch_size)
        if ours != theirs:
            raise RenderError(
                f"image processor (patch, merge, temporal patch) {ours} != model "
                f"{model.name!r} {theirs}"
            )
        if video_fps <= 0:
            raise RenderError(f"video_fps must be > 0, got {video_fps}")
        self.factor = v.patch_size * v.spatial_merge_size
        self.min_pixels = int(proc.size["shortest_edge"])
        self.max_pixels = int(max_pixels or proc.size["longest_edge"])
        unit = self.factor**2
        for name, px in (("max_pixels", self.max_pixels), ("video_max_pixels", video_max_pixels)):
            if px is not None and px < unit:
                raise RenderError(f"{name}={px} is below one merged token ({unit} pixels)")
        self.tokenizer, self.processor, self.model = tokenizer, proc, model
        self.template, self.system_prompt = template, system_prompt
        self.video_max_pixels, self.video_min_pixels = video_max_pixels, video_min_pixels
        self.video_fps = video_fps
        self.merge = v.spatial_merge_size**2

    # -- text ---------------------------------------------------------------------------
    def messages(self, sample: Sample) -> list[dict[str, Any]]:
        """The chat for `sample`: an optional system turn and the user turn's parts."""
        return self._messages(sample.uid, sample.problem, len(sample.images), sample.video)

    def _messages(
        self, uid: str, problem: str, images: int, video: object | None
    ) -> list[dict[str, Any]]:
        text = self.template.replace("{problem}", problem)
        pieces = _PLACEHOLDER.split(text)
        n_img, n_vid = pieces.count("<image>"), pieces.count("<video>")
        video = video is not None
        where = f"sample {uid!r}"
        if images and video:
            raise RenderError(f"{where}: has images and a video; a prompt holds one kind")
        if (n_img, n_vid) != (0, 0) and (n_img, n_vid) != (images, int(video)):
            raise RenderError(
                f"{where}: problem has {n_img} <image> and {n_vid} <video> placeholders "
                f"but the sample has {images} images and {int(video)} videos"
            )
        if (n_img, n_vid) == (0, 0):
            pieces = ["<image>"] * images + ["<video>"] * int(video) + [text]
        parts = [
            {"type": p[1:-1]} if p in ("<image>", "<video>") else {"type": "text", "text": p}
            for p in pieces
            if p
        ]
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": parts}]

    def _ids(self, sample: Sample) -> list[int]:
        return self._chat_ids(self.messages(sample))

    def _chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def text_tokens(self, uid: str, problem: str, images: int, video: bool) -> int:
        """Text tokens (chat template included, each visual's pad not counted) of a row."""
        ids = self._chat_ids(self._messages(uid, problem, images, object() if video else None))
        return len(ids) - images - int(video)

    def visual_tokens(self, media: RowMedia, frames: int) -> int:
        """Visual tokens `encode` gives a row of these decoded sizes, with no pixels: the
        processor's resize rule per image; the video's frame size at `frames` sampled
        frames, padded to the temporal patch."""
        p = self.processor.patch_size
        visual = 0
        for w, h in media.image_sizes:
            rh, rw = smart_resize(h, w, self.factor, self.min_pixels, self.max_pixels)
            visual += (rh // p) * (rw // p) // self.merge
        if media.video_size is not None:
            w, h = media.video_size
            rh, rw = self.video_size(h, w, frames)
            grid_t = math.ceil(frames / self.processor.temporal_patch_size)
            visual += grid_t * (rh // p) * (rw // p) // self.merge
        return visual

    # -- pixels -------------------------------------------------------------------------
    def _images(self, images: Sequence[Image.Image]) -> tuple[torch.Tensor, torch.Tensor]:
        size = {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels}
        out = self.processor(images=list(images), size=size, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"].long().view(-1, 3)

    def video_size(self, height: int, width: int, frames: int) -> tuple[int, int]:
        """qwen-vl-utils' frame size: its pixel bounds in merged tokens (a total budget
        over the frames), the upper one lowered to `video_max_pixels` when set."""
        unit = self.factor**2
        lo = VIDEO_MIN_TOKENS * unit if self.video_min_pixels is None else self.video_min_pixels
        hi = max(min(VIDEO_MAX_TOKENS * unit, VIDEO_TOTAL_TOKENS * unit / frames * 2), lo * 1.05)
        if self.video_max_pixels is not None:
            hi = min(hi, self.video_max_pixels)
            lo = min(lo, hi)
        return smart_resize(height, width, factor=self.factor, min_pixels=lo, max_pixels=int(hi))

    def _video(self, sample: Sample) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        frames = sample.video
        if not frames:
            raise RenderError(f"sample {sample.uid!r}: video has no frames")
        sizes = {f.size for f in frames}
        if len(sizes) > 1:
            raise RenderError(f"sample {sample.uid!r}: video frames differ in size {sorted(sizes)}")
        w, h = frames[0].size
        height, width = self.video_size(h, w, len(frames))
        pixels, grid = video_frames_to_patches(frames, self.processor, height, width)
        seconds = torch.tensor([self.processor.temporal_patch_size / self.video_fps])
        return pixels, grid, seconds

    # -- public -------------------------------------------------------------------------
    def encode(self, sample: Sample) -> PromptInputs:
        """One sample as token ids (placeholders expanded) and its pixels."""
        ids = self._ids(sample)
        st = self.model.special_tokens
        pixels = grid = videos = vgrid = seconds = None
        pads: list[int] = []
        if sample.images:
            pixels, grid = self._images(sample.images)
            pads = [int(n) // self.merge for n in grid.prod(-1).tolist()]
        elif sample.video is not None:
            videos, vgrid, seconds = self._video(sample)
            pads = [int(vgrid.prod()) // self.merge]
        pad_id = st.image_token_id if sample.images else st.video_token_id
        found = [i for i in ids if i in (st.image_token_id, st.video_token_id)]
        if found != [pad_id] * len(pads):
            raise RenderError(
                f"sample {sample.uid!r}: the chat template rendered pad ids {found} for "
                f"{len(pads)} visual(s) of pad id {pad_id}; does it render "
                "{'type': 'image'|'video'} content parts with the model's pad tokens?"
            )
        out: list[int] = []
        types: list[int] = []
        kind = IMAGE if sample.images else VIDEO
        counts = iter(pads)
        for i in ids:
            n = next(counts) if i == pad_id and pads else 1
            out += [i] * n
            types += [kind if i == pad_id and pads else 0] * n
        return PromptInputs(
            input_ids=torch.tensor(out, dtype=torch.long),
            pixel_values=pixels,
            image_grid_thw=grid,
            mm_token_type_ids=torch.tensor(types, dtype=torch.int32),
            pixel_values_videos=videos,
            video_grid_thw=vgrid,
            second_per_grid_ts=seconds,
        )

    def encode_batch(self, samples: Sequence[Sample]) -> PromptBatch:
        """Samples rendered and right-padded with the model's pad id."""
        return collate_prompts(
            [self.encode(s) for s in samples], pad_id=self.model.special_tokens.pad_token_id
        )
