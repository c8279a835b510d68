"""A tiny random Qwen2.5-VL as a Hub-format folder (config, weights, tokenizer with a chat
template, image processor), as a user would download it; and image prompts for it."""

from __future__ import annotations

from pathlib import Path

import torch

from rollplex.backends.torch.model import build_model, save_model
from rollplex.backends.torch.task import QUESTIONS, VisualTask
from rollplex.backends.torch.tokenizer import build_image_processor, build_tokenizer, encode_prompt
from rollplex.data.prompt_media import Media
from rollplex.data.prompts import PromptBatch, collate_prompts
from rollplex.specs.model import MODEL_PRESETS, ModelSpec

SPEC: ModelSpec = MODEL_PRESETS["tiny"]  # head_dim 32: vLLM's CPU attention takes it
# Qwen2.5-VL's template, trimmed to text, images and video
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_folder(
    folder: Path, model: torch.nn.Module | None = None, seed: int = 0, spec: ModelSpec = SPEC
) -> Path:
    """save_pretrained-style folder of `model` (a fresh seeded one of `spec` when None)."""
    model = build_model(spec, seed=seed) if model is None else model
    save_model(model, spec, folder)
    tok = build_tokenizer(spec)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    build_image_processor(spec).save_pretrained(folder)
    return folder


def image_prompts(n: int = 2) -> tuple[PromptBatch, Media]:
    """`n` image prompts of unequal length: the torch batch and the same images for vLLM."""
    tok, proc = build_tokenizer(SPEC), build_image_processor(SPEC)
    samples = VisualTask(seed=0).samples(0, n)
    images = [s.image.resize((56, 56)) if i % 2 == 0 else s.image for i, s in enumerate(samples)]
    qs = [QUESTIONS["count"], QUESTIONS["colour"]]
    prompts = [encode_prompt(tok, proc, im, qs[i % 2]) for i, im in enumerate(images)]
    batch = collate_prompts(prompts, pad_id=SPEC.special_tokens.pad_token_id)
    return batch, Media(tuple((im.convert("RGB"),) for im in images))
