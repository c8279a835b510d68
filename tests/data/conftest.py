"""Data tests' shared fixtures: a tiny byte-level tokenizer with Qwen's chat template and
special tokens, and the tiny preset's image processor."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rollplex.backends.torch.tokenizer import SPECIAL_TOKEN_NAMES, build_image_processor
from rollplex.models.chat_template import QWEN2_5_VL_CHAT_TEMPLATE
from rollplex.specs.model import MODEL_PRESETS

SPEC = MODEL_PRESETS["tiny"]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE with Qwen's special tokens at the tiny spec's ids."""
    ids = SPEC.special_tokens.model_dump()
    specials = sorted({ids[f]: n for f, n in reversed(SPECIAL_TOKEN_NAMES.items())}.items())
    assert [i for i, _ in specials] == list(range(len(specials)))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[n for _, n in specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = ["You are a helpful assistant.", "What colour is the shape? Answer briefly."] * 20
    tok.train_from_iterator(text, trainer)
    tok.add_special_tokens([AddedToken(n, special=True) for _, n in specials])
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    out.chat_template = QWEN2_5_VL_CHAT_TEMPLATE  # as its Hub folders ship it
    return out


@pytest.fixture(scope="module")
def processor():
    return build_image_processor(SPEC, max_pixels=56 * 56)
