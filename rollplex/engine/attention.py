"""Decode attention over the shared-prefix cache (cache.py), by the cache's `attention`:
"sdpa", "flex" (flex.py) or "split" (`split_attention`; on CUDA by default split_kernel.py's
two Triton kernels, the same softmax)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from rollplex.engine import flex
from rollplex.engine.cache import SharedPrefixKV
from rollplex.engine.phases import first_call
from rollplex.engine.split_kernel import split_attention_kernel

_compiled: Callable | None = None


def attend_shared(
    attn: torch.nn.Module,
    q: torch.Tensor,
    cache: SharedPrefixKV,
    layer: int,
    kv_len: int,
    kernel: bool = False,
    new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Attention of q [B, H, G, D] over the cache: [B, G, H * D]; under "split", on
    split_kernel.py's Triton kernels when `kernel`, which then write `new_kv` (the step's
    K/V [B, Hkv, G, D], not yet in the cache) at the step's slot first."""
    if new_kv is not None and not (kernel and cache.split is not None):
        raise ValueError("only split_kernel.py's kernels write the step's K/V (new_kv)")
    b, heads, g, d = q.shape
    kv_heads = cache.keys[layer].shape[1]
    scale = getattr(attn, "scaling", d**-0.5)
    if cache.flex is not None:
        out = flex.attend(q, cache.keys[layer], cache.values[layer], cache.flex, scale)
        return out.transpose(1, 2).reshape(b, g, heads * d)
    if cache.split is not None:
        own = cache.split
        args = (
            q,
            cache.keys[layer],
            cache.values[layer],
            own.prefix_lengths,
            own.keys[layer][:, :, :, :kv_len],
            own.values[layer][:, :, :, :kv_len],
            own.step,
            scale,
        )
        if kernel:
            return split_attention_kernel(*args, new_kv=new_kv)
        return (split_call() if q.is_cuda else split_attention)(*args)
    # "sdpa". Query head j * rep + r reads K/V head j (transformers' repeat_kv order): fold r
    # into the query length, as rows r * G + g. transformers' own SDPA path would repeat_kv
    # the whole cache for GQA whenever a mask is given (on CUDA), reading it rep times over;
    # the fold reads it once. But every row reads all G rows' response K/V (and the mask).
    q = q.reshape(b, kv_heads, (heads // kv_heads) * g, d)
    out = F.scaled_dot_product_attention(
        q,
        cache.keys[layer][:, :, :kv_len],
        cache.values[layer][:, :, :kv_len],
        attn_mask=cache.mask[..., :kv_len],
        scale=scale,
    )
    # reshape, not view: a CUDA kernel may return the heads strided inside the query dim
    return out.reshape(b, heads, g, d).transpose(1, 2).reshape(b, g, heads * d)


def split_call() -> Callable:
    """`split_attention` compiled once per process, dynamic shapes (every bucket, model and
    kv_len); what it fuses is the fp32 masking, max, exp, sums and casts."""
    global _compiled
    if _compiled is None:
        import torch._dynamo

        # sizes of 1 (one prompt, one head group) and each dtype compile their own graph;
        # past the limit dynamo would silently run it eagerly
        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, 64)
        compiled = torch.compile(split_attention, dynamic=True)
        _compiled = first_call(compiled, "compile split attention")  # a logged phase
    return _compiled


def split_attention(
    q: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    prefix_lengths: torch.Tensor,
    own_k: torch.Tensor,
    own_v: torch.Tensor,
    step: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [B, H, G, D] over prompt b's prefix K/V [B, Hkv, C, D] (its first
    `prefix_lengths[b]` keys) and row g's own response K/V [B, Hkv, G, n, D] (steps <=
    `step`): [B, G, H * D], the exact softmax over their union. Part A folds the group's G
    rows x query heads of a K/V head into one query block, so the prefix is read once per
    prompt; part B is each row's queries over its own responses only; no mask tensor is
    read. Each part's max, sum and weighted values apart, then merged (log-sum-exp), as
    flash-decoding's splits merge: scores, exps and sums in fp32, matmuls in q's dtype.
    On CUDA it runs compiled (`split_call`), so the fp32 pieces fuse around the matmuls.
    Masked scores are the float32 minimum, not -inf: a part with no visible key (a padding
    prompt's prefix) then weighs exp(min - max) = 0, and a row with no key at all averages
    finite values."""
    b, heads, g, d = q.shape
    kv_heads, cap, n = prefix_k.shape[1], prefix_k.shape[2], own_k.shape[3]
    rep = heads // kv_heads
    low = torch.finfo(torch.float32).min
    # Part A: query head j * rep + r reads K/V head j; rows r * G + g of one query block.
    sa = torch.matmul(q.reshape(b, kv_heads, rep * g, d), prefix_k.transpose(-1, -2))
    valid = torch.arange(cap, device=q.device) < prefix_lengths[:, None]  # [B, C]
    ma, la, ea = _partial_softmax(torch.where(valid[:, None, None, :], sa.float() * scale, low))
    oa = torch.matmul(ea.to(q.dtype), prefix_v)  # [B, Hkv, rep * G, D], unnormalised
    # Part B: row g's rep query heads of K/V head j over its own keys, [B, Hkv, G, rep, n].
    sb = torch.matmul(q.reshape(b, kv_heads, rep, g, d).transpose(2, 3), own_k.transpose(-1, -2))
    seen = torch.arange(n, device=q.device) <= step
    mb, lb, eb = _partial_softmax(torch.where(seen, sb.float() * scale, low))
    ob = torch.matmul(eb.to(q.dtype), own_v)  # [B, Hkv, G, rep, D]
    # Both in [B, Hkv, rep, G, *], merged: the softmax over the union of their keys.
    ma, la, oa = (t.reshape(b, kv_heads, rep, g, -1) for t in (ma, la, oa))
    mb, lb, ob = (t.transpose(2, 3) for t in (mb, lb, ob))
    top = torch.maximum(ma, mb)
    wa, wb = torch.exp(ma - top), torch.exp(mb - top)
    out = (oa.float() * wa + ob.float() * wb) / (la * wa + lb * wb)
    return out.to(q.dtype).reshape(b, heads, g, d).transpose(1, 2).reshape(b, g, heads * d)


def _partial_softmax(scores: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(row max, sum of exp(score - max), exp(score - max)) of fp32 scores: one pass over
    them (a fused reduction when compiled); the exps are in [0, 1], fit for the PV matmul in
    the model's dtype, and normalised only after the parts merge, as flash-decoding does."""
    top = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - top)
    return top, e.sum(-1, keepdim=True), e
