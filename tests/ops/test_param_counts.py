"""ModelSpec's parameter counts against the real transformers model, built on the meta device
from the public Qwen2.5-VL shapes (no weights allocated)."""

from __future__ import annotations

import pytest
import torch

from rollplex.specs import MODEL_PRESETS

SIZES = ["qwen2_5_vl_3b", "qwen2_5_vl_7b", "qwen2_5_vl_32b", "qwen2_5_vl_72b"]


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # tied weights are yielded once


@pytest.mark.parametrize("name", SIZES)
def test_param_count_matches_transformers(name):
    from transformers import Qwen2_5_VLForConditionalGeneration

    spec = MODEL_PRESETS[name]
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(spec.to_hf_config())
    total, vision = _count(model), _count(model.model.visual)
    print(f"{name}: spec {spec.param_count():,} vs model {total:,}")
    assert spec.param_count() == pytest.approx(total, rel=0.005)
    assert spec.vision.param_count() == pytest.approx(vision, rel=0.005)
    assert spec.llm_param_count() == pytest.approx(total - vision, rel=0.005)
    assert (model.lm_head.weight is model.model.language_model.embed_tokens.weight) == (
        spec.tie_word_embeddings
    )
