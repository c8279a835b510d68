"""Batched, seeded sampling on the model's forward with a KV cache (never `generate()`).

Every row takes one token per step. The first token is sampled from the prefix's last
logits; each next one from a one-token forward over the growing cache. A row that emits
`eos_id` is done: it keeps riding along (fed `pad_id`, masked out) until all rows are done
or `max_new_tokens` is reached, so the batch stays rectangular.

The returned logprobs are the policy's own, log softmax of the raw logits. Temperature and
top-p only shape which token is drawn, so these equal `response_logprobs` of the same tokens
and can serve as the old-policy logprobs of GRPO's ratio.
"""

from __future__ import annotations

import torch

from rollplex.backends.torch.logprob import token_logprobs
from rollplex.backends.torch.prefix import (
    Model,
    PrefixState,
    cache_kv,
    embed_tokens,
    fork_cache,
    lm_hidden,
    response_positions,
)


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row [N]: argmax when temperature == 0, else nucleus sampling."""
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1:
        # Keep the smallest head of the sorted distribution whose mass reaches top_p (the
        # most likely token always survives). A stable sort keeps ties deterministic.
        sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def decode(
    model: Model,
    state: PrefixState,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    eos_id: int,
    pad_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample up to `max_new_tokens` per row of `state` (one row per response).

    Returns (tokens [N, R] right-padded with pad, logprobs [N, R] with 0 on padding,
    lengths [N], eos included). R = max_new_tokens. `state` is not modified."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if pad_id is None:
        pad_id = model.config.text_config.pad_token_id or 0
    n, dev = state.rows, state.last_logits.device
    tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=dev)
    logprobs = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=dev)
    lengths = torch.zeros(n, dtype=torch.long, device=dev)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    with torch.no_grad():
        kv = fork_cache(cache_kv(state.cache))
        mask = state.attention_mask
        logits = state.last_logits
        for t in range(max_new_tokens):
            live = ~done
            nxt = sample_next(logits, temperature, top_p, generator)
            tokens[:, t] = torch.where(live, nxt, pad_id)
            logprobs[:, t] = torch.where(live, token_logprobs(logits, nxt), 0.0)
            lengths += live.long()
            done = done | (live & (nxt == eos_id))
            if t + 1 == max_new_tokens or bool(done.all()):
                break
            mask = torch.cat([mask, live.to(mask.dtype).unsqueeze(1)], 1)
            hidden = lm_hidden(
                model,
                embed_tokens(model, tokens[:, t : t + 1]),
                response_positions(state, 1, offset=t),
                mask,
                kv,
            )
            logits = model.lm_head(hidden[:, -1])
    return tokens, logprobs, lengths
