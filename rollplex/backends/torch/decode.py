"""Batched, seeded sampling on the model's forward with a KV cache (never `generate()`):
the eager reference loop. The torch rollout decodes with rollplex/engine (static shared-prefix
cache, CUDA graphs, on-device sampling); this loop stays as what the engine is tested
against (same greedy tokens and logprobs) and as bench/gpu_decode.py's baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rollplex.backends.torch.logprob import token_logprobs
from rollplex.engine.prefix import (
    Model,
    PrefixState,
    cache_kv,
    embed_tokens,
    fork_cache,
    lm_hidden,
    response_positions,
)
from rollplex.engine.session import check_lengths


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | Sequence[torch.Generator] | None,
) -> torch.Tensor:
    """One token per row [N]: argmax when temperature == 0, else nucleus sampling. A
    sequence of generators gives each row its own stream, so a row's tokens do not depend
    on which other rows share its batch (or its rank)."""
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
    if isinstance(generator, list | tuple):  # one stream per row (data-parallel ranks)
        if len(generator) != probs.shape[0]:
            raise ValueError(f"{len(generator)} row generators for {probs.shape[0]} rows")
        rows = [
            torch.multinomial(p[None], 1, generator=g)
            for p, g in zip(probs, generator, strict=True)
        ]
        return torch.cat(rows).squeeze(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@dataclass(slots=True)
class Generation:
    """What a rollout returns: token ids and the policy's per-token logprobs."""

    tokens: torch.Tensor  # [N, R] long, right-padded with pad
    logprobs: torch.Tensor  # [N, R] fp32, 0 on padding
    lengths: torch.Tensor  # [N] long, eos included


class DecodeSession:
    """Sampling from `state` that can stop after any step and resume where it left off.

    Each step draws one token per row from the current logits, then (unless finished) runs a
    one-token forward for the next logits. Stopping between steps keeps all of that state,
    and every draw comes from the same `generator`, so any split into `advance` calls gives
    the tokens of one uninterrupted run, so a plan can split decode into segments (and run
    other work between them). `state` is never modified.

    A row that emits `eos_id` is done: it keeps riding along (fed `pad_id`, masked out)
    until all rows are done or `max_new_tokens` is reached, so the batch stays rectangular.
    The logprobs are of the temperature-scaled distribution the token was drawn from
    (log softmax(logits / T), before top-p, as verl and TRL score them), so they equal
    `response_logprobs(..., temperature=T)` of the same tokens and serve as the old-policy
    logprobs of the ratio."""

    def __init__(
        self,
        model: Model,
        state: PrefixState,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        generator: torch.Generator | None,
        eos_id: int,
        pad_id: int | None = None,
        lengths: Sequence[int] | None = None,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        caps = check_lengths(lengths, state.rows, max_new_tokens)
        if pad_id is None:
            pad_id = model.config.text_config.pad_token_id or 0
        n, dev = state.rows, state.lengths.device
        self.model, self.state, self.max_new_tokens = model, state, max_new_tokens
        self.temperature, self.top_p, self.generator = temperature, top_p, generator
        self.eos_id, self.pad_id = eos_id, pad_id
        self.tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=dev)
        self.logprobs = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=dev)
        self.lengths = torch.zeros(n, dtype=torch.long, device=dev)
        self._done = torch.zeros(n, dtype=torch.bool, device=dev)
        # forced lengths (eos ignored) or the cap for every row
        self._caps = torch.tensor(caps or [max_new_tokens] * n, device=dev)
        if caps is not None:
            self.eos_id = -1
        with torch.no_grad():
            self.kv = fork_cache(cache_kv(state.cache))
        self.mask = state.attention_mask
        self.logits = state.last_logits
        self.t = 0  # steps taken
        self.finished = False

    @property
    def steps_left(self) -> int:
        return 0 if self.finished else self.max_new_tokens - self.t

    def advance(self, steps: int | None = None) -> bool:
        """Run up to `steps` decode steps (all remaining when None); True once finished."""
        budget = self.steps_left if steps is None else min(steps, self.steps_left)
        with torch.no_grad():
            for _ in range(budget):
                self._step()
        return self.finished

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(token, its logprob) per row from the current logits."""
        nxt = sample_next(self.logits, self.temperature, self.top_p, self.generator)
        return nxt, token_logprobs(self.logits, nxt, self.temperature)

    def _step(self) -> None:
        t, live = self.t, ~self._done
        nxt, lp = self._draw()
        self.tokens[:, t] = torch.where(live, nxt, self.pad_id)
        self.logprobs[:, t] = torch.where(live, lp, 0.0)
        self.lengths += live.long()
        self._done = self._done | (live & ((nxt == self.eos_id) | (self._caps <= t + 1)))
        self.t = t + 1
        if self.t == self.max_new_tokens or bool(self._done.all()):
            self.finished = True
            self.logits = self.kv = None  # the cache is no longer needed: let it go
            return
        self.mask = torch.cat([self.mask, live.to(self.mask.dtype).unsqueeze(1)], 1)
        hidden = lm_hidden(
            self.model,
            embed_tokens(self.model, self.tokens[:, t : t + 1]),
            response_positions(self.state, 1, offset=t),
            self.mask,
            self.kv,
        )
        self.logits = self.model.lm_head(hidden[:, -1])

    def result(self) -> Generation:
        if not self.finished:
            raise RuntimeError(f"decode session still has {self.steps_left} steps to run")
        return Generation(self.tokens, self.logprobs, self.lengths)


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
    session = DecodeSession(
        model, state, max_new_tokens, temperature, top_p, generator, eos_id, pad_id
    )
    session.advance()
    out = session.result()
    return out.tokens, out.logprobs, out.lengths
