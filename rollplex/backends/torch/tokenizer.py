"""A small word-level tokenizer built in code, the real Qwen2-VL image processor (PIL, no
torchvision), and `encode_prompt`, laid out as Qwen2.5-VL expects:

    <|vision_start|> <|image_pad|> x N <|vision_end|> question words   (N = patches / merge^2)
Nothing is downloaded: it exists so tiny models can be trained and served on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from PIL import Image
from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessorPil

from rollplex.backends.torch.task import VOCAB_WORDS
from rollplex.data.prompts import PromptInputs
from rollplex.specs.model import ModelSpec

# SpecialTokens field -> token text (Qwen2.5-VL's names). Where two fields share an id
# (Qwen's pad == bos), the first name listed wins.
SPECIAL_TOKEN_NAMES: dict[str, str] = {
    "pad_token_id": "<|endoftext|>",
    "bos_token_id": "<|im_start|>",
    "eos_token_id": "<|im_end|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
}
UNK_TOKEN = "[UNK]"
MAX_VOCAB = 512


def build_tokenizer(spec: ModelSpec, words: Sequence[str] = VOCAB_WORDS) -> PreTrainedTokenizerFast:
    """Word-level tokenizer: special tokens at the spec's ids, then [UNK] and `words` at the
    lowest free ids, then `<|reserved_i|>` up to the vocab size so every id the model can
    sample decodes to something."""
    if spec.vocab_size > MAX_VOCAB:
        raise ValueError(
            f"build_tokenizer makes small vocabularies (<= {MAX_VOCAB}); {spec.name} has "
            f"{spec.vocab_size}: use the checkpoint's own tokenizer"
        )
    ids = spec.special_tokens.model_dump()
    name_of: dict[int, str] = {}
    for field, name in SPECIAL_TOKEN_NAMES.items():
        name_of.setdefault(ids[field], name)
    vocab = {name: i for i, name in name_of.items()}
    free = iter(i for i in range(spec.vocab_size) if i not in name_of)
    for word in dict.fromkeys([UNK_TOKEN, *(w.lower() for w in words)]):
        if word in vocab:
            continue
        i = next(free, None)
        if i is None:
            raise ValueError(f"vocab {spec.vocab_size} too small for {len(words)} words")
        vocab[word] = i
    reserved = [f"<|reserved_{i}|>" for i in free]
    vocab.update({name: int(name[11:-2]) for name in reserved})

    tok = Tokenizer(WordLevel(vocab, unk_token=UNK_TOKEN))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    # Added (not merely in-vocab) so "<|image_pad|>" in text is one token, not split on "|".
    tok.add_special_tokens([AddedToken(n, special=True) for n in [*name_of.values(), *reserved]])
    st = spec.special_tokens
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token=UNK_TOKEN,
        pad_token=name_of[st.pad_token_id],
        bos_token=name_of[st.bos_token_id],
        eos_token=name_of[st.eos_token_id],
        padding_side="right",
    )


def build_image_processor(spec: ModelSpec, max_pixels: int = 112 * 112) -> Qwen2VLImageProcessorPil:
    """transformers' Qwen2-VL image processor (PIL backend) with the spec's patch geometry.

    Images are resized to multiples of patch * merge pixels with at most `max_pixels`, so a
    small `max_pixels` keeps the visual token count (and CPU tests) small."""
    v = spec.vision
    factor = v.patch_size * v.spatial_merge_size
    if max_pixels < factor * factor:
        raise ValueError(f"max_pixels {max_pixels} is below one merged token ({factor}x{factor})")
    return Qwen2VLImageProcessorPil(
        patch_size=v.patch_size,
        temporal_patch_size=v.temporal_patch_size,
        merge_size=v.spatial_merge_size,
        min_pixels=factor * factor,
        max_pixels=max_pixels,
    )


def token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    """The id of a token that must be in the vocabulary (never silently [UNK])."""
    i = tokenizer.convert_tokens_to_ids(token)
    if i is None or (i == tokenizer.unk_token_id and token != UNK_TOKEN):
        raise KeyError(f"{token!r} is not a single token of this tokenizer")
    return int(i)


def encode_prompt(
    tokenizer: PreTrainedTokenizerFast,
    processor: Qwen2VLImageProcessorPil,
    image: Image.Image,
    question: str,
) -> PromptInputs:
    """One image plus a question, as input ids with image placeholders and pixel patches."""
    feats = processor(images=image, return_tensors="pt")
    grid = feats["image_grid_thw"].long().view(1, 3)
    n_image = int(grid.prod()) // processor.merge_size**2
    start, end, pad = (
        token_id(tokenizer, SPECIAL_TOKEN_NAMES[f])
        for f in ("vision_start_token_id", "vision_end_token_id", "image_token_id")
    )
    words = tokenizer(question, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([start, *[pad] * n_image, end, *words], dtype=torch.long)
    return PromptInputs(
        input_ids=ids,
        pixel_values=feats["pixel_values"],
        image_grid_thw=grid,
        mm_token_type_ids=(ids == pad).to(torch.int32),
    )


def tokenizer_for(spec: ModelSpec):
    """The tokenizer a run uses: the folder's (AutoTokenizer) when `spec.path` names one,
    else the word-level tokenizer built above for tiny presets."""
    if spec.path is not None:
        from rollplex.models import open_model_folder

        return open_model_folder(spec.path, spec).tokenizer()
    return build_tokenizer(spec)


def image_processor_for(spec: ModelSpec, max_pixels: int = 112 * 112):
    """The image processor a run uses: the folder's when `spec.path` names one."""
    if spec.path is not None:
        from rollplex.models import open_model_folder

        return open_model_folder(spec.path, spec).image_processor()
    return build_image_processor(spec, max_pixels)
