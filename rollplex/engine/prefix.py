"""The response-independent half of a step, once per prompt: vision features and the
prefix forward, whose KV cache its G responses share (decode engine, response_logprobs).

    vision_encode -> prefix_forward -> expand_prefix / DecodeEngine.start / response_logprobs
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cache

import torch
from transformers import DynamicCache, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLTextModel

from rollplex.data.prompts import PromptBatch

Model = Qwen2_5_VLForConditionalGeneration


@dataclass(slots=True)
class PrefixState:
    """What the response half needs from a prefix forward, one row per sequence.

    Prompts are right-padded (rollplex/data/prompts.py). Each row's M-RoPE positions come
    from `get_rope_index` over its valid tokens, image and video grids alike; the first
    response token sits at `next_positions[row]` on all three axes, the next one at +1, and
    so on. Positions are always passed explicitly: transformers keeps `rope_deltas` as state
    on the module, and with explicit positions that state is never read."""

    cache: DynamicCache  # K/V of every prefix position (pads included, masked out)
    # [N, V] logits at each row's last valid prefix token; None while only `last_hidden`
    # is known (a row chunk defers the head until its chunks are merged)
    last_logits: torch.Tensor | None
    attention_mask: torch.Tensor  # [N, P] long, 1 on valid prefix tokens
    next_positions: torch.Tensor  # [N] long, M-RoPE position of the first response token
    rope_deltas: torch.Tensor  # [N] long, M-RoPE position minus token index for text
    lengths: torch.Tensor  # [N] long, valid prefix tokens
    group_size: int = 1  # rows per prompt (after expand_prefix)
    last_hidden: torch.Tensor | None = None  # [N, H], kept only when the head is deferred

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])


@cache
def _cache_kwarg() -> str:
    # transformers renamed `past_key_values` to `cache` after 5.19; accept both.
    params = inspect.signature(Qwen2_5_VLTextModel.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def lm_hidden(
    model: Model,
    embeds: torch.Tensor,
    positions: torch.Tensor,
    attention_mask: torch.Tensor,
    kv: DynamicCache | None,
) -> torch.Tensor:
    """Final-norm hidden states of the LLM for `embeds` [N, T, H] at M-RoPE `positions`
    [3, N, T]. `attention_mask` [N, past + T] covers the cached tokens too; `kv` is
    extended in place with the new tokens' K/V."""
    out = model.model.language_model(
        inputs_embeds=embeds,
        position_ids=positions,
        attention_mask=attention_mask,
        use_cache=kv is not None,
        **{_cache_kwarg(): kv},
    )
    return out.last_hidden_state


def embed_tokens(model: Model, ids: torch.Tensor) -> torch.Tensor:
    return model.get_input_embeddings()(ids)


def new_cache(model: Model) -> DynamicCache:
    """An empty cache with the model's layer types."""
    return DynamicCache(config=model.config)


def fork_cache(kv: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A new cache object holding per-layer (K, V). DynamicCache copies them in and grows by
    concatenation, so appending to the fork never touches the caller's tensors (and the
    copy is differentiable)."""
    return DynamicCache(ddp_cache_data=kv)


def cache_kv(kv: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in kv.layers]


def vision_encode(model: Model, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """Merged visual features [sum tokens, H], visuals in order (images, and videos: grids
    with t > 1): the vision tower plus the 2x2 merger, exactly the call
    `get_image_features` / `get_video_features` make. Autograd follows the caller's
    grad mode (and the tower's requires_grad flags)."""
    visual = model.model.visual
    if grid_thw.shape[0] == 0:  # text-only prompts (a row chunk may hold only those)
        return pixel_values.new_zeros((0, model.config.vision_config.out_hidden_size))
    return visual(pixel_values.type(visual.dtype), grid_thw=grid_thw).pooler_output


def rope_index(
    model: Model,
    batch: PromptBatch,
    input_ids: torch.Tensor,
    mm_token_type_ids: torch.Tensor,
    attention_mask: torch.Tensor,
) -> torch.Tensor:
    """M-RoPE positions [3, N, T] from the model's own `get_rope_index`, with the image
    and video grids of `batch` (whose rows the N sequences extend, in order)."""
    positions, _ = model.model.get_rope_index(
        input_ids,
        mm_token_type_ids=mm_token_type_ids,
        image_grid_thw=batch.image_grid_thw,
        video_grid_thw=batch.video_grid_thw,
        second_per_grid_ts=batch.second_per_grid_ts,
        attention_mask=attention_mask,
    )
    return positions


def prefix_positions(model: Model, batch: PromptBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [3, B, P] of the prompts, position [B] of the token after each).

    The next position is read off `get_rope_index` over each prompt plus one text token,
    so a response continues exactly as in one forward over prompt + response. The
    `rope_deltas` it returns (max position + 1 - length) agree with that for images but
    not for a video whose temporal positions outrun its height and width: transformers 5
    puts the text after a video at start + max(h, w) / merge. (vLLM 0.32 and Qwen's own
    code put it at the video's max position + 1, so for such videos their positions differ
    from transformers' ones.)"""
    b, p = batch.input_ids.shape
    rows = torch.arange(b, device=batch.input_ids.device)
    ids = torch.nn.functional.pad(batch.input_ids, (0, 1), value=0)
    types = torch.nn.functional.pad(batch.mm_token_type_ids, (0, 1), value=0)
    mask = torch.nn.functional.pad(batch.attention_mask, (0, 1), value=0)
    ids[rows, batch.lengths] = 0
    types[rows, batch.lengths] = 0
    mask[rows, batch.lengths] = 1
    positions = rope_index(model, batch, ids, types, mask)
    following = positions[0, rows, batch.lengths].clone()
    positions[:, rows, batch.lengths] = 0  # a pad again: as get_rope_index leaves pads
    return positions[:, :, :p], following


def scatter_visual(embeds: torch.Tensor, types: torch.Tensor, features: torch.Tensor):
    """Put visual features (row by row, in token order) at the image and video tokens.
    Positions come from the token types, not ids: a response may sample a pad id."""
    mask = (types != 0).unsqueeze(-1)
    if int(mask.sum()) != features.shape[0]:
        raise ValueError(f"{int(mask.sum())} visual tokens but {features.shape[0]} features")
    return embeds.masked_scatter(mask, features.to(embeds.dtype))


def prefix_embeds(model: Model, batch: PromptBatch, features: torch.Tensor) -> torch.Tensor:
    """The decoder's input over the prompts: token embeddings, visual features at the image
    and video tokens. Autograd follows the caller's grad mode."""
    return scatter_visual(embed_tokens(model, batch.input_ids), batch.mm_token_type_ids, features)


def prefix_forward(
    model: Model, batch: PromptBatch, vision_features: torch.Tensor, grad: bool, head: bool = True
) -> PrefixState:
    """One forward over each prompt's prefix, keeping its KV cache.

    `vision_features` are each prompt's visuals (its images, or its video), row by row.
    With `grad=True` the graph is kept, even inside a caller's no_grad: a loss on the
    responses backpropagates through the cache and `last_logits` into the LLM, and through
    `vision_features` into the merger and the tower when those were computed with grad.
    `head=False` leaves `last_logits` None and keeps `last_hidden`, for callers that run
    the LM head later on more rows at once."""
    with torch.enable_grad() if grad else torch.no_grad():
        embeds = prefix_embeds(model, batch, vision_features)
        positions, following = prefix_positions(model, batch)
        kv = new_cache(model)
        hidden = lm_hidden(model, embeds, positions, batch.attention_mask, kv)
        rows = torch.arange(batch.size, device=hidden.device)
        last_hidden = hidden[rows, batch.lengths - 1]
        last_logits = model.lm_head(last_hidden) if head else None
    return prefix_state(batch, kv, following, last_hidden, last_logits)


def prefix_state(
    batch: PromptBatch,
    cache: DynamicCache,
    following: torch.Tensor,
    last_hidden: torch.Tensor,
    last_logits: torch.Tensor | None,
) -> PrefixState:
    """The state a prefix forward over `batch` leaves: `following` [B] is each row's next
    position; `last_hidden` is kept only when the LM head was deferred (no logits)."""
    following = following.to(batch.lengths.device)
    return PrefixState(
        cache=cache,
        last_logits=last_logits,
        attention_mask=batch.attention_mask,
        next_positions=following,
        rope_deltas=following - batch.lengths,
        lengths=batch.lengths,
        last_hidden=last_hidden if last_logits is None else None,
    )


def expand_prefix(state: PrefixState, group_size: int) -> PrefixState:
    """Share each row across `group_size` consecutive rows (row b -> rows b*G .. b*G+G-1).

    K/V are repeated into a new cache object, so the input state stays usable; under
    autograd the repeat sums the G rows' gradients back into the one prefix."""
    if group_size < 1:
        raise ValueError("group_size must be >= 1")
    if state.last_logits is None:
        raise ValueError("expand_prefix needs last_logits (the LM head was deferred)")

    def rep(t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(group_size, dim=0)

    kv = [(rep(k), rep(v)) for k, v in cache_kv(state.cache)]
    return PrefixState(
        cache=fork_cache(kv),
        last_logits=rep(state.last_logits),
        attention_mask=rep(state.attention_mask),
        next_positions=rep(state.next_positions),
        rope_deltas=rep(state.rope_deltas),
        lengths=rep(state.lengths),
        group_size=state.group_size * group_size,
    )


def response_positions(state: PrefixState, steps: int, offset: int = 0) -> torch.Tensor:
    """M-RoPE positions [3, N, steps] of response tokens offset .. offset+steps-1: text
    positions continue from the prefix on all three axes."""
    pos = state.next_positions[:, None] + offset + torch.arange(steps, device=state.lengths.device)
    return pos.unsqueeze(0).expand(3, -1, -1)
