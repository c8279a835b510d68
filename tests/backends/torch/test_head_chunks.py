"""The chunked, recomputing LM head gives the one-shot logprobs and gradients."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch import logprob
from rollplex.backends.torch.logprob import head_logprobs, token_logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunks_equal_one_shot_values_and_grads(monkeypatch, temperature):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(3, 7, 16, requires_grad=True)
    tokens = torch.randint(0, 50, (3, 7))
    ref = token_logprobs(head(hidden), tokens, temperature)
    ref.sum().backward()
    want_h, want_w = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    monkeypatch.setattr(logprob, "HEAD_CHUNK_BYTES", 4 * 50 * 4)  # 4 tokens a chunk
    out = head_logprobs(head, hidden, tokens, temperature)
    out.sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(hidden.grad, want_h, rtol=0, atol=1e-6)
    torch.testing.assert_close(head.weight.grad, want_w, rtol=0, atol=1e-6)


def test_no_grad_chunks_keep_nothing(monkeypatch):
    head = torch.nn.Linear(8, 20, bias=False)
    monkeypatch.setattr(logprob, "HEAD_CHUNK_BYTES", 2 * 20 * 4)
    with torch.no_grad():
        out = head_logprobs(head, torch.randn(2, 5, 8), torch.randint(0, 20, (2, 5)), 1.0)
    assert out.shape == (2, 5) and out.grad_fn is None
