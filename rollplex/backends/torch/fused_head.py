"""Token logprobs (and entropy) of an LM head in chunks of tokens, fused into one autograd
node that keeps no logits: the forward saves each token's log-sum-exp (4 bytes), the
backward recomputes a chunk's logits and turns them into their gradient in place.

A checkpointed chunk of `logits.float()`, `logsumexp`, `gather` leaves autograd to hold the
bf16 logits, their float32 copy, the softmax and the float32 gradient at once: 4x a chunk's
float32 logits at its backward's peak (measured: `bench/results/fused_head_cpu.md`). Here
the backward holds the float32 logits, overwritten by their gradient, and its bf16 cast
(1.5x; 2.0x, against 6.0x unfused, when the entropy has a gradient, which needs log p
beside p). The forward holds 2.0x with the entropy (3.5x unfused). The planner prices
these (ops/formulas/head.py). The gradients are the unfused form's
(tests/backends/torch/test_fused_head.py).
"""

from __future__ import annotations

from typing import Any

import torch

_NO_ENTROPY, _METRIC, _GRAD = 0, 1, 2


def fusable(head: torch.nn.Module) -> bool:
    """A plain `nn.Linear` whose weight is an ordinary tensor: no module hooks to bypass
    (a head that is its own FSDP2 unit unshards in one) and no DTensor weight (tensor
    parallel, or FSDP2 at rest). Inside an FSDP2 root's forward the gathered head is one."""
    if type(head) is not torch.nn.Linear or head._forward_hooks or head._forward_pre_hooks:
        return False
    return type(head.weight) is torch.nn.Parameter or type(head.weight) is torch.Tensor


def _scaled_logits(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """float32 (float64 for float64 `x`) logits / temperature of rows `x` (temperature 0
    or 1: the raw logits)."""
    z = torch.nn.functional.linear(x, weight, bias)
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    if temperature > 0 and temperature != 1.0:
        z.div_(temperature)
    return z


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        tokens: torch.Tensor,
        temperature: float,
        chunk: int,
        entropy: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0]
        lp = torch.empty(n, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
        lse = torch.empty_like(lp)
        ent = torch.empty_like(lp) if entropy else lp.new_empty(0)
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            z = _scaled_logits(x[lo:hi], weight, bias, temperature)
            lse[lo:hi] = z.logsumexp(-1)
            lp[lo:hi] = z.gather(-1, tokens[lo:hi, None]).squeeze(-1) - lse[lo:hi]
            if entropy:  # H = -sum p log p: log p in place, p beside it, one dot a row
                log_p = z.sub_(lse[lo:hi, None])
                p = log_p.exp()
                ent[lo:hi] = torch.bmm(p.unsqueeze(1), log_p.unsqueeze(2)).view(-1).neg_()
                del p, log_p
            del z  # before the next chunk's logits are made
        ctx.save_for_backward(x, weight, bias, tokens, lse)  # no logits, no entropy
        ctx.temperature, ctx.chunk, ctx.entropy = temperature, chunk, entropy
        if entropy != _GRAD:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx: Any, g_lp: torch.Tensor, g_ent: torch.Tensor | None):
        x, weight, bias, tokens, lse = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        with_ent = ctx.entropy == _GRAD and g_ent is not None
        scale = 1.0 / t if t > 0 and t != 1.0 else 1.0
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        gx = torch.empty_like(x) if need_x else None
        gw = torch.zeros_like(weight) if need_w else None
        gb = torch.zeros_like(bias) if need_b else None
        g_lp = torch.zeros_like(lse) if g_lp is None else g_lp.to(lse.dtype)
        for lo in range(0, x.shape[0], chunk):
            hi = min(x.shape[0], lo + chunk)
            z = _scaled_logits(x[lo:hi], weight, bias, t).sub_(lse[lo:hi, None])  # log p
            g = g_lp[lo:hi, None]
            # d lp / dz = onehot - p, and d H / dz = -p (log p + H), with -H = sum p log p.
            # log p turns into p (or the coefficient of p), then into the gradient, in place:
            # one float32 buffer, two with the entropy's gradient.
            if with_ent:
                p = z.exp()
                neg_h = torch.bmm(p.unsqueeze(1), z.unsqueeze(2)).view(-1, 1)
                z.sub_(neg_h).mul_(-g_ent[lo:hi, None].to(lse.dtype)).sub_(g)
                z = p.mul_(z)
                del p
            else:
                z.exp_().mul_(-g)
            z[torch.arange(hi - lo, device=x.device), tokens[lo:hi]] += g_lp[lo:hi]
            if scale != 1.0:
                z.mul_(scale)
            grad = z.to(x.dtype)
            del z, g  # before the matmuls: their operand is the compute-dtype copy
            if gx is not None:
                torch.mm(grad, weight, out=gx[lo:hi])
            if gw is not None:
                gw.addmm_(grad.t(), x[lo:hi])
            if gb is not None:
                gb += grad.sum(0)
            del grad
        return gx, gw, gb, None, None, None, None


def fused_head_logprobs(
    head: torch.nn.Linear,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
    chunk: int,
    entropy: str | None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`head_logprobs` of a `fusable` head for hidden [N, T, H] and tokens [N, T]: logprobs
    [N, T] in float32, with the entropy [N, T] when `entropy` is "metric" (no gradient) or
    "grad"."""
    n, t, h = hidden.shape
    mode = {None: _NO_ENTROPY, "metric": _METRIC, "grad": _GRAD}[entropy]
    lp, ent = _HeadLogprobs.apply(
        hidden.reshape(n * t, h),
        head.weight,
        head.bias,
        tokens.reshape(n * t),
        temperature,
        chunk,
        mode,
    )
    if mode == _NO_ENTROPY:
        return lp.view(n, t)
    return lp.view(n, t), ent.view(n, t)
