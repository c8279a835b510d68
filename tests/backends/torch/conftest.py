"""Shared fixtures: the tiny spec, a seeded model, and a 2-prompt batch of unequal length."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.task import QUESTIONS, VisualTask
from rollplex.backends.torch.tokenizer import build_image_processor, build_tokenizer, encode_prompt
from rollplex.data.prompts import PromptBatch, collate_prompts
from rollplex.specs.model import MODEL_PRESETS, ModelSpec

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture(scope="session")
def spec() -> ModelSpec:
    return MODEL_PRESETS["tiny"]


@pytest.fixture(scope="session")
def tokenizer(spec):
    return build_tokenizer(spec)


@pytest.fixture(scope="session")
def processor(spec):
    return build_image_processor(spec)


@pytest.fixture
def model(spec):
    return build_model(spec, seed=0)


@pytest.fixture(scope="session")
def batch(tokenizer, processor, spec) -> PromptBatch:
    """Two prompts that differ in image size (4 vs 9 image tokens) and question length."""
    a, b = VisualTask(seed=0).samples(0, 2)
    prompts = [
        encode_prompt(tokenizer, processor, a.image.resize((56, 56)), QUESTIONS["count"]),
        encode_prompt(tokenizer, processor, b.image, QUESTIONS["colour"]),
    ]
    out = collate_prompts(prompts, pad_id=spec.special_tokens.pad_token_id)
    assert out.lengths[0] != out.lengths[1]  # the batch really is padded
    return out


@pytest.fixture
def prefix(model, batch):
    """The batch's prompts prefilled once (no grad): one prefix state per prompt."""
    from rollplex.engine.prefix import prefix_forward, vision_encode

    with torch.no_grad():
        feats = vision_encode(model, batch.pixel_values, batch.image_grid_thw)
        return prefix_forward(model, batch, feats, grad=False)
