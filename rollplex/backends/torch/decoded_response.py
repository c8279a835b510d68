"""The training response forward from a decode's kept layer outputs (decode once).

On-policy the decode ran every decoder layer over each fed response token with the weights
the trainer reads (engine/decoded.py keeps each layer's output). So no response forward
runs: each layer is a `replay` node whose forward returns what the decode computed and
whose backward recomputes the layer over the response rows with grad, attending to the
prefix K/V as the trainer's own response forward does (transformers' decoder layer under
the `SharedPrefix` mask: shared_prefix_attention.py), exactly as a checkpointed layer
would. The recompute runs each layer on the rows' fed tokens packed (packed_rows.py), the
kept outputs stay padded as the decode wrote them; the final norm, LM head, logprobs and
loss then run with grad on the packed tokens.
"""

from __future__ import annotations

import torch

from rollplex.backends.torch.logprob import NO_ENTROPY, fed_tokens, group_size_of, hidden_logprobs
from rollplex.backends.torch.packed_rows import PackedRows
from rollplex.backends.torch.shared_prefix_attention import SharedPrefix, use_shared_prefix
from rollplex.engine.prefix import Model, PrefixState, cache_kv, embed_tokens
from rollplex.engine.riders import replay


def response_layer(
    layer: torch.nn.Module,
    hidden: torch.Tensor,
    shared: SharedPrefix,
    rope: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """One decoder layer over response rows `hidden` [N, T, H], called as the text model
    calls it in `response_hidden` (its class's forward: not a checkpoint wrapper that an
    enclosing `checkpointed_layers` may have put on the instance)."""
    return type(layer).forward(
        layer,
        hidden,
        attention_mask=shared,
        position_embeddings=rope,
        position_ids=None,
        past_key_values=None,
        use_cache=False,
    )


def replayed_response_hidden(
    model: Model,
    state: PrefixState,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    kept: torch.Tensor,
    packed: bool = True,
) -> tuple[torch.Tensor, PackedRows | None] | None:
    """`response_hidden` (final hidden states of tokens 0..R-2: [1, T, H] of the fed tokens
    and their packing, or [N, R-1, H] and None unless `packed`) from `kept`
    [layers, N, >= R-1, H], the decode's layer outputs of these rows; None when R=1. With
    grad, the embeddings are recomputed (a lookup) and each layer replayed; without, the
    last kept output is normed."""
    n, width = responses.shape
    g = group_size_of(state, n)
    if width == 1:
        return None
    lm = model.model.language_model
    if kept.shape[0] != len(lm.layers) or kept.shape[1] != n or kept.shape[2] < width - 1:
        raise ValueError(
            f"kept decode outputs {tuple(kept.shape)} do not cover {len(lm.layers)} layers x "
            f"{n} rows x {width - 1} fed tokens"
        )
    kept = kept[:, :, : width - 1]
    valid = fed_tokens(lengths, width)
    packing = PackedRows.of(valid) if packed and bool(valid.any()) else None

    def out(h: torch.Tensor) -> tuple[torch.Tensor, PackedRows | None]:
        return (h, None) if packing is None else (packing.pack(h), packing)

    if not torch.is_grad_enabled():
        return out(lm.norm(kept[-1]))
    use_shared_prefix(model)
    shared = SharedPrefix.build(
        cache_kv(state.cache), state.attention_mask, valid, g, packed=packing is not None
    )
    steps = torch.arange(width - 1, device=state.lengths.device)
    pos = state.next_positions.repeat_interleave(g)[:, None] + steps
    h = embed_tokens(model, responses[:, :-1])  # padded: the first layer's replayed input
    at = pos if packing is None else packing.pack(pos)
    with torch.no_grad():  # no parameters: the rotary of text positions (h: only its dtype)
        rope = lm.rotary_emb(h, at.unsqueeze(0).expand(3, -1, -1))
    for layer, kept_out in zip(lm.layers, kept, strict=True):

        def run(x: torch.Tensor, layer: torch.nn.Module = layer) -> tuple[torch.Tensor]:
            if packing is None:
                return (response_layer(layer, x, shared, rope),)
            return (packing.unpack(response_layer(layer, packing.pack(x), shared, rope)),)

        (h,) = replay(run, h, kept_out)
    return out(lm.norm(h))


def decoded_response_logprobs(
    model: Model,
    state: PrefixState,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    kept: torch.Tensor,
    temperature: float = 1.0,
    entropy: str | None = NO_ENTROPY,
    packed: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`response_logprobs` of these rows with their decode's kept layer outputs in place of
    the response forward (same gradients: each layer recomputed in the backward)."""
    g = group_size_of(state, responses.shape[0])
    hidden = replayed_response_hidden(model, state, responses, lengths, kept, packed)
    rest, packing = (None, None) if hidden is None else hidden
    return hidden_logprobs(model, state, responses, lengths, rest, temperature, g, entropy, packing)
