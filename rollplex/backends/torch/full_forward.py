"""verl's per-sample forward: prefix + response per row through transformers' own forward.

What a serial verl step runs (every sample re-encodes its prompt), and the yardstick the
prefix-sharing path (logprob.py) is tested against. Packed by default: the layers run the
rows' real tokens only (packed_attention.py). Follows the caller's grad mode.
"""

from __future__ import annotations

import torch

from rollplex.backends.torch.logprob import (
    NO_ENTROPY,
    head_logprobs,
    masked_outputs,
    response_mask,
)
from rollplex.backends.torch.packed_attention import PackedCausal
from rollplex.backends.torch.shared_prefix_attention import use_shared_prefix
from rollplex.data.prompts import PromptBatch
from rollplex.engine.prefix import Model, embed_tokens, lm_hidden, rope_index, scatter_visual


def _full_sequences(
    batch: PromptBatch, responses: torch.Tensor, lengths: torch.Tensor, group_size: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded [prefix_b, response_i] rows: input ids, mm types, mask, prefix lengths."""
    plen = batch.lengths.repeat_interleave(group_size)
    total = plen + lengths
    width = int(total.max())
    ids = torch.full((responses.shape[0], width), pad_id, dtype=torch.long)
    types = torch.zeros_like(ids, dtype=batch.mm_token_type_ids.dtype)
    for i, (p, r) in enumerate(zip(plen.tolist(), lengths.tolist(), strict=True)):
        b = i // group_size
        ids[i, :p] = batch.input_ids[b, :p]
        ids[i, p : p + r] = responses[i, :r]
        types[i, :p] = batch.mm_token_type_ids[b, :p]
    mask = response_mask(total, width).long()
    dev = batch.input_ids.device
    return ids.to(dev), types.to(dev), mask.to(dev), plen


def _predicting(hidden: torch.Tensor, plen: torch.Tensor, width: int) -> torch.Tensor:
    """[N, width, H] of `hidden` [N, L, H] at the positions that predict each response
    token: token j of row i at plen_i - 1 + j (clamped past the row's end)."""
    idx = (plen.to(hidden.device) - 1)[:, None] + torch.arange(width, device=hidden.device)
    idx = idx.clamp(max=hidden.shape[1] - 1)
    return hidden.gather(1, idx.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))


def full_logits(
    model: Model,
    batch: PromptBatch,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """Logits [N, R, V] that score each response token, from one full forward per sample
    (N = batch.size * group_size; response i belongs to prompt i // group_size)."""
    return model.lm_head(full_hidden(model, batch, responses, lengths, group_size))


def full_hidden(
    model: Model,
    batch: PromptBatch,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """Final hidden states [N, R, H] at the positions that predict each response token."""
    n, width = responses.shape
    if n != batch.size * group_size:
        raise ValueError(f"{n} responses for {batch.size} prompts x G={group_size}")
    pad_id = model.config.text_config.pad_token_id or 0
    ids, types, mask, plen = _full_sequences(batch, responses, lengths, group_size, pad_id)
    # verl recomputes the visuals for every sample: repeat each prompt's pixels G times.
    rep = batch.repeat(group_size)
    positions = rope_index(model, rep, ids, types, mask)
    hidden = model.model(
        input_ids=ids,
        pixel_values=rep.pixel_values if rep.image_grid_thw.numel() else None,
        image_grid_thw=rep.image_grid_thw,
        pixel_values_videos=rep.pixel_values_videos if rep.video_grid_thw.numel() else None,
        video_grid_thw=rep.video_grid_thw,
        second_per_grid_ts=rep.second_per_grid_ts,
        mm_token_type_ids=types,
        attention_mask=mask,
        position_ids=positions,
        use_cache=False,
    ).last_hidden_state
    return _predicting(hidden, plen, width)


def full_logprobs(
    model: Model,
    batch: PromptBatch,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    group_size: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Logprobs [N, R] of the responses with no prefix reuse; 0 past each row's length."""
    hidden = full_hidden(model, batch, responses, lengths, group_size)
    out = head_logprobs(model.lm_head, hidden, responses, temperature)
    return masked_outputs(out, response_mask(lengths, responses.shape[1]))


def features_full_head_outputs(
    model: Model,
    batch: PromptBatch,
    features: torch.Tensor,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    packed: bool = True,
) -> torch.Tensor:
    """`model.lm_head` outputs [N, R, out] that predict each response token, from one
    forward over [prefix_i, response_i] per row, with the image and video tokens of row i
    taking `features` (rows in order); `batch` has one row per response."""
    hidden = features_full_hidden(model, batch, features, responses, lengths, packed)
    return model.lm_head(hidden)


def features_full_hidden(
    model: Model,
    batch: PromptBatch,
    features: torch.Tensor,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    packed: bool = True,
) -> torch.Tensor:
    """Final hidden states [N, R, H] that predict each response token (see above). With
    `packed`, the layers run the rows' real tokens only (packed_attention.py)."""
    n, width = responses.shape
    if n != batch.size:
        raise ValueError(f"{n} responses for {batch.size} prefix rows")
    pad_id = model.config.text_config.pad_token_id or 0
    ids, types, mask, plen = _full_sequences(batch, responses, lengths, 1, pad_id)
    embeds = scatter_visual(embed_tokens(model, ids), types, features)
    positions = rope_index(model, batch, ids, types, mask)
    if packed:
        use_shared_prefix(model)  # its dispatcher routes the PackedCausal mask
        causal = PackedCausal.of(mask.bool())
        pack = causal.packing
        at = pack.pack(positions.permute(1, 2, 0)).permute(2, 0, 1)  # [3, 1, T]
        # unpacked for the gather, whose input is the normed output the saved-activations
        # formula counts (ops.formulas.saved_activation_bytes), packed or not
        hidden = pack.unpack(lm_hidden(model, pack.pack(embeds), at, causal.masks(), None))
    else:
        hidden = lm_hidden(model, embeds, positions, mask, None)
    return _predicting(hidden, plen, width)


def features_full_logprobs(
    model: Model,
    batch: PromptBatch,
    features: torch.Tensor,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    temperature: float = 1.0,
    entropy: str | None = NO_ENTROPY,
    packed: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Logprobs [N, R] of `features_full_head_outputs`' logits; 0 past each row's length.
    With `entropy`, (logprobs, entropy [N, R]) from the same logits (head_logprobs)."""
    hidden = features_full_hidden(model, batch, features, responses, lengths, packed)
    out = head_logprobs(model.lm_head, hidden, responses, temperature, entropy)
    return masked_outputs(out, response_mask(lengths, responses.shape[1]))
