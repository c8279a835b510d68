"""Prefix reuse is exact: one prefix per prompt, shared by G responses, gives the same
logprobs and the same gradients as verl's full forward per sample."""

from __future__ import annotations

import torch

from rollplex.backends.torch.full_forward import full_logprobs
from rollplex.backends.torch.logprob import response_logprobs, response_mask
from rollplex.engine.prefix import expand_prefix, prefix_forward, vision_encode

G = 3
LENGTHS = torch.tensor([5, 1, 3, 4, 2, 5])  # unequal, so responses are right-padded


def _responses(vocab: int, pad: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    raw = torch.randint(7, vocab, (len(LENGTHS), int(LENGTHS.max())), generator=gen)
    return torch.where(response_mask(LENGTHS, raw.shape[1]), raw, pad)


def _shared_prefix_logprobs(model, batch, responses, grad: bool) -> torch.Tensor:
    feats = vision_encode(model, batch.pixel_values, batch.image_grid_thw)
    state = expand_prefix(prefix_forward(model, batch, feats, grad=grad), G)
    return response_logprobs(model, state, responses, LENGTHS)


def test_logprobs_equal_full_forward(model, batch, spec):
    responses = _responses(spec.vocab_size, spec.special_tokens.pad_token_id)
    with torch.no_grad():
        shared = _shared_prefix_logprobs(model, batch, responses, grad=False)
        full = full_logprobs(model, batch, responses, LENGTHS, G)
    valid = response_mask(LENGTHS, responses.shape[1])
    assert torch.isfinite(shared).all()
    assert (shared[valid] < 0).all() and (shared[~valid] == 0).all()
    torch.testing.assert_close(shared, full, atol=1e-5, rtol=0)
    # Each row is scored against its own prompt: rows of different prompts differ.
    assert not torch.allclose(shared[0, 0], shared[G, 0])


def test_gradients_equal_full_forward(model, batch, spec):
    responses = _responses(spec.vocab_size, spec.special_tokens.pad_token_id)
    weights = torch.randn(responses.shape, generator=torch.Generator().manual_seed(3))

    def grads(logprobs: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        (logprobs * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    shared = grads(_shared_prefix_logprobs(model, batch, responses, grad=True))
    full = grads(full_logprobs(model, batch, responses, LENGTHS, G))
    names = {n for n, _ in model.named_parameters()}
    assert set(full) == names and set(shared) == names  # LLM, merger and tower all reached
    for name, ref in full.items():
        scale = ref.abs().max()
        assert scale > 0, f"{name} got no gradient"
        err = (shared[name] - ref).abs().max()
        assert err <= 1e-5 * scale, f"{name}: max |diff| {err:.3g} vs max |grad| {scale:.3g}"


def test_state_is_reusable_and_expand_repeats_rows(model, batch, spec):
    responses = _responses(spec.vocab_size, spec.special_tokens.pad_token_id)
    with torch.no_grad():
        feats = vision_encode(model, batch.pixel_values, batch.image_grid_thw)
        base = prefix_forward(model, batch, feats, grad=False)
        state = expand_prefix(base, G)
        first = response_logprobs(model, state, responses, LENGTHS)
        again = response_logprobs(model, state, responses, LENGTHS)
        # One-token responses are scored from the prefix's last logits alone.
        one = response_logprobs(model, state, responses[:, :1], LENGTHS.clamp(max=1))
    assert torch.equal(first, again)  # scoring did not grow the shared cache
    assert torch.equal(one, first[:, :1])
    assert state.cache.get_seq_length() == base.cache.get_seq_length() == batch.input_ids.shape[1]
    assert state.group_size == G and state.rows == batch.size * G
    assert torch.equal(state.last_logits[G], base.last_logits[1])
    # The first response token comes right after the prompt's highest M-RoPE position; image
    # tokens share positions (a 3x3 grid spans 3), so that is below the token count.
    positions, _ = model.model.get_rope_index(
        batch.input_ids,
        mm_token_type_ids=batch.mm_token_type_ids,
        image_grid_thw=batch.image_grid_thw,
        attention_mask=batch.attention_mask,
    )
    after_last = positions.amax(dim=(0, 2)) + 1
    assert torch.equal(state.next_positions, after_last.repeat_interleave(G))
    assert (base.next_positions < batch.lengths).all()
