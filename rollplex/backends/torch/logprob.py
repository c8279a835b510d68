"""Per-token logprobs of responses over a prefix cache shared by each prompt's G responses.

`response_logprobs` runs only response tokens (packed: packed_rows.py) on top of the
prefix; the token-level pieces (logprobs, entropy, the chunked LM head, masks) serve the
per-sample forward too (full_forward.py). Both follow the caller's grad mode: reference
scorer without grad, training forward with it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from rollplex.backends.torch.fused_head import fusable, fused_head_logprobs
from rollplex.backends.torch.packed_rows import PackedRows
from rollplex.backends.torch.shared_prefix_attention import SharedPrefix, use_shared_prefix
from rollplex.engine.prefix import (
    Model,
    PrefixState,
    cache_kv,
    embed_tokens,
    lm_hidden,
)
from rollplex.ops.formulas import head as head_price


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log softmax(logits / temperature)[token] in fp32, without materialising the full
    log-softmax: the distribution the rollout sampled from, so rollout, reference and
    trainer logprobs agree and the ratio is 1 on-policy (verl and TRL divide by T too).
    Temperature 0 (greedy) scores the raw logits."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position, in fp32: logsumexp(z) -
    sum(softmax(z) * z), verl's entropy_from_logits on the logits it divides by T."""
    z = logits.float()
    if temperature > 0 and temperature != 1.0:
        z = z / temperature
    return z.logsumexp(-1) - (torch.softmax(z, -1) * z).sum(-1)


# fp32 logits one chunk of head_logprobs may hold (priced there): at a real vocab (152k)
# 1 GiB is ~1,700 tokens, where [64 x 256] responses would need 10 GiB at once.
HEAD_CHUNK_BYTES = head_price.HEAD_CHUNK_BYTES


# What the training forward computes beside logprobs: nothing, the entropy as a metric
# (without grad), or the entropy with grad (an entropy_coeff term in the loss).
NO_ENTROPY, ENTROPY_METRIC, ENTROPY_GRAD = None, "metric", "grad"


def entropy_mode(entropy_coeff: float) -> str:
    """ENTROPY_GRAD when the loss has an entropy term, else ENTROPY_METRIC."""
    return ENTROPY_GRAD if entropy_coeff else ENTROPY_METRIC


def _logprobs_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, entropy: str | None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    lp = token_logprobs(logits, tokens, temperature)
    if entropy is None:
        return lp
    if entropy == ENTROPY_GRAD:
        return lp, token_entropy(logits, temperature)
    with torch.no_grad():  # a metric: no graph through the [.., V] softmax
        return lp, token_entropy(logits, temperature)


def head_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
    entropy: str | None = NO_ENTROPY,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """token_logprobs(head(hidden), tokens) for hidden [N, T, H], tokens [N, T], computed in
    chunks of tokens whose logits are recomputed in backward instead of kept (the fused
    linear + log-softmax of Liger/verl). Same values as the one-shot form up to the
    matmul's rounding for a different row count; one chunk when the logits are small
    (still recomputed in backward: a training micro-batch's logits are small, but kept for
    every micro-batch until the backward they would add up). With `entropy`
    (ENTROPY_METRIC or ENTROPY_GRAD) it returns (logprobs, token_entropy [N, T]) from the
    same chunk's logits, the entropy with grad only for ENTROPY_GRAD."""
    n, t, h = hidden.shape
    vocab = head.weight.shape[0] if hasattr(head, "weight") else h
    chunk = max(1, HEAD_CHUNK_BYTES // (4 * vocab))
    keep = torch.is_grad_enabled()
    if keep and fusable(head):  # one node that keeps no logits (fused_head.py)
        return fused_head_logprobs(head, hidden, tokens, temperature, chunk, entropy)
    flat, ids = hidden.reshape(n * t, h), tokens.reshape(n * t)

    def part(x: torch.Tensor, y: torch.Tensor):
        return _logprobs_entropy(head(x), y, temperature, entropy)

    if n * t <= chunk:
        return (
            checkpoint(part, hidden, tokens, use_reentrant=False) if keep else part(hidden, tokens)
        )
    parts = [
        checkpoint(part, flat[lo : lo + chunk], ids[lo : lo + chunk], use_reentrant=False)
        if keep
        else part(flat[lo : lo + chunk], ids[lo : lo + chunk])
        for lo in range(0, n * t, chunk)
    ]
    if entropy is None:
        return torch.cat(parts).view(n, t)
    return (
        torch.cat([p[0] for p in parts]).view(n, t),
        torch.cat([p[1] for p in parts]).view(n, t),
    )


def response_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """[N, width] bool: True on the first `lengths[row]` tokens."""
    return torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]


def group_size_of(state: PrefixState, rows: int, group_size: int | None = None) -> int:
    """Responses per prefix row: `rows` responses on `state`'s rows, row b's G responses at
    b * G .. b * G + G - 1 (1 on a state already expanded to one row per response). A
    given `group_size` must be that G."""
    if rows < 1 or rows % state.rows or group_size not in (None, rows // state.rows):
        want = "a whole group of G" if group_size is None else f"group_size={group_size}"
        raise ValueError(f"{rows} responses for {state.rows} prefix rows: want {want} per row")
    return rows // state.rows


def first_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    group_size: int,
    temperature: float,
    entropy: str | None = NO_ENTROPY,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """token_logprobs of response token 0 [N] from its prompt's last logits [B, V]:
    the normaliser is taken once per prompt and picked per row, logits never repeated.
    With `entropy`, (logprobs, entropy [N]) as head_logprobs gives them."""
    prompt = torch.arange(tokens.shape[0], device=tokens.device) // group_size
    ent = None
    if entropy is not None:
        with torch.set_grad_enabled(entropy == ENTROPY_GRAD and torch.is_grad_enabled()):
            ent = token_entropy(logits, temperature)[prompt]
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    lp = logits[prompt, tokens] - logits.logsumexp(-1)[prompt]
    return lp if ent is None else (lp, ent)


def response_head_outputs(
    model: Model,
    state: PrefixState,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    group_size: int | None = None,
    packed: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`model.lm_head` at the positions that predict the response tokens: [N, out] for
    token 0 (the prefix's last output, repeated over each prompt's G rows), then
    [N, R-1, out] from the response's own hidden states (token j is fed to predict j+1, so
    the last token is never fed), None when R=1. Two parts, not one tensor: concatenating
    [N, R, vocab] logits would copy them. With the LM head these are logits; on a critic
    (lm_head is its value head) they are values."""
    g = group_size_of(state, responses.shape[0], group_size)
    hidden = response_hidden(model, state, responses, lengths, packed)
    first = state.last_logits if g == 1 else state.last_logits.repeat_interleave(g, 0)
    if hidden is None:
        return first, None
    rest, packing = hidden
    out = model.lm_head(rest)  # per token: on the packed tokens only, then padded
    return first, out if packing is None else packing.unpack(out)


def fed_tokens(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """[N, width - 1] bool: the response tokens fed to the model (token j predicts j+1)."""
    return response_mask(lengths, width)[:, :-1]


def response_hidden(
    model: Model,
    state: PrefixState,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    packed: bool = True,
) -> tuple[torch.Tensor, PackedRows | None] | None:
    """Final hidden states of response tokens 0..R-2 on top of the prefix (they predict
    tokens 1..R-1), None when R=1: with `packed`, [1, T, H] of the rows' fed tokens and
    their packing (packed_rows.py: the layers run no padding), else [N, R-1, H] and None.
    `state` has one row per prompt (each prompt's G responses attend to its one prefix
    K/V: shared_prefix_attention.py) or one per response (an expanded state, G = 1)."""
    n, width = responses.shape
    g = group_size_of(state, n)
    if width == 1:
        return None
    use_shared_prefix(model)
    valid = fed_tokens(lengths, width)
    packed = packed and bool(valid.any())
    shared = SharedPrefix.build(
        cache_kv(state.cache), state.attention_mask, valid, g, packed=packed
    )
    steps = torch.arange(width - 1, device=state.lengths.device)
    pos = state.next_positions.repeat_interleave(g)[:, None] + steps
    # looked up padded, then packed: the embedding's backward keeps a view of the response
    # ids, not a packed copy the saved-activations formula would not count
    embeds, packing = embed_tokens(model, responses[:, :-1]), shared.packed
    if packing is not None:
        embeds, pos = packing.pack(embeds), packing.pack(pos)
    hidden = lm_hidden(model, embeds, pos.unsqueeze(0).expand(3, -1, -1), shared.masks(), None)
    return hidden, packing


def response_logprobs(
    model: Model,
    state: PrefixState,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    temperature: float = 1.0,
    group_size: int | None = None,
    entropy: str | None = NO_ENTROPY,
    packed: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Logprobs [N, R] of right-padded `responses` [N, R] given the prefix in `state`
    (one row per prompt, whose G responses are rows b * G .. b * G + G - 1, or one row
    per response); 0 past each row's length. `group_size`, if given, is checked. With
    `entropy`, (logprobs, entropy [N, R]) from the same logits (head_logprobs). `packed`:
    the layers and LM head run on the real tokens only (the same values)."""
    g = group_size_of(state, responses.shape[0], group_size)
    hidden = response_hidden(model, state, responses, lengths, packed)
    rest, packing = (None, None) if hidden is None else hidden
    return hidden_logprobs(model, state, responses, lengths, rest, temperature, g, entropy, packing)


def hidden_logprobs(
    model: Model,
    state: PrefixState,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    rest: torch.Tensor | None,
    temperature: float,
    group_size: int,
    entropy: str | None = NO_ENTROPY,
    packing: PackedRows | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`response_logprobs` from the final hidden states `rest` of response tokens 0..R-2
    (however they were computed: decoded_response.py replays a decode's): [N, R-1, H],
    or [1, T, H] of the tokens `packing` packs, whose LM head then runs on those alone."""
    g = group_size
    first = first_logprobs(state.last_logits, responses[:, 0], g, temperature, entropy)
    if rest is not None:
        targets = responses[:, 1:] if packing is None else packing.pack(responses[:, 1:])
        rest = head_logprobs(model.lm_head, rest, targets, temperature, entropy)
        if packing is not None:
            rest = _each(rest, packing.unpack)
    valid = response_mask(lengths, responses.shape[1])
    if entropy is None:
        return masked_outputs(_join(first, rest), valid)
    lp = _join(first[0], None if rest is None else rest[0])
    ent = _join(first[1], None if rest is None else rest[1])
    return masked_outputs(lp, valid), masked_outputs(ent, valid)


def _join(first: torch.Tensor, rest: torch.Tensor | None) -> torch.Tensor:
    """Token 0's [N] and the others' [N, R-1] as [N, R]."""
    return first.unsqueeze(1) if rest is None else torch.cat([first.unsqueeze(1), rest], 1)


def masked_outputs(
    out: torch.Tensor | tuple[torch.Tensor, torch.Tensor], valid: torch.Tensor
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """0 past each row's length (each of a (logprobs, entropy) pair)."""
    return _each(out, lambda x: torch.where(valid, x, torch.zeros_like(x)))


def _each(
    out: torch.Tensor | tuple[torch.Tensor, ...], fn: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """`fn` of a tensor, or of each of a (logprobs, entropy) pair."""
    return tuple(fn(x) for x in out) if isinstance(out, tuple) else fn(out)
