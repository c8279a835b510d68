"""Fixtures for the formula tests: the tiny Qwen2.5-VL built from its spec, and inputs shaped
as the Qwen2-VL processor shapes them (image placeholders, flattened patches, M-RoPE)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from rollplex.specs import MODEL_PRESETS, ModelSpec

torch.set_num_threads(1)  # the machine's 2 cores are shared


def build_tiny(spec: ModelSpec, attn: str = "eager") -> Any:
    """fp32 random-weight model on CPU. `attn_implementation` reaches both the ViT and the LLM."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration._from_config(
        spec.to_hf_config(), attn_implementation=attn
    )
    vision_attn = model.model.visual.config._attn_implementation
    text_attn = model.model.language_model.config._attn_implementation
    assert (vision_attn, text_attn) == (attn, attn)
    return model


def count_flops(fn: Callable[[], Any]) -> tuple[int, Any]:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        out = fn()
    return counter.get_total_flops(), out


def cache_kwarg(model: Any) -> str:
    """transformers renamed `past_key_values=` to `cache=` after 5.19; an unknown name would
    vanish into **kwargs and silently drop the cache, so ask the signature."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@dataclass(slots=True)
class TinyBatch:
    """B sequences of `text, <vision_start>, image tokens, <vision_end>, text` + R response."""

    spec: ModelSpec
    grid: tuple[int, int, int]  # (t, h, w) in patches of each sequence's image
    pixel_values: torch.Tensor  # [B * t*h*w, C*T*P*P]
    image_grid_thw: torch.Tensor  # [B, 3]
    prefix_ids: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, R]
    positions: torch.Tensor  # [3, B, P + R] M-RoPE ids of the full sequence
    rope_delta: torch.Tensor  # [B, 1]

    @property
    def sequences(self) -> int:
        return self.prefix_ids.shape[0]

    @property
    def prefix_tokens(self) -> int:
        return self.prefix_ids.shape[1]

    @property
    def response_tokens(self) -> int:
        return self.response_ids.shape[1]

    @property
    def patches(self) -> int:
        t, h, w = self.grid
        return t * h * w

    @property
    def full_ids(self) -> torch.Tensor:
        return torch.cat([self.prefix_ids, self.response_ids], 1)

    def mm_token_type_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids == self.spec.special_tokens.image_token_id).int()

    def vision_inputs(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return dict(
            input_ids=ids,
            pixel_values=self.pixel_values,
            image_grid_thw=self.image_grid_thw,
            mm_token_type_ids=self.mm_token_type_ids(ids),
        )


def make_batch(
    model: Any,
    spec: ModelSpec,
    sequences: int = 2,
    image_hw: tuple[int, int] = (224, 224),
    text: tuple[int, int] = (5, 9),
    response: int = 12,
) -> TinyBatch:
    v, st = spec.vision, spec.special_tokens
    grid = (1, image_hw[0] // v.patch_size, image_hw[1] // v.patch_size)
    image_tokens = grid[0] * grid[1] * grid[2] // v.merge_factor
    gen = torch.Generator().manual_seed(1)

    def words(n: int) -> torch.Tensor:  # ordinary ids above the special ones
        return torch.randint(7, spec.vocab_size, (sequences, n), generator=gen)

    def fill(token: int, n: int = 1) -> torch.Tensor:
        return torch.full((sequences, n), token)

    prefix = torch.cat(
        [
            words(text[0]),
            fill(st.vision_start_token_id),
            fill(st.image_token_id, image_tokens),
            fill(st.vision_end_token_id),
            words(text[1]),
        ],
        1,
    )
    resp = words(response)
    full = torch.cat([prefix, resp], 1)
    thw = torch.tensor([grid] * sequences)
    positions, delta = model.model.get_rope_index(
        full, mm_token_type_ids=(full == st.image_token_id).int(), image_grid_thw=thw
    )
    pixels = torch.randn(sequences * grid[0] * grid[1] * grid[2], v.patch_dim, generator=gen)
    return TinyBatch(spec, grid, pixels, thw, prefix, resp, positions, delta)


@dataclass(slots=True, frozen=True)
class TinyKit:
    """The helpers above, handed to tests as a fixture (no test-package imports needed)."""

    build: Callable[..., Any] = build_tiny
    batch: Callable[..., TinyBatch] = make_batch
    count_flops: Callable[[Callable[[], Any]], tuple[int, Any]] = count_flops
    cache_kwarg: Callable[[Any], str] = cache_kwarg


@pytest.fixture
def kit() -> TinyKit:
    return TinyKit()


@pytest.fixture
def tiny_spec() -> ModelSpec:
    return MODEL_PRESETS["tiny"]


@pytest.fixture
def tiny_model(tiny_spec: ModelSpec) -> Any:
    return build_tiny(tiny_spec).eval()


@pytest.fixture
def tiny_batch(tiny_model: Any, tiny_spec: ModelSpec) -> TinyBatch:
    return make_batch(tiny_model, tiny_spec)
