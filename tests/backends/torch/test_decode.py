"""Decode: seeded, stops at eos, pads after it, greedy = argmax of the full forward, and
its logprobs equal response_logprobs of the tokens it produced."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.decode import decode, sample_next
from rollplex.backends.torch.full_forward import full_logits
from rollplex.backends.torch.logprob import response_logprobs, response_mask
from rollplex.engine.prefix import expand_prefix

G = 2
R = 6


@pytest.fixture
def state(prefix):
    return expand_prefix(prefix, G)


def _sample(model, state, seed: int, eos: int, temperature: float = 1.0, top_p: float = 0.9):
    gen = torch.Generator().manual_seed(seed)
    return decode(model, state, R, temperature, top_p, gen, eos_id=eos)


def test_same_seed_same_tokens(model, state, spec):
    eos = spec.special_tokens.eos_token_id
    a, b, c = (_sample(model, state, s, eos) for s in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])  # the generator, not a fixed pattern, picks tokens
    assert a[0].shape == (state.rows, R)


def test_stops_at_eos_and_pads(model, state, spec):
    pad = spec.special_tokens.pad_token_id
    free, _, free_len = _sample(model, state, 1, eos=-1)  # -1 never occurs: no stop
    assert (free_len == R).all()
    eos = int(free[0, 2])  # row 0 emits this token at step 2: call it eos
    tokens, logprobs, lengths = _sample(model, state, 1, eos=eos)
    assert int(lengths[0]) <= 3 and int(tokens[0, lengths[0] - 1]) == eos
    valid = response_mask(lengths, R)
    assert (tokens[~valid] == pad).all() and (logprobs[~valid] == 0).all()
    for row in range(state.rows):
        n = int(lengths[row])
        # Same generator stream, so each row matches the free run up to its first eos.
        assert torch.equal(tokens[row, :n], free[row, :n])
        hits = (free[row] == eos).nonzero()
        assert n == (int(hits[0]) + 1 if len(hits) else R)


def test_greedy_is_argmax_of_full_forward(model, state, batch, spec):
    tokens, _, lengths = decode(model, state, R, 0.0, 1.0, None, spec.special_tokens.eos_token_id)
    with torch.no_grad():
        logits = full_logits(model, batch, tokens, lengths, G)
    valid = response_mask(lengths, R)
    assert torch.equal(logits.argmax(-1)[valid], tokens[valid])
    # Greedy ignores the generator.
    again = decode(model, state, R, 0.0, 1.0, torch.Generator().manual_seed(5), 2)
    assert torch.equal(again[0], tokens)


def test_logprobs_match_response_logprobs(model, state, spec):
    free, _, _ = _sample(model, state, 3, eos=-1)
    tokens, logprobs, lengths = _sample(model, state, 3, eos=int(free[1, 1]))
    assert lengths.min() < R  # some row stopped early
    with torch.no_grad():
        scored = response_logprobs(model, state, tokens, lengths)
    torch.testing.assert_close(logprobs, scored, atol=1e-5, rtol=0)


def test_top_p_and_temperature():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]]).repeat(64, 1)
    gen = torch.Generator().manual_seed(0)
    # A nucleus below the top token's mass keeps only that token.
    assert (sample_next(logits, 1.0, 0.1, gen) == 1).all()
    # Probs are 0.64, 0.24, 0.09, 0.03: the top two hold 0.88 < 0.9, so top_p = 0.9 keeps three.
    drawn = sample_next(logits, 1.0, 0.9, gen)
    assert set(drawn.tolist()) <= {1, 2, 3} and len(set(drawn.tolist())) > 1
    assert torch.equal(sample_next(logits, 0.0, 0.5, gen), logits.argmax(-1))
    with pytest.raises(ValueError):
        sample_next(logits, -1.0, 1.0, gen)
