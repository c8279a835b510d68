"""A small Qwen2.5-VL whose shapes hit the awkward cases: FSDP padding (100 and 120 rows
over 8 ranks), KV heads replicated (2 KV heads under rollout TP 4), vocab padding (60 ->
64 rows), a vision tower that TP can split 2 ways but not 4."""

from __future__ import annotations

import pytest

from rollplex.specs import ModelSpec, SpecialTokens, VisionSpec


def small_spec(tied: bool = False) -> ModelSpec:
    return ModelSpec(
        name="small",
        hidden_size=128,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=100,
        vocab_size=60,
        tie_word_embeddings=tied,
        mrope_section=(4, 6, 6),
        max_position_embeddings=256,
        dtype="float32",
        vision=VisionSpec(
            depth=1,
            hidden_size=32,
            num_heads=2,
            intermediate_size=120,
            out_hidden_size=128,
            patch_size=2,
            fullatt_block_indexes=(0,),
        ),
        special_tokens=SpecialTokens(
            image_token_id=5,
            video_token_id=6,
            vision_start_token_id=3,
            vision_end_token_id=4,
            eos_token_id=2,
            pad_token_id=0,
            bos_token_id=1,
        ),
    )


@pytest.fixture
def small() -> ModelSpec:
    return small_spec()
