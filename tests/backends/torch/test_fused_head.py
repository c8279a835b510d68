"""The fused LM head (fused_head.py) gives the unfused logprobs, entropy and gradients of
hidden states, weight and bias, in every entropy mode and at any temperature, and holds
less at its backward's peak; heads it cannot fuse take the unfused path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from cpu_memory import cpu_peak_bytes

from rollplex.backends.torch import logprob
from rollplex.backends.torch.fused_head import fusable, fused_head_logprobs
from rollplex.backends.torch.logprob import (
    ENTROPY_GRAD,
    ENTROPY_METRIC,
    head_logprobs,
    token_entropy,
    token_logprobs,
)


def _setup(bias: bool, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=bias).to(dtype)
    hidden = torch.randn(3, 7, 16, dtype=dtype, requires_grad=True)
    tokens = torch.randint(0, 50, (3, 7))
    return head, hidden, tokens


def _unfused(head, hidden, tokens, temperature, entropy):
    logits = head(hidden)
    lp = token_logprobs(logits, tokens, temperature)
    if entropy is None:
        return lp, None
    ent = token_entropy(logits, temperature)
    return lp, ent if entropy == ENTROPY_GRAD else ent.detach()


def _grads(head, hidden, lp, ent, w_ent):
    loss = (lp * torch.linspace(-1, 2, lp.numel()).view_as(lp).to(lp)).sum()
    if ent is not None and ent.requires_grad:
        loss = loss + w_ent * ent.sum()
    params = [hidden, head.weight] + ([head.bias] if head.bias is not None else [])
    return torch.autograd.grad(loss, params)


@pytest.mark.parametrize("entropy", [None, ENTROPY_METRIC, ENTROPY_GRAD])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_equals_unfused(entropy, temperature, bias):
    head, hidden, tokens = _setup(bias)
    want_lp, want_ent = _unfused(head, hidden, tokens, temperature, entropy)
    want = _grads(head, hidden, want_lp, want_ent, 0.3)
    # 4 tokens a chunk over 21: five full chunks and a short one
    out = fused_head_logprobs(head, hidden, tokens, temperature, 4, entropy)
    lp, ent = (out, None) if entropy is None else out
    torch.testing.assert_close(lp, want_lp, rtol=0, atol=1e-6)
    if entropy is not None:
        # -sum p log p against lse - E_p[z]: one formula, two roundings (~4 here: 1e-6 is
        # a few float32 ulps of it)
        torch.testing.assert_close(ent, want_ent, rtol=1e-6, atol=1e-6)
        assert ent.requires_grad == (entropy == ENTROPY_GRAD)
    for got, exp in zip(_grads(head, hidden, lp, ent, 0.3), want, strict=True):
        torch.testing.assert_close(got, exp, rtol=0, atol=1e-6)


@pytest.mark.parametrize("entropy", [0, 2])  # none, with grad
def test_fused_gradcheck(entropy):
    """float64 end to end: the analytic gradient against finite differences."""
    head, hidden, tokens = _setup(True, torch.float64)
    w, b = head.weight.detach().requires_grad_(), head.bias.detach().requires_grad_()

    def f(x, w, b):
        from rollplex.backends.torch.fused_head import _HeadLogprobs

        args = (x.reshape(-1, 16), w, b, tokens.reshape(-1), 0.7, 5, entropy)
        lp, ent = _HeadLogprobs.apply(*args)
        return (lp, ent) if entropy else lp

    assert torch.autograd.gradcheck(f, (hidden, w, b))


def test_head_logprobs_takes_the_fused_path_with_grad_only(monkeypatch):
    head, hidden, tokens = _setup(False, torch.float32)
    monkeypatch.setattr(logprob, "HEAD_CHUNK_BYTES", 4 * 50 * 4)  # 4 tokens a chunk
    out = head_logprobs(head, hidden, tokens, 1.0)
    assert type(out.grad_fn).__name__ == "ViewBackward0"
    assert "_HeadLogprobs" in type(out.grad_fn.next_functions[0][0]).__name__
    with torch.no_grad():
        assert head_logprobs(head, hidden, tokens, 1.0).grad_fn is None
    ref = token_logprobs(head(hidden), tokens, 1.0)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)


def test_heads_with_hooks_or_subclasses_are_not_fused():
    head = torch.nn.Linear(4, 6, bias=False)
    assert fusable(head)
    head.register_forward_pre_hook(lambda m, a: None)  # FSDP2 unshards in one
    assert not fusable(head)

    class Wrapped(torch.nn.Linear):
        pass

    assert not fusable(Wrapped(4, 6))


def _backward_peak(out: torch.Tensor) -> int:
    return cpu_peak_bytes(lambda: out.sum().backward())


def test_fused_backward_holds_less_than_the_checkpointed_chunks(monkeypatch):
    torch.manual_seed(0)
    vocab, width, tokens_n = 4096, 64, 256
    head = torch.nn.Linear(width, vocab, bias=False).to(torch.bfloat16)
    hidden = torch.randn(1, tokens_n, width, dtype=torch.bfloat16, requires_grad=True)
    tokens = torch.randint(0, vocab, (1, tokens_n))
    chunk_fp32 = 64 * vocab * 4
    monkeypatch.setattr(logprob, "HEAD_CHUNK_BYTES", chunk_fp32)  # 64 tokens a chunk

    fused = _backward_peak(head_logprobs(head, hidden, tokens, 1.0))
    monkeypatch.setattr(logprob, "fusable", lambda _: False)
    unfused = _backward_peak(head_logprobs(head, hidden, tokens, 1.0))
    # the unfused chunk holds ~4x its float32 logits, the fused one ~1.5x (+ the gradients)
    grads = (hidden.numel() + head.weight.numel()) * 2
    assert unfused - grads > 3.5 * chunk_fp32
    assert fused - grads < 2.0 * chunk_fp32


def test_fsdp2_head_is_fused_only_when_gathered_in_its_root():
    """At rest FSDP2 holds DTensor shards (not fusable); the root's unshard gathers the
    head into a plain Linear (fused); a head that is its own unit is an FSDP subclass."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        root = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 16, bias=False))
        fully_shard(root[0])
        fully_shard(root)
        assert not fusable(root[1])
        root.unshard()
        assert fusable(root[1])
        own = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False))
        fully_shard(own[0])
        fully_shard(own)
        own.unshard()
        own[0].unshard()
        assert not fusable(own[0])
    finally:
        dist.destroy_process_group()
